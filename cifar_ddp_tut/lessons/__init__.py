"Exhibits for the notebooks (pitfalls, proofs, demos, launch helpers), never imported by the program."

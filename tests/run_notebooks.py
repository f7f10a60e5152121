"""Run notebooks as a learner's Run All does, save their outputs, and write their Run All times.

    python tests/run_notebooks.py                      # every notebook under nbs/ (the index aside)
    python tests/run_notebooks.py nbs/course/03_inside_ddp.ipynb ...

Each notebook runs top to bottom in a fresh Jupyter kernel, in its own folder, every cell (no test
switch, no skipped flag), and stops at the first error. Its outputs are saved into the notebook (then
`nbdev_clean` tidies it), and the time it took replaces the "Run All" figure of its row in the syllabus
tables of `nbs/index.ipynb` and `README.md`, so the times shown are those of the run whose outputs are
saved. `--no-save` runs them without writing anything."""
import argparse, json, os, re, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'


def notebooks() -> list:
    "Every notebook of the course and the program, in reading order (sorted paths)."
    return sorted(p for p in NBS.rglob('*.ipynb')
                  if '.ipynb_checkpoints' not in p.parts and p.name != 'index.ipynb')


def execute(path:Path, timeout:float=900):
    "Run `path` top to bottom in a fresh kernel in its folder: (the executed notebook, seconds)."
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    env_before = os.environ.pop('IN_TEST', None)  # a learner's kernel has no test switch
    try:
        t0 = time.monotonic()
        # a cell that raises makes execute() raise CellExecutionError naming the cell and the error
        NotebookClient(nb, timeout=timeout, kernel_name='python3',
                       resources={'metadata': {'path': str(path.parent)}}).execute()
        return nb, time.monotonic() - t0
    finally:
        if env_before is not None: os.environ['IN_TEST'] = env_before


def clean_nb(path:Path):
    "What `nbdev_clean` does to one notebook (run from the repository, where settings.ini is)."
    from nbdev.clean import nbdev_clean
    cwd = os.getcwd(); os.chdir(ROOT)
    try: nbdev_clean(fname=str(path))
    finally: os.chdir(cwd)


def fmt(secs:float) -> str:
    return f"{secs:.0f} s" if secs < 100 else f"{secs / 60:.1f} min"


def name(path:Path) -> str:
    "How the syllabus tables name a notebook: `course/03_inside_ddp`."
    return f"{path.parent.name}/{path.stem}"


def set_time(text:str, nb_name:str, secs:float) -> str:
    "Replace the last cell (the Run All time) of the table row that starts with `nb_name`."
    row = re.compile(r'^(\| `' + re.escape(nb_name) + r'` \|.*\| )[^|]*( \|)$', re.M)
    return row.sub(lambda m: m[1] + fmt(secs) + m[2], text)


def record(times:dict):
    "Write `times` ({notebook name: seconds}) into the syllabus tables of the index and README."
    idx = NBS/'index.ipynb'
    nb = json.loads(idx.read_text())
    for c in nb['cells']:
        if c['cell_type'] != 'markdown': continue
        s = ''.join(c['source'])
        for k, v in times.items(): s = set_time(s, k, v)
        c['source'] = s.splitlines(keepends=True)
    idx.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    readme = ROOT/'README.md'
    s = readme.read_text()
    for k, v in times.items(): s = set_time(s, k, v)
    readme.write_text(s)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('paths', nargs='*', type=Path, help='notebooks to run (default: all)')
    p.add_argument('--no-save', action='store_true', help='run only: save no outputs, no times')
    a = p.parse_args(argv)
    import nbformat
    paths = [x.resolve() for x in a.paths] or notebooks()
    times = {}
    for path in paths:
        nb, secs = execute(path)
        times[name(path)] = secs
        print(f"{name(path)}: {fmt(secs)}", flush=True)
        if not a.no_save:
            nbformat.write(nb, path)
            clean_nb(path)
    if not a.no_save: record(times)
    print(f"all: {fmt(sum(times.values()))}")


if __name__ == '__main__': main()

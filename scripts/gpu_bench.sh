#!/usr/bin/env bash
# The GPU figures of nbs/program/09_benchmark.ipynb in one run on one GPU, within a time budget
# (default 570 s):
#   bash scripts/gpu_bench.sh [OUT_DIR]            OUT_DIR: default ./bench_gpu
#   BENCH_BUDGET_S=900 bash scripts/gpu_bench.sh   a longer budget
#   BENCH_ARGS="--size small --steps 2" bash ...     extra cifar_ddp_bench options (a rehearsal on CPU)
# Each step is one cifar_ddp_bench command; it writes OUT_DIR/STEP.json (rewritten after every line,
# so a step cut short keeps what it measured), its table in OUT_DIR/STEP.md and its stderr in
# OUT_DIR/STEP.err. Steps run in order of importance; one that would not finish before the budget
# ends is not started, and OUT_DIR/skipped.txt names it.
set -u
out=${1:-./bench_gpu}
mkdir -p "$out"
deadline=$(( $(date +%s) + ${BENCH_BUDGET_S:-570} ))
cache="$out/compile_cache"   # compiled kernels: cold in step 3, warm in step 4
rm -rf "$cache"

step() {  # step NAME SECONDS_IT_NEEDS ARGS...: one benchmark command, if there is time for it
  local name=$1 need=$2 left
  shift 2
  left=$(( deadline - $(date +%s) ))
  if (( left < need )); then
    echo "$name: not started, $left s of the budget left and it needs about $need s" | tee -a "$out/skipped.txt"
    return
  fi
  echo "== $name: $left s left"
  timeout "$left" python -m cifar_ddp_tut.bench --size full --nprocs 1 --out "$out/$name.json" "$@" ${BENCH_ARGS:-} \
    > "$out/$name.md" 2> "$out/$name.err"
  echo "exit code $?" >> "$out/$name.md"
  tail -n 12 "$out/$name.md"
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; \
  python -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"; } \
  > "$out/machine.txt" 2>&1
# 1-2. the headline: original and fast, 3 launches each, at 32 images a process (each GPU of the
#      seed's 4-GPU run) and at 128 (the whole global batch on one GPU)
step headline_32 200 --recipes original,fast --per_process_batch 32 --repeats 3
step headline_128 230 --recipes original,fast --per_process_batch 128 --repeats 3
# 3. the levers, one launch each, at 32 a process, where kernel launches may be the limit
step levers_32 150 --recipes levers --per_process_batch 32 --compile_cache_dir "$cache"
# 4. the same compilation again, from the cache step 3 filled: what a second run pays
step compile_warm_32 60 --recipes fast_compile --per_process_batch 32 --compile_cache_dir "$cache"
echo "reports in $out"

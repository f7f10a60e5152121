"Helpers for tests that run the real program under torchrun."
import json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT/'config'/'cpu_quickstart.yaml'


def torchrun(nproc, *args, timeout=300, extra_env=None, launcher_args=()):
    "Run `torchrun --standalone --nproc_per_node=nproc -m cifar_ddp_tut.train *args`; (CompletedProcess, seconds)."
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}', *launcher_args,
           '-m', 'cifar_ddp_tut.train', *map(str, args)]
    env = {**os.environ, 'OMP_NUM_THREADS': '1', **(extra_env or {})}
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    return p, time.monotonic() - t0


def read_metrics(save_dir):
    return [json.loads(l) for l in (Path(save_dir)/'metrics.jsonl').read_text().splitlines()]

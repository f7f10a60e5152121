"Helpers for tests that run the real program under torchrun."
import json, os, sys, time
from pathlib import Path
import psutil
from cifar_ddp_tut.launch import run_process, start_process, stop_process, torchrun_cmd

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT/'config'/'cpu_quickstart.yaml'


def _env(extra_env):
    return {**os.environ, 'OMP_NUM_THREADS': '1', **(extra_env or {})}


def torchrun(nproc, *args, timeout=300, extra_env=None, launcher_args=(), module='cifar_ddp_tut.train'):
    "Run `torchrun --standalone --nproc_per_node=nproc -m module *args`; (CompletedProcess, seconds)."
    t0 = time.monotonic()
    cmd = torchrun_cmd(nproc, *args, module=module, launcher_args=launcher_args)
    p = run_process(cmd, timeout, env=_env(extra_env), cwd=ROOT)  # past it: stopped, its workers too
    return p, time.monotonic() - t0


def run_module(module, *args, timeout=300):
    "Run `python -m module *args` from the repository, one thread a process; (CompletedProcess, seconds)."
    t0 = time.monotonic()
    p = run_process([sys.executable, '-m', module, *args], timeout, env=_env(None), cwd=ROOT)
    return p, time.monotonic() - t0


def small_args(save_dir, data_dir, *extra, epochs=4) -> list:
    "The small quickstart (640 training and 101 test images, 4 epochs, no plot): conftest's `small_run`."
    return ['--cfg', QUICKSTART, '--save_dir', save_dir, '--data_dir', data_dir, '--synthetic_train_size', '640',
            '--synthetic_test_size', '101', '--epoch', str(epochs), '--plot', 'false', *extra]


def read_metrics(save_dir):
    return [json.loads(l) for l in (Path(save_dir)/'metrics.jsonl').read_text().splitlines()]


def start_torchrun(nproc, *args, log_dir, launcher_args=(), extra_env=None, standalone=True):
    "Start torchrun in the background (its own process group); stdout/stderr go to files in `log_dir`."
    log_dir = Path(log_dir); log_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(log_dir.glob('*.out')))
    out, err = open(log_dir/f'{n}.out', 'w'), open(log_dir/f'{n}.err', 'w')
    cmd = torchrun_cmd(nproc, *args, launcher_args=launcher_args, standalone=standalone)
    p = start_process(cmd, stdout=out, stderr=err, env=_env(extra_env), cwd=ROOT)
    p.out_path, p.err_path = log_dir/f'{n}.out', log_dir/f'{n}.err'
    return p


def children(pid):
    "Pids of the direct children of `pid`."
    try: return sorted(c.pid for c in psutil.Process(pid).children())
    except psutil.NoSuchProcess: return []


def wait_for(cond, timeout, what, poll=0.2):
    "Poll `cond()` until true; fail the test with `what` after `timeout` seconds."
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond(): return time.monotonic() - t0
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def snapshot_value(save_dir, key='epochs_run'):
    "`key` (one of checkpoint.PROGRESS_KEYS) of save_dir/snapshot.pt; 0 when it is absent or unreadable."
    from cifar_ddp_tut.checkpoint import CheckpointError, snapshot_progress
    try: return snapshot_progress(Path(save_dir)/'snapshot.pt')[key]
    except CheckpointError: return 0


def kill_tree(p):
    "SIGKILL torchrun `p` (a Popen) and every process below it, as a crash or a lost machine would."
    stop_process(p, grace_s=0)


def world_pids(out_text):
    "{rank: pid} from the 'world: ...' line that rank 0 prints."
    import re
    line = next(l for l in out_text.splitlines() if l.startswith('world: '))
    return {int(r): int(pid) for r, pid in re.findall(r'rank (\d+) = .*?pid (\d+)\)', line)}


COMPARED = ('epoch', 'train_loss', 'train_acc', 'val_loss', 'val_acc', 'val_count', 'lr', 'step')


def same_history(a, b, tol=1e-9):
    "Histories equal in every learned quantity (timings differ run to run)."
    assert [h['epoch'] for h in a] == [h['epoch'] for h in b], (a, b)
    for x, y in zip(a, b):
        for k in COMPARED: assert abs(x[k] - y[k]) <= tol, (k, x, y)

"`launch`, the notebooks' way to run a function on N gloo processes, and `launch_workers`, the program's (torch's agent)."
import signal, time
import psutil, pytest, torch
from cifar_ddp_tut.dist import LaunchError, launch_workers
from cifar_ddp_tut.lessons.tools import launch


def rank_tensor(env):
    "A worker that returns a tensor (spawned processes import it from this module)."
    return torch.full((100_000,), float(env.rank))


def test_launch_returns_tensors_from_every_rank():
    # torch's queue sends a tensor as shared memory that dies with its sender; a rank that had
    # exited before its result was read left `launch` waiting until its timeout
    results = launch(rank_tensor, 2, timeout_s=120)
    assert [r.sum().item() for r in results] == [0.0, 100_000.0]


def test_launch_workers_returns_every_rank_and_names_a_failure():
    "The benchmark's and the doctor's launcher: results by rank, the failing rank named, the caller's signal handlers back."
    sigs = (signal.SIGALRM, signal.SIGTERM, signal.SIGINT)
    before = [signal.getsignal(s) for s in sigs]
    results = launch_workers(rank_tensor, 2, backend='gloo', timeout_s=120)  # the agent waits until a result is read
    assert [r.sum().item() for r in results] == [0.0, 100_000.0]
    with pytest.raises(LaunchError, match=r"failed \(exit code 1\): \[rank \d\] TypeError: rank_tensor\(\) takes 1"):
        launch_workers(rank_tensor, 2, 'one too many', timeout_s=120)
    assert [signal.getsignal(s) for s in sigs] == before


STUBBORN = '''import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a worker that ignores SIGTERM
open(sys.argv[1], 'w').write(str(os.getpid()))
time.sleep(600)
'''


def alive(pid:int) -> bool:
    try: return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess: return False


@pytest.mark.slow
def test_run_past_its_timeout_leaves_no_worker_running(tmp_path):
    "torchrun gives its workers, each in a session of its own, 30 s after SIGTERM: `run` kills them."
    from cifar_ddp_tut.lessons.tools import run
    (tmp_path/'stubborn.py').write_text(STUBBORN)
    pid_file = tmp_path/'pid'
    with pytest.raises(RuntimeError, match='did not finish in 5 s'):
        run('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=1',
            tmp_path/'stubborn.py', pid_file, timeout=5, show=False)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, f"worker {pid} still running after run() returned"
        time.sleep(0.2)

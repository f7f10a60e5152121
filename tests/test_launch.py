"""`cifar_ddp_tut.launch`: `launch`, the notebooks' and checkers' way to run a function on N gloo processes,
`launch_workers`, the program's (torch's agent), and starting and stopping a torchrun job or a command."""
import os, signal, subprocess, sys, time
import psutil, pytest, torch
from cifar_ddp_tut.launch import (TORCHRUN, LaunchError, launch, launch_workers, run_process, start_process,
                                  stop_process, torchrun_cmd)


def rank_tensor(env):
    "A worker that returns a tensor (spawned processes import it from this module)."
    return torch.full((100_000,), float(env.rank))


def rank1_dies(env):
    "Rank 1 ends its process without a word; rank 0 returns."
    if env.rank == 1: os._exit(7)
    return 'done'


def test_launch_returns_tensors_from_every_rank():
    # torch's queue sends a tensor as shared memory that dies with its sender; a rank that had
    # exited before its result was read left `launch` waiting until its timeout
    results = launch(rank_tensor, 2, job_timeout_s=120)
    assert [r.sum().item() for r in results] == [0.0, 100_000.0]


def test_launch_names_a_failure_or_returns_each_outcome():
    "By default a failing rank raises LaunchError; with outcomes=True each rank's fate comes back, as a checker needs."
    with pytest.raises(LaunchError, match=r"rank \d failed: TypeError: rank_tensor\(\) takes 1"):
        launch(rank_tensor, 2, 'one too many', job_timeout_s=120)
    got = launch(rank1_dies, 2, group_timeout_s=3, job_timeout_s=120, outcomes=True)
    assert [(x['rank'], x['status']) for x in got] == [(0, 'ok'), (1, 'died')], got
    assert got[0]['value'] == 'done' and got[1]['exitcode'] == 7, got


def test_launch_workers_returns_every_rank_and_names_a_failure():
    "The benchmark's and the doctor's launcher: results by rank, the failing rank named, the caller's signal handlers back."
    sigs = (signal.SIGALRM, signal.SIGTERM, signal.SIGINT)
    before = [signal.getsignal(s) for s in sigs]
    # the agent waits until a result is read
    results = launch_workers(rank_tensor, 2, backend='gloo', job_timeout_s=120)
    assert [r.sum().item() for r in results] == [0.0, 100_000.0]
    with pytest.raises(LaunchError, match=r"failed \(exit code 1\): \[rank \d\] TypeError: rank_tensor\(\) takes 1"):
        launch_workers(rank_tensor, 2, 'one too many', job_timeout_s=120)
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
        run(*TORCHRUN[1:], '--standalone', '--nproc_per_node=1',
            tmp_path/'stubborn.py', pid_file, timeout=5, show=False)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, f"worker {pid} still running after run() returned"
        time.sleep(0.2)


def wait_gone(pid, secs=10):
    deadline = time.monotonic() + secs
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.2)


@pytest.mark.slow
def test_stop_process_ends_torchrun_and_a_worker_that_ignores_sigterm(tmp_path):
    "`stop_process` on a torchrun job (`torchrun_cmd`, `start_process`): torchrun and its stubborn worker are gone."
    (tmp_path/'stubborn.py').write_text(STUBBORN)
    pid_file = tmp_path/'pid'
    p = start_process(torchrun_cmd(1, pid_file, module='stubborn'), cwd=tmp_path, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and p.poll() is None, "the worker never started"
        time.sleep(0.2)
    t0 = time.monotonic()
    stop_process(p, grace_s=2)
    assert time.monotonic() - t0 < 10  # not torchrun's 30 s for a worker that ignores SIGTERM
    assert p.returncode is not None
    wait_gone(int(pid_file.read_text()))


def test_run_process_stops_a_command_past_its_timeout(tmp_path):
    "`run_process` is `subprocess.run` that also stops what the command started: here a grandchild."
    code = ("import subprocess, sys, time; "
            "q = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            "print(q.pid, flush=True); time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_process([sys.executable, '-c', code], job_timeout_s=3, grace_s=1)
    wait_gone(int(e.value.output.split()[0]))
    p = run_process([sys.executable, '-c', 'print("hi")'], job_timeout_s=60)
    assert (p.returncode, p.stdout) == (0, 'hi\n')

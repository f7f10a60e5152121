"""Elastic restarts under torchrun, with no spare restarts: every restarted group must form, every time.
And the connect phase of `setup` honours timeout_s: a rank that cannot join fails with one line."""
import os, signal, sys, time
import pytest
from _util import (ROOT, QUICKSTART, read_metrics, start_torchrun, children, wait_for, snapshot_value,
                   same_history, small_args as small)
from cifar_ddp_tut.dist import free_port
from cifar_ddp_tut.launch import run_process, stop_process

EPOCHS = 4
KILLS = EPOCHS - 1  # one SIGKILL after each snapshot but the last: max-restarts equals the kills, none to spare


@pytest.mark.slow
def test_elastic_restarts_every_time(tmp_path, small_run):
    """`--max-restarts=3` and exactly 3 SIGKILLs, each of one worker of a freshly restarted group, after its snapshot.
    One restart that fails to form its process group uses up the budget and the job fails."""
    reference = small_run.history  # the same arguments, uninterrupted (conftest)
    p = start_torchrun(2, *small(tmp_path/'run', tmp_path/'data', '--timeout_s', '30'), log_dir=tmp_path/'logs',
                       launcher_args=[f'--max-restarts={KILLS}'])
    killed, t0 = [], time.monotonic()
    try:
        for k in range(1, KILLS + 1):
            # snapshot k is written by the group started after kill k-1, so that group has formed and trained
            wait_for(lambda: snapshot_value(tmp_path/'run') >= k or p.poll() is not None, 240, f'snapshot {k}')
            assert p.poll() is None, f"torchrun exited (rc {p.returncode}) before kill {k}:\n{p.err_path.read_text()[-3000:]}"
            time.sleep(0.5)  # into the next epoch
            workers = [w for w in children(p.pid) if w not in killed]
            assert len(workers) == 2, (k, workers, killed)
            victim = workers[k % 2]  # alternate between the two local ranks
            os.kill(victim, signal.SIGKILL); killed.append(victim)
            assert snapshot_value(tmp_path/'run') < EPOCHS, "the run finished before the kill: too fast to interrupt"
        rc = p.wait(300)
    finally:
        if p.poll() is None: stop_process(p, 0)  # torchrun and its workers
    out, err = p.out_path.read_text(), p.err_path.read_text()
    print(f"{KILLS} kills, {KILLS} restarts, finished in {time.monotonic() - t0:.0f} s")
    assert rc == 0, err[-3000:]
    assert out.count('resuming from') == KILLS, out
    assert 'could not join the process group' not in err
    hist = read_metrics(tmp_path/'run')
    assert [h['epoch'] for h in hist] == list(range(1, EPOCHS + 1))  # continuous: no epoch lost or repeated
    same_history(hist, reference)


def _alone(rank, timeout_s, code=None, world_size=2):
    "Start the training program (or `code`) as `rank` of a world whose other ranks never come; (CompletedProcess, seconds)."
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'WORLD_SIZE': str(world_size), 'RANK': str(rank), 'LOCAL_RANK': '0',
           'LOCAL_WORLD_SIZE': '1', 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': str(free_port())}
    cmd = [sys.executable, '-c', code] if code else [sys.executable, '-m', 'cifar_ddp_tut.train', '--cfg', QUICKSTART,
                                                    '--timeout_s', str(timeout_s), '--plot', 'false']
    t0 = time.monotonic()
    p = run_process(cmd, 120, env=env, cwd=ROOT)
    return p, time.monotonic() - t0


@pytest.mark.parametrize('rank', [0, 1])
def test_elastic_connect_honours_timeout(rank):
    "Rank 0 alone (its store waits for a client) or rank 1 alone (no store to reach): one line, exit 1, ~timeout_s."
    p, secs = _alone(rank, 4)
    errors = [l for l in p.stderr.splitlines() if 'error:' in l]
    print(f"rank {rank} alone: exit {p.returncode} after {secs:.1f} s (timeout_s=4, including start-up): {errors}")
    assert p.returncode == 1, p.stderr[-2000:]
    assert len(errors) == 1 and 'Traceback' not in p.stderr, p.stderr[-2000:]
    assert f'[rank {rank}] could not join the process group within timeout_s=4 s while connecting to the TCP store' in errors[0]
    assert secs < 4 + 30  # start-up (imports) on a loaded 2-core machine, then the timeout


def test_elastic_connect_watchdog_ends_a_stuck_call():
    """A connect step stuck where Python cannot interrupt it: the watchdog prints the one line and exits at timeout_s + 5.
    A world of one: the store and the agreement on an attempt id run for real and pass; torch's public
    `init_process_group` is replaced by a sleep, standing in for gloo stuck in C++."""
    hang = ("import time, torch.distributed as dist\n"
            "dist.init_process_group = lambda *a, **k: time.sleep(600)\n"
            "from cifar_ddp_tut.dist import setup\n"
            "setup('gloo', 2)\n")
    p, secs = _alone(0, 2, code=hang, world_size=1)
    lines = [l for l in p.stderr.splitlines() if 'could not join' in l]
    print(f"stuck connect: exit {p.returncode} after {secs:.1f} s: {lines}")
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-2000:]
    last = lines[0]
    assert '[rank 0] could not join the process group within timeout_s=2 s while creating the process group' in last
    assert 'stuck in C++, exiting' in last and secs < 2 + 5 + 30

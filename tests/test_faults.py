"""Faults with real processes: resume after a kill, a peer that stops answering, and two torchrun 'nodes' on one
machine (elastic restarts: test_elastic.py)."""
import os, signal, sys, time
import pytest
from _util import (read_metrics, torchrun, start_torchrun, children, kill_tree, wait_for,
                   snapshot_value, world_pids, same_history, small_args as small)
from cifar_ddp_tut.dist import free_port
from cifar_ddp_tut.launch import run_process

EPOCHS = 4


@pytest.fixture(scope='module')
def reference(small_run):
    "The uninterrupted run every interrupted one must reproduce (conftest's, shared with test_elastic)."
    return small_run.history


@pytest.mark.slow
def test_resume_after_kill_matches_uninterrupted(tmp_path, reference):
    args = small(tmp_path/'run', tmp_path/'data')
    p = start_torchrun(2, *args, log_dir=tmp_path/'logs')
    wait_for(lambda: snapshot_value(tmp_path/'run') >= 1 or p.poll() is not None, 300, 'the first snapshot')
    kill_tree(p)
    done = len(read_metrics(tmp_path/'run'))
    assert 1 <= done < EPOCHS, f"killed after {done} epochs: the run was too fast to interrupt"
    p2, _ = torchrun(2, *args)
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert 'resuming from' in p2.stdout and f'{snapshot_value(tmp_path/"run")} of {EPOCHS} epochs done' not in p2.stdout.split('resuming')[0]
    same_history(read_metrics(tmp_path/'run'), reference)
    # --resume false starts over and ignores the snapshot
    p3, _ = torchrun(2, *args, '--resume', 'false', '--epoch', '1')
    assert p3.returncode == 0 and 'starting fresh' in p3.stdout
    assert len(read_metrics(tmp_path/'run')) == 1


@pytest.mark.slow
def test_mid_epoch_snapshots_resume(tmp_path):
    "snapshot_every=K writes snapshots inside the epoch; a resumed run picks up at the recorded batch."
    args = small(tmp_path/'run', tmp_path/'data', '--snapshot_every', '3', '--epoch', '2')
    p = start_torchrun(2, *args, log_dir=tmp_path/'logs')
    wait_for(lambda: snapshot_value(tmp_path/'run', 'batches_done') > 0 or p.poll() is not None, 300, 'a mid-epoch snapshot')
    kill_tree(p)
    p2, _ = torchrun(2, *args)
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert 'batches into the next' in p2.stdout, p2.stdout
    hist = read_metrics(tmp_path/'run')
    assert [h['epoch'] for h in hist] == [1, 2] and hist[-1]['step'] == 2 * 10


# Elastic restarts under torchrun (three kills in a row, no spare restarts) are in test_elastic.py.


@pytest.mark.slow
def test_peer_that_stops_answering_fails_within_timeout(tmp_path):
    "A rank frozen with SIGSTOP: the other rank's collective times out after timeout_s and it exits with a message."
    p = start_torchrun(2, *small(tmp_path/'run', tmp_path/'data', '--epoch', '30', '--timeout_s', '5'), log_dir=tmp_path/'logs')
    wait_for(lambda: snapshot_value(tmp_path/'run') >= 1 or p.poll() is not None, 300, 'the first snapshot')
    pids = world_pids(p.out_path.read_text())
    os.kill(pids[1], signal.SIGSTOP)
    try:
        secs = wait_for(lambda: 'did not answer within timeout_s' in p.err_path.read_text(), 90, "rank 0's timeout message")
    finally:
        os.kill(pids[1], signal.SIGCONT)
    rc = p.wait(120)
    print(f"rank 0 reported the frozen peer {secs:.1f} s after SIGSTOP (timeout_s=5); torchrun exit code {rc}")
    assert rc != 0 and secs < 60
    assert '[rank 0] a peer process died or did not answer within timeout_s' in p.err_path.read_text()


@pytest.mark.slow
def test_two_nodes_on_one_machine(tmp_path):
    "Two torchrun 'nodes' (--nnodes=2, one process each) meet at a c10d rendezvous on 127.0.0.1 and train together."
    port = free_port()
    launcher = ['--nnodes=2', '--rdzv_backend=c10d', f'--rdzv_endpoint=127.0.0.1:{port}', '--rdzv_id=cifar-test']
    args = small(tmp_path/'run', tmp_path/'data', '--epoch', '2')
    nodes = [start_torchrun(1, *args, log_dir=tmp_path/f'node{i}', launcher_args=launcher, standalone=False) for i in range(2)]
    rcs = [n.wait(300) for n in nodes]
    outs = [n.out_path.read_text() for n in nodes]
    assert rcs == [0, 0], [n.err_path.read_text()[-2000:] for n in nodes]
    main_out = next(o for o in outs if o.startswith('world: '))
    world = main_out.splitlines()[0]
    assert 'node 0 local 0' in world and 'node 1 local 0' in world, world  # rank 1 is local rank 0 of the second node
    assert 'replicas in sync: max |parameter and buffer difference| over 2 rank(s) = 0' in main_out, main_out
    assert sum('epoch 2/2: train loss' in o for o in outs) == 1  # one main process in the whole job
    assert [h['epoch'] for h in read_metrics(tmp_path/'run')] == [1, 2]


def test_crash_while_writing_keeps_previous_snapshot(tmp_path):
    "A process killed halfway through writing a snapshot leaves the previous one whole and loadable."
    from cifar_ddp_tut.checkpoint import load_checkpoint, save_atomic
    import torch
    save_atomic({'model': {'w': torch.arange(10.)}, 'epochs_run': 1}, tmp_path/'snapshot.pt')
    before = (tmp_path/'snapshot.pt').read_bytes()
    crash = f"""
import os, torch
from cifar_ddp_tut.checkpoint import save_atomic
def dying_save(obj, f, *a, **k):
    f.write(b'PK\\x03\\x04 half a zip'); f.flush(); os._exit(9)  # killed mid-write
torch.save = dying_save
save_atomic({{'model': {{'w': torch.zeros(10)}}, 'epochs_run': 2}}, {str(tmp_path/'snapshot.pt')!r})
"""
    p = run_process([sys.executable, '-c', crash], 120)
    assert p.returncode == 9, p.stderr
    assert (tmp_path/'snapshot.pt').read_bytes() == before
    assert load_checkpoint(tmp_path/'snapshot.pt')['epochs_run'] == 1
    # the next successful save clears the dead writer's temporary file
    save_atomic({'model': {}, 'epochs_run': 2}, tmp_path/'snapshot.pt')
    assert sorted(f.name for f in tmp_path.iterdir()) == ['snapshot.pt']

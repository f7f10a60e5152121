"""Several nodes, tried as a cluster user would on one machine: two torchrun agents ("nodes", one process each) meet
at a c10d rendezvous on 127.0.0.1 with README's options (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, a stated
join_timeout) and share one save_dir. A node killed and replaced rejoins; a worker killed on one node restarts both;
SIGTERM to one node stops both with a snapshot that resumes exactly; a node that never comes is given up on within
join_timeout, with the files untouched.

The rendezvous notices a dead node after 3 missed heartbeats keep_alive_interval apart: 1 s here (torch's default
is 5 s) to keep the tests short. Node A starts first and hosts the rendezvous store (its endpoint is its own address); node B is the one that dies:
the store host's death ends the job (program/08)."""
import os, re, shutil, signal, socket, time
from dataclasses import dataclass
from pathlib import Path
import pytest
from _util import (read_metrics, start_torchrun, torchrun, children, wait_for, snapshot_value, kill_tree,
                   same_history, small_args)
from cifar_ddp_tut.dist import free_port

EPOCHS, STEPS = 3, 4  # 256 training images, batch 64: the faults come in epoch 2
JOIN_S = 30     # join_timeout of the tests that re-form: a replacement starts 2 s after the kill
NEVER_S = 10    # join_timeout of the node that waits for a peer that never comes
SHARE_OFF = {'TORCH_DISABLE_SHARE_RDZV_TCP_STORE': '1'}


def small(save_dir, data_dir):
    return small_args(save_dir, data_dir, '--synthetic_train_size', '256', '--synthetic_test_size', '64',
                      '--timeout_s', '30', epochs=EPOCHS)


@dataclass(frozen=True)
class Reference:
    "The same run on one node of 2 processes, uninterrupted: the history every faulted run must end with."
    save_dir: Path
    data_dir: Path
    history: list


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp('nodes_reference')
    p, secs = torchrun(2, *small(d/'run', d/'data'))
    assert p.returncode == 0, p.stderr[-3000:]
    print(f"reference: {secs:.0f} s")
    return Reference(d/'run', d/'data', read_metrics(d/'run'))


def _listening(port):
    with socket.socket() as s: return s.connect_ex(('127.0.0.1', port)) == 0


class Nodes:
    "Agents started with one command line (README's several-nodes command, one process per node)."
    def __init__(self, tmp_path, *args, join_s=JOIN_S):
        self.port, self.log_dir, self.args, self.started = free_port(), tmp_path/'logs', args, []
        self.launcher = ['--nnodes=2', '--rdzv_backend=c10d', f'--rdzv_endpoint=127.0.0.1:{self.port}',
                         '--rdzv_id=nodes', '--max-restarts=2', f'--rdzv_conf=join_timeout={join_s},keep_alive_interval=1']

    def start(self):
        p = start_torchrun(1, *self.args, log_dir=self.log_dir, launcher_args=self.launcher, extra_env=SHARE_OFF,
                           standalone=False)
        if not self.started:  # node A: let it bind the rendezvous store before B starts
            wait_for(lambda: _listening(self.port) or p.poll() is not None, 60, "node A's rendezvous store")
        self.started.append(p)
        return p

    def wait(self, *ps, timeout=240):
        return [p.wait(timeout) for p in ps]

    def out(self): return ''.join(p.out_path.read_text() for p in self.started)
    def err(self): return ''.join(p.err_path.read_text()[-3000:] for p in self.started)

    def kill_all(self):
        for p in self.started:
            if p.poll() is None: kill_tree(p)


def _after_snapshot_1(nodes, run):
    "Wait for the first epoch-end snapshot, then half a second into epoch 2."
    a = nodes.started[0]
    wait_for(lambda: snapshot_value(run) >= 1 or any(p.poll() is not None for p in nodes.started), 240, 'snapshot 1')
    assert all(p.poll() is None for p in nodes.started), nodes.err()
    time.sleep(0.5)
    assert snapshot_value(run) < EPOCHS, "the run finished before the fault: too fast to interrupt"
    return a


def _continued(nodes, run, reference):
    "Every epoch once, resumed once, the uninterrupted run's history."
    out = nodes.out()
    assert out.count('resuming from') == 1, out
    hist = read_metrics(run)
    assert [h['epoch'] for h in hist] == list(range(1, EPOCHS + 1))
    same_history(hist, reference)


@pytest.mark.slow
def test_a_replaced_node_rejoins(tmp_path, reference):
    """Node B (its agent and worker) SIGKILLed in epoch 2, the same command started again 2 s later: A's agent restarts,
    the new round forms with the replacement, and the run ends as the uninterrupted one did."""
    run = tmp_path/'run'
    nodes = Nodes(tmp_path, *small(run, reference.data_dir))
    try:
        a, b = nodes.start(), nodes.start()
        _after_snapshot_1(nodes, run)
        kill_tree(b); t_kill = time.monotonic()
        time.sleep(2)
        c = nodes.start()
        wait_for(lambda: 'resuming from' in nodes.out() or a.poll() is not None, 2 * JOIN_S, 'the re-formed job')
        formed = time.monotonic() - t_kill
        rcs = nodes.wait(a, c)
    finally: nodes.kill_all()
    print(f"node B killed, the same command started 2 s later: the job resumed {formed:.1f} s after the kill")
    assert rcs == [0, 0], nodes.err()
    _continued(nodes, run, reference.history)


@pytest.mark.slow
def test_a_worker_killed_on_one_node(tmp_path, reference):
    "Node B's worker SIGKILLed in epoch 2: both agents restart their workers (one restart each) and the run continues."
    run = tmp_path/'run'
    nodes = Nodes(tmp_path, *small(run, reference.data_dir))
    try:
        a, b = nodes.start(), nodes.start()
        _after_snapshot_1(nodes, run)
        [worker] = children(b.pid)
        os.kill(worker, signal.SIGKILL)
        rcs = nodes.wait(a, b)
    finally: nodes.kill_all()
    assert rcs == [0, 0], nodes.err()
    _continued(nodes, run, reference.history)


@pytest.mark.slow
def test_one_node_preempted(tmp_path, reference):
    """SIGTERM to node B's torchrun alone in epoch 2 (one machine preempted): both ranks stop at one step with a
    snapshot and B is gone within seconds; A's agent, with restarts left, waits join_timeout for B to come
    back, then gives up. The same command on both nodes resumes and ends as the uninterrupted run."""
    run = tmp_path/'run'
    args = small(run, reference.data_dir)
    nodes = Nodes(tmp_path, *args, join_s=NEVER_S)
    try:
        a, b = nodes.start(), nodes.start()
        _after_snapshot_1(nodes, run)
        t0 = time.monotonic()
        b.send_signal(signal.SIGTERM)
        b.wait(30); b_secs = time.monotonic() - t0
        a.wait(NEVER_S + 60); a_secs = time.monotonic() - t0
    finally: nodes.kill_all()
    stopped = [l for p in (a, b) for l in p.err_path.read_text().splitlines() if 'stopped by SIGTERM' in l]
    print(f"SIGTERM to node B: B gone after {b_secs:.1f} s, A (join_timeout={NEVER_S}) after {a_secs:.1f} s: {stopped}")
    assert b_secs < 15 and len(stopped) == 1, nodes.err()
    assert a_secs < b_secs + NEVER_S + 20 and a.returncode == 1
    assert a.err_path.read_text().strip().endswith('RendezvousTimeoutError')
    step = int(re.search(r'after optimizer step (\d+)', stopped[0])[1])
    assert snapshot_value(run, 'step') == step and STEPS < step < EPOCHS * STEPS  # stopped after epoch 1, saved there
    again = Nodes(tmp_path, *args)
    try: rcs = again.wait(again.start(), again.start())
    finally: again.kill_all()
    assert rcs == [0, 0], again.err()
    _continued(again, run, reference.history)


@pytest.mark.slow
def test_a_node_that_never_comes(tmp_path, reference):
    """Node A alone, resuming a finished run's save_dir: it gives up after join_timeout (RendezvousTimeoutError, which
    carries no text) and leaves every file as it was."""
    run = tmp_path/'run'
    shutil.copytree(reference.save_dir, run)
    before = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in run.iterdir()}
    nodes = Nodes(tmp_path, *small(run, reference.data_dir), join_s=NEVER_S)
    t0 = time.monotonic()
    try:
        a = nodes.start()
        rc = a.wait(NEVER_S + 60)
    finally: nodes.kill_all()
    secs = time.monotonic() - t0
    last = nodes.err().strip().splitlines()[-1]
    print(f"node A alone, join_timeout={NEVER_S}: exit {rc} after {secs:.1f} s; last line: {last}")
    assert rc == 1 and last == 'torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError', nodes.err()
    assert NEVER_S <= secs < NEVER_S + 20
    assert {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in run.iterdir()} == before

"""Two nodes in two network namespaces joined by a veth pair, each running `cifar_ddp_node` (README's
several-nodes command, one process per node), and the link between them cut: a short blip is survived
without a retry; a partition longer than the group timeout is healed by the retries and the run ends with
the uninterrupted history; a partition longer than the retry budget stops both nodes with the snapshot
intact and one line saying what to do; a bad config on one node is not retried; SIGTERM during a pause
ends it at once.

The namespaces, the veth pair and its addresses (10.213.0.0/24) exist only inside the test and are
deleted after it, even when it fails. Needs root (`ip netns`); skipped with the reason otherwise."""
import os, re, signal, subprocess, sys, time
from pathlib import Path
import pytest
from _util import ROOT, read_metrics, same_history, small_args, snapshot_value, wait_for
from cifar_ddp_tut.launch import start_process, stop_process

EPOCHS = 3
TIMEOUT_S = 10  # the program's group timeout (--timeout_s): a partition longer than this fails the workers
PORT = 29400
NODE = [sys.executable, '-m', 'cifar_ddp_tut.node']


def _ip(*args, check=True):
    return subprocess.run(['ip', *args], capture_output=True, text=True, check=check)


class Net:
    "Namespaces a, b, with veth ends a, b holding 10.213.0.1 and 10.213.0.2: the two nodes' only link."
    def __init__(self):
        tag = f"cdn{os.getpid() % 100000}"
        self.ns, self.dev, self.addr = [f"{tag}{s}" for s in 'ab'], [f"{tag}v{s}" for s in 'ab'], \
            ['10.213.0.1', '10.213.0.2']

    def up(self):
        for ns in self.ns: _ip('netns', 'add', ns)
        _ip('link', 'add', self.dev[0], 'type', 'veth', 'peer', 'name', self.dev[1])
        for ns, dev, addr in zip(self.ns, self.dev, self.addr):
            _ip('link', 'set', dev, 'netns', ns)
            _ip('-n', ns, 'addr', 'add', f'{addr}/24', 'dev', dev)
            _ip('-n', ns, 'link', 'set', dev, 'up'); _ip('-n', ns, 'link', 'set', 'lo', 'up')

    def cut(self): _ip('-n', self.ns[1], 'link', 'set', self.dev[1], 'down')   # node b's link down
    def heal(self): _ip('-n', self.ns[1], 'link', 'set', self.dev[1], 'up')

    def down(self):
        for ns in self.ns: _ip('netns', 'del', ns, check=False)  # deletes the veth pair with them


def _need_netns():
    probe = f"cdnprobe{os.getpid() % 100000}"
    try: r = _ip('netns', 'add', probe, check=False)
    except FileNotFoundError: pytest.skip("no `ip` command: two nodes need two network namespaces")
    if r.returncode: pytest.skip(f"`ip netns add` is not permitted here: {r.stderr.strip()}")
    _ip('netns', 'del', probe)


@pytest.fixture
def net():
    _need_netns()
    n = Net()
    try:
        n.up(); yield n
    finally: n.down()


JOIN_S = 10     # join_timeout: after its worker failed, node a waits this long for node b, then its
                # torchrun gives up; a cut shorter than timeout_s + join_timeout torchrun heals alone
READ_S = 10     # read_timeout of the rendezvous store (torch's default 60 s): how long node b, its
                # link back, tries to reach a store that is gone
PAUSE_S = 3     # cifar_ddp_node --pause


BLIP_TIMEOUT_S = 30  # the blip run's timeout_s and read_timeout. The connections come back seconds after
                     # the link (TCP's retransmissions back off, each waiting twice the last): with 10 s,
                     # CI once saw a 5 s cut fail a collective and restart the workers


def small(save_dir, data_dir, *extra, timeout_s=TIMEOUT_S):
    return small_args(save_dir, data_dir, '--synthetic_train_size', '256', '--synthetic_test_size', '64',
                      '--timeout_s', str(timeout_s), *extra, epochs=EPOCHS)


class Nodes:
    "README's several-nodes command through cifar_ddp_node, one process per node, node i in namespace i."
    def __init__(self, net, tmp_path, retries=(3, 3), pause=PAUSE_S, max_restarts=3, read_s=READ_S):
        self.net, self.log_dir, self.retries, self.pause, self.ps = net, tmp_path/'logs', retries, pause, []
        self.max_restarts, self.read_s = max_restarts, read_s
        self.log_dir.mkdir(exist_ok=True)

    def cmd(self, i, args):
        conf = f'join_timeout={JOIN_S},read_timeout={self.read_s},is_host={int(i == 0)}'  # a namespace's
        # address is not its host name's: say which node hosts the rendezvous store, and where each is
        return [*NODE, '--retries', self.retries[i], '--pause', self.pause, '--nnodes=2', '--nproc_per_node=1',
                '--rdzv_backend=c10d', f'--rdzv_endpoint={self.net.addr[0]}:{PORT}', '--rdzv_id=partition',
                f'--max-restarts={self.max_restarts}', f'--rdzv_conf={conf}', f'--local_addr={self.net.addr[i]}',
                '--monitor-interval=0.5', '-m', 'cifar_ddp_tut.train', *args]

    def start(self, *args, b_args=None):
        for i in range(2):
            env = {**os.environ, 'OMP_NUM_THREADS': '1', 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE': '1',
                   'GLOO_SOCKET_IFNAME': self.net.dev[i]}
            cmd = self.cmd(i, args if i == 0 or b_args is None else b_args)
            self.ps.append(start_process(['ip', 'netns', 'exec', self.net.ns[i], *cmd], env=env, cwd=ROOT,
                                         stdout=open(self.log_dir/f'{i}.out', 'w'),
                                         stderr=open(self.log_dir/f'{i}.err', 'w')))
            if i == 0: time.sleep(1)  # node a binds the rendezvous store first
        return self.ps

    def err(self, i): return (self.log_dir/f'{i}.err').read_text()
    def out(self, i): return (self.log_dir/f'{i}.out').read_text()
    def said(self, i): return [l for l in self.err(i).splitlines() if l.startswith('cifar_ddp_node:')]

    def wait(self, timeout=600):
        t0 = time.monotonic()
        for p in self.ps: p.wait(max(1, timeout - (time.monotonic() - t0)))
        return [p.returncode for p in self.ps]

    def stop(self):
        for p in self.ps:
            if p.poll() is None: stop_process(p, grace_s=5)


def _in_epoch_2(nodes, run):
    "Wait for the first epoch's snapshot, then half a second into epoch 2."
    wait_for(lambda: snapshot_value(run) >= 1 or any(p.poll() is not None for p in nodes.ps), 240,
             'the snapshot of epoch 1')
    assert all(p.poll() is None for p in nodes.ps), nodes.err(0)[-3000:] + nodes.err(1)[-3000:]
    time.sleep(0.5)


def _cut(net, secs):
    t0 = time.monotonic(); net.cut()
    try: time.sleep(secs)
    finally: net.heal()
    return t0


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory): return tmp_path_factory.mktemp('partition_data')


@pytest.fixture(scope='module')
def blip(tmp_path_factory, data_dir):
    "A run whose link is down for 5 s in epoch 2: the uninterrupted history, a reference for the others."
    _need_netns()
    d = tmp_path_factory.mktemp('blip')
    net = Net()
    try:
        net.up(); nodes = Nodes(net, d, read_s=BLIP_TIMEOUT_S)
        nodes.start(*small(d/'run', data_dir, timeout_s=BLIP_TIMEOUT_S))
        _in_epoch_2(nodes, d/'run'); t0 = _cut(net, 5)
        rcs = nodes.wait(); secs = time.monotonic() - t0
    finally:
        nodes.stop(); net.down()
    return dict(rcs=rcs, secs=secs, said=[nodes.said(0), nodes.said(1)], out=nodes.out(0) + nodes.out(1),
                history=read_metrics(d/'run'), err=nodes.err(0)[-3000:] + nodes.err(1)[-3000:])


@pytest.mark.slow
def test_a_blip_is_survived_without_a_retry(blip):
    """Node b's link down for 5 s, well under timeout_s: no collective times out, no worker restarts,
    nothing is retried."""
    print(f"5 s blip: both nodes ended {blip['secs']:.0f} s after the cut, exit codes {blip['rcs']}")
    assert blip['rcs'] == [0, 0], blip['err']
    assert blip['said'] == [[], []] and 'resuming from' not in blip['out']
    assert [h['epoch'] for h in blip['history']] == list(range(1, EPOCHS + 1))


@pytest.mark.slow
def test_a_partition_is_healed_by_the_retries(net, tmp_path, data_dir, blip):
    """Node b's link down for 35 s: the workers fail at timeout_s, a's torchrun gives up after join_timeout,
    b's when its link is back and the store it waited on is gone; each cifar_ddp_node tries again with
    the same --rdzv_id, the job re-forms once the link is back and resumes to the uninterrupted history."""
    run, nodes = tmp_path/'run', Nodes(net, tmp_path)
    try:
        nodes.start(*small(run, data_dir))
        _in_epoch_2(nodes, run); t0 = _cut(net, 35)  # > timeout_s + join_timeout, with a margin
        rcs = nodes.wait(); secs = time.monotonic() - t0
    finally: nodes.stop()
    said = nodes.said(0) + nodes.said(1)
    print(f"35 s partition: healed, both nodes done {secs:.0f} s after the cut; exit codes {rcs}",
          *[f"node {n}: {l}" for i, n in enumerate('ab') for l in nodes.said(i)], sep='\n')
    assert rcs == [0, 0], nodes.err(0)[-3000:] + nodes.err(1)[-3000:]
    assert said and all('trying again' in l for l in said), said
    assert (nodes.out(0) + nodes.out(1)).count('resuming from') == 1
    same_history(read_metrics(run), blip['history'])


@pytest.mark.slow
def test_a_partition_longer_than_the_retries(net, tmp_path, data_dir):
    """Node b's link stays down while node a retries once and stops with one line saying what to do; node b,
    cut off, waits on the rendezvous store until its link is back, then finds nobody, retries once and stops
    with the same line. The snapshot of epoch 1 is intact."""
    run, nodes = tmp_path/'run', Nodes(net, tmp_path, retries=(1, 1))
    try:
        nodes.start(*small(run, data_dir))
        _in_epoch_2(nodes, run); t0 = time.monotonic(); net.cut()
        try: nodes.ps[0].wait(600)
        finally: net.heal()
        secs_a = time.monotonic() - t0
        rcs = nodes.wait(); secs = time.monotonic() - t0
    finally: nodes.stop()
    last = [nodes.said(i)[-1] for i in range(2)]
    print(f"a partition longer than --retries 1: node a stopped {secs_a:.0f} s after the cut; the link "
          f"then back, node b stopped {secs - secs_a:.0f} s later; exit codes {rcs}; last lines: {last}")
    assert all(rc not in (0, None) for rc in rcs)
    assert [len(nodes.said(i)) for i in range(2)] == [2, 2], (nodes.said(0), nodes.said(1))
    assert all('no tries are left' in l and 'run this same command on every node' in l for l in last)
    from cifar_ddp_tut.checkpoint import snapshot_progress
    assert snapshot_progress(run/'snapshot.pt')['epochs_run'] == 1  # verifies and loads


@pytest.mark.slow
def test_a_bad_config_is_not_retried(net, tmp_path, data_dir):
    """Node a given a learning rate that is not a number: its program refuses (exit code 2, one line) and
    a's cifar_ddp_node stops though it has tries left. (--max-restarts=0: torchrun would first restart the
    refusing worker itself; node b, with no retries, stops once its worker gives up waiting for a's.)"""
    run, nodes = tmp_path/'run', Nodes(net, tmp_path, retries=(2, 0), max_restarts=0)
    t0 = time.monotonic()
    try:
        nodes.start(*small(run, data_dir, '--lr', 'nan'), b_args=small(run, data_dir))
        rc_a = nodes.ps[0].wait(300); secs_a = time.monotonic() - t0
        rcs = nodes.wait(); secs = time.monotonic() - t0
    finally: nodes.stop()
    refusals = [l for l in nodes.err(0).splitlines() if l.startswith('cifar_ddp_train: error:')]
    print(f"bad config on node a: a exit {rc_a} after {secs_a:.0f} s, not retried; b exit {rcs[1]} after "
          f"{secs:.0f} s; a said: {refusals}; b said: {nodes.said(1)}")
    assert rc_a != 0 and nodes.said(0) == [], nodes.err(0)[-3000:]
    assert len(refusals) == 1 and 'lr=nan' in refusals[0]
    assert 'exitcode  : 2' in nodes.err(0)
    assert not (run/'snapshot.pt').exists()


@pytest.mark.slow
def test_sigterm_during_a_pause(tmp_path):
    """A torchrun that fails (its worker exits 13) and a pause of 120 s: SIGTERM in the pause ends
    cifar_ddp_node at once, exit 128 + SIGTERM, no further try."""
    cmd = [*NODE, '--retries', '3', '--pause', '120', '--standalone', '--nproc_per_node=1',
           '-m', 'cifar_ddp_tut.lessons.launching', '0']
    err = tmp_path/'err'
    p = start_process(cmd, stdout=subprocess.DEVNULL, stderr=open(err, 'w'), cwd=ROOT,
                      env={**os.environ, 'OMP_NUM_THREADS': '1'})
    try:
        wait_for(lambda: 'trying again in 120 s' in err.read_text() or p.poll() is not None, 120, 'the pause')
        t0 = time.monotonic(); p.send_signal(signal.SIGTERM); rc = p.wait(30); secs = time.monotonic() - t0
    finally: stop_process(p, grace_s=0)
    said = [l for l in err.read_text().splitlines() if l.startswith('cifar_ddp_node:')]
    print(f"SIGTERM during a 120 s pause: exit {rc} after {secs:.2f} s; {said}")
    assert rc == 128 + signal.SIGTERM and secs < 2 and len(said) == 1, err.read_text()[-3000:]
    assert 'worker exit code 13' in said[0] and '2 more after this' in said[0]


# ---- fast unit tests of cifar_ddp_node's reading of torchrun (no namespaces, no workers)
def test_the_root_cause_is_the_failure_reported():
    "torchrun's summary lists the other failures first and the root cause (first observed) last."
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from cifar_ddp_tut.node import failure_reason
    killed = ProcessFailure(local_rank=0, pid=1, exitcode=-15, error_file='none')
    root = ProcessFailure(local_rank=1, pid=2, exitcode=13, error_file='none')
    root.timestamp, killed.timestamp = 100, 105
    msg = ChildFailedError('train', {0: killed, 1: root}).format_msg()
    assert msg.index('exitcode  : -15') < msg.index('Root Cause') < msg.index('exitcode  : 13')
    assert failure_reason(1, msg.splitlines()) == 'worker exit code 13'


def test_torchruns_own_refusal_is_not_retried(capsys):
    "A bad torchrun argument (no worker started) ends the node with one line, without a retry."
    from cifar_ddp_tut.node import run_node
    err = __import__('io').StringIO()
    code = run_node(['--standalone', '--nproc_per_node=x', '-m', 'cifar_ddp_tut.train'],
                    retries=2, pause=0, err=err)
    said = [l for l in err.getvalue().splitlines() if l.startswith('cifar_ddp_node:')]
    assert code != 0 and len(said) == 1 and 'refused its arguments' in said[0], err.getvalue()
    assert 'Unsupported nproc_per_node value' in said[0]


def test_sigusr1_is_passed_on_only_when_torchrun_handles_it():
    from cifar_ddp_tut.node import _handled
    assert signal.SIGUSR1 not in _handled(['--nnodes=2', '-m', 'x'])
    assert signal.SIGUSR1 in _handled(['--signals-to-handle=SIGTERM,SIGUSR1', '-m', 'x'])
    assert signal.SIGUSR1 in _handled(['--signals_to_handle', 'SIGUSR1', '-m', 'x'])

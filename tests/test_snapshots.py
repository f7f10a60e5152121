"""Snapshots a run can trust, with real torchrun processes (issue 23). A damaged file is never loaded: a damaged latest
snapshot falls back to the previous one, with one line; with none usable, one line, nothing trained, every file as it
was; --eval_only refuses a damaged checkpoint. SIGTERM (to torchrun), SIGUSR1 (to one rank, or to a torchrun given
--signals-to-handle) stops every rank at
the same step: rank 0 writes a mid-epoch snapshot, every process is gone within 30 s, one line says how to resume, and
the same command resumes and ends with the parameters and history of an uninterrupted run, bit for bit."""
import hashlib, os, re, shutil, signal, struct, time, zipfile
from pathlib import Path
import psutil, pytest, torch
from _util import QUICKSTART, torchrun, run_module, start_torchrun, wait_for, snapshot_value, read_metrics, world_pids, same_history

pytestmark = pytest.mark.slow  # every test here reads a training run (the module's reference)
STEPS = 8  # optimizer steps an epoch: 512 images, batch 64
SMALL = ['--synthetic_train_size', str(STEPS * 64), '--synthetic_test_size', '51', '--epoch', '2', '--plot', 'false']


def _args(save_dir, data_dir, *extra):
    return ['--cfg', QUICKSTART, '--save_dir', save_dir, '--data_dir', data_dir, *SMALL, *extra]


def _lines(text): return [l for l in text.splitlines() if l.startswith('cifar_ddp_train: ')]


def _model(path): return torch.load(path, map_location='cpu', weights_only=True)['model']


def _same_model(a, b):
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "parameters differ"


def _hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def punch_hole(path, n=128):
    "Zero `n` bytes in the middle of the largest record of torch archive `path`, its zip directory intact (bit rot)."
    with zipfile.ZipFile(path) as z: r = max(z.infolist(), key=lambda r: r.compress_size)
    raw = bytearray(Path(path).read_bytes())
    k, e = struct.unpack('<HH', raw[r.header_offset + 26:r.header_offset + 30])
    mid = r.header_offset + 30 + k + e + r.compress_size // 2
    raw[mid:mid + n] = bytes(n)
    Path(path).write_bytes(bytes(raw))


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    "The uninterrupted run: its folder (snapshot.pt, snapshot.prev.pt, best.pt, metrics.jsonl), data, final weights."
    d = tmp_path_factory.mktemp('ref')
    p, secs = torchrun(2, *_args(d/'run', d/'data'))
    assert p.returncode == 0, p.stderr[-3000:]
    hist = read_metrics(d/'run')
    print(f"reference run: {secs:.1f} s")
    return dict(run=d/'run', data=d/'data', history=hist, model=_model(d/'run'/'snapshot.pt'),
                train_secs=STEPS * 64 / hist[-1]['images_per_s'])  # an epoch's training


def _stop(p, sig, pid):
    "Send `sig` to `pid`; wait until torchrun and every worker are gone: (seconds, stderr lines of the program)."
    procs = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    os.kill(pid, sig)
    t0 = time.monotonic()
    p.wait(60)
    wait_for(lambda: not any(q.is_running() and q.status() != psutil.STATUS_ZOMBIE for q in procs), 60,
             'every process to exit')
    return time.monotonic() - t0, _lines(p.err_path.read_text())


def _stopped_at(line, sig, epoch):
    m = re.search(rf"stopped by {sig} after optimizer step (\d+) \(epoch {epoch} of 2, (\d+) of {STEPS} batches\); "
                  r".*snapshot\.pt holds the run up to there; run the same command again to resume from it$", line)
    assert m, line
    return int(m[1]), int(m[2])


def _sigterm_in_first_epoch(args, log_dir, reference, what=''):
    """Start the run, SIGTERM torchrun about a third into epoch 1, and check that every process is gone within 30 s
    with one line: (torchrun's Popen, the program's stderr lines)."""
    p = start_torchrun(2, *args, log_dir=log_dir)
    wait_for(lambda: 'steps per epoch' in p.out_path.read_text() or p.poll() is not None, 300, 'training to start')
    time.sleep(0.3 * reference['train_secs'])
    assert p.poll() is None, p.err_path.read_text()[-3000:]
    secs, lines = _stop(p, signal.SIGTERM, p.pid)
    print(f"SIGTERM{what}: every process gone after {secs:.1f} s: {lines}")
    assert secs < 30 and len(lines) == 1, p.err_path.read_text()[-3000:]
    return p, lines


def test_sigterm_mid_epoch_stops_every_rank_and_resumes_bitwise(tmp_path, reference):
    "SIGTERM to torchrun (what SLURM sends) in the first epoch: one line, a mid-epoch snapshot, all gone within 30 s."
    run, args = tmp_path/'run', _args(tmp_path/'run', reference['data'])
    _, lines = _sigterm_in_first_epoch(args, tmp_path/'logs', reference)
    step, done = _stopped_at(lines[0], 'SIGTERM', 1)
    ck = torch.load(run/'snapshot.pt', map_location='cpu', weights_only=True)
    assert (ck['epochs_run'], ck['batches_done'], ck['step']) == (0, done, step) and 0 < done < STEPS, ck['batches_done']
    p2, secs2 = torchrun(2, *args)
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert f"resuming from {run/'snapshot.pt'}: 0 of 2 epochs done, {done} batches into the next" in p2.stdout
    same_history(read_metrics(run), reference['history'], tol=0)
    _same_model(_model(run/'snapshot.pt'), reference['model'])
    print(f"resumed in {secs2:.1f} s: history and parameters equal the uninterrupted run's")


def test_sigterm_with_dataloader_workers(tmp_path, reference):
    """torchrun sends SIGTERM to each worker's whole process group, DataLoader workers included: they ignore it (else
    each rank would die with 'DataLoader worker ... is killed by signal: Terminated' and save nothing)."""
    run = tmp_path/'run'
    p, lines = _sigterm_in_first_epoch(_args(run, reference['data'], '--num_workers', '1'), tmp_path/'logs', reference,
                                       ' with a DataLoader worker per rank')
    _, done = _stopped_at(lines[0], 'SIGTERM', 1)
    assert snapshot_value(run, 'batches_done') == done and 'killed by signal' not in p.err_path.read_text()


# what README and the SLURM script give torchrun so that it passes SIGUSR1 on (by default SIGUSR1 ends torchrun)
SIGNALS_TO_HANDLE = '--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1'


def test_sigusr1_to_torchrun_with_signals_to_handle(tmp_path, reference):
    """SIGUSR1 to torchrun started with README's --signals-to-handle: torchrun passes it on, every rank stops at the
    same step, rank 0 writes a mid-epoch snapshot, one line, every process gone within 30 s."""
    run, args = tmp_path/'run', _args(tmp_path/'run', reference['data'])
    p = start_torchrun(2, *args, log_dir=tmp_path/'logs', launcher_args=(SIGNALS_TO_HANDLE,))
    wait_for(lambda: snapshot_value(run) >= 1 or p.poll() is not None, 300, 'the first epoch-end snapshot')
    time.sleep(0.3 * reference['train_secs'])
    assert p.poll() is None, p.err_path.read_text()[-3000:]
    secs, lines = _stop(p, signal.SIGUSR1, p.pid)
    print(f"SIGUSR1 to torchrun: every process gone after {secs:.1f} s: {lines}")
    assert secs < 30 and len(lines) == 1, p.err_path.read_text()[-3000:]
    step, done = _stopped_at(lines[0], 'SIGUSR1', 2)
    assert snapshot_value(run, 'step') == step and 0 < snapshot_value(run, 'batches_done') == done < STEPS


def test_sigusr1_to_one_rank_then_damaged_latest_falls_back(tmp_path, reference):
    """SIGUSR1 to rank 1 alone in the second epoch: both ranks stop at the same step (rank 0 writes the snapshot).
    Then 128 zero bytes in snapshot.pt's largest record: the same command says so in its one resuming line, resumes
    from snapshot.prev.pt (the end of epoch 1) and still ends bit for bit where the uninterrupted run did."""
    run, args = tmp_path/'run', _args(tmp_path/'run', reference['data'])
    p = start_torchrun(2, *args, log_dir=tmp_path/'logs')
    wait_for(lambda: snapshot_value(run) >= 1 or p.poll() is not None, 300, 'the first epoch-end snapshot')
    time.sleep(0.3 * reference['train_secs'])
    assert p.poll() is None, p.err_path.read_text()[-3000:]
    secs, lines = _stop(p, signal.SIGUSR1, world_pids(p.out_path.read_text())[1])
    print(f"SIGUSR1 to rank 1: every process gone after {secs:.1f} s: {lines}")
    assert secs < 30 and len(lines) == 1, p.err_path.read_text()[-3000:]
    step, done = _stopped_at(lines[0], 'SIGUSR1', 2)
    assert torch.load(run/'snapshot.prev.pt', weights_only=True)['step'] == STEPS  # the epoch-end snapshot, kept
    punch_hole(run/'snapshot.pt')
    p2, _ = torchrun(2, *args)
    assert p2.returncode == 0, p2.stderr[-3000:]
    resumed = [l for l in p2.stdout.splitlines() if 'resuming' in l]
    print(resumed)
    assert len(resumed) == 1 and resumed[0].startswith(f"resuming from {run/'snapshot.prev.pt'}: 1 of 2 epochs done; "
                                                       "not from snapshot.pt: "), resumed
    assert re.search(rf"snapshot\.pt' is corrupt: 1 record\(s\) fail their CRC-32 check \(.*\); it held step {step}, "
                     rf"so the {step - STEPS} steps after step {STEPS} are trained again$", resumed[0]), resumed[0]
    same_history(read_metrics(run), reference['history'], tol=0)
    _same_model(_model(run/'snapshot.pt'), reference['model'])


def test_no_usable_snapshot_or_another_model_trains_nothing(tmp_path, reference):
    """Intact snapshots but another model (one plain process): one line, exit 1, every file as it was (a mismatch is not
    damage: no fall back). Both snapshots damaged (2 ranks): one line, exit 1, nothing trained, every file as it was."""
    run = tmp_path/'run'
    shutil.copytree(reference['run'], run)
    before = _hashes(run)
    p, _ = run_module('cifar_ddp_tut.train', *_args(run, reference['data'], '--epoch', '3', '--model', 'resnet34'))
    lines = _lines(p.stderr)
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-3000:]
    assert "does not fit this model (it was saved from model='resnet18'" in lines[0], lines[0]
    assert _hashes(run) == before
    punch_hole(run/'snapshot.pt'); punch_hole(run/'snapshot.prev.pt')
    before = _hashes(run)
    p, secs = torchrun(2, *_args(run, reference['data'], '--epoch', '3'))
    lines = _lines(p.stderr)
    print(f"exit {p.returncode} after {secs:.1f} s: {lines}")
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-3000:]
    assert re.search(r"error: no snapshot to resume from: checkpoint='.*snapshot\.pt' is corrupt: .*; and "
                     r"checkpoint='.*snapshot\.prev\.pt' is corrupt: .*; nothing was trained", lines[0]), lines[0]
    assert 'train loss' not in p.stdout and 'cifar_ddp_tut/' not in p.stderr  # no traceback from the program
    assert _hashes(run) == before


def test_eval_only_refuses_a_damaged_checkpoint(tmp_path, reference):
    """A best.pt with 128 zero bytes inside a tensor: --eval_only (one plain process; test_bad_input has 2 ranks refuse
    a junk file with one line) says so in one line and exits non-zero, evaluating nothing."""
    shutil.copy(reference['run']/'best.pt', tmp_path/'best.pt')
    punch_hole(tmp_path/'best.pt')
    p, secs = run_module('cifar_ddp_tut.train', *_args(tmp_path/'eval', reference['data'], '--eval_only', 'true',
                                                        '--checkpoint', tmp_path/'best.pt'))
    lines = _lines(p.stderr)
    print(f"exit {p.returncode} after {secs:.1f} s: {lines}")
    assert p.returncode == 1 and len(lines) == 1, p.stderr[-3000:]
    assert re.search(r"error: checkpoint='.*best\.pt' is corrupt: 1 record\(s\) fail their CRC-32 check", lines[0])
    assert not (tmp_path/'eval'/'eval.json').exists() and 'cifar_ddp_tut/' not in p.stderr

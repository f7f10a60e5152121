"""Faults a user meets during a run, with real processes (issue 9): a loss that turns into NaN, a Ctrl-C, a save_dir
that stops being writable mid-run."""
import errno, hashlib, io, os, re, shutil, signal, time
import pytest, torch
from cifar_ddp_tut.train import OutputError, write_output
from pathlib import Path
from _util import QUICKSTART, torchrun, start_torchrun, wait_for, snapshot_value, read_metrics

SMALL = ['--synthetic_train_size', '640', '--synthetic_test_size', '101', '--plot', 'false']


def _hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def _errors(stderr): return [l for l in stderr.splitlines() if 'cifar_ddp_train: ' in l]


@pytest.mark.slow
def test_nan_loss_stops_every_rank_and_keeps_the_last_good_files(tmp_path, small_run):
    """A good run (a copy of conftest's), then a run whose loss explodes (lr 1e4): every rank stops within nan_check_every steps
    with one line naming the epoch and steps, exit 1, and snapshot.pt, best.pt and metrics.jsonl stay byte for byte the
    good run's."""
    shutil.copytree(small_run.save_dir, tmp_path/'run')
    common = ['--cfg', QUICKSTART, '--save_dir', tmp_path/'run', '--data_dir', small_run.data_dir, *SMALL]
    good = _hashes(tmp_path/'run')
    p, secs = torchrun(2, *common, '--epoch', '2', '--resume', 'false', '--lr', '1e4', '--nan_check_every', '5')
    errors = _errors(p.stderr)
    print(f"exit {p.returncode} after {secs:.1f} s: {errors}")
    assert p.returncode != 0 and len(errors) == 1, p.stderr[-3000:]
    assert re.search(r"error: the training loss became nan or inf in epoch 1, between optimizer steps \d+ and \d+", errors[0])
    assert 'lower lr (now 10000)' in errors[0]
    assert 'epoch 1/2: train loss' not in p.stdout  # stopped inside the epoch: nothing logged as if it were fine
    assert _hashes(tmp_path/'run') == good


@pytest.mark.slow
def test_ctrl_c_says_once_what_was_kept(tmp_path):
    "SIGINT to torchrun (what Ctrl-C in a terminal sends): one line from rank 0 saying what the snapshot holds; no tracebacks."
    args = ['--cfg', QUICKSTART, '--save_dir', tmp_path/'run', '--data_dir', tmp_path/'data', *SMALL, '--epoch', '30']
    p = start_torchrun(2, *args, log_dir=tmp_path/'logs')
    wait_for(lambda: snapshot_value(tmp_path/'run') >= 1 or p.poll() is not None, 300, 'the first snapshot')
    assert p.poll() is None, f"the run ended by itself (exit {p.returncode}):\n{p.err_path.read_text()[-3000:]}"
    os.kill(p.pid, signal.SIGINT)
    p.wait(120)
    err = p.err_path.read_text()
    lines = _errors(err)
    print(lines)
    assert len(lines) == 1 and 'cifar_ddp_train: interrupted; ' in lines[0], err[-3000:]
    assert re.search(r"snapshot\.pt holds \d+ epoch\(s\).*; run the same command again to resume from it", lines[0])
    assert 'KeyboardInterrupt' not in err and 'cifar_ddp_tut/' not in err, err[-3000:]
    assert snapshot_value(tmp_path/'run') >= 1  # the snapshot survived


@pytest.mark.slow
def test_unwritable_save_dir_mid_run_names_the_file(tmp_path):
    """save_dir becomes unusable after the run started (here: metrics.jsonl replaced by a folder, as a full or read-only
    disk would make the write fail): rank 0 names the file and what was kept, exit non-zero, no traceback."""
    args = ['--cfg', QUICKSTART, '--save_dir', tmp_path/'run', '--data_dir', tmp_path/'data', *SMALL, '--epoch', '30']
    p = start_torchrun(2, *args, log_dir=tmp_path/'logs')
    wait_for(lambda: snapshot_value(tmp_path/'run') >= 1 or p.poll() is not None, 300, 'the first snapshot')
    assert p.poll() is None, f"the run ended by itself (exit {p.returncode}):\n{p.err_path.read_text()[-3000:]}"
    m = tmp_path/'run'/'metrics.jsonl'
    m.unlink(); m.mkdir()  # os.replace(file, folder) now fails with an OSError
    (m/'x').write_text('a file inside, so the folder cannot be replaced')
    rc = p.wait(180)
    err = p.err_path.read_text()
    lines = _errors(err)
    print(lines)
    assert rc != 0
    assert any("could not write" in l and "metrics.jsonl" in l and "snapshot.pt are kept" in l for l in lines), err[-3000:]
    assert 'cifar_ddp_tut/' not in err, err[-3000:]
    assert snapshot_value(tmp_path/'run') >= 1


class _FullDisk(io.RawIOBase):
    "A file on a full disk: every write fails with ENOSPC."
    def writable(self): return True
    def write(self, b): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_inside_torch_save_names_the_file(tmp_path):
    """torch.save reports a failed write as a RuntimeError ('unexpected pos ...'), not an OSError (a full disk made
    CI's rank 0 die with that traceback): write_output still names the file, and the old file and no temporary stay."""
    path = tmp_path/'snapshot.pt'
    path.write_bytes(b'the previous snapshot')
    with pytest.raises(OutputError, match=r"could not write '.*snapshot\.pt' \(No space left on device\); free space"):
        write_output(path, lambda f: torch.save({'w': torch.zeros(100_000)}, _FullDisk()), 'free space')
    assert path.read_bytes() == b'the previous snapshot'
    assert [p.name for p in tmp_path.iterdir()] == ['snapshot.pt']
    with pytest.raises(RuntimeError, match='not a write failure'):  # other errors pass through unchanged
        write_output(path, lambda f: (_ for _ in ()).throw(RuntimeError('not a write failure')), 'x')

"The foundation, end to end: the quickstart under torchrun on 2 gloo processes, and a plain single process."
import sys
import pytest
from pathlib import Path
from _util import QUICKSTART, ROOT, read_metrics
from cifar_ddp_tut.checkpoint import load_checkpoint, load_model_state
from cifar_ddp_tut.config import load_config
from cifar_ddp_tut.model import build_model
from cifar_ddp_tut.launch import run_process


@pytest.mark.slow
def test_quickstart_two_processes(quickstart_run):
    """README's command on 2 processes (conftest's `quickstart_run`: 5 epochs at lr 0.01 and 1,000 test images, the
    settings of the accuracy comparison in test_bench.py, which reads the same run)."""
    out, hist = quickstart_run.save_dir, quickstart_run.history
    assert [h['epoch'] for h in hist] == [1, 2, 3, 4, 5]  # counted from 1, as on the console
    for h in hist:
        assert set(h) >= {'train_loss', 'train_acc', 'val_loss', 'val_acc', 'lr', 'seconds', 'peak_mem_gb'}
        assert h['val_count'] == 1000  # every test image once
    assert hist[-1]['val_acc'] > 0.6, hist  # chance is 0.1
    assert hist[-1]['train_loss'] < hist[0]['train_loss']
    # rank 0 alone prints the per-epoch lines
    assert quickstart_run.stdout.count('epoch 5/5: train loss') == 1, quickstart_run.stdout
    # the best model loads, weights_only, into a fresh model built from the same config
    ck = load_checkpoint(out/'best.pt')
    cfg = load_config(QUICKSTART)
    model = build_model(cfg)
    load_model_state(model, ck)
    assert abs(ck['val_acc'] - max(h['val_acc'] for h in hist)) < 1e-12
    png = (out/'curves.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10_000
    print(f"quickstart: {quickstart_run.seconds:.1f} s, final val acc {hist[-1]['val_acc']:.4f}")


def test_single_plain_process(tmp_path):
    "No torchrun, no process group: the same program runs as one ordinary process."
    out = tmp_path/'run'
    cmd = [sys.executable, '-m', 'cifar_ddp_tut.train', '--cfg', str(QUICKSTART), '--save_dir', str(out),
           '--data_dir', str(tmp_path/'data'), '--epoch', '1', '--max_steps_per_epoch', '4', '--synthetic_train_size', '300',
           '--synthetic_test_size', '51', '--plot', 'false']
    p = run_process(cmd, 180, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert '1 process(es) on cpu (no process group)' in p.stdout
    h, = read_metrics(out)
    assert h['val_count'] == 51 and h['step'] == 4
    assert (out/'snapshot.pt').exists() and not (out/'curves.png').exists()


def test_console_script_help():
    "The console script `cifar_ddp_train` is installed beside this interpreter and documents every key."
    script = Path(sys.executable).parent/'cifar_ddp_train'
    assert script.exists(), "pip install -e . should install the cifar_ddp_train console script"
    p = run_process([script, '--help'], 60)
    assert p.returncode == 0, p.stderr
    for key in ('--batch_size', '--save_dir', '--eval_only', '--timeout_s', 'GLOBAL batch'): assert key in p.stdout

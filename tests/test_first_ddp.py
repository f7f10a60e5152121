"""The scripts in steps/ beyond what nbs/course/01_first_ddp.ipynb runs and checks (one process; s2
under mp.spawn with 1 and 2 processes; s3 under torchrun with 2; two torchrun launchers as two nodes;
GroupNorm 2 x 16 = 1 x 32): s3 under torchrun with one process is step 1, digit for digit; and the
diffs saved in the notebook (one line of context) are those of the scripts as they are now."""
import json, re
import pytest
import torch
from _util import ROOT
from cifar_ddp_tut.data import write_synthetic_cifar10
from cifar_ddp_tut.launch import TORCHRUN
from cifar_ddp_tut.lessons.figures import diff_html, listing_html
from cifar_ddp_tut.lessons.tools import results, run

STEPS = ROOT/'steps'
TINY = ['--epochs', 2, '--steps', 3]  # 2 epochs of 3 steps of 32 images
TIMEOUT = 240


def epoch_lines(out): return re.findall(r'^epoch \d+: .*$', out, re.M)


@pytest.mark.slow
def test_torchrun_world_of_one_is_one_process(tmp_path):
    """s1 saves the plain model's weights; s3 under torchrun with one process runs the DDP code path
    and prints s1's numbers, digit for digit (the notebook shows s2 with one process does)."""
    write_synthetic_cifar10(tmp_path/'data', n_train=128, n_test=16, seed=0)
    out1 = run(str(STEPS/'s1_one_process.py'), *TINY, '--data', 'data', '--out', 's1.pt', cwd=tmp_path,
               timeout=TIMEOUT, show=False)
    r1 = results(out1)
    assert len(epoch_lines(out1)) == 2 and r1['per_rank_batch'] == [32, 32], out1
    assert all(0 < l < 5 for l in r1['losses']), out1
    sd = torch.load(tmp_path/'s1.pt')
    assert not any(k.startswith('module.') for k in sd) and sd['fc.weight'].shape == (10, 512)
    out3 = run(*TORCHRUN[1:], '--standalone', '--nproc_per_node=1', str(STEPS/'s3_torchrun.py'),
               *TINY, '--data', 'data', '--out', 's3.pt', cwd=tmp_path, timeout=TIMEOUT, show=False)
    r3 = results(out3)
    assert len(epoch_lines(out3)) == 2 and out3.count('param_sum') == 1, out3
    assert (r3['losses'], r3['param_sum'], r3['per_rank_batch']) == (r1['losses'], r1['param_sum'],
                                                                     r1['per_rank_batch']), (r3, r1)
    assert len(r3['ranks']) == 1


def test_notebook_diffs_are_current():
    "Every listing and diff saved in the notebook equals one computed now from steps/."
    nb = json.loads((ROOT/'nbs'/'course'/'01_first_ddp.ipynb').read_text())
    shown = []
    for cell in nb['cells']:
        for o in cell.get('outputs', []):
            h = ''.join(o.get('data', {}).get('text/html', ''))
            h = re.sub(r'^<details><summary>[^<]*</summary>(.*)</details>$', r'\1', h, flags=re.S)
            m = re.match(r'<div class="step-(diff|file)"(?: data-old="([^"]+)")? '
                         r'data-new="([^"]+)"', h)
            if not m: continue
            kind, old, new = m.groups()
            now = (diff_html(STEPS/old, STEPS/new, context=1) if kind == 'diff'
                   else listing_html(STEPS/new))
            assert h == now, f"{old} -> {new} changed: re-run nbs/course/01_first_ddp.ipynb and save it"
            shown.append((old, new))
    assert shown == [('s1_one_process.py', 's2_spawn.py'), ('s2_spawn.py', 's3_torchrun.py')], shown

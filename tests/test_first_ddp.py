"""The scripts in steps/, run for real: one process, DDP under mp.spawn with 1 and 2 processes,
under torchrun with 1 and 2, and two torchrun launchers as two nodes; and the diffs saved in
nbs/course/01_first_ddp.ipynb are those of the scripts as they are now."""
import json, re
import pytest
import torch
from _util import ROOT
from cifar_ddp_tut.data import write_synthetic_cifar10
from cifar_ddp_tut.dist import free_port
from cifar_ddp_tut.lessons.tools import diff_html, listing_html, results, run, run_together

STEPS = ROOT/'steps'
TORCHRUN = ['-m', 'torch.distributed.run']
TINY = ['--epochs', 2, '--steps', 3]  # 2 epochs of 3 steps of 32 images
TIMEOUT = 240


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp('steps')
    write_synthetic_cifar10(d/'data', n_train=128, n_test=16, seed=0)
    return d


_done = {}

def step(work, key):
    "(output, results) of one of the runs the tests compare, run once, on first use."
    if (work, key) in _done: return _done[work, key]
    s = lambda name: str(STEPS/name)
    spawn = lambda n: (s('s2_spawn.py'), '--world_size', n, '--port', free_port())
    torchrun = lambda n: (*TORCHRUN, '--standalone', f'--nproc_per_node={n}', s('s3_torchrun.py'))
    group = ('--norm', 'group', '--epochs', 1, '--steps', 3)
    cmd = {'s1': (s('s1_one_process.py'), *TINY), 's2x1': (*spawn(1), *TINY),
           's2x2': (*spawn(2), *TINY), 's3x1': (*torchrun(1), *TINY), 's3x2': (*torchrun(2), *TINY),
           'g1': (s('s1_one_process.py'), *group), 'g2': (*spawn(2), *group)}[key]
    out = run(*cmd, '--data', 'data', '--out', f'{key}.pt', cwd=work, timeout=TIMEOUT, show=False)
    _done[work, key] = out, results(out)
    return _done[work, key]


def epoch_lines(out): return re.findall(r'^epoch \d+: .*$', out, re.M)


@pytest.mark.slow
def test_one_process(work):
    out, r = step(work, 's1')
    assert len(epoch_lines(out)) == 2 and r['per_rank_batch'] == [32, 32], out
    assert all(0 < l < 5 for l in r['losses']), out
    sd = torch.load(work/'s1.pt')
    assert not any(k.startswith('module.') for k in sd) and sd['fc.weight'].shape == (10, 512)


@pytest.mark.slow
def test_spawn_world_of_one_is_one_process(work):
    "s2 with --world_size 1 runs the DDP code path and prints step 1's numbers, digit for digit."
    out, r = step(work, 's2x1')
    _, r1 = step(work, 's1')
    assert (r['losses'], r['param_sum'], r['per_rank_batch']) == (r1['losses'], r1['param_sum'],
                                                                  r1['per_rank_batch']), (r, r1)
    assert len(r['ranks']) == 1


@pytest.mark.slow
def test_spawn_two_processes(work):
    "Two processes: rank 0 alone prints and saves, 16 images each a step, both replicas identical."
    out, r = step(work, 's2x2')
    assert len(epoch_lines(out)) == 2 and out.count('param_sum') == 1, out
    assert r['per_rank_batch'] == [16, 16]
    assert len(r['ranks']) == 2 and r['ranks'][0] == r['ranks'][1], r
    sd = torch.load(work/'s2x2.pt')  # the inner model's weights, without DDP's prefix
    assert not any(k.startswith('module.') for k in sd)
    assert abs(sum(v.double().sum().item() for k, v in sd.items()
                   if 'running' not in k and 'num_batches' not in k) - r['param_sum']) < 1e-6
    # with BatchNorm each rank normalises over its 16 images: not step 1's numbers
    assert r['param_sum'] != step(work, 's1')[1]['param_sum']


@pytest.mark.slow
def test_torchrun_same_as_spawn(work):
    "Under torchrun with 1 and 2 processes, s3 prints exactly what s2 printed with as many."
    for n in (1, 2):
        out, r = step(work, f's3x{n}')
        assert len(epoch_lines(out)) == 2 and out.count('param_sum') == 1, out
        assert r == step(work, f's2x{n}')[1], (n, r)


@pytest.mark.slow
def test_two_launchers_as_two_nodes(work):
    "Two torchrun launchers (--nnodes=2, one process each) run s3 unchanged: s3x2's numbers."
    node = [*TORCHRUN, '--nnodes=2', '--nproc_per_node=1', '--rdzv_backend=c10d',
            f'--rdzv_endpoint=127.0.0.1:{free_port()}', '--rdzv_id=steps-test',
            str(STEPS/'s3_torchrun.py'), *TINY, '--data', 'data', '--out', 'nodes.pt']
    outs = run_together([node, node], cwd=work, timeout=TIMEOUT, show=False)
    assert sorted(o.count('param_sum') for o in outs) == [0, 1], outs  # one rank 0 in the job
    assert results(''.join(outs)) == step(work, 's3x2')[1]


@pytest.mark.slow
def test_groupnorm_two_processes_equal_one(work):
    "Without BatchNorm, 2 processes x 16 images train the weights of 1 x 32, to float rounding."
    import torchvision
    for k in ('g1', 'g2'): step(work, k)
    g1, g2 = (torch.load(work/f'{k}.pt') for k in ('g1', 'g2'))
    torch.manual_seed(0)  # the scripts' starting weights, to see that training moved them
    g0 = torchvision.models.resnet18(num_classes=10, norm_layer=lambda c: torch.nn.GroupNorm(32, c))
    g0 = g0.state_dict()
    moved = max((g1[k] - g0[k]).abs().max().item() for k in g0)
    diff = max((g2[k] - g1[k]).abs().max().item() for k in g0)
    print(f"GroupNorm, 3 steps: moved {moved:.3g}, 2 x 16 vs 1 x 32 differ by {diff:.2g}")
    assert moved > 1e-3 and diff < 1e-5, (moved, diff)


def test_notebook_diffs_are_current():
    "Every listing and diff saved in the notebook equals one computed now from steps/."
    nb = json.loads((ROOT/'nbs'/'course'/'01_first_ddp.ipynb').read_text())
    shown = []
    for cell in nb['cells']:
        for o in cell.get('outputs', []):
            h = ''.join(o.get('data', {}).get('text/html', ''))
            m = re.match(r'<div class="step-(diff|file)"(?: data-old="([^"]+)")? '
                         r'data-new="([^"]+)"', h)
            if not m: continue
            kind, old, new = m.groups()
            now = diff_html(STEPS/old, STEPS/new) if kind == 'diff' else listing_html(STEPS/new)
            assert h == now, f"{old} -> {new} changed: re-run nbs/course/01_first_ddp.ipynb and save it"
            shown.append((old, new))
    assert shown == [(None, 's1_one_process.py'), ('s1_one_process.py', 's2_spawn.py'),
                     ('s2_spawn.py', 's3_torchrun.py')], shown

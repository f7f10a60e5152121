"""Distributed semantics held with real gloo processes: DDP == big batch, no_sync accumulation, exact evaluation,
sampler facts, checkpoints across wrappers, SyncBatchNorm refused on CPU. The sampler facts on real processes and
DDP's `module.` keys are proved in test_pitfalls.py (test_set_epoch, test_module_prefix)."""
import json
import numpy as np
import pytest
import torch
from _util import QUICKSTART, torchrun
from cifar_ddp_tut.dist import DistEnv
from cifar_ddp_tut.lessons.tools import launch
from cifar_ddp_tut.lessons.semantics import ddp_checks, train_steps, tiny_config
from cifar_ddp_tut.checkpoint import save_atomic, load_checkpoint, load_model_state
from cifar_ddp_tut.model import build_model

TOL = 1e-5  # float32 rounding after 3 SGD steps (measured: 1.2e-7); values printed with pytest -s


@pytest.fixture(scope='module')
def single(): return ddp_checks(DistEnv())


@pytest.fixture(scope='module')
def two(): return launch(ddp_checks, 2, timeout_s=300)


def _worst(res, ref, key='plain'): return max(float(np.abs(r[key][0] - ref[key][0]).max()) for r in res)


def test_ddp_two_processes_equal_one_big_batch(single, two):
    moved = float(np.abs(single['plain'][0] - train_steps(DistEnv(), steps=0, per_rank=12)[0]).max())
    worst = _worst(two, single)
    print(f"N=2: max |param diff| vs single process {worst:.2e} (largest update {moved:.2e})")
    assert worst < TOL and moved > 1000 * worst
    assert np.array_equal(two[0]['plain'][0], two[1]['plain'][0])  # replicas bit-identical


def test_ddp_three_processes_equal_one_big_batch(single):
    three = launch(ddp_checks, 3, 12, 3, False, timeout_s=300)
    worst = _worst(three, single)
    print(f"N=3: max |param diff| vs single process {worst:.2e}")
    assert worst < TOL
    assert all(np.array_equal(r['plain'][0], three[0]['plain'][0]) for r in three)


def test_batchnorm_in_training_mode_differs(single, two):
    "Per-rank batch statistics really change the result: the reason for freeze_bn / SyncBatchNorm."
    assert _worst(two, single, 'bn_train') > 100 * TOL


def test_accumulation_with_no_sync_equals_plain(two):
    plain, accum = two[0]['plain'], two[0]['accum']
    diff = float(np.abs(plain[0] - accum[0]).max())
    print(f"accumulate_steps=3 vs 1: max |param diff| {diff:.2e}; all-reduce hook calls {accum[1]} vs {plain[1]}")
    assert diff < TOL
    assert accum[1] == plain[1] > 0  # no_sync skipped the all-reduce on the first two micro-batches


@pytest.mark.slow
def test_eval_only_exact_for_any_world_size(tmp_path, small_run):
    "The same checkpoint (conftest's small run) evaluated by 1, 2 and 3 processes: same count, same correct, same loss."
    train_dir = small_run.save_dir
    common = ['--cfg', QUICKSTART, '--data_dir', small_run.data_dir, '--synthetic_train_size', '640',
              '--synthetic_test_size', '101']
    results = {}
    for n in (1, 2, 3):
        out = tmp_path/f'eval{n}'
        p, _ = torchrun(n, *common, '--eval_only', 'true', '--checkpoint', train_dir/'best.pt', '--save_dir', out, '--batch_size', 6)
        assert p.returncode == 0, p.stderr[-3000:]
        results[n] = json.loads((out/'eval.json').read_text())
        assert results[n]['world_size'] == n
    print({n: (r['count'], r['correct'], r['loss']) for n, r in results.items()})
    for n in (2, 3):
        assert results[n]['count'] == results[1]['count'] == 101
        assert results[n]['correct'] == results[1]['correct']
        assert abs(results[n]['loss'] - results[1]['loss']) < 1e-5


def test_sampler_shards_disjoint_cover_and_reshuffle():
    "In one process, rank as an argument: every world size and epoch splits 48 items into disjoint covering shards."
    from torch.utils.data.distributed import DistributedSampler
    for world in (2, 3, 4):
        orders = []
        for epoch in range(3):
            shards = []
            for r in range(world):
                s = DistributedSampler(range(48), num_replicas=world, rank=r, shuffle=True, seed=7); s.set_epoch(epoch)
                shards.append(list(s))
            assert sorted(sum(shards, [])) == list(range(48))
            orders.append(tuple(shards[0]))
        assert len(set(orders)) == 3  # set_epoch: a new order every epoch


def test_checkpoint_between_compiled_and_plain(tmp_path):
    torch.manual_seed(0)
    net, compiled = build_model(tiny_config()), torch.compile(build_model(tiny_config()))
    save_atomic({'model': net.state_dict()}, tmp_path/'plain.pt')
    load_model_state(compiled, load_checkpoint(tmp_path/'plain.pt'))
    save_atomic({'model': compiled.state_dict()}, tmp_path/'compiled.pt')
    assert next(iter(load_checkpoint(tmp_path/'compiled.pt')['model'])).startswith('_orig_mod.')
    back = build_model(tiny_config())
    load_model_state(back, load_checkpoint(tmp_path/'compiled.pt'))
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), net.state_dict().values()))


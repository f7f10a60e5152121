"""Distributed semantics: sampler facts, checkpoints across wrappers (exact evaluation for any world size:
test_correctness.py). DDP == one big batch on 2 and 3 processes, BatchNorm's difference and no_sync
accumulation are run and checked once, in nbs/course/05_guarantees.ipynb. The sampler facts on real processes and
DDP's `module.` keys are proved in test_pitfalls.py (test_set_epoch, test_module_prefix)."""
import json
import pytest
import torch
from _util import QUICKSTART, torchrun
from cifar_ddp_tut.lessons.semantics import tiny_config
from cifar_ddp_tut.checkpoint import save_atomic, load_checkpoint, load_model_state
from cifar_ddp_tut.model import build_model

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



def test_accumulated_step_is_one_big_batch_in_one_process():
    "course/05's accumulated_step (3 micro-batches, loss / 3) gives plain_step's weights, BatchNorm frozen."
    from cifar_ddp_tut.dist import DistEnv
    from cifar_ddp_tut.lessons.semantics import train_steps, accumulated_step
    plain, calls = train_steps(DistEnv(), steps=2, per_rank=6)
    accum, _ = train_steps(DistEnv(), steps=2, per_rank=6, step=accumulated_step)
    assert calls == [0, 0]                      # no DDP in one process: no all-reduce
    assert abs(plain - accum).max() < 1e-5

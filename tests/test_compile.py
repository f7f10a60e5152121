"""`compile: true` trains the same model as eager code, in both places compile can wrap (`compile_scope`), on 2
real gloo processes, and torch's kernel cache goes where `compile_cache_dir` says (CUDA graphs on a CPU:
test_bad_input's cuda_graphs_on_cpu). The GPU timings of these options are the benchmark's (nbs/program/09_benchmark.ipynb), not a test's."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from cifar_ddp_tut.config import Config
from cifar_ddp_tut.launch import launch_workers
from cifar_ddp_tut.model import build_optimizer, prepare_model


def train_tiny(env, values:dict, steps:int=3) -> dict:
    "A small conv net through `prepare_model` and SGD for `steps` steps on this rank's own batches."
    torch.manual_seed(0)  # the same initial weights on every rank and in every launch
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(8, 10))
    cfg = Config(pretrained=False, lr=0.1, momentum=0.9, **values)
    model, bare = prepare_model(net, cfg, env)
    opt, g, losses = build_optimizer(model, cfg, env), torch.Generator().manual_seed(env.rank), []
    for _ in range(steps):
        x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)
        loss = F.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return dict(losses=losses, params=[p.detach().clone() for p in bare.parameters()],
                compiled=type(model).__name__ == 'OptimizedModule' or bare._compiled_call_impl is not None)


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path):
    cache = tmp_path/'kernels'
    runs = {scope: launch_workers(train_tiny, 2, dict(compile=scope != 'eager', compile_scope=scope if scope != 'eager'
                                                      else 'ddp', compile_cache_dir=str(cache)),
                                  backend='gloo', job_timeout_s=600)
            for scope in ('eager', 'ddp', 'module')}
    eager = runs['eager']
    for scope, ranks in runs.items():
        assert [r['compiled'] for r in ranks] == [scope != 'eager'] * 2, scope
        for rank, (r, e) in enumerate(zip(ranks, eager)):
            # each rank's own losses (different batches), the same as eager's to float rounding
            assert r['losses'] == pytest.approx(e['losses'], rel=1e-4, abs=1e-5), (scope, rank)
            for p, q in zip(r['params'], e['params']): torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
        for p, q in zip(ranks[0]['params'], ranks[1]['params']): assert torch.equal(p, q), scope  # DDP: in step
    assert any(cache.rglob('*')), "torch wrote no compiled kernels to compile_cache_dir"


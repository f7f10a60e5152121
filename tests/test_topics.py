"The DDP topics of nbs/course/06_topics.ipynb, held with real gloo processes."
import numpy as np
from cifar_ddp_tut.lessons.tools import launch
from cifar_ddp_tut.lessons.topics import compile_worker, demo_uneven, demo_unused, lr_worker


def test_find_unused_parameters():
    """A branch unused on step 1 makes DDP raise at step 2; find_unused_parameters=True trains;
    static_graph trains when the unused set is fixed and raises when it changes."""
    res = launch(demo_unused, 2, timeout_s=300)
    for r in res:
        assert r['plain']['log'][:2] == ['step 0: ok', 'step 1: ok'], r['plain']
        assert 'Expected to have finished reduction in the prior iteration' in r['plain']['error']
        assert 'find_unused_parameters=True' in r['plain']['error']
        assert r['find_unused']['error'] is None and len(r['find_unused']['log']) == 4
        assert r['static_never']['error'] is None and len(r['static_never']['log']) == 4
        assert 'graph has changed' in r['static_changing']['error']


def test_join_lets_uneven_ranks_finish():
    """Rank 0 has 3 batches, rank 1 has 5: without Join rank 1 times out in its 4th all-reduce
    (3 s group timeout, no hang); with Join both finish their own batches with equal models."""
    res = launch(demo_uneven, 2, timeout_s=300)
    plain, join, least = ([r[m] for r in res] for m in ('plain', 'join', 'min'))
    assert [p['steps'] for p in plain] == [3, 3] and plain[0]['error'] is None
    assert 'Timed out' in plain[1]['error'], plain[1]
    assert [j['steps'] for j in join] == [3, 5] and all(j['error'] is None for j in join)
    assert join[0]['weight'] == join[1]['weight']  # Join syncs the final model
    assert [m['steps'] for m in least] == [3, 3] and least[0]['weight'] == least[1]['weight']


def test_fixed_global_batch_same_training_for_any_world_size():
    "Global batch 64 split 64/N a rank: the same parameters (to float rounding) for N = 1, 2, 4."
    params = {n: launch(lr_worker, n, {'a': (64 // n, 0.02, 0)}, 1, timeout_s=300)[0]['a']['params']
              for n in (1, 2, 4)}
    for n in (2, 4):
        assert np.abs(params[n] - params[1]).max() < 1e-5, n
    start = launch(lr_worker, 1, {'a': (64, 0.0, 0)}, 1, timeout_s=300)[0]['a']['params']  # lr 0
    moved = np.abs(params[1] - start).max()
    assert moved > 1e-2  # the training did move the parameters


def test_compile_ddp_matches_eager_and_splits_at_buckets():
    """torch.compile (aot_eager) + DDP on 2 processes: DDPOptimizer splits the graph per bucket (one
    graph with optimize_ddp off, or when the model was first compiled by a call outside DDP) and
    training gives the same parameters as eager DDP."""
    variants = ('eager', 'inner', 'outer, no split', 'inner, first call without DDP')
    res = launch(compile_worker, 2, variants, timeout_s=400)
    for r in res:
        graphs = r['inner']['graphs']
        assert len(graphs) == 4 and sum(graphs) == 5, graphs  # 4 buckets, 5 linear layers
        assert r['outer, no split']['graphs'] == [5]
        assert r['inner, first call without DDP']['graphs'] == [5]
        for v in variants[1:]:
            assert np.abs(r[v]['params'] - r['eager']['params']).max() < 1e-5, v

"""What DDP(model) does, held with real gloo processes (nbs/course/03_inside_ddp.ipynb): the
constructor broadcasts rank 0's state; DDP written from scratch (a hook per gradient, and buckets
all-reduced asynchronously) reaches torch's DDP's parameters and buffers, and follows its rule for
when buffers are broadcast; torch's bucket sizes, no_sync and gradient views; SyncBatchNorm written
out with all_reduce equals BatchNorm on the global batch; torch's SyncBatchNorm refuses CPU
processes."""
import pytest
from cifar_ddp_tut.lessons.tools import launch
from cifar_ddp_tut.lessons.machinery import (broadcast_at_construction, buffer_sync_rule,
                                             compare_wrappers, sync_bn_check, sync_bn_on_cpu,
                                             torch_ddp_features)

TOL = 1e-5  # float32 rounding; measured 0.0 on 2 ranks (a/2 + b/2 does not depend on order)


def test_ddp_constructor_broadcasts_rank0_params_and_buffers():
    "Ranks seeded differently (and with different BN statistics) hold rank 0's state after DDP()."
    res = launch(broadcast_at_construction, 2, timeout_s=300)
    before0, before1 = res[0]['before'], res[1]['before']
    assert before0['conv1'] != before1['conv1'] and before0['param_sum'] != before1['param_sum']
    assert before0['buffer_sum'] != before1['buffer_sum']
    assert res[1]['after'] == before0 and res[0]['after'] == before0   # weights AND buffers
    assert res[0]['same_object'] and res[1]['same_object']             # in place: ddp.module is it


@pytest.fixture(scope='module')
def compared():
    kinds = ('torch DDP', 'ScratchDDP', 'BucketDDP', 'ScratchDDP, no buffer broadcast')
    return launch(compare_wrappers, 2, kinds, 3, 4, 5, timeout_s=300)


@pytest.mark.parametrize('kind', ['ScratchDDP', 'BucketDDP'])
def test_from_scratch_ddp_equals_torch_ddp(compared, kind):
    "3 SGD steps of ResNet-18 (BN training mode, rank-dependent init): same params and buffers."
    for r, res in enumerate(compared):
        x = res[kind]
        print(f"{kind} rank {r}: params {x['params_vs_ref']:.1e}, buffers "
              f"{x['buffers_vs_ref']:.1e}, moved {x['moved']:.3f}, "
              f"collectives {x['collectives_per_step']}")
        assert x['params_vs_ref'] < TOL and x['buffers_vs_ref'] < TOL
        assert x['between_ranks'] == 0
        assert x['moved'] > 1e4 * TOL                   # the parameters really changed
        assert res['torch DDP']['between_ranks'] == 0


def test_buckets_need_fewer_collectives(compared):
    "An all-reduce per parameter tensor (62), or one per 5 MB bucket; and 2 broadcasts."
    hooks = compared[0]['ScratchDDP']['collectives_per_step']
    buckets = compared[0]['BucketDDP']['collectives_per_step']
    assert hooks == ['62 + 2'] * 3
    n = int(buckets[0].split(' + ')[0])
    assert 1 < n < 62 and buckets == [f"{n} + 2"] * 3


def test_without_buffer_broadcast_rank1_buffers_drift(compared):
    "BN in training mode: params unaffected, but rank 1's running stats drift from torch DDP's."
    x0 = compared[0]['ScratchDDP, no buffer broadcast']
    x1 = compared[1]['ScratchDDP, no buffer broadcast']
    assert x0['params_vs_ref'] < TOL and x1['params_vs_ref'] < TOL
    assert x0['buffers_vs_ref'] < TOL          # rank 0's buffers are its own either way
    assert x1['buffers_vs_ref'] > 1e-3


def test_buffers_broadcast_only_after_a_synchronised_training_forward():
    "Torch's DDP and ScratchDDP skip the buffer broadcast after a no_grad or no_sync forward."
    rule = launch(buffer_sync_rule, 2, timeout_s=300)[1]
    print(rule)
    assert rule['ScratchDDP'] == rule['torch DDP']
    assert rule['forwards'] == ('train', 'no_grad', 'train', 'no_sync', 'train', 'train')
    assert [v > 0 for v in rule['torch DDP']] == [False, False, True, False, True, False]


def test_torch_ddp_buckets_no_sync_and_gradient_views():
    """One bucket in step 1; then the cap, with a small first bucket only when bucket_cap_mb is not
    given; no_sync skips the all-reduce; with zero_grad(set_to_none=True) every gradient is copied
    into its bucket each backward, bucket views or not."""
    feat = launch(torch_ddp_features, 2, timeout_s=300)
    b = feat[0]['buckets_mb']
    print(b, feat[0]['views'])
    assert [len(steps[0]) for steps in b.values()] == [1, 1, 1]
    assert len(b[None][1]) == 3 and b[None][1][0] < 10 < b[None][1][1]   # 1 MiB first cap
    assert len(b[25][1]) == 2 and b[25][1][0] > 25                       # explicit 25: no small one
    ns = feat[1]['no_sync']
    assert ns['inside'] == 0 and ns['grads_vs_rank0_inside'] > 0 and ns['grads_vs_rank0_after'] == 0
    v = feat[0]['views']
    assert [v[k]['copies'] for k in ((False, True), (True, True), (True, False))] == [62, 62, 0]
    assert v[True, True]['none_after_zero_grad'] == 62 and v[True, True]['storages'] == 6


def test_written_out_sync_bn_equals_global_batch_bn():
    "Per-rank sums, sums of squares and counts, all-reduced: BatchNorm2d over the global batch."
    for x in launch(sync_bn_check, 2, timeout_s=300):
        print(x)
        for k in ('output', 'input_grad', 'weight_grad_summed', 'running_mean', 'running_var'):
            assert x[k] < 1e-4, (k, x[k])
        assert x['plain_bn_on_slice'] > 0.01    # per-rank BN really differs


def test_torch_sync_bn_refuses_cpu_processes():
    x = launch(sync_bn_on_cpu, 2, timeout_s=300)[0]
    assert x['converted'] == 20
    assert x['DDP(model)'].startswith('ValueError') and 'GPU' in x['DDP(model)']
    assert x['model(x), training mode'].startswith('ValueError')

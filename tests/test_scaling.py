"Checks of the scaling lesson (nbs/course/09_scaling.ipynb) with real gloo processes: ZeRO and FSDP2 train to DDP's parameters, the comm hooks send the bytes they should, the cost model gives sane values."
import math
import pytest
from cifar_ddp_tut.lessons.scaling import (KINDS, HOOKS, FABRICS, RESNET50, compare_worker, hook_worker,
                                           allreduce_s, bucket_sizes, step_time, predict, scaling_rows,
                                           memory_per_rank, powersgd_bytes, grad_bytes, small_model)
from cifar_ddp_tut.data import write_synthetic_cifar10
from cifar_ddp_tut.lessons.tools import launch


def test_zero_and_fsdp2_train_to_ddps_parameters():
    res = launch(compare_worker, 2, KINDS, 3, 8, timeout_s=300)
    for rank, r in enumerate(res):
        for kind in ('zero', 'fsdp'):
            assert r[kind]['max_diff'] <= 1e-6, (rank, kind, r[kind]['max_diff'])
        ddp = r['ddp']
        assert ddp['params'] == ddp['grads'] == ddp['optimizer'] == grad_bytes(small_model())
        assert r['zero']['params'] == ddp['params'] and r['zero']['optimizer'] < 0.6 * ddp['optimizer']
        for k in ('params', 'grads', 'optimizer'):
            assert abs(r['fsdp'][k] - ddp[k] / 2) <= 64, (k, r['fsdp'][k], ddp[k])  # halves, up to padding
    # ZeRO's two shards of optimizer state add up to the whole
    assert res[0]['zero']['optimizer'] + res[1]['zero']['optimizer'] == res[0]['ddp']['optimizer']


def test_comm_hooks_send_the_bytes_they_should(tmp_path):
    write_synthetic_cifar10(tmp_path, n_train=128, n_test=64, seed=0)
    res = launch(hook_worker, 2, str(tmp_path), HOOKS, 1, 32, 2, timeout_s=300)
    full = grad_bytes(small_model())
    for r in res:
        assert r['fp32']['bytes_last_step'] == full
        assert r['fp16']['bytes_last_step'] * 2 == full == r['bf16']['bytes_last_step'] * 2
        assert r['powersgd']['bytes_last_step'] == powersgd_bytes(small_model()) < full / 100
        assert r['powersgd4']['bytes_last_step'] == powersgd_bytes(small_model(), rank=4) < full / 20
        assert all(math.isfinite(h['train_loss']) and h['steps'] == 4 for h in r.values())


def test_cost_model_is_sane():
    b = 100e6
    assert allreduce_s(b, 1, 10, 5) == 0
    t2, t8, t1024 = (allreduce_s(b, n, 10, 0) for n in (2, 8, 1024))
    assert t2 < t8 < t1024 < 2 * b / 10e9 + 1e-12  # bandwidth term: 2(N-1)/N, below 2 x bytes / busbw
    assert math.isclose(t2, b / 10e9)
    assert allreduce_s(b, 1024, 10, 5, 'tree') < allreduce_s(b, 1024, 10, 5, 'ring')
    assert sum(bucket_sizes(b)) == b and bucket_sizes(b)[0] == 2**20
    fast, slow = step_time(0.1, b, 8, 300, 2), step_time(0.1, b, 8, 1, 20)
    assert fast['exposed_s'] < slow['exposed_s'] and 0 <= slow['hidden'] <= fast['hidden'] <= 1
    assert step_time(0.1, b, 8, 1, 20, overlap=0)['exposed_s'] >= slow['exposed_s']
    rows = scaling_rows(RESNET50, FABRICS)
    assert all(0 < r['efficiency'] <= 1 + 1e-9 and r['step_s'] >= r['compute_s'] for r in rows)
    eff = {f: next(r['efficiency'] for r in rows if (r['fabric'], r['mode'], r['n']) == (f, 'per_gpu', 64))
           for f in FABRICS}
    assert eff['NVLink 3 + 8x IB HDR 200G'] > eff['NVLink 3 + 100 GbE'] > eff['NVLink 3 + 25 GbE']
    assert 2000 < predict(RESNET50, 1, 256, FABRICS['NVLink 3 + 25 GbE'])['images_s'] < 2600
    assert memory_per_rank(1e9, 8, 'ddp')['total'] == 16e9
    assert memory_per_rank(10e9, 8, 'fsdp')['total'] == 20e9
    assert memory_per_rank(10e9, 8, 'zero')['total'] == 80e9 + 80e9 / 8

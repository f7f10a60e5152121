"The pitfalls of nbs/course/07_pitfalls.ipynb, each held on real gloo processes: the wrong way shows its damage, the fix removes it."
import io, time
import numpy as np
import pytest
import torch
import torch.distributed as dist
from cifar_ddp_tut.launch import launch
from cifar_ddp_tut.lessons.pitfalls import (demo_rank0_only_collective, demo_download, demo_rank_vs_local_rank,
                                            demo_save_every_rank, demo_module_prefix, toy_snapshot,
                                            with_hole, load_and_compare, demo_train_and_crash, demo_resume)

NAMES = ('rank_vs_local_rank', 'download', 'save', 'prefix')


def run_demos(env, *calls) -> list:
    "Several demos, each `(fn, *args)`, one after another in these processes (spawn imports this module)."
    out = []
    for fn, *args in calls:
        dist.barrier(); out.append(fn(env, *args))
    return out


@pytest.fixture(scope='module')
def four(tmp_path_factory):
    "Four demos in one launch of 4 processes (2 'nodes' x 2): starting processes is the slow part. {demo: [result by rank]}."
    root = tmp_path_factory.mktemp('pitfalls')
    res = launch(run_demos, 4, (demo_rank_vs_local_rank, 12, 2),
                 (demo_download, str(root/'download')), (demo_save_every_rank, str(root/'save')),
                 (demo_module_prefix, str(root/'prefix')), job_timeout_s=180)
    return {name: [by_rank[i] for by_rank in res] for i, name in enumerate(NAMES)}


def test_rank_vs_local_rank(four):
    res = four['rank_vs_local_rank']
    assert res[2]['wrong']['indices'] == res[0]['wrong']['indices']  # node 1's local rank 0 reads rank 0's shard
    assert (res[0]['wrong']['distinct'], res[0]['wrong']['n_main']) == (6, 2)
    assert (res[0]['fixed']['distinct'], res[0]['fixed']['n_main']) == (12, 1)
    assert [r['fixed']['is_main'] for r in res] == [True, False, False, False]


def test_download(four):
    res = four['download']  # ranks 0, 1, 3 arrive together, rank 2 0.6 s later
    assert sum(r['wrong']['fetched'] > 0 for r in res) >= 2, res  # the same file downloaded more than once
    assert res[2]['wrong']['fetched'] == 0 and res[2]['wrong']['read'] != 'ok', res  # took a half-written file for the real one
    assert [r['fixed']['fetched'] > 0 for r in res] == [True, False, False, False]  # in_order: one download
    assert [r['fixed']['read'] for r in res] == ['ok'] * 4


def test_save_every_rank(four):
    res = four['save']
    assert all(r['wrong']['written'] > 0 for r in res)  # N writes of one file
    assert sum(r['wrong']['read'] != 'ok' for r in res) >= 1, [r['wrong']['read'] for r in res]  # a torn read
    for r in res:  # torn: zeros where an overlapping writer had not yet written, or a short file
        if r['wrong']['read'] != 'ok': assert r['wrong']['zeroed'] > 0 or r['wrong']['size'] < 35000, r['wrong']
    assert [r['fixed']['written'] > 0 for r in res] == [True, False, False, False]
    assert [r['fixed']['read'] for r in res] == ['ok'] * 4
    assert res[0]['fixed']['files'] == ['best.pt']  # no temporary file left behind


def test_module_prefix(four):
    for r in four['prefix']:
        assert r['wrong']['keys'][0] == 'module.0.weight'
        assert 'Unexpected key(s) in state_dict: "module.0.weight"' in r['wrong']['plain_load']
        assert r['fixed']['keys'][0] == '0.weight' and r['fixed']['plain_load'] == 'ok'
        assert r['wrong']['rescued'] and r['fixed']['rescued']  # consume_prefix_in_state_dict_if_present strips it


def test_rank0_only_collective_pairs_with_the_next_one():
    """Collectives pair by order: rank 0's extra all-reduce returns at once with rank 1's other all-reduce's
    value; only the next one waits, until the 3 s timeout; at DETAIL the next one raises at once."""
    t0 = time.monotonic()
    res = launch(demo_rank0_only_collective, 2, 3.0, job_timeout_s=120)
    elapsed = time.monotonic() - t0
    for r in res:
        assert [ev['value'] for ev in r['fixed']['events']] == [3, 300, None]
        first, last = r['wrong']['events'][0], r['wrong']['events'][-1]
        assert (first['outcome'], first['value']) == ('ok', 201), first  # 1 + 200: paired with the other's count
        # the wait: a timeout, or the partner's closed connection (the first to time out closes them)
        assert 'Timed out waiting 3000ms' in last['outcome'] or 'Connection closed by peer' in last['outcome'], last
        assert 2.9 < last['end'] - last['start'] < 20, last  # it waited for the timeout (slack for a busy machine)
        first, last = r['wrong, DETAIL']['events'][0], r['wrong, DETAIL']['events'][-1]
        assert first['value'] == 201  # two all-reduces of one float look alike: DETAIL lets it through
        assert 'Detected mismatch between collectives' in last['outcome'], last
        assert last['end'] - last['start'] < 2.5, last  # at once, not at the timeout
    assert [[ev['name'] for ev in r['wrong']['events']] for r in res] == [['all_reduce'] * 2, ['all_reduce', 'barrier']]
    assert res[0]['fixed']['log'] == 'epoch loss 3' and res[0]['wrong']['log'] == 'epoch loss 201'
    assert elapsed < 100, elapsed  # process start-up included; a hang would have hit launch's 120 s deadline


def test_resume_mid_epoch_is_bitwise_only_with_everything(tmp_path):
    "A snapshot after batch 3 of epoch 1, resumed in new processes: bitwise equal on CPU only if it restores all."
    snap = str(tmp_path/'snapshot.pt')
    whole = launch(demo_train_and_crash, 2, snap, job_timeout_s=180)
    resumed = launch(demo_resume, 2, snap, job_timeout_s=180)
    assert np.array_equal(whole[0], whole[1])
    for r in resumed:
        assert np.array_equal(r['everything'], whole[0])
        assert not np.array_equal(r['all but the random states'], whole[0])  # dropout masks differ
        assert not np.array_equal(r['weights and position only'], whole[0])  # momentum and schedule restart


def test_torn_file_loads_silently_or_fails():
    "torch.load reads zeros inside a tensor's bytes without an error; zeros over a record header it refuses."
    snap = toy_snapshot(); buf = io.BytesIO(); torch.save(snap, buf); data = buf.getvalue()
    assert load_and_compare(data, snap) == 'ok'
    assert load_and_compare(with_hole(data, 'tensor'), snap).startswith('loaded, but 32 of 8320 weights differ')
    assert 'PytorchStreamReader failed' in load_and_compare(with_hole(data, 'header'), snap)

"The error atlas (nbs/course/08_error_atlas.ipynb) on real gloo processes: decisions taken together, exact gathered metrics, a sharded stream, reentrant checkpointing under DDP."
import time
from collections import Counter
import torch
from cifar_ddp_tut.lessons.tools import launch
from cifar_ddp_tut.lessons.atlas import (demo_decide_together, demo_gather_eval, demo_stream, demo_mark_twice, toy_eval_set,
                                         roc_auc, confusion)


def test_decide_together():
    "A rank that skips a NaN batch or stops early alone leaves the others timing out; a reduced flag keeps them together."
    t0 = time.monotonic()
    res = launch(demo_decide_together, 2, 2.0, timeout_s=90)
    assert 'Timed out' in res[0]['wrong']['nan']['log'][-1], res[0]['wrong']['nan']       # rank 0 waits alone
    assert res[1]['wrong']['nan']['log'][1] == 'step 1: skipped'
    assert 'Timed out' in res[1]['wrong']['early']['log'][-1], res[1]['wrong']['early']   # rank 1 trains on alone
    assert res[0]['wrong']['early']['log'][-1] == 'stopped after epoch 2'
    for r in range(2):
        assert res[r]['fixed']['nan']['log'] == ['step 0: ok', 'step 1: skipped', 'step 2: ok', 'step 3: ok']
        assert res[r]['fixed']['early']['log'][-1] == 'stopped after epoch 2'
    assert res[0]['fixed']['nan']['weight'] == res[1]['fixed']['nan']['weight']
    assert time.monotonic() - t0 < 60


def test_gather_eval_exact():
    "Gathered uneven predictions equal the one-process AUC and confusion matrix; padding and rank means do not."
    s, y = toy_eval_set(torch.arange(101))
    ref = (roc_auc(s, y), confusion(s, y))
    res = launch(demo_gather_eval, 3, 101, timeout_s=90)
    assert [r['n_local'] for r in res] == [34, 34, 33]
    for r in res:
        assert r['exact']['indices'] == list(range(101))
        assert r['exact']['scores'] == s.tolist()
        assert (r['exact']['auc'], r['exact']['confusion']) == ref
    assert res[0]['padded']['n'] == 102 and res[0]['mean_of_ranks'] != ref[0]


def test_stream_sharded_once():
    "Sharded over 2 ranks x 2 workers, each record is read exactly once; unsharded, 4 times."
    res = launch(demo_stream, 2, 50, 2, timeout_s=90)
    fixed = Counter(x for seen in res[0]['fixed']['everyone'] for x in seen)
    wrong = Counter(x for seen in res[0]['wrong']['everyone'] for x in seen)
    assert sorted(fixed) == list(range(50)) and set(fixed.values()) == {1}
    assert sorted(wrong) == list(range(50)) and set(wrong.values()) == {4}
    assert res[0]['fixed']['everyone'] == res[1]['fixed']['everyone']


def test_mark_ready_twice():
    "Reentrant checkpointing fails under DDP when a block is checkpointed twice (default arguments) or with the unused search."
    res = launch(demo_mark_twice, 2, timeout_s=90)
    for r in res:
        for case in ('twice', 'once_unused'):
            assert r[case].startswith('Expected to mark a variable ready only once'), r[case]
            assert 'has been marked as ready twice' in r[case].splitlines()[-1], r[case]
        assert r['once'].startswith('ok') and r['once'] == r['once_no_checkpoint']  # checkpointed once: supported
        assert r['non_reentrant'] == r['static_graph'] == r['no_checkpoint'] == res[0]['no_checkpoint']

"""The error atlas on real gloo processes, beyond what nbs/course/08_error_atlas.ipynb runs and checks (decisions
taken together, a sharded stream, reentrant checkpointing under DDP, gathered metrics on 2 processes): gathered metrics
on 3 processes, where the shards are uneven (34, 34, 33)."""
import torch
from cifar_ddp_tut.launch import launch
from cifar_ddp_tut.lessons.atlas import demo_gather_eval, toy_eval_set, roc_auc, confusion


def test_gather_eval_exact():
    "Gathered uneven predictions equal the one-process AUC and confusion matrix; padding and rank means do not."
    s, y = toy_eval_set(torch.arange(101))
    ref = (roc_auc(s, y), confusion(s, y))
    res = launch(demo_gather_eval, 3, 101, job_timeout_s=90)
    assert [r['n_local'] for r in res] == [34, 34, 33]
    for r in res:
        assert r['exact']['indices'] == list(range(101))
        assert r['exact']['scores'] == s.tolist()
        assert (r['exact']['auc'], r['exact']['confusion']) == ref
    assert res[0]['padded']['n'] == 102 and res[0]['mean_of_ranks'] != ref[0]

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


def test_stack_signal_is_not_one_the_program_or_torchrun_handles(monkeypatch):
    "The stack-dump signal: no handler of the program's, and not one torchrun takes."
    import signal
    from torch.distributed.run import get_args_parser
    from cifar_ddp_tut import train
    from cifar_ddp_tut.lessons.atlas import STACK_SIGNAL
    handled, real = set(), signal.signal
    def record(sig, handler):
        if handler not in (signal.SIG_DFL, None): handled.add(sig)
        return real(sig, handler)
    monkeypatch.setattr(signal, 'signal', record)
    train.ignore_stop_signals()  # what DataLoader workers install
    try: train.main(['--cfg', 'no/such/config.yaml'])  # installs its handlers, refuses the path
    except SystemExit: pass
    assert signal.SIGUSR1 in handled and signal.SIGTERM in handled  # the program's stop signals
    assert STACK_SIGNAL not in handled
    torchrun_takes = get_args_parser().parse_args(['job.py']).signals_to_handle.split(',')
    assert signal.Signals(STACK_SIGNAL).name not in torchrun_takes

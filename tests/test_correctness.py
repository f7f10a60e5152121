"""Faults a first GPU run would hit, proven on CPU (issue 8): the logged validation is the saved model's, resume
keeps random states on the CPU, static graph + accumulation is refused, cuDNN autotuning, torch's error types."""
import dataclasses, json, os, stat, sys
import pytest
import torch
from _util import QUICKSTART, ROOT, torchrun
from cifar_ddp_tut import train
from cifar_ddp_tut.config import ConfigError, load_config
from cifar_ddp_tut.dist import DistEnv
from cifar_ddp_tut.launch import run_process

TOL = 1e-5
SMALL = ['--synthetic_train_size', '640', '--synthetic_test_size', '101']


def _eval(nproc, ckpt, save_dir, data, *extra):
    args = ['--cfg', QUICKSTART, '--data_dir', data, *SMALL, '--save_dir', save_dir, '--eval_only', 'true',
            '--checkpoint', ckpt, *extra]
    if nproc == 1:  # one plain process, no process group at all
        p = run_process([sys.executable, '-m', 'cifar_ddp_tut.train', *args], 300, cwd=ROOT,
                        env={**os.environ, 'OMP_NUM_THREADS': '1'})
    else: p, _ = torchrun(nproc, *args)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((save_dir/'eval.json').read_text())


@pytest.mark.slow
def test_logged_validation_is_the_saved_models(small_run, tmp_path):
    """2 processes train with BatchNorm in training mode; the val loss/acc they log for each epoch equal an --eval_only of
    the checkpoint saved at that epoch, in ONE process (so with one set of buffers), to 1e-5. Before the fix each rank
    evaluated its shard with its own BatchNorm running statistics. The run is conftest's `small_run` (4 epochs). And the
    evaluation is exact for any world size and evaluation batch: 2 processes (a batch that does not divide) and 3 (uneven
    shards, eval_batch_size) give the one process's figures."""
    run, data = small_run.save_dir, small_run.data_dir
    assert 'replicas in sync: max |parameter and buffer difference| over 2 rank(s) = 0' in small_run.stdout, small_run.stdout
    hist = small_run.history
    best_epoch = torch.load(run/'best.pt', weights_only=True)['epoch']
    for ckpt, row in (('snapshot.pt', hist[-1]), ('best.pt', hist[best_epoch - 1])):
        ev = _eval(1, run/ckpt, tmp_path/f'eval_{ckpt}', data)
        print(f"{ckpt}: logged val acc {row['val_acc']:.6f} loss {row['val_loss']:.6f}; "
              f"1-process eval acc {ev['acc']:.6f} loss {ev['loss']:.6f}")
        assert ev['count'] == row['val_count'] == 101
        assert abs(ev['acc'] - row['val_acc']) <= TOL and abs(ev['loss'] - row['val_loss']) <= TOL * max(1, abs(row['val_loss']))
        if ckpt == 'best.pt': one = ev
    # eval_only with a world size that does not divide the training batch: evaluation needs no even split
    ev3 = _eval(2, run/'snapshot.pt', tmp_path/'eval_odd', data, '--batch_size', '63')
    assert ev3['count'] == 101 and abs(ev3['acc'] - hist[-1]['val_acc']) <= TOL
    # the same checkpoint on 3 processes (101 = 34 + 34 + 33) with an evaluation batch of its own (30: 10 a rank, so
    # batches of 10, 10, 10 and 4 or 3): the one process's count, correct and loss
    ev = _eval(3, run/'best.pt', tmp_path/'eval3', data, '--batch_size', '6', '--eval_batch_size', '30')
    assert ev['world_size'] == 3 and (ev['count'], ev['correct']) == (one['count'], one['correct']) == (101, one['correct'])
    assert abs(ev['loss'] - one['loss']) < TOL
    # files follow the umask (022 for this run) like any other write (the temporary file behind the atomic write is 0600)
    for f in ('metrics.jsonl', 'best.pt', 'snapshot.pt'):
        assert stat.S_IMODE((run/f).stat().st_mode) == 0o644, f


def _tiny_cfg(tmp_path, **kw):
    return load_config(QUICKSTART, {'save_dir': str(tmp_path/'run'), 'data_dir': str(tmp_path/'data'),
                                    'synthetic_train_size': '128', 'synthetic_test_size': '16', 'batch_size': '32',
                                    'epoch': '1', 'max_steps_per_epoch': '2', 'plot': 'false', **kw})


def test_resume_keeps_random_states_on_the_cpu(tmp_path, monkeypatch):
    """A snapshot loaded with map_location=cuda:LOCAL_RANK would carry the RNG states onto the GPU; the trainer reads
    snapshots onto the CPU. Whatever the trainer's device (here `meta`, a device that is not the CPU), the states
    handed to set_rng_state are CPU tensors."""
    cfg = _tiny_cfg(tmp_path)
    t = train.build_trainer(cfg, DistEnv())
    t.fit()
    seen = []
    def spy(st):
        seen.extend(v.device.type for v in (st['torch'], st['numpy'][1]))
        return real(st)
    real = train.set_rng_state
    monkeypatch.setattr(train, 'set_rng_state', spy)
    t2 = train.build_trainer(cfg, DistEnv())
    t2.env = dataclasses.replace(t2.env, device=torch.device('meta'))  # a device that is not the CPU
    assert t2.load_snapshot(tmp_path/'run'/'snapshot.pt') == 1
    assert seen == ['cpu', 'cpu'] and t2.epochs_run == 1 and t2.step == t.step


def test_static_graph_with_accumulation_is_refused():
    "DDP's static graph fails inside no_sync() (PyTorch issue 143580): one config error instead of an internal assert."
    with pytest.raises(ConfigError, match="ddp_static_graph=true cannot be combined with accumulate_steps=2"):
        load_config(ROOT/'config'/'classifier_cifar10_fast.yaml', {'accumulate_steps': '2'})
    load_config(ROOT/'config'/'classifier_cifar10_fast.yaml', {'accumulate_steps': '2', 'ddp_static_graph': 'false'})


def test_cudnn_benchmark_on_cuda_by_default():
    "Fixed training shapes: cuDNN's autotuner is on for CUDA devices unless the config turns it off; never on CPU."
    cfg = load_config(QUICKSTART)
    try:
        train.set_kernel_flags(cfg, torch.device('cuda', 0))
        assert torch.backends.cudnn.benchmark is True
        train.set_kernel_flags(dataclasses.replace(cfg, cudnn_benchmark=False), torch.device('cuda', 0))
        assert torch.backends.cudnn.benchmark is False
        train.set_kernel_flags(cfg, torch.device('cpu'))
        assert torch.backends.cudnn.benchmark is False
    finally: torch.backends.cudnn.benchmark = False


@pytest.mark.parametrize('exc', [torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp: unhandled system error"),
                                 torch.distributed.DistNetworkError("The client socket has failed to connect to [head]:29500"),
                                 torch.distributed.DistStoreError("wait for key 'rank1' failed")])
def test_torch_distributed_errors_give_one_line(exc, monkeypatch, capsys):
    "NCCL and the store raise torch's own error types: caught by type (not by words), one line, exit 1."
    def failing_run(cfg, env): raise exc
    monkeypatch.setattr(train, 'run_program', failing_run)
    monkeypatch.setattr(train, 'check_paths', lambda cfg: None)
    with pytest.raises(SystemExit) as e: train.main(['--cfg', str(QUICKSTART)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1, err
    assert err[0].startswith('cifar_ddp_train: error:') and type(exc).__name__ in err[0], err


def test_every_type_error_suggests_a_value_that_loads():
    "The example in a type error is itself valid: `device` once suggested device: '[0]', which was rejected in turn."
    import yaml
    from dataclasses import fields
    from cifar_ddp_tut.config import Config
    for f in fields(Config):
        wrong = {'list': 'text', 'str': [1], 'bool': 'maybe', 'int': 'four', 'float': 'x'}[f.type if isinstance(f.type, str) else f.type.__name__]
        with pytest.raises(ConfigError) as e: load_config(None, {f.name: wrong})
        example = str(e.value).split('(for example ')[1][:-1]
        load_config(None, yaml.safe_load(example))  # raises if the suggestion is not accepted

"""Review fixes to the Trainer (issue 40): no device wait for a progress bar nobody sees, and
`deterministic: true` accepted once CUDA has started (torch 2.14 does not require cuBLAS's
workspace setting, so refusing would stop a setup torch accepts)."""
import os
import pytest, torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from cifar_ddp_tut import train
from cifar_ddp_tut.config import load_config, run_sizes
from cifar_ddp_tut.dist import DistEnv
from cifar_ddp_tut.model import build_model, prepare_model, build_optimizer, build_scheduler


def test_no_progress_line_without_a_terminal(monkeypatch, tmp_path):
    calls = []
    class Bar(train.tqdm):
        def set_postfix(self, *a, **k): calls.append(k); return super().set_postfix(*a, **k)
    monkeypatch.setattr(train, 'tqdm', Bar)
    cfg = load_config(None, dict(model='resnet18', pretrained=False, image_size=32, resize_size=32,
                                 batch_size=4, epoch=1, warmup_steps=0, log_every=1,
                                 save_dir=str(tmp_path)))
    env = DistEnv()
    model, bare = prepare_model(build_model(cfg), cfg, env)
    opt = build_optimizer(model, cfg, env)
    ds = TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    t = train.Trainer(cfg, env, model, bare, opt, build_scheduler(opt, cfg, 2),
                      DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, 1, 0)), None, run_sizes(cfg, 1, 2))
    t.run_epoch(0)  # under pytest stderr is no terminal: the bar is disabled
    assert calls == [], "the hidden bar's postfix read the loss (.item()) anyway"


def test_deterministic_accepted_after_cuda_started(monkeypatch):
    monkeypatch.delenv('CUBLAS_WORKSPACE_CONFIG', raising=False)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: True)
    train.deterministic_env(load_config(None, dict(deterministic=True, num_workers=0)))
    assert os.environ['CUBLAS_WORKSPACE_CONFIG'] == train.CUBLAS_DETERMINISTIC
    monkeypatch.setenv('CUBLAS_WORKSPACE_CONFIG', ':16:8')  # a user's own setting is kept
    train.deterministic_env(load_config(None, dict(deterministic=True, num_workers=0)))
    assert os.environ['CUBLAS_WORKSPACE_CONFIG'] == ':16:8'

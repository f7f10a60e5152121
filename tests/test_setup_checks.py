"""Review fixes in config, data and model: the batch is checked against torchrun's WORLD_SIZE before
any process joins; a damaged CIFAR-10 folder and a failed download are told apart from a missing one;
deterministic also makes torch.compile's kernel choice deterministic."""
import dataclasses, os
import pytest
import torch
import torchvision
from cifar_ddp_tut import train
from cifar_ddp_tut.config import Config, ConfigError, parse_cli
from cifar_ddp_tut.data import DataError, _load_cifar10, _BASE
from cifar_ddp_tut.dist import DistEnv
from cifar_ddp_tut.model import compile_options


def test_batch_checked_against_world_size_before_setup(monkeypatch, tmp_path, capsys):
    "WORLD_SIZE is in the environment before joining: a batch that does not split stops before setup."
    monkeypatch.setenv('WORLD_SIZE', '2')
    with pytest.raises(ConfigError, match="batch_size=63 is not divisible by world_size=2"):
        parse_cli(['--batch_size', '63'])
    # eval_only evaluates on any world size
    ck = tmp_path/'best.pt'; ck.write_bytes(b'x')
    assert parse_cli(['--batch_size', '63', '--eval_only', 'true', '--checkpoint', str(ck)]).eval_only
    monkeypatch.setenv('WORLD_SIZE', 'x')  # a malformed one is env_ranks' to report
    assert parse_cli(['--batch_size', '63']).batch_size == 63
    for k, v in dict(WORLD_SIZE='2', RANK='0', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1',
                     MASTER_PORT='9').items(): monkeypatch.setenv(k, v)
    def no_setup(*a, **k): raise AssertionError("setup was called")
    monkeypatch.setattr(train, 'setup', no_setup)
    with pytest.raises(SystemExit) as e:
        train.main(['--batch_size', '63', '--save_dir', str(tmp_path/'run'),
                    '--data_dir', str(tmp_path/'data')])
    assert e.value.code != 0
    assert "batch_size=63 is not divisible by world_size=2" in capsys.readouterr().err


def test_damaged_cifar_folder_is_not_called_missing(tmp_path):
    "A present cifar-10-batches-py that fails torchvision's MD5 check is reported as damaged."
    (tmp_path/_BASE).mkdir()
    (tmp_path/_BASE/'data_batch_1').write_bytes(b'garbage')
    cfg = Config(data_dir=str(tmp_path), download=False)
    with pytest.raises(DataError, match="is damaged") as e: _load_cifar10(cfg, True, None)
    assert "is not in" not in str(e.value)
    with pytest.raises(DataError, match="is not in"):  # and a missing one still as missing
        _load_cifar10(Config(data_dir=str(tmp_path/'none'), download=False), True, None)


def test_failed_download_names_the_archive(tmp_path, monkeypatch):
    "A downloaded archive failing its MD5 check is named, not the extracted folder."
    import torchvision.datasets.utils as U
    monkeypatch.setattr(U, '_get_redirect_url', lambda url, max_hops=3: url)
    monkeypatch.setattr(U, '_urlretrieve', lambda url, fpath, *a, **k: open(fpath, 'wb').write(b'x'))
    with pytest.raises(DataError) as e: _load_cifar10(Config(data_dir=str(tmp_path)), True, None)
    assert torchvision.datasets.CIFAR10.filename in str(e.value) and 'failed its MD5' in str(e.value)
    assert f"delete {tmp_path/_BASE}" not in str(e.value)


def test_deterministic_makes_compile_kernel_choice_deterministic():
    "deterministic: true turns on inductor's deterministic mode (no timing-picked kernels)."
    import torch._inductor.config as inductor
    old = inductor.deterministic
    try:
        inductor.deterministic = False
        compile_options(Config(compile=True, deterministic=True, num_workers=0), DistEnv())
        assert inductor.deterministic is True
    finally: inductor.deterministic = old


def test_eval_batch_size_doc_says_what_0_means():
    "0 means the training micro-batch (batch_size / accumulate_steps), as eval_batch_per_rank does."
    doc = {f.name: f for f in dataclasses.fields(Config)}['eval_batch_size'].metadata['doc']
    assert 'accumulate_steps' in doc

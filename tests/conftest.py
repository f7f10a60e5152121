"""What several test files share, each trained once a session: a small run of the quickstart, and the quickstart
itself (with the accuracy check's settings).

The `slow` marker is registered in pyproject.toml (`--strict-markers`: a misspelt marker is an error).
`pytest -m "not slow"` is the developer's loop; CI runs every test."""
import os
from dataclasses import dataclass
from pathlib import Path
import pytest
from _util import QUICKSTART, read_metrics, small_args, torchrun
from cifar_ddp_tut.bench import RECIPES


@dataclass(frozen=True)
class SmallRun:
    "A finished run of `small_args` on 2 processes. Read only: copy `save_dir` before changing it."
    save_dir: Path   # metrics.jsonl, snapshot.pt, best.pt
    data_dir: Path   # its synthetic CIFAR-10 files
    stdout: str
    history: list    # metrics.jsonl, one dict an epoch


@pytest.fixture(scope='session')
def small_run(tmp_path_factory) -> SmallRun:
    """The small quickstart trained once for the whole session, uninterrupted, under umask 022 (so
    that its files' modes can be checked). Tests that need this run read it here instead of
    training their own copy."""
    d = tmp_path_factory.mktemp('small_run')
    old = os.umask(0o022)
    try: p, secs = torchrun(2, *small_args(d/'run', d/'data'))
    finally: os.umask(old)
    assert p.returncode == 0, p.stderr[-3000:]
    print(f"small_run: {secs:.0f} s")
    return SmallRun(d/'run', d/'data', p.stdout, read_metrics(d/'run'))



# The quickstart as it is (3 epochs at lr 0.05, 501 test images) is too noisy for a one-point comparison of two recipes:
# changing nothing but the random stream of the crops (the original recipe with one DataLoader worker) moved its final
# accuracy by up to 2.8 points, either way. A lower learning rate, 5 epochs (closer to convergence) and 1,000 test
# images (less sampling noise) make the comparison meaningful and stable: see the measurements in issue 5's report.
ACCURACY_SETTINGS = ['--lr', 0.01, '--epoch', 5, '--synthetic_test_size', 1000]


def recipe_args(name) -> list:
    "The command-line options that select the benchmark's recipe `name` (`original`: the quickstart's own values)."
    return [a for k, v in RECIPES[name].items() for a in (f'--{k}', str(v).lower() if isinstance(v, bool) else v)]


@dataclass(frozen=True)
class QuickstartRun:
    "README's quickstart command on 2 processes with ACCURACY_SETTINGS and the original recipe spelt out. Read only."
    save_dir: Path
    stdout: str
    history: list
    seconds: float


def train_quickstart(save_dir, data_dir, recipe) -> QuickstartRun:
    p, secs = torchrun(2, '--cfg', QUICKSTART, '--save_dir', save_dir, '--data_dir', data_dir, *ACCURACY_SETTINGS,
                       *recipe_args(recipe))
    assert p.returncode == 0, p.stderr[-4000:]
    return QuickstartRun(Path(save_dir), p.stdout, read_metrics(save_dir), secs)


@pytest.fixture(scope='session')
def quickstart_run(tmp_path_factory) -> QuickstartRun:
    """The quickstart trained once for the session: test_quickstart checks the run, test_bench compares the fast
    recipe's accuracy with it (one training instead of two of the same command)."""
    d = tmp_path_factory.mktemp('quickstart')
    return train_quickstart(d/'run', d/'data', 'original')

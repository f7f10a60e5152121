"""What several test files share: one small trained quickstart, trained once a session.

The `slow` marker is registered in pyproject.toml (`--strict-markers`: a misspelt marker is an error).
`pytest -m "not slow"` is the developer's loop; CI runs every test."""
import os
from dataclasses import dataclass
from pathlib import Path
import pytest
from _util import read_metrics, small_args, torchrun


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


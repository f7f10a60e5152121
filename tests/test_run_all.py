"""The notebooks run once per CI run, as a learner's Run All runs them: `nbdev_test` (README's test
command) executes every cell of every notebook, and nothing in them can tell that it runs under test.

These checks take a second; the pass itself is `nbdev_test`, not pytest. To run notebooks in a real
Jupyter kernel and save their outputs and Run All times, use `python tests/run_notebooks.py`."""
import json, re
from _util import ROOT


def _notebooks():
    return sorted(p for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)


def _code_cells(path):
    return [''.join(c['source']) for c in json.loads(path.read_text())['cells'] if c['cell_type'] == 'code']


def test_nbdev_test_runs_every_notebook_and_every_cell():
    "No flag in settings.ini skips a cell, and nbdev_test finds every notebook in nbs/course and nbs/program."
    from nbdev.config import get_config
    from nbdev.doclinks import nbglob
    cfg = get_config(path=ROOT)
    assert cfg.tst_flags.split() == [], f"tst_flags = {cfg.tst_flags}: nbdev_test would skip cells so flagged"
    assert cfg.recursive
    nbs = _notebooks()
    assert {p.parent.name for p in nbs} >= {'nbs', 'course', 'program'}
    assert sorted(nbglob(ROOT/'nbs', as_path=True)) == nbs  # a name starting with _ or . would be skipped
    assert not list((ROOT/'nbs').rglob('.notest')), "a .notest file makes nbdev_test skip its folder"
    for p in nbs:
        for src in _code_cells(p):
            assert not re.search(r'^#\|\s*eval:\s*false', src, re.M | re.I), f"{p.name}: eval: false\n{src[:300]}"
            assert not re.search(r'^#\|\s*skip_exec', src, re.M), p.name
        assert 'skip_exec' not in p.read_text(), f"{p.name}: skip_exec makes nbdev_test skip the notebook"


def test_no_test_switch():
    "nbdev_test sets IN_TEST; a learner's kernel has no such variable: no notebook or module may read it."
    readers = [f"{p.relative_to(ROOT)}: {line.strip()}"
               for p in [*_notebooks(), *(ROOT/'cifar_ddp_tut').rglob('*.py'), *(ROOT/'steps').rglob('*.py')]
               for src in (_code_cells(p) if p.suffix == '.ipynb' else [p.read_text()])
               for line in src.splitlines() if 'IN_TEST' in line]
    assert not readers, "what CI runs must be what a learner runs:\n" + '\n'.join(readers)

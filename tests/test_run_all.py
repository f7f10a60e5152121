"""Run All, as a learner presses it in JupyterLab: every notebook top to bottom, in its own kernel.

`nbdev_test` sets `IN_TEST` (the notebooks then pick smaller sizes) and skips cells flagged `slow`, `gpu` or
`notest`. A learner gets neither, so this test runs every cell of every notebook without them, on the CPU, and
fails on the first error. It is the slowest test here (minutes); skip it locally with `-k "not run_all"`.
Set `RUN_ALL_TIMES=path.json` to record each notebook's wall time (the index's syllabus quotes them)."""
import json, os, time
from pathlib import Path
import nbformat, pytest
from nbclient import NotebookClient
from _util import ROOT

NOTEBOOKS = sorted(p for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: f'{p.parent.name}/{p.stem}')
def test_run_all(path, monkeypatch):
    monkeypatch.delenv('IN_TEST', raising=False)
    nb = nbformat.read(path, as_version=4)
    t0 = time.monotonic()
    # a cell that raises makes execute() raise CellExecutionError naming the cell and the error
    NotebookClient(nb, timeout=900, kernel_name='python3',
                   resources={'metadata': {'path': str(path.parent)}}).execute()
    secs = time.monotonic() - t0
    print(f'{path.name}: {secs:.0f} s')
    if out := os.environ.get('RUN_ALL_TIMES'):
        times = json.loads(Path(out).read_text()) if Path(out).exists() else {}
        Path(out).write_text(json.dumps({**times, path.stem: round(secs)}, indent=1))

"""A learner opens a notebook in JupyterLab and it is not modified: no "unsaved changes" mark, nothing
to save, no diff in nbs/.

On opening, JupyterLab writes the running kernel's `kernelspec` and `language_info` into the notebook's
metadata, and marks it modified if they differ from what the file holds. So every saved notebook
carries both (settings.ini's `allowed_metadata_keys` keeps `language_info` through `nbdev_clean`),
with the kernelspec that `nbdev_clean` writes (`display_name` = `name` = `python3`): README's install
gives the environment's kernel that display name. The one thing that still differs on another Python
is `language_info.version` (JupyterLab's behaviour, not ours); the browser test below runs on the
Python that runs it. A cell whose input the course folds (`jupyter.source_hidden`, kept by
settings.ini's `allowed_cell_metadata_keys`) opens collapsed, and unmodified too.

The browser test needs Debian's chromium and the playwright package (.ci/run installs both)."""
import copy
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ipykernel.ipkernel import IPythonKernel

ROOT = Path(__file__).resolve().parents[1]
KERNELSPEC = {'display_name': 'python3', 'language': 'python', 'name': 'python3'}
CHROMIUM = '/usr/bin/chromium'
# the collapsed inputs of the notebook in view
FOLDED_HERE = '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPlaceholder'


def notebooks():
    return sorted(p for p in (ROOT / 'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)


def lab_metadata() -> dict:
    "What JupyterLab writes into a notebook's metadata when Python 3 (ipykernel) starts for it."
    return {'kernelspec': dict(KERNELSPEC), 'language_info': dict(IPythonKernel.language_info)}


@pytest.mark.parametrize('nb', notebooks(), ids=lambda p: p.relative_to(ROOT / 'nbs').as_posix())
def test_every_notebook_carries_what_jupyterlab_writes_on_opening(nb):
    meta = json.loads(nb.read_text(encoding='utf-8'))['metadata']
    want = lab_metadata()
    assert meta.get('kernelspec') == want['kernelspec'], f"{nb.name}: kernelspec {meta.get('kernelspec')}"
    li = meta.get('language_info')
    assert li is not None, (f"{nb.name} has no language_info: JupyterLab adds it on opening and marks the "
                            "notebook modified. Re-run it with tests/run_notebooks.py, which saves it.")
    assert {k: v for k, v in li.items() if k != 'version'} == \
           {k: v for k, v in want['language_info'].items() if k != 'version'}, f"{nb.name}: {li}"
    assert li['version'].count('.') == 2, f"{nb.name}: language_info.version {li['version']!r}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _opened_modified(page, port: int, name: str) -> bool:
    "Open nbs/`name` in JupyterLab, wait for its kernel to be idle: is its tab marked modified?"
    page.goto(f'http://127.0.0.1:{port}/lab/tree/{name}?reset')   # ?reset: no notebook opened before
    page.locator('.jp-Notebook').first.wait_for(timeout=90_000)
    status = page.locator('.jp-Notebook-ExecutionIndicator').first
    deadline = time.monotonic() + 90
    while status.get_attribute('data-status') != 'idle':
        assert time.monotonic() < deadline, f"{name}: the kernel never became idle"
        time.sleep(0.5)
    time.sleep(3)   # the kernel's info reply has been applied to the model by now
    return page.locator('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty').count() > 0


@pytest.mark.slow
def test_jupyterlab_opens_a_saved_notebook_without_modifying_it(tmp_path):
    import playwright.sync_api as playwright   # in .[dev]
    assert Path(CHROMIUM).exists(), 'apt-get install chromium (.ci/run installs it)'
    src = ROOT / 'nbs' / 'course' / '04_shards_and_metrics.ipynb'
    saved = json.loads(src.read_text(encoding='utf-8'))
    # as saved, on this Python (another patch version would differ only in language_info.version)
    saved['metadata']['language_info']['version'] = IPythonKernel.language_info['version']
    (tmp_path / 'saved.ipynb').write_text(json.dumps(saved), encoding='utf-8')
    # the control: what every notebook was before, without language_info
    bare = copy.deepcopy(saved)
    del bare['metadata']['language_info']
    (tmp_path / 'bare.ipynb').write_text(json.dumps(bare), encoding='utf-8')
    # folded code (the course's plumbing): JupyterLab shows the input collapsed, and opening it
    # modifies nothing either
    folded = copy.deepcopy(saved)
    code = [c for c in folded['cells'] if c['cell_type'] == 'code'
            and not c['metadata'].get('jupyter', {}).get('source_hidden')]
    code[0]['metadata']['jupyter'] = {'source_hidden': True}    # one more than the saved notebook folds
    (tmp_path / 'folded.ipynb').write_text(json.dumps(folded), encoding='utf-8')
    # the kernel as README's install names it, found first through JUPYTER_PATH
    kdir = tmp_path / 'jupyter' / 'kernels' / 'python3'
    kdir.mkdir(parents=True)
    (kdir / 'kernel.json').write_text(json.dumps(
        {'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
         'display_name': 'python3', 'language': 'python'}))
    port = _free_port()
    env = {**os.environ, 'JUPYTER_PATH': str(tmp_path / 'jupyter'),
           'JUPYTER_CONFIG_DIR': str(tmp_path / 'config')}   # no settings of the machine's user
    lab = subprocess.Popen(
        [sys.executable, '-m', 'jupyterlab', '--no-browser', f'--port={port}', '--ip=127.0.0.1',
         '--allow-root', '--ServerApp.token=', '--ServerApp.password=', f'--ServerApp.root_dir={tmp_path}',
         f'--LabApp.workspaces_dir={tmp_path / "workspaces"}', '--LabApp.news_url=',
         f'--LabApp.user_settings_dir={tmp_path / "settings"}'],
        env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / 'lab.log').open('w'))
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(('127.0.0.1', port), timeout=1).close()
                break
            except OSError:
                assert lab.poll() is None and time.monotonic() < deadline, (tmp_path / 'lab.log').read_text()
                time.sleep(0.5)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                '--no-sandbox', '--disable-gpu', '--disable-background-networking',
                '--disable-component-update', '--disable-sync', '--no-first-run'])
            try:
                page = browser.new_page(viewport={'width': 1280, 'height': 800})
                assert not _opened_modified(page, port, 'saved.ipynb'), \
                    "JupyterLab marked a saved notebook modified on opening"
                shown_folded = page.locator(FOLDED_HERE).count()
                page = browser.new_page(viewport={'width': 1280, 'height': 800})
                assert not _opened_modified(page, port, 'folded.ipynb'), \
                    "JupyterLab marked a notebook with folded code modified on opening"
                deadline = time.monotonic() + 30   # cells render progressively on a busy machine
                while page.locator(FOLDED_HERE).count() <= shown_folded:
                    assert time.monotonic() < deadline, "the cell folded in the copy is not shown collapsed"
                    time.sleep(0.5)
                page = browser.new_page(viewport={'width': 1280, 'height': 800})
                assert _opened_modified(page, port, 'bare.ipynb'), \
                    "the control (no language_info) was not marked modified: the test sees nothing"
            finally:
                browser.close()
    finally:
        lab.terminate()
        try: lab.wait(20)
        except subprocess.TimeoutExpired: lab.kill()
    for f, nb in (('saved.ipynb', saved), ('bare.ipynb', bare), ('folded.ipynb', folded)):
        assert json.loads((tmp_path / f).read_text(encoding='utf-8')) == nb   # opening wrote nothing

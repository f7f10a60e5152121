"""The course as a website: `mkdocs build` (mkdocs.yml, scripts/site_hooks.py) builds it from the saved
notebooks, and a reader finds every notebook in the sidebar in reading order with its question, its
saved figures, links that lead somewhere under the address it is published at, and the error atlas
through the search box. The browser's view of the same build (nothing cut off, the atlas first in
the search box) is in tests/test_site_browser.py."""
import html
import json
import re
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from cifar_ddp_tut.launch import run_process

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'
BASE = '/cifar_ddp_tut/'   # where GitHub Pages serves the site: settings.ini's doc_baseurl


def build_site(www: Path) -> Path:
    "The site built into `www` + BASE, as GitHub Pages serves it: the folder of the site."
    out = www / BASE.strip('/')
    t0 = time.monotonic()
    p = run_process([sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir', out], 600,
                    cwd=ROOT, env={**__import__('os').environ, 'NO_MKDOCS_2_WARNING': '1'})
    print(f"mkdocs build: {time.monotonic() - t0:.0f} s")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return out


def notebooks():
    "Every notebook of the site, in reading order: the index, then the course, then the program."
    nbs = [NBS / 'index.ipynb']
    for d in ('course', 'program'): nbs += sorted((NBS / d).glob('[0-9]*.ipynb'))
    return nbs


def page_of(nb: Path) -> str:
    return nb.relative_to(NBS).with_suffix('.html').as_posix()


class Page(HTMLParser):
    "What a test needs of one built page: its links, its images, its element ids, its sidebar."
    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.urls, self.images, self.ids, self.nav = [], [], set(), []
        self._nav_depth = 0   # inside the primary (left) sidebar while > 0
        self._in_title, self.title = False, ''
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if 'id' in a: self.ids.add(a['id'])
        if tag == 'a' and 'name' in a: self.ids.add(a['name'])
        for k in ('href', 'src'):
            if a.get(k) is not None and not (tag == 'link' and a.get('rel') in ('canonical',)):
                self.urls.append(a[k])
        if tag == 'img': self.images.append(a.get('src', ''))
        if tag == 'nav':
            if self._nav_depth or 'md-nav--primary' in a.get('class', ''): self._nav_depth += 1
        elif self._nav_depth and tag == 'a' and a.get('href'): self.nav.append(a['href'])
        if tag == 'title': self._in_title = True

    def handle_endtag(self, tag):
        if tag == 'nav' and self._nav_depth: self._nav_depth -= 1
        if tag == 'title': self._in_title = False

    def handle_data(self, data):
        if self._in_title: self.title += data


_BUILT = {}


def built_site(tmp_path_factory) -> Path:
    "The site, built once a test session (this module and test_site_browser.py share it)."
    if 'site' not in _BUILT: _BUILT['site'] = build_site(tmp_path_factory.mktemp('www'))
    return _BUILT['site']


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "The site, built from the notebooks as they are saved."
    return built_site(tmp_path_factory)


@pytest.fixture(scope='module')
def pages(site):
    return {p.relative_to(site).as_posix(): Page(p.read_text(encoding='utf-8'))
            for p in site.rglob('*.html')}


@pytest.mark.slow
def test_every_notebook_has_a_page_in_the_sidebar_in_reading_order(site, pages):
    expected = [page_of(nb) for nb in notebooks()]
    for nb in notebooks():
        first = next(c for c in json.loads(nb.read_text(encoding='utf-8'))['cells']
                     if c['cell_type'] == 'markdown')
        title = re.search(r'^# (.+)$', ''.join(first['source']), re.M).group(1).replace('`', '')
        assert page_of(nb) in pages, f"no page for {nb.relative_to(ROOT)}"
        assert title in pages[page_of(nb)].title, (page_of(nb), pages[page_of(nb)].title)
    # the left sidebar, as it is on the home page: every notebook in reading order
    nav = list(dict.fromkeys(u for u in pages['index.html'].nav if u.endswith('.html')))
    nav = [u for u in nav if not u.startswith(('source/', 'api/'))]
    assert nav == expected


@pytest.mark.slow
def test_the_sidebar_shows_the_question_each_notebook_answers(site):
    index = (site / 'index.html').read_text(encoding='utf-8')
    sidebar = index[index.index('md-nav--primary'):]
    for nb in notebooks()[1:]:
        first = next(c for c in json.loads(nb.read_text(encoding='utf-8'))['cells']
                     if c['cell_type'] == 'markdown')
        question = re.search(r'^> (.+?\?)', ''.join(first['source']), re.M).group(1)
        question = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', question).replace('`', '')
        assert html.escape(question) in sidebar, (nb.name, question)


def _resolve(site, page, url):
    "The file and fragment an internal link of `page` leads to, or None for an external one."
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(('mailto:', 'javascript:')): return None
    path = unquote(parts.path)
    # 404.html links from the site's address (site_url), the one page shown at any address
    if path.startswith('/'):
        if not path.startswith(BASE): return Path('/outside-the-site' + path), parts.fragment
        base, path = site, path[len(BASE):]
    else:
        base = (site / page).parent
    target = base / path if path else site / page
    target = target.resolve()
    if target.is_dir(): target = target / 'index.html'
    return target, parts.fragment


@pytest.mark.slow
def test_no_internal_link_is_broken(site, pages):
    broken, checked = [], 0
    for page, parsed in pages.items():
        for url in parsed.urls:
            if url.startswith('data:'): continue
            r = _resolve(site, page, url)
            if r is None: continue
            target, frag = r
            checked += 1
            if not target.is_relative_to(site.resolve()) or not target.exists():
                broken.append(f"{page}: {url} (no such file)")
            elif frag and target.suffix == '.html':
                rel = target.relative_to(site.resolve()).as_posix()
                if frag not in pages[rel].ids and not re.fullmatch(r'__\w+', frag):
                    broken.append(f"{page}: {url} (no id {frag!r} in {rel})")
    # the search results link into pages too
    index = json.loads((site / 'search/search_index.json').read_text(encoding='utf-8'))
    for doc in index['docs']:
        path, _, frag = doc['location'].partition('#')
        if path not in pages: broken.append(f"search: {doc['location']} (no such page)")
        elif frag and frag not in pages[path].ids: broken.append(f"search: {doc['location']} (no id)")
    assert checked > 1000 and not broken, '\n'.join(broken[:40])


@pytest.mark.slow
def test_the_site_needs_nothing_from_the_internet(site, pages):
    "Scripts, style sheets, fonts and images all come from the site itself."
    remote = []
    for page, parsed in pages.items():
        text = (site / page).read_text(encoding='utf-8')
        for m in re.finditer(r'<(script|link|img|iframe)\b[^>]*?(?:src|href)="(https?:)?//[^"]*"', text):
            if m.group(1) == 'link' and 'stylesheet' not in m.group(0) and 'preload' not in m.group(0):
                continue
            remote.append(f"{page}: {m.group(0)[:120]}")
        if re.search(r'fonts\.(googleapis|gstatic)\.com|cdnjs|cdn\.jsdelivr|unpkg\.com', text):
            remote.append(f"{page}: names a CDN")
    for css in site.rglob('*.css'):
        if re.search(r'url\(\s*["\']?(https?:)?//', css.read_text(encoding='utf-8')):
            remote.append(f"{css.relative_to(site)}: url() to another host")
    assert not remote, '\n'.join(remote[:20])


def _figures(nb: Path):
    "The PNG figures saved in the notebook's outputs, except in cells that nbdev's docs hide."
    for c in json.loads(nb.read_text(encoding='utf-8'))['cells']:
        if re.search(r'^\s*#\s*\|\s*hide\s*$', ''.join(c['source']), re.M): continue
        for o in c.get('outputs', []):
            png = o.get('data', {}).get('image/png')
            if png: yield re.sub(r'\s', '', ''.join(png) if isinstance(png, list) else png)


@pytest.mark.slow
def test_every_saved_figure_is_an_image_on_its_page(pages):
    total = 0
    for nb in notebooks():
        shown = {re.sub(r'\s', '', unquote(src)).removeprefix('data:image/png;base64,')
                 for src in pages[page_of(nb)].images if src.startswith('data:image/png')}
        for i, png in enumerate(_figures(nb)):
            total += 1
            assert png in shown, f"figure {i + 1} of {nb.relative_to(ROOT)} is not on its page"
    assert total >= 10  # the course draws figures: a parser that finds none is broken


def search(index, query):
    """The pages whose indexed text holds every word of `query`, as the site's search box matches
    them: words split by the index's `config.separator`, each word of the query a prefix (the
    search box adds a wildcard to each); most mentions first."""
    sep = re.compile(index['config']['separator'])
    words = [w for w in sep.split(query.lower()) if w]
    hits = []
    for doc in index['docs']:
        text = html.unescape(re.sub(r'<[^>]+>', ' ', doc['title'] + ' ' + doc['text'])).lower()
        terms = [w for w in sep.split(text) if w]
        counts = [sum(t.startswith(w) for t in terms) for w in words]
        if all(counts): hits.append((-sum(counts), doc['location']))
    return [loc for _, loc in sorted(hits)]


@pytest.mark.slow
@pytest.mark.parametrize('message', [
    'Expected to mark a variable ready only once',
    'Default process group has not been initialized',
    'EADDRINUSE',
])
def test_searching_an_error_message_finds_the_atlas(site, message):
    index = json.loads((site / 'search/search_index.json').read_text(encoding='utf-8'))
    hits = search(index, message)
    atlas = [h for h in hits if h.startswith('course/08_error_atlas.html#')]
    assert atlas, f"searching {message!r} finds no section of the atlas: {hits[:10]}"
    section = next(d for d in index['docs'] if d['location'] == atlas[0])
    assert message.lower() in html.unescape(section['title'] + section['text']).lower()


@pytest.mark.slow
def test_nbdev_docs_sidebar_has_the_same_order():
    """`nbdev_docs` (with Quarto) writes nbs/sidebar.yml from the same files: checked without
    Quarto by asking nbdev for the sidebar it would write."""
    p = run_process([sys.executable, '-c', 'from nbdev.quarto import nbdev_sidebar; '
                     'nbdev_sidebar.__wrapped__(printit=True, force=True)'], 300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    listed = re.findall(r'^\s*- (\S+\.ipynb)\s*$', p.stdout, re.M)
    assert listed == [nb.relative_to(NBS).as_posix() for nb in notebooks()], p.stdout


# ---------------------------------------------------------------------------------------------
# One home page, one README


def _hooks():
    sys.path.insert(0, str(ROOT / 'scripts'))
    import site_hooks
    return site_hooks


def test_readme_is_the_index_notebook():
    "README.md is what `python scripts/make_readme.py` writes from nbs/index.ipynb, the site's home."
    p = run_process([sys.executable, 'scripts/make_readme.py', '--check'], 120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-4000:]
    # what README has always held is in the home page too
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    for heading in ('## The fast recipe and the benchmark', '## Resume, restart, evaluate, scale out',
                    '## When something goes wrong: the error atlas', '## Tests'):
        assert heading in readme
    assert '`device: [0, 1, 2, 3]` selects the GPUs' in readme


def test_readme_first_screen_gets_a_newcomer_running():
    "Before any table: what this is, then clone, install (its size, torch's CPU build), run, the course."
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    first = readme[:readme.index('\n|')]            # everything before the first table
    assert first.count('\n') < 60, "the first screen runs past 60 lines"
    steps = ['git clone ', '&& cd cifar_ddp_tut', 'pip install -e ".[dev]"', 'GB',
             'download.pytorch.org/whl/cpu', 'not tried here',
             'torchrun --standalone --nproc_per_node=2 -m cifar_ddp_tut.train --cfg config/cpu_quickstart.yaml',
             'jupyter lab nbs', 'course/01_first_ddp']
    at = [first.find(s) for s in steps]
    assert all(i >= 0 for i in at), [s for s, i in zip(steps, at) if i < 0]
    assert first.index('> Learn PyTorch') < at[0], "one line on what this is comes first"
    assert at[0] < at[2] < at[6] < at[7], "clone, install, run, then the course"


def test_run_notebooks_writes_the_same_times_into_readme_and_index(tmp_path, monkeypatch):
    "The Run All times go into both files alike, so README stays what the index makes."
    import importlib.util, shutil
    spec = importlib.util.spec_from_file_location('run_notebooks', ROOT / 'tests' / 'run_notebooks.py')
    rn = importlib.util.module_from_spec(spec); spec.loader.exec_module(rn)
    (tmp_path / 'nbs').mkdir()
    shutil.copy(NBS / 'index.ipynb', tmp_path / 'nbs' / 'index.ipynb')
    shutil.copy(ROOT / 'README.md', tmp_path / 'README.md')
    monkeypatch.setattr(rn, 'NBS', tmp_path / 'nbs'); monkeypatch.setattr(rn, 'ROOT', tmp_path)
    rn.record({'course/03_inside_ddp': 4321.0})
    mr = _make_readme()
    text = mr.readme(json.loads((tmp_path / 'nbs' / 'index.ipynb').read_text(encoding='utf-8')))
    assert text == (tmp_path / 'README.md').read_text(encoding='utf-8')
    assert '| `course/03_inside_ddp` |' in text and rn.fmt(4321.0) in text


def _make_readme():
    import importlib.util
    spec = importlib.util.spec_from_file_location('make_readme', ROOT / 'scripts' / 'make_readme.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m


# ---------------------------------------------------------------------------------------------
# What the hooks do to a notebook: "Under the hood:" parts, progress bars


def _fixture_notebook():
    "A small notebook with two 'Under the hood:' parts, one at the end, and a saved progress bar."
    import nbformat.v4 as v4
    md, code = v4.new_markdown_cell, v4.new_code_cell
    cells = [
        md('# Fixture\n\n> What does the site do with an "Under the hood" part?'),
        md('## 1. Buckets\n\nThe rule: keep reading.\n\n#### Under the hood: how the Reducer orders '
           'buckets\n\nPrivate names here.'),
        code('x = 1', outputs=[v4.new_output('stream', name='stderr',
                                              text='\r 40%|####      | 2/5 [00:01<00:01, 2.0it/s]'),
                                v4.new_output('stream', name='stdout', text='kept\n')]),
        md('##### a deeper heading inside the part\n\nstill inside'),
        md('#### Back in the thread\n\nOutside again.'),
        md('## 2. Last\n\n### Under the hood: the end\n\nRuns to the end of the notebook.'),
        code('y = 2'),
    ]
    for i, c in enumerate(cells): c['id'] = f'c{i}'
    return v4.new_notebook(cells=cells)


def test_under_the_hood_parts_are_collapsed_and_progress_bars_left_out(tmp_path):
    import os
    from mkdocs_jupyter.nbconvert2 import nb2html
    h = _hooks()
    nb = h.prepare(json.loads(json.dumps(_fixture_notebook())), Path('course/x.ipynb'), set())
    outs = [o for c in nb['cells'] for o in c.get('outputs', [])]
    assert [o['text'] for o in outs] == ['kept\n'], "the progress bar is left out, the print kept"
    path = tmp_path / 'x.ipynb'
    path.write_text(json.dumps(nb), encoding='utf-8')
    page = h.collapse_under_the_hood(nb2html(str(path), no_prompt=True))
    parts = re.findall(r'<details class="under-the-hood">(.*?)</details>', page, re.S)
    assert len(parts) == 2, page
    first, last = parts
    assert re.search(r'<summary><h4[^>]*>Under the hood: how the Reducer orders buckets', first)
    assert 'Private names here.' in first and 'kept' in first and 'still inside' in first
    assert 'Back in the thread' not in first and 'Outside again' in page.split('</details>')[1]
    assert 'The rule: keep reading.' not in first                    # the section's rule stays open
    assert re.search(r'<summary><h3[^>]*>Under the hood: the end', last) and 'Runs to the end' in last
    assert page.count('<details') == page.count('</details>') == 2


def test_folded_code_is_folded_on_the_page_with_its_outputs_in_view(tmp_path):
    "A cell JupyterLab shows collapsed (jupyter.source_hidden) is a closed <details> on its page."
    import nbformat.v4 as v4
    from mkdocs_jupyter.nbconvert2 import nb2html
    h = _hooks()
    shown = v4.new_code_cell('print("in view")', outputs=[v4.new_output('stream', name='stdout',
                                                                         text='first\n')])
    fold = v4.new_code_cell('#| export\nimport os\n\ndef worker(rank, world):\n\n    return "plumbing"',
                            outputs=[v4.new_output('stream', name='stdout', text='its output\n')])
    fold['metadata'] = {'jupyter': {'source_hidden': True}}
    nb = v4.new_notebook(cells=[v4.new_markdown_cell('# Fixture\n\n> Folded?'), shown, fold])
    for i, c in enumerate(nb['cells']): c['id'] = f'c{i}'
    path = tmp_path / 'x.ipynb'
    path.write_text(json.dumps(h.prepare(json.loads(json.dumps(nb)), Path('course/x.ipynb'), set())))
    page = h.fold_code(nb2html(str(path), no_prompt=True))
    parts = re.findall(r'<details class="folded-code"><summary>(.*?)</summary>(.*?)</details>', page, re.S)
    assert len(parts) == 1, page
    summary, body = parts[0]
    assert summary == 'Show the code (3 lines): <code>def worker(rank, world)</code>'
    assert 'plumbing' in body and 'its output' not in body and 'its output' in page
    assert 'in view' not in body and 'first' not in body
    assert body.count('<div') == body.count('</div>')


def test_a_notebook_without_under_the_hood_is_unchanged():
    h = _hooks()
    nb = json.loads((NBS / 'course' / '01_first_ddp.ipynb').read_text(encoding='utf-8'))
    if any('Under the hood:' in ''.join(c['source']) for c in nb['cells']): pytest.skip('uses it')
    cells = [c for c in nb['cells'] if not h._hidden(c)]
    folds = sum(h.folded(c) for c in cells)  # each folded cell gets a marker cell
    assert len(h.prepare(nb, Path('course/01_first_ddp.ipynb'), set())['cells']) <= len(cells) + folds + 1


def test_torch_docs_map_links_first_mentions_only():
    h = _hooks()
    docs = h.torch_docs()
    assert docs and all(u.startswith('https://docs.pytorch.org/docs/stable/') for u in docs.values())
    page = ('<h2 id="a">Why <code>DDP</code></h2><p>Use <code>DDP</code> and <code>DDP</code>, '
            '<a href="x"><code>torchrun</code></a>, then <code>torchrun</code>.</p>'
            '<pre><code>all_reduce</code></pre><p><code>all_reduce</code></p>')
    out = h.link_torch_docs(page, docs)
    assert out.count('class="torch-doc"') == 3
    assert '<h2 id="a">Why <code>DDP</code></h2>' in out                   # not in a heading
    assert out.count(docs['DDP']) == 1 and out.count(docs['torchrun']) == 1
    assert '<pre><code>all_reduce</code></pre>' in out


# ---------------------------------------------------------------------------------------------
# The built site: published address, conveniences


@pytest.mark.slow
def test_published_under_its_base_path(site):
    import configparser
    ini = configparser.ConfigParser(); ini.read(ROOT / 'settings.ini')
    url = ini['DEFAULT']['doc_host'] + ini['DEFAULT']['doc_baseurl'] + '/'
    assert url.endswith(BASE)
    sitemap = (site / 'sitemap.xml').read_text(encoding='utf-8')
    locs = re.findall(r'<loc>(.*?)</loc>', sitemap)
    assert len(locs) >= len(notebooks()) and all(l.startswith(url) for l in locs), locs[:3]
    # the 404 page is shown at any address: its links start from the base path
    hrefs = Page((site / '404.html').read_text(encoding='utf-8')).urls
    assert any(u.startswith(BASE + 'assets/') for u in hrefs), hrefs[:10]


@pytest.mark.slow
def test_each_notebook_page_offers_its_download_and_repository(site, pages):
    for nb in notebooks()[1:]:   # the home page is README's text
        text = (site / page_of(nb)).read_text(encoding='utf-8')
        m = re.search(r'<a href="([^"]+\.ipynb)" download=', text)
        assert m, f"{page_of(nb)}: no download link"
        got = (site / page_of(nb)).parent / m.group(1)
        assert got.read_bytes() == nb.read_bytes(), f"{page_of(nb)}: the download is not the notebook"
        assert f'blob/main/nbs/{nb.relative_to(NBS).as_posix()}' in text


@pytest.mark.slow
def test_torch_apis_link_to_pytorch_docs(site):
    text = (site / 'course/03_inside_ddp.html').read_text(encoding='utf-8')
    links = re.findall(r'class="torch-doc" href="([^"]+)"', text)
    assert links and len(links) == len(set(links)), "each page links a torch API once"
    assert any('DistributedDataParallel' in u for u in links)


@pytest.mark.slow
def test_api_pages_show_signatures_and_docstrings(site):
    h = _hooks()
    for m in h.modules():
        if m == '__init__.py': continue
        assert (site / 'api' / (m[:-3] + '.html')).exists(), m
    text = (site / 'api/config.html').read_text(encoding='utf-8')
    assert 'id="cifar_ddp_tut.config.load_config"' in text
    assert 'doc-signature' in text and 'Config' in text


# ---------------------------------------------------------------------------------------------
# Published by CI


def _tool(name):
    import shutil
    exe = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(exe).exists(): pytest.fail(f"{name} is missing: pip install -e '.[dev]' brings it")
    return exe


def test_the_workflows_pass_the_linters():
    "The GitHub workflows against GitHub's workflow schema, and zizmor's audits (offline)."
    wfs = sorted((ROOT / '.github' / 'workflows').glob('*.yml'))
    assert {p.name for p in wfs} >= {'test.yml', 'pages.yml'}
    p = run_process([_tool('check-jsonschema'), '--builtin-schema', 'vendor.github-workflows',
                     *map(str, wfs)], 120, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    p = run_process([_tool('zizmor'), '--offline', '--no-progress', *map(str, wfs)], 120, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    test = (ROOT / '.github/workflows/test.yml').read_text(encoding='utf-8')
    assert 'bash .ci/run' in test, "CI where the project is hosted runs what .ci/run runs"
    pages_wf = (ROOT / '.github/workflows/pages.yml').read_text(encoding='utf-8')
    assert 'mkdocs build' in pages_wf and 'actions/deploy-pages' in pages_wf

"""The course as a website: `mkdocs build` (mkdocs.yml, scripts/site_hooks.py) builds it from the saved
notebooks, and a reader finds every notebook in the sidebar in reading order with its question, its
saved figures, links that lead somewhere, and the error atlas through the search box."""
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
pytestmark = pytest.mark.slow  # about a minute on 2 busy cores: one build for the whole module


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


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "The site, built once for this module from the notebooks as they are saved."
    out = tmp_path_factory.mktemp('site') / '_site'
    t0 = time.monotonic()
    p = run_process([sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir', out], 600,
                    cwd=ROOT, env={**__import__('os').environ, 'NO_MKDOCS_2_WARNING': '1'})
    print(f"mkdocs build: {time.monotonic() - t0:.0f} s")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    return out


@pytest.fixture(scope='module')
def pages(site):
    return {p.relative_to(site).as_posix(): Page(p.read_text(encoding='utf-8'))
            for p in site.rglob('*.html')}


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
    nav = [u for u in nav if not u.startswith('source/')]
    assert nav == expected


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
    # 404.html links from the root of the site, the one page that can be shown at any address
    base = site if path.startswith('/') else (site / page).parent
    target = base / path.lstrip('/') if path else site / page
    target = target.resolve()
    if target.is_dir(): target = target / 'index.html'
    return target, parts.fragment


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


def test_nbdev_docs_sidebar_has_the_same_order():
    """`nbdev_docs` (with Quarto) writes nbs/sidebar.yml from the same files: checked without
    Quarto by asking nbdev for the sidebar it would write."""
    p = run_process([sys.executable, '-c', 'from nbdev.quarto import nbdev_sidebar; '
                     'nbdev_sidebar.__wrapped__(printit=True, force=True)'], 300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    listed = re.findall(r'^\s*- (\S+\.ipynb)\s*$', p.stdout, re.M)
    assert listed == [nb.relative_to(NBS).as_posix() for nb in notebooks()], p.stdout

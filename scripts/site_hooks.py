"""MkDocs hooks that turn the saved notebooks in `nbs/` into the course's website (`mkdocs build`).

Nothing is executed: each page shows the outputs saved in its notebook. On the way the notebooks are
copied to a scratch folder and prepared as nbdev's own docs prepare them (`#| hide` cells left out,
`#| ...` directive lines not shown); the pages then get working links (`.ipynb` links point at
pages), the package's source as pages, and nothing that must be fetched from the internet.
"""
import html
import json
import re
import shutil
import tempfile
from pathlib import Path

from latex2mathml.converter import convert as latex_to_mathml
from mkdocs.structure.toc import get_toc

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'
PKG = ROOT / 'cifar_ddp_tut'
SECTIONS = {'course': 'The DDP course', 'program': 'The program'}
SOURCE_DIR = 'source'  # where the package's source pages go in the site
API_DIR = 'api'        # where the package's API pages (mkdocstrings) go in the site
HERE = Path(__file__).resolve().parent
TORCH_DOCS = HERE / 'torch_docs.json'   # the one map: a torch name as the notebooks write it -> its docs
UNDER_THE_HOOD = 'Under the hood:'      # a heading starting so opens a part the site collapses
# a code cell whose input JupyterLab shows collapsed (cell metadata jupyter.source_hidden: the
# course's plumbing, off a learner's reading path) is folded on its page too: one click shows it
FOLD_MARK = 'fold-next'
# pages a search for an error message should find first: the atlas answers messages, so its
# sections outrank pages whose titles share a word by prefix ("use" of "user"); checked by
# tests/test_site_browser.py against every message of README's atlas table
SEARCH_BOOST = {'course/08_error_atlas.ipynb': 20}
# the package's API and source pages below the lessons: their short headings ("no_sync") would
# otherwise outrank the notebook that teaches the name
REFERENCE_BOOST = 0.1

_scratch = None   # the folder the site is built from
_css = []         # the notebooks' style sheets, written once to assets/notebook.css


# ---------------------------------------------------------------------------------------------
# Which notebooks, in which order, answering which question


def notebooks(nbs=NBS):
    "The site's notebooks in reading order: index.ipynb, then each folder's notebooks by name."
    out = [nbs / 'index.ipynb'] if (nbs / 'index.ipynb').exists() else []
    for d in sorted(p for p in nbs.iterdir() if p.is_dir() and not p.name.startswith(('_', '.'))):
        out += sorted(p for p in d.glob('*.ipynb') if not p.name.startswith(('_', '.')))
    return out


def title_and_question(nb):
    "The `# title` and `> question` lines of a notebook's first markdown cell."
    cell = next(c for c in nb['cells'] if c['cell_type'] == 'markdown')
    lines = ''.join(cell['source']).splitlines()
    title = next((l[2:].strip() for l in lines if l.startswith('# ')), '')
    question = next((l[1:].strip() for l in lines if l.startswith('>')), '')
    return title, question


def _plain(md):
    "Markdown of a heading or a summary as plain text."
    return re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', md).replace('`', '')


def _first_question(text):
    "The question of a summary that goes on after its question mark."
    m = re.match(r'(.*?\?)(\s|$)', text)
    return m.group(1) if m else text


def _number(path):
    m = re.match(r'(\d+)_', path.name)
    return f'{int(m.group(1))}. ' if m else ''


def _exported_module(nb):
    "The module `#| default_exp` names, as a path in the package, or None."
    for c in nb['cells']:
        m = re.search(r'^#\|\s*default_exp\s+(\S+)', ''.join(c['source']), re.M)
        if c['cell_type'] == 'code' and m: return m.group(1).replace('.', '/') + '.py'
    return None


# ---------------------------------------------------------------------------------------------
# Preparing a notebook for its page


_DIRECTIVE = re.compile(r'^\s*#\s*\|\s*(.*)$')


def _directives(src):
    return [m.group(1).strip() for l in src.splitlines() if (m := _DIRECTIVE.match(l))]


def _hidden(cell):
    "Cells that nbdev's docs leave out: `#| hide`, `#| include: false`."
    ds = _directives(''.join(cell['source']))
    return any(d == 'hide' or re.fullmatch(r'include:\s*false', d) for d in ds)


def _code_cell(cell):
    src = ''.join(cell['source'])
    ds = _directives(src)
    shown = '\n'.join(l for l in src.splitlines() if not _DIRECTIVE.match(l)).strip('\n')
    cell = dict(cell, source=shown)
    if any(re.fullmatch(r'echo:\s*false', d) for d in ds):
        cell['metadata'] = dict(cell.get('metadata', {}), tags=['remove_input'])
    if any(re.fullmatch(r'output:\s*false', d) for d in ds): cell['outputs'] = []
    if not shown and not cell.get('outputs'): return None
    return cell


_CODE = re.compile(r'(```.*?```|`[^`\n]*`)', re.S)


def _math(md):
    "LaTeX between `$$` or `$` as MathML, which browsers draw without a script from the internet."
    def mathml(m, display):
        try: return latex_to_mathml(m.group(1), display=display)
        except Exception: return m.group(0)  # a formula it cannot read stays as written
    def block(m): return mathml(m, 'block')
    def inline(m): return mathml(m, 'inline')
    parts = _CODE.split(md)
    for i in range(0, len(parts), 2):  # not inside code
        p = re.sub(r'\$\$(.+?)\$\$', block, parts[i], flags=re.S)
        parts[i] = re.sub(r'(?<![\\$\w])\$(?!\s)([^$\n]+?)(?<!\s)\$(?![\w$])', inline, p)
    return ''.join(parts)


def _link_notebook_names(md, here, known):
    "`course/03_inside_ddp` or `nbs/course/03_inside_ddp.ipynb` in code becomes a link to its page."
    def sub(m):
        rel = f'{m.group(2)}.ipynb'
        if rel not in known: return m.group(0)
        return f'[{m.group(1)}]({"../" * len(here.parent.parts)}{rel})'
    return re.sub(r'(?<!\[)(`(?:nbs/)?((?:course|program)/\d+_\w+)(?:\.ipynb)?`)(?!\])', sub, md)


_TQDM = re.compile(r'\d+%\|[^|\n]*\|\s*\d+/\d+|\r')


def progress_bar(out):
    "A progress bar saved as an output (tqdm on stderr, a widget): noise on a page."
    if 'application/vnd.jupyter.widget-view+json' in out.get('data', {}): return True
    text = out.get('text', '')
    text = ''.join(text) if isinstance(text, list) else text
    return out.get('output_type') == 'stream' and out.get('name') == 'stderr' and bool(_TQDM.search(text))


_MD_HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')


def _heading_chunks(md):
    "A markdown cell's text cut before each heading line (not inside a ``` fence)."
    chunks, cur, fence = [], [], False
    for line in md.splitlines(keepends=True):
        if line.lstrip().startswith('```'): fence = not fence
        if not fence and _MD_HEADING.match(line) and cur:
            chunks.append(''.join(cur)); cur = []
        cur.append(line)
    if cur: chunks.append(''.join(cur))
    return chunks


CLOSE_MARK = '<div class="uth-close"></div>'


def mark_under_the_hood(cells):
    """Cells with each "Under the hood:" part starting a cell of its own and closed by a marker cell
    before the next heading of the same or a higher level (or at the end): the page turns each part
    into a `<details>` (`collapse_under_the_hood`)."""
    if not any(c['cell_type'] == 'markdown' and re.search(r'^#{1,6}\s+' + UNDER_THE_HOOD,
               ''.join(c['source']), re.M) for c in cells):
        return cells
    out, level = [], None
    def close(cid):
        out.append({'cell_type': 'markdown', 'id': f'{cid}-uth-end', 'metadata': {}, 'source': CLOSE_MARK})
    for cell in cells:
        if cell['cell_type'] != 'markdown':
            out.append(cell); continue
        for k, chunk in enumerate(_heading_chunks(''.join(cell['source']))):
            m = _MD_HEADING.match(chunk.splitlines()[0]) if chunk.strip() else None
            if m and level is not None and len(m.group(1)) <= level:
                close(cell.get('id', 'c')); level = None
            if m and level is None and m.group(2).startswith(UNDER_THE_HOOD): level = len(m.group(1))
            out.append(dict(cell, id=f"{cell.get('id', 'c')}-{k}" if k else cell.get('id'), source=chunk))
    if level is not None: close('last')
    return out


def folded(cell):
    "A code cell whose input JupyterLab shows collapsed (`jupyter.source_hidden` in its metadata)."
    return cell['cell_type'] == 'code' and bool(cell.get('metadata', {}).get('jupyter', {}).get('source_hidden'))


def _fold_marker(cell):
    "A marker cell before a folded code cell: its summary names the cell's first definition and size."
    lines = [l for l in ''.join(cell['source']).splitlines() if l.strip()]
    first = next((l for l in lines if re.match(r'(async\s+)?(def|class)\s', l)), lines[0] if lines else '')
    summary = (f'Show the code ({len(lines)} lines): <code>{html.escape(first.strip().rstrip(":"))}</code>')
    return {'cell_type': 'markdown', 'id': f"{cell.get('id', 'c')}-fold", 'metadata': {},
            'source': f'<div class="{FOLD_MARK}" data-summary="{html.escape(summary)}"></div>'}


def prepare(nb, rel, known):
    "The notebook as its page shows it; `rel` is its path under nbs/, `known` every such path."
    cells = []
    for cell in nb['cells']:
        if _hidden(cell): continue
        if cell['cell_type'] == 'code':
            cell = _code_cell(cell)
            if cell is None: continue
            if folded(cell) and cell['source'].strip(): cells.append(_fold_marker(cell))
            if cell.get('outputs'):
                cell['outputs'] = [o for o in cell['outputs'] if not progress_bar(o)]
        elif cell['cell_type'] == 'markdown':
            md = _link_notebook_names(_math(''.join(cell['source'])), rel, known)
            cell = dict(cell, source=md)
        cells.append(cell)
    cells = mark_under_the_hood(cells)
    module = _exported_module(nb)
    if module and cells:
        href = Path(*['..'] * len(rel.parent.parts), SOURCE_DIR, PKG.name, module + '.md').as_posix()
        note = (f'The code exported from this notebook: [`{PKG.name}/{module}`]({href}) '
                f'(generated by `nbdev_export`; the notebook is the source to edit).')
        cells.insert(1, {'cell_type': 'markdown', 'id': 'exported-code', 'metadata': {}, 'source': note})
    return dict(nb, cells=cells)


def source_page(py, rel_to_pkg):
    "A page showing one generated module, with a link back to the notebook it is exported from."
    text = py.read_text(encoding='utf-8')
    m = re.search(r'File to edit: \.\./(?:\.\./)*nbs/(\S+?\.ipynb)', text)
    depth = len(Path(SOURCE_DIR, PKG.name, rel_to_pkg).parent.parts)
    back = ''
    if m:
        nb = m.group(1)
        back = (f'Generated by `nbdev_export` from [{nb[:-6]}]({"../" * depth}{nb}): '
                'read and edit the notebook, not this file.\n\n')
    fence = '`' * max(3, 1 + max((len(r) for r in re.findall(r'`+', text)), default=0))
    return f'# {PKG.name}/{rel_to_pkg}\n\n{back}{fence}python linenums="1"\n{text}\n{fence}\n'


def api_page(dotted, rel_to_pkg):
    "A module's API page: mkdocstrings renders its public names' signatures and docstrings."
    src = Path('..', *['..'] * rel_to_pkg.count('/'), SOURCE_DIR, PKG.name, rel_to_pkg + '.md').as_posix()
    return (f'# {dotted}\n\nSignatures and docstrings of the names `{dotted}` exports '
            f'(its `__all__`); the code: [{PKG.name}/{rel_to_pkg}]({src}).\n\n::: {dotted}\n')


def modules():
    "The package's modules, as paths relative to the package."
    return sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob('*.py')
                  if not p.name.startswith('_') and '__pycache__' not in p.parts)


# ---------------------------------------------------------------------------------------------
# MkDocs events


def on_config(config, **kwargs):
    "Prepare the notebooks and source pages in a scratch folder, and the sidebar in reading order."
    global _scratch
    _scratch = Path(tempfile.mkdtemp(prefix='cifar_ddp_site_'))
    nbs = notebooks()
    known = {p.relative_to(NBS).as_posix() for p in nbs}
    nav, sections, meta, titles = [], {}, {}, {}
    for p in nbs:
        rel = p.relative_to(NBS)
        nb = json.loads(p.read_text(encoding='utf-8'))
        out = _scratch / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(prepare(nb, rel, known), indent=1, ensure_ascii=False) + '\n',
                       encoding='utf-8')
        title, question = title_and_question(nb)
        titles[rel.as_posix()] = f'{_number(p)}{_plain(title)}' if rel.parent.parts else 'Home'
        if rel.parent == Path('.'):
            nav.append({'Home': rel.as_posix()})
            continue
        meta[rel.as_posix()] = html.escape(_plain(_first_question(question)))
        section = SECTIONS.get(rel.parent.as_posix(), rel.parent.as_posix())
        if section not in sections:
            sections[section] = []
            nav.append({section: sections[section]})
        sections[section].append({titles[rel.as_posix()]: rel.as_posix()})
    source_nav = []
    for m in modules():
        page = Path(SOURCE_DIR, PKG.name, m + '.md')
        (_scratch / page).parent.mkdir(parents=True, exist_ok=True)
        (_scratch / page).write_text(source_page(PKG / m, m), encoding='utf-8')
        source_nav.append({m: page.as_posix()})
    api_nav = []
    for m in modules():
        if m == '__init__.py': continue
        dotted = f"{PKG.name}.{m[:-3].replace('/', '.')}"
        page = Path(API_DIR, m[:-3] + '.md')
        (_scratch / page).parent.mkdir(parents=True, exist_ok=True)
        (_scratch / page).write_text(api_page(dotted, m), encoding='utf-8')
        api_nav.append({dotted: page.as_posix()})
    nav.append({"The package's API": api_nav})
    nav.append({"The package's source": source_nav})
    (_scratch / 'assets').mkdir(exist_ok=True)
    shutil.copy(HERE / 'site.css', _scratch / 'assets' / 'site.css')
    shutil.copy(HERE / 'site_search.js', _scratch / 'assets' / 'site_search.js')  # site_theme/main.html
    config['nav'] = nav
    config['docs_dir'] = str(_scratch)
    config.extra['questions'], config.extra['titles'] = meta, titles
    config['extra_css'] = ['assets/notebook.css', 'assets/site.css'] + list(config.get('extra_css', []))
    return config


def on_page_markdown(markdown, page, config, **kwargs):
    "The question a notebook answers, shown under its title in the sidebar."
    q = config.extra['questions'].get(page.file.src_uri)
    if q: page.meta['subtitle'] = q
    if page.file.src_uri in SEARCH_BOOST: page.meta['search'] = {'boost': SEARCH_BOOST[page.file.src_uri]}
    if page.file.src_uri.startswith((API_DIR + '/', SOURCE_DIR + '/')):
        page.meta['search'] = {'boost': REFERENCE_BOOST}
    return markdown


_ASSET = re.compile(r'<style type="text/css">(.*?)</style>', re.S)
_REMOTE_SCRIPTS = [
    re.compile(r'<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->', re.S),
    re.compile(r'<script type="module">\s*document\.addEventListener\("DOMContentLoaded", async.*?'
               r'<!-- End of mermaid configuration -->', re.S),
]


_HEADING = re.compile(r'<h([1-6])([^>]*?)\bid="([^"]*)"([^>]*)>(.*?)</h\1>', re.S)


def _headings_and_toc(content):
    """The page with one id per heading, and its table of contents from those ids (the converter's
    own drops what is in `code` from a heading's id, so its links missed their headings)."""
    seen, tokens, stack = {}, [], []

    def heading(m):
        level, old, inner = int(m.group(1)), m.group(3), m.group(5)
        n = seen.get(old, 0)
        seen[old] = n + 1
        new = f'{old}_{n}' if n else old
        inner = inner.replace(f'href="#{old}"', f'href="#{new}"')
        name = re.sub(r'<[^>]+>', '', re.sub(r'<a class="anchor-link".*?</a>', '', inner)).strip()
        token = {'level': level, 'id': new, 'name': name, 'children': []}
        while stack and stack[-1]['level'] >= level: stack.pop()
        (stack[-1]['children'] if stack else tokens).append(token)
        stack.append(token)
        return f'<h{level}{m.group(2)}id="{new}"{m.group(4)}>{inner}</h{level}>'
    return _HEADING.sub(heading, content), get_toc(tokens)


_CELL = re.compile(r'<div class="jp-Cell [^"]*"[^>]*>')
_FIRST_HEADING = re.compile(r'<h([1-6])\b[^>]*>.*?</h\1>', re.S)


def collapse_under_the_hood(content):
    """Each "Under the hood:" part (marked by `mark_under_the_hood`) as a closed `<details>` whose
    summary is its heading: a reader who skips it keeps the thread, one click opens it."""
    if 'uth-close' not in content and UNDER_THE_HOOD not in content: return content
    starts = [m.start() for m in _CELL.finditer(content)]
    if not starts: return content
    out, prev = [content[:starts[0]]], starts[0]
    bounds = starts[1:] + [len(content)]
    for a, b in zip(starts, bounds):
        cell = content[a:b]
        if CLOSE_MARK in cell:
            out.append('</details>\n')
        else:
            h = _FIRST_HEADING.search(cell)
            text = re.sub(r'<[^>]+>', '', h.group(0)).strip() if h else ''
            if h and text.startswith(UNDER_THE_HOOD) and not cell[:h.start()].count('<p'):
                out.append(f'<details class="under-the-hood"><summary>{h.group(0)}</summary>\n')
                cell = cell[:h.start()] + cell[h.end():]
        out.append(cell)
    return ''.join(out)


_FOLD = re.compile(r'<div class="' + FOLD_MARK + r'" data-summary="([^"]*)"></div>')


def _div_end(s, a):
    "The end of the `<div>` that opens at `a`."
    depth = 0
    for m in re.finditer(r'<div\b|</div>', s[a:]):
        depth += 1 if m.group(0) == '<div' else -1
        if depth == 0: return a + m.end()
    return len(s)


def fold_code(content):
    """The input of each code cell after a `_fold_marker` inside a closed `<details>`; its outputs stay
    in view."""
    out, pos = [], 0
    for m in _FOLD.finditer(content):
        if m.start() < pos: continue
        a = content.find('<div class="jp-Cell-inputWrapper"', m.end())
        if a < 0: continue
        b = _div_end(content, a)
        out += [content[pos:a], f'<details class="folded-code"><summary>{html.unescape(m.group(1))}'
                f'</summary>\n', content[a:b], '\n</details>\n']
        pos = b
    return ''.join(out) + content[pos:]


def torch_docs():
    "The map from a torch name, as the notebooks write it in `code`, to its page in PyTorch's docs."
    return json.loads(TORCH_DOCS.read_text(encoding='utf-8'))


def link_torch_docs(content, docs):
    """The first mention of each torch name of `docs` in a page's prose (`<code>name</code>` outside
    headings, links and code cells) linked to PyTorch's documentation."""
    seen = set()
    def sub(m):
        name = html.unescape(m.group(1))
        url = docs.get(name)
        if not url or url in seen: return m.group(0)
        before = content[:m.start()]
        if before.rfind('<a ') > before.rfind('</a>'): return m.group(0)       # inside a link
        if re.search(r'<h[1-6][^>]*>(?:(?!</h[1-6]>).)*$', before[-800:], re.S): return m.group(0)
        if before.rfind('<pre') > before.rfind('</pre>'): return m.group(0)     # inside code
        seen.add(url)
        return f'<a class="torch-doc" href="{url}" title="PyTorch documentation">{m.group(0)}</a>'
    return re.sub(r'<code>([^<]{1,80})</code>', sub, content)


def notebook_links(page, config):
    "The download of the notebook and its page in the repository, under the page's title."
    rel = page.file.src_uri
    name = Path(rel).name
    repo = config.get('repo_url')
    view = (f' · <a href="{repo.rstrip("/")}/blob/{config.extra.get("branch", "main")}/nbs/{rel}">'
            'View it in the repository</a>') if repo else ''
    return (f'<p class="nb-links"><a href="{name}" download="{name}">Download this notebook '
            f'(<code>{name}</code>)</a>{view}</p>\n')


def on_page_content(content, page, config, files, **kwargs):
    "Notebook pages: links to notebooks lead to their pages; style sheets shared; no remote scripts."
    if not page.file.src_uri.endswith('.ipynb'): return content
    # the notebook's own title, numbered as in the sidebar (the converter drops `code` from it)
    page.title = config.extra['titles'].get(page.file.src_uri, page.title)
    for rx in _REMOTE_SCRIPTS: content = rx.sub('', content)

    def css(m):
        if m.group(1) not in _css: _css.append(m.group(1))
        return ''
    content = _ASSET.sub(css, content)
    content, page.toc = _headings_and_toc(content)
    # the search box indexes words a reader reads, not the copy button's notice or the heading's ¶
    for tag in ('<span class="notice" hidden', '<a class="anchor-link"'):
        content = content.replace(tag, tag + ' data-search-exclude="true"')

    def link(m):
        url = m.group(2)
        if re.match(r'[a-z][a-z0-9+.-]*:|/|#', url): return m.group(0)
        path, _, frag = url.partition('#')
        stem, dot, ext = path.rpartition('.')
        if ext not in ('ipynb', 'md'): return m.group(0)
        return f'{m.group(1)}"{stem}.html{"#" + frag if frag else ""}"'
    content = re.sub(r'(href=)"([^"]*)"', link, content)
    content = collapse_under_the_hood(content)
    content = fold_code(content)
    content = link_torch_docs(content, torch_docs())
    h1 = content.find('</h1>') if '/' in page.file.src_uri else -1   # the home page: README's text
    if h1 >= 0: content = content[:h1 + 5] + notebook_links(page, config) + content[h1 + 5:]
    return content


def on_post_build(config, **kwargs):
    out = Path(config['site_dir']) / 'assets' / 'notebook.css'
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text('\n'.join(_css), encoding='utf-8')   # the site's own rules: scripts/site.css
    # each page's "Download this notebook": the notebook as saved, hidden cells and all
    for nb in notebooks():
        rel = nb.relative_to(NBS)
        (Path(config['site_dir']) / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(nb, Path(config['site_dir']) / rel)


def on_shutdown(**kwargs):
    if _scratch is not None: shutil.rmtree(_scratch, ignore_errors=True)

"""The website as a reader's browser shows it: headless Chromium (Debian's package, which .ci/run
installs where none is present), driven by Playwright, on the site built and served under the address
GitHub Pages serves it at (`/cifar_ddp_tut/`).

- Nothing is cut off at any width: every page at 1280 and 390 px has no element whose content is
  wider than its box without a scroll container around it, and printed output keeps its lines whole.
- The atlas first: each message of README's atlas table, typed into the search box or pasted whole,
  puts the atlas section that answers it first, as the page's own search (lunr, in the browser) ranks.
- The dark theme keeps figures on their white ground."""
import functools
import http.server
import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from test_site import BASE, NBS, ROOT, built_site

pytestmark = pytest.mark.slow
FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
         '--disable-component-update', '--disable-sync', '--no-first-run']
WIDTHS = (1280, 390)


def chromium():
    for name in ('chromium', 'chromium-browser', 'google-chrome'):
        if exe := shutil.which(name): return exe
    pytest.fail("no Chromium: `apt-get install chromium` (.ci/run does it)")


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    "The site served on 127.0.0.1 under its base path: (the site's folder, its address)."
    site = built_site(tmp_path_factory)   # built once a session, with tests/test_site.py
    www = site.parent
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a): pass
    handler = functools.partial(Quiet, directory=str(www))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield site, f'http://127.0.0.1:{server.server_port}{BASE}'
    server.shutdown()


@pytest.fixture(scope='module')
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=FLAGS)
        yield b
        b.close()


def _page(browser, width, base):
    ctx = browser.new_context(viewport={'width': width, 'height': 900})
    # the site needs nothing from elsewhere; the repository's star count is not fetched here
    ctx.route(re.compile(r'^(?!' + re.escape(base.split(BASE)[0]) + r').*'), lambda r: r.abort())
    return ctx, ctx.new_page()


# An element is cut off when its content is wider than its box and neither it nor a box around it
# scrolls; a printed output that wraps its lines (`white-space` other than `pre`) breaks a table row.
CUT_OFF = """() => {
  const root = document.querySelector('article.md-content__inner') || document.body;
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const bad = [], vw = document.documentElement.clientWidth;
  const say = el => el.tagName.toLowerCase() + (typeof el.className === 'string' && el.className ?
      '.' + el.className.trim().split(/\\s+/).slice(0, 2).join('.') : '');
  for (const el of root.querySelectorAll('*')) {
    // an inline element has no box of its own (clientWidth 0): its block is checked instead
    if (el.clientWidth === 0 || el.scrollWidth <= el.clientWidth + 1) continue;
    if (el.closest('details:not([open])') || scrolls(el)) continue;
    let a = el.parentElement, ok = false;
    for (; a && a !== document.body; a = a.parentElement) if (scrolls(a)) { ok = true; break; }
    if (!ok) bad.push(`${say(el)}: content ${el.scrollWidth}px wide in ${el.clientWidth}px, no scroll: `
                      + (el.textContent || '').trim().slice(0, 70));
  }
  for (const pre of root.querySelectorAll('.jp-OutputArea-output pre'))
    if (getComputedStyle(pre).whiteSpace !== 'pre')
      bad.push(`printed output wraps its lines (white-space ${getComputedStyle(pre).whiteSpace}): `
               + pre.textContent.trim().slice(0, 70));
  if (document.documentElement.scrollWidth > vw + 1)
    bad.push(`the page itself is ${document.documentElement.scrollWidth}px wide in ${vw}px`);
  return bad;
}"""


def test_nothing_is_cut_off_at_any_width(served, browser):
    site, base = served
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob('*.html'))
    assert len(pages) > 40
    bad, t0 = [], time.monotonic()
    ctx, page = _page(browser, WIDTHS[0], base)
    for rel in pages:
        page.goto(base + rel, wait_until='load')
        for width in WIDTHS:   # one load, laid out at each width in turn (as a resized window)
            page.set_viewport_size({'width': width, 'height': 900})
            page.evaluate('() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))')
            bad += [f'{rel} at {width} px: {b}' for b in page.evaluate(CUT_OFF)]
        page.set_viewport_size({'width': WIDTHS[0], 'height': 900})
    ctx.close()
    print(f"{len(pages)} pages at {len(WIDTHS)} widths: {time.monotonic() - t0:.0f} s")
    assert not bad, '\n'.join(bad[:40])


def atlas_messages():
    """Each message of README's atlas table (the backticked parts of its first column), with the
    atlas section that answers it (its number, from the second column)."""
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    table = readme[readme.index('| the message |'):].split('\n\n')[0].splitlines()[2:]
    out = []
    for row in table:
        msg, section = [c.strip() for c in row.strip('|').split(' | ')][:2]
        number = section.split()[0]
        out += [(m, number) for m in re.findall(r'`([^`]+)`', msg)]
    return out


def pasted_line(message):
    "The whole line a reader pastes: the longest line of the atlas notebook that holds the message."
    nb = json.loads((NBS / 'course' / '08_error_atlas.ipynb').read_text(encoding='utf-8'))
    lines = []
    for c in nb['cells']:
        for o in c.get('outputs', []):
            t = o.get('text', '') or o.get('data', {}).get('text/plain', '')
            lines += (''.join(t) if isinstance(t, list) else t).splitlines()
        if c['cell_type'] == 'markdown':
            lines += [l for l in ''.join(c['source']).splitlines() if not l.startswith('#')]
    lines = [l.strip(' `>') for l in lines if message in l and len(l) < 400]
    return max(lines, key=len, default=message)


def _search(page, query, typed):
    "The search box's results for `query`: the links of its result list, in their order."
    box = page.locator('input.md-search__input')
    box.click()
    box.fill('')
    if typed: box.press_sequentially(query)
    else:   # a paste: the whole text at once, then the key's release, which the search box reads
        box.fill(query)
        box.press('End')
    last, stable = None, 0
    for _ in range(100):  # the worker answers each keystroke: wait until the list stops changing
        time.sleep(0.1)
        now = page.eval_on_selector_all('.md-search-result__item a.md-search-result__link',
                                        'es => es.map(e => e.getAttribute("href"))')
        none = page.eval_on_selector('.md-search-result__meta', 'e => /No matching/i.test(e.textContent)')
        stable = stable + 1 if now == last and (now or none) else 0
        last = now
        if stable >= 3: break
    return last or []


def test_searching_an_atlas_message_finds_its_atlas_section_first(served, browser):
    site, base = served
    messages = atlas_messages()
    assert len(messages) >= 15, messages
    toc = (site / 'course/08_error_atlas.html').read_text(encoding='utf-8')
    ctx, page = _page(browser, 1280, base)
    page.goto(base + 'index.html', wait_until='load')
    wrong = []
    for message, number in messages:
        for query, typed in ((message, True), (pasted_line(message), False)):
            hits = _search(page, query, typed)
            sections = [h for h in hits if '#' in h]          # a page's own entry heads its group
            first = sections[0].split('?')[0] + '#' + sections[0].split('#')[1] if sections else ''
            frag = first.partition('#')[2]
            ok = 'course/08_error_atlas.html' in first and re.match(
                rf'{re.escape(number.replace(".", ""))}\b|{re.escape(number.replace(".", ""))}-', frag)
            if not ok:
                wrong.append(f"{'typed' if typed else 'pasted'} {query[:80]!r}: first {first or hits[:3]}, "
                             f"expected the atlas's section {number}")
    # a number or a one-letter word (lunr's automaton once merged states with numbers in them)
    for query in ('1', 'a', 'step 1'):
        if not [h for h in _search(page, query, False) if '#' in h]: wrong.append(f"{query!r}: nothing")
    ctx.close()
    assert not wrong, '\n'.join(wrong)


def test_the_dark_theme_keeps_figures_readable(served, browser):
    site, base = served
    ctx, page = _page(browser, 1280, base)
    ctx.add_init_script("localStorage.setItem(location.pathname.split('/').slice(0, 2).join('/') + "
                        "'/.__palette', JSON.stringify({index: 1, color: {scheme: 'slate'}}))")
    page.goto(base + 'course/09_scaling.html', wait_until='load')
    page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")
    bg = page.evaluate("""() => [getComputedStyle(document.body).backgroundColor,
        getComputedStyle(document.querySelector('.jp-OutputArea-output img')).backgroundColor]""")
    ctx.close()
    assert bg[0] != 'rgb(255, 255, 255)' and bg[1] == 'rgb(255, 255, 255)', bg

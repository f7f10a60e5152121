"""README.md from nbs/index.ipynb, the site's home page: one source for both.

    python scripts/make_readme.py           # writes README.md
    python scripts/make_readme.py --check   # exits 1, saying where, when README.md is not what it writes

Edit nbs/index.ipynb, then run this (nbdev's `nbdev_readme` does the same with Quarto, which this
project does not need). README.md is the notebook's markdown cells in order, separated by a blank
line; cells nbdev's docs hide (`#| hide`) are left out, and any other code cell is shown as code.
`tests/run_notebooks.py` writes the Run All times into both files alike; `tests/test_site.py` fails
when README.md and the notebook differ."""
import argparse, difflib, json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INDEX, README = ROOT / 'nbs' / 'index.ipynb', ROOT / 'README.md'
NOTE = ('<!-- Generated from nbs/index.ipynb by `python scripts/make_readme.py`: '
        'edit the notebook, not this file. -->')


def _hidden(src):
    return bool(re.search(r'^\s*#\s*\|\s*(hide\s*$|include:\s*false)', src, re.M))


def readme(nb) -> str:
    "The README's text for the notebook `nb` (a dict as json.load gives it)."
    parts = []
    for c in nb['cells']:
        src = ''.join(c['source']).strip('\n')
        if not src or _hidden(src): continue
        parts.append(src if c['cell_type'] == 'markdown' else f'```python\n{src}\n```')
    parts.insert(1, NOTE)   # after the title: shown nowhere, read by whoever edits README.md
    return '\n\n'.join(parts) + '\n'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--check', action='store_true', help='write nothing; exit 1 if README.md differs')
    a = p.parse_args(argv)
    text = readme(json.loads(INDEX.read_text(encoding='utf-8')))
    if not a.check:
        README.write_text(text, encoding='utf-8')
        return 0
    have = README.read_text(encoding='utf-8')
    if have == text: return 0
    diff = difflib.unified_diff(text.splitlines(), have.splitlines(), 'from nbs/index.ipynb',
                                'README.md', lineterm='', n=1)
    print('README.md differs from nbs/index.ipynb: edit the notebook, then run '
          '`python scripts/make_readme.py`\n' + '\n'.join(list(diff)[:60]), file=sys.stderr)
    return 1


if __name__ == '__main__': sys.exit(main())

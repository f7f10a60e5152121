"""Citations of torch's source stay true: every one with line numbers has the one form

    `torch/distributed/distributed_c10d.py` lines 513-516 (`No backend type associated`)

(a backticked path from the `torch/` package root, `lines A-B` or `line A`, then in parentheses a
backticked name or quoted words), and for each the file exists in the installed torch (C++ headers,
cited as `torch/csrc/...`, are installed under `torch/include/torch/csrc/...`) and the named words
are in the cited lines. `.cpp` files are not installed: they are cited by file and function, without
line numbers. A line number given any other way (`distributed_c10d.py` 2355, reducer.cpp:1529,
"same file, lines 67-68") fails, so that a citation torch's next release would silently move is
found. Read: every notebook under nbs/ (markdown cells, and code cells' comments and docstrings;
never outputs, and never a fenced code block in markdown, which quotes a message), and the
comments and docstrings of cifar_ddp_tut/**/*.py."""
import importlib.util, io, json, re, tokenize
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH = Path(importlib.util.find_spec('torch').submodule_search_locations[0])  # not imported: fast
EXT = r'(?:py|pyi|hpp|h|cuh|cpp|cu|cc)'
FILE = rf'[\w./\-]+\.{EXT}\b'
NUMS = r'(\d+)(?:\s*[-\u2013]\s*(\d+))?'
NAME = r'(?:`([^`]+)`|"([^"]+)"|\u201c([^\u201d]+)\u201d)'
CITE = re.compile(rf'`(torch/{FILE})`\s+lines?\s+{NUMS}\s+\(\s*{NAME}\s*\)')
UNITS = r'\s*(?:[KMGT]i?[Bb]\b|%|x\b|ms\b|s\b|steps?\b|images?\b|bytes?\b|GPUs?\b|ranks?\b)'
LOOSE = [  # a line number given outside the form
    re.compile(rf'`?({FILE})`?[\s,:(]*(?:lines?\s+)?{NUMS}\b(?!{UNITS}|\.\d|\])'),  # file 2355
    re.compile(rf'({FILE}):(\d+)()(?![\d\]])'),  # file.cpp:1529, not a log line's [file.cc:123]
    re.compile(rf'\blines?\s+{NUMS}\b(?=[^.\n]{{0,40}}?\b(?:of|in)\s+`?{FILE})'),  # lines 3-4 of f
]
NEAR_FILE = re.compile(rf'{FILE}|\bsame file\b')
BARE_LINES = re.compile(rf'\blines?\s+{NUMS}\b')  # "same file, lines 67-68" after a cited file


def _flat(text:str) -> str:
    "Whitespace and comment markers folded away, so words that a line break splits still match."
    lines = (re.sub(r'^\s*(?://+|#+|\*+|/\*+)?\s?', '', l) for l in text.splitlines())
    return re.sub(r'\s+', ' ', ' '.join(lines)).strip()


def torch_path(cited:str) -> Path:
    "Where the file `cited` (a path from the torch/ package root) is installed."
    rel = Path(cited).relative_to('torch')
    if rel.parts[0] == 'csrc': return TORCH/'include'/'torch'/rel
    return TORCH/rel


def check_citation(m:re.Match) -> str|None:
    "What is wrong with one citation in the form (None: it holds)."
    path, a, b = m[1], int(m[2]), int(m[3] or m[2])
    name = next(g for g in m.groups()[3:] if g is not None)
    if path.startswith('torch/include/'):
        return f"cite a C++ header by its source path, torch/{path[len('torch/include/torch/'):]}"
    if path.endswith(('.cpp', '.cu', '.cc')):
        return "torch's .cpp/.cu files are not installed: cite file and function, no line numbers"
    f = torch_path(path)
    if not f.is_file(): return f"no such file in the installed torch ({f})"
    lines = f.read_text(errors='replace').splitlines()
    if not 1 <= a <= b <= len(lines): return f"lines {a}-{b} are not in the file ({len(lines)} lines)"
    if _flat(name) not in _flat('\n'.join(lines[a - 1:b])):
        near = [i + 1 for i, l in enumerate(lines) if _flat(name)[:40] in _flat(l)]
        return (f"{name!r} is not in lines {a}-{b}" +
                (f" (a line holding its start: {near[:5]})" if near else " (nor anywhere in the file)"))
    return None


def problems_in(text:str) -> tuple:
    "(citations in the form found, [(citation or excerpt, what is wrong)]) for one piece of text."
    found, bad, rest = 0, [], text
    for m in CITE.finditer(text):
        found += 1
        if (why := check_citation(m)): bad.append((' '.join(m[0].split()), why))
        rest = rest.replace(m[0], ' ' * len(m[0]), 1)  # what is left holds no well-formed citation
    for pat in LOOSE:
        for m in pat.finditer(rest):
            bad.append((' '.join(m[0].split()), "a line number outside the form `torch/...` lines A-B "
                        "(`name`) (a .cpp: file and function, no line numbers)"))
            rest = rest[:m.start()] + ' ' * (m.end() - m.start()) + rest[m.end():]
    for m in BARE_LINES.finditer(rest):
        if NEAR_FILE.search(rest[max(0, m.start() - 120):m.start()]):
            bad.append((' '.join(rest[max(0, m.start() - 40):m.end()].split()),
                        "lines without the backticked torch/ path before them"))
    return found, bad


def _code_text(src:str) -> str:
    "Comments and statement strings (docstrings) of Python source; the whole of it if it won't parse."
    src = '\n'.join('' if l.lstrip().startswith(('%', '!')) else l for l in src.splitlines())
    out, prev = [], tokenize.NEWLINE
    try:
        for t in tokenize.generate_tokens(io.StringIO(src).readline):
            if t.type == tokenize.COMMENT: out.append(t.string)
            elif t.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT,
                                                         tokenize.DEDENT, tokenize.NL):
                out.append(t.string)
            if t.type not in (tokenize.COMMENT,): prev = t.type
    except (tokenize.TokenError, IndentationError, SyntaxError): return src
    return '\n'.join(out)


def sources() -> list:
    "(where, text) for every place that is read."
    out = []
    for nb in sorted((ROOT/'nbs').rglob('*.ipynb')):
        if '.ipynb_checkpoints' in nb.parts: continue
        for i, c in enumerate(json.loads(nb.read_text())['cells']):
            src = ''.join(c['source'])
            if c['cell_type'] == 'markdown': text = re.sub(r'```.*?```', '', src, flags=re.S)
            elif c['cell_type'] == 'code': text = _code_text(src)
            else: continue
            out.append((f"{nb.relative_to(ROOT)} cell {i} ({c['cell_type']}, id {c.get('id')})", text))
    for py in sorted((ROOT/'cifar_ddp_tut').rglob('*.py')):
        if py.name == '_modidx.py': continue
        out.append((str(py.relative_to(ROOT)), _code_text(py.read_text())))
    return out


def report(where_bad:list) -> str:
    return '\n'.join(f"{where}: {cite}\n    -> {why}" for where, cite, why in where_bad)


def test_checker_itself():
    "The checker passes the form, catches a wrong line, and flags line numbers outside the form."
    good = ("`torch/distributed/distributed_c10d.py` line 6324 (`implements barrier as an\n"
            "  all_reduce`)")
    assert problems_in(good) == (1, [])
    n, bad = problems_in(good.replace('6324', '6300'))
    assert n == 1 and 'not in lines 6300-6300' in bad[0][1] and '6324' in bad[0][1]
    for loose in ("(`distributed_c10d.py` 2355)", "see reducer.cpp:1529 for it",
                  "`torch/distributed/distributed_c10d.py` lines 2351-2354",
                  "`torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp` lines 163-176 (`SkipCleanUp = 3`)"
                  " and (same file, lines 67-68)", "lines 3-4 of `run.py`"):
        assert problems_in(loose)[1], loose
    assert problems_in("`torch/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp` line 174 "
                       "(`SkipCleanUp = 3`)")[1][0][1].startswith('cite a C++ header by its source')
    assert 'not installed' in problems_in("`torch/csrc/distributed/c10d/reducer.cpp` line 9 (`x`)"
                                          )[1][0][1]
    for fine in ("(`reducer.cpp`, `Reducer::mark_variable_ready`)", "`src/graph/topo.h`: 20 GB/s",
                 "gloo's `[file.cc:123]` prefix",
                 "```\n[rank0]:[E...] ProcessGroupNCCL.cpp:616] Watchdog\n```"):
        text = re.sub(r'```.*?```', '', fine, flags=re.S)
        assert problems_in(text) == (0, []), fine


def test_citations_hold_and_have_the_form():
    found, bad = 0, []
    for where, text in sources():
        n, b = problems_in(text)
        found += n
        bad += [(where, cite, why) for cite, why in b]
    assert found, "no citation of torch's source found at all: has the form changed?"
    assert not bad, f"{len(bad)} citation(s) of torch's source to fix:\n" + report(bad)

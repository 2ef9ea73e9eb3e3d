"""The library snippets the documentation shows are the ones the tests execute.

Each snippet lives once, as a `README_SNIPPET*` string in the test module that runs
it (tests/test_export.py, tests/test_layers_keras.py, tests/test_tff_learning.py). The
pages are README.md and docs/*.md (the snippets themselves are in docs/library.md).
This test checks that

* every snippet appears, as exactly that text, in a ```python block of some page;
* no page shows a ```python block that looks like a snippet (mostly the same lines)
  but differs from it, so a snippet that changes in one place and not the other
  fails here, wherever the pages put it.
"""

import difflib
import glob
import importlib
import os
import re
import textwrap

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODULES = ("test_export", "test_layers_keras", "test_own_model_virtual", "test_tff_learning")
# A ```python block whose lines are at least this similar to a snippet's (difflib's
# ratio over lines) is taken for a copy of it and must equal it. The untested
# fragments of the pages (bring your own data, a config dataclass) score below 0.2.
_LOOKS_LIKE = 0.5


def _pages():
  """Paths of the pages, relative to the repository: README.md, docs/*.md."""
  docs = sorted(glob.glob(os.path.join(_ROOT, "docs", "*.md")))
  return ["README.md"] + [os.path.relpath(p, _ROOT) for p in docs]


def python_blocks(text):
  """The ```python blocks of a markdown text, without their fences (a fence indented
  inside a list item: its block with that indentation removed)."""
  blocks = re.findall(r"^( *)```python\n(.*?)^\1```", text, flags=re.S | re.M)
  return [textwrap.dedent(block).strip("\n") for _, block in blocks]


def _blocks():
  """(page, block) for every ```python block of every page."""
  out = []
  for page in _pages():
    with open(os.path.join(_ROOT, page), encoding="utf-8") as f:
      out += [(page, block) for block in python_blocks(f.read())]
  return out


def _snippets():
  out = []
  for name in _MODULES:
    module = importlib.import_module(name)
    out += [(f"{name}.{attr}", getattr(module, attr).strip("\n"))
            for attr in sorted(dir(module))
            if attr.startswith("README_SNIPPET")]
  return out


def similarity(a, b):
  """difflib's ratio over the lines of two blocks (1.0: the same lines)."""
  return difflib.SequenceMatcher(None, a.splitlines(), b.splitlines()).ratio()


def mismatches(blocks, snippets, threshold=_LOOKS_LIKE):
  """(page, snippet name, ratio) for every block that looks like a snippet but is not one."""
  texts = {text for _, text in snippets}
  out = []
  for page, block in blocks:
    if block in texts:
      continue
    for name, text in snippets:
      ratio = similarity(block, text)
      if ratio >= threshold:
        out.append((page, name, round(ratio, 2)))
  return out


def test_every_module_has_a_snippet():
  names = {n.split(".")[0] for n, _ in _snippets()}
  assert names == set(_MODULES), names


def test_the_pages_are_found():
  pages = _pages()
  assert "README.md" in pages and "docs/library.md" in pages, pages


@pytest.mark.parametrize("name, snippet", _snippets(), ids=[n for n, _ in _snippets()])
def test_some_page_shows_the_tested_snippet(name, snippet):
  pages = [page for page, block in _blocks() if block == snippet]
  assert pages, f"no page ({', '.join(_pages())}) has the ```python block of {name}"


def test_no_page_shows_a_changed_copy_of_a_snippet():
  bad = mismatches(_blocks(), _snippets())
  assert not bad, f"```python blocks that look like a tested snippet but differ: {bad}"


def test_the_checks_can_fail():
  # The checks above, on edited copies of the real snippets: a changed line is caught
  # as a changed copy, and the edited block no longer counts as showing the snippet.
  snippets = _snippets()
  name, text = snippets[0]
  lines = text.splitlines()
  edited = "\n".join(lines[:-1] + [lines[-1] + "  # edited"])
  assert mismatches([("page.md", edited)], snippets) == [
      ("page.md", name, round(similarity(edited, text), 2))
  ]
  assert edited not in {t for _, t in snippets}
  # An unrelated block is not taken for a copy.
  assert mismatches([("page.md", "import os\nprint(os.getcwd())")], snippets) == []
  # python_blocks reads only ```python fences, whole.
  page = "x\n```python\na = 1\nb = 2\n```\n```\nnot python\n```\n"
  assert python_blocks(page) == ["a = 1\nb = 2"]
  assert python_blocks("1. item\n\n   ```python\n   a = 1\n   ```\n") == ["a = 1"]

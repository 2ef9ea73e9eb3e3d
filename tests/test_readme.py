"""The README's library snippets are the ones the tests execute.

Each snippet lives once, as a `README_SNIPPET*` string in the test module that runs
it (tests/test_export.py, tests/test_layers_keras.py, tests/test_tff_learning.py); this
test checks that README.md shows exactly that text in a ```python block, so a
snippet that changes in one place and not the other fails here.
"""

import importlib
import os
import re

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODULES = ("test_export", "test_layers_keras", "test_tff_learning")


def _readme_blocks():
  text = open(os.path.join(_ROOT, "README.md"), encoding="utf-8").read()
  return [b.strip("\n") for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)]


def _snippets():
  out = []
  for name in _MODULES:
    module = importlib.import_module(name)
    out += [(f"{name}.{attr}", getattr(module, attr))
            for attr in sorted(dir(module))
            if attr.startswith("README_SNIPPET")]
  return out


def test_every_module_has_a_snippet():
  names = {n.split(".")[0] for n, _ in _snippets()}
  assert names == set(_MODULES), names


@pytest.mark.parametrize("name, snippet", _snippets(), ids=[n for n, _ in _snippets()])
def test_readme_shows_the_tested_snippet(name, snippet):
  assert snippet.strip("\n") in _readme_blocks(), f"README.md lacks the ```python block of {name}"

"""Modules imported on first use (TensorFlow's and TFP's `LazyLoader` pattern).

The algorithm modules declare their settings and register themselves without
TensorFlow, so that launchers check every flag before TensorFlow starts; they
bind `tf`, `tff` and the library's TensorFlow modules with `load`, and the real
import happens at the first attribute access (when an algorithm is built).
"""

from __future__ import annotations

import importlib
import types


class LazyModule(types.ModuleType):
  """Stands for the module `name` until an attribute is read."""

  def __init__(self, name: str):
    super().__init__(name)
    self.__dict__["_lazy_module"] = None

  def _load(self) -> types.ModuleType:
    module = self.__dict__["_lazy_module"]
    if module is None:
      module = importlib.import_module(self.__name__)
      self.__dict__["_lazy_module"] = module
    return module

  def __getattr__(self, item):
    return getattr(self._load(), item)

  def __dir__(self):
    return dir(self._load())

  def __repr__(self):
    state = "loaded" if self.__dict__["_lazy_module"] is not None else "not loaded"
    return f"<lazy module {self.__name__!r} ({state})>"


def load(name: str) -> LazyModule:
  """A stand-in for `importlib.import_module(name)` that imports on first use."""
  return LazyModule(name)

"""No TFF computation runs in TFF's stock context.

`import tensorflow_federated` makes TFF's stock local C++ context the default
(in the importing thread). Its first computation starts a `worker_binary` that
writes to our stdout/stderr and outlives this process (parent PID 1), holding a
`| tee` pipe open. So wherever tfbfl is imported, the stock context is replaced
by `NoRuntimeContext`, whose every call raises `NoRuntimeError` with one line
naming `tfbfl.runtime.set_local_runtime()`; the runtimes of `tfbfl.runtime`
(whose workers end with this process) install their own contexts over it, and
reinstate it when closed.

`install()` (run by `import tfbfl`) does it at once if TFF is already imported,
else from an import hook right after TFF's `__init__` has run: tfbfl itself
imports TensorFlow only when it needs it, and this must not import it either.

Not covered: TFF imported in another thread than tfbfl (TFF's default context is
per thread), and a user who installs TFF's stock context explicitly
(`tff.backends.native.set_sync_local_cpp_execution_context()`).
"""

from __future__ import annotations

import importlib.abc
import sys
import types

MESSAGE = ("no TFF runtime installed: call tfbfl.runtime.set_local_runtime() (or "
           "tfbfl.runtime.set_runtime(...)) before invoking a TFF computation; tfbfl "
           "disabled TFF's stock context, whose worker_binary would outlive this process")

_TFF = "tensorflow_federated"
# The executor stack of TFF's stock context (TFF 0.87, `executor_factory.py`).
_STOCK_STACK_FN = "local_cpp_executor_factory.<locals>.stack_fn"


class NoRuntimeError(RuntimeError):
  """A TFF computation was invoked before a tfbfl runtime was installed."""


class NoRuntimeContext:
  """TFF's default context while no tfbfl runtime is installed: refuses every
  call (a `tff.framework.SyncContext`, registered when TFF is imported)."""

  def invoke(self, comp, arg):
    del comp, arg
    raise NoRuntimeError(MESSAGE)


def is_stock_context(context) -> bool:
  """Whether `context` is TFF's stock local C++ context (the one that starts an
  unowned `worker_binary`)."""
  factory = getattr(context, "executor_factory", None)
  stack_fn = getattr(factory, "_executor_stack_fn", None)
  return getattr(stack_fn, "__qualname__", None) == _STOCK_STACK_FN


def replace_stock_context(tff: types.ModuleType) -> bool:
  """Replaces TFF's default context by a `NoRuntimeContext` if it is the stock
  one (in the calling thread); True if it did."""
  tff.framework.SyncContext.register(NoRuntimeContext)
  if not is_stock_context(tff.framework.get_context_stack().current):
    return False
  tff.framework.set_default_context(NoRuntimeContext())
  return True


class _GuardedLoader(importlib.abc.Loader):
  """TFF's own loader, followed by `replace_stock_context`."""

  def __init__(self, loader, hook):
    self._loader, self._hook = loader, hook

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    module.__loader__ = module.__spec__.loader = self._loader  # TFF sees its own loader.
    self._loader.exec_module(module)
    replace_stock_context(module)
    self._hook.remove()


class _TffImportHook(importlib.abc.MetaPathFinder):
  """Finds `tensorflow_federated` with the other finders and wraps its loader."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname != _TFF:
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(fullname, path, target)
      if spec is not None:
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
          spec.loader = _GuardedLoader(spec.loader, self)
        return spec
    return None

  def remove(self) -> None:
    if self in sys.meta_path:
      sys.meta_path.remove(self)


def install() -> None:
  """Keeps TFF's stock context from ever running a computation (see above)."""
  tff = sys.modules.get(_TFF)
  if tff is not None and hasattr(tff, "framework"):
    replace_stock_context(tff)
  elif not any(isinstance(f, _TffImportHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _TffImportHook())

"""The process-wide runtime: installed once, reused, shut down at exit.

    runtime.set_local_runtime(max_concurrent_computation_calls=2)   # or
    runtime.set_runtime("remote", workers=["host1:8000", "host2:8000"])
    ...  # invoke TFF computations
    runtime.shutdown()   # optional: atexit does it too

A runtime installs its context as TFF's default in the calling thread; closing
it reinstates the context it replaced (see `guard` for the one tfbfl puts in
place of TFF's stock context).
"""

from __future__ import annotations

import atexit
import inspect
import os
from typing import Optional, Sequence

from tfbfl import _lazy
from tfbfl.runtime.local import LocalRuntime
from tfbfl.runtime.remote import RemoteRuntime

tff = _lazy.load("tensorflow_federated")

_RUNTIME = None  # LocalRuntime or RemoteRuntime


def _effective_options(cls, kwargs):
  """`kwargs` with `cls`'s defaults filled in (None concurrency = CPU count), so
  that `set_local_runtime()` and `set_local_runtime(<the defaults>)` compare equal."""
  bound = inspect.signature(cls.__init__).bind(None, **kwargs)
  bound.apply_defaults()
  options = {k: v for k, v in bound.arguments.items() if k != "self"}
  if options.get("max_concurrent_computation_calls", 0) is None:
    options["max_concurrent_computation_calls"] = os.cpu_count() or 1
  return options


def _install(cls, kwargs):
  """Starts `cls(**kwargs)` as the process-wide runtime, or reuses the running
  one if it was started with the same class and (effective) options."""
  global _RUNTIME
  kwargs = _effective_options(cls, kwargs)
  if _RUNTIME is not None and _RUNTIME.running:
    if type(_RUNTIME) is cls and _RUNTIME.requested == kwargs:  # pylint: disable=unidiomatic-typecheck
      # Another runtime may have replaced the default context meanwhile.
      tff.framework.set_default_context(_RUNTIME.context)
      return _RUNTIME
    _RUNTIME.close()
  _RUNTIME = cls(**kwargs).start()
  _RUNTIME.requested = dict(kwargs)
  return _RUNTIME


def set_local_runtime(**kwargs) -> LocalRuntime:
  """Starts (once) the process-wide local runtime and makes it TFF's default.

  Calling again with the same options returns the running runtime; with other
  options (or while a remote runtime is installed) the old one is stopped and a
  new one started.
  """
  return _install(LocalRuntime, dict(kwargs))


def set_runtime(executor: str = "local", workers: Optional[Sequence[str]] = None, **kwargs):
  """Installs the process-wide runtime chosen by `--executor`.

  Args:
    executor: "local" (an owned worker on this machine, `LocalRuntime`) or
      "remote" (`RemoteRuntime` over `workers`).
    workers: "host:port" addresses (a list, or one comma-separated string);
      required for "remote", refused for "local".
    **kwargs: options of the chosen runtime class.
  """
  if executor == "local":
    if workers:
      raise ValueError("--workers is only used with --executor=remote.")
    return set_local_runtime(**kwargs)
  if executor == "remote":
    if isinstance(workers, str):
      workers = [w for w in workers.split(",") if w.strip()]
    if not workers:
      raise ValueError("--executor=remote needs --workers=host:port[,host:port...].")
    return _install(RemoteRuntime, dict(workers=tuple(workers), **kwargs))
  raise ValueError(f"--executor must be 'local' or 'remote', got {executor!r}.")


def mergeable_context_active() -> bool:
  """True when TFF's current default context is a mergeable (multi-worker) one,
  e.g. a `RemoteRuntime`'s. Under it, CLIENTS-placed results come back in
  subround completion order, and in a computation that also aggregates, the
  client work producing CLIENTS-placed results runs twice (before and after the
  merge); drivers use this to pick a two-phase round (see `tfbfl.round_loop`)."""
  return isinstance(tff.framework.get_context_stack().current,
                    tff.framework.MergeableCompExecutionContext)


def current_runtime():
  """The process-wide runtime (`LocalRuntime`, `RemoteRuntime`) or None."""
  return _RUNTIME


def shutdown() -> None:
  """Stops the process-wide runtime (registered with atexit): a local runtime's
  worker is terminated, a remote runtime's connections closed."""
  global _RUNTIME
  if _RUNTIME is not None:
    _RUNTIME.close()
    _RUNTIME = None


atexit.register(shutdown)

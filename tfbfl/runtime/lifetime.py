"""Ties a child process's life to this one's.

A child started with `preexec_fn=die_with_parent` is SIGKILLed by the kernel when
the thread that forked it exits (`PR_SET_PDEATHSIG`, Linux), so it cannot outlive
us even on `kill -9`; it also runs in a process group of its own, so a terminal's
Ctrl-C reaches only us, and our own hooks then end it with `terminate`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
from typing import Optional

_PR_SET_PDEATHSIG = 1

_LIBC = []  # [libc] once loaded by `libc()`, [None] where there is none.


def libc():
  """libc, loaded in the parent: a `preexec_fn` runs between fork and exec of a
  multi-threaded process and must not dlopen (or import) anything itself."""
  if not _LIBC:
    try:
      _LIBC.append(ctypes.CDLL("libc.so.6", use_errno=True))
    except OSError:  # Not Linux.
      _LIBC.append(None)
  return _LIBC[0]


def loaded_libc():
  """The libc `libc()` loaded, or None; safe in a `preexec_fn`."""
  return _LIBC[0] if _LIBC else None


def die_with_parent() -> None:
  """`preexec_fn`: ask the kernel to SIGKILL the child when its parent dies, and
  leave the parent's process group, so a Ctrl-C at the terminal reaches only the
  parent: the worker keeps serving while the interrupted run reports and saves,
  then the parent's own hooks end it (a worker killed by the same Ctrl-C made
  TFF's executor thread log gRPC retries before the interruption was handled).

  Call `libc()` in the parent first; without it (or off Linux) only the
  process group changes, and the atexit/finalize hooks still apply."""
  os.setpgid(0, 0)
  lib = loaded_libc()
  if lib is not None:
    lib.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def terminate(process: Optional[subprocess.Popen],
              timeout_s: float = 5.0,
              sock_dir: Optional[str] = None) -> None:
  """SIGTERM, then SIGKILL after `timeout_s`; always reaps the process and
  removes its socket directory."""
  try:
    if process is None or process.poll() is not None:
      return
    try:
      process.terminate()
      process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
    except ProcessLookupError:
      pass
  finally:
    if sock_dir:
      shutil.rmtree(sock_dir, ignore_errors=True)


def log_tail(path: str, num_bytes: int = 2000) -> str:
  """The last `num_bytes` of a log file, decoded; "<no log>" if unreadable."""
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - num_bytes))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return "<no log>"

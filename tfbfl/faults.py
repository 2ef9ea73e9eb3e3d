"""What ends a run from outside its code, said in one line: `RunFault`.

The faults a user meets while a run trains are not bugs of the run: a TFF worker that
dies, hangs or cannot be reached (`runtime.WorkerError`, `runtime.WorkerExited`, TFF's
own gRPC errors), a file that cannot be written or read (a full disk, a directory that
is read-only or not this user's, one that disappeared: `files.FileWriteError`, an
`OSError`, TensorFlow's file errors), the output directory removed or moved mid-run
(`run_directory.RunDirGone`). `describe(error)` names such a fault (the worker, the
file, what it needs) and gives its exit status; `during_run` adds where the run was,
what is kept and how to continue: a `RunFault`, which the round loop attaches to the
error it raises as it is (`attach`; `found(error)` reads it back), e.g.

    TFF worker 127.0.0.1:47312 is unavailable (...) during CreateValue: Socket closed,
    in round 3 of 4 (evaluating); the checkpoint has round 2, and what was written
    before is intact; once the worker is back, continue with: python -m
    launchers.train --flagfile=runs/v/flags.txt --resume

`tfbfl.flags.run` prints `found(error)` as the launcher's one `FATAL` line, no
traceback (faults outside a run, e.g. connecting to the workers, get `outside_run`'s
line), and exits
with `status`: `WORKER_FAILED_STATUS` (75, the runner of the campaign runs such a cell
once more) or `FILE_FAILED_STATUS` (74). Every file a run writes is written whole or
not at all (`tfbfl.files`), so what was written before a fault stays intact.

This module imports neither TensorFlow nor TFF.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import grpc

from tfbfl import files
from tfbfl import run_directory
from tfbfl.runtime import remote
from tfbfl.runtime import worker_process

# sysexits.h: EX_TEMPFAIL (the same command may pass once the worker is back; the
# round loop's WORKER_EXITED_STATUS) and EX_IOERR (a file could not be written or read).
WORKER_FAILED_STATUS = 75
FILE_FAILED_STATUS = 74

WORKER, FILE, GONE = "worker", "file", "gone"


class RunFault(RuntimeError):
  """A fault outside the run's code (see the module docstring) ended it.

  `str()` is one line: what happened, which worker / file / flag, what is kept and
  what to do next. `status` is the launcher's exit status, `kind` one of "worker",
  "file", "gone".
  """

  def __init__(self, message: str, status: int, kind: str):
    super().__init__(" ".join(str(message).split()))
    self.status, self.kind = status, kind


_ATTRIBUTE = "tfbfl_fault"


def attach(error: BaseException, fault: "RunFault") -> None:
  """Gives `error` (raised on as it is: callers catch its own type) its one line."""
  setattr(error, _ATTRIBUTE, fault)


def found(error: BaseException) -> Optional["RunFault"]:
  """The `RunFault` of `error`: the one the round loop attached (`attach`), else
  `outside_run`'s; None when `error` is no fault of the module docstring."""
  fault = getattr(error, _ATTRIBUTE, None)
  return fault if isinstance(fault, RunFault) else outside_run(error)


def _chain(error: BaseException):
  """`error` and the errors it was raised from or while handling (at most 12)."""
  seen = []
  while error is not None and len(seen) < 12 and all(error is not e for e in seen):
    seen.append(error)
    error = error.__cause__ or error.__context__
  return seen


def describe(error: BaseException) -> Optional[Tuple[str, int, str]]:
  """(one line saying what failed, exit status, kind) of a fault of the module
  docstring found in `error` or the errors it was raised from; None for any other
  error (a bug, a bad flag: those keep their own message or traceback)."""
  chain = _chain(error)
  for e in chain:
    fault = e if isinstance(e, RunFault) else getattr(e, _ATTRIBUTE, None)
    if isinstance(fault, RunFault):
      return str(fault), fault.status, fault.kind
  for e in chain:
    if isinstance(e, remote.WorkerError):
      return str(e), WORKER_FAILED_STATUS, WORKER
    if isinstance(e, worker_process.WorkerExited):
      return str(e), WORKER_FAILED_STATUS, WORKER
  for e in chain:  # TFF's own stub and contexts: a gRPC call that found no worker
    if isinstance(e, grpc.RpcError) and isinstance(e, grpc.Call):
      try:
        code, details = e.code(), e.details()
      except Exception:  # pylint: disable=broad-except  (a call without its status)
        continue
      if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return (f"a TFF worker failed a call with {code.name}: {details}", WORKER_FAILED_STATUS,
                WORKER)
  for e in chain:
    if isinstance(e, run_directory.RunDirGone):
      return str(e), FILE_FAILED_STATUS, GONE
    if isinstance(e, files.FileWriteError):
      return str(e), FILE_FAILED_STATUS, FILE
  for e in chain:
    if isinstance(e, OSError) and e.errno in files.WRITE_ERRNOS and e.filename:
      return (f"cannot use {os.path.abspath(os.fsdecode(e.filename))}: "
              f"{e.strerror or e}", FILE_FAILED_STATUS, FILE)
    if not isinstance(e, OSError):
      failed = files.write_error(e, "")
      if failed is not None:  # a TensorFlow file error (its text names the file)
        return f"{failed.detail}", FILE_FAILED_STATUS, FILE
  return None


def _fix(error: BaseException, kind: str) -> str:
  """What the user does before continuing."""
  if kind == WORKER:
    return "once the worker is back"
  failed = next((e for e in _chain(error) if isinstance(e, files.FileWriteError)), None)
  what = failed.kind if failed is not None else None
  return {
      "no space": "free space there",
      "not allowed": "make it writable by this user",
      "read-only": "make it writable again",
  }.get(what, "once that is fixed")


def during_run(error: BaseException, *, where: str, output_dir: Optional[str],
               saved_round: Optional[int], command: str) -> Optional[RunFault]:
  """The `RunFault` of `error` raised `where` ("in round 3 of 4 (training)") in a run
  writing to `output_dir`, whose checkpoint holds `saved_round` (None: none yet),
  continued by `command --resume`; None if `error` is no fault of the module docstring."""
  described = describe(error)
  if described is None:
    return None
  what, status, kind = described
  if isinstance(error, RunFault):
    return error
  if isinstance(getattr(error, _ATTRIBUTE, None), RunFault):
    return getattr(error, _ATTRIBUTE)
  what = what.rstrip(". ")
  if kind == GONE:
    return RunFault(
        f"{what}, {where}; stopped, as its outputs are not there any more: if it was moved, "
        f"move it back and continue with: {command} --resume; else start the run again "
        "(the same command, or --resume, which starts it from round 0).", status, kind)
  fix = _fix(error, kind)
  if not output_dir:
    return RunFault(f"{what}, {where}; nothing was saved (no --output_dir): run it again "
                    f"{fix}.", status, kind)
  if saved_round:
    kept = f"the checkpoint has round {saved_round}, and what was written before is intact"
    then = f"continue with: {command} --resume"
  else:
    kept = "no checkpoint yet (see --checkpoint_every)"
    then = f"start it again from round 0 with: {command} --resume"
  return RunFault(f"{what}, {where}; {kept}; {fix}, {then}", status, kind)


def outside_run(error: BaseException) -> Optional[RunFault]:
  """The `RunFault` of `error` raised before or after a run (connecting to the
  workers, reading the data), or None; its advice is to run the same command again."""
  described = describe(error)
  if described is None:
    return None
  what, status, kind = described
  if isinstance(error, RunFault):
    return error
  if isinstance(getattr(error, _ATTRIBUTE, None), RunFault):
    return getattr(error, _ATTRIBUTE)
  what = what.rstrip(". ")
  fix = "once the worker is back" if kind == WORKER else "once that is fixed"
  return RunFault(f"{what}; run the same command again {fix}.", status, kind)

"""One run per output directory: a lock, ownership of old outputs, the data fingerprint.

`tfbfl.round_loop.ExperimentRunner` takes its `output_dir` with these helpers
before it reads or writes anything there:

* `prepare(path)` creates the directory, or raises one `ValueError` naming
  `--output_dir` when it is a regular file or cannot be created or written.
* `RunLock(path).acquire()` takes an exclusive, non-blocking `fcntl.flock` on
  `<path>/.tfbfl.lock` and holds it until `release()` (or until the process
  exits: the kernel drops the lock with the file descriptor, so a killed run
  never leaves a stale lock). A second run into a directory in use, from any
  process, fails at once with `RunDirBusyError` (a `ValueError`). The lock file
  itself stays (removing it would race with a waiting run).
* `existing_outputs(path)` lists the outputs of a previous run there
  (`metrics.csv`, `client_metrics.csv`, `summary.json`, `curves.png`,
  `flags.txt`, `tb/`, `export/`, the checkpoint, client states and their
  snapshots; a `flags.txt` alone, left by a run stopped before its first
  round, is no run); `clear_outputs(path)` removes exactly those
  (`--overwrite`) and nothing else.
* `data_fingerprint(data)` is a sha256 over every client's id and train/test
  arrays (dtype, shape, bytes), stored in checkpoints so that `--resume`
  refuses data that changed under the same path (and in `summary.json`).
* `flagfile_text(flags, names)` writes a run's flags in absl `--flagfile`
  format (`flags.txt`), `source_commit()` names the git commit of the tfbfl
  source tree and `source_modified()` whether tracked files differ from it
  (`summary.json`).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
import weakref
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from tfbfl import state_files

LOCK_FILE = ".tfbfl.lock"
# Files and directories a run writes into its output directory (besides the
# lock and temporaries); `clear_outputs` removes exactly these.
FLAGS_FILE = "flags.txt"
OUTPUT_FILES = ("metrics.csv", "client_metrics.csv", "summary.json", "curves.png", "checkpoint.npz",
                "checkpoint.pkl", FLAGS_FILE)
OUTPUT_DIRS = ("tb", "client_states", "export")
# Written at the start of a run: alone, they are no run to protect (a run stopped
# before its first round), though `clear_outputs` removes them.
_NOT_A_RUN_ALONE = (FLAGS_FILE,)
_SNAPSHOT = re.compile(r"^client_states_r\d+$")


class RunDirBusyError(ValueError):
  """Another run holds the output directory's lock."""


class RunDirGone(OSError):
  """The output directory of a run was removed, moved or replaced while the run
  held it (`RunLock.check`): its lock file is no longer at its path."""

  def __init__(self, directory: str):
    super().__init__(errno.ENOENT, "removed or moved while a run held it", directory)
    self.directory = directory

  def __str__(self) -> str:
    return f"--output_dir={self.directory} was removed or moved while the run wrote into it"


def prepare(path: str, flag: str = "--output_dir") -> str:
  """Creates `path` (and parents) if needed; returns its absolute path.

  Raises:
    ValueError: one line naming `flag`, when `path` is a regular file, lies
      under one, or cannot be created or written (permissions, /proc, ...).
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{flag}={path} is a regular file, not a directory.")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ValueError(f"{flag}={path} cannot be created ({e.strerror or e}).") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise ValueError(f"{flag}={path} is not writable.")
  return path


# Locks this process holds: realpath -> (RunLock, weakref of its owner or None).
_HELD: Dict[str, tuple] = {}


class RunLock:
  """An exclusive `fcntl.flock` on `<directory>/.tfbfl.lock` (see module doc)."""

  def __init__(self, directory: str):
    self.directory = os.path.realpath(directory)
    self.path = os.path.join(self.directory, LOCK_FILE)
    self._fd: Optional[int] = None

  @property
  def held(self) -> bool:
    return self._fd is not None

  def acquire(self, owner=None) -> "RunLock":
    """Takes the lock without waiting.

    Within one process, a lock held by another `owner` that has finished its
    run (`owner.state is not None`, as `ExperimentRunner` sets at the end of
    `run`) or was garbage collected is handed over; one held by a live run is
    refused like a lock of another process.

    Raises:
      RunDirBusyError: the directory is in use by another run.
    """
    if self._fd is not None:
      return self
    previous = _HELD.get(self.directory)
    if previous is not None and previous[1] is not None:  # held for a run of this process
      lock, holder = previous[0], previous[1]()
      if holder is None or getattr(holder, "state", None) is not None or holder is owner:
        lock.release()
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise RunDirBusyError(
            f"--output_dir={self.directory} is in use by another run (lock {self.path} is "
            "held); wait for it to finish or choose another --output_dir.") from None
      raise ValueError(f"--output_dir={self.directory}: cannot lock {self.path} "
                       f"({e.strerror or e}).") from None
    self._fd = fd
    try:
      os.ftruncate(fd, 0)
      os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
      pass
    _HELD[self.directory] = (self, weakref.ref(owner) if owner is not None else None)
    if owner is not None:  # the lock goes with its owner
      weakref.finalize(owner, self.release)
    return self

  def check(self) -> None:
    """Raises `RunDirGone` when the lock file this lock holds is no longer at its
    path: the directory was removed, moved or replaced since it was taken (a run
    writing on would recreate it and fill it with a part of its outputs). A lock not
    held, or a path that cannot be looked at (permissions), passes."""
    if self._fd is None:
      return
    try:
      held, there = os.fstat(self._fd), os.stat(self.path)
    except (FileNotFoundError, NotADirectoryError):
      raise RunDirGone(self.directory) from None
    except OSError:
      return
    if (held.st_dev, held.st_ino) != (there.st_dev, there.st_ino):
      raise RunDirGone(self.directory)

  def release(self) -> None:
    """Drops the lock (idempotent)."""
    fd, self._fd = self._fd, None
    if fd is not None:
      if _HELD.get(self.directory, (None,))[0] is self:
        del _HELD[self.directory]
      try:
        fcntl.flock(fd, fcntl.LOCK_UN)
      finally:
        os.close(fd)

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()

  def __del__(self):
    try:
      self.release()
    except Exception:  # pylint: disable=broad-except  (interpreter shutdown)
      pass


def check_free(directory: str) -> None:
  """Raises `RunDirBusyError` if another run holds `directory`'s lock now
  (a quick check before expensive start-up; the run takes the lock itself)."""
  directory = os.path.realpath(directory)
  if not os.path.exists(os.path.join(directory, LOCK_FILE)):
    return
  previous = _HELD.get(directory)
  if previous is not None:
    holder = previous[1]() if previous[1] is not None else None
    if previous[1] is None or (holder is not None and getattr(holder, "state", None) is None):
      raise RunDirBusyError(f"--output_dir={directory} is in use by another run (of this "
                            "process); wait for it to finish or choose another --output_dir.")
    return
  probe = RunLock(directory)
  probe.acquire()
  probe.release()


def existing_outputs(directory: str) -> List[str]:
  """Names of a previous run's outputs in `directory` (sorted; [] if none).
  An empty `client_states/` does not count."""
  try:
    names = set(os.listdir(directory))
  except (FileNotFoundError, NotADirectoryError):
    return []
  found = [n for n in OUTPUT_FILES if n in names]
  for n in OUTPUT_DIRS:
    full = os.path.join(directory, n)
    if n in names and (not os.path.isdir(full) or os.listdir(full)):
      found.append(n + "/")
  found += [n + "/" for n in names if _SNAPSHOT.match(n)]
  if all(n in _NOT_A_RUN_ALONE for n in found):
    return []
  return sorted(found)


def refuse_or_clear(directory: str, *, resume: bool, overwrite: bool) -> List[str]:
  """Enforces ownership of `directory` by a new run; returns what was removed.

  * `overwrite`: removes a previous run's outputs (`clear_outputs`).
  * `resume`: keeps them (the checkpoint is checked when it is loaded).
  * neither: raises `ValueError` if the directory holds a previous run.
  """
  if overwrite:
    return clear_outputs(directory)
  if not resume:
    found = existing_outputs(directory)
    if found:
      shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
      raise ValueError(
          f"--output_dir={os.path.abspath(directory)} already holds another run ({shown}); "
          "pass --resume to continue it or --overwrite to replace it.")
  return []


def clear_outputs(directory: str) -> List[str]:
  """Removes a previous run's outputs from `directory` (only the names listed
  in this module; other files stay). Returns the names removed."""
  removed = []
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return removed
  for name in sorted(names):
    full = os.path.join(directory, name)
    if name in OUTPUT_FILES or name in OUTPUT_DIRS or _SNAPSHOT.match(name):
      if os.path.isdir(full) and not os.path.islink(full):
        shutil.rmtree(full)
      else:
        os.unlink(full)
      removed.append(name)
  return removed


def data_fingerprint(data) -> str:
  """sha256 hex digest of a `FederatedData`'s contents: every client id (in
  order) and its train and test arrays (dtype, shape and bytes). Computed once
  per data object and cached on it."""
  cached = getattr(data, "_tfbfl_fingerprint", None)
  if cached is not None:
    return cached

  def arrays():
    for cid in data.client_ids:
      yield np.frombuffer(str(cid).encode("utf-8"), dtype=np.uint8)
      for split in (data.train, data.test):
        for a in split[cid]:
          yield np.asarray(a)

  digest = state_files.sha256_arrays(arrays())
  try:
    data._tfbfl_fingerprint = digest  # pylint: disable=protected-access
  except AttributeError:
    pass
  return digest


# ------------------------------------------------------------------ flags.txt
# Flags a replay chooses itself (`--resume` or `--overwrite` after `--flagfile`).
NOT_IN_FLAGFILE = ("resume", "overwrite")


def flag_text(value: Any) -> Optional[str]:
  """`value` as absl parses it back from `--name=<text>`: bools `true`/`false`,
  lists comma-joined, floats in `repr` (exact round trip); None: no text."""
  if value is None:
    return None
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    return repr(value) if math.isfinite(value) else str(value)
  if isinstance(value, (list, tuple)):
    return ",".join(flag_text(v) or "" for v in value)
  return str(value)


# flags.txt: its first line, and its last, which holds the sha256 of the lines above
# (`FlagsFile`; `check_flagfile`). A flags.txt of an older tfbfl starts with
# `UNCHECKED_HEADER` and has no checksum.
FLAGS_HEADER = "# The flags of this run (its last line checks them). Continue it, or run it again:"
UNCHECKED_HEADER = "# The flags of this run. Continue it, or run it again:"
CHECKSUM_LINE = "# sha256 of the lines above: "


def checked_flags_text(body: str) -> str:
  """`body` (`FLAGS_HEADER`'s line first) with its checksum line appended."""
  return body + CHECKSUM_LINE + hashlib.sha256(body.encode("utf-8")).hexdigest() + "\n"


def check_flagfile(path: str) -> None:
  """Refuses a run's `flags.txt` (a `--flagfile` named so) that is truncated or was
  changed since the run wrote it, before absl reads it: absl would take what is left
  of a truncated file, and a flipped bit in a value, as the run's flags. A flags
  file of another name, or of an older tfbfl (no checksum line), is not checked.

  Raises:
    ValueError: one line naming `--flagfile=path` and what is wrong.
  """
  if os.path.basename(path) != FLAGS_FILE:
    return
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError:
    return  # absl names a missing or unreadable flag file itself
  where = f"--flagfile={path}"
  advice = ("pass the run's flags on the command line instead (with --resume they are "
            "checked against its checkpoint)")
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError:
    raise ValueError(f"{where} is corrupted (not UTF-8 text); {advice}.") from None
  if not text or FLAGS_HEADER.startswith(text.rstrip("\n")) or UNCHECKED_HEADER.startswith(
      text.rstrip("\n")):
    raise ValueError(f"{where} is truncated ({len(raw)} bytes, no flags); {advice}.")
  if not text.startswith(FLAGS_HEADER):
    return
  lines = text.splitlines(keepends=True)
  last = lines[-1]
  if not last.startswith(CHECKSUM_LINE) or not last.endswith("\n"):
    raise ValueError(f"{where} is truncated (its last line, '{CHECKSUM_LINE}...', is "
                     f"missing); {advice}.")
  body = "".join(lines[:-1])
  want = last[len(CHECKSUM_LINE):].strip()
  got = hashlib.sha256(body.encode("utf-8")).hexdigest()
  if got != want:
    raise ValueError(
        f"{where} changed since the run wrote it (its lines hash to sha256 {got[:12]}..., its "
        f"last line says {want[:12]}...): corrupted, or edited by hand. Pass a changed flag "
        "on the command line after --flagfile instead of editing the file, or delete the "
        "file's last line to use it as it is.")


def flags_file_differences(output_dir: str, flags: Mapping[str, Any],
                           ignore: Iterable[str] = ()) -> List[str]:
  """The flags whose value in `<output_dir>/flags.txt` differs from `flags` (names
  sorted; [] without a flags.txt). Only flags the file names are compared, `ignore`
  and `NOT_IN_FLAGFILE` left out; values are compared as the file writes them
  (`flag_text`). A damaged file raises `check_flagfile`'s `ValueError`."""
  path = os.path.join(output_dir, FLAGS_FILE)
  if not os.path.exists(path):
    return []
  check_flagfile(path)
  with open(path, encoding="utf-8") as f:
    saved = dict(line[2:].rstrip("\n").split("=", 1) for line in f
                 if line.startswith("--") and "=" in line)
  skip = set(ignore) | set(NOT_IN_FLAGFILE) | {"verbose"}
  return sorted(k for k, text in saved.items()
                if k not in skip and k in flags and flag_text(flags[k]) != text)


def flagfile_text(flags: Mapping[str, Any], names: Iterable[str]) -> str:
  """`flags` (name -> value) as an absl `--flagfile`: one `--name=value` line per
  flag in `names` (`--algorithm` first, then sorted), None and `NOT_IN_FLAGFILE`
  left out; a value with a line break cannot be written and is left out with a
  comment saying so."""
  names = set(names) - set(NOT_IN_FLAGFILE)
  keys = sorted((k for k in flags if k in names), key=lambda k: (k != "algorithm", k))
  lines = []
  for key in keys:
    text = flag_text(flags[key])
    if text is None:
      continue
    if "\n" in text or "\r" in text:
      lines.append(f"# --{key} left out: its value has a line break")
      continue
    lines.append(f"--{key}={text}")
  return "\n".join(lines) + "\n"


# -------------------------------------------------------------- source commit
def _git_in_checkout(args: Sequence[str], timeout_s: float) -> Optional[str]:
  """stdout of `git <args>` run at the top of the git work tree that tfbfl is
  imported from, or None when the package does not lie at the top of one (an
  installed wheel), git is missing or slow (`timeout_s`), or anything fails."""
  import tfbfl  # pylint: disable=g-import-not-at-top

  package_dir = os.path.dirname(os.path.abspath(tfbfl.__file__))
  env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
  env["GIT_OPTIONAL_LOCKS"] = "0"  # reading must not take the index lock

  def git(*words, cwd):
    out = subprocess.run(["git", *words],
                         cwd=cwd,
                         env=env,
                         stdin=subprocess.DEVNULL,
                         capture_output=True,
                         text=True,
                         timeout=timeout_s,
                         check=False)
    return out.stdout if out.returncode == 0 else None

  try:
    top = git("rev-parse", "--show-toplevel", cwd=package_dir)
    if top is None or os.path.realpath(top.strip()) != os.path.realpath(
        os.path.dirname(package_dir)):
      return None  # no checkout, or tfbfl inside some other repository (a venv in a project)
    return git(*args, cwd=top.strip())
  except (OSError, subprocess.SubprocessError, ValueError):
    return None


@functools.lru_cache(maxsize=1)
def source_commit(timeout_s: float = 2.0) -> Optional[str]:
  """`git rev-parse HEAD` of the checkout tfbfl is imported from, or None (see
  `_git_in_checkout`). Cached."""
  out = _git_in_checkout(["rev-parse", "HEAD"], timeout_s)
  head = out.strip() if out else ""
  return head if re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", head) else None


# The tracked files whose content is the code a run executes: the package, the
# launchers and benchmarks, the pins and the build files. Results, reports and docs
# are not code: a campaign that writes its records and README leaves the code as it was.
SOURCE_PATHS = ("tfbfl", "launchers", "benchmarks", "requirements", "setup.cfg", "pyproject.toml",
                "Makefile")


def source_diff(timeout_s: float = 2.0) -> Optional[str]:
  """`git diff HEAD` of `SOURCE_PATHS` in that checkout ('' when the code is the
  commit's; before the first commit, the staged and unstaged changes of those paths),
  or None where git cannot tell (see `_git_in_checkout`). Not cached."""
  if source_commit.__wrapped__(timeout_s) is None:
    out = _git_in_checkout(["status", "--porcelain", "--untracked-files=no", "--", *SOURCE_PATHS],
                           timeout_s)
  else:
    out = _git_in_checkout(["diff", "--no-ext-diff", "--binary", "HEAD", "--", *SOURCE_PATHS],
                           timeout_s)
  return out


def source_provenance(timeout_s: float = 2.0) -> Dict[str, Any]:
  """What names the code that runs now: `git_commit`, `git_modified` (a file of
  `SOURCE_PATHS` differs from that commit) and, where it does, `git_diff_sha256`, the
  sha256 of that difference (`source_diff`). Not cached: a long-lived runner asks
  again for every record."""
  diff = source_diff(timeout_s)
  out: Dict[str, Any] = dict(git_commit=source_commit.__wrapped__(timeout_s),
                             git_modified=None if diff is None else bool(diff.strip()))
  if diff and diff.strip():
    out["git_diff_sha256"] = hashlib.sha256(diff.encode()).hexdigest()
  return out


_CODE_IDENTITY = ("git_commit", "git_modified", "git_diff_sha256")


def code_identity(entry: Mapping[str, Any]) -> Dict[str, Any]:
  """The `source_provenance` fields of a code-history `entry` (without its round)."""
  return {k: entry[k] for k in _CODE_IDENTITY if k in entry}


def extend_code_history(history: Optional[Sequence[Mapping[str, Any]]], from_round: int,
                        now: Mapping[str, Any]) -> List[Dict[str, Any]]:
  """A run's code history after a session that starts at round `from_round` under the
  code `now` (`source_provenance()`): one entry per session, the stretch of rounds it
  ran, `{"from_round": r, "git_commit": ..., "git_modified": ...[, "git_diff_sha256":
  ...]}`; the entries after the first are the run's resumes (`resumes`).

  A resumed run whose checkpoint predates the history (`history` None at `from_round`
  > 0) starts with an entry of unknown code for the rounds before. Histories written
  before one entry a session kept one a change of code: there, sessions under the code
  of the entry before them are not listed.
  """
  out = [dict(e) for e in history or ()]
  if not out and from_round > 0:
    out.append(dict(from_round=0, git_commit=None, git_modified=None))
  out.append(dict(from_round=int(from_round), **code_identity(now)))
  return out


def _identity(entry: Mapping[str, Any]) -> tuple:
  return tuple(entry.get(k) for k in _CODE_IDENTITY)


def resumes(history: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
  """The entries of a code `history` whose session continued a checkpoint (its
  `from_round` > 0), in order."""
  return [e for e in history if e["from_round"] > 0]


def distinct_codes(history: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
  """The different codes (`code_identity`) of code-history entries, in first-seen order
  (one for runs that all ran one code, however many entries or runs they list)."""
  seen: Dict[tuple, Dict[str, Any]] = {}
  for e in history:
    seen.setdefault(_identity(e), code_identity(e))
  return list(seen.values())


@functools.lru_cache(maxsize=1)
def source_modified(timeout_s: float = 2.0) -> Optional[bool]:
  """Whether a file of `SOURCE_PATHS` in that checkout differs from `source_commit()`
  (results, docs and untracked files do not count), so that a summary does not name
  a commit its code is not; None where git cannot tell (see `_git_in_checkout`).
  Cached."""
  return source_provenance(timeout_s)["git_modified"]

"""Files written whole or not at all: a temporary file in the destination's
directory, flushed, renamed into place, the directory synced.

Every output of a run (metrics, summaries, checkpoints, exports, records) goes
through here or through `tfbfl.state_files`, which uses the same rule.

A write that fails (a full disk, a directory that is read-only, not writable by
this user, or gone) raises `FileWriteError`: an `OSError` whose message is one line
naming the file and the cause (for a full disk, how much the file needs and how much
is free), with the destination left as it was. `write_error(error, path)` makes one
from an `OSError` or from TensorFlow's errors (TensorBoard events, SavedModels),
which carry the cause only in their text.
"""

from __future__ import annotations

import errno as errno_lib
import os
import re
import tempfile
from typing import Optional


def umask() -> int:
  """The process's umask (read without changing it for longer than the call)."""
  mask = os.umask(0)
  os.umask(mask)
  return mask


def fsync_dir(path: str) -> None:
  """fsync a directory (makes a rename in it durable); best effort."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


# ------------------------------------------------------------------ failures
# The errors of a write that the user can fix (space, rights, a mount, a directory).
NO_SPACE = (errno_lib.ENOSPC, errno_lib.EDQUOT, errno_lib.EFBIG)
NOT_ALLOWED = (errno_lib.EACCES, errno_lib.EPERM)
READ_ONLY = (errno_lib.EROFS,)
GONE = (errno_lib.ENOENT, errno_lib.ENOTDIR)
WRITE_ERRNOS = NO_SPACE + NOT_ALLOWED + READ_ONLY + GONE + (errno_lib.EIO, errno_lib.EISDIR)

# How TensorFlow's C++ file system words them (its errors carry no errno).
_TF_CAUSES = {
    "No space left on device": errno_lib.ENOSPC,
    "Disk quota exceeded": errno_lib.EDQUOT,
    "Permission denied": errno_lib.EACCES,
    "Read-only file system": errno_lib.EROFS,
    "No such file or directory": errno_lib.ENOENT,
    "Input/output error": errno_lib.EIO,
}


def size_text(n: Optional[float]) -> str:
  """`n` bytes as `123 B`, `4.5 kB`, `1.2 MB`, `3.0 GB`."""
  if n is None:
    return "?"
  n = float(n)
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= scale:
      return f"{n / scale:.1f} {unit}"
  return f"{int(n)} B"


def free_bytes(path: str) -> Optional[int]:
  """Bytes this user may still write on the file system of `path` (its nearest
  existing parent), or None where that cannot be read."""
  path = os.path.abspath(path)
  while path and not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  try:
    st = os.statvfs(path)
  except OSError:
    return None
  return st.f_bavail * st.f_frsize


class FileWriteError(OSError):
  """Writing `path` failed; the file is as it was before (atomic writes).

  `str()` is one line: the cause (no space, with what the file needs and what is
  free; permission denied; a read-only file system; the directory gone), naming
  `path`. Attributes: `errno`, `path`, `needed` (bytes, or None), `free` (bytes
  free on its file system when it failed, or None), `detail` (the system's words).
  """

  def __init__(self, path: str, error_number: Optional[int], detail: str = "",
               needed: Optional[int] = None):
    self.path = os.path.abspath(os.fspath(path))
    self.needed = needed
    self.free = free_bytes(self.path) if error_number in NO_SPACE else None
    self.detail = " ".join(str(detail).split())
    super().__init__(error_number, self.detail or os.strerror(error_number or errno_lib.EIO),
                     self.path)

  @property
  def kind(self) -> str:
    """'no space', 'not allowed', 'read-only', 'gone' or 'other'."""
    for kind, numbers in (("no space", NO_SPACE), ("not allowed", NOT_ALLOWED),
                          ("read-only", READ_ONLY), ("gone", GONE)):
      if self.errno in numbers:
        return kind
    return "other"

  def __str__(self) -> str:
    path, directory = self.path, os.path.dirname(self.path)
    kind = self.kind
    if kind == "no space":
      needs = f"it needs {size_text(self.needed)}" if self.needed else "it needs more"
      free = (f"{size_text(self.free)} free on the file system of {directory}"
              if self.free is not None else f"the file system of {directory} is full")
      if self.errno == errno_lib.EDQUOT:
        return f"disk quota exceeded writing {path} ({needs}; {free})"
      return f"no space left on device writing {path} ({needs}; {free})"
    if kind == "not allowed":
      return (f"permission denied writing {path} ({directory} is not writable by uid "
              f"{os.geteuid()})")
    if kind == "read-only":
      return f"cannot write {path}: {directory} is on a read-only file system"
    if kind == "gone":
      return (f"cannot write {path}: its directory {directory} no longer exists (removed "
              "or moved while in use)")
    return f"cannot write {path}: {self.detail or os.strerror(self.errno or errno_lib.EIO)}"


def write_error(error: BaseException, path: str,
                needed: Optional[int] = None) -> Optional[FileWriteError]:
  """The `FileWriteError` of a failed write of `path`, from `error`: an `OSError`
  of the errnos users meet (`WRITE_ERRNOS`), or a TensorFlow error whose text holds
  one of their causes (TensorBoard events, SavedModels); None for any other error.
  An error that already is a `FileWriteError` is returned as it is."""
  if isinstance(error, FileWriteError):
    return error
  if isinstance(error, OSError):
    if error.errno not in WRITE_ERRNOS:
      return None
    return FileWriteError(path, error.errno, error.strerror or str(error), needed)
  if type(error).__module__.startswith("tensorflow"):
    message = str(getattr(error, "message", error))
    for cause, number in _TF_CAUSES.items():
      if cause in message:
        found = re.search(r"(/[^\s;:'\"]+)[;:]\s*" + re.escape(cause), message)
        where = found.group(1) if found else ""
        detail = f"{where}: {cause}" if where and where != os.path.abspath(path) else cause
        return FileWriteError(path, number, detail, needed)
  return None


# -------------------------------------------------------------------- writes
def atomic_write_bytes(path: str, data: bytes, *, prefix: str = ".tmp-") -> None:
  """Writes `data` to `path` via a temporary file `prefix*` in the same directory
  and a rename; the file gets the usual mode (0o666 minus the umask).

  Raises:
    FileWriteError: the write failed (`path` is unchanged).
  """
  directory = os.path.dirname(os.path.abspath(path))
  tmp = None
  try:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600
    os.replace(tmp, path)
    tmp = None
    fsync_dir(directory)
  except BaseException as e:
    remove_quietly(tmp)
    failed = write_error(e, path, len(data)) if isinstance(e, OSError) else None
    if failed is not None and failed is not e:
      raise failed from e
    raise


def remove_quietly(path: Optional[str]) -> None:
  """Removes the file `path` if it is there (a failed write's temporary file); an
  error doing so is ignored (the write's own error is the one to report)."""
  if path is None:
    return
  try:
    if os.path.lexists(path):
      os.unlink(path)
  except OSError:
    pass


def atomic_write_text(path: str, text: str, *, prefix: str = ".tmp-") -> None:
  atomic_write_bytes(path, text.encode("utf-8"), prefix=prefix)

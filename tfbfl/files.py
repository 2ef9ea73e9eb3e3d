"""Files written whole or not at all: a temporary file in the destination's
directory, flushed, renamed into place, the directory synced.

Every output of a run (metrics, summaries, checkpoints, exports, records) goes
through here or through `tfbfl.state_files`, which uses the same rule.
"""

from __future__ import annotations

import os
import tempfile


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


def atomic_write_bytes(path: str, data: bytes, *, prefix: str = ".tmp-") -> None:
  """Writes `data` to `path` via a temporary file `prefix*` in the same directory
  and a rename; the file gets the usual mode (0o666 minus the umask)."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600
    os.replace(tmp, path)
    fsync_dir(directory)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def atomic_write_text(path: str, text: str, *, prefix: str = ".tmp-") -> None:
  atomic_write_bytes(path, text.encode("utf-8"), prefix=prefix)

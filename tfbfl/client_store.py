"""Where the round driver keeps per-client states (`--client_store=memory|disk`).

Stateful algorithms (VIRTUAL: each client's factor, posterior copy and private
network) keep one state per client *in the controller*; workers receive the
selected clients' states with each round and keep nothing. Both stores have the
same interface, a mutable mapping keyed by integer client index:

    store[i] = state; state = store[i]; i in store; store.get(i, default)
    len(store); store.keys(); store.values(); store.items(); store.clear()

* `MemoryClientStore`: a `dict` (code that takes `state["clients"]` as a dict keeps
  working); memory grows linearly with the number of clients that have a state
  (VIRTUAL, MLP 64-100-100-10: about 0.75 MB per client).
* `DiskClientStore`: a `collections.abc.MutableMapping` over one state file per
  client in a directory (keys in increasing order), `client_<index>.npz` in the
  `tfbfl.state_files` format (numpy arrays + a JSON manifest with checksums: reading
  one never executes code, and a damaged file is one `ValueError` naming it),
  written atomically (temporary file in the same directory, fsync, rename), so a
  crash never leaves a half-written state; a state is in memory only while it is
  used. Files of the old pickle format (`client_<index>.pkl`) are never read.

Checkpoints: a `DiskClientStore` pickles as its directory only. To checkpoint it
consistently with the rest of the driver's state, `snapshot(dest)` hard-links
every current file into a new directory (no copy: writes replace files by
rename, so the snapshot keeps the old contents) and `restore(src)` does the
reverse. `snapshot_name(round)` names the directory a checkpoint refers to.
"""

from __future__ import annotations

import collections.abc
import os
import re
import shutil
import tempfile
from typing import Iterator, Optional

from tfbfl import state_files

_FILE = re.compile(r"^client_(\d+)\.npz$")
_LEGACY_FILE = re.compile(r"^client_(\d+)\.pkl$")


class MemoryClientStore(dict):
  """Client states in a dict (the default)."""

  kind = "memory"


class DiskClientStore(collections.abc.MutableMapping):
  """Client states as `<directory>/client_<index>.npz`, one file per client.

  Args:
    directory: created if missing; states already there are used (a resumed run).
    fsync: flush each file to disk before the rename (durable across power loss;
      set False to trade that for speed on slow disks).
  """

  kind = "disk"

  def __init__(self, directory: str, *, fsync: bool = True):
    self.directory = os.path.abspath(directory)
    self.fsync = fsync
    os.makedirs(self.directory, exist_ok=True)

  def path(self, index: int) -> str:
    index = int(index)
    if index < 0:
      raise KeyError(f"client index must be >= 0, got {index}.")
    return os.path.join(self.directory, f"client_{index}.npz")

  def __getitem__(self, index: int):
    """The state of client `index`, checked by `tfbfl.state_files.load`.

    Raises:
      KeyError: no state for `index`.
      ValueError: naming the file, when it is damaged or not a state file.
    """
    try:
      state, _ = state_files.load(self.path(index))
    except FileNotFoundError:
      raise KeyError(int(index)) from None
    return state

  def __setitem__(self, index: int, state) -> None:
    """Writes the state atomically; a state that `tfbfl.state_files` cannot store
    (TypeError) leaves the old file untouched."""
    state_files.save(self.path(index), state, fsync=self.fsync)

  def __delitem__(self, index: int) -> None:
    try:
      os.unlink(self.path(index))
    except FileNotFoundError:
      raise KeyError(int(index)) from None

  def __contains__(self, index) -> bool:
    try:
      return os.path.exists(self.path(index))
    except (KeyError, TypeError, ValueError):
      return False

  def _indices(self):
    return sorted(int(m.group(1)) for m in map(_FILE.match, os.listdir(self.directory)) if m)

  def __iter__(self) -> Iterator[int]:
    return iter(self._indices())

  def __len__(self) -> int:
    return len(self._indices())

  def clear(self) -> None:
    """Removes every client file, including pickle states of an older tfbfl (a
    fresh run reusing the directory)."""
    for i in self._indices():
      os.unlink(self.path(i))
    for name in os.listdir(self.directory):
      if _LEGACY_FILE.match(name):
        os.unlink(os.path.join(self.directory, name))

  def nbytes(self) -> int:
    """Bytes on disk of all client files."""
    return sum(os.path.getsize(self.path(i)) for i in self._indices())

  # ----------------------------------------------------------- checkpoints
  def snapshot(self, dest: str) -> str:
    """Hard-links every client file into the new directory `dest` (atomically:
    built under a temporary name, then renamed). Falls back to copying where
    hard links are not supported. Returns `dest`."""
    dest = os.path.abspath(dest)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(dest):
      raise FileExistsError(f"snapshot directory {dest} already exists.")
    tmp = tempfile.mkdtemp(prefix=".tmp-snapshot-", dir=parent)
    try:
      for i in self._indices():
        src, dst = self.path(i), os.path.join(tmp, os.path.basename(self.path(i)))
        try:
          os.link(src, dst)
        except OSError:
          shutil.copy2(src, dst)
      state_files.fsync_dir(tmp)
      os.rename(tmp, dest)
      state_files.fsync_dir(parent)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
    return dest

  def restore(self, src: str) -> None:
    """Makes the store hold exactly the states of snapshot `src` (files written
    after the snapshot are removed).

    Raises:
      FileNotFoundError: `src` does not exist.
      ValueError: `src` holds pickle states of an older tfbfl (never loaded), or a
        state file that is not intact (empty, truncated, not a state file: its
        manifest is checked here, its arrays' checksums when it is read), naming it.
    """
    if not os.path.isdir(src):
      raise FileNotFoundError(f"client-state snapshot {src} does not exist.")
    legacy = sorted(n for n in os.listdir(src) if _LEGACY_FILE.match(n))
    if legacy:
      raise ValueError(
          f"{os.path.join(src, legacy[0])}: a pickle client state of an older tfbfl; "
          "pickles are never loaded (they can execute code). Start afresh with --overwrite.")
    wanted = {int(m.group(1)) for m in map(_FILE.match, os.listdir(src)) if m}
    for i in sorted(wanted):  # damaged files are named now, not when their client is drawn
      try:
        state_files.read_meta(os.path.join(src, f"client_{i}.npz"))
      except ValueError as e:
        raise ValueError(f"{e} It is a client state of the checkpoint's snapshot: the run "
                         "cannot continue from it; start it again with --overwrite.") from None
    for i in self._indices():
      if i not in wanted:
        os.unlink(self.path(i))
    for i in sorted(wanted):
      source, target = os.path.join(src, f"client_{i}.npz"), self.path(i)
      if os.path.exists(target) and os.path.samefile(source, target):
        continue  # unchanged since the snapshot (and rename() of two links is a no-op)
      tmp = os.path.join(self.directory, f".tmp-restore-{i}")
      if os.path.lexists(tmp):
        os.unlink(tmp)
      try:
        os.link(source, tmp)
      except OSError:
        shutil.copy2(source, tmp)
      os.replace(tmp, target)
    state_files.fsync_dir(self.directory)

  def __getstate__(self):
    return dict(directory=self.directory, fsync=self.fsync)

  def __setstate__(self, state):
    self.__init__(state["directory"], fsync=state["fsync"])

  def __repr__(self) -> str:
    return f"DiskClientStore({self.directory!r})"


def snapshot_name(round_num: int) -> str:
  """Directory name (under the output directory) of the client-state snapshot
  that the checkpoint of round `round_num` refers to."""
  return f"client_states_r{int(round_num):06d}"


def make_client_store(kind: str = "memory", directory: Optional[str] = None):
  """`MemoryClientStore()` for "memory"; `DiskClientStore(directory)` for "disk"."""
  if kind == "memory":
    return MemoryClientStore()
  if kind == "disk":
    if not directory:
      raise ValueError("--client_store=disk needs a directory (default: "
                       "<output_dir>/client_states; set --output_dir).")
    return DiskClientStore(directory)
  raise ValueError(f"--client_store must be 'memory' or 'disk', got {kind!r}.")


def save_snapshot(store: DiskClientStore, output_dir: str, round_num: int) -> str:
  """Snapshots `store` as `<output_dir>/<snapshot_name(round_num)>` (replacing a
  stale one of that name) and returns the name, to be saved in the checkpoint."""
  name = snapshot_name(round_num)
  path = os.path.join(output_dir, name)
  if os.path.exists(path):
    shutil.rmtree(path)
  store.snapshot(path)
  return name


def prune_snapshots(output_dir: str, keep: str) -> None:
  """Removes every client-state snapshot in `output_dir` except `keep` (call
  after the checkpoint that refers to `keep` has been written)."""
  for name in os.listdir(output_dir):
    if name != keep and re.match(r"^client_states_r\d+$", name):
      shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)

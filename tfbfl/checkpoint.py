"""A run's checkpoint: `<output_dir>/checkpoint.npz`, written and read here only.

The file is a `tfbfl.state_files` archive (arrays + a JSON manifest with per-array
checksums; never a pickle) of the runner's state

    {"round": r, "server_state": ..., "rows": [...], "client_rows": [...],
     "wall_time_s": ..., and either "clients": {index: client state}
                                 or "client_snapshot": "client_states_r<r>"}

with the manifest's `meta`

    {"kind": "checkpoint", "round": r, "flags": the comparable flags,
     "data_fingerprint": tfbfl.run_directory.data_fingerprint(data),
     "client_store": "memory" | "disk"}.

A disk client store (`tfbfl.client_store.DiskClientStore`) is saved as a
hard-linked snapshot directory that the checkpoint names; older snapshots are
pruned only after the checkpoint that replaces them is on disk.

The runner (`--resume`) and `tfbfl.restore` (export from a checkpoint) both read
through `load`, which checks, in this order: no pickle of an older tfbfl, the file
(format, version, checksums, structure), the kind and round, the flags (when
given), the data fingerprint, the snapshot's name and directory. Each failure is
one `ValueError` / `FileNotFoundError` line naming the file.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional

import numpy as np

from tfbfl import client_store as client_store_lib
from tfbfl import state_files

CHECKPOINT = "checkpoint.npz"
LEGACY_CHECKPOINT = "checkpoint.pkl"  # pickles of older versions: never loaded

# Flags a resumed run may change: how long, where and how it runs, not what it computes.
RESUMABLE_FLAGS = frozenset({
    "rounds", "resume", "overwrite", "checkpoint_every", "output_dir", "eval_every", "executor",
    "workers", "call_timeout_s", "verbose", "eval_chunk", "clients_per_group", "export",
    "export_samples"
})


@dataclasses.dataclass
class RunState:
  """The round loop's state: what a checkpoint holds.

  `clients` is a client-state store (`tfbfl.client_store`: index -> state; a
  client never selected has none). `rows` are `metrics.csv`'s rows and
  `client_rows` `client_metrics.csv`'s; `wall_time_s` counts every session of
  the run; the byte totals are kept for algorithms that count bytes
  (`base.ReportsRoundBytes`); `calibration` is the last evaluation's reliability
  bins and per-client calibration. Read access by key (`state["round"]`) is kept
  for code written when the state was a dict.
  """
  round: int
  server_state: Any
  clients: Any
  rows: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  client_rows: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  wall_time_s: float = 0.0
  bytes_up_total: Optional[int] = None
  bytes_down_total: Optional[int] = None
  # The last evaluation's reliability bins and per-client calibration (None before one).
  calibration: Optional[Dict[str, Any]] = None
  # The code that ran the rounds, one entry a session (`run_directory.extend_code_history`).
  code_history: Optional[List[Dict[str, Any]]] = None

  _OPTIONAL = ("bytes_up_total", "bytes_down_total", "calibration", "code_history")

  def tree(self) -> Dict[str, Any]:
    """The checkpoint's tree, without the clients (the optional fields only once set)."""
    out = dict(round=self.round, server_state=self.server_state, rows=self.rows,
               client_rows=self.client_rows, wall_time_s=self.wall_time_s)
    out.update({k: getattr(self, k) for k in self._OPTIONAL if getattr(self, k) is not None})
    return out

  @classmethod
  def from_tree(cls, tree: Mapping[str, Any], clients) -> "RunState":
    known = {f.name for f in dataclasses.fields(cls)} - {"clients"}
    return cls(clients=clients, **{k: v for k, v in tree.items() if k in known})

  def __getitem__(self, key: str):
    if key not in {f.name for f in dataclasses.fields(self)}:
      raise KeyError(key)
    return getattr(self, key)

  def get(self, key: str, default=None):
    value = getattr(self, key, None) if key in {f.name for f in dataclasses.fields(self)} else None
    return default if value is None else value


class Checkpoint(NamedTuple):
  """A checked checkpoint: `state` without its clients; `clients` (a dict index ->
  state) or `snapshot_dir` (a disk store's snapshot directory) holds them."""
  path: str
  round: int
  meta: Dict[str, Any]
  state: Dict[str, Any]
  clients: Optional[Dict[int, Any]]
  snapshot_dir: Optional[str]


def path_in(output_dir: str) -> str:
  return os.path.join(output_dir, CHECKPOINT)


def exists(output_dir: str) -> bool:
  """Whether `output_dir` holds a checkpoint (or the pickle of an older tfbfl, which
  `read_meta` and `load` refuse): a run without one never checkpointed."""
  return (os.path.exists(path_in(output_dir)) or
          os.path.exists(os.path.join(output_dir, LEGACY_CHECKPOINT)))


def plain_flag(v):
  """A flag value as plain Python (numpy scalars -> numbers, tuples -> lists),
  as stored in a checkpoint's JSON manifest and compared on `--resume`."""
  if isinstance(v, np.generic):
    return v.item()
  if isinstance(v, (list, tuple)):
    return [plain_flag(x) for x in v]
  if isinstance(v, dict):
    return {str(k): plain_flag(x) for k, x in v.items()}
  if v is None or isinstance(v, (bool, int, float, str)):
    return v
  return str(v)


def comparable_flags(flags: Mapping[str, Any]) -> Dict[str, Any]:
  """The flags a checkpoint must share with a run that resumes it."""
  return {k: plain_flag(v) for k, v in flags.items() if k not in RESUMABLE_FLAGS}


def save(output_dir: str, state: RunState, *, flags: Mapping[str, Any],
         data_fingerprint: str) -> int:
  """Writes `state` as the checkpoint of `output_dir`, atomically; returns its round."""
  tree = state.tree()
  clients = state.clients
  snapshot = None
  if isinstance(clients, client_store_lib.DiskClientStore):
    snapshot = client_store_lib.save_snapshot(clients, output_dir, state.round)
    tree["client_snapshot"] = snapshot
  else:
    tree["clients"] = dict(clients)
  meta = dict(kind="checkpoint",
              round=int(state.round),
              flags=comparable_flags(flags),
              data_fingerprint=data_fingerprint,
              client_store=getattr(clients, "kind", "memory"))
  state_files.save(path_in(output_dir), tree, meta=meta)
  if snapshot is not None:
    client_store_lib.prune_snapshots(output_dir, keep=snapshot)
  return int(state.round)


def _refuse_legacy(output_dir: str, resume: bool) -> None:
  legacy = os.path.join(output_dir, LEGACY_CHECKPOINT)
  if not os.path.exists(path_in(output_dir)) and os.path.exists(legacy):
    message = (f"{legacy} is a pickle checkpoint of an older tfbfl, which is never loaded (a "
               "pickle can execute code)")
    raise ValueError(_resume_message(message + "; start afresh with --overwrite.", resume) if
                     resume else message + ".")


def _resume_message(message: str, resume: bool) -> str:
  return f"--resume: {message}" if resume else message


def _model_text(flags: Mapping[str, Any]) -> str:
  """`--model=<name> (variables <fingerprint>)`, or the built-in `--architecture`."""
  if flags.get("model") is None:
    return f"the built-in --architecture={flags.get('architecture')}"
  return f"--model={flags['model']} (variables {flags.get('model_fingerprint')})"


def _check_meta(path: str, meta: Mapping[str, Any], flags: Optional[Mapping[str, Any]],
                data_fingerprint: Optional[str], resume: bool) -> None:
  if meta.get("kind") != "checkpoint" or not isinstance(meta.get("round"), int):
    raise ValueError(_resume_message(f"{path} is a tfbfl state file but not a checkpoint.", resume))
  if flags is not None:
    saved, want = meta.get("flags", {}), comparable_flags(flags)
    if saved != want:
      diff = sorted(k for k in set(saved) | set(want) if saved.get(k) != want.get(k))
      if set(diff) & {"model", "model_fingerprint"}:
        raise ValueError(_resume_message(
            f"checkpoint {path} was written with another model: {_model_text(saved)} then, "
            f"{_model_text(want)} now" +
            (f" (other flags too: {[k for k in diff if not k.startswith('model')]})"
             if any(not k.startswith("model") for k in diff) else "") +
            "; resume with the model it was built with.", resume))
      raise ValueError(
          _resume_message(f"checkpoint {path} was written with other flags: {diff}.", resume))
  if data_fingerprint is not None and meta.get("data_fingerprint") != data_fingerprint:
    message = (f"the data changed since checkpoint {path} was written (data fingerprint "
               f"{str(meta.get('data_fingerprint'))[:12]}..., now {data_fingerprint[:12]}...)")
    raise ValueError(
        _resume_message(message + "; pass --overwrite to start afresh on the new data.", resume)
        if resume else message + ".")


def read_meta(output_dir: str, *, flags: Optional[Mapping[str, Any]] = None,
              data_fingerprint: Optional[str] = None, resume: bool = False) -> Dict[str, Any]:
  """The checked manifest of `output_dir`'s checkpoint (cheap: no arrays are read).

  Args:
    flags: the flags of the run that will use it (None: not compared).
    data_fingerprint: its data's fingerprint (None: not compared).
    resume: word the errors for `--resume` (prefix and advice).
  """
  path = path_in(output_dir)
  _refuse_legacy(output_dir, resume)
  try:
    meta = state_files.read_meta(path)
  except FileNotFoundError:
    raise FileNotFoundError(_resume_message(f"no checkpoint at {path}", resume) + (
        "." if resume else " (run with --checkpoint_every=N to write one).")) from None
  except ValueError as e:
    raise ValueError(_resume_message(str(e), resume)) from None
  _check_meta(path, meta, flags, data_fingerprint, resume)
  return meta


def load(output_dir: str, *, flags: Optional[Mapping[str, Any]] = None,
         data_fingerprint: Optional[str] = None, resume: bool = False) -> Checkpoint:
  """The checkpoint of `output_dir`, every check passed (see the module docstring;
  arguments as `read_meta`). Never unpickles."""
  path = path_in(output_dir)
  _refuse_legacy(output_dir, resume)
  if not os.path.exists(path):
    read_meta(output_dir, resume=resume)  # raises its FileNotFoundError
  try:
    state, meta = state_files.load(path)
  except ValueError as e:
    raise ValueError(_resume_message(str(e), resume)) from None
  _check_meta(path, meta, flags, data_fingerprint, resume)
  not_a_checkpoint = ValueError(
      _resume_message(f"{path} is a tfbfl state file but not a checkpoint.", resume))
  if (not isinstance(state, dict) or state.get("round") != meta["round"] or
      "server_state" not in state):
    raise not_a_checkpoint
  clients = state.pop("clients", None)
  snapshot = state.pop("client_snapshot", None)
  snapshot_dir = None
  if snapshot is not None:
    if not isinstance(snapshot, str) or snapshot != client_store_lib.snapshot_name(state["round"]):
      raise ValueError(
          _resume_message(f"{path} names a bad client-state snapshot {snapshot!r:.60}.", resume))
    snapshot_dir = os.path.join(output_dir, snapshot)
  elif clients is None:
    raise ValueError(_resume_message(f"{path} holds no client states.", resume))
  return Checkpoint(path, int(state["round"]), meta, state,
                    None if clients is None else dict(clients), snapshot_dir)

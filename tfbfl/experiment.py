"""The round driver shared by every federated algorithm and launcher.

It owns what is the same for all methods: client sampling, the client-state store,
evaluation with the S and MT metrics, outputs and checkpoints. An algorithm plugs
in by satisfying `tfbfl.algorithms.base.FederatedAlgorithm` (a `typing.Protocol`):

    initial_server_state() -> server_state
    initial_client_state(client_index) -> client_state
    next(server_state, client_states, seeds, data) -> (server_state, client_states, metrics)
    evaluate(server_state, client_states, seeds, test_data) -> per-client sums
        {server_loss, server_correct, mt_loss, mt_correct, num_examples}

Per-client results (client states, evaluation dicts) may carry a `client_index`;
the driver then re-keys them, as multi-worker contexts (`tfbfl.runtime.RemoteRuntime`)
return them in completion order. Under such a context, results without it are
refused. An algorithm may define `next_two_phase` (same signature as `next`); the
driver uses it instead of `next` under a multi-worker context (see
`tfbfl.algorithms.virtual`).

Client states live in the controller, in a `tfbfl.client_store` store chosen by
`RunConfig.client_store` ("memory", or "disk": one file per client under
`client_store_dir`, default `<output_dir>/client_states`; checkpoints then refer to
a hard-linked snapshot `<output_dir>/client_states_r<round>`).

An algorithm may also define `round_bytes(num_selected, round_metrics) -> (up, down)`
(see `tfbfl.communication`); the driver then adds `bytes_up`, `bytes_down` and their
running totals to every row and to `summary.json`.

Round `r` (1-based) samples `clients_per_round` clients without replacement with
`np.random.default_rng([seed, r])` and gives client `k` the stateless seed
`[seed, r * 1_000_003 + k]`, so a run, and a run resumed from a checkpoint, is
fully determined by `seed`. Metrics are weighted by client test-set size:

* S  = the server model on every client's test data;
* MT = each client's own model on its own test data (its last deployed model; a
  client never selected yet is evaluated with its initial model).

Outputs in `output_dir` (see `ExperimentRunner.run`):

* `metrics.csv`: one row per round. Every row has the training metrics
  (`train_loss`, `train_accuracy`, the algorithm's own, `bytes_*`); rounds that
  are evaluated (every `eval_every`-th and the last) also have S and MT
  (`server_accuracy`, `server_loss`, `mt_accuracy`, `mt_loss`, `*_ece`), left
  empty in the others.
* `client_metrics.csv`: per-client MT accuracy per evaluated round.
* `summary.json` (strict JSON): best/final S and MT, the flags, `tfbfl_version`,
  `git_commit` (of the tfbfl checkout, or null), `git_modified` (tracked files
  differ from that commit, or null), `data_fingerprint`.
* `flags.txt`: the run's flags as an absl flag file, so that
  `python -m launchers.train --flagfile=<output_dir>/flags.txt [--resume]`
  replays (or continues) it.
* `tb/`: TensorBoard events, one per round and tag, grouped (`accuracy/server`,
  `accuracy/mt`, `loss/server`, `loss/mt`, `ece/...`, `train/...`,
  `communication/...`, `diagnostics/...`, `time/wall_s`), and HParams (the flags
  and, as metrics, the final S/MT accuracy and loss); a resumed run first drops
  the events of rounds after its checkpoint, so no (tag, round) is written twice.
* `curves.png`: S/MT accuracy, S/MT loss, train loss and (with `bytes_up`) the
  cumulative bytes per round.
* `checkpoint.npz` (a `tfbfl.state_io` file: arrays + a JSON manifest, never a
  pickle): every `checkpoint_every` rounds and always after the last round, so
  nothing trained is lost.
* `export/`: the final server and client models (`tfbfl.export.export_run`,
  unless `RunConfig.export` is off), written last.

Every file is written to a temporary name and renamed, so an interrupted run
never leaves a half-written file, and a resumed run reproduces the uninterrupted
one. Ctrl-C raises `RunInterrupted` (a `KeyboardInterrupt`) whose message says
where the run stopped and how to continue it; the launchers print it as one line.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import shlex
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from tfbfl import client_store as client_store_lib
from tfbfl import options
from tfbfl import run_dir as run_dir_lib
from tfbfl import state_io
from tfbfl import metrics as metrics_lib
from tfbfl.algorithms.base import FederatedAlgorithm
from tfbfl.algorithms.base import client_seed  # noqa: F401  (the driver's seed rule)
from tfbfl.data import FederatedData

CHECKPOINT = "checkpoint.npz"  # tfbfl.state_io format; see _save_checkpoint
FLAGS_FILE = run_dir_lib.FLAGS_FILE  # the run's flags, an absl --flagfile
EXPORT_DIR = "export"  # tfbfl.export.export_run's output
TB_DIR = "tb"
LEGACY_CHECKPOINT = "checkpoint.pkl"  # pickles of older versions: never loaded
BASE_COLUMNS = ("round", "server_accuracy", "server_loss", "mt_accuracy", "mt_loss", "train_loss",
                "train_accuracy", "wall_time_s")


def default_clients_per_round(num_clients: int) -> int:
  """`--clients_per_round`'s default: every client, at most 10."""
  return min(10, int(num_clients))


@dataclasses.dataclass
class RunConfig:
  """How to drive the rounds (the algorithm-independent flags)."""
  rounds: int = options.integer(20, "Communication rounds.", low=1)
  clients_per_round: Optional[int] = options.integer(
      None,
      "Clients per round C (fixed; default min(10, number of clients)).",
      low=1,
      high=10**7,
      none_ok=True)
  eval_every: int = options.integer(1, "Evaluate S and MT every this many rounds.", low=1)
  seed: int = options.integer(0,
                              "Fixes client sampling, initialisation and data splits.",
                              high=options.MAX_SEED)
  output_dir: Optional[str] = options.text(None, "Where metrics.csv, summary.json, curves.png go.")
  checkpoint_every: int = options.integer(
      0, "Also checkpoint every N rounds (0: only at the end; with --output_dir the final "
      "state is always saved).")
  resume: bool = options.boolean(
      False, "Continue from the checkpoint in --output_dir (same "
      "flags and data, checked).")
  verbose: bool = True
  client_store: str = options.choice(
      "memory", ("memory", "disk"), "Where the controller keeps client states: memory, or "
      "one file per client under <output_dir>/client_states.")
  client_store_dir: Optional[str] = None  # disk: default <output_dir>/client_states
  overwrite: bool = options.boolean(
      False, "Replace the outputs of a previous run in --output_dir (without it, or "
      "--resume, such a directory is refused).")
  data_fingerprint: Optional[str] = None  # tfbfl.run_dir.data_fingerprint; None: computed
  # Streamed evaluation (see `ExperimentRunner.evaluate`): at most this many clients
  # per evaluation call; 0: one call with every client (`algorithm.evaluate`).
  eval_chunk: int = options.integer(
      64, "Evaluate at most this many clients per call, MT cached per client where exact "
      "(0: every client in one call).")
  eval_cache: bool = True  # cache MT per client (streamed path, where exact)
  export: bool = options.boolean(True, "Write export/ SavedModels at the end of the run.")
  export_samples: int = options.integer(
      0, "MC samples of the exported server predictive (0: posterior mean).")

  def resolved(self, num_clients: int) -> "RunConfig":
    """This config with `clients_per_round` set (unset: min(10, num_clients))."""
    if self.clients_per_round is not None:
      return self
    return dataclasses.replace(self, clients_per_round=default_clients_per_round(num_clients))

  def validate(self, num_clients: int) -> None:
    if self.rounds < 1:
      raise ValueError(f"--rounds must be >= 1, got {self.rounds}.")
    if not 1 <= self.clients_per_round <= num_clients:
      raise ValueError(f"--clients_per_round must be in [1, num_clients={num_clients}], "
                       f"got {self.clients_per_round}.")
    if self.eval_every < 1:
      raise ValueError(f"--eval_every must be >= 1, got {self.eval_every}.")
    if self.checkpoint_every < 0:
      raise ValueError(f"--checkpoint_every must be >= 0, got {self.checkpoint_every}.")
    if self.eval_chunk < 0:
      raise ValueError(f"--eval_chunk must be >= 0, got {self.eval_chunk}.")
    if self.resume and not self.output_dir:
      raise ValueError("--resume needs --output_dir (where the checkpoint is).")
    if self.resume and self.overwrite:
      raise ValueError("--resume and --overwrite exclude each other (continue the run in "
                       "--output_dir, or replace it).")
    if self.client_store not in ("memory", "disk"):
      raise ValueError(f"--client_store must be 'memory' or 'disk', got {self.client_store!r}.")
    if self.client_store == "disk" and not (self.output_dir or self.client_store_dir):
      raise ValueError("--client_store=disk needs --output_dir (states go to "
                       "<output_dir>/client_states).")


# ----------------------------------------------------------------- file output
def atomic_write_bytes(path: str, data: bytes) -> None:
  """Writes `data` to `path` via a temporary file in the same directory + rename."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs get the usual mode
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def atomic_write_text(path: str, text: str) -> None:
  atomic_write_bytes(path, text.encode("utf-8"))


def write_csv(path: str, rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> None:
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: _fmt(row.get(k, "")) for k in columns})
  atomic_write_text(path, buf.getvalue())


def _fmt(v):
  if isinstance(v, (float, np.floating)):
    return f"{float(v):.6g}"
  return v


def evaluated(row: Dict[str, Any]) -> bool:
  """True for a `metrics.csv` row of an evaluated round (it has S and MT)."""
  value = row.get("server_accuracy")
  return value is not None and value != ""


def curves_figure(rows: Sequence[Dict[str, Any]], title: str = ""):
  """The figure of `curves.png` (matplotlib, Agg): S/MT accuracy, S/MT loss and
  train loss per round and, when the rows have `bytes_up`, the cumulative bytes
  sent each way; integer round ticks."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top

  number = lambda v: v is not None and v != "" and np.isfinite(float(v))
  ev = [r for r in rows if evaluated(r)]
  with_bytes = any(number(r.get("bytes_up")) for r in rows)
  panels = 4 if with_bytes else 3
  fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
  axes = list(axes[0])

  def line(ax, source, key, label):
    points = [(int(r["round"]), float(r[key])) for r in source if number(r.get(key))]
    if points:
      ax.plot(*zip(*points), marker=".", label=label)
    return bool(points)

  for key, label in (("server", "S (server model)"), ("mt", "MT (client models)")):
    line(axes[0], ev, f"{key}_accuracy", label)
    line(axes[1], ev, f"{key}_loss", label)
  axes[0].set_ylabel("test accuracy")
  axes[1].set_ylabel("test cross-entropy")
  line(axes[2], rows, "train_loss", "train loss")
  axes[2].set_ylabel("train loss")
  if with_bytes:
    for key, label in (("bytes_up_total", "up (clients -> server)"), ("bytes_down_total",
                                                                      "down (server -> clients)")):
      points = [(int(r["round"]), float(r[key]) / 2**20) for r in rows if number(r.get(key))]
      if points:
        axes[3].plot(*zip(*points), marker=".", label=label)
    axes[3].set_ylabel("cumulative MiB")
  for ax in axes:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  return fig


def plot_curves(path: str, rows: Sequence[Dict[str, Any]], title: str = "") -> None:
  """Writes `curves_figure(rows, title)` to `path` (PNG, atomically)."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig = curves_figure(rows, title)
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=100)
  plt.close(fig)
  atomic_write_bytes(path, buf.getvalue())


# ---------------------------------------------------------------- TensorBoard
# metrics.csv column -> TensorBoard tag; other columns: see `tensorboard_tag`.
TB_TAGS = {
    "server_accuracy": "accuracy/server",
    "mt_accuracy": "accuracy/mt",
    "server_loss": "loss/server",
    "mt_loss": "loss/mt",
    "server_ece": "ece/server",
    "mt_ece": "ece/mt",
    "train_loss": "train/loss",
    "train_accuracy": "train/accuracy",
    "wall_time_s": "time/wall_s",
}
# HParams metrics (their last value: the run's final S/MT numbers).
HPARAMS_METRICS = ("accuracy/server", "accuracy/mt", "loss/server", "loss/mt", "ece/server",
                   "ece/mt", "train/loss", "communication/bytes_up_total")


def tensorboard_tag(key: str, diagnostics: Sequence[str] = ()) -> str:
  """The grouped TensorBoard tag of a `metrics.csv` column: `TB_TAGS`, else
  `communication/<key>` for `bytes_*`, `diagnostics/<key>` for the algorithm's
  `factor_diagnostics`, `train/<key>` for any other training metric."""
  if key in TB_TAGS:
    return TB_TAGS[key]
  if key.startswith("bytes_"):
    return f"communication/{key}"
  if key in diagnostics:
    return f"diagnostics/{key}"
  return f"train/{key}"


def _hparam_value(v):
  """A flag value as an HParams value (bool, int, float or str); None: left out."""
  v = _plain_flag(v)
  if v is None or isinstance(v, (bool, int, float, str)):
    return v
  if isinstance(v, list):
    return ",".join(str(x) for x in v)
  return json.dumps(v, sort_keys=True)


def trim_tensorboard(directory: str, last_round: int) -> int:
  """Rewrites the event files in `directory` into one, keeping every event of
  steps <= `last_round` once per (tag, step) and dropping HParams summaries
  (a resumed run writes them again at its end). A truncated file (a killed
  run) is read up to the cut. The new file takes the name of the oldest, so
  TensorBoard reads it before those the resumed run writes; the old ones are
  removed after it is in place. Returns how many (tag, step) pairs were kept."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.core.util import event_pb2  # pylint: disable=g-import-not-at-top

  if not os.path.isdir(directory):
    return 0
  names = sorted(n for n in os.listdir(directory) if ".tfevents." in n and not n.startswith("."))
  if not names:
    return 0
  records, seen, version = [], set(), None
  for name in names:
    try:
      for record in tf.data.TFRecordDataset(os.path.join(directory, name)):
        event = event_pb2.Event.FromString(record.numpy())
        if event.HasField("file_version"):
          version = version or event
          continue
        if not event.HasField("summary"):
          continue
        kept = [
            v for v in event.summary.value
            if not v.tag.startswith("_hparams_/") and event.step <= last_round and
            (v.tag, event.step) not in seen
        ]
        if not kept:
          continue
        seen.update((v.tag, event.step) for v in kept)
        del event.summary.value[:]
        event.summary.value.extend(kept)
        records.append(event.SerializeToString())
    except tf.errors.DataLossError:
      pass  # cut off by a kill: the complete records before the cut are kept
  target = os.path.join(directory, names[0] if names[0].endswith(".v2") else names[0] + ".v2")
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
  os.close(fd)
  try:
    with tf.io.TFRecordWriter(tmp) as writer:
      if version is not None:
        writer.write(version.SerializeToString())
      for record in records:
        writer.write(record)
    os.replace(tmp, target)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise
  for name in names:
    if os.path.join(directory, name) != target:
      os.unlink(os.path.join(directory, name))
  return len(seen)


# --------------------------------------------------------------------- driver
def sample_clients(seed: int, round_num: int, num_clients: int, per_round: int) -> List[int]:
  rng = np.random.default_rng([seed, round_num])
  return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))


def aggregate_evaluation(per_client: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """Weights each client's sums by its test-set size."""
  n = float(sum(float(c["num_examples"]) for c in per_client))
  if n <= 0:
    raise ValueError("evaluation needs at least one test example over all clients.")
  total = lambda k: float(sum(float(c[k]) for c in per_client))
  out = dict(server_accuracy=total("server_correct") / n,
             server_loss=total("server_loss") / n,
             mt_accuracy=total("mt_correct") / n,
             mt_loss=total("mt_loss") / n,
             client_mt_accuracy=[
                 float(c["mt_correct"]) / max(float(c["num_examples"]), 1.0) for c in per_client
             ])
  # Calibration bins add over clients: the ECE of the pooled test set.
  for key in ("server", "mt"):
    if all(f"{key}_calibration" in c for c in per_client):
      bins = sum(np.asarray(c[f"{key}_calibration"], np.float64) for c in per_client)
      out[f"{key}_ece"] = metrics_lib.expected_calibration_error(bins)
  return out


def _plain_sums(result) -> Dict[str, Any]:
  """One client's evaluation sums (a dict or a struct of tensors) as a dict of
  numpy values, without `client_index`."""
  items = result.items() if hasattr(result, "items") else result._asdict().items()
  return {k: np.asarray(v) for k, v in items if k != "client_index"}


def _flatten_metrics(metrics: Any) -> Dict[str, float]:
  """Nested metric dicts -> flat {leaf name: float}; a path joined by '/' only
  where two leaves share a name."""
  leaves = []

  def walk(m, path):
    if hasattr(m, "items"):
      for k, v in m.items():
        walk(v, path + (str(k),))
    else:
      leaves.append((path, float(np.asarray(m))))

  walk(metrics, ())
  names = [p[-1] for p, _ in leaves]
  return {(p[-1] if names.count(p[-1]) == 1 else "/".join(p)): v for p, v in leaves}


class RunStoppedError(RuntimeError):
  """The robust-round rules stopped the run; `str()` is one line naming the cause
  (`launchers.train` prints it and exits 1)."""


class NonFiniteServerStateError(RunStoppedError):
  """A round made the server state non-finite; the run stops before saving it."""


# Robust rounds: a run stops after this many rounds in a row in which every client
# update was dropped (the server model did not move in any of them).
ALL_DROPPED_STOP_ROUNDS = 3


class AllClientsDroppedError(RunStoppedError):
  """`ALL_DROPPED_STOP_ROUNDS` rounds in a row dropped every client update; the run
  stops after writing the last of them (instead of finishing untrained)."""


class RunInterrupted(KeyboardInterrupt):
  """Ctrl-C (a `KeyboardInterrupt`) during `ExperimentRunner.run`. `str()` is one
  line: the round it stopped in, the last checkpoint and the command that
  continues the run (or that nothing was saved)."""

  def __init__(self, message: str, round_num: Optional[int], checkpoint_round: Optional[int]):
    super().__init__(message)
    self.round_num, self.checkpoint_round = round_num, checkpoint_round


def non_finite_leaves(tree, path="server_state"):
  """Paths of the floating-point leaves of `tree` (namedtuples, lists, dicts,
  TFF structs of numpy values) that hold a NaN or an infinity."""
  if isinstance(tree, dict):
    items = [(f"{path}.{k}", v) for k, v in tree.items()]
  elif hasattr(tree, "_fields"):
    items = [(f"{path}.{k}", getattr(tree, k)) for k in tree._fields]
  elif isinstance(tree, (list, tuple)) or (hasattr(tree, "__iter__") and
                                           not isinstance(tree,
                                                          (str, bytes, np.ndarray, np.generic))):
    items = [(f"{path}[{i}]", v) for i, v in enumerate(tree)]
  else:
    a = np.asarray(tree)
    floating = np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)
    return [path] if floating and not np.all(np.isfinite(a)) else []
  return [bad for p, v in items for bad in non_finite_leaves(v, p)]


class ExperimentRunner:
  """Runs `rounds` rounds of `algorithm` on `data`; see the module docstring.

  Args:
    algorithm: object with the four members listed in the module docstring.
    data: `tfbfl.data.FederatedData`.
    config: `RunConfig`.
    flags: dict of the launcher's flags, stored in `summary.json` and checked on
      `--resume` (a checkpoint of another configuration is refused).
    round_hook: optional `fn(round_num, metrics_dict)` called after each round
      (e.g. communication accounting adds columns).
  """

  def __init__(self,
               algorithm,
               data: FederatedData,
               config: RunConfig,
               flags: Optional[Dict[str, Any]] = None,
               round_hook: Optional[Callable[[int, Dict[str, Any]], None]] = None):
    config = config.resolved(len(data.client_ids))
    config.validate(len(data.client_ids))
    if not isinstance(algorithm, FederatedAlgorithm):
      missing = [
          m for m in ("initial_server_state", "initial_client_state", "next", "evaluate")
          if not callable(getattr(algorithm, m, None))
      ]
      raise TypeError(f"{type(algorithm).__name__} is not a tfbfl.algorithms.base."
                      f"FederatedAlgorithm: it lacks {missing}.")
    self.algorithm, self.data, self.config = algorithm, data, config
    self.flags = dict(flags or {})
    self.round_hook = round_hook
    self.client_ids = list(data.client_ids)
    self._train = [data.train[c] for c in self.client_ids]
    self._test = [data.test[c] for c in self.client_ids]
    self.rows: List[Dict[str, Any]] = []
    self.client_rows: List[Dict[str, Any]] = []
    self.state: Optional[Dict[str, Any]] = None
    self._tb_writer = None
    self._diagnostic_keys: set = set()  # factor_diagnostics columns (TensorBoard group)
    self._round_in_progress: Optional[int] = None
    self._rounds_done = 0
    # Streamed evaluation: client index -> its last MT sums (valid until the
    # client trains again), and how many clients' MT / S each call computed.
    self._mt_cache: Dict[int, Dict[str, Any]] = {}
    self.eval_counts = dict(mt_clients=0, s_clients=0, calls=0)

  # ---------------------------------------------------------------- state
  def _new_client_store(self):
    cfg = self.config
    directory = cfg.client_store_dir or (os.path.join(cfg.output_dir, "client_states")
                                         if cfg.output_dir else None)
    return client_store_lib.make_client_store(cfg.client_store, directory)

  def _fresh_state(self):
    clients = self._new_client_store()
    clients.clear()  # a fresh run in a used directory starts from no states
    return dict(round=0,
                server_state=self.algorithm.initial_server_state(),
                clients=clients,
                rows=[],
                client_rows=[],
                wall_time_s=0.0)

  def _client_state(self, state, index):
    if index not in state["clients"]:
      state["clients"][index] = self.algorithm.initial_client_state(index)
    return state["clients"][index]

  def _checkpoint_path(self):
    return os.path.join(self.config.output_dir, CHECKPOINT)

  def _data_fingerprint(self) -> str:
    if self.config.data_fingerprint is None:
      self.config.data_fingerprint = run_dir_lib.data_fingerprint(self.data)
    return self.config.data_fingerprint

  def _save_checkpoint(self, state):
    """Writes `checkpoint.npz` atomically (`tfbfl.state_io`: arrays + a JSON
    manifest with the flags, the data fingerprint and per-array checksums).
    A disk client store is saved as a hard-linked snapshot directory that the
    checkpoint names; older snapshots are pruned only after the checkpoint
    that replaces them is on disk."""
    tree = {k: v for k, v in state.items() if k != "clients"}
    snapshot = None
    if isinstance(state["clients"], client_store_lib.DiskClientStore):
      snapshot = client_store_lib.save_snapshot(state["clients"], self.config.output_dir,
                                                state["round"])
      tree["client_snapshot"] = snapshot
    else:
      tree["clients"] = dict(state["clients"])
    meta = dict(kind="checkpoint",
                round=int(state["round"]),
                flags=self._checkpoint_flags(),
                data_fingerprint=self._data_fingerprint(),
                client_store=getattr(state["clients"], "kind", "memory"))
    state_io.save(self._checkpoint_path(), tree, meta=meta)
    self._checkpoint_round = int(state["round"])
    if snapshot is not None:
      client_store_lib.prune_snapshots(self.config.output_dir, keep=snapshot)

  def _checkpoint_flags(self):
    return self._comparable_flags(self.flags)

  @staticmethod
  def _comparable_flags(flags):
    """The flags a checkpoint must share with a run that resumes it."""
    ignore = {
        "rounds", "resume", "overwrite", "checkpoint_every", "output_dir", "eval_every", "executor",
        "workers", "call_timeout_s", "verbose", "eval_chunk", "clients_per_group", "export",
        "export_samples"
    }
    return {k: _plain_flag(v) for k, v in flags.items() if k not in ignore}

  @classmethod
  def check_resumable(cls, output_dir: str, flags: Dict[str, Any], data_fingerprint: str) -> int:
    """Cheap check, before any start-up, that `--resume` into `output_dir` can
    work: its checkpoint exists and has a valid manifest written with the same
    flags and data. Returns the checkpoint's round. `run` checks everything
    again (and every array's checksum) when it loads the checkpoint.

    Raises:
      FileNotFoundError, ValueError: one line naming the checkpoint.
    """
    path = os.path.join(output_dir, CHECKPOINT)
    cls._refuse_legacy(output_dir, path)
    try:
      meta = state_io.read_meta(path)
    except FileNotFoundError:
      raise FileNotFoundError(f"--resume: no checkpoint at {path}.") from None
    except ValueError as e:
      raise ValueError(f"--resume: {e}") from None
    cls._check_meta(path, meta, cls._comparable_flags(flags), data_fingerprint)
    return int(meta["round"])

  @staticmethod
  def _refuse_legacy(output_dir, path):
    legacy = os.path.join(output_dir, LEGACY_CHECKPOINT)
    if not os.path.exists(path) and os.path.exists(legacy):
      raise ValueError(
          f"--resume: {legacy} is a pickle checkpoint of an older tfbfl, which is never "
          "loaded (a pickle can execute code); start afresh with --overwrite.")

  @staticmethod
  def _check_meta(path, meta, want_flags, data_fingerprint):
    if meta.get("kind") != "checkpoint" or not isinstance(meta.get("round"), int):
      raise ValueError(f"--resume: {path} is a tfbfl state file but not a checkpoint.")
    saved = meta.get("flags", {})
    if saved != want_flags:
      diff = sorted(k for k in set(saved) | set(want_flags) if saved.get(k) != want_flags.get(k))
      raise ValueError(f"--resume: checkpoint {path} was written with other flags: {diff}.")
    if meta.get("data_fingerprint") != data_fingerprint:
      raise ValueError(
          f"--resume: the data changed since checkpoint {path} was written (data fingerprint "
          f"{str(meta.get('data_fingerprint'))[:12]}..., now {data_fingerprint[:12]}...); "
          "pass --overwrite to start afresh on the new data.")

  def _load_checkpoint(self):
    """The state saved by `_save_checkpoint`, after checking (in this order)
    the file (`tfbfl.state_io.load`: format, version, checksums, structure),
    the flags and the data fingerprint; raises one `ValueError` line (or
    `FileNotFoundError`) naming the checkpoint otherwise. Never unpickles."""
    path = self._checkpoint_path()
    self._refuse_legacy(self.config.output_dir, path)
    if not os.path.exists(path):
      raise FileNotFoundError(f"--resume: no checkpoint at {path}.")
    try:
      state, meta = state_io.load(path)
    except ValueError as e:
      raise ValueError(f"--resume: {e}") from None
    self._check_meta(path, meta, self._checkpoint_flags(), self._data_fingerprint())
    if (not isinstance(state, dict) or state.get("round") != meta["round"] or
        "server_state" not in state):
      raise ValueError(f"--resume: {path} is a tfbfl state file but not a checkpoint.")
    if "clients" in state:
      state["clients"] = client_store_lib.MemoryClientStore(state["clients"])
    snapshot = state.pop("client_snapshot", None)
    if snapshot is not None:  # disk store: its files as of the checkpoint
      if not isinstance(snapshot, str) or snapshot != client_store_lib.snapshot_name(
          state["round"]):
        raise ValueError(f"--resume: {path} names a bad client-state snapshot {snapshot!r:.60}.")
      state["clients"] = self._new_client_store()
      try:
        state["clients"].restore(os.path.join(self.config.output_dir, snapshot))
      except FileNotFoundError as e:
        raise FileNotFoundError(f"--resume: {e}") from None
      except ValueError as e:
        raise ValueError(f"--resume: {e}") from None
    if "clients" not in state:
      raise ValueError(f"--resume: {path} holds no client states.")
    self._checkpoint_round = int(state["round"])
    return state

  def _start_state(self):
    """Takes `output_dir` for this run and returns the state to start from.

    With an `output_dir`: creates it, takes its lock (`tfbfl.run_dir.RunLock`,
    held until `close()`; a directory in use by another run is refused at
    once), removes stale `.tmp-*` files of interrupted writes, then refuses a
    directory holding another run unless `resume` (its checkpoint is then
    checked) or `overwrite` (its outputs are removed first). Returns the
    checkpoint's state with `resume`, else a fresh one.
    """
    cfg = self.config
    if not cfg.output_dir:
      return self._load_checkpoint() if cfg.resume else self._fresh_state()
    run_dir_lib.prepare(cfg.output_dir)
    if getattr(self, "_lock", None) is None:
      self._lock = run_dir_lib.RunLock(cfg.output_dir)
    self._lock.acquire(owner=self)
    try:
      store_dir = cfg.client_store_dir or os.path.join(cfg.output_dir, "client_states")
      for directory in (cfg.output_dir, store_dir):
        state_io.remove_stale_temporaries(directory)
      removed = run_dir_lib.refuse_or_clear(cfg.output_dir,
                                            resume=cfg.resume,
                                            overwrite=cfg.overwrite)
      if removed and cfg.verbose:
        print(f"--overwrite: removed {', '.join(removed)} from {cfg.output_dir}", flush=True)
      return self._load_checkpoint() if cfg.resume else self._fresh_state()
    except BaseException:
      self.close()
      raise

  def close(self) -> None:
    """Releases the lock on `output_dir` (idempotent). `training.run_training`
    calls it when the run ends; the lock also goes with the runner object or
    the process."""
    writer, self._tb_writer = getattr(self, "_tb_writer", None), None
    if writer is not None:
      writer.close()
    lock = getattr(self, "_lock", None)
    if lock is not None:
      lock.release()

  @staticmethod
  def _rekey(selected, results, what="client states"):
    """Per-client `results` in `selected` order. Results that carry
    `client_index` (an attribute, or a key of a dict) are matched by it
    (multi-worker contexts return them in completion order); others are taken
    in the order returned, which the local context keeps, and are refused under
    a multi-worker context."""
    results = list(results)
    if len(results) != len(selected):
      raise RuntimeError(f"{len(selected)} clients were selected but {len(results)} "
                         f"{what} came back.")
    index_of = lambda r: r.get("client_index") if isinstance(r, dict) else getattr(
        r, "client_index", None)
    indices = [index_of(r) for r in results]
    if any(i is None for i in indices):
      from tfbfl import runtime  # pylint: disable=g-import-not-at-top

      if len(results) > 1 and runtime.mergeable_context_active():
        raise RuntimeError(
            f"{what} came back from a multi-worker context without `client_index`, so "
            "they may be out of client order; this algorithm cannot run with "
            "--executor=remote until its per-client outputs carry client_index.")
      return results
    by_index = {int(np.asarray(i)): r for i, r in zip(indices, results)}
    missing = sorted(set(selected) - set(by_index))
    if missing:
      raise RuntimeError(f"{what} of clients {missing} did not come back.")
    return [by_index[i] for i in selected]

  def _round_fn(self):
    """`algorithm.next`, or its `next_two_phase` under a multi-worker context."""
    from tfbfl import runtime  # pylint: disable=g-import-not-at-top

    two_phase = getattr(self.algorithm, "next_two_phase", None)
    if two_phase is not None and runtime.mergeable_context_active():
      return two_phase
    return self.algorithm.next

  # ------------------------------------------------------------- evaluate
  def _streamed(self) -> bool:
    return self.config.eval_chunk > 0 and all(
        hasattr(self.algorithm, m) for m in ("evaluate_server", "evaluate_clients"))

  def _mt_cacheable(self) -> bool:
    return self.config.eval_cache and bool(getattr(self.algorithm, "mt_cacheable", False))

  def evaluate(self, state) -> Dict[str, Any]:
    """S and MT over all K clients (see the module docstring).

    Algorithms with `evaluate_server` and `evaluate_clients` are evaluated
    streamed, `eval_chunk` clients per call: S from the server state and the
    clients' test data alone; MT from each client's state alone, loaded from
    the store one chunk at a time (a client never trained is evaluated with
    `initial_client_state`, which is not stored) and cached per client when the
    algorithm says MT is a function of the state (`mt_cacheable`): only clients
    trained since their last evaluation are recomputed. Others (and
    `eval_chunk = 0`) send every client's state in one `algorithm.evaluate` call.
    """
    k = len(self.client_ids)
    seeds = [client_seed(self.config.seed, -1 - state["round"], i) for i in range(k)]
    if not self._streamed():
      states = [self._client_state(state, i) for i in range(k)]
      per_client = self.algorithm.evaluate(state["server_state"], states, seeds, self._test)
      self.eval_counts["calls"] += 1
      self.eval_counts["mt_clients"] += k
      self.eval_counts["s_clients"] += k
      return aggregate_evaluation(self._rekey(list(range(k)), per_client, "evaluation results"))
    chunk = self.config.eval_chunk
    chunks = lambda indices: [indices[j:j + chunk] for j in range(0, len(indices), chunk)]
    server_part: List[Dict[str, Any]] = []
    for ids in chunks(list(range(k))):
      out = self.algorithm.evaluate_server(state["server_state"], ids, [seeds[i] for i in ids],
                                           [self._test[i] for i in ids])
      server_part.extend(_plain_sums(r) for r in self._rekey(ids, out, "evaluation results"))
      self.eval_counts["calls"] += 1
      self.eval_counts["s_clients"] += len(ids)
    if not self._mt_cacheable():
      self._mt_cache = {}
    clients = state["clients"]
    for ids in chunks([i for i in range(k) if i not in self._mt_cache]):
      states = []
      for i in ids:  # a never-trained client: its initial state, rebuilt, not stored
        s = clients.get(i)
        states.append(self.algorithm.initial_client_state(i) if s is None else s)
      out = self.algorithm.evaluate_clients(states, ids, [seeds[i] for i in ids],
                                            [self._test[i] for i in ids])
      del states  # disk store: one chunk of states in memory at a time
      for i, r in zip(ids, self._rekey(ids, out, "evaluation results")):
        self._mt_cache[i] = _plain_sums(r)
      self.eval_counts["calls"] += 1
      self.eval_counts["mt_clients"] += len(ids)
    per_client = [{**server_part[i], **self._mt_cache[i]} for i in range(k)]
    if not self._mt_cacheable():
      self._mt_cache = {}
    return aggregate_evaluation(per_client)

  # ------------------------------------------------------------------ run
  def run(self) -> Dict[str, Any]:
    """Runs the rounds; the output directory's lock is released when it returns
    or raises. Each round adds a `metrics.csv` row and prints a progress line
    (`verbose`); every `eval_every`-th round and the last are evaluated. With an
    `output_dir`, the run ends by saving the final state (`checkpoint.npz`,
    whatever `checkpoint_every`), then `summary.json`, `curves.png` and the
    TensorBoard HParams, then `export/` (`RunConfig.export`; an export that
    fails raises, the run's other outputs complete, and `launchers.export`
    can redo it from the checkpoint).

    Raises:
      RunInterrupted: on Ctrl-C (see the class).
      NonFiniteServerStateError, AllClientsDroppedError (`RunStoppedError`s):
        the robust-round rules stopped the run (one-line message).
    """
    try:
      return self._run()
    except KeyboardInterrupt as e:
      if isinstance(e, RunInterrupted):
        raise
      raise self._interrupted() from None
    finally:
      self.close()

  def _interrupted(self) -> RunInterrupted:
    """The `RunInterrupted` of a Ctrl-C now (see `run`)."""
    cfg, r = self.config, self._round_in_progress
    if r:
      where = f"in round {r} of {cfg.rounds}"
    elif self._rounds_done:
      where = f"after round {self._rounds_done} of {cfg.rounds} (writing the final outputs)"
    else:
      where = "before the first round"
    saved = None
    if cfg.output_dir:
      try:
        saved = int(state_io.read_meta(self._checkpoint_path())["round"])
      except (OSError, ValueError, KeyError, TypeError):
        saved = None
    command = "python -m launchers.train --flagfile=" + shlex.quote(
        os.path.join(cfg.output_dir or "", FLAGS_FILE))
    if saved:
      message = (f"interrupted {where}; the checkpoint has round {saved}; continue with: "
                 f"{command} --resume")
    elif cfg.output_dir:
      message = (f"interrupted {where}; nothing was saved (no checkpoint yet: see "
                 f"--checkpoint_every); start again with: {command} --overwrite")
    else:
      message = f"interrupted {where}; nothing was saved (no --output_dir)."
    return RunInterrupted(message, r, saved)

  def _run(self) -> Dict[str, Any]:
    cfg = self.config
    state = self._start_state()  # lock, ownership of output_dir, checkpoint or fresh
    self._rounds_done = state["round"]
    if cfg.resume and self.config.verbose:
      print(f"resumed from {self._checkpoint_path()} at round {state['round']}", flush=True)
    if cfg.output_dir:
      self._write_flags_file()
      if cfg.resume:  # events of rounds after the checkpoint are written again
        trim_tensorboard(os.path.join(cfg.output_dir, TB_DIR), state["round"])
    k = len(self.client_ids)
    self._mt_cache = {}  # a resumed run recomputes every client's MT once
    start_round = state["round"] + 1
    clock = time.time() - state["wall_time_s"]
    session_start, session_rounds = time.time(), 0
    round_fn = self._round_fn()
    if cfg.verbose and start_round <= cfg.rounds:
      print(
          f"[{self.algorithm.name}] rounds {start_round}-{cfg.rounds}, {cfg.clients_per_round} of "
          f"{k} clients each" + (f", outputs in {cfg.output_dir}" if cfg.output_dir else "") +
          "; building computations (the first round traces them, ~20 s) ...",
          flush=True)
    for r in range(start_round, cfg.rounds + 1):
      self._round_in_progress = r
      selected = sample_clients(cfg.seed, r, k, cfg.clients_per_round)
      states = [self._client_state(state, i) for i in selected]
      seeds = [client_seed(cfg.seed, r, i) for i in selected]
      data = [self._train[i] for i in selected]
      server_state, new_states, metrics = round_fn(state["server_state"], states, seeds, data)
      # Robust rounds: a non-finite server state stops the run before this round
      # is stored anywhere (outputs and the last checkpoint stay as they were).
      bad = non_finite_leaves(server_state)
      if bad:
        raise NonFiniteServerStateError(
            f"[{self.algorithm.name}] round {r}: the server state became non-finite "
            f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); stopped without writing "
            f"anything of round {r} (the last checkpoint is intact). "
            "Try a smaller --client_lr or --server_lr.")
      state["server_state"] = server_state
      for i, s in zip(selected, self._rekey(selected, new_states)):
        state["clients"][i] = s
        self._mt_cache.pop(i, None)  # trained: its MT is recomputed at the next evaluation
      state["round"] = self._rounds_done = r
      session_rounds += 1
      flat = _flatten_metrics(metrics)
      if cfg.verbose and flat.get("clients_dropped", 0) >= len(selected):
        print(
            f"[{self.algorithm.name}] round {r}: all {len(selected)} client updates were dropped "
            "(non-finite, or norm above --max_update_ratio); the server model is unchanged.",
            flush=True)
      round_bytes = getattr(self.algorithm, "round_bytes", None)
      if round_bytes is not None:
        up, down = round_bytes(len(selected), flat)
        state["bytes_up_total"] = state.get("bytes_up_total", 0) + up
        state["bytes_down_total"] = state.get("bytes_down_total", 0) + down
        flat.update(bytes_up=up,
                    bytes_down=down,
                    bytes_up_total=state["bytes_up_total"],
                    bytes_down_total=state["bytes_down_total"])
      if self.round_hook is not None:
        self.round_hook(r, flat)
      state["wall_time_s"] = time.time() - clock
      row = dict(round=r, **flat)
      if r % cfg.eval_every == 0 or r == cfg.rounds:
        self._evaluate_into(state, row)
      row["wall_time_s"] = time.time() - clock
      state["rows"].append(row)
      self._write_outputs(state, row)
      if cfg.output_dir and cfg.checkpoint_every and r % cfg.checkpoint_every == 0:
        self._save_checkpoint(state)
      self._report(r, row, session_start, session_rounds)  # after its outputs: Ctrl-C loses none
      self._stop_if_all_dropped(state["rows"], r)
    self._round_in_progress = None
    rows = state["rows"]
    if not rows or rows[-1]["round"] != state["round"] or not evaluated(rows[-1]):
      # Resumed with no round left to run, from a checkpoint of a round without
      # evaluation: the final state is evaluated now.
      row = rows[-1] if rows and rows[-1]["round"] == state["round"] else None
      new = row is None
      row = dict(round=state["round"]) if new else row
      before = dict(row)
      self._evaluate_into(state, row)
      if new:
        row["wall_time_s"] = state["wall_time_s"]
        rows.append(row)
      self._write_outputs(state, {k2: v for k2, v in row.items() if k2 not in before or new})
      self._report(state["round"], row, session_start, max(session_rounds, 1))
    self.rows, self.client_rows = state["rows"], state["client_rows"]
    self.state = state  # server state and every client's state, for analyses (Fig. 4)
    summary = self.summary(state)
    if cfg.output_dir:
      if self._saved_round() != state["round"]:
        self._save_checkpoint(state)  # the final state, whatever checkpoint_every
      self._write_final_outputs(state, summary)
      if cfg.export:  # last: `python -m launchers.export` can redo it from the checkpoint
        self._export(state)
    return summary

  def _evaluate_into(self, state, row) -> None:
    """Adds round `row["round"]`'s S and MT (and the algorithm's diagnostics) to
    `row` and its per-client MT accuracy to `state["client_rows"]`."""
    diagnostics = getattr(self.algorithm, "factor_diagnostics", None)
    if diagnostics is not None:
      extra = diagnostics(state["server_state"], state["clients"])
      self._diagnostic_keys.update(extra)
      row.update(extra)
    ev = self.evaluate(state)
    row.update({k: v for k, v in ev.items() if k != "client_mt_accuracy"})
    state["client_rows"].append(
        dict(round=row["round"],
             **{
                 c: a for c, a in zip(self.client_ids, ev["client_mt_accuracy"])
             }))

  def _saved_round(self) -> Optional[int]:
    return getattr(self, "_checkpoint_round", None)

  def _write_flags_file(self) -> None:
    """`flags.txt`: the flags of `launchers.train` among `self.flags` (see
    `tfbfl.run_dir.flagfile_text`)."""
    from tfbfl import training  # pylint: disable=g-import-not-at-top  (imports this module)

    out = self.config.output_dir
    names = [n for n in ("algorithm", *training.DEFAULTS) if n != "verbose"]
    path = os.path.join(out, FLAGS_FILE)
    header = ("# The flags of this run. Continue it, or run it again:\n"
              f"#   python -m launchers.train --flagfile={shlex.quote(path)} --resume\n"
              f"#   python -m launchers.train --flagfile={shlex.quote(path)} --overwrite\n")
    atomic_write_text(path, header + run_dir_lib.flagfile_text(self.flags, names))

  def _export(self, state) -> None:
    """`tfbfl.export.export_run` of the final state into `<output_dir>/export`,
    with every client's state (a never-selected client: its initial state);
    skipped, with a note, for an algorithm `tfbfl.export.supports_export` refuses."""
    from tfbfl import export  # pylint: disable=g-import-not-at-top

    supported = getattr(export, "supports_export", None)
    if supported is not None and not supported(self.algorithm):
      if self.config.verbose:
        print(f"[{self.algorithm.name}] no export: the algorithm has no export hooks.", flush=True)
      return
    clients = state["clients"]

    def client_items():
      for index, client_id in enumerate(self.client_ids):
        s = clients.get(index)
        yield (str(client_id), index,
               self.algorithm.initial_client_state(index) if s is None else s)

    export.export_run(self.algorithm,
                      state["server_state"],
                      client_items(),
                      os.path.join(self.config.output_dir, EXPORT_DIR),
                      samples=self.config.export_samples,
                      seed=self.config.seed,
                      raw_input=self.data.raw_input)
    if self.config.verbose:
      print(
          f"[{self.algorithm.name}] exported the server and {len(self.client_ids)} client "
          f"models to {os.path.join(self.config.output_dir, EXPORT_DIR)}",
          flush=True)

  def _stop_if_all_dropped(self, rows, r):
    """Raises `AllClientsDroppedError` when the last `ALL_DROPPED_STOP_ROUNDS` rows
    (rounds up to `r`, a resumed run's included) each dropped every client."""
    last = rows[-ALL_DROPPED_STOP_ROUNDS:]
    c = self.config.clients_per_round
    if len(last) == ALL_DROPPED_STOP_ROUNDS and all(
        row.get("clients_dropped", 0) >= c for row in last):
      ratio = getattr(getattr(self.algorithm, "config", None), "max_update_ratio", None)
      raise AllClientsDroppedError(
          f"[{self.algorithm.name}] rounds {r - ALL_DROPPED_STOP_ROUNDS + 1}-{r}: every client "
          f"update was dropped in {ALL_DROPPED_STOP_ROUNDS} rounds in a row (non-finite, or its "
          "move above --max_update_ratio" + (f"={ratio:g}" if ratio is not None else "") + " times "
          "the server's; update_ratio_max in metrics.csv), so the server model has not moved; "
          f"stopped after writing round {r}. Try a smaller --client_lr or --server_lr, or a "
          "larger --max_update_ratio.")

  def _report(self, r, row, session_start, session_rounds):
    if not self.config.verbose:
      return
    per_round = (time.time() - session_start) / max(session_rounds, 1)
    eta = per_round * max(self.config.rounds - r, 0)
    if evaluated(row):
      scores = (f"S acc {row['server_accuracy']:.4f} loss {row['server_loss']:.4f}  "
                f"MT acc {row['mt_accuracy']:.4f} loss {row['mt_loss']:.4f}  ")
    else:
      scores = "(not evaluated)  "
    print(f"[{self.algorithm.name}] round {r}/{self.config.rounds}  " + scores +
          f"train loss {row.get('train_loss', float('nan')):.4f}  " +
          (f"dropped {int(row['clients_dropped'])}/{self.config.clients_per_round}  "
           if "clients_dropped" in row else "") +
          f"{per_round:.2f} s/round  ETA {int(eta // 60)}:{int(eta % 60):02d}",
          file=sys.stdout,
          flush=True)

  def summary(self, state) -> Dict[str, Any]:
    rows = [r for r in state["rows"] if evaluated(r)]  # S and MT: evaluated rounds
    best = lambda key: max(r[key] for r in rows)
    import tfbfl  # pylint: disable=g-import-not-at-top

    return dict(
        algorithm=self.algorithm.name,
        flags=self.flags,
        rounds=state["round"],
        best_server_accuracy=best("server_accuracy"),
        best_mt_accuracy=best("mt_accuracy"),
        best_global_accuracy=best("server_accuracy"),
        final_server_accuracy=rows[-1]["server_accuracy"],
        final_mt_accuracy=rows[-1]["mt_accuracy"],
        final_server_loss=rows[-1]["server_loss"],
        final_mt_loss=rows[-1]["mt_loss"],
        # NLL = the test cross-entropy of the evaluated predictive (metrics.csv's losses).
        final_server_nll=rows[-1]["server_loss"],
        final_mt_nll=rows[-1]["mt_loss"],
        final_server_ece=rows[-1].get("server_ece"),
        final_mt_ece=rows[-1].get("mt_ece"),
        wall_time_s=state["wall_time_s"],
        bytes_up_total=state.get("bytes_up_total"),
        bytes_down_total=state.get("bytes_down_total"),
        tfbfl_version=tfbfl.__version__,
        git_commit=run_dir_lib.source_commit(),
        git_modified=run_dir_lib.source_modified(),
        data_fingerprint=self._data_fingerprint())

  def _write_outputs(self, state, new_values):
    """metrics.csv and client_metrics.csv as of `state`; `new_values` (a row,
    or what was added to one) to TensorBoard."""
    out = self.config.output_dir
    if not out:
      return
    rows = state["rows"]
    extra = sorted({k for r in rows for k in r} - set(BASE_COLUMNS))
    write_csv(os.path.join(out, "metrics.csv"), rows, list(BASE_COLUMNS) + extra)
    write_csv(os.path.join(out, "client_metrics.csv"), state["client_rows"],
              ["round"] + self.client_ids)
    self._write_tensorboard(int(rows[-1]["round"]), new_values)

  def _write_final_outputs(self, state, summary):
    out = self.config.output_dir
    self._write_hparams()
    plot_curves(os.path.join(out, "curves.png"), state["rows"], title=self.algorithm.name)
    atomic_write_text(os.path.join(out, "summary.json"),
                      json.dumps(strict_json(summary), indent=2, sort_keys=True, allow_nan=False))

  def _tensorboard(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if self._tb_writer is None:
      self._tb_writer = tf.summary.create_file_writer(os.path.join(self.config.output_dir, TB_DIR))
    return tf, self._tb_writer

  def _write_tensorboard(self, step: int, values: Dict[str, Any]) -> None:
    """One scalar per numeric entry of `values` at `step` (grouped tags:
    `tensorboard_tag`)."""
    tf, writer = self._tensorboard()
    with writer.as_default():
      for key, value in values.items():
        if key == "round" or isinstance(value, bool):
          continue
        if isinstance(value, (int, float, np.integer, np.floating)):
          tf.summary.scalar(tensorboard_tag(key, self._diagnostic_keys), float(value), step=step)
    writer.flush()

  def _write_hparams(self) -> None:
    """HParams of the run: the flags (`self.flags`) and, as metrics, the tags in
    `HPARAMS_METRICS` (their last values: the final S/MT accuracy and loss)."""
    from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top

    values = {k: _hparam_value(v) for k, v in sorted(self.flags.items())}
    values = {k: v for k, v in values.items() if v is not None}
    tags = {tensorboard_tag(k, self._diagnostic_keys) for r in self.rows for k in r}
    _, writer = self._tensorboard()
    with writer.as_default():
      hp.hparams_config(hparams=[hp.HParam(k) for k in values],
                        metrics=[hp.Metric(t) for t in HPARAMS_METRICS if t in tags])
      hp.hparams(values)
    writer.flush()


def strict_json(o):
  """`o` as strict JSON values: numpy scalars as Python numbers, tuples and sets
  as lists, non-finite floats as the strings "nan", "inf", "-inf" (JSON has no
  NaN or Infinity), anything else unknown as its `str`."""
  if isinstance(o, dict):
    return {str(k): strict_json(v) for k, v in o.items()}
  if isinstance(o, (list, tuple, set)):
    return [strict_json(v) for v in o]
  if isinstance(o, (bool, np.bool_)):
    return bool(o)
  if isinstance(o, (int, np.integer)):
    return int(o)
  if isinstance(o, (float, np.floating)):
    v = float(o)
    return v if np.isfinite(v) else ("nan" if np.isnan(v) else ("inf" if v > 0 else "-inf"))
  if o is None or isinstance(o, str):
    return o
  return str(o)


def json_default(o):
  if isinstance(o, (np.integer,)):
    return int(o)
  if isinstance(o, (np.floating,)):
    return float(o)
  if isinstance(o, (tuple, set)):
    return list(o)
  return str(o)


def _plain_flag(v):
  """A flag value as plain Python (numpy scalars -> numbers, tuples -> lists),
  as stored in a checkpoint's JSON manifest and compared on `--resume`."""
  if isinstance(v, np.generic):
    return v.item()
  if isinstance(v, (list, tuple)):
    return [_plain_flag(x) for x in v]
  if isinstance(v, dict):
    return {str(k): _plain_flag(x) for k, x in v.items()}
  if v is None or isinstance(v, (bool, int, float, str)):
    return v
  return str(v)

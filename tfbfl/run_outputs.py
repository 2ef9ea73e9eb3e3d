"""What a run writes, as small objects the round loop calls: `RunOutput`s.

`tfbfl.round_loop.ExperimentRunner` is the round loop; every file it leaves in
`output_dir` (and its progress lines) comes from one of these, each called at
the start of a run, after every round and at its end, in the order given, the
way TFF's release and state managers plug into `run_training_process`:

    FlagsFile       flags.txt (start)
    MetricsFiles    metrics.csv, client_metrics.csv (every round)
    TensorBoard     tb/ scalars (every round), HParams (end); a resumed run first
                    drops the events of rounds after its checkpoint
    Checkpoints     checkpoint.npz every `checkpoint_every` rounds and at the end
    Curves          curves.png (end)
    SummaryJson     summary.json (end)
    Export          export/ SavedModels (end, last)
    Progress        one line per round on stdout

`standard_outputs` builds that list for a runner; pass `outputs=` to the runner
to add your own (subclass `RunOutput`). Every file is written whole or not at
all (`tfbfl.files`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

from tfbfl import checkpoint
from tfbfl import export
from tfbfl import files
from tfbfl import run_directory
from tfbfl.checkpoint import RunState

FLAGS_FILE = run_directory.FLAGS_FILE  # the run's flags, an absl --flagfile
EXPORT_DIR = "export"  # tfbfl.export.export_run's output
TB_DIR = "tb"
BASE_COLUMNS = ("round", "server_accuracy", "server_loss", "mt_accuracy", "mt_loss", "train_loss",
                "train_accuracy", "wall_time_s")


# ----------------------------------------------------------------- file helpers
def write_csv(path: str, rows: Sequence[Dict[str, Any]], columns: Sequence[str]) -> None:
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: _fmt(row.get(k, "")) for k in columns})
  files.atomic_write_text(path, buf.getvalue())


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
  # Fixed margins in inches (room for the tick labels and the axis labels): what
  # `tight_layout` finds here, without its extra pass over every tick.
  width, height = fig.get_size_inches()
  fig.subplots_adjust(left=0.8 / width, right=1 - 0.2 / width, bottom=0.55 / height,
                      top=1 - 0.45 / height, wspace=0.32)
  return fig


def plot_curves(path: str, rows: Sequence[Dict[str, Any]], title: str = "") -> None:
  """Writes `curves_figure(rows, title)` to `path` (PNG, atomically)."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig = curves_figure(rows, title)
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=100)
  plt.close(fig)
  files.atomic_write_bytes(path, buf.getvalue())


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
  v = checkpoint.plain_flag(v)
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


# ------------------------------------------------------------------ outputs
class RunOutput:
  """One output of a run; the runner calls, in this order over a run:

    on_start(state, resumed)       before the first round of this session
    on_round(state, row, new)      after round `row["round"]` (`new`: the values
                                   added to `row` by this call; a resumed run
                                   whose last round was not evaluated gets one
                                   more call with its evaluation)
    on_end(state, summary)         after the last round, in list order
    on_stop(state)                 instead of on_end, after round `state.round` when
                                   the run stops there as asked (`round_loop.request_stop`)
    close()                        always, last (idempotent)
  """

  def on_start(self, state: RunState, resumed: bool) -> None:
    del state, resumed

  def on_round(self, state: RunState, row: Dict[str, Any], new: Dict[str, Any]) -> None:
    del state, row, new

  def on_end(self, state: RunState, summary: Dict[str, Any]) -> None:
    del state, summary

  def on_stop(self, state: RunState) -> None:
    del state

  def close(self) -> None:
    pass


class FlagsFile(RunOutput):
  """`flags.txt`: the launcher's flags among `flags` (`replay_flag_names`; None:
  all) and the commands that continue or redo the run."""

  def __init__(self, output_dir: str, flags: Dict[str, Any], command: str,
               flag_names: Optional[Sequence[str]]):
    self.path = os.path.join(output_dir, FLAGS_FILE)
    self.flags, self.command, self.flag_names = flags, command, flag_names

  def on_start(self, state, resumed):
    names = [n for n in (self.flags if self.flag_names is None else self.flag_names)
             if n != "verbose"]
    command = f"{self.command} --flagfile={shlex.quote(self.path)}"
    header = (f"{run_directory.FLAGS_HEADER}\n"
              f"#   {command} --resume\n"
              f"#   {command} --overwrite\n")
    files.atomic_write_text(
        self.path,
        run_directory.checked_flags_text(header + run_directory.flagfile_text(self.flags, names)))


class MetricsFiles(RunOutput):
  """`metrics.csv` (one row per round: `BASE_COLUMNS`, then every other key
  sorted) and `client_metrics.csv` (per-client MT accuracy per evaluated round),
  rewritten whole after every round."""

  def __init__(self, output_dir: str, client_ids: Sequence[str]):
    self.output_dir, self.client_ids = output_dir, list(client_ids)

  def on_round(self, state, row, new):
    rows = state.rows
    extra = sorted({k for r in rows for k in r} - set(BASE_COLUMNS))
    write_csv(os.path.join(self.output_dir, "metrics.csv"), rows, list(BASE_COLUMNS) + extra)
    write_csv(os.path.join(self.output_dir, "client_metrics.csv"), state.client_rows,
              ["round"] + self.client_ids)


class TensorBoard(RunOutput):
  """`tb/`: one scalar per numeric value of every round (tags `tensorboard_tag`;
  `diagnostic_keys`, filled by the runner, go to `diagnostics/`), and at the end
  HParams: the flags and, as metrics, the final S/MT accuracy and loss."""

  def __init__(self, output_dir: str, flags: Dict[str, Any], diagnostic_keys: set):
    self.directory = os.path.join(output_dir, TB_DIR)
    self.flags, self.diagnostic_keys = flags, diagnostic_keys
    self._writer = None

  def _tf_writer(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TensorFlow loads late)

    if self._writer is None:
      self._writer = tf.summary.create_file_writer(self.directory)
    return tf, self._writer

  def on_start(self, state, resumed):
    if resumed:  # events of rounds after the checkpoint are written again
      trim_tensorboard(self.directory, state.round)

  def _failed(self, error: Exception) -> Exception:
    """A TensorFlow file error of the event writer as a `files.FileWriteError`
    naming `tb/` (else `error` itself)."""
    return files.write_error(error, self.directory) or error

  def on_round(self, state, row, new):
    try:
      tf, writer = self._tf_writer()
      step = int(state.rows[-1]["round"])
      with writer.as_default():
        for key, value in new.items():
          if key == "round" or isinstance(value, bool):
            continue
          if isinstance(value, (int, float, np.integer, np.floating)):
            tf.summary.scalar(tensorboard_tag(key, self.diagnostic_keys), float(value), step=step)
      writer.flush()
    except Exception as e:  # pylint: disable=broad-except  (TensorFlow's file errors)
      failed = self._failed(e)
      if failed is e:
        raise
      raise failed from e

  def on_end(self, state, summary):
    from tensorboard.plugins.hparams import api as hp  # pylint: disable=g-import-not-at-top

    values = {k: _hparam_value(v) for k, v in sorted(self.flags.items())}
    values = {k: v for k, v in values.items() if v is not None}
    tags = {tensorboard_tag(k, self.diagnostic_keys) for r in state.rows for k in r}
    try:
      _, writer = self._tf_writer()
      with writer.as_default():
        hp.hparams_config(hparams=[hp.HParam(k) for k in values],
                          metrics=[hp.Metric(t) for t in HPARAMS_METRICS if t in tags])
        hp.hparams(values)
      writer.flush()
    except Exception as e:  # pylint: disable=broad-except  (TensorFlow's file errors)
      failed = self._failed(e)
      if failed is e:
        raise
      raise failed from e

  def close(self):
    """Closes the event writer. Every event was flushed (and a failure to write one
    raised) by `on_round` / `on_end`; a writer that failed may fail again here, which
    would hide the first error, so closing never raises."""
    writer, self._writer = self._writer, None
    if writer is not None:
      try:
        writer.close()
      except Exception:  # pylint: disable=broad-except
        pass


class Checkpoints(RunOutput):
  """`checkpoint.npz` (`tfbfl.checkpoint`) every `every` rounds (0: none in
  between), and always of the final state and of the round a run stops after as
  asked, so nothing trained is lost."""

  def __init__(self, output_dir: str, every: int, flags: Dict[str, Any],
               data_fingerprint: Callable[[], str]):
    self.output_dir, self.every, self.flags = output_dir, int(every), flags
    self.data_fingerprint = data_fingerprint
    self.saved_round: Optional[int] = None

  def save(self, state: RunState) -> None:
    self.saved_round = checkpoint.save(self.output_dir, state, flags=self.flags,
                                       data_fingerprint=self.data_fingerprint())

  def on_start(self, state, resumed):
    if resumed:
      self.saved_round = state.round

  def on_round(self, state, row, new):
    r = state.round
    if self.every and r % self.every == 0 and self.saved_round != r:
      self.save(state)

  def on_end(self, state, summary):
    self._save_unless_saved(state)

  def on_stop(self, state):
    self._save_unless_saved(state)

  def _save_unless_saved(self, state):
    if self.saved_round != state.round:
      self.save(state)


class Curves(RunOutput):
  """`curves.png` (`plot_curves`) at the end."""

  def __init__(self, output_dir: str, title: str):
    self.path, self.title = os.path.join(output_dir, "curves.png"), title

  def on_end(self, state, summary):
    plot_curves(self.path, state.rows, title=self.title)


class SummaryJson(RunOutput):
  """`summary.json` (strict JSON) at the end."""

  def __init__(self, output_dir: str):
    self.path = os.path.join(output_dir, "summary.json")

  def on_end(self, state, summary):
    files.atomic_write_text(
        self.path, json.dumps(strict_json(summary), indent=2, sort_keys=True, allow_nan=False))


TEMPERATURE_KEYS = ("server_temperature", "mt_temperature")


class Export(RunOutput):
  """`export/`: `tfbfl.export.export_run` of the final state, every client's
  model included (a never-selected client: its initial state); skipped, with a
  note, for an algorithm without export hooks. Last: `python -m
  launchers.export` can redo it from the checkpoint."""

  def __init__(self, output_dir: str, algorithm, client_ids: Sequence[str], *, samples: int,
               seed: int, raw_input, verbose: bool):
    self.directory = os.path.join(output_dir, EXPORT_DIR)
    self.algorithm, self.client_ids = algorithm, list(client_ids)
    self.samples, self.seed, self.raw_input, self.verbose = samples, seed, raw_input, verbose

  def on_end(self, state, summary):
    name = self.algorithm.name
    if not export.supports_export(self.algorithm):
      if self.verbose:
        print(f"[{name}] no export: the algorithm has no export hooks.", flush=True)
      return
    # The models are exported untempered; a run that fitted temperatures
    # (`--temperature_scaling`) states its last ones in export.json's "run".
    last = state.rows[-1] if state.rows else {}
    try:
      export.export_run(self.algorithm,
                        state.server_state,
                        export.iter_client_states(self.algorithm, self.client_ids, state.clients),
                        self.directory,
                        samples=self.samples,
                        seed=self.seed,
                        info={k: last[k] for k in TEMPERATURE_KEYS if k in last},
                        raw_input=self.raw_input)
    except Exception as e:  # pylint: disable=broad-except  (TensorFlow's file errors)
      failed = files.write_error(e, self.directory)
      if failed is None or failed is e:
        raise
      raise failed from e
    if self.verbose:
      print(f"[{name}] exported the server and {len(self.client_ids)} client models to "
            f"{self.directory}", flush=True)


def _clock_time(seconds: float) -> str:
  """`m:ss`, or `h:mm:ss` from an hour on."""
  minutes, secs = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress(RunOutput):
  """One line per round on stdout: S and MT, train loss, dropped clients, the
  time per round of this session and the time left.

  A session's first round also traces the computations, so from its second round
  on the pace (and the time left) counts only the rounds after it.
  """

  def __init__(self, name: str, rounds: int, clients_per_round: int,
               clock: Callable[[], float] = time.time):
    self.name, self.rounds, self.clients_per_round = name, rounds, clients_per_round
    self._clock = clock
    self._start, self._first_round, self._first_done = clock(), 0, None

  def on_start(self, state, resumed):
    self._start, self._first_round, self._first_done = self._clock(), state.round, None

  def _seconds_per_round(self, round_num: int) -> float:
    now = self._clock()
    if self._first_done is None:
      self._first_done = now
      return (now - self._start) / max(round_num - self._first_round, 1)
    return (now - self._first_done) / max(round_num - self._first_round - 1, 1)

  def on_round(self, state, row, new):
    r = int(row["round"])
    per_round = self._seconds_per_round(state.round)
    eta = per_round * max(self.rounds - r, 0)
    if evaluated(row):
      scores = (f"S acc {row['server_accuracy']:.4f} loss {row['server_loss']:.4f}  "
                f"MT acc {row['mt_accuracy']:.4f} loss {row['mt_loss']:.4f}  ")
    else:
      scores = "(not evaluated)  "
    print(f"[{self.name}] round {r}/{self.rounds}  " + scores +
          f"train loss {row.get('train_loss', float('nan')):.4f}  " +
          (f"dropped {int(row['clients_dropped'])}/{self.clients_per_round}  "
           if "clients_dropped" in row else "") +
          f"{per_round:.2f} s/round  ETA {_clock_time(eta)}",
          file=sys.stdout,
          flush=True)

"""What the experiment modules share: run records, metrics, figures, markdown, help texts.

* Run records: a finished run leaves a JSON record in its directory
  (`summary.json`, written by `tfbfl.round_loop.ExperimentRunner`; the Table II
  grid's `result.json`). `finished_run` returns it when its flags match the wanted
  ones, so a re-run skips it. Two flag sets match when they agree on every flag
  but `NOT_COMPARED` (where and how a run is written, not what it computes) and,
  for `dataset=npz`, `num_clients` (the file decides it), compared as JSON; a
  record that is missing or cannot be read (a write cut off) is no record.
* `read_metrics`: the rows of a run's `metrics.csv`; `evaluated`: those with S/MT.
* `pyplot` / `save_figure`: matplotlib on the Agg backend; a figure saved as PNG
  atomically (`tfbfl.round_loop.atomic_write_bytes`) and closed.
* `md_row` / `md_table`: pipe-table lines (`| a | b |`, `|---|---|`).
* `mean_difference` / `beyond_error`: the claims' rule, shared by the Table II
  reports: a difference of two seed means counts only beyond its standard error.
* `flag_help`: the help text of a training setting (`tfbfl.driver.settings()`),
  with an experiment's note ("paper: 32") appended, for launcher flags that keep
  their own defaults.

Nothing here imports TensorFlow; matplotlib and the training settings load on use.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfbfl import round_loop
from tfbfl import run_outputs

SUMMARY = "summary.json"
METRICS = "metrics.csv"
# Flags that decide where or how a run is written, not its result.
NOT_COMPARED = ("output_dir", "checkpoint_every", "resume", "overwrite", "verbose", "export",
                "export_samples")


def log_line(line: str) -> None:
  """The default progress printer: one line on stdout, flushed."""
  print(line, file=sys.stdout, flush=True)


# ---------------------------------------------------------------- run records
def jsonable(obj: Any) -> Any:
  """`obj` as it reads back from JSON (tuples become lists, numpy scalars numbers)."""
  return json.loads(json.dumps(obj, default=round_loop.json_default))


def read_json(path: str) -> Optional[Dict[str, Any]]:
  """The JSON object in `path`, or None if the file is missing or unreadable."""
  try:
    with open(path) as f:
      return json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def comparable(flags: Mapping[str, Any], ignore: Sequence[str] = ()) -> Dict[str, Any]:
  """`flags` (as JSON) without `NOT_COMPARED`, `ignore` and, for `dataset=npz`, `num_clients`."""
  skip = set(NOT_COMPARED) | set(ignore)
  if flags.get("dataset") == "npz":  # the file decides the number of clients
    skip.add("num_clients")
  # As summary.json holds them (strict JSON: an infinite flag such as the default
  # --fola_gamma is the string "inf"), whichever of the two forms `flags` is in.
  flags = run_outputs.strict_json(jsonable(dict(flags)))
  return {k: v for k, v in flags.items() if k not in skip}


def same_flags(saved: Mapping[str, Any], wanted: Mapping[str, Any],
               ignore: Sequence[str] = ()) -> bool:
  """True if two runs' flags agree on everything that decides a result (`comparable`)."""
  return comparable(saved, ignore) == comparable(wanted, ignore)


def finished_run(path: str,
                 wanted: Optional[Mapping[str, Any]] = None,
                 key: str = "flags") -> Optional[Dict[str, Any]]:
  """The run record in `path` (e.g. `<run dir>/summary.json`), or None if there is
  none or (given `wanted`) its `record[key]` flags differ (`same_flags`)."""
  record = read_json(path)
  if record is None or (wanted is not None and not same_flags(record.get(key, {}), wanted)):
    return None
  return record


# -------------------------------------------------------------------- metrics
def read_metrics(run_dir: str,
                 *,
                 numeric: bool = False,
                 missing_ok: bool = False) -> List[Dict[str, Any]]:
  """The rows of `<run_dir>/metrics.csv` as dicts of strings (`numeric`: of floats,
  empty cells left out). A missing file raises FileNotFoundError, or (`missing_ok`)
  gives no rows."""
  path = os.path.join(run_dir, METRICS)
  if missing_ok and not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  if numeric:
    return [{k: float(v) for k, v in r.items() if v != ""} for r in rows]
  return rows


def evaluated(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """The rows of evaluated rounds: with `--eval_every > 1` the others carry only the
  training metrics, their S/MT cells empty (rows without the column are kept)."""
  return [r for r in rows if r.get("server_accuracy", None) != ""]


# -------------------------------------------------------------------- figures
def pyplot():
  """`matplotlib.pyplot` on the non-interactive Agg backend."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_figure(fig, path: str, *, dpi: int = 100, tight: bool = False) -> None:
  """Writes `fig` to `path` as PNG (atomically; `tight`: `tight_layout` first) and closes it."""
  if tight:
    fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=dpi)
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  plt.close(fig)
  round_loop.atomic_write_bytes(path, buf.getvalue())


# How the reports name the algorithms of the papers' tables.
ALGORITHM_NAMES = {"virtual": "VIRTUAL", "fedavg": "FedAvg", "fedprox": "FedProx", "fedpa": "FedPA",
                   "local": "Local", "global": "Global", "fola": "FOLA"}

# --------------------------------------------------------------------- claims
# A VIRTUAL mean S at most this many percentage points below a baseline's is "comparable".
S_COMPARABLE_PP = 1.0


def mean_difference(a: Tuple[float, float, int], b: Tuple[float, float, int]) -> Tuple[float, float]:
  """`(m_a - m_b, sqrt(s_a^2 / n_a + s_b^2 / n_b))` from two `(mean, sample std, seeds)`.

  The second number is the standard error of the difference of the two means over
  independent seeds (Welch's); with one seed each it is 0.
  """
  (ma, sa, na), (mb, sb, nb) = a, b
  if na < 1 or nb < 1:
    raise ValueError(f"a difference of means needs a seed on each side, got {na} and {nb}.")
  return ma - mb, math.sqrt(sa**2 / na + sb**2 / nb)


def beyond_error(diff: float, se: float) -> int:
  """+1 when `diff > se` (above over these seeds), -1 when `diff < -se`, else 0 (a tie)."""
  return 1 if diff > se else -1 if diff < -se else 0


# ------------------------------------------------------------------- markdown
def mean_std(values: Sequence[Optional[float]],
             scale: float = 1.0) -> Tuple[float, float, int]:
  """`(mean, std with ddof 1, n)` of the finite `values` times `scale` (nan, nan, 0 for none)."""
  v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float) * scale
  if not len(v):
    return float("nan"), float("nan"), 0
  return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v)


def mean_se(values: Sequence[Optional[float]],
            scale: float = 1.0) -> Tuple[float, float, int]:
  """`(mean, standard error, n)` of the finite `values` times `scale` (se nan below two)."""
  m, s, n = mean_std(values, scale)
  return m, (s / math.sqrt(n) if n > 1 else float("nan")), n


def anchor(name: str, title: str) -> List[str]:
  """A section heading with an explicit anchor the coverage table links to."""
  return [f'<a id="{name}"></a>', "", f"### {title}", ""]


def label_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
  """Axis labels, title, a light grid and, where lines are labelled, a small legend."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3, which="both")
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=7)


def md_row(cells: Iterable[Any]) -> str:
  """`| a | b | c |`."""
  return "| " + " | ".join(str(c) for c in cells) + " |"


def md_table(header: Sequence[Any], rows: Iterable[Iterable[Any]] = ()) -> List[str]:
  """The lines of a pipe table: `header`, the `|---|...|` rule, then `rows`."""
  return [md_row(header), "|" + "---|" * len(header)] + [md_row(r) for r in rows]


# ----------------------------------------------------------------- help texts
def flag_help(name: str, *, paper: Any = None, note: str = "") -> str:
  """The help text of the training setting `name` (`tfbfl.driver.settings()`),
  followed by `(note; paper: <paper>)` where given."""
  from tfbfl import driver  # pylint: disable=g-import-not-at-top
  text = driver.settings()[name][1].help
  extra = [s for s in (note, "" if paper is None else f"paper: {paper}") if s]
  if not extra:
    return text
  stop = "." if text.endswith(".") else ""
  return f"{text[:len(text) - len(stop)]} ({'; '.join(extra)}){stop}"

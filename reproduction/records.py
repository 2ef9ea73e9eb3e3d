"""The campaign's records: what one holds, reading them, and values read off them.

A *record* is the small JSON file `<results_dir>/<cell name>.json` that the runner
(`reproduction.runner`) writes when a cell of the catalogue
(`reproduction.reproduce`) finishes: the cell, its flags and command, the commit,
wall time, machine, and the result. The result is what a collector (`COLLECTORS`, one
per launcher) keeps of the launcher's own output files: per-round S/MT accuracy, NLL,
ECE and bytes for training cells (`collect_train`); per-method accuracies for PFNM and
FOLA cells. `read_records` reads every record under a results directory;
`curve_values`, `best_value`, `final_value`, `final_values`, `stopped`, `score_text` and
`wall_seconds` read one record's values, for the catalogue's tuning choices, the
runner's progress lines and estimates, and the report.

A record file holds, besides the record, `sha256`: the checksum of the rest
(`record_text`, `write_record`). `read_records` refuses a record file that is
truncated, not JSON or whose checksum does not match (a flipped bit would otherwise
change a result in silence), naming it; records written before the checksum are read
as they are.

Nothing here knows the catalogue's cells: the catalogue reads record values to choose
its tuned settings, so the records sit below it. This module imports neither
TensorFlow nor absl.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from tfbfl import files
from reproduction import _runs

RECORD_VERSION = 1  # `runner.make_record` writes it; `read_records` passes over others
CHECKSUM = "sha256"  # a record file's checksum of the rest of it (`record_text`)


class DamagedRecord(ValueError):
  """A record file that is truncated, not JSON, or changed since it was written."""


def _digest(rec: Mapping[str, Any]) -> str:
  body = {k: v for k, v in rec.items() if k != CHECKSUM}
  return hashlib.sha256(
      json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def record_text(rec: Mapping[str, Any]) -> str:
  """The text of a record's file: indented JSON, keys sorted, with `CHECKSUM`."""
  return json.dumps(dict(rec, **{CHECKSUM: _digest(rec)}), indent=1, sort_keys=True) + "\n"


def write_record(path: str, rec: Mapping[str, Any]) -> None:
  """Writes `rec` to `path` (`record_text`), whole or not at all (`tfbfl.files`)."""
  files.atomic_write_text(path, record_text(rec))


def read_record(path: str) -> Any:
  """The JSON in the record file `path`, its checksum checked and removed.

  Raises:
    DamagedRecord: one line naming `path`: truncated or not JSON, or its checksum
      does not match (what to do: restore it, or remove it and the cell runs again).
  """
  advice = (f"restore it (git checkout -- {path}) or remove it, and its cell runs again")
  with open(path, "rb") as f:
    raw = f.read()
  try:
    rec = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    what = "empty" if not raw else f"truncated or corrupted: not JSON ({str(e)[:60]})"
    raise DamagedRecord(f"{path}: a damaged campaign record ({what}); {advice}.") from None
  if isinstance(rec, dict) and CHECKSUM in rec:
    if rec[CHECKSUM] != _digest(rec):
      raise DamagedRecord(f"{path}: a damaged campaign record (its checksum does not match: "
                          f"corrupted, or edited by hand); {advice}.")
    rec = {k: v for k, v in rec.items() if k != CHECKSUM}
  return rec


# ------------------------------------------------------------------- reading
def read_records(results_dir: str) -> Dict[str, Dict[str, Any]]:
  """cell name -> record, for every record under `results_dir` (`read_record`: a
  damaged one raises `DamagedRecord` naming it; JSON of another kind is passed over)."""
  out = {}
  if not os.path.isdir(results_dir):
    return out
  for root, _, names in os.walk(results_dir):
    for f in sorted(names):
      if f.endswith(".json"):
        rec = read_record(os.path.join(root, f))
        if isinstance(rec, dict) and rec.get("record_version") == RECORD_VERSION and "cell" in rec:
          out[rec["cell"]["name"]] = rec
  return out


# -------------------------------------------------------- a record's result
def _read_csv(path: str) -> List[Dict[str, str]]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _number(text: str) -> Any:
  try:
    v = float(text)
  except (TypeError, ValueError):
    return text
  return int(v) if v.is_integer() and "." not in str(text) and "e" not in str(text) else v


CURVE_COLUMNS = ("round", "server_accuracy", "server_loss", "server_ece", "mt_accuracy", "mt_loss",
                 "mt_ece", "train_loss", "clients_dropped", "delta_nonzeros", "bytes_up_total",
                 "bytes_down_total",
                 "wall_time_s")
# Curves kept when a run has them: VIRTUAL's variance trajectories (metrics.csv's
# `log_prec_*` columns, `mean_shared_log_precision`) and the fitted temperatures
# (`--temperature_scaling`).
CURVE_PREFIXES = ("log_prec_", "mean_shared_log_precision")
OPTIONAL_CURVES = ("server_temperature", "mt_temperature")
SUMMARY_KEYS = ("best_server_accuracy", "best_mt_accuracy", "final_server_accuracy",
                "final_mt_accuracy", "final_server_nll", "final_mt_nll", "final_server_ece",
                "final_mt_ece", "rounds", "wall_time_s", "bytes_up_total", "bytes_down_total",
                "data_fingerprint", "final_calibration")


def collect_train(output_dir: str) -> Dict[str, Any]:
  """A training cell's result: per-round curves (evaluated rounds) and summary keys."""
  rows = _runs.read_metrics(output_dir)
  extra = sorted({c for r in rows for c in r if c.startswith(CURVE_PREFIXES) or
                  c in OPTIONAL_CURVES})
  curves = {c: [_number(r.get(c, "")) if r.get(c, "") != "" else None for r in rows]
            for c in CURVE_COLUMNS + tuple(extra)}
  summary = _runs.read_json(os.path.join(output_dir, _runs.SUMMARY)) or {}
  return dict(curves=curves, summary={k: summary.get(k) for k in SUMMARY_KEYS})


def collect_csv(name: str) -> Callable[[str], Dict[str, Any]]:
  def collect(output_dir: str) -> Dict[str, Any]:
    rows = _read_csv(os.path.join(output_dir, name))
    return dict(rows=[{k: _number(v) for k, v in r.items()} for r in rows])

  return collect


def collect_fola_curves(output_dir: str) -> Dict[str, Any]:
  """Per method, the learning curve of its run (`<output_dir>/<method>/alpha_*`)."""
  out = {}
  for method in sorted(os.listdir(output_dir)):
    mdir = os.path.join(output_dir, method)
    if not os.path.isdir(mdir):
      continue
    for sub in sorted(os.listdir(mdir)):
      if os.path.exists(os.path.join(mdir, sub, _runs.METRICS)):
        out[method] = collect_train(os.path.join(mdir, sub))
  return dict(methods=out)


def collect_snr_cdf(output_dir: str) -> Dict[str, Any]:
  """Fig. 4's per-layer quantiles of log10 SNR and the CDF curves (`launchers.virtual_snr_cdf`)."""
  return dict(quantiles=collect_csv("fig4_summary.csv")(output_dir)["rows"],
              cdf=collect_csv("fig4_snr_cdf.csv")(output_dir)["rows"])


COLLECTORS: Dict[str, Callable[[str], Dict[str, Any]]] = {
    "train": collect_train,
    "pfnm_batches": collect_csv("trials.csv"),
    "pfnm_depth": collect_csv("trials.csv"),
    "pfnm_streaming": collect_csv("trials.csv"),
    "pfnm_sensitivity": collect_csv("trials.csv"),
    "fola_first_round": collect_csv("first_round.csv"),
    "fola_curves": collect_fola_curves,
    "virtual_snr_cdf": collect_snr_cdf,
}


# ------------------------------------------------------------------- values
def curve_values(rec: Mapping[str, Any], key: str) -> List[float]:
  """A training record's curve `key` on its evaluated rounds."""
  return [v for v in rec["result"]["curves"].get(key, []) if v is not None]


def best_value(rec: Optional[Mapping[str, Any]], key: str) -> float:
  """Max over evaluated rounds of a training record's curve `key` (nan if none)."""
  if rec is None:
    return float("nan")
  vals = curve_values(rec, key)
  return float(max(vals)) if vals else float("nan")


def final_value(rec: Mapping[str, Any], key: str) -> float:
  vals = curve_values(rec, key)
  return float(vals[-1]) if vals else float("nan")


def final_values(recs: Sequence[Mapping[str, Any]], key: str) -> List[float]:
  """`final_value` of each record."""
  return [final_value(r, key) for r in recs]


def clock_at_round(result: Mapping[str, Any], round_num: int) -> float:
  """A training result's clock (metrics.csv's cumulative `wall_time_s`, which a resumed
  run continues from its checkpoint) at the end of round `round_num`; 0.0 where its
  curves do not hold that round."""
  curves = result.get("curves") or {}
  for r, seconds in zip(curves.get("round") or (), curves.get("wall_time_s") or ()):
    if r == round_num and seconds is not None:
      return float(seconds)
  return 0.0


def wall_seconds(rec: Mapping[str, Any]) -> float:
  """The wall time of a record's cell over every invocation that ran it.

  `wall_time_s` itself where the record has `earlier_invocations_wall_time_s` (the
  runner then counted the rounds an earlier invocation checkpointed) or was not
  resumed. A record written before that key, resumed from an earlier invocation's
  checkpoint (`resumed_from_rounds`, one attempt), counted its last invocation only:
  the clock of the round it resumed from is added. Neither counts an earlier
  invocation's start-up or its rounds after its last checkpoint.
  """
  seconds = float(rec["wall_time_s"])
  resumed = rec.get("resumed_from_rounds")
  if resumed and "earlier_invocations_wall_time_s" not in rec and not rec.get("attempts"):
    seconds += clock_at_round(rec["result"], resumed[0])
  return seconds


def stopped(rec: Mapping[str, Any]) -> str:
  """The launcher's one line where the robust rounds stopped the cell's run, else ''."""
  return rec["result"].get("stopped", "")


def score_text(rec: Mapping[str, Any]) -> str:
  """A tuning record's best-round MT accuracy, % (marked where its run stopped)."""
  return f"{100 * best_value(rec, 'mt_accuracy'):.1f}" + (" (stopped)" if stopped(rec) else "")

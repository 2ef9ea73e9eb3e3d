"""VIRTUAL Section IV-F as a library: sparse updates (Table III) and SNR CDFs (Fig. 4).

The launchers `launchers/virtual_sparsity.py` and `launchers/virtual_snr_cdf.py`
are thin absl shells around this module.

* `run_sparsity_table`: trains VIRTUAL and "VIRTUAL + FedAvg init"
  (`fedavg_init=True`) at every pruning percentile (`prune_percentile`: the
  clients zero the entries of `Delta_i` whose SNR is below that percentile), plus
  one FedProx reference run, and writes `table3.md` / `table3.csv`: per
  percentile the measured pruned fraction, the mean size of one client's upload
  per round (non-zero entries of `Delta_i` and bytes, `tfbfl.communication`) and
  the max (over evaluated rounds) MT and S test accuracy of each variant.
* `run_snr_cdf`: trains (or reuses) the two variants, loads the final client
  states from the run's `checkpoint.npz` and computes, per dense layer (kernel
  tensor of the shared network), the empirical CDF of `log10 SNR` pooled over the
  clients' posteriors `q_i(theta)` (`ClientState.shared_posterior`), with
  `SNR = |mu| / sigma = |eta1| / sqrt(eta2)` (`tfbfl.sparsity.snr`). Writes
  `fig4_snr_cdf.png`, `fig4_snr_cdf.csv` and `fig4_summary.csv` (quantiles).

Every run goes through `tfbfl.driver.run_training` into its own directory
`<output_dir>/<method>_p<percentile>` (`fedprox` for the reference) and always
checkpoints its final round, so both launchers can share an `--output_dir`: the
SNR launcher reuses the table's unpruned runs. A run whose `summary.json` exists
with the same flags (`reproduction._runs.same_flags`) is skipped, one whose
checkpoint holds fewer rounds than asked is resumed, so re-running an interrupted
table finishes it.
"""

from __future__ import annotations

import collections.abc
import importlib
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfbfl import client_store
from tfbfl import round_loop
from tfbfl import state_files
from tfbfl import driver
from reproduction import _runs

__all__ = [
    "VARIANTS",
    "LABELS",
    "DEFAULT_PERCENTILES",
    "PASS_THROUGH",
    "RunSpec",
    "run_name",
    "sparsity_specs",
    "ensure_run",
    "run_record",
    "table3_rows",
    "format_table3_md",
    "write_table3",
    "run_sparsity_table",
    "load_final_state",
    "dense_kernel_indices",
    "log10_snr",
    "empirical_cdf",
    "layer_log_snr",
    "cdf_curves",
    "write_cdf_csv",
    "cdf_quantiles",
    "plot_snr_cdf",
    "run_snr_cdf",
    "define_launcher_flags",
    "define_training_flags",
    "params_from_flags",
    "parse_percentiles",
]

# Table III's columns (left to right) and the reference line.
VARIANTS = ("virtual_fedavg_init", "virtual")
LABELS = {
    "virtual_fedavg_init": "VIRTUAL + FedAvg init",
    "virtual": "VIRTUAL",
    "fedprox": "FedProx"
}
DEFAULT_PERCENTILES = (0.0, 50.0, 75.0, 90.0)
TABLE_COLUMNS = ("row", "pruned_percent", "metric", "virtual_fedavg_init", "virtual", "fedprox",
                 "zero_fraction", "delta_nonzeros", "delta_bytes",
                 "delta_nonzeros_virtual_fedavg_init", "delta_nonzeros_virtual",
                 "delta_bytes_virtual_fedavg_init", "delta_bytes_virtual")

# Training flags the launchers pass through to `driver.run_training` unchanged
# (VIRTUAL-specific ones are ignored by FedProx and vice versa).
PASS_THROUGH = ("dataset", "data_dir", "partition", "alpha", "min_size", "classes_per_client",
                "test_fraction", "num_clients", "clients_per_round", "rounds", "epochs_per_round",
                "batch_size", "client_lr", "server_lr", "hidden_units", "seed", "eval_every",
                "precision_step", "kl_weight", "prior_scale", "init_scale", "server_loss_weight",
                "gate_init", "eval_samples", "prune_per_layer", "architecture", "image_shape",
                "filters", "lstm_units", "mu", "scale_optimizer", "scale_lr")

_Log = Callable[[str], None]


# ------------------------------------------------------------------- flags
def define_training_flags(flag_values=None) -> None:
  """absl flags for `PASS_THROUGH` (defaults and help texts: `driver.settings()`,
  via `tfbfl.flags`) plus `--output_dir` and `--fedprox_client_lr`, on
  `flag_values` (default FLAGS)."""
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top
  from tfbfl import flags as tfbfl_flags  # pylint: disable=g-import-not-at-top

  fv = absl_flags.FLAGS if flag_values is None else flag_values
  absl_flags.DEFINE_string("output_dir",
                           None,
                           "Root of the run directories and the report.",
                           flag_values=fv)
  absl_flags.DEFINE_float("fedprox_client_lr",
                          None,
                          "FedProx client learning rate (default: --client_lr).",
                          flag_values=fv)
  # Combinations are checked per run (`driver.resolve_params`), not while parsing.
  tfbfl_flags.define(PASS_THROUGH, flag_values=fv, check_combinations=False)


def define_launcher_flags(flag_values=None) -> None:
  """The flags both launchers share: `define_training_flags`, `--variants`,
  `--round_progress`; `--output_dir` required."""
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top

  fv = absl_flags.FLAGS if flag_values is None else flag_values
  define_training_flags(fv)
  absl_flags.DEFINE_list("variants",
                         list(VARIANTS),
                         f"VIRTUAL variants among {list(VARIANTS)}.",
                         flag_values=fv)
  absl_flags.DEFINE_bool("round_progress",
                         False,
                         "Print one line per round of every run.",
                         flag_values=fv)
  absl_flags.mark_flag_as_required("output_dir", flag_values=fv)


def params_from_flags(fv) -> Dict[str, Any]:
  """The pass-through training flags as a `run_training` params dict."""
  return {name: fv[name].value for name in PASS_THROUGH}


def parse_percentiles(values: Sequence[Any]) -> Tuple[float, ...]:
  """`--percentiles` entries -> sorted unique floats in [0, 100)."""
  out = set()
  for v in values:
    try:
      p = float(v)
    except (TypeError, ValueError) as e:
      raise ValueError(f"--percentiles: {v!r} is not a number.") from e
    if not 0.0 <= p < 100.0:
      raise ValueError(f"--percentiles must be in [0, 100), got {p}.")
    out.add(p)
  if not out:
    raise ValueError("--percentiles needs at least one value.")
  return tuple(sorted(out))


# -------------------------------------------------------------------- runs
class RunSpec:
  """One training run: `method` in VARIANTS or 'fedprox', at `percentile`."""

  def __init__(self, method: str, percentile: Optional[float], params: Dict[str, Any]):
    if method not in LABELS:
      raise ValueError(f"method must be one of {sorted(LABELS)}, got {method!r}.")
    self.method, self.percentile, self.params = method, percentile, dict(params)
    self.name = run_name(method, percentile)

  def __repr__(self):
    return f"RunSpec({self.name})"


def _pct_text(p: float) -> str:
  return f"{p:g}"


def run_name(method: str, percentile: Optional[float]) -> str:
  """Directory name of a run: `virtual_p50`, `virtual_fedavg_init_p0`, `fedprox`."""
  if method == "fedprox":
    return "fedprox"
  return f"{method}_p{_pct_text(float(percentile))}"


def _variant_params(base: Dict[str, Any], method: str, percentile: float) -> Dict[str, Any]:
  p = dict(base)
  p.pop("fedprox_client_lr", None)
  p.update(algorithm="virtual",
           fedavg_init=(method == "virtual_fedavg_init"),
           prune_percentile=float(percentile))
  return p


def sparsity_specs(base: Dict[str, Any],
                   percentiles: Sequence[float],
                   variants: Sequence[str] = VARIANTS,
                   fedprox: bool = True) -> List[RunSpec]:
  """The runs of Table III: each variant at each percentile, then FedProx."""
  for v in variants:
    if v not in VARIANTS:
      raise ValueError(f"variants must be among {VARIANTS}, got {v!r}.")
  specs = [RunSpec(m, float(q), _variant_params(base, m, q)) for q in percentiles for m in variants]
  if fedprox:
    p = dict(base)
    lr = p.pop("fedprox_client_lr", None)
    if lr is not None:
      p["client_lr"] = lr
    p["algorithm"] = "fedprox"
    specs.append(RunSpec("fedprox", None, p))
  return specs


def _checkpoint_round(run_dir: str) -> Optional[int]:
  path = os.path.join(run_dir, round_loop.CHECKPOINT)
  if not os.path.exists(path):
    return None
  try:
    return int(state_files.read_meta(path)["round"])
  except (ValueError, KeyError, TypeError):  # unreadable or not a checkpoint: start afresh
    return None


def _run_params(spec: RunSpec, output_dir: str, round_progress: bool = False):
  """(`run_training` params of `spec`, its resolved flags: those a matching
  summary.json holds, `_runs.same_flags`)."""
  # A run trained (again) replaces what its directory holds; a resumed one keeps it.
  params = dict(spec.params,
                output_dir=os.path.join(output_dir, spec.name),
                verbose=round_progress,
                resume=False,
                overwrite=True,
                export=False)  # a sweep: `launchers.export` writes a run's models later
  params["checkpoint_every"] = int(params.get("rounds") or driver.DEFAULTS["rounds"])
  return params, driver.resolve_params(params)


def ensure_run(
    spec: RunSpec,
    output_dir: str,
    *,
    log: Optional[_Log] = None,
    runner: Callable[[Dict[str, Any]], Dict[str, Any]] = driver.run_training,
    round_progress: bool = False,
    require_checkpoint: bool = False,
) -> Tuple[Dict[str, Any], str]:
  """Returns `(summary, how)` of `spec` in `<output_dir>/<spec.name>`.

  `how` is 'reused' (summary.json with the same flags), 'resumed' (from a
  checkpoint of the same flags with fewer rounds) or 'trained'. Every run
  checkpoints its final round (`checkpoint.npz`, read by `load_final_state`).
  `round_progress`: print the driver's line per round. `require_checkpoint`: a
  finished run counts only if its checkpoint holds the final round.
  """
  log = log or _runs.log_line
  run_dir = os.path.join(output_dir, spec.name)
  params, want = _run_params(spec, output_dir, round_progress)
  summary = _runs.read_json(os.path.join(run_dir, _runs.SUMMARY))
  ckpt_round = _checkpoint_round(run_dir)
  if summary is not None and _runs.same_flags(summary.get("flags", {}), want):
    if not require_checkpoint or ckpt_round == int(summary.get("rounds", -1)):
      return summary, "reused"
    log(f"  {spec.name}: finished run has no final checkpoint; training afresh")
    return runner(params), "trained"
  if ckpt_round is not None:
    # Interrupted (checkpoint, no summary), or finished with fewer rounds.
    same_but_rounds = summary is not None and _runs.same_flags(
        summary.get("flags", {}), want, ignore=("rounds",))
    if ((summary is None and ckpt_round <= want["rounds"]) or
        (same_but_rounds and ckpt_round < want["rounds"])):
      try:
        return runner(dict(params, resume=True, overwrite=False)), "resumed"
      except ValueError as e:  # checkpoint written with other flags
        log(f"  {spec.name}: cannot resume ({e}); training afresh")
  if summary is not None:
    log(f"  {spec.name}: existing run has other flags; training afresh")
  return runner(params), "trained"


def _mean_column(rows, key) -> Optional[float]:
  vals = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
  return float(np.mean(vals)) if vals else None


def run_record(spec: RunSpec,
               summary: Dict[str, Any],
               run_dir: Optional[str] = None,
               metrics_rows: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
  """One run's Table III numbers.

  Per client and round: `delta_bytes` (mean upload, `bytes_up_total / (rounds *
  C)`), `delta_nonzeros` (mean of metrics.csv's `delta_nonzeros / C` over the
  evaluated rounds; FedProx: its dense parameter count) and, for VIRTUAL,
  `delta_entries` (the dense delta's size, `bytes_down / 8`: two float32 natural
  parameters per weight) and `zero_fraction = 1 - delta_nonzeros / delta_entries`.
  """
  if metrics_rows is None:
    metrics_rows = _runs.read_metrics(run_dir, missing_ok=True) if run_dir else []
  flags = summary.get("flags", {})
  rounds = int(summary.get("rounds") or flags.get("rounds") or 0)
  per_round = int(
      flags.get("clients_per_round") or
      round_loop.default_clients_per_round(driver.DEFAULTS["num_clients"]))
  uploads = rounds * per_round
  per_client = lambda total: (float(total) / uploads) if total is not None and uploads else None
  delta_bytes = per_client(summary.get("bytes_up_total"))
  down = per_client(summary.get("bytes_down_total"))
  nnz = _mean_column(_runs.evaluated(metrics_rows), "delta_nonzeros")
  nnz = nnz / per_round if nnz is not None else None
  entries = pruned = None
  if spec.method == "fedprox":
    # Dense float32 weights each way.
    entries = down / 4.0 if down is not None else None
    if nnz is None:
      nnz = delta_bytes / 4.0 if delta_bytes is not None else None
  else:
    entries = down / 8.0 if down is not None else None
    if nnz is not None and entries:
      pruned = 1.0 - nnz / entries
  return dict(method=spec.method,
              percentile=spec.percentile,
              run=spec.name,
              max_mt_accuracy=float(summary["best_mt_accuracy"]),
              max_s_accuracy=float(summary["best_server_accuracy"]),
              delta_bytes=delta_bytes,
              delta_nonzeros=nnz,
              delta_entries=entries,
              zero_fraction=pruned,
              rounds=rounds,
              wall_time_s=summary.get("wall_time_s"))


# ------------------------------------------------------------------ table
def _mean_of(values) -> Optional[float]:
  vals = [v for v in values if v is not None]
  return float(np.mean(vals)) if vals else None


def table3_rows(records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Table III in CSV form: per percentile an MT and an S row (accuracies in %),
  then FedProx's MT and S rows. Delta sizes are per client and round, averaged
  over the variants of a row (per-variant values in their own columns)."""
  by_pct: Dict[float, Dict[str, Dict[str, Any]]] = {}
  fedprox = None
  for r in records:
    if r["method"] == "fedprox":
      fedprox = r
    else:
      by_pct.setdefault(float(r["percentile"]), {})[r["method"]] = r
  rows = []
  for pct in sorted(by_pct):
    runs = by_pct[pct]
    common = dict(row=f"{_pct_text(pct)}%",
                  pruned_percent=pct,
                  zero_fraction=_mean_of(r["zero_fraction"] for r in runs.values()),
                  delta_nonzeros=_mean_of(r["delta_nonzeros"] for r in runs.values()),
                  delta_bytes=_mean_of(r["delta_bytes"] for r in runs.values()))
    for v in VARIANTS:
      common[f"delta_nonzeros_{v}"] = runs[v]["delta_nonzeros"] if v in runs else None
      common[f"delta_bytes_{v}"] = runs[v]["delta_bytes"] if v in runs else None
    for metric, key in (("MT", "max_mt_accuracy"), ("S", "max_s_accuracy")):
      row = dict(common, metric=metric)
      for v in VARIANTS:
        row[v] = 100.0 * runs[v][key] if v in runs else None
      rows.append(row)
  if fedprox is not None:
    for metric, key in (("MT", "max_mt_accuracy"), ("S", "max_s_accuracy")):
      rows.append(
          dict(row="FedProx",
               pruned_percent=None,
               metric=metric,
               fedprox=100.0 * fedprox[key],
               zero_fraction=0.0,
               delta_nonzeros=fedprox["delta_nonzeros"],
               delta_bytes=fedprox["delta_bytes"]))
  return rows


def _human(n: Optional[float], unit: str = "") -> str:
  if n is None:
    return "-"
  for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(n) >= size:
      return f"{n / size:.3g}{suffix}{unit}"
  return f"{n:.3g}{unit}"


def _acc(v: Optional[float]) -> str:
  return "-" if v is None else f"{v:.1f}"


def format_table3_md(rows: Sequence[Dict[str, Any]], title: str = "") -> str:
  """Markdown of `table3_rows` shaped like the paper's Table III."""
  lines = []
  if title:
    lines += [title, ""]
  fed = [r for r in rows if r["row"] == "FedProx"]

  def sizes(r):  # Delta's size, on a percentile's (or FedProx's) first (MT) row only
    first = r["metric"] == "MT"
    return ((_human(r["delta_nonzeros"]), _human(r["delta_bytes"], "B")) if first else ("", ""))

  def zeros(r):
    frac = r["zero_fraction"]
    if r["metric"] != "MT":
      return ""
    return "-" if frac is None else f"{100 * frac:.1f}%"

  lines += _runs.md_table(
      ("% pruned weights", "zero entries (measured)", "Delta size (non-zeros)",
       "Delta size (bytes)", "Acc", "VIRTUAL + FedAvg init", "VIRTUAL"),
      [(r["row"] if r["metric"] == "MT" else "", zeros(r), *sizes(r), r["metric"],
        _acc(r["virtual_fedavg_init"]), _acc(r["virtual"])) for r in rows if r["row"] != "FedProx"])
  if fed:
    lines += [""] + _runs.md_table(
        ("Reference (no pruning)", "Delta size (non-zeros)", "Delta size (bytes)", "Acc",
         "FedProx"), [("FedProx (dense)" if r["metric"] == "MT" else "", *sizes(r), r["metric"],
                       _acc(r["fedprox"])) for r in fed])
  lines += [
      "", "Accuracies: max over evaluated rounds, in %. Delta size: mean upload of one "
      "client in one round (VIRTUAL: non-zero entries of Delta_i, each two float32 natural "
      "parameters, sent sparse with an int32 index when pruned; FedProx: dense float32 "
      "weights). Zero entries: 1 - non-zeros / entries of the dense Delta_i (pruned, plus "
      "entries that did not change)."
  ]
  return "\n".join(lines) + "\n"


def write_table3(output_dir: str, records: Sequence[Dict[str, Any]], title: str = "") -> str:
  """Writes `table3.csv` and `table3.md` (atomically); returns the markdown."""
  rows = table3_rows(records)
  round_loop.write_csv(os.path.join(output_dir, "table3.csv"), rows, TABLE_COLUMNS)
  md = format_table3_md(rows, title)
  round_loop.atomic_write_text(os.path.join(output_dir, "table3.md"), md)
  return md


def _describe(base: Dict[str, Any]) -> str:
  p = driver.resolve_params(dict(base))
  return (f"{p['dataset']}, {p['partition']}, K={p['num_clients']}, C={p['clients_per_round']}, "
          f"{p['rounds']} rounds, E={p['epochs_per_round']}, hidden {list(p['hidden_units'])}, "
          f"seed {p['seed']}")


def run_sparsity_table(base: Dict[str, Any],
                       percentiles: Sequence[float],
                       output_dir: str,
                       *,
                       variants: Sequence[str] = VARIANTS,
                       fedprox: bool = True,
                       log: Optional[_Log] = None,
                       report_only: bool = False,
                       runner: Callable[[Dict[str, Any]], Dict[str, Any]] = driver.run_training,
                       round_progress: bool = False) -> Tuple[List[Dict[str, Any]], str]:
  """Runs (or reuses) every Table III run; writes the table. Returns (records, md)."""
  log = log or _runs.log_line
  specs = sparsity_specs(base, percentiles, variants, fedprox)
  records, start = [], time.time()
  for i, spec in enumerate(specs, 1):
    run_dir = os.path.join(output_dir, spec.name)
    if report_only:
      summary = _runs.read_json(os.path.join(run_dir, _runs.SUMMARY))
      if summary is None:
        log(f"[{i}/{len(specs)}] {spec.name}: no result yet, left out")
        continue
      if not _runs.same_flags(summary.get("flags", {}), _run_params(spec, output_dir)[1]):
        log(f"[{i}/{len(specs)}] {spec.name}: run with other flags, left out")
        continue
      how = "reused"
    else:
      log(f"[{i}/{len(specs)}] {spec.name}: {LABELS[spec.method]}" +
          (f", prune {_pct_text(spec.percentile)}%" if spec.percentile is not None else "") +
          " ...")
      t0 = time.time()
      summary, how = ensure_run(spec,
                                output_dir,
                                log=log,
                                runner=runner,
                                round_progress=round_progress)
    rec = run_record(spec, summary, run_dir)
    records.append(rec)
    elapsed = time.time() - start
    log(f"[{i}/{len(specs)}] {spec.name} {how}: max MT {rec['max_mt_accuracy']:.4f} "
        f"max S {rec['max_s_accuracy']:.4f}, delta {_human(rec['delta_nonzeros'])} non-zeros "
        f"{_human(rec['delta_bytes'], 'B')} per client-round" +
        ("" if report_only else f" ({time.time() - t0:.1f} s; elapsed {elapsed / 60:.1f} min)"))
  title = f"Table III (VIRTUAL Sec. IV-F) on {_describe(base)}"
  md = write_table3(output_dir, records, title)
  return records, md


# ------------------------------------------------------------------- SNR CDF
def load_final_state(run_dir: str) -> Dict[str, Any]:
  """The driver state in `<run_dir>/checkpoint.npz` (incl. `clients`, a dict
  client index -> state; a disk store's snapshot is read into it), read with
  `tfbfl.state_files.load` (checked; never unpickled)."""
  path = os.path.join(run_dir, round_loop.CHECKPOINT)
  importlib.import_module("tfbfl.algorithms.virtual")  # its state types, for state_files.load
  state, _ = state_files.load(path)
  snapshot = state.pop("client_snapshot", None)
  if snapshot is not None:
    snap = client_store.DiskClientStore(os.path.join(run_dir, snapshot))
    state["clients"] = dict(snap.items())
  return state


def _leaves(structure) -> List[np.ndarray]:
  if isinstance(structure, (list, tuple)) and not hasattr(structure, "shape"):
    out = []
    for s in structure:
      out += _leaves(s)
    return out
  if isinstance(structure, dict):
    out = []
    for k in sorted(structure):
      out += _leaves(structure[k])
    return out
  return [np.asarray(structure)]


def _eta(posterior) -> Tuple[List[np.ndarray], List[np.ndarray]]:
  eta1 = posterior.eta1 if hasattr(posterior, "eta1") else posterior[0]
  eta2 = posterior.eta2 if hasattr(posterior, "eta2") else posterior[1]
  return _leaves(eta1), _leaves(eta2)


def log10_snr(posterior) -> List[np.ndarray]:
  """Per leaf, `log10(|mu| / sigma) = log10(|eta1| / sqrt(eta2))` (numpy; as
  `tfbfl.sparsity.snr`). Exact zeros give -inf."""
  eta1, eta2 = _eta(posterior)
  with np.errstate(divide="ignore"):
    return [
        np.log10(np.abs(np.asarray(a, np.float64))) - 0.5 * np.log10(np.asarray(b, np.float64))
        for a, b in zip(eta1, eta2)
    ]


def dense_kernel_indices(posterior) -> List[int]:
  """Leaf indices of the dense layers' kernels (rank-2 leaves) of a shared posterior."""
  eta1, _ = _eta(posterior)
  return [i for i, a in enumerate(eta1) if a.ndim == 2]


def empirical_cdf(values, grid=None) -> Tuple[np.ndarray, np.ndarray]:
  """Empirical CDF `F(x) = #{v <= x} / n` of `values` (NaN dropped; -inf, the
  log SNR of a zero mean, counts as below every x): at the sorted finite values
  (default) or at `grid`. Returns (x, F)."""
  v = np.sort(np.asarray(values, np.float64).ravel())
  v = v[~np.isnan(v)]
  if v.size == 0:
    raise ValueError("empirical_cdf needs at least one value.")
  if grid is None:
    f = np.arange(1, v.size + 1, dtype=np.float64) / v.size
    keep = np.isfinite(v)
    return v[keep], f[keep]
  x = np.asarray(grid, np.float64)
  return x, np.searchsorted(v, x, side="right") / v.size


def layer_log_snr(client_states, trained_only: bool = True) -> Dict[int, np.ndarray]:
  """Dense kernel leaf index -> log10 SNR pooled over the clients' shared
  posteriors (`state.shared_posterior`). `trained_only`: skip clients never
  selected (their posterior is the initial one) when any client was trained."""
  states = list(client_states.values()) if isinstance(
      client_states, collections.abc.Mapping) else list(client_states)
  if trained_only and any(bool(np.asarray(getattr(s, "trained", True))) for s in states):
    states = [s for s in states if bool(np.asarray(getattr(s, "trained", True)))]
  if not states:
    raise ValueError("no client states.")
  kernels = dense_kernel_indices(states[0].shared_posterior)
  pooled: Dict[int, List[np.ndarray]] = {i: [] for i in kernels}
  for s in states:
    snrs = log10_snr(s.shared_posterior)
    for i in kernels:
      pooled[i].append(snrs[i].ravel())
  return {i: np.concatenate(v) for i, v in pooled.items()}


def cdf_curves(per_variant: Dict[str, Dict[int, np.ndarray]],
               num_points: int = 200,
               shapes: Optional[Dict[int, Tuple[int, ...]]] = None) -> List[Dict[str, Any]]:
  """CDF rows `{layer, leaf, shape, variant, log10_snr, snr_db, cdf}` on a common
  grid per layer (spanning every variant's finite values)."""
  rows = []
  layers = sorted({i for d in per_variant.values() for i in d})
  for layer_num, leaf in enumerate(layers, 1):
    finite = [v[np.isfinite(v)] for d in per_variant.values() if leaf in d for v in [d[leaf]]]
    lo = min(float(v.min()) for v in finite if v.size)
    hi = max(float(v.max()) for v in finite if v.size)
    grid = np.linspace(lo, hi, num_points) if hi > lo else np.array([lo])
    for variant, d in per_variant.items():
      if leaf not in d:
        continue
      x, f = empirical_cdf(d[leaf], grid)
      shape = "x".join(str(s) for s in (shapes or {}).get(leaf, ()))
      for xi, fi in zip(x, f):
        rows.append(
            dict(layer=layer_num,
                 leaf=leaf,
                 shape=shape,
                 variant=variant,
                 log10_snr=xi,
                 snr_db=10.0 * xi,
                 cdf=fi))
  return rows


def write_cdf_csv(path: str, rows: Sequence[Dict[str, Any]]) -> None:
  round_loop.write_csv(path, rows,
                       ("layer", "leaf", "shape", "variant", "log10_snr", "snr_db", "cdf"))


def cdf_quantiles(
    per_variant: Dict[str, Dict[int, np.ndarray]],
    quantiles: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 0.9)
) -> List[Dict[str, Any]]:
  """Per layer and variant: number of weights and quantiles of log10 SNR."""
  rows = []
  layers = sorted({i for d in per_variant.values() for i in d})
  for layer_num, leaf in enumerate(layers, 1):
    for variant, d in per_variant.items():
      if leaf not in d:
        continue
      v = d[leaf][np.isfinite(d[leaf])]
      row = dict(layer=layer_num, leaf=leaf, variant=variant, num_weights=int(d[leaf].size))
      for q in quantiles:
        row[f"q{int(round(100 * q))}_log10_snr"] = float(np.quantile(v, q))
      rows.append(row)
  return rows


def plot_snr_cdf(path: str, rows: Sequence[Dict[str, Any]], title: str = "") -> None:
  """Fig. 4: one panel per dense layer, one CDF per variant (PNG, Agg)."""
  plt = _runs.pyplot()
  layers = sorted({(r["layer"], r["shape"]) for r in rows})
  fig, axes = plt.subplots(1,
                           max(len(layers), 1),
                           figsize=(4.2 * max(len(layers), 1), 3.6),
                           squeeze=False)
  styles = {"virtual": dict(color="C0", ls="-"), "virtual_fedavg_init": dict(color="C3", ls="--")}
  # VIRTUAL first, so that a dashed curve on top stays visible where they coincide.
  variants = sorted(dict.fromkeys(r["variant"] for r in rows), key=lambda v: v != "virtual")
  for ax, (layer, shape) in zip(axes[0], layers):
    lows = []
    for variant in variants:
      pts = [r for r in rows if r["layer"] == layer and r["variant"] == variant]
      if pts:
        ax.step([r["snr_db"] for r in pts], [r["cdf"] for r in pts],
                where="post",
                label=LABELS.get(variant, variant),
                **styles.get(variant, {}))
        lows.append(next(r["snr_db"] for r in pts if r["cdf"] >= 0.002))
    x_max = max(r["snr_db"] for r in rows if r["layer"] == layer)
    if lows and min(lows) < x_max:  # hide the long empty left tail (< 0.2% of weights)
      ax.set_xlim(min(lows) - 0.05 * (x_max - min(lows)), x_max + 0.05 * (x_max - min(lows)))
    ax.set_title(f"dense layer {layer}" + (f" ({shape})" if shape else ""))
    ax.set_xlabel("SNR = |mu|/sigma  [dB, 10 log10]")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("CDF over all clients' weights")
  axes[0][0].legend(loc="upper left", fontsize=8)
  if title:
    fig.suptitle(title, fontsize=9)
  _runs.save_figure(fig, path, dpi=110, tight=True)


def run_snr_cdf(base: Dict[str, Any],
                output_dir: str,
                *,
                percentile: float = 0.0,
                variants: Sequence[str] = VARIANTS,
                num_points: int = 400,
                log: Optional[_Log] = None,
                runner: Callable[[Dict[str, Any]], Dict[str, Any]] = driver.run_training,
                round_progress: bool = False) -> Dict[str, Any]:
  """Trains (or reuses) the variants at `percentile`, then writes Fig. 4 and its
  data. Returns {per_variant: {variant: {leaf: log10 snr}}, rows, quantiles}."""
  log = log or _runs.log_line
  specs = sparsity_specs(base, [percentile], variants, fedprox=False)
  per_variant: Dict[str, Dict[int, np.ndarray]] = {}
  shapes: Dict[int, Tuple[int, ...]] = {}
  for i, spec in enumerate(specs, 1):
    log(f"[{i}/{len(specs)}] {spec.name}: {LABELS[spec.method]} ...")
    t0 = time.time()
    summary, how = ensure_run(spec,
                              output_dir,
                              log=log,
                              runner=runner,
                              round_progress=round_progress,
                              require_checkpoint=True)
    run_dir = os.path.join(output_dir, spec.name)
    state = load_final_state(run_dir)
    if int(state["round"]) != int(summary["rounds"]):
      raise RuntimeError(f"{run_dir}: checkpoint is at round {state['round']}, the run has "
                         f"{summary['rounds']} rounds; delete the directory and re-run.")
    per_variant[spec.method] = layer_log_snr(state["clients"])
    first = next(iter(state["clients"].values()))
    eta1, _ = _eta(first.shared_posterior)
    shapes.update({leaf: tuple(eta1[leaf].shape) for leaf in per_variant[spec.method]})
    med = ", ".join(
        f"{np.median(v[np.isfinite(v)]):.2f}" for v in per_variant[spec.method].values())
    log(f"[{i}/{len(specs)}] {spec.name} {how} ({time.time() - t0:.1f} s): max MT "
        f"{summary['best_mt_accuracy']:.4f} S {summary['best_server_accuracy']:.4f}; "
        f"median log10 SNR per dense layer: {med}")
  rows = cdf_curves(per_variant, num_points, shapes)
  quantiles = cdf_quantiles(per_variant)
  write_cdf_csv(os.path.join(output_dir, "fig4_snr_cdf.csv"), rows)
  round_loop.write_csv(os.path.join(output_dir, "fig4_summary.csv"), quantiles,
                       list(quantiles[0]) if quantiles else ["layer"])
  plot_snr_cdf(os.path.join(output_dir, "fig4_snr_cdf.png"),
               rows,
               title=f"CDF of client posterior SNR (Fig. 4): {_describe(base)}" +
               (f", prune {_pct_text(percentile)}%" if percentile else ""))
  return dict(per_variant=per_variant, rows=rows, quantiles=quantiles)

"""The hyperparameter grid of VIRTUAL's Table II / Figs. 2-3, resumable, and its report.

Grid (VIRTUAL, Sec. IV-B, IV-D and App. D): for every dataset spec and algorithm,
the product of

* 5 log-spaced client learning rates (all algorithms);
* VIRTUAL: the KL multipliers beta (`kl_weight`) {1e-6, 1e-5, 1e-4, 1e-3} x the
  paper's server step grid (`virtual_server_lrs`) {0.2, 0.4, 0.6, 0.8, 1.0}. The
  step is VIRTUAL's damped-EP step alpha, applied alike to the server posterior
  and to the client factors (`tfbfl/algorithms/virtual/`), so it lies in (0, 1];
* FedAvg, FedProx: server learning rates {0.2, 0.4, ..., 1.0};
* FedProx: 5 log-spaced proximal strengths mu > 0 (mu = 0 is FedAvg);
* FedPA (posterior averaging, `tfbfl.algorithms.fedpa`): FedAvg's grid, its own
  settings (shrinkage, burn-ins) at their defaults;
* Local, Global: client learning rate only;

each repeated for every seed in `seeds` (the seed also draws the partition and
the train/test split, as the 5 splits of VIRTUAL v1 Table 2).

VIRTUAL appears twice, tuned over the same values: `virtual` runs with
`server_loss_weight=1` (the server network's own cross-entropy added to the
client loss; label "VIRTUAL (w_S=1)") and `virtual_eq3` runs with
`server_loss_weight=0`, the paper's objective eq. (3) (label "VIRTUAL eq. 3
(w_S=0)"). Both set the weight explicitly, so the labels hold whatever
`tfbfl.driver`'s default; `--fixed` may not set it.

A *cell* is one run: (dataset spec, algorithm, hyperparameters, seed). It runs via
`tfbfl.driver.run_training` in its own output directory
`<output_dir>/<dataset>/<algorithm>/<cell key>/` and its result (the run's flags,
summary and per-round S/MT loss and accuracy curves) is written atomically to
`result.json` there. A cell whose `result.json` exists with the same flags is
not run again (`reproduction._runs.finished_run`: flags that only say where
or how a run is written do not count), so an interrupted grid resumes where it
stopped (a cell cut off mid-run starts over). One progress line per finished cell (cell i/N, dataset,
algorithm, hyperparameters and seed, best S and MT, seconds, ETA); the first
line gives the number of cells and a rough time estimate (`estimate_seconds`).

Selection (Table II reports "max accuracy at convergence"): a cell's score is the
run's best-round accuracy (`best_server_accuracy` for S, `best_mt_accuracy` for
MT); a *configuration* (a cell without its seed) scores the mean over its seeds;
per (dataset, algorithm) the configuration with the largest mean S and, separately,
the one with the largest mean MT win (ties: first in grid order). A configuration
whose last-round S (MT) loss is not finite on some seed diverged: it has no
accuracy "at convergence" and wins S (MT) only if all configurations diverged
(then marked † in the table). Std is the sample standard deviation over seeds
(ddof = 1; 0 with a single seed).

Report files in `output_dir`: `table2.md`, `table2.csv` (rows dataset x
algorithm; S and MT mean +- std and the winning hyperparameters), `fig3.png`
(S and MT test cross-entropy per round, log scale, one column per dataset, the
winning configurations, mean over seeds) and `fig2.png` (VIRTUAL's beta sweep:
S and MT cross-entropy per round, one line per beta, the other hyperparameters
fixed at the best-MT configuration). Below the table, `table2.md` states per paper
claim "held" or "not held" with the numbers (`paper_claims`): (a) VIRTUAL MT above
FedAvg MT on every non-IID dataset (beyond the standard error of the difference
over seeds, the reproduction report's rule), (b) S comparable (VIRTUAL's mean S >= FedAvg's
- 1 percentage point), (c) PMNIST the exception (on the permuted partition VIRTUAL
beats FedAvg on neither S nor MT), each for `virtual` and `virtual_eq3`.

`--quick` (`plan(quick=True)`: `QUICK_GRID`, `QUICK_PARAMS`, `QUICK_ALGORITHMS`):
a seeded reduced protocol, one configuration per algorithm: digits homogeneous,
class_dirichlet and permuted; seeds {0, 1, 2}; `virtual`, `virtual_eq3`, `fedavg`;
client lr 0.05, beta 1e-4, VIRTUAL step 0.1 (VIRTUAL's default 1/C,
`virtual.default_step`, at the default C = 10), FedAvg server lr 1.0; 10 rounds (E, B, C unchanged): 3 x 3 x 3 = 27 cells, 18 of them
VIRTUAL (~40-60 s each on a quiet 2-core machine) and 9 FedAvg (~3 s): about
13-19 minutes. Explicit flags still override.

Dataset specs: `name[:partition][:key=value...]` with `name` a preset of
`reproduction.presets` (`digits_dirichlet`, `femnist_mlp`, ...) or a dataset of
`tfbfl.data.DATASETS`, e.g. `digits:class_dirichlet`, `digits:class_dirichlet:alpha=0.1`,
`npz:data_dir=/data/clients.npz`; keys are `tfbfl.driver` flags. A cell's flags:
the preset, overridden by the launcher's shared flags (`--rounds`, `--fixed`, ...),
overridden by the spec's own partition and `key=value` parts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from tfbfl import data as data_lib
from tfbfl import driver
from reproduction import presets
from tfbfl import round_loop
from tfbfl.algorithms import virtual
from reproduction import _runs

RESULT_FILE = "result.json"
DEFAULT_DATASETS = ("digits:homogeneous", "digits:class_dirichlet", "digits:permuted")
ALGORITHMS = ("virtual", "virtual_eq3", "fedavg", "fedprox", "fedpa", "local", "global")
QUICK_ALGORITHMS = ("virtual", "virtual_eq3", "fedavg")
# Grid algorithm name -> (tfbfl.driver algorithm, flags it fixes). The VIRTUAL
# variants differ only in the weight of the server network's own loss.
VARIANTS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "virtual": ("virtual", dict(server_loss_weight=1.0)),
    "virtual_eq3": ("virtual", dict(server_loss_weight=0.0)),
}
VIRTUAL_ALGORITHMS = tuple(VARIANTS)
LABELS = dict(_runs.ALGORITHM_NAMES, virtual="VIRTUAL (w_S=1)",
              virtual_eq3="VIRTUAL eq. 3 (w_S=0)")
# Hyperparameters each algorithm is tuned over (cell-key order).
TUNED = {
    "virtual": ("client_lr", "kl_weight", "server_lr"),
    "virtual_eq3": ("client_lr", "kl_weight", "server_lr"),
    "fedavg": ("client_lr", "server_lr"),
    "fedprox": ("client_lr", "mu", "server_lr"),
    "fedpa": ("client_lr", "server_lr"),  # FedPA's own settings at their defaults
    "local": ("client_lr",),
    "global": ("client_lr",),
}
# Flags the grid sets per cell: neither --fixed nor a dataset spec may set them.
GRID_SET = ("algorithm", "seed", "output_dir", "client_lr", "kl_weight", "mu", "server_lr",
            "server_loss_weight")
CURVE_KEYS = ("server_loss", "mt_loss", "server_accuracy", "mt_accuracy")


def log_spaced(low: float, high: float, num: int) -> Tuple[float, ...]:
  """`num` log-spaced values from `low` to `high` (rounded to 3 significant digits)."""
  if not 0 < low <= high:
    raise ValueError(f"log-spaced grid needs 0 < low <= high, got {low}, {high}.")
  return tuple(float(f"{v:.3g}") for v in np.geomspace(low, high, num))


@dataclasses.dataclass(frozen=True)
class GridSpec:
  """The hyperparameter values of the grid (see the module docstring)."""
  client_lrs: Tuple[float, ...] = log_spaced(3e-3, 3e-1, 5)
  kl_weights: Tuple[float, ...] = log_spaced(1e-6, 1e-3, 4)
  mus: Tuple[float, ...] = log_spaced(1e-3, 1.0, 5)
  server_lrs: Tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
  # VIRTUAL's damped-EP step alpha (server and client factors alike): the paper's grid.
  virtual_server_lrs: Tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
  seeds: Tuple[int, ...] = (0,)

  def __post_init__(self):
    for name in ("client_lrs", "kl_weights", "mus", "server_lrs", "virtual_server_lrs", "seeds"):
      if not getattr(self, name):
        raise ValueError(f"--{name} must not be empty.")
    for name in ("client_lrs", "server_lrs", "virtual_server_lrs", "mus"):
      bad = [v for v in getattr(self, name) if not v > 0]
      if bad:
        raise ValueError(f"--{name} must all be > 0, got {bad}.")
    if any(v < 0 for v in self.kl_weights):
      raise ValueError(f"--kl_weights must all be >= 0, got {self.kl_weights}.")
    bad = [v for v in self.virtual_server_lrs if v > 1]
    if bad:
      raise ValueError(
          f"--virtual_server_lrs (VIRTUAL's damped-EP step) must be in (0, 1], got {bad}.")

  def values(self, algorithm: str) -> Dict[str, Tuple[Any, ...]]:
    """Hyperparameter name -> values tried for `algorithm`."""
    table = dict(
        client_lr=self.client_lrs,
        kl_weight=self.kl_weights,
        mu=self.mus,
        server_lr=(self.virtual_server_lrs if algorithm in VIRTUAL_ALGORITHMS else self.server_lrs))
    return {name: table[name] for name in TUNED[algorithm]}


# `--quick`: one configuration per algorithm, 3 seeds (rounds come from QUICK_PARAMS;
# datasets DEFAULT_DATASETS, algorithms QUICK_ALGORITHMS).
QUICK_GRID = GridSpec(client_lrs=(0.05,),
                      kl_weights=(1e-4,),
                      mus=(0.01,),
                      server_lrs=(1.0,),
                      virtual_server_lrs=(virtual.default_step(
                          round_loop.default_clients_per_round(driver.DEFAULTS["num_clients"])),),
                      seeds=(0, 1, 2))
QUICK_PARAMS = dict(rounds=10)


def make_grid(quick: bool = False, **overrides) -> GridSpec:
  """The full (or `--quick`) grid with the non-None `overrides` (GridSpec fields)."""
  base = QUICK_GRID if quick else GridSpec()
  given = {k: tuple(v) for k, v in overrides.items() if v is not None}
  unknown = set(given) - {f.name for f in dataclasses.fields(GridSpec)}
  if unknown:
    raise ValueError(f"unknown grid fields {sorted(unknown)}.")
  return dataclasses.replace(base, **given)


def default_algorithms(quick: bool = False) -> Tuple[str, ...]:
  """The algorithms run when none are given: `QUICK_ALGORITHMS` under `--quick`."""
  return QUICK_ALGORITHMS if quick else ALGORITHMS


def make_fixed(quick: bool = False, **params) -> Dict[str, Any]:
  """Flags shared by all cells: `QUICK_PARAMS` under `--quick`, then the non-None `params`."""
  fixed = dict(QUICK_PARAMS) if quick else {}
  fixed.update({k: v for k, v in params.items() if v is not None})
  unknown = set(fixed) - set(driver.DEFAULTS)
  if unknown:
    raise ValueError(f"unknown training flags {sorted(unknown)}.")
  tuned = set(fixed) & (set(GRID_SET) | {"dataset", "partition"})
  if tuned:
    raise ValueError(f"--fixed must not set {sorted(tuned)}: the grid (or --datasets) sets them.")
  return fixed


# ------------------------------------------------------------ dataset specs
def _convert(name: str, text: str):
  """Parses `text` as the type of `driver.DEFAULTS[name]`."""
  default = driver.DEFAULTS[name]
  if isinstance(default, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"--{name} must be true or false, got {text!r}.")
    return text.lower() in ("true", "1")
  if isinstance(default, tuple):
    return tuple(int(h) for h in text.split(",") if h.strip())
  if isinstance(default, int):
    return int(text)
  if isinstance(default, float):
    return float(text)
  return text


def parse_assignments(items: Iterable[str], flag: str = "fixed") -> Dict[str, Any]:
  """`["name=value", ...]` -> {name: typed value} for `driver.DEFAULTS` names."""
  out = {}
  for item in items:
    name, sep, text = item.partition("=")
    name = name.strip()
    if not sep or name not in driver.DEFAULTS:
      raise ValueError(
          f"--{flag}: expected name=value with name one of {sorted(driver.DEFAULTS)}, "
          f"got {item!r}.")
    try:
      out[name] = _convert(name, text.strip())
    except ValueError as e:
      raise ValueError(f"--{flag}: bad value in {item!r} ({e}).") from e
  return out


def parse_dataset_spec(spec: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
  """`name[:partition][:key=value...]` -> (base, overrides), both training params.

  `base` is the preset `name` of `reproduction.presets` (e.g. `digits_dirichlet`,
  `femnist_mlp`) or `{dataset: name}` for a dataset of `tfbfl.data.DATASETS`;
  `overrides` holds the partition and the `key=value` parts. A cell's flags are
  `base`, then the shared `--fixed` flags, then `overrides` (module docstring).
  """
  parts = [s.strip() for s in spec.split(":")]
  name, rest = parts[0], parts[1:]
  if name in presets.PRESETS:
    base = presets.preset(name)
  elif name in data_lib.DATASETS:
    base = dict(dataset=name)
  else:
    raise ValueError(f"--datasets: unknown dataset or preset {name!r} in {spec!r}; known: "
                     f"{sorted(set(data_lib.DATASETS) | set(presets.PRESETS))}.")
  overrides: Dict[str, Any] = {}
  for part in rest:
    if "=" in part:
      assigned = parse_assignments([part], flag="datasets")
      if set(assigned) & set(GRID_SET):
        raise ValueError(f"--datasets: {part!r} in {spec!r} sets a flag the grid sets per cell "
                         f"{GRID_SET}.")
      overrides.update(assigned)
    elif part:
      if part not in data_lib.PARTITIONS:
        raise ValueError(f"--datasets: unknown partition {part!r} in {spec!r}; "
                         f"known: {list(data_lib.PARTITIONS)}.")
      overrides["partition"] = part
  return base, overrides


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.=,+-]+", "-", text).strip("-")


def _fmt_value(v) -> str:
  return f"{v:g}" if isinstance(v, float) else str(v)


# -------------------------------------------------------------------- cells
@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid."""
  dataset: str  # dataset spec
  algorithm: str
  hparams: Tuple[Tuple[str, Any], ...]  # (name, value) in TUNED order
  seed: int

  @property
  def config_key(self) -> str:
    """The hyperparameters, e.g. `client_lr=0.03,server_lr=1` (seeds pooled over)."""
    return ",".join(f"{k}={_fmt_value(v)}" for k, v in self.hparams)

  @property
  def key(self) -> str:
    return f"{self.config_key},seed={self.seed}"

  def directory(self, output_dir: str) -> str:
    return os.path.join(output_dir, _slug(self.dataset), self.algorithm, _slug(self.key))

  def params(self, output_dir: str, fixed: Dict[str, Any]) -> Dict[str, Any]:
    """The `driver.run_training` flags of this cell: the dataset spec's base
    (preset), the shared `fixed` flags, the spec's overrides, then the cell's own."""
    base, overrides = parse_dataset_spec(self.dataset)
    p = dict(base)
    p.update(fixed)
    p.update(overrides)
    p.update(dict(self.hparams))
    algorithm, variant_flags = VARIANTS.get(self.algorithm, (self.algorithm, {}))
    p.update(variant_flags)
    p.update(algorithm=algorithm,
             seed=self.seed,
             output_dir=self.directory(output_dir),
             verbose=False)
    return p


def enumerate_cells(datasets: Sequence[str], algorithms: Sequence[str],
                    grid: GridSpec) -> List[Cell]:
  """Every cell, in order dataset, algorithm, hyperparameters (row-major), seed."""
  for a in algorithms:
    if a not in TUNED:
      raise ValueError(f"--algorithms must be among {tuple(TUNED)}, got {a!r}.")
  for d in datasets:
    parse_dataset_spec(d)
  cells = []
  for d in datasets:
    for a in algorithms:
      values = grid.values(a)
      names = list(values)
      for combo in np.ndindex(*[len(values[n]) for n in names]):
        hparams = tuple((n, values[n][i]) for n, i in zip(names, combo))
        cells.extend(Cell(d, a, hparams, int(s)) for s in grid.seeds)
  return cells


def plan(quick: bool = False,
         *,
         datasets: Optional[Sequence[str]] = None,
         algorithms: Optional[Sequence[str]] = None,
         fixed_items: Iterable[str] = (),
         params: Optional[Dict[str, Any]] = None,
         **grid_values) -> Tuple[List[Cell], Dict[str, Any]]:
  """The launcher's cells and shared flags.

  Args:
    quick: the `--quick` protocol (module docstring) for whatever is not given.
    datasets: dataset specs (default `DEFAULT_DATASETS`).
    algorithms: grid algorithm names (default `default_algorithms(quick)`).
    fixed_items: `--fixed` items `name=value`.
    params: shared training flags (`rounds`, ...; None values are ignored).
    **grid_values: `GridSpec` fields (`seeds`, `client_lrs`, ...; None = default).
  """
  spec = make_grid(quick, **grid_values)
  shared = dict(params or {})
  shared.update(parse_assignments(fixed_items))
  fixed = make_fixed(quick, **shared)
  cells = enumerate_cells(list(datasets or DEFAULT_DATASETS),
                          list(algorithms or default_algorithms(quick)), spec)
  return cells, fixed


# Rough cost model of a cell on digits-sized data on a quiet 2-core machine: a fixed
# start-up (tracing, first evaluation) plus seconds per round at E = 20 local epochs
# and C = 10 clients per round, scaled by E and C (measured: a 10-round VIRTUAL run
# takes ~40-60 s, a FedAvg run ~3 s; a 1-round, 1-epoch VIRTUAL run ~9 s).
SECONDS_PER_ROUND = {
    "virtual": 4.2,
    "fedavg": 0.1,
    "fedprox": 0.15,
    "fedpa": 0.2,
    "local": 0.1,
    "global": 0.1
}
STARTUP_SECONDS = {
    "virtual": 8.0,
    "fedavg": 2.0,
    "fedprox": 2.0,
    "fedpa": 3.0,
    "local": 2.0,
    "global": 2.0
}
_SECONDS_DEFAULT = (5.0, 1.0)  # other algorithms: start-up, per round


def estimate_seconds(cell: Cell, fixed: Optional[Dict[str, Any]] = None) -> float:
  """Rough wall time of one cell (`SECONDS_PER_ROUND`; digits-sized data)."""
  p = dict(driver.DEFAULTS)
  p.update(cell.params("", dict(fixed or {})))
  startup = STARTUP_SECONDS.get(p["algorithm"], _SECONDS_DEFAULT[0])
  per_round = SECONDS_PER_ROUND.get(p["algorithm"], _SECONDS_DEFAULT[1])
  clients = p["clients_per_round"] or round_loop.default_clients_per_round(p["num_clients"])
  return startup + (float(p["rounds"]) * per_round * float(p["epochs_per_round"]) / 20.0 *
                    float(clients) / 10.0)


def read_curves(run_dir: str) -> Dict[str, List[float]]:
  """Per-round S/MT loss and accuracy from a run's `metrics.csv` (evaluated rounds)."""
  rows = _runs.evaluated(_runs.read_metrics(run_dir))
  curves = {"round": [int(r["round"]) for r in rows]}
  for k in CURVE_KEYS:
    curves[k] = [float(r[k]) for r in rows]
  return curves


def run_cell(params: Dict[str, Any]) -> Dict[str, Any]:
  """Runs one cell with `driver.run_training`; returns {summary, curves}.

  A cell runs only when it has no result yet, so whatever a cut-off earlier
  attempt left in its directory is replaced (`overwrite=True`). Cells skip the
  SavedModel export (a sweep needs its metrics; `python -m launchers.export
  --output_dir=<cell dir>` writes a cell's models from its final checkpoint)."""
  summary = driver.run_training(dict(params, overwrite=True, export=False))
  return dict(summary=summary, curves=read_curves(params["output_dir"]))


def load_result(cell: Cell, output_dir: str, params: Optional[Dict[str, Any]] = None):
  """The cell's stored result, or None if absent or unreadable (or, given `params`,
  run with other flags: `_runs.same_flags`)."""
  return _runs.finished_run(os.path.join(cell.directory(output_dir), RESULT_FILE),
                            params,
                            key="params")


def run_grid(cells: Sequence[Cell],
             output_dir: str,
             fixed: Optional[Dict[str, Any]] = None,
             *,
             cell_runner: Callable[[Dict[str, Any]], Dict[str, Any]] = run_cell,
             log: Optional[Callable[[str], None]] = None) -> List[Dict[str, Any]]:
  """Runs every cell not finished yet; returns the results of all cells (in order).

  Args:
    cells: from `enumerate_cells`.
    output_dir: root of the cell directories.
    fixed: flags shared by every cell (rounds, epochs_per_round, ...).
    cell_runner: `fn(params) -> {summary, curves}` (default `run_cell`).
    log: progress printer (default: print to stdout); one line per cell.
  """
  fixed = dict(fixed or {})
  log = log or _runs.log_line
  results, todo = [], []
  for cell in cells:
    params = cell.params(output_dir, fixed)
    result = load_result(cell, output_dir, params)
    results.append(result)
    if result is None:
      todo.append(len(results) - 1)
  estimates = {i: estimate_seconds(cells[i], fixed) for i in todo}
  total_estimate = sum(estimates.values())
  log(f"grid: {len(cells)} cells, {len(cells) - len(todo)} already done, {len(todo)} to run; "
      f"rough estimate {total_estimate / 60:.1f} min (digits-sized data, quiet 2-core machine)")
  start, estimated_done = time.time(), 0.0
  for done, i in enumerate(todo, 1):
    cell = cells[i]
    params = cell.params(output_dir, fixed)
    t0 = time.time()
    out = cell_runner(params)
    result = dict(dataset=cell.dataset,
                  algorithm=cell.algorithm,
                  hparams=dict(cell.hparams),
                  config_key=cell.config_key,
                  seed=cell.seed,
                  params=_runs.jsonable(params),
                  summary=_runs.jsonable(out["summary"]),
                  curves=_runs.jsonable(out["curves"]),
                  cell_time_s=time.time() - t0)
    round_loop.atomic_write_text(os.path.join(cell.directory(output_dir), RESULT_FILE),
                                 json.dumps(result, indent=1, sort_keys=True))
    results[i] = result
    elapsed = time.time() - start
    # ETA: the cost model's remaining time, rescaled by how fast cells ran so far
    # (VIRTUAL and FedAvg cells differ ~15x, so a plain average per cell misleads).
    estimated_done += estimates[i]
    if estimated_done > 0:
      eta = elapsed / estimated_done * (total_estimate - estimated_done)
    else:
      eta = elapsed / done * (len(todo) - done)
    log(f"cell {done}/{len(todo)} {cell.dataset} {cell.algorithm} {cell.key}: "
        f"best S {result['summary']['best_server_accuracy']:.4f} "
        f"MT {result['summary']['best_mt_accuracy']:.4f} "
        f"({result['cell_time_s']:.1f} s; elapsed {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min)")
  return results


# ---------------------------------------------------------------- selection
@dataclasses.dataclass
class ConfigStats:
  """One configuration (cell without seed) aggregated over its seeds."""
  dataset: str
  algorithm: str
  config_key: str
  hparams: Dict[str, Any]
  results: List[Dict[str, Any]]

  def scores(self, metric: str) -> np.ndarray:
    key = {"S": "best_server_accuracy", "MT": "best_mt_accuracy"}[metric]
    return np.array([r["summary"][key] for r in self.results], dtype=np.float64)

  def mean(self, metric: str) -> float:
    return float(np.mean(self.scores(metric)))

  def std(self, metric: str) -> float:
    s = self.scores(metric)
    return float(np.std(s, ddof=1)) if len(s) > 1 else 0.0

  def diverged(self, metric: str) -> bool:
    """True if some seed's last-round test loss of `metric` is not finite."""
    key = {"S": "server_loss", "MT": "mt_loss"}[metric]
    return not all(np.isfinite(r["curves"][key][-1]) for r in self.results)

  def mean_curve(self, key: str) -> Tuple[List[int], np.ndarray]:
    """Rounds and the per-round mean over seeds of `key` (rounds common to all seeds)."""
    rounds = sorted(set.intersection(*[set(r["curves"]["round"]) for r in self.results]))
    stacked = [
        [dict(zip(r["curves"]["round"], r["curves"][key]))[t] for t in rounds] for r in self.results
    ]
    return rounds, np.mean(np.array(stacked, dtype=np.float64), axis=0)


def group_results(
    results: Iterable[Optional[Dict[str, Any]]]) -> Dict[Tuple[str, str], List[ConfigStats]]:
  """(dataset, algorithm) -> configurations in first-seen order (missing results skipped)."""
  groups: Dict[Tuple[str, str], Dict[str, ConfigStats]] = {}
  for r in results:
    if r is None:
      continue
    configs = groups.setdefault((r["dataset"], r["algorithm"]), {})
    if r["config_key"] not in configs:
      configs[r["config_key"]] = ConfigStats(r["dataset"], r["algorithm"], r["config_key"],
                                             dict(r["hparams"]), [])
    configs[r["config_key"]].results.append(r)
  return {k: list(v.values()) for k, v in groups.items()}


def select_best(configs: Sequence[ConfigStats], metric: str) -> ConfigStats:
  """The configuration with the largest mean best-round accuracy (first on ties).

  A configuration that diverged (non-finite last-round loss on some seed) has no
  accuracy "at convergence": it wins only if every configuration diverged.
  """
  best, best_key = None, None
  for c in configs:
    key = (not c.diverged(metric), c.mean(metric))
    if best is None or key > best_key:
      best, best_key = c, key
  return best


TABLE_COLUMNS = ("dataset", "algorithm", "label", "partition", "s_mean", "s_std", "s_hparams",
                 "s_diverged", "mt_mean", "mt_std", "mt_hparams", "mt_diverged", "num_seeds",
                 "num_configs")


def table2_rows(results: Iterable[Optional[Dict[str, Any]]]) -> List[Dict[str, Any]]:
  """One row per (dataset, algorithm): the best S and the best MT configuration."""
  rows = []
  for (dataset, algorithm), configs in group_results(results).items():
    s, mt = select_best(configs, "S"), select_best(configs, "MT")
    rows.append(
        dict(dataset=dataset,
             algorithm=algorithm,
             label=LABELS.get(algorithm, algorithm),
             partition=dataset_partition(dataset),
             s_mean=s.mean("S"),
             s_std=s.std("S"),
             s_hparams=s.config_key,
             s_diverged=s.diverged("S"),
             mt_mean=mt.mean("MT"),
             mt_std=mt.std("MT"),
             mt_hparams=mt.config_key,
             mt_diverged=mt.diverged("MT"),
             num_seeds=min(len(c.results) for c in configs),
             num_configs=len(configs)))
  return rows


def dataset_partition(spec: str) -> str:
  """The partition a dataset spec runs with (its own, its preset's, or the default)."""
  try:
    base, overrides = parse_dataset_spec(spec)
  except ValueError:
    parts = [x for x in spec.split(":")[1:] if x and "=" not in x]
    return parts[0] if parts else ""
  return str(overrides.get("partition", base.get("partition", driver.DEFAULTS["partition"])))


def _is_permuted(row: Dict[str, Any]) -> bool:
  """The PMNIST-like rows: the permuted partition, or the pmnist dataset itself."""
  partition = row.get("partition") or dataset_partition(row["dataset"])
  return partition == "permuted" or row["dataset"].split(":")[0] == "pmnist"


def _is_non_iid(row: Dict[str, Any]) -> bool:
  return (row.get("partition") or dataset_partition(row["dataset"])) != "homogeneous"


def _pm(row: Dict[str, Any], metric: str) -> str:
  m = metric.lower()
  return (f"{100 * row[m + '_mean']:.1f} ± {100 * row[m + '_std']:.1f}" +
          (" †" if row.get(m + "_diverged") else ""))


def paper_claims(rows: Sequence[Dict[str, Any]], baseline: str = "fedavg") -> List[str]:
  """The paper's Table II claims judged on `table2_rows` rows, one line each.

  For each VIRTUAL variant present (`virtual`, `virtual_eq3`) against FedAvg:
  (a) on every non-IID dataset row (partition other than homogeneous) VIRTUAL's
  mean MT above FedAvg's; (b) on every dataset VIRTUAL's mean S >= FedAvg's mean S
  - `_runs.S_COMPARABLE_PP` percentage points; (c) on the permuted partition (PMNIST)
  VIRTUAL beats FedAvg on neither MT nor S, PMNIST being the one dataset where
  VIRTUAL loses in the paper. "Above" and "beats" follow the reproduction report's
  rule (`_runs.mean_difference`, `_runs.beyond_error`): the difference of the means
  must exceed its standard error over the seeds; within it, the two tie.
  Each line says "held" or "not held" with mean ± std (%), the number of seeds and,
  for MT, the difference with its standard error, or why it cannot be judged (no
  FedAvg row for the dataset, ...).
  """
  by_key = {(r["dataset"], r["algorithm"]): r for r in rows}
  datasets = list(dict.fromkeys(r["dataset"] for r in rows))
  variants = [a for a in VIRTUAL_ALGORITHMS if any(r["algorithm"] == a for r in rows)]
  base_label = LABELS.get(baseline, baseline)
  if not variants:
    return ["Paper claims cannot be judged: no VIRTUAL rows in the table."]

  def difference(v, b, metric):
    """(difference of the means, its standard error) in percentage points."""
    m = metric.lower()
    summary = lambda r: (100 * r[m + "_mean"], 100 * r[m + "_std"], r["num_seeds"])
    return _runs.mean_difference(summary(v), summary(b))

  def beats(v, b, metric):
    return _runs.beyond_error(*difference(v, b, metric)) > 0

  def numbers(v, b, metrics):
    parts = [f"{metric} {_pm(v, metric)} vs {base_label} {_pm(b, metric)}" for metric in metrics]
    text = f"{'; '.join(parts)} (%, mean ± std over {v['num_seeds']} vs {b['num_seeds']} seeds"
    if "MT" in metrics:
      text += "; MT difference {:+.1f} pp, standard error {:.1f}".format(*difference(v, b, "MT"))
    return text + ")"

  def verdict(ok):
    return "held" if ok else "not held"

  lines = []
  for a in variants:
    label = LABELS[a]
    claim_a = f"(a) {label} MT above {base_label} MT on non-IID data"
    claim_b = (f"(b) {label} S comparable to {base_label} "
               f"(rule: mean S >= {base_label}'s - {_runs.S_COMPARABLE_PP:g} pp)")
    claim_c = f"(c) PMNIST the exception: {label} beats {base_label} on neither MT nor S"
    non_iid = [d for d in datasets if (d, a) in by_key and _is_non_iid(by_key[(d, a)])]
    permuted = [d for d in datasets if (d, a) in by_key and _is_permuted(by_key[(d, a)])]

    def judge(claim, rows, rule, parts):
      """One line per dataset of `rows`: the verdict of `rule(v, b)` on its numbers."""
      for d in rows:
        v, b = by_key[(d, a)], by_key.get((d, baseline))
        if b is None:
          lines.append(f"{claim}, {d}: cannot be judged: no {base_label} row.")
        else:
          lines.append(f"{claim}, {d}: {verdict(rule(v, b))}: {numbers(v, b, parts)}.")

    if not non_iid:
      lines.append(f"{claim_a}: cannot be judged: no non-IID dataset row.")
    judge(claim_a, non_iid, lambda v, b: beats(v, b, "MT"), ("MT",))
    judge(claim_b, [d for d in datasets if (d, a) in by_key],
          lambda v, b: 100 * v["s_mean"] >= 100 * b["s_mean"] - _runs.S_COMPARABLE_PP, ("S",))
    if not permuted:
      lines.append(f"{claim_c}: cannot be judged: no permuted-partition row.")
    judge(claim_c, permuted, lambda v, b: not beats(v, b, "MT") and not beats(v, b, "S"),
          ("MT", "S"))
  return lines


def format_table2_md(rows: Sequence[Dict[str, Any]], claims: bool = True) -> str:
  """Markdown table in percent, like VIRTUAL Table II (+ the winning hyperparameters),
  followed (`claims`) by the paper's claims judged on it (`paper_claims`)."""
  lines = [
      "Server (S) and multi-task (MT) max accuracy at convergence, % "
      "(mean ± std over seeds; best configuration per metric; "
      "† = every configuration diverged).", ""
  ]
  lines += _runs.md_table(
      ("Dataset", "Algorithm", "S", "MT", "S hyperparameters", "MT hyperparameters", "seeds"),
      [(r["dataset"], r.get("label") or LABELS.get(r["algorithm"], r["algorithm"]), _pm(
          r, "s"), _pm(r, "mt"), r["s_hparams"], r["mt_hparams"], r["num_seeds"]) for r in rows])
  if claims and rows:
    lines += ["", "Paper claims (Table II), judged on the rows above:", ""]
    lines += [f"- {line}" for line in paper_claims(rows)]
  return "\n".join(lines) + "\n"


def write_table2(output_dir: str, results) -> List[Dict[str, Any]]:
  """Writes `table2.md` and `table2.csv`; returns the rows."""
  rows = table2_rows(results)
  round_loop.atomic_write_text(os.path.join(output_dir, "table2.md"), format_table2_md(rows))
  round_loop.write_csv(os.path.join(output_dir, "table2.csv"), rows, TABLE_COLUMNS)
  return rows


# -------------------------------------------------------------------- plots
def _figure(num_cols: int):
  """Two rows (S, MT) of `num_cols` loss panels."""
  plt = _runs.pyplot()
  fig, axes = plt.subplots(2, num_cols, figsize=(4.2 * num_cols, 7), squeeze=False)
  return plt, fig, axes


def _loss_axes(axes_col, labels) -> None:
  """Log-scale cross-entropy panels (top: S, bottom: MT) with their legends."""
  for ax, label in zip(axes_col, labels):
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)


def _datasets(groups) -> List[str]:
  return list(dict.fromkeys(d for d, _ in groups))


def _positive(values: np.ndarray) -> np.ndarray:
  """Non-finite or non-positive losses are not drawn on a log axis."""
  values = np.asarray(values, dtype=np.float64)
  return np.where(np.isfinite(values) & (values > 0), values, np.nan)


def plot_fig3(path: str, results) -> None:
  """S (top) and MT (bottom) test cross-entropy per round of the winning configurations."""
  groups = group_results(results)
  datasets = _datasets(groups)
  _, fig, axes = _figure(max(len(datasets), 1))
  for col, dataset in enumerate(datasets):
    for (d, algorithm), configs in groups.items():
      if d != dataset:
        continue
      for row, (metric, key) in enumerate((("S", "server_loss"), ("MT", "mt_loss"))):
        best = select_best(configs, metric)
        rounds, curve = best.mean_curve(key)
        axes[row, col].plot(rounds,
                            _positive(curve),
                            marker=".",
                            label=f"{LABELS.get(algorithm, algorithm)} ({best.config_key})")
    _loss_axes(axes[:, col], ("S test cross-entropy", "MT test cross-entropy"))
    axes[0, col].set_title(dataset)
  _runs.save_figure(fig, path, tight=True)


def plot_fig2(path: str, results, algorithm: str = "virtual") -> bool:
  """VIRTUAL's beta sweep: S (top) and MT (bottom) cross-entropy per round, one line
  per beta, client and server learning rates fixed at the best-MT configuration.
  Returns False (and writes nothing) without VIRTUAL results."""
  groups = {k: v for k, v in group_results(results).items() if k[1] == algorithm}
  if not groups:
    return False
  import matplotlib.colors as mcolors  # pylint: disable=g-import-not-at-top
  datasets = _datasets(groups)
  plt, fig, axes = _figure(len(datasets))
  betas = sorted({c.hparams["kl_weight"] for cs in groups.values() for c in cs})
  positive = [b for b in betas if b > 0] or [1.0]
  norm = mcolors.LogNorm(vmin=min(positive), vmax=max(max(positive), min(positive) * 10))
  cmap = plt.get_cmap("viridis")
  for col, dataset in enumerate(datasets):
    configs = groups[(dataset, algorithm)]
    best = select_best(configs, "MT")
    others = {k: v for k, v in best.hparams.items() if k != "kl_weight"}
    sweep = sorted((c for c in configs if all(c.hparams.get(k) == v for k, v in others.items())),
                   key=lambda c: c.hparams["kl_weight"])
    for c in sweep:
      beta = c.hparams["kl_weight"]
      color = cmap(norm(beta)) if beta > 0 else "black"
      for row, key in enumerate(("server_loss", "mt_loss")):
        rounds, curve = c.mean_curve(key)
        axes[row, col].plot(rounds,
                            _positive(curve),
                            marker=".",
                            color=color,
                            label=f"beta={beta:g}")
    fixed = ",".join(f"{k}={_fmt_value(v)}" for k, v in others.items())
    axes[0, col].set_title(f"{dataset}\n{fixed}", fontsize=9)
    _loss_axes(axes[:, col], ("S cross-entropy", "MT cross-entropy"))
  fig.tight_layout(rect=(0, 0, 0.9, 1))
  fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap),
               cax=fig.add_axes([0.92, 0.15, 0.015, 0.7]),
               label="beta (KL multiplier)")
  _runs.save_figure(fig, path)
  return True


def write_report(output_dir: str, results) -> List[Dict[str, Any]]:
  """`table2.md`, `table2.csv`, `fig3.png` and (with VIRTUAL results) `fig2.png`
  (of `virtual`, or of `virtual_eq3` when only that variant ran)."""
  results = list(results)
  rows = write_table2(output_dir, results)
  if rows:
    plot_fig3(os.path.join(output_dir, "fig3.png"), results)
    for algorithm in VIRTUAL_ALGORITHMS:
      if plot_fig2(os.path.join(output_dir, "fig2.png"), results, algorithm):
        break
  return rows

"""The papers' experiments as named cells: the campaign's catalogue.

A *cell* is one run of one launcher with fixed flags: (paper, experiment, row,
algorithm, setting, seed), named `paper/experiment/row/algorithm/setting/seedN`,
e.g. `virtual/table2/mnist/fedavg/tuned/seed1` or `pfnm/j_sweep/homogeneous/all/J=10/seed0`.
The catalogue (`catalogue`) holds every cell of the campaign:

* VIRTUAL Table II on MNIST, PMNIST and FEMNIST-MLP (`reproduction.presets`: K = 100
  clients, C = 10, E = 20, B = 20, MLP 2 x 100) for VIRTUAL, FedAvg, FedProx and
  FedPA. First *tuning* cells at seed 0 on a validation split of the clients'
  training data (`--validation_fraction`; the test data are not read), then the
  *tuned* cells, seeds 0-2, at the setting with the best validation MT accuracy
  (max over rounds, as Table II reports). A second stage then tunes the server
  step at the grid's setting (`STEP_STAGE`). A tuned cell waits
  until every tuning cell of its (row, algorithm) has a record.
* PFNM accuracy vs the number of batches J on MNIST (paper Figs. 2-3): both
  partitions, the paper's J values and hyperparameters (`launchers.pfnm_batches`).
* FOLA's first-round global accuracy over alpha on MNIST-MLP 784-500-300-10
  (its Fig. 2a) and its learning curves at N = 20, alpha = 0.01, E = 5, lr = 0.01
  (Fig. 3a).

Each cell is run by `reproduction.runner`, which writes its record;
`reproduction.records` reads the records (the tuned cells' settings are chosen
from their values here), and `reproduction.reproduction_report` rebuilds the
report from the records alone.

This module imports neither TensorFlow nor absl.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from reproduction import presets
from tfbfl.algorithms.virtual import config as virtual_config
from reproduction import _runs
from reproduction import records as records_lib

DATA_ROOT_TOKEN = "<data_root>"  # data paths are stored relative to --data_root

# ------------------------------------------------------------------ the papers
# VIRTUAL Table II (max accuracy over rounds at convergence, %): row -> metric -> algorithm.
VIRTUAL_TABLE2 = {
    "femnist_mlp": {
        "MT": dict(fedavg=94.3, fedprox=94.5, virtual=95.7),
        "S": dict(fedavg=90.2, fedprox=89.9, virtual=90.9)
    },
    "femnist_conv": {
        "MT": dict(fedavg=97.3, fedprox=97.0, virtual=98.2),
        "S": dict(fedavg=95.5, fedprox=95.5, virtual=97.3)
    },
    "mnist": {
        "MT": dict(fedavg=96.9, fedprox=96.9, virtual=97.4),
        "S": dict(fedavg=97.6, fedprox=97.6, virtual=97.8)
    },
    "pmnist": {
        "MT": dict(fedavg=85.9, fedprox=85.6, virtual=84.2),
        "S": dict(fedavg=48.3, fedprox=47.5, virtual=42.5)
    },
}
TABLE2_ROWS = ("mnist", "pmnist", "femnist_mlp")
TABLE2_ALGORITHMS = ("virtual", "fedavg", "fedprox", "fedpa")
TABLE2_SEEDS = (0, 1, 2)
# Tuning grid, shrunk to what 2 cores allow (VIRTUAL App. D tunes lr, beta and the
# server step over wider grids): one axis per algorithm beside the client lr. 0.2 was
# added when every baseline chose 0.1, the grid's top, on MNIST, PMNIST and FEMNIST;
# 0.5 (baselines only) when every MNIST baseline then chose 0.2 (FedAvg 91.9, FedProx
# 91.9, FedPA 92.0 validation MT), so that no baseline is left under-tuned.
TABLE2_LRS = (0.02, 0.05, 0.1, 0.2)
TABLE2_BASELINE_LRS = TABLE2_LRS + (0.5,)
TABLE2_TUNING = {
    "virtual": dict(client_lr=TABLE2_LRS, kl_weight=(1e-5, 1e-4, 1e-3)),
    "fedavg": dict(client_lr=TABLE2_BASELINE_LRS),
    "fedprox": dict(client_lr=TABLE2_BASELINE_LRS, mu=(0.001, 0.01, 0.1)),
    "fedpa": dict(client_lr=TABLE2_BASELINE_LRS),
}
# Per-row departures from TABLE2_TUNING: PMNIST's VIRTUAL cells tune the lr alone, at
# the default beta (why, measured: docs/reproduction.md),
# up to the baselines' 0.5 (added when lr 0.2, the grid's top, won: 83.9 against 83.8
# at 0.1).
_DEFAULT_BETA = next(f.default for f in dataclasses.fields(virtual_config.VirtualConfig)
                     if f.name == "kl_weight")
TABLE2_ROW_TUNING = {
    ("pmnist", "virtual"): dict(client_lr=TABLE2_BASELINE_LRS, kl_weight=(_DEFAULT_BETA,)),
}
TABLE2_ROUNDS = {"tune": 30, "final": 100}
VALIDATION_FRACTION = 0.2
# The evaluation the papers' VIRTUAL cells run at: the posterior means (the papers do
# not say; the campaign's records are of them). The library's default is the Monte Carlo
# predictive since issue 34; a cell's setting may ask for it (`eval_samples=10`).
PAPER_EVALUATION = dict(eval_samples=0)


def _paper_evaluation(algorithm: str) -> Dict[str, Any]:
  """`PAPER_EVALUATION` for a VIRTUAL cell; no flag for the other algorithms."""
  return dict(PAPER_EVALUATION) if algorithm == "virtual" else {}

# VIRTUAL's own knobs (issue 21, item 4), each changed alone from the row's tuned
# setting, on the tuning protocol (validation split, TABLE2_ROUNDS["tune"] rounds):
# the damped-EP step (default 1/C = 0.1), the lateral gate's start, the natural-
# gradient precision step and the Monte Carlo predictive. "tuned" is the reference.
# FEMNIST's were added for its server step stage (below); PMNIST's cells cost ~30 min.
ABLATION_ROWS = ("mnist", "femnist_mlp")
ABLATIONS = (
    ("tuned", {}),
    ("server_lr=0.05", dict(server_lr=0.05)),
    ("server_lr=0.2", dict(server_lr=0.2)),
    ("server_lr=0.4", dict(server_lr=0.4)),
    ("gate_init=0", dict(gate_init=0.0)),
    ("precision_step=0.05", dict(precision_step=0.05)),
    ("eval_samples=10", dict(eval_samples=10)),
)
ABLATION_SEEDS = (0, 1)
# The server step's stage of the tuning (App. D tunes the server learning rate of every
# method, over {0.2, 0.4, ..., 1.0}): on every row, after the grid, the step with
# the best validation MT among the grid's own cell (`DEFAULT_STEP`: VIRTUAL's damped-EP
# step 1/C = 0.1 on these rows, the baselines' server lr 1.0, plain averaging) and the
# cells of the other steps at the grid's setting, seed 0. Steps in increasing order, so
# the first and the last are the stage's edges. On the `ABLATION_ROWS` VIRTUAL's step
# cells are its `server_lr` knobs' seed-0 ablation cells (one run serves both); on
# PMNIST, which has no knobs' cells, `tune_step` cells like the baselines'. 1.5
# (baselines only) was added when every baseline on MNIST and FEMNIST chose 1.0, App.
# D's top, with validation MT rising all the way from 0.2 (the grid grows past an edge
# its choices sit on, as the lr's did); 2 and 3 when FEMNIST's FedAvg then chose 1.5
# (91.7 against 91.1 at 1.0).
DEFAULT_STEP = "default"
_BASELINE_STEPS = (0.2, 0.4, 0.6, 0.8, DEFAULT_STEP, 1.5, 2.0, 3.0)
STEP_STAGE = {"virtual": (0.05, DEFAULT_STEP, 0.2, 0.4), "fedavg": _BASELINE_STEPS,
              "fedprox": _BASELINE_STEPS, "fedpa": _BASELINE_STEPS}
DEFAULT_STEP_TEXT = {"virtual": "1/C", "fedavg": "1", "fedprox": "1", "fedpa": "1"}
STEP_STAGE_ROWS = TABLE2_ROWS

PFNM_J = (2, 5, 10, 15, 20, 25, 30)
PFNM_PARTITIONS = ("homogeneous", "class_dirichlet")
PFNM_TRIALS = (0, 1, 2)
PFNM_METHODS = ("pfnm", "pfnm_small_gamma", "fedavg_shared", "local", "uniform_ensemble",
                "weighted_ensemble")

FOLA_ALPHAS = (0.01, 0.1, 1.0, 10.0, 100.0)
FOLA_METHODS = ("fola", "fedavg", "fedcurv")
FOLA_REPEATS = (0, 1, 2)
FOLA_BASE = dict(dataset="mnist", architecture="mlp", hidden_units="500,300", num_clients=20,
                 epochs_per_round=5, client_lr=0.01, batch_size=32)
FOLA_CURVE_ROUNDS = 30


# -------------------------------------------------------------------- cells
@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of one launcher.

  `flags` are the launcher's flags (without `--output_dir`); a value that starts
  with `DATA_ROOT_TOKEN` is a path under the runner's `--data_root`. `needs` names
  the folders under `--data_root` the cell reads. `depends` is set on a tuned cell
  whose tuning is not finished (it cannot run yet; the text says why).
  """
  paper: str
  experiment: str
  row: str
  algorithm: str
  setting: str
  seed: int
  launcher: str
  flags: Tuple[Tuple[str, Any], ...]
  estimate_s: float
  needs: Tuple[str, ...] = ()
  depends: str = ""

  @property
  def name(self) -> str:
    return "/".join((self.paper, self.experiment, self.row, self.algorithm, self.setting,
                     f"seed{self.seed}"))

  @property
  def flag_dict(self) -> Dict[str, Any]:
    return dict(self.flags)

  def record_path(self, results_dir: str) -> str:
    return os.path.join(results_dir, self.name + ".json")

  def command(self, output_dir: str, data_root: str) -> List[str]:
    """`python -m launchers.<launcher> --flag=value ...` with the paths filled in."""
    args = [sys.executable, "-m", f"launchers.{self.launcher}"]
    for k, v in self.flags:
      args.append(f"--{k}={_flag_text(_with_root(v, data_root))}")
    args.append(f"--output_dir={output_dir}")
    return args


def _flag_text(value: Any) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, (list, tuple)):
    return ",".join(_flag_text(v) for v in value)
  if isinstance(value, float):
    return repr(value)
  return str(value)


def _with_root(value: Any, data_root: str) -> Any:
  if isinstance(value, str) and value.startswith(DATA_ROOT_TOKEN):
    return os.path.join(data_root, value[len(DATA_ROOT_TOKEN):].lstrip("/"))
  return value


def _data(name: str) -> str:
  return f"{DATA_ROOT_TOKEN}/{name}"


def fmt_number(v: Any) -> str:
  return f"{v:g}" if isinstance(v, float) else str(v)


def setting_name(hparams: Mapping[str, Any]) -> str:
  """`client_lr=0.05,kl_weight=0.0001` (sorted keys)."""
  return ",".join(f"{k}={fmt_number(v)}" for k, v in sorted(hparams.items())) or "default"


# Rough seconds per round on a quiet 2-core machine at the MNIST protocol (C = 10,
# E = 20, B = 20, 600 examples a client, evaluation every round), measured; FEMNIST's
# sample has ~100 examples a client (x 1/6). Start-up: loading, tracing, first round.
# FOLA's was measured beside two campaign cells (an upper bound).
TRAIN_SECONDS_PER_ROUND = {"virtual": 17.0, "fedavg": 2.5, "fedprox": 3.0, "fedpa": 3.5,
                           "fola": 6.0}
TRAIN_STARTUP_S = 30.0
ROW_SCALE = {"mnist": 1.0, "pmnist": 1.0, "femnist_mlp": 0.2}


def _table2_flags(row: str, algorithm: str, hparams: Mapping[str, Any], rounds: int,
                  seed: int, tune: bool) -> Tuple[Tuple[str, Any], ...]:
  flags = presets.preset(row)
  flags.update(data_dir=_data(_row_data(row)), algorithm=algorithm, rounds=rounds, seed=seed, eval_every=1,
               export=False)
  flags.update(_paper_evaluation(algorithm))
  if tune:
    flags["validation_fraction"] = VALIDATION_FRACTION
  flags.update(hparams)
  return tuple(sorted(flags.items()))


def _grid(axes: Mapping[str, Sequence[Any]]) -> List[Dict[str, Any]]:
  names = sorted(axes)
  combos = [{}]
  for n in names:
    combos = [dict(c, **{n: v}) for c in combos for v in axes[n]]
  return combos


def _train_estimate_s(row: str, algorithm: str, rounds: int, validation: bool,
                      cost: float = 1.0) -> float:
  """A training cell's estimated seconds (`validation`: trains on 1 - VALIDATION_FRACTION
  of the data; `cost`: a factor for extra evaluation work)."""
  per_round = TRAIN_SECONDS_PER_ROUND[algorithm] * ROW_SCALE[row]
  return TRAIN_STARTUP_S + rounds * per_round * (1 - VALIDATION_FRACTION * validation) * cost


def _tuning_cells(row: str, algorithm: str) -> List[Cell]:
  """The tuning grid's cells of one Table II row and algorithm (seed 0, validation split)."""
  rounds = TABLE2_ROUNDS["tune"]
  return [
      Cell("virtual", "tune", row, algorithm, setting_name(hp), 0, "train",
           _table2_flags(row, algorithm, hp, rounds, 0, True),
           _train_estimate_s(row, algorithm, rounds, True), (_row_data(row),))
      for hp in _grid(tuning_axes(row, algorithm))
  ]


def _row_data(row: str) -> str:
  return "femnist" if row.startswith("femnist") else "mnist"


def grid_setting(records: Mapping[str, Mapping[str, Any]], row: str,
                 algorithm: str) -> Tuple[Optional[Dict[str, Any]], str]:
  """`choose_setting` over the row's tuning grid for `algorithm` (the ablations' reference)."""
  tuning = _tuning_cells(row, algorithm)
  return choose_setting([records.get(c.name) for c in tuning],
                        [dict(_hparams(c, algorithm)) for c in tuning])


def grid_cell(row: str, algorithm: str, chosen: Mapping[str, Any]) -> Cell:
  return next(c for c in _tuning_cells(row, algorithm)
              if dict(_hparams(c, algorithm)) == dict(chosen))


def step_stage(row: str, algorithm: str) -> bool:
  """Whether the row's `algorithm` tunes the server step after its grid (`STEP_STAGE`)."""
  return row in STEP_STAGE_ROWS and algorithm in STEP_STAGE


def _steps_in_ablations(row: str, algorithm: str) -> bool:
  """Whether the stage's step cells are VIRTUAL's `server_lr` knobs' ablation cells."""
  return algorithm == "virtual" and row in ABLATION_ROWS


def _stage_steps(algorithm: str) -> List[Any]:
  """The stage's steps, `DEFAULT_STEP` first (it wins ties)."""
  return [DEFAULT_STEP] + [s for s in STEP_STAGE[algorithm] if s != DEFAULT_STEP]


def step_setting(chosen: Mapping[str, Any], step: Any) -> Dict[str, Any]:
  return dict(chosen) if step == DEFAULT_STEP else dict(chosen, server_lr=step)


def step_cell(row: str, algorithm: str, step: Any, chosen: Optional[Mapping[str, Any]],
               why: str) -> Cell:
  """The stage's cell of `step` at the grid's setting `chosen` (None: not chosen yet, `why`):
  the grid's own cell for `DEFAULT_STEP`, VIRTUAL's `server_lr` ablation cell on the
  `ABLATION_ROWS`, or else a `tune_step` cell."""
  if step == DEFAULT_STEP:
    return grid_cell(row, algorithm, chosen)
  name = setting_name(dict(server_lr=step))
  if _steps_in_ablations(row, algorithm):
    return _ablation_cell(row, name, 0, chosen, why)
  rounds = TABLE2_ROUNDS["tune"]
  return Cell("virtual", "tune_step", row, algorithm, name, 0, "train",
              _table2_flags(row, algorithm, step_setting(chosen or {}, step), rounds, 0, True),
              _train_estimate_s(row, algorithm, rounds, True), (_row_data(row),),
              depends="" if chosen is not None else why)


def _step_tuning_cells(records: Mapping[str, Mapping[str, Any]], row: str,
                       algorithm: str) -> List[Cell]:
  """The stage's `tune_step` cells (VIRTUAL's on the `ABLATION_ROWS` are in
  `ablation_cells`)."""
  if not step_stage(row, algorithm) or _steps_in_ablations(row, algorithm):
    return []
  chosen, why = grid_setting(records, row, algorithm)
  return [step_cell(row, algorithm, s, chosen, why) for s in _stage_steps(algorithm)[1:]]


def tuned_setting(records: Mapping[str, Mapping[str, Any]], row: str,
                  algorithm: str) -> Tuple[Optional[Dict[str, Any]], str]:
  """The grid's setting (`grid_setting`), then, where `step_stage` holds, the server
  step with the best validation MT among the `STEP_STAGE` cells at that setting."""
  chosen, why = grid_setting(records, row, algorithm)
  if chosen is None or not step_stage(row, algorithm):
    return chosen, why
  steps = _stage_steps(algorithm)
  stage = [step_cell(row, algorithm, s, chosen, "") for s in steps]
  best, why = choose_setting([records.get(c.name) for c in stage],
                             [step_setting(chosen, s) for s in steps])
  return best, why and f"{why} (the server step's stage: {_steps_text(algorithm)} at seed 0)"


def _steps_text(algorithm: str) -> str:
  return ", ".join(fmt_number(s) for s in STEP_STAGE[algorithm])


def setting_keys(row: str, algorithm: str) -> Tuple[str, ...]:
  """The hyperparameters a row's tuning chooses for `algorithm`."""
  return tuple(tuning_axes(row, algorithm)) + (("server_lr",) if step_stage(row, algorithm) else ())


def table2_cells(records: Mapping[str, Mapping[str, Any]]) -> List[Cell]:
  """VIRTUAL Table II: tuning cells, then tuned cells at the chosen settings."""
  cells = []
  for row in TABLE2_ROWS:
    for algorithm in TABLE2_ALGORITHMS:
      cells += _tuning_cells(row, algorithm) + _step_tuning_cells(records, row, algorithm)
      chosen, why = tuned_setting(records, row, algorithm)
      for seed in TABLE2_SEEDS:
        rounds = TABLE2_ROUNDS["final"]
        cells.append(
            Cell("virtual", "table2", row, algorithm, "tuned", seed, "train",
                 _table2_flags(row, algorithm, chosen or {}, rounds, seed, False),
                 _train_estimate_s(row, algorithm, rounds, False),
                 (_row_data(row),), depends="" if chosen is not None else why))
  return cells


def _knob_cell(experiment: str, row: str, algorithm: str, name: str, knob: Mapping[str, Any],
               seed: int, chosen: Optional[Mapping[str, Any]], why: str) -> Cell:
  """`knob` on top of the setting `chosen` (None: not chosen yet, `why`), on the tuning
  protocol; a Monte Carlo predictive's evaluations are counted in the estimate."""
  rounds = TABLE2_ROUNDS["tune"]
  return Cell("virtual", experiment, row, algorithm, name, seed, "train",
              _table2_flags(row, algorithm, dict(chosen or {}, **knob), rounds, seed, True),
              _train_estimate_s(row, algorithm, rounds, True, _evaluation_cost(knob)),
              (_row_data(row),), depends="" if chosen is not None else why)


# A round's extra cost per Monte Carlo draw beyond the first, with MT cached: on MNIST an
# evaluation at 10 draws took ~1.9 s against ~0.9 s at the means, beside a ~14 s round
# (docs/virtual.md, "The predictive"): (1.9 - 0.9) / (14 + 0.9) / 9.
_MONTE_CARLO_COST_PER_DRAW = 0.0075


def _evaluation_cost(knob: Mapping[str, Any]) -> float:
  """The estimate's factor for a Monte Carlo predictive's extra evaluations."""
  return 1 + _MONTE_CARLO_COST_PER_DRAW * ((knob.get("eval_samples", 1) or 1) - 1)


def _ablation_cell(row: str, name: str, seed: int, chosen: Optional[Mapping[str, Any]],
                   why: str) -> Cell:
  """Knob `name` of `ABLATIONS` at the grid's setting `chosen` (None: not chosen yet, `why`)."""
  return _knob_cell("ablate", row, "virtual", name, dict(ABLATIONS)[name], seed, chosen, why)


def ablation_cells(records: Mapping[str, Mapping[str, Any]]) -> List[Cell]:
  """VIRTUAL's knobs (`ABLATIONS`) beside its tuned setting, on the tuning protocol."""
  cells = []
  for row in ABLATION_ROWS:
    chosen, why = grid_setting(records, row, "virtual")
    for name, _ in ABLATIONS:
      for seed in ABLATION_SEEDS:
        if name == "tuned" and seed == 0:
          continue  # that run is the chosen tuning cell (`ablation_records`)
        cells.append(_ablation_cell(row, name, seed, chosen, why))
  return cells


def default_step_cells(records: Mapping[str, Mapping[str, Any]]) -> List[Cell]:
  """The grid's setting at the default server step on Table II's protocol (seeds as
  Table II's), beside the tuned cells wherever the step stage chose another step (none
  once it has chosen the default: the tuned cells are then these; waiting while the
  stage runs)."""
  cells = []
  rounds = TABLE2_ROUNDS["final"]
  for row in STEP_STAGE_ROWS:
    for algorithm in TABLE2_ALGORITHMS:
      grid, _ = grid_setting(records, row, algorithm)
      chosen, why = tuned_setting(records, row, algorithm)
      if grid is None or chosen == grid or not step_stage(row, algorithm):
        continue
      for seed in TABLE2_SEEDS:
        cells.append(
            Cell("virtual", "default_step", row, algorithm, "default", seed, "train",
                 _table2_flags(row, algorithm, grid, rounds, seed, False),
                 _train_estimate_s(row, algorithm, rounds, False), (_row_data(row),),
                 depends="" if chosen is not None else why))
  return cells


def tuning_axes(row: str, algorithm: str) -> Mapping[str, Sequence[Any]]:
  """The tuning grid's axes of one Table II row and algorithm."""
  return TABLE2_ROW_TUNING.get((row, algorithm), TABLE2_TUNING[algorithm])


def _hparams(cell: Cell, algorithm: str) -> List[Tuple[str, Any]]:
  return [(k, v) for k, v in cell.flags if k in tuning_axes(cell.row, algorithm)]


def choose_setting(records: Sequence[Optional[Mapping[str, Any]]],
                   settings: Sequence[Dict[str, Any]]) -> Tuple[Optional[Dict[str, Any]], str]:
  """The setting whose tuning run has the largest best-round validation MT accuracy
  (ties: the first in grid order); `(None, reason)` while a tuning record is missing."""
  missing = sum(r is None for r in records)
  if missing:
    return None, f"waits for {missing} of {len(records)} tuning cells"
  return dict(settings[best_tuning_index(records)]), ""


def best_tuning_index(records: Sequence[Mapping[str, Any]]) -> int:
  """Index of the tuning record with the largest best-round MT accuracy (first on ties;
  non-finite scores and stopped runs lose)."""
  scores = np.array([-np.inf if records_lib.stopped(r) else
                      records_lib.best_value(r, "mt_accuracy") for r in records])
  return int(np.argmax(np.where(np.isfinite(scores), scores, -np.inf)))


def pfnm_cells() -> List[Cell]:
  """PFNM's accuracy vs J on MNIST (Figs. 2 and 3): one cell per (partition, J, trial)."""
  cells = []
  for partition in PFNM_PARTITIONS:
    for J in PFNM_J:
      for trial in PFNM_TRIALS:
        flags = dict(dataset="mnist", data_dir=_data("mnist"), partition=partition, J=J,
                     trials=1, seed=trial, methods=",".join(PFNM_METHODS))
        cells.append(
            Cell("pfnm", "j_sweep", partition, "all", f"J={J}", trial, "pfnm_batches",
                 tuple(sorted(flags.items())), 60.0 + 10.0 * J, ("mnist",)))
  return cells


def fola_cells() -> List[Cell]:
  """FOLA on MNIST-MLP: first-round GA over alpha (Fig. 2a), curves at alpha 0.01 (Fig. 3a)."""
  cells = []
  for alpha in FOLA_ALPHAS:
    for rep in FOLA_REPEATS:
      flags = dict(FOLA_BASE, data_dir=_data("mnist"), sweep="alpha", alphas=str(alpha),
                   alpha=alpha, repeats=1, seed=rep, methods=",".join(FOLA_METHODS))
      cells.append(
          Cell("fola", "first_round", "mnist_mlp", "all", f"alpha={fmt_number(alpha)}", rep,
               "fola_first_round", tuple(sorted(flags.items())), 240.0, ("mnist",)))
  for rep in FOLA_REPEATS:
    flags = dict(FOLA_BASE, data_dir=_data("mnist"), alphas="0.01", rounds=FOLA_CURVE_ROUNDS,
                 seed=rep, methods=",".join(FOLA_METHODS))
    cells.append(
        Cell("fola", "curves", "mnist_mlp", "all", "alpha=0.01", rep, "fola_curves",
             tuple(sorted(flags.items())), 60.0 * FOLA_CURVE_ROUNDS, ("mnist",)))
  return cells


# VIRTUAL's scales with an Adam step of their own (`--scale_optimizer`, issue 34).
SCALE_ADAM = dict(scale_optimizer="adam", scale_lr=1e-3)

# ------------------------------------------- the papers' other tables and figures
# VIRTUAL's FEMNIST experiments beyond Table II run at Table II's tuned FEMNIST-MLP
# setting of each algorithm (`tuned_setting`), on its protocol (test split, 100
# rounds) unless said otherwise; they wait until that setting is chosen.
FEMNIST_ROW = "femnist_mlp"
# Table III (Sec. IV-F): SNR pruning of the clients' deltas, VIRTUAL and "VIRTUAL +
# FedAvg init". VIRTUAL at 0 % is Table II's own tuned cell (not run again).
TABLE3_PERCENTILES = (0.0, 50.0, 75.0, 90.0)
TABLE3_VARIANTS = {"virtual": {}, "virtual_fedavg_init": dict(fedavg_init=True)}
TABLE3_SEEDS = (0, 1, 2)
# The paper's Table III: percentile -> variant -> (MT, S), and its delta sizes.
VIRTUAL_TABLE3 = {0.0: dict(virtual=(95.6, 90.9), virtual_fedavg_init=(86.2, 89.4)),
                  50.0: dict(virtual=(94.3, 89.2), virtual_fedavg_init=(76.3, 81.8)),
                  75.0: dict(virtual=(94.9, 90.8), virtual_fedavg_init=(78.7, 80.4)),
                  90.0: dict(virtual=(48.5, 20.3), virtual_fedavg_init=(25.5, 21.0))}
VIRTUAL_TABLE3_DELTA = {0.0: "158k", 50.0: "79k", 75.0: "40k", 90.0: "16k"}
# Fig. 4: per-layer SNR CDFs of the final client posteriors, one run per variant.
SNR_SEEDS = (0,)
# Fig. 4's runs at the paper's plain SGD ("prune=0"), and (ours) with the scales' own
# Adam step, under which the posterior variances learn (issue 34).
SNR_SETTINGS = {"prune=0": {}, "prune=0,scale_adam": SCALE_ADAM}
# Table IV / Fig. 6: E = 100 epochs a round (App. A).
TABLE4_ALGORITHMS = ("virtual", "fedavg", "fedprox")
TABLE4_EPOCHS = 100
TABLE4_SEEDS = (0, 1, 2)
VIRTUAL_TABLE4 = {"femnist_mlp": {"MT": dict(fedavg=92.7, fedprox=92.8, virtual=93.2),
                                  "S": dict(fedavg=86.2, fedprox=86.6, virtual=87.6)},
                  "femnist_conv": {"MT": dict(fedavg=97.0, fedprox=97.3, virtual=98.2),
                                   "S": dict(fedavg=95.5, fedprox=95.6, virtual=97.3)}}
# Fig. 2: beta from 1e-6 to 1 (at 1 the KL term is the same order as the data term's
# cross-entropy per client); the tuned beta's cells are Table II's.
BETAS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
BETA_SEEDS = (0, 1)
# A training cell estimated above CHECKPOINT_AFTER_S (quiet; a loaded machine takes 2-3x)
# checkpoints every CHECKPOINT_EVERY rounds, so that a stopped campaign loses minutes of
# it, not the cell (`_checkpointed`; how often a run checkpoints decides no result).
CHECKPOINT_EVERY = 5
CHECKPOINT_AFTER_S = 300.0
# Launchers whose training runs checkpoint (`--checkpoint_every`) and continue from a
# checkpoint (`--resume`): one run per cell (`train`) or one per method (`fola_curves`).
RESUMABLE_LAUNCHERS = ("train", "fola_curves")
# Table II's FEMNIST-conv row: at the MLP row's tuned settings (no grid of its own:
# ~85 s a round, measured).
CONV_ROW = "femnist_conv"
# (ours) The conv row's baselines also at the default server step (plain averaging, as
# the paper's FedAvg and FedProx): at the MLP row's tuned steps some of their conv runs
# diverge (docs/reproduction.md).
CONV_DEFAULT_STEP_ALGORITHMS = ("fedavg", "fedprox")
# VIRTUAL v1 Table 2 (virtual_v1.txt): 10 clients, all in every round, Local, Global,
# FedAvg and VIRTUAL, MT accuracy over splits (the seed draws the partition).
V1_ROWS = ("mnist", "pmnist")
V1_ALGORITHMS = ("local", "global", "fedavg", "virtual")
V1_SEEDS = (0, 1, 2)
V1_FLAGS = dict(num_clients=10, clients_per_round=10, rounds=10, epochs_per_round=5,
                batch_size=20, eval_every=1, export=False)
V1_PAPER = {"mnist": dict(global_=96.78, local=95.11, fedavg=96.75, virtual=96.66),
            "pmnist": dict(global_=44.0, local=51.0, fedavg=45.0, virtual=56.0)}

PFNM_EXTRA_METHODS = ("distillation", "downpour_sgd")
PFNM_DEPTHS = (1, 2, 3, 4, 5, 6)
PFNM_DEPTH_J = 10
PFNM_STREAMING = dict(J=3, steps=15)
PFNM_SENSITIVITY_J = 25
# Supplement Fig. 5: sigma^2 at sigma0^2 = 10, gamma0 = 1 for several J.
PFNM_SIGMA_J = (5, 10, 25)
# Supplement Fig. 3a: downpour SGD's accuracy vs its communication rounds (heterogeneous
# MNIST, J = 25; the paper's curve goes past 4000 rounds, ours stops at 200): one trial
# per round count, PFNM_TRIALS at the most, where the claim compares it with PFNM.
PFNM_DSGD_ROUNDS = (10, 20, 50, 100, 200)
PFNM_DSGD_J = 25

FOLA_NS = (5, 10, 20, 50, 100)
# Fig. 2(b)-(d): B, E and lr swept one at a time at FOLA_BASE, alpha FOLA_SWEEP_ALPHA.
FOLA_SWEEP_ALPHA = 0.1
FOLA_LEARNING_AXES = {"batch_size": ("batch_sizes", (8, 32, 64, 128, 254)),
                      "epochs_per_round": ("epochs_list", (1, 5, 10, 15, 20)),
                      "client_lr": ("client_lrs", (1.0, 0.1, 0.01, 0.001, 0.0001))}
# Fig. 3(a) for more N, the offline Laplace method beside the three.
FOLA_CURVE_NS = (5, 20, 100)
FOLA_CURVE_METHODS = FOLA_METHODS + ("laplace_offline",)


def _row_setting(records: Mapping[str, Mapping[str, Any]], row: str, algorithm: str,
                 choose: Callable[..., Tuple[Optional[Dict[str, Any]], str]] = tuned_setting
                 ) -> Tuple[Dict[str, Any], str]:
  """Table II's tuned setting of (row, algorithm) (`choose=grid_setting`: its grid's, at
  the default server step) and why it is not chosen yet ('')."""
  chosen, why = choose(records, row, algorithm)
  return dict(chosen or {}), ("" if chosen is not None else
                              f"Table II's {row} {algorithm} tuning: {why}")


def _femnist_train_cell(records, experiment_name: str, algorithm: str, label: str,
                        setting: str, seed: int, extra: Mapping[str, Any], *,
                        tuned_as: str = "", row: str = FEMNIST_ROW, rounds_cost: float = 1.0,
                        launcher: str = "train", default_step: bool = False) -> Cell:
  """A training cell at Table II's tuned FEMNIST-MLP setting of `tuned_as` (default
  `algorithm`; `default_step`: its tuning grid's setting, whose server step is the
  default), `extra` flags on top; `label` is the cell's algorithm field."""
  hp, why = _row_setting(records, FEMNIST_ROW, tuned_as or algorithm,
                         grid_setting if default_step else tuned_setting)
  flags = dict(_table2_flags(row, algorithm, dict(hp, **extra), TABLE2_ROUNDS["final"], seed,
                             False))
  if launcher != "train":
    for key in ("algorithm", "export"):
      flags.pop(key)
  return Cell("virtual", experiment_name, row, label, setting, seed, launcher,
              tuple(sorted(flags.items())),
              _train_estimate_s(FEMNIST_ROW, algorithm, TABLE2_ROUNDS["final"], False, rounds_cost),
              (_row_data(row),), depends=why)


# Issue 34: VIRTUAL settings whose predictive may be calibrated, beside today's tuned
# setting and FedAvg's, on the tuning protocol (validation split, TABLE2_ROUNDS["tune"]
# rounds) of every Table II row: each setting changes the row's tuned VIRTUAL setting
# only where it says. "scale_adam": the scales' own Adam step (`--scale_optimizer`);
# "private_kl": the private KL's own weight (`--private_kl_weight`); "temperature_scaling":
# one temperature for S and one for MT fitted on calibration splits held out of the
# clients' training data (`--temperature_scaling`), what a user might pick instead of a
# Bayesian method, or on top of one.
TEMPERATURE_SCALING = dict(temperature_scaling=True, calibration_fraction=0.2)
CALIBRATION_SETTINGS = (
    ("tuned", {}),
    ("eval_samples=10", dict(eval_samples=10)),
    ("scale_adam", SCALE_ADAM),
    ("scale_adam,eval_samples=10", dict(SCALE_ADAM, eval_samples=10)),
    ("scale_adam=0.01,eval_samples=10", dict(SCALE_ADAM, scale_lr=1e-2, eval_samples=10)),
    # The private KL at Bayes by backprop's weight 1 instead of beta (`--private_kl_weight`).
    ("private_kl=1,eval_samples=10", dict(private_kl_weight=1.0, eval_samples=10)),
    # The Monte Carlo predictive, post-hoc calibrated as FedAvg's is below.
    ("eval_samples=10,temperature_scaling", dict(TEMPERATURE_SCALING, eval_samples=10)),
)
# What a user might pick instead: FedAvg at its tuned setting, with and without fitted
# temperatures; FOLA (not a Table II algorithm: no tuning of its own) at FedAvg's tuned
# client setting, its S at the server Gaussian's mean and as its Laplace predictive, at the
# smallest prior precision (the widest spread) that stayed within 0.002 of the mean's S NLL
# on digits (docs/paper-experiments.md, "The Laplace predictive").
LAPLACE_PREDICTIVE = dict(laplace_samples=10, laplace_prior_precision=1e4)
CALIBRATION_BASELINE_SETTINGS = {
    "fedavg": (("tuned", {}), ("temperature_scaling", TEMPERATURE_SCALING)),
    "fola": (("mean", {}), ("laplace_samples=10", LAPLACE_PREDICTIVE)),
}
CALIBRATION_BASELINES = tuple(CALIBRATION_BASELINE_SETTINGS)
CALIBRATION_SEEDS = (0, 1)


def calibration_setting(records: Mapping[str, Mapping[str, Any]], row: str,
                        algorithm: str) -> Tuple[Optional[Dict[str, Any]], str]:
  """The setting a calibration cell of `algorithm` starts from: the row's tuned one
  (`tuned_setting`); FOLA's is FedAvg's without the server step (FOLA's server takes
  the Gaussian product, no step)."""
  if algorithm != "fola":
    return tuned_setting(records, row, algorithm)
  chosen, why = tuned_setting(records, row, "fedavg")
  return (None if chosen is None else
          {k: v for k, v in chosen.items() if k != "server_lr"}), why


def calibration_cells(records: Mapping[str, Mapping[str, Any]]) -> List[Cell]:
  """Issue 34's cells: `CALIBRATION_SETTINGS` of VIRTUAL and the baselines'
  `CALIBRATION_BASELINE_SETTINGS`, per Table II row and seed, on the tuning protocol
  (waiting for the row's tuning)."""
  cells = []
  for row in TABLE2_ROWS:
    for algorithm in ("virtual",) + CALIBRATION_BASELINES:
      chosen, why = calibration_setting(records, row, algorithm)
      settings = (CALIBRATION_SETTINGS if algorithm == "virtual" else
                  CALIBRATION_BASELINE_SETTINGS[algorithm])
      cells += [_knob_cell("calibration", row, algorithm, name, knob, seed, chosen, why)
                for name, knob in settings for seed in CALIBRATION_SEEDS]
  return cells


# Issue 34, item 4: the setting the calibration cells choose, on Table II's protocol (test
# split, TABLE2_ROUNDS["final"] rounds, TABLE2_SEEDS) beside the row's tuned cells.
CALIBRATED_EXPERIMENT = "table2_calibrated"
# VIRTUAL's default evaluation since issue 34, a CALIBRATION_SETTINGS entry: on Table II's
# protocol also where a row's chosen setting changes more than it.
DEFAULT_EVALUATION = "eval_samples=10"


def calibration_choice(records: Mapping[str, Mapping[str, Any]],
                       row: str) -> Tuple[Optional[str], str]:
  """The VIRTUAL `CALIBRATION_SETTINGS` entry of `row` with the lowest mean final MT NLL
  below the tuned setting's, among those whose mean final MT accuracy is within one
  standard error of the tuned setting's, once every setting has its `CALIBRATION_SEEDS`
  recorded; `(None, why)` before that or when none qualifies."""
  finals = {}
  for name, knob in CALIBRATION_SETTINGS:
    recs = [records.get(_knob_cell("calibration", row, "virtual", name, knob, s, None, "").name)
            for s in CALIBRATION_SEEDS]
    if any(r is None for r in recs):
      return None, (f"every {row} VIRTUAL calibration setting at seeds "
                    f"{', '.join(map(str, CALIBRATION_SEEDS))} (first missing: {name})")
    finals[name] = (_runs.mean_se(records_lib.final_values(recs, "mt_loss")),
                    _runs.mean_se(records_lib.final_values(recs, "mt_accuracy")))
  (tuned_nll, _, _), (tuned_acc, tuned_se, _) = finals["tuned"]
  candidates = [(nll, name) for name, ((nll, _, _), (acc, _, _)) in finals.items()
                if name != "tuned" and nll < tuned_nll and acc >= tuned_acc - tuned_se]
  if not candidates:
    return None, (f"no {row} calibration setting lowered the tuned MT NLL at an MT accuracy "
                  "within one s.e. of the tuned one's")
  return min(candidates)[1], ""


def calibrated_table2_cells(records: Mapping[str, Mapping[str, Any]]) -> List[Cell]:
  """Issue 34's chosen setting (`calibration_choice`) per row on Table II's protocol and,
  where that changes more, VIRTUAL's default evaluation alone (`DEFAULT_EVALUATION`)."""
  cells = []
  rounds = TABLE2_ROUNDS["final"]
  knobs = dict(CALIBRATION_SETTINGS)
  for row in TABLE2_ROWS:
    tuned, why = tuned_setting(records, row, "virtual")
    name, why_choice = calibration_choice(records, row)
    settings = [(name or "chosen", knobs.get(name, {}), why_choice or why)]
    if name != DEFAULT_EVALUATION:
      settings.append((DEFAULT_EVALUATION, knobs[DEFAULT_EVALUATION], why))
    for setting, knob, depends in settings:
      for seed in TABLE2_SEEDS:
        cells.append(
            Cell("virtual", CALIBRATED_EXPERIMENT, row, "virtual", setting, seed, "train",
                 _table2_flags(row, "virtual", dict(tuned or {}, **knob), rounds, seed, False),
                 _train_estimate_s(row, "virtual", rounds, False, _evaluation_cost(knob)),
                 (_row_data(row),), depends=depends))
  return cells


def virtual_figure_cells(records: Mapping[str, Mapping[str, Any]]) -> List[Cell]:
  """VIRTUAL's Table III, Fig. 4, Table IV (MLP), Fig. 2 and FEMNIST-conv cells (the conv
  row's baselines at their tuned and at the default server step)."""
  cells = []
  for variant, extra in TABLE3_VARIANTS.items():
    for p in TABLE3_PERCENTILES:
      if variant == "virtual" and p == 0.0:
        continue  # Table II's tuned cells
      for seed in TABLE3_SEEDS:
        knob = dict(extra, prune_percentile=p) if p else dict(extra)
        cells.append(_femnist_train_cell(records, "table3", "virtual", variant,
                                         f"prune={fmt_number(p)}", seed, knob, tuned_as="virtual"))
  for setting, knob in SNR_SETTINGS.items():
    for variant in TABLE3_VARIANTS:
      for seed in SNR_SEEDS:
        cells.append(_femnist_train_cell(records, "snr_cdf", "virtual", variant, setting, seed,
                                         dict(knob, variants=variant),
                                         launcher="virtual_snr_cdf"))
  for algorithm in TABLE4_ALGORITHMS:
    for seed in TABLE4_SEEDS:
      cells.append(_femnist_train_cell(records, "table4", algorithm, algorithm,
                                       f"E={TABLE4_EPOCHS}", seed,
                                       dict(epochs_per_round=TABLE4_EPOCHS),
                                       rounds_cost=TABLE4_EPOCHS / 20))
  tuned_beta = _row_setting(records, FEMNIST_ROW, "virtual")[0].get("kl_weight")
  for beta in BETAS:
    if beta == tuned_beta:
      continue  # Table II's tuned cells
    for seed in BETA_SEEDS:
      cells.append(_femnist_train_cell(records, "beta", "virtual", "virtual",
                                       setting_name(dict(kl_weight=beta)), seed,
                                       dict(kl_weight=beta)))
  for algorithm in TABLE4_ALGORITHMS:
    for seed in TABLE2_SEEDS:
      cells.append(_femnist_train_cell(records, "table2_conv", algorithm, algorithm,
                                       "mlp_tuned", seed,
                                       presets.preset(CONV_ROW),
                                       row=CONV_ROW, rounds_cost=25.0))
  for algorithm in CONV_DEFAULT_STEP_ALGORITHMS:
    for seed in TABLE2_SEEDS:
      cells.append(_femnist_train_cell(records, "default_step", algorithm, algorithm,
                                       DEFAULT_STEP, seed, presets.preset(CONV_ROW),
                                       row=CONV_ROW, rounds_cost=25.0, default_step=True))
  return cells


def v1_cells() -> List[Cell]:
  """VIRTUAL v1 Table 2 on MNIST and P-MNIST: 10 clients, each seed its own split."""
  cells = []
  for row in V1_ROWS:
    for algorithm in V1_ALGORITHMS:
      for seed in V1_SEEDS:
        flags = dict(V1_FLAGS, dataset=row, data_dir=_data("mnist"), algorithm=algorithm,
                     seed=seed, **_paper_evaluation(algorithm))
        if row == "mnist":
          flags["partition"] = "homogeneous"
        cells.append(Cell("virtual_v1", "v1_table2", row, algorithm, "default", seed, "train",
                          tuple(sorted(flags.items())),
                          TRAIN_STARTUP_S + 10 * 8 * TRAIN_SECONDS_PER_ROUND.get(algorithm, 3.0),
                          ("mnist",)))
  return cells


def _pfnm_cell(experiment_name: str, partition: str, setting: str, trial: int, launcher: str,
               estimate_s: float, **flags: Any) -> Cell:
  flags = dict(dataset="mnist", data_dir=_data("mnist"), partition=partition, trials=1,
               seed=trial, **flags)
  return Cell("pfnm", experiment_name, partition, "all", setting, trial, launcher,
              tuple(sorted(flags.items())), estimate_s, ("mnist",))


def pfnm_figure_cells() -> List[Cell]:
  """PFNM's Fig. 3 extra baselines (KD, downpour SGD), Fig. 4 (depth at J = 10), the
  supplement's streaming experiment, its sensitivity grids (J = 25, Fig. 4), sigma^2
  for several J (Fig. 5) and downpour SGD over its communication rounds (Fig. 3a)."""
  cells = []
  for partition in PFNM_PARTITIONS:
    for trial in PFNM_TRIALS:
      for J in PFNM_J:
        cells.append(_pfnm_cell("extra", partition, f"J={J}", trial, "pfnm_batches",
                                60.0 + 20.0 * J, J=J, methods=",".join(PFNM_EXTRA_METHODS)))
      for C in PFNM_DEPTHS:
        cells.append(_pfnm_cell("depth", partition, f"C={C}", trial, "pfnm_depth",
                                120.0 + 60.0 * C, C=C, J=PFNM_DEPTH_J))
      cells.append(_pfnm_cell("streaming", partition,
                              f"J={PFNM_STREAMING['J']},S={PFNM_STREAMING['steps']}", trial,
                              "pfnm_streaming", 900.0, **PFNM_STREAMING))
      cells.append(_pfnm_cell("sensitivity", partition, f"J={PFNM_SENSITIVITY_J}", trial,
                              "pfnm_sensitivity", 1800.0, J=PFNM_SENSITIVITY_J))
      for J in PFNM_SIGMA_J:
        cells.append(_pfnm_cell("sensitivity_sigma", partition, f"J={J}", trial,
                                "pfnm_sensitivity", 60.0 + 12.0 * J, J=J, sigma0_sq_grid=10.0,
                                gamma0_grid=1.0))
  for rounds in PFNM_DSGD_ROUNDS:
    for trial in PFNM_TRIALS if rounds == max(PFNM_DSGD_ROUNDS) else PFNM_TRIALS[:1]:
      cells.append(_pfnm_cell("dsgd_rounds", "class_dirichlet", f"rounds={rounds}", trial,
                              "pfnm_batches", 60.0 + 15.0 * rounds, J=PFNM_DSGD_J,
                              methods="downpour_sgd", comm_rounds=rounds))
  return cells


def _fola_cell(experiment_name: str, setting: str, rep: int, launcher: str, estimate_s: float,
               algorithm: str = "all", **flags: Any) -> Cell:
  flags = dict(FOLA_BASE, data_dir=_data("mnist"), seed=rep, **flags)
  return Cell("fola", experiment_name, "mnist_mlp", algorithm, setting, rep, launcher,
              tuple(sorted(flags.items())), estimate_s, ("mnist",))


def fola_figure_cells() -> List[Cell]:
  """FOLA's Fig. 2(a) over alpha x N, Fig. 2(b)-(d) over B, E and lr, and Fig. 3(a)
  for more N with the offline Laplace method."""
  cells = []
  methods = ",".join(FOLA_METHODS)
  for n in FOLA_NS:
    if n == FOLA_BASE["num_clients"]:
      continue  # the first_round cells
    for alpha in FOLA_ALPHAS:
      for rep in FOLA_REPEATS:
        cells.append(_fola_cell("first_round_n", f"N={n},alpha={fmt_number(alpha)}", rep,
                                "fola_first_round", 120.0 + 2.0 * n, num_clients=n,
                                sweep="alpha", alphas=str(alpha), alpha=alpha, repeats=1,
                                methods=methods))
  for axis, (list_flag, values) in FOLA_LEARNING_AXES.items():
    for v in values:
      cost = 1.0 + (v / FOLA_BASE["epochs_per_round"] if axis == "epochs_per_round" else 0.0)
      for rep in FOLA_REPEATS:
        cells.append(_fola_cell(f"first_round_{axis}", f"{axis}={fmt_number(v)}", rep,
                                "fola_first_round", 150.0 * cost, sweep=axis,
                                **{list_flag: str(v)}, alpha=FOLA_SWEEP_ALPHA,
                                alphas=str(FOLA_SWEEP_ALPHA), repeats=1, methods=methods))
  for n in FOLA_CURVE_NS:
    for rep in FOLA_REPEATS:
      if n == FOLA_BASE["num_clients"]:  # the curves cells ran the other three
        cells.append(_fola_cell("curves", "alpha=0.01", rep, "fola_curves",
                                40.0 * 60 * FOLA_CURVE_ROUNDS / 30, algorithm="laplace_offline",
                                alphas="0.01", rounds=FOLA_CURVE_ROUNDS,
                                methods="laplace_offline"))
        continue
      cells.append(_fola_cell("curves_n", f"N={n},alpha=0.01", rep, "fola_curves",
                              160.0 * 60 * FOLA_CURVE_ROUNDS / 30, num_clients=n, alphas="0.01",
                              rounds=FOLA_CURVE_ROUNDS, methods=",".join(FOLA_CURVE_METHODS)))
  return cells


def smoke_cells() -> List[Cell]:
  """Three cheap cells on the bundled digits (2 rounds, 1 epoch): the runner's own check."""
  cells = []
  for seed in (0, 1, 2):
    flags = dict(dataset="digits", algorithm="fedavg", rounds=2, epochs_per_round=1, seed=seed,
                 export=False)
    cells.append(
        Cell("smoke", "digits", "digits", "fedavg", "default", seed, "train",
             tuple(sorted(flags.items())), 20.0))
  return cells


CATALOGUES = {"papers": lambda records: (table2_cells(records) + default_step_cells(records) +
                                         ablation_cells(records) + virtual_figure_cells(records) +
                                         v1_cells() + pfnm_cells() + pfnm_figure_cells() +
                                         fola_cells() + fola_figure_cells() +
                                         calibration_cells(records) +
                                         calibrated_table2_cells(records)),
              "smoke": lambda records: smoke_cells()}


def _checkpointed(cell: Cell) -> Cell:
  """`cell`, checkpointing every CHECKPOINT_EVERY rounds if its launcher is one of
  RESUMABLE_LAUNCHERS and it is estimated above CHECKPOINT_AFTER_S."""
  if (cell.launcher not in RESUMABLE_LAUNCHERS or cell.estimate_s <= CHECKPOINT_AFTER_S or
      "checkpoint_every" in cell.flag_dict):
    return cell
  flags = dict(cell.flag_dict, checkpoint_every=CHECKPOINT_EVERY)
  return dataclasses.replace(cell, flags=tuple(sorted(flags.items())))


def catalogue(records: Mapping[str, Mapping[str, Any]], name: str = "papers") -> List[Cell]:
  """Every cell of catalogue `name` (the tuned cells' settings come from `records`)."""
  if name not in CATALOGUES:
    raise ValueError(f"--catalogue must be one of {sorted(CATALOGUES)}, got {name!r}.")
  return [_checkpointed(c) for c in CATALOGUES[name](records)]


def _rejoin_settings(pieces: Sequence[str]) -> List[str]:
  joined: List[str] = []
  for piece in pieces:
    if joined and "=" in piece.strip().split("/", 1)[0]:
      joined[-1] += "," + piece.strip()
    else:
      joined.append(piece)
  return joined


def select(cells: Sequence[Cell], patterns: Sequence[str]) -> List[Cell]:
  """The cells whose name matches one of the shell-style `patterns` (a pattern without
  a wildcard also matches everything below it: `virtual/table2` = `virtual/table2/*`).

  `patterns` may come from a comma-split flag: a piece whose first path segment is a
  `key=value` setting cannot begin a cell name, so it is joined back to the piece before
  it (`...client_lr=0.1`, `kl_weight=1e-05/seed0` is the one name `--list` printed).
  """
  pats = []
  for p in _rejoin_settings(patterns):
    p = p.strip().strip("/")
    if p:
      pats += [p] if any(ch in p for ch in "*?[") else [p, p + "/*"]
  if not pats:
    return list(cells)
  chosen = [c for c in cells if any(fnmatch.fnmatchcase(c.name, p) for p in pats)]
  if not chosen:
    raise ValueError(f"--cells {','.join(patterns)} matches no cell; `--list` shows the names.")
  return chosen

"""FOLA paper experiments: Fig. 2 (first-round accuracy grids) and Fig. 3 (learning
curves per alpha), driven by `launchers/fola_first_round.py` and
`launchers/fola_curves.py` over `tfbfl.driver.run_training` runs.

The algorithms themselves are `tfbfl.algorithms.fola` (FOLA, offline Laplace,
FedCurv); this module holds what the experiments add: the extra method
`product_identity` (FedAvg as a Gaussian product with unit precisions, for the
CNN), the launchers' shared flags, the sweeps, CSV/markdown summaries and plots.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Dict, Iterable, List, Sequence

from absl import flags as absl_flags
import numpy as np

from tfbfl import data as data_lib
from tfbfl import driver
from tfbfl import round_loop
from tfbfl import runtime
from tfbfl.algorithms import registry
from tfbfl.algorithms.fola import FolaAlgorithm
from reproduction import _runs


def _product_identity(data, p):
  """FOLA's config for the flags `p`, with unit precisions and no penalty."""
  config = registry.get("fola").make_config(p, data)
  return FolaAlgorithm(dataclasses.replace(config, fisher="identity", fola_lambda=0.0),
                       name="product_identity")


# Methods of the experiment drivers below that are not registry names:
# the Gaussian product with unit precisions and no penalty, i.e. FedAvg.
EXTRA_METHODS = {"product_identity": _product_identity}


def method_for_model(method: str, model: str, log=print) -> str:
  """The method to run for `method` on `model`.

  The registry's `fedavg` trains the MLP only; on the CNN it is replaced by
  `product_identity` (the Gaussian product with unit precisions and no penalty,
  tested to be FedAvg's round), with a message.
  """
  if method == "fedavg" and model == "cnn":
    log("[fola] --architecture=cnn: running FedAvg as 'product_identity' (the registry's fedavg "
        "trains the MLP only).")
    return "product_identity"
  return method


def build_method(data, params):
  """An algorithm for `params["algorithm"]`: a registry name or `EXTRA_METHODS`."""
  name = params["algorithm"]
  if name in EXTRA_METHODS:
    return EXTRA_METHODS[name](data, params)
  return driver.build_algorithm(data, params)


# ------------------------------------------------------- experiment drivers
CIFAR10_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
                 "test_batch", "batches.meta")


def check_dataset_available(dataset: str) -> None:
  """Raises ValueError naming what is missing when `dataset` has no loader yet."""
  if dataset in data_lib.DATASETS:
    return
  if dataset == "cifar10":
    raise ValueError(
        "--dataset=cifar10 needs the CIFAR-10 loader (dataset 'cifar10' in tfbfl.data) and the "
        "CIFAR-10 python batches in --data_dir: "
        f"{', '.join(CIFAR10_FILES)} (cifar-10-python.tar.gz from "
        "https://www.cs.toronto.edu/~kriz/cifar.html).")
  raise ValueError(f"--dataset must be one of {sorted(data_lib.DATASETS)}, got {dataset!r}.")


def _resolve(params: Dict[str, Any]) -> Dict[str, Any]:
  """`driver.resolve_params` for every method name, `EXTRA_METHODS` included."""
  p = dict(params)
  extra = p.get("algorithm") in EXTRA_METHODS
  if extra:
    name, p["algorithm"] = p["algorithm"], "fola"
  p = driver.resolve_params(p)
  if extra:
    p["algorithm"] = name
  return p


def _methods_to_run(base_params: Dict[str, Any], methods: Sequence[str], log) -> List[str]:
  """`methods` as run on `base_params`' model (`method_for_model`), once the
  dataset is known to load (`check_dataset_available`). Checked before any run: a
  name no run could take is an error naming `--methods`."""
  known = sorted(set(driver.algorithm_names()) | set(EXTRA_METHODS))
  unknown = [m for m in methods if m not in known]
  if not methods or unknown:
    raise ValueError(f"--methods must be a non-empty list of {known}; got {list(methods)}" +
                     (f" ({unknown} unknown)." if unknown else "."))
  check_dataset_available(base_params.get("dataset", driver.DEFAULTS["dataset"]))
  model = base_params.get("architecture", "mlp")
  return [method_for_model(m, model, log) for m in methods]


SWEEP_AXES = ("alpha", "num_clients", "batch_size", "epochs_per_round", "client_lr")

# The method hyperparameters the FOLA launchers expose as float flags (defaults
# and help texts: `driver.settings()`).
_METHOD_FLAGS = ("fola_lambda", "fola_gamma", "fola_eps", "fola_clip_norm", "compress_p",
                 "fedcurv_lambda")
# Training flags both launchers take as they are (the paper's E and B as defaults).
_BASE_FLAGS = ("dataset", "num_clients", "batch_size", "epochs_per_round", "client_lr", "seed")


def define_launcher_flags() -> None:
  """Defines the absl flags the FOLA launchers share.

  `--methods`, `--alphas`, `--data_dir`, `--hidden_units` (paper: 500,300), the
  base settings `--dataset`, `--num_clients`, `--batch_size` (paper: 32),
  `--epochs_per_round` (paper: 5), `--client_lr`, `--seed`, and the method
  hyperparameters (`--fola_lambda`, `--fola_gamma`, `--fola_eps`,
  `--fola_clip_norm`, `--compress_p`, `--fedcurv_lambda`). Help texts, and the
  defaults the paper does not set, come from `driver.settings()`. A launcher
  calls it once at import, then `flags.adopt_module_key_flags(fola_figures)` to
  list them in its own `--helpshort`; `launcher_params(FLAGS)` reads them back.
  """
  d, help_of = driver.DEFAULTS, _runs.flag_help
  absl_flags.DEFINE_list("methods", ["fola", "fedavg", "fedcurv"], "Methods to compare.")
  absl_flags.DEFINE_list("alphas", ["0.01", "0.1", "1", "10", "100"], "Dirichlet concentrations.")
  absl_flags.DEFINE_string("data_dir", None, help_of("data_dir"))
  absl_flags.DEFINE_list("hidden_units", ["500", "300"], help_of("hidden_units", paper="500,300"))
  absl_flags.DEFINE_string(
      "dataset", d["dataset"],
      help_of("dataset", paper="mnist with the 784-500-300-10 MLP, cifar10 with the CNN"))
  absl_flags.DEFINE_integer("num_clients", d["num_clients"],
                            help_of("num_clients", note="all take part in every round"))
  absl_flags.DEFINE_integer("batch_size", 32, help_of("batch_size", paper=32))
  absl_flags.DEFINE_integer("epochs_per_round", 5, help_of("epochs_per_round", paper=5))
  absl_flags.DEFINE_float("client_lr", d["client_lr"], help_of("client_lr"))
  absl_flags.DEFINE_integer(
      "seed", d["seed"], help_of("seed",
                                 note="fola_first_round's repeats use --seed, --seed+1, ..."))
  for name in _METHOD_FLAGS:
    absl_flags.DEFINE_float(name, d[name], help_of(name))


def launcher_params(flag_values) -> Dict[str, Any]:
  """The base settings, `data_dir`, `hidden_units` (ints) and the method
  hyperparameters, from the flags of `define_launcher_flags`, as `training`
  parameters."""
  return dict(data_dir=flag_values.data_dir,
              hidden_units=tuple(int(h) for h in flag_values.hidden_units),
              **{name: getattr(flag_values, name) for name in _BASE_FLAGS + _METHOD_FLAGS})


def first_round_accuracy(base_params: Dict[str, Any],
                         methods: Sequence[str],
                         sweeps: Dict[str, Sequence[Any]],
                         repeats: int = 3,
                         log=print) -> List[Dict[str, Any]]:
  """Global accuracy (S) after the first round, one axis at a time (Fig. 2).

  For each axis in `sweeps` (names in `SWEEP_AXES`) and each of its values,
  every method runs `repeats` times with seeds `seed, seed+1, ...` (each repeat
  redraws the partition, the initialisation and the minibatches), all other
  settings at `base_params`; partition `label_dirichlet` (q_n ~ Dir(alpha p)) and
  full participation, as in the paper. A method that is not available (e.g.
  `fedavg` before `tfbfl.algorithms.fedavg` exists) is skipped with a message.

  Returns:
    One row per run: method, axis, value, repeat, seed, the five settings and
    `global_accuracy`, `global_loss`.
  """
  for axis in sweeps:
    if axis not in SWEEP_AXES:
      raise ValueError(f"sweep axis must be one of {SWEEP_AXES}, got {axis!r}.")
  if int(repeats) < 1:
    raise ValueError(f"--repeats must be >= 1, got {repeats}.")
  methods = _methods_to_run(base_params, methods, log)
  rows, cache, unavailable = [], {}, set()
  runtime.set_local_runtime()
  for axis, values in sweeps.items():
    for value in values:
      for method in methods:
        if method in unavailable:
          continue
        for rep in range(int(repeats)):
          p = dict(base_params,
                   algorithm=method,
                   partition="label_dirichlet",
                   rounds=1,
                   eval_every=1,
                   output_dir=None,
                   verbose=False,
                   resume=False)
          p[axis] = value
          p["seed"] = int(base_params.get("seed", 0)) + rep
          p["clients_per_round"] = p["num_clients"]
          p = _resolve(p)
          fd = driver.load_data(p)
          # The algorithm depends on the data only through shapes: reuse it
          # across alphas (the expensive part is building the computations).
          key = (method, tuple(sorted((k, str(v)) for k, v in p.items() if k != "alpha")))
          if key not in cache:
            try:
              cache[key] = build_method(fd, p)
            except ValueError as e:
              if method in driver.algorithm_names() and "not available" in str(e):
                log(f"[first_round] skipping {method}: {e}")
                unavailable.add(method)
                break
              raise
          run_config = round_loop.RunConfig(rounds=1,
                                            clients_per_round=p["num_clients"],
                                            seed=p["seed"],
                                            verbose=False)
          runner = round_loop.ExperimentRunner(cache[key], fd, run_config, flags=p)
          summary = runner.run()
          row = dict(method=method,
                     axis=axis,
                     value=value,
                     repeat=rep,
                     seed=p["seed"],
                     **{k: p[k] for k in SWEEP_AXES},
                     global_accuracy=summary["final_server_accuracy"],
                     global_loss=summary["final_server_loss"])
          rows.append(row)
          log(f"[first_round] {method:>16s} {axis}={value} repeat {rep}: "
              f"GA {row['global_accuracy']:.4f}")
  return rows


def summarise(rows: Iterable[Dict[str, Any]],
              keys=("method", "axis", "value"),
              value="global_accuracy") -> List[Dict[str, Any]]:
  """Mean, sample std (ddof = 1; 0 for one run) and count of `value` per `keys`."""
  groups: Dict[tuple, List[float]] = collections.OrderedDict()
  for r in rows:
    groups.setdefault(tuple(r[k] for k in keys), []).append(float(r[value]))
  return [
      dict(zip(keys, k),
           mean=float(np.mean(v)),
           std=float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
           count=len(v)) for k, v in groups.items()
  ]


def format_first_round_table(rows: Sequence[Dict[str, Any]]) -> str:
  """Markdown: per swept axis, methods x values, GA mean +- std (n runs)."""
  stats = summarise(rows)
  out = []
  for axis in collections.OrderedDict.fromkeys(s["axis"] for s in stats):
    values = list(collections.OrderedDict.fromkeys(s["value"] for s in stats if s["axis"] == axis))
    table = []
    for method in collections.OrderedDict.fromkeys(s["method"] for s in stats if s["axis"] == axis):
      cells = {s["value"]: s for s in stats if s["axis"] == axis and s["method"] == method}
      table.append([method] + [
          f"{cells[v]['mean']:.3f} ± {cells[v]['std']:.3f} (n={cells[v]['count']})" if v in
          cells else "" for v in values
      ])
    out += _runs.md_table([f"method \\ {axis}"] + [f"{v:g}" for v in values], table)
    out.append("")
  return "\n".join(out)


def write_rows_csv(path: str, rows: Sequence[Dict[str, Any]]) -> None:
  columns = list(rows[0]) if rows else []
  round_loop.write_csv(path, rows, columns)


def plot_first_round(path: str, rows: Sequence[Dict[str, Any]], title: str = "") -> None:
  """GA after the first round vs each swept axis, one line per method (Fig. 2)."""
  plt = _runs.pyplot()
  stats = summarise(rows)
  axes_names = list(collections.OrderedDict.fromkeys(s["axis"] for s in stats))
  fig, axes = plt.subplots(1,
                           max(1, len(axes_names)),
                           figsize=(4 * max(1, len(axes_names)), 3.5),
                           squeeze=False)
  methods = list(collections.OrderedDict.fromkeys(s["method"] for s in stats))
  styles = [("o", "-"), ("s", "--"), ("^", ":"), ("v", "-."), ("D", "-")]
  for ax, axis in zip(axes[0], axes_names):
    for k, method in enumerate(methods):
      pts = [s for s in stats if s["axis"] == axis and s["method"] == method]
      if not pts:
        continue
      marker, line = styles[k % len(styles)]  # methods that coincide stay visible
      ax.errorbar([float(s["value"]) for s in pts], [s["mean"] for s in pts],
                  yerr=[s["std"] for s in pts],
                  marker=marker,
                  linestyle=line,
                  capsize=3,
                  label=method,
                  alpha=0.85)
    if axis in ("alpha", "client_lr"):
      ax.set_xscale("log")
    ax.set_xlabel(axis)
    ax.set_ylabel("global accuracy after round 1")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(title)
  _runs.save_figure(fig, path, tight=True)


def add_best_global_accuracy(output_dir: str) -> Dict[str, Any]:
  """Adds `best_global_accuracy` (= best S accuracy) to `output_dir/summary.json`."""
  path = os.path.join(output_dir, _runs.SUMMARY)
  with open(path) as f:
    summary = json.load(f)
  summary["best_global_accuracy"] = summary["best_server_accuracy"]
  round_loop.atomic_write_text(path, json.dumps(summary, indent=2, sort_keys=True))
  return summary


def learning_curves(base_params: Dict[str, Any],
                    methods: Sequence[str],
                    alphas: Sequence[float],
                    output_dir: str,
                    log=print,
                    resume: bool = False) -> List[Dict[str, Any]]:
  """Learning curves per alpha and method (Fig. 3) through `driver.run_training`.

  Each run writes `metrics.csv`, `summary.json` (with `best_global_accuracy`) and
  `curves.png` to `output_dir/<method>/alpha_<alpha>`. Partition
  `label_dirichlet`, full participation. Returns one row per run (method, alpha,
  best/final global accuracy, bytes, run directory); unavailable methods are
  skipped with a message.

  A run starts afresh in its directory, or, with `resume`, continues from the
  checkpoint there where an earlier invocation left one (`checkpoint_every` in
  `base_params` decides how often they are written; a finished run's final
  checkpoint gives its result again without training). The checkpoint must have
  been written with the same settings and data, as for `launchers.train --resume`.
  """
  methods = _methods_to_run(base_params, methods, log)
  rows = []
  for alpha in alphas:
    for method in methods:
      run_dir = os.path.join(output_dir, method, f"alpha_{alpha:g}")
      resume_run = resume and os.path.exists(os.path.join(run_dir, round_loop.CHECKPOINT))
      p = dict(base_params,
               algorithm=method,
               alpha=float(alpha),
               partition="label_dirichlet",
               output_dir=run_dir,
               resume=resume_run,
               overwrite=not resume_run,
               export=False)  # a sweep: `launchers.export` writes a run's models later
      p["clients_per_round"] = p.get("num_clients", driver.DEFAULTS["num_clients"])
      try:
        if method in EXTRA_METHODS:
          summary = _run_extra(p)
        else:
          summary = driver.run_training(p)
      except ValueError as e:
        if "not available" in str(e):
          log(f"[curves] skipping {method}: {e}")
          continue
        raise
      summary = add_best_global_accuracy(run_dir)
      rows.append(
          dict(method=method,
               alpha=float(alpha),
               best_global_accuracy=summary["best_global_accuracy"],
               final_global_accuracy=summary["final_server_accuracy"],
               bytes_up_total=summary.get("bytes_up_total"),
               bytes_down_total=summary.get("bytes_down_total"),
               wall_time_s=summary["wall_time_s"],
               run_dir=run_dir))
      log(f"[curves] {method} alpha={alpha:g}: best GA {summary['best_global_accuracy']:.4f}")
  return rows


def _run_extra(params):
  """`driver.run_training` for an `EXTRA_METHODS` name."""
  p = _resolve(params)
  fd = driver.load_data(p)
  runtime.set_local_runtime()
  algorithm = build_method(fd, p)
  run_config = round_loop.RunConfig(rounds=p["rounds"],
                                    clients_per_round=p["clients_per_round"],
                                    eval_every=p["eval_every"],
                                    seed=p["seed"],
                                    output_dir=p["output_dir"],
                                    verbose=p["verbose"],
                                    checkpoint_every=p["checkpoint_every"],
                                    resume=p["resume"],
                                    overwrite=p["overwrite"])
  flags = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}
  return round_loop.ExperimentRunner(algorithm, fd, run_config, flags=flags).run()


def plot_learning_curves(path: str, rows: Sequence[Dict[str, Any]]) -> None:
  """Global (S) accuracy per round, one panel per alpha, one line per method (Fig. 3)."""
  plt = _runs.pyplot()
  alphas = list(collections.OrderedDict.fromkeys(r["alpha"] for r in rows))
  fig, axes = plt.subplots(1,
                           max(1, len(alphas)),
                           figsize=(4 * max(1, len(alphas)), 3.5),
                           squeeze=False)
  for ax, alpha in zip(axes[0], alphas):
    for r in rows:
      if r["alpha"] != alpha:
        continue
      m = [x for x in _runs.read_metrics(r["run_dir"], numeric=True) if "server_accuracy" in x]
      ax.plot([x["round"] for x in m], [x["server_accuracy"] for x in m],
              marker=".",
              label=r["method"])
    ax.set_title(f"alpha = {alpha:g}")
    ax.set_xlabel("round")
    ax.set_ylabel("global accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  _runs.save_figure(fig, path, tight=True)

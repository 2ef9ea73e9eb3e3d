"""The PFNM paper's experiments as a library; the launchers are thin absl shells.

* ``run_batches``: accuracy and global model size against the number of batches
  ``J`` (paper Figs. 2 and 3);
* ``run_depth``: against the number of hidden layers ``C`` at ``J = 10`` (Fig. 4,
  supplement Fig. 2b);
* ``run_streaming``: ``J`` groups revealing their data in ``S`` steps
  (supplement 4.2, Fig. 3b);
* ``run_sensitivity``: grids over ``sigma0^2``, ``gamma0`` and ``sigma^2``
  (supplement 4.3, Figs. 4 and 5).

Each writes, atomically, ``results.csv`` and ``results.md`` (one row per method
and setting: mean and std over trials), ``trials.csv`` (one row per trial),
``settings.json`` and PNG figures into an output directory, and prints a summary
line per trial, with progress lines within it (the local networks trained, each
method's accuracy, a tenth of downpour SGD's rounds or of a sensitivity grid).

Local networks are trained by ``tfbfl.algorithms.pfnm.LocalTrainer`` (TFF), the
global networks come from ``tfbfl.matching``, and the baselines from
``tfbfl.algorithms.oneshot_baselines``.

The settings, their flags and the launchers' ``main`` are in
``reproduction.pfnm_options``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from tfbfl import round_loop
from tfbfl.algorithms import oneshot_baselines as baselines
from tfbfl.algorithms import pfnm
from reproduction import _runs
from reproduction.pfnm_options import (CONSTRAINED_METHODS, DEPTH_METHODS, EXTRA_METHODS,
                                           ONESHOT_METHODS, STREAMING_METHODS,
                                           ExperimentSettings, check_at_least_one)
from tfbfl.matching import StreamingPFNM

__all__ = [
    "get_trainer",
    "run_oneshot_trial",
    "run_batches",
    "run_depth",
    "run_streaming",
    "run_sensitivity",
    "summarize",
]

LABELS = {
    "pfnm": "PFNM",
    "pfnm_small_gamma": "PFNM, small gamma0",
    "pfnm_streaming": "PFNM-Streaming",
    "fedavg_shared": "FedAvg one-shot (shared init)",
    "fedavg_independent": "FedAvg one-shot (independent init)",
    "dpmeans": "DP-means",
    "local": "Local models (average)",
    "uniform_ensemble": "U-Ens",
    "weighted_ensemble": "W-Ens",
    "distillation": "KD (pools data)",
    "downpour_sgd": "D-SGD",
}

_CONSTRAINT = {
    "uniform_ensemble": baselines.CONSTRAINT["uniform_ensemble"],
    "weighted_ensemble": baselines.CONSTRAINT["weighted_ensemble"],
    "distillation": baselines.CONSTRAINT["distillation"],
    "downpour_sgd": baselines.CONSTRAINT["downpour_sgd"],
}

# ------------------------------------------------------------------ trainers
_TRAINERS: Dict[pfnm.LocalTrainingConfig, pfnm.LocalTrainer] = {}


def get_trainer(cfg: pfnm.LocalTrainingConfig) -> pfnm.LocalTrainer:
  """One ``LocalTrainer`` (its TFF computations) per config, cached."""
  if cfg not in _TRAINERS:
    _TRAINERS[cfg] = pfnm.LocalTrainer(cfg)
  return _TRAINERS[cfg]


def _as_single(net):
  return (net[0][0], net[0][1], net[1][0], net[1][1])


def _row(method, net_or_size, acc, **extra):
  size = net_or_size if isinstance(net_or_size, dict) else pfnm.model_size(net_or_size)
  row = dict(method=method,
             accuracy=float(acc),
             neurons=size["neurons"],
             layers="-".join(str(l) for l in size["layers"]),
             params=size["params"])
  row.update(extra)
  return row


# ------------------------------------------------------------ one-shot trial
def run_oneshot_trial(fd,
                      settings: ExperimentSettings,
                      methods: Sequence[str],
                      seed: int,
                      hidden_units=None,
                      log: Optional[Callable[[str], None]] = None) -> List[dict]:
  """Trains the local networks of one trial and evaluates every method.

  Args:
    fd: ``FederatedData`` of the trial (its clients are the ``J`` batches).
    settings: ``ExperimentSettings``.
    methods: names from ``ONESHOT_METHODS``.
    seed: trial seed (initialisations, shuffles, matching sweeps).
    hidden_units: hidden widths (default ``settings.hidden_units``).
    log: given, a line when the local networks are trained and after each method
      (downpour SGD: ten over its rounds).

  Returns:
    One row per method: ``method, accuracy, neurons, layers, params``.
  """
  client_data = [fd.train[c] for c in fd.client_ids]
  x_test, y_test = fd.pooled("test")
  hidden = tuple(settings.hidden_units if hidden_units is None else hidden_units)
  cfg = settings.training_config(fd, hidden)
  nets_cache: Dict[tuple, list] = {}

  def trained(hidden_, shared):
    key = (tuple(hidden_), bool(shared))
    if key not in nets_cache:
      c = dataclasses.replace(cfg, hidden_units=tuple(hidden_), shared_init=bool(shared))
      nets_cache[key] = get_trainer(c).train(client_data, seed)
    return nets_cache[key]

  started = time.time()
  main = trained(hidden, cfg.shared_init)
  if log is not None:
    log(f"{len(main)} local networks trained [{time.time() - started:.0f} s]")
  nets = [c.weights for c in main]
  counts = [c.class_counts for c in main]
  hp = dataclasses.replace(settings.hp, seed=seed)
  fedavg_hidden = settings.fedavg_hidden_units or hidden
  if len(fedavg_hidden) != len(hidden):
    fedavg_hidden = (fedavg_hidden[0],) * len(hidden)
  rows = []
  for method in methods:
    started = time.time()
    if method == "pfnm":
      glob = pfnm.match_networks(nets, counts, hp)
      rows.append(_row(method, glob, pfnm.accuracy(glob, x_test, y_test)))
    elif method == "pfnm_small_gamma":
      small = dataclasses.replace(hp, gamma0=settings.small_gamma0)
      glob = pfnm.match_networks(nets, counts, small)
      rows.append(_row(method, glob, pfnm.accuracy(glob, x_test, y_test)))
    elif method in ("fedavg_shared", "fedavg_independent"):
      res = trained(fedavg_hidden, method == "fedavg_shared")
      glob = baselines.average_networks([c.weights for c in res], [c.num_examples for c in res])
      rows.append(_row(method, glob, pfnm.accuracy(glob, x_test, y_test)))
    elif method == "dpmeans":
      if len(hidden) != 1:
        continue  # DP-means of neurons is defined for one hidden layer only.
      glob = baselines.dpmeans_network(nets,
                                       counts,
                                       lam=settings.dpmeans_lambda,
                                       max_iter=settings.dpmeans_max_iter,
                                       seed=seed)
      rows.append(_row(method, glob, pfnm.accuracy(glob, x_test, y_test)))
    elif method == "local":
      accs = baselines.local_accuracies(nets, x_test, y_test)
      rows.append(_row(method, nets[0], accs.mean()))
    elif method in ("uniform_ensemble", "weighted_ensemble"):
      acc = baselines.ensemble_accuracy(nets, x_test, y_test,
                                        counts if method == "weighted_ensemble" else None)
      rows.append(_row(method, baselines.ensemble_size(nets), acc))
    elif method == "distillation":
      x_pool, _ = fd.pooled("train")
      glob = baselines.distill(nets,
                               x_pool,
                               cfg,
                               seed=seed,
                               hidden_units=(settings.kd_hidden,) * len(hidden),
                               epochs=settings.kd_epochs)
      rows.append(_row(method, glob, pfnm.accuracy(glob, x_test, y_test)))
    elif method == "downpour_sgd":
      trainer = get_trainer(dataclasses.replace(cfg, epochs=settings.dsgd_epochs_per_round))
      glob = baselines.downpour_sgd(trainer,
                                    client_data,
                                    settings.comm_rounds,
                                    seed=seed,
                                    server_lr=settings.dsgd_server_lr,
                                    callback=_progress(log, "D-SGD", settings.comm_rounds,
                                                       x_test, y_test))
      rows.append(_row(method, glob, pfnm.accuracy(glob, x_test, y_test)))
    else:
      raise ValueError(f"--methods: unknown method {method!r}")
    if log is not None and rows and rows[-1]["method"] == method:
      log(f"{method}: accuracy {rows[-1]['accuracy']:.3f} [{time.time() - started:.0f} s]")
  return rows


def _a_tenth(step, total):
  """Whether 1-based ``step`` of ``total`` ends a tenth of them (ten log lines a run)."""
  return step % max(1, total // 10) == 0 or step == total


def _progress(log, name, total, x_test, y_test):
  """A ``callback(round, weights)`` that logs the test accuracy ten times over
  ``total`` rounds (None without ``log``): a 200-round run is silent for half an hour
  otherwise."""
  if log is None:
    return None
  start = time.time()

  def callback(r, weights):
    if _a_tenth(r, total):
      log(f"{name} round {r}/{total}: test accuracy "
          f"{pfnm.accuracy(weights, x_test, y_test):.3f} [{time.time() - start:.0f} s]")

  return callback


# -------------------------------------------------------------------- outputs
def summarize(
    rows: Sequence[dict],
    keys: Sequence[str],
    values: Sequence[str] = ("accuracy", "neurons", "params")) -> List[dict]:
  """Mean and std (population, over trials) of ``values`` per group of ``keys``,
  in first-appearance order."""
  groups: Dict[tuple, List[dict]] = {}
  for r in rows:
    groups.setdefault(tuple(r[k] for k in keys), []).append(r)
  out = []
  for key, rs in groups.items():
    s = dict(zip(keys, key))
    for v in values:
      arr = np.array([float(r[v]) for r in rs])
      s[f"{v}_mean"], s[f"{v}_std"] = float(arr.mean()), float(arr.std())
    s["trials"] = len(rs)
    if "method" in keys:
      s["label"] = LABELS.get(s["method"], s["method"])
      s["constraint"] = _CONSTRAINT.get(s["method"], "")
    out.append(s)
  return out


def _markdown(summary: Sequence[dict], columns: Sequence[tuple], title: str, notes=()) -> str:
  lines = [f"# {title}", ""]
  lines += [f"{n}" for n in notes]
  if notes:
    lines.append("")
  lines += _runs.md_table([h for h, _ in columns],
                          [[fmt(s) for _, fmt in columns] for s in summary])
  return "\n".join(lines) + "\n"


def _pm(key, digits=3):
  return lambda s: f"{s[key + '_mean']:.{digits}f} ± {s[key + '_std']:.{digits}f}"


def _method_cell(s):
  dagger = " †" if s.get("constraint") else ""
  return f"{s['label']}{dagger}"


def _plot_lines(ax, summary, x_key, methods, value="accuracy"):
  for m in methods:
    pts = [s for s in summary if s["method"] == m]
    if not pts:
      continue
    ax.errorbar([s[x_key] for s in pts], [s[f"{value}_mean"] for s in pts],
                yerr=[s[f"{value}_std"] for s in pts],
                marker="o",
                capsize=3,
                label=LABELS.get(m, m))
  ax.grid(alpha=0.3)


def _write_results(output_dir,
                   settings,
                   summary,
                   columns,
                   md,
                   trial_rows,
                   trial_columns,
                   extra=None):
  """``results.csv`` (``summary`` in ``columns``), ``trials.csv``, ``settings.json``
  (``settings`` and ``extra``) and ``results.md`` (the text ``md``)."""
  round_loop.write_csv(os.path.join(output_dir, "results.csv"), summary, columns)
  os.makedirs(output_dir, exist_ok=True)
  round_loop.write_csv(os.path.join(output_dir, "trials.csv"), trial_rows, trial_columns)
  payload = {"settings": settings.to_json()}
  payload.update(extra or {})
  round_loop.atomic_write_text(os.path.join(output_dir, "settings.json"),
                               json.dumps(payload, indent=2, default=str) + "\n")
  round_loop.atomic_write_text(os.path.join(output_dir, "results.md"), md)


def _label_axes(ax, xlabel, ylabel="test accuracy", legend=True):
  """Axis labels and, once every line is drawn, the legend."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if legend:
    ax.legend(fontsize=8)


def _oneshot_trials(settings, methods, num_batches, trials, label, log, hidden_units=None, **keys):
  """``trials`` one-shot trials with ``num_batches`` clients (trial ``t``: data and
  training seeds derived from ``(settings.seed, num_batches, t)``); every row gets
  ``keys`` and ``trial``, every trial a log line ``[<label> trial t/trials] ...``."""
  J = num_batches
  rows = []
  for t in range(trials):
    start = time.time()
    fd = settings.load(J, baselines.derive_seed(settings.seed, J, t))
    prefix = f"[{label} trial {t + 1}/{trials}]"
    trial_rows = run_oneshot_trial(fd,
                                   settings,
                                   methods,
                                   baselines.derive_seed(settings.seed, J, t, 1),
                                   hidden_units=hidden_units,
                                   log=lambda line, prefix=prefix: log(f"{prefix} {line}"))
    for r in trial_rows:
      r.update(keys, trial=t)
    rows += trial_rows
    _log_trial(log, prefix, trial_rows, start)
  return rows


def _log_trial(log, prefix, rows, start):
  parts = [
      f"{r['method']}={r['accuracy']:.3f}" + (f" ({r['neurons']} n)" if r['method'].startswith(
          ("pfnm", "dpmeans")) else "") for r in rows
  ]
  log(f"{prefix} {' '.join(parts)} [{time.time() - start:.1f} s]")


# -------------------------------------------------------------- experiments
def run_batches(settings: ExperimentSettings,
                J_values: Sequence[int],
                trials: int,
                output_dir: str,
                log: Callable[[str], None] = print) -> List[dict]:
  """Accuracy and size vs the number of batches ``J`` (Figs. 2 and 3).

  Writes ``results.csv``/``results.md`` (per ``J`` and method),
  ``trials.csv``, ``settings.json``, ``fig2_constrained.png`` (accuracy and
  size of the methods that satisfy the constraints) and
  ``fig3_extra_resources.png`` (PFNM against the extra-resource baselines).
  Returns the summary rows.
  """
  check_at_least_one(trials=trials)
  methods = settings.methods or ONESHOT_METHODS
  rows = []
  for J in J_values:
    rows += _oneshot_trials(settings, methods, J, trials, f"J={J}", log, J=J)
  summary = summarize(rows, ("J", "method"))
  columns = [
      "J", "method", "label", "accuracy_mean", "accuracy_std", "neurons_mean", "neurons_std",
      "params_mean", "params_std", "trials", "constraint"
  ]
  md = _markdown(
      summary, [("J", lambda s: str(s["J"])), ("method", _method_cell),
                ("test accuracy", _pm("accuracy")), ("hidden neurons", _pm("neurons", 1)),
                ("parameters", lambda s: f"{s['params_mean']:.0f}"),
                ("trials", lambda s: str(s["trials"]))],
      f"PFNM vs number of batches J ({settings.dataset}, {settings.partition}" +
      (f", alpha={settings.alpha}" if settings.partition == "class_dirichlet" else "") + ")",
      notes=[
          "† violates a constraint of the federated setting: U-Ens/W-Ens stack all J "
          "networks; KD pools the training inputs at the server; D-SGD communicates "
          f"{settings.comm_rounds} times ({settings.dsgd_epochs_per_round} epoch(s) apart).",
          "Mean ± std over trials; accuracy on the pooled test data."
      ])
  _write_results(output_dir, settings, summary, columns, md, rows,
                 ["J", "trial", "method", "accuracy", "neurons", "layers", "params"], {
                     "J": list(J_values),
                     "trials": trials
                 })
  _figures_batches(output_dir, summary, settings, J_values)
  return summary


def _figures_batches(output_dir, summary, settings, J_values):
  plt = _runs.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  _plot_lines(axes[0], summary, "J", CONSTRAINED_METHODS)
  _label_axes(axes[0], "number of batches J")
  size_methods = ("pfnm", "pfnm_small_gamma", "dpmeans")
  _plot_lines(axes[1], summary, "J", size_methods, value="neurons")
  width = sum(settings.hidden_units)
  axes[1].plot(list(J_values), [width * J for J in J_values], "k:", label="J x local size")
  _label_axes(axes[1], "number of batches J", "global hidden neurons")
  fig.suptitle(f"Fig. 2: constrained methods ({settings.dataset}, {settings.partition})")
  _runs.save_figure(fig, os.path.join(output_dir, "fig2_constrained.png"), tight=True)

  fig, ax = plt.subplots(figsize=(6, 4))
  _plot_lines(ax, summary, "J", ("pfnm",) + EXTRA_METHODS)
  _label_axes(ax, "number of batches J")
  ax.set_title(f"Fig. 3: extra-resource baselines ({settings.dataset}, {settings.partition})")
  _runs.save_figure(fig, os.path.join(output_dir, "fig3_extra_resources.png"), tight=True)


def run_depth(settings: ExperimentSettings,
              C_values: Sequence[int],
              J: int,
              width: int,
              trials: int,
              output_dir: str,
              log: Callable[[str], None] = print) -> List[dict]:
  """Accuracy and size vs the number of hidden layers ``C`` (Fig. 4).

  Trial ``t`` uses the same data partition for every ``C``.  Writes
  ``results.csv``/``results.md``, ``trials.csv``, ``settings.json`` and
  ``fig4_depth.png`` (accuracy; global neurons per layer).
  """
  check_at_least_one(trials=trials)
  methods = settings.methods or DEPTH_METHODS
  rows = []
  for C in C_values:
    rows += _oneshot_trials(settings,
                            methods,
                            J,
                            trials,
                            f"C={C}",
                            log,
                            hidden_units=(width,) * C,
                            C=C,
                            J=J)
  for r in rows:
    r["neurons_per_layer"] = r["neurons"] / r["C"]
  summary = summarize(rows, ("C", "method"), ("accuracy", "neurons", "neurons_per_layer", "params"))
  columns = [
      "C", "method", "label", "accuracy_mean", "accuracy_std", "neurons_mean", "neurons_std",
      "neurons_per_layer_mean", "params_mean", "trials", "constraint"
  ]
  md = _markdown(
      summary, [("C", lambda s: str(s["C"])), ("method", _method_cell),
                ("test accuracy", _pm("accuracy")), ("hidden neurons", _pm("neurons", 1)),
                ("per layer", lambda s: f"{s['neurons_per_layer_mean']:.1f}"),
                ("parameters", lambda s: f"{s['params_mean']:.0f}")],
      f"PFNM vs depth C (J={J}, width {width}, {settings.dataset}, {settings.partition})",
      notes=[
          "† violates a constraint of the federated setting (see pfnm_batches).",
          "Mean ± std over trials; accuracy on the pooled test data."
      ])
  _write_results(output_dir, settings, summary, columns, md, rows,
                 ["C", "J", "trial", "method", "accuracy", "neurons", "layers", "params"], {
                     "C": list(C_values),
                     "J": J,
                     "width": width,
                     "trials": trials
                 })
  plt = _runs.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  _plot_lines(axes[0], summary, "C", methods)
  _label_axes(axes[0], "number of hidden layers C")
  _plot_lines(axes[1], summary, "C", ("pfnm",), value="neurons_per_layer")
  axes[1].axhline(width * J, color="k", linestyle=":", label="J x width")
  _label_axes(axes[1], "number of hidden layers C", "PFNM global neurons per layer")
  fig.suptitle(f"Fig. 4: depth (J={J}, {settings.dataset}, {settings.partition})")
  _runs.save_figure(fig, os.path.join(output_dir, "fig4_depth.png"), tight=True)
  return summary


def _split_steps(fd, steps: int, seed: int):
  """Per client, ``steps`` disjoint random parts of its training data."""
  rng = np.random.default_rng(seed)
  out = []
  for c in fd.client_ids:
    x, y = fd.train[c]
    parts = np.array_split(rng.permutation(len(y)), steps)
    out.append([(x[p], y[p]) for p in parts])
  return out


def run_streaming(settings: ExperimentSettings,
                  J: int,
                  steps: int,
                  trials: int,
                  output_dir: str,
                  fresh_neurons: int = 1,
                  init_noise: float = 0.01,
                  log: Callable[[str], None] = print) -> List[dict]:
  """Streaming federated learning (supplement 4.2, Fig. 3b).

  Each of the ``J`` groups' training data is split at random into ``steps``
  parts; at step ``s`` every group reveals part ``s``.  Methods:

  * ``pfnm_streaming``: at step ``s > 1`` group ``j``'s network starts from
    ``StreamingPFNM.local_init`` (``L_j - fresh_neurons`` global neurons drawn by
    popularity, ``fresh_neurons`` at the prior mean, noise ``init_noise``), is
    trained on part ``s``, and the posterior is updated (eqs. 10-11);
  * ``downpour_sgd``: the global network is broadcast, trained on part ``s`` and
    averaged (one communication per step);
  * ``uniform_ensemble`` / ``weighted_ensemble`` / ``local``: each group keeps
    training its own network on the new part (weighted ensemble with the
    class counts seen so far).

  Writes ``results.csv``/``results.md`` (per step and method), ``trials.csv``,
  ``settings.json`` and ``fig_streaming.png``.
  """
  check_at_least_one(trials=trials, steps=steps)
  if fresh_neurons < 0 or fresh_neurons > min(settings.hidden_units):
    raise ValueError(f"--fresh_neurons must be in [0, {min(settings.hidden_units)}], "
                     f"got {fresh_neurons}")
  if len(settings.hidden_units) != 1:
    raise ValueError("--hidden_units: streaming PFNM supports one hidden layer")
  methods = settings.methods or STREAMING_METHODS
  width = settings.hidden_units[0]
  # Every group needs >= `steps` training examples.
  min_size = max(settings.min_size, int(math.ceil(steps / (1 - settings.test_fraction))) + 2)
  rows = []
  for t in range(trials):
    start = time.time()
    fd = settings.load(J, baselines.derive_seed(settings.seed, J, t), min_size=min_size)
    x_test, y_test = fd.pooled("test")
    parts = _split_steps(fd, steps, baselines.derive_seed(settings.seed, J, t, 2))
    cfg = settings.training_config(fd)
    trainer = get_trainer(cfg)
    trial_seed = baselines.derive_seed(settings.seed, J, t, 1)
    stream = StreamingPFNM(dataclasses.replace(settings.hp, seed=trial_seed))
    own_nets, own_counts = None, np.zeros((J, fd.num_classes), np.int64)
    dsgd = pfnm.initial_weights(cfg, pfnm.init_seeds(trial_seed, 1, True)[0])
    for s in range(steps):
      step_data = [parts[j][s] for j in range(J)]
      seed_s = baselines.derive_seed(trial_seed, s)
      step_rows = []
      own = None
      if any(m in methods for m in ("uniform_ensemble", "weighted_ensemble", "local")) or (
          s == 0 and "pfnm_streaming" in methods):
        own = trainer.train(step_data, seed_s, init_weights=own_nets, init_seed=trial_seed)
        own_nets = [r.weights for r in own]
        own_counts += np.stack([r.class_counts for r in own])
      if "local" in methods:
        accs = baselines.local_accuracies(own_nets, x_test, y_test)
        step_rows.append(_row("local", own_nets[0], accs.mean()))
      if "uniform_ensemble" in methods:
        step_rows.append(
            _row("uniform_ensemble", baselines.ensemble_size(own_nets),
                 baselines.ensemble_accuracy(own_nets, x_test, y_test)))
      if "weighted_ensemble" in methods:
        step_rows.append(
            _row("weighted_ensemble", baselines.ensemble_size(own_nets),
                 baselines.ensemble_accuracy(own_nets, x_test, y_test, list(own_counts))))
      if "pfnm_streaming" in methods:
        if s == 0:
          res = own  # fresh independent initialisations: the same training as the ensembles'
        else:
          inits = []
          for j in range(J):
            W1, b1, W2, b2 = stream.local_init(j,
                                               width,
                                               n_fresh=fresh_neurons,
                                               noise_std=init_noise,
                                               seed=baselines.derive_seed(trial_seed, s, j, 3))
            inits.append([(W1, b1), (W2, b2)])
          res = trainer.train(step_data, seed_s, init_weights=inits)
        W1, b1, W2, b2 = stream.update([_as_single(r.weights) for r in res],
                                       [r.class_counts for r in res])
        glob = [(W1, b1), (W2, b2)]
        step_rows.append(_row("pfnm_streaming", glob, pfnm.accuracy(glob, x_test, y_test)))
      if "downpour_sgd" in methods:
        mean = trainer.dsgd_round(dsgd, step_data, seed_s)
        lr = settings.dsgd_server_lr
        dsgd = [(W + lr * (Wm - W), b + lr * (bm - b)) for (W, b), (Wm, bm) in zip(dsgd, mean)]
        step_rows.append(_row("downpour_sgd", dsgd, pfnm.accuracy(dsgd, x_test, y_test)))
      for r in step_rows:
        r.update(step=s + 1, trial=t, J=J)
      rows += step_rows
    last = [r for r in rows if r["trial"] == t and r["step"] == steps]
    _log_trial(log, f"[streaming trial {t + 1}/{trials}, step {steps}]", last, start)
  order = {m: i for i, m in enumerate(STREAMING_METHODS)}
  summary = summarize(sorted(rows, key=lambda r: (r["step"], order[r["method"]])),
                      ("step", "method"))
  columns = [
      "step", "method", "label", "accuracy_mean", "accuracy_std", "neurons_mean", "neurons_std",
      "params_mean", "trials", "constraint"
  ]
  md = _markdown(summary, [("step", lambda s: str(s["step"])), ("method", _method_cell),
                           ("test accuracy", _pm("accuracy")),
                           ("hidden neurons", _pm("neurons", 1))],
                 f"Streaming PFNM (J={J}, S={steps}, {settings.dataset}, {settings.partition})",
                 notes=[
                     "† violates a constraint (ensembles stack all J networks; D-SGD communicates "
                     "every step).", "Mean ± std over trials; accuracy on the pooled test data."
                 ])
  _write_results(
      output_dir, settings, summary, columns, md, rows,
      ["step", "trial", "J", "method", "accuracy", "neurons", "layers", "params"], {
          "J": J,
          "steps": steps,
          "trials": trials,
          "fresh_neurons": fresh_neurons,
          "init_noise": init_noise
      })
  plt = _runs.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  _plot_lines(axes[0], summary, "step", methods)
  _label_axes(axes[0], "step s")
  _plot_lines(axes[1], summary, "step", ("pfnm_streaming",), value="neurons")
  _label_axes(axes[1], "step s", "PFNM global neurons", legend=False)
  fig.suptitle(f"Streaming (supplement Fig. 3b): J={J}, S={steps}, {settings.dataset}")
  _runs.save_figure(fig, os.path.join(output_dir, "fig_streaming.png"), tight=True)
  return summary


def run_sensitivity(settings: ExperimentSettings,
                    J_values: Sequence[int],
                    trials: int,
                    sigma0_sq_grid: Sequence[float],
                    gamma0_grid: Sequence[float],
                    sigma_sq_grid: Sequence[float],
                    output_dir: str,
                    log: Callable[[str], None] = print) -> List[dict]:
  """PFNM's accuracy over a grid of ``(sigma0^2, gamma0, sigma^2)`` (supplement 4.3).

  The local networks of a trial are trained once; every grid point only
  re-runs the matching.  Training accuracy (pooled training data, as the
  paper's heatmaps) and test accuracy are reported.  Writes
  ``results.csv``/``results.md``, ``trials.csv``, ``settings.json``,
  ``fig4_sensitivity.png`` (heatmaps of training accuracy over
  ``sigma0^2 x gamma0``, one per ``sigma^2``, first ``J``) and
  ``fig5_sigma.png`` (accuracy vs ``sigma^2`` per ``J`` at the grid point
  nearest ``sigma0^2 = 10``, ``gamma0 = 1``).
  """
  check_at_least_one(trials=trials)
  grid = list(itertools.product(sigma0_sq_grid, gamma0_grid, sigma_sq_grid))
  rows = []
  for J in J_values:
    for t in range(trials):
      start = time.time()
      fd = settings.load(J, baselines.derive_seed(settings.seed, J, t))
      seed = baselines.derive_seed(settings.seed, J, t, 1)
      cfg = settings.training_config(fd)
      res = get_trainer(cfg).train([fd.train[c] for c in fd.client_ids], seed)
      nets, counts = [r.weights for r in res], [r.class_counts for r in res]
      x_tr, y_tr = fd.pooled("train")
      x_te, y_te = fd.pooled("test")
      prefix = f"[J={J} trial {t + 1}/{trials}]"
      log(f"{prefix} {J} local networks trained [{time.time() - start:.0f} s]")
      for i, (s0, g0, s2) in enumerate(grid, 1):
        if _a_tenth(i, len(grid)):
          log(f"{prefix} grid point {i}/{len(grid)} [{time.time() - start:.0f} s]")
        hp = dataclasses.replace(settings.hp, sigma0_sq=s0, gamma0=g0, sigma_sq=s2, seed=seed)
        glob = pfnm.match_networks(nets, counts, hp)
        size = pfnm.model_size(glob)
        rows.append(
            dict(J=J,
                 trial=t,
                 sigma0_sq=s0,
                 gamma0=g0,
                 sigma_sq=s2,
                 train_accuracy=pfnm.accuracy(glob, x_tr, y_tr),
                 test_accuracy=pfnm.accuracy(glob, x_te, y_te),
                 neurons=size["neurons"],
                 params=size["params"]))
      best = max((r for r in rows if r["J"] == J and r["trial"] == t),
                 key=lambda r: r["train_accuracy"])
      log(f"{prefix} {len(grid)} grid points; best train accuracy "
          f"{best['train_accuracy']:.3f} (test {best['test_accuracy']:.3f}, {best['neurons']} n) "
          f"at sigma0_sq={best['sigma0_sq']:g} gamma0={best['gamma0']:g} "
          f"sigma_sq={best['sigma_sq']:g} [{time.time() - start:.1f} s]")
  summary = summarize(rows, ("J", "sigma0_sq", "gamma0", "sigma_sq"),
                      ("train_accuracy", "test_accuracy", "neurons", "params"))
  columns = [
      "J", "sigma0_sq", "gamma0", "sigma_sq", "train_accuracy_mean", "train_accuracy_std",
      "test_accuracy_mean", "test_accuracy_std", "neurons_mean", "neurons_std", "trials"
  ]
  md = _markdown(summary, [("J", lambda s: str(s["J"])),
                           ("sigma0^2", lambda s: f"{s['sigma0_sq']:g}"),
                           ("gamma0", lambda s: f"{s['gamma0']:g}"),
                           ("sigma^2", lambda s: f"{s['sigma_sq']:g}"),
                           ("train accuracy", _pm("train_accuracy")),
                           ("test accuracy", _pm("test_accuracy")),
                           ("hidden neurons", _pm("neurons", 1))],
                 f"PFNM parameter sensitivity ({settings.dataset}, {settings.partition})",
                 notes=["Mean ± std over trials."])
  _write_results(
      output_dir, settings, summary, columns, md, rows, [
          "J", "trial", "sigma0_sq", "gamma0", "sigma_sq", "train_accuracy", "test_accuracy",
          "neurons", "params"
      ], {
          "J": list(J_values),
          "trials": trials,
          "sigma0_sq_grid": list(sigma0_sq_grid),
          "gamma0_grid": list(gamma0_grid),
          "sigma_sq_grid": list(sigma_sq_grid)
      })

  plt = _runs.pyplot()
  J0 = J_values[0]
  fig, axes = plt.subplots(1,
                           len(sigma_sq_grid),
                           figsize=(4 * len(sigma_sq_grid), 3.6),
                           squeeze=False)
  for ax, s2 in zip(axes[0], sigma_sq_grid):
    mat = np.array([[
        next(s["train_accuracy_mean"]
             for s in summary
             if s["J"] == J0 and s["sigma0_sq"] == s0 and s["gamma0"] == g0 and s["sigma_sq"] == s2)
        for g0 in gamma0_grid
    ]
                    for s0 in sigma0_sq_grid])
    im = ax.imshow(mat, origin="lower", cmap="viridis", aspect="auto")
    for (i, k), v in np.ndenumerate(mat):
      ax.text(k, i, f"{v:.2f}", ha="center", va="center", color="w", fontsize=8)
    ax.set_xticks(range(len(gamma0_grid)), [f"{g:g}" for g in gamma0_grid])
    ax.set_yticks(range(len(sigma0_sq_grid)), [f"{s:g}" for s in sigma0_sq_grid])
    _label_axes(ax, "gamma0", "sigma0^2", legend=False)
    ax.set_title(f"sigma^2 = {s2:g}")
    fig.colorbar(im, ax=ax)
  fig.suptitle(f"Fig. 4 (supplement): training accuracy, J={J0}, {settings.dataset}, "
               f"{settings.partition}")
  _runs.save_figure(fig, os.path.join(output_dir, "fig4_sensitivity.png"), tight=True)

  s0_ref = min(sigma0_sq_grid, key=lambda v: abs(math.log(v / 10.0)))
  g0_ref = min(gamma0_grid, key=lambda v: abs(math.log(v)))
  fig, ax = plt.subplots(figsize=(6, 4))
  for J in J_values:
    pts = [s for s in summary if s["J"] == J and s["sigma0_sq"] == s0_ref and s["gamma0"] == g0_ref]
    ax.errorbar([s["sigma_sq"] for s in pts], [s["train_accuracy_mean"] for s in pts],
                yerr=[s["train_accuracy_std"] for s in pts],
                marker="o",
                capsize=3,
                label=f"J={J}")
  ax.set_xscale("log")
  ax.grid(alpha=0.3)
  _label_axes(ax, "sigma^2", "training accuracy")
  ax.set_title(f"Fig. 5 (supplement): sigma0^2={s0_ref:g}, gamma0={g0_ref:g}")
  _runs.save_figure(fig, os.path.join(output_dir, "fig5_sigma.png"), tight=True)
  return summary

"""One entry point from a flat dict of launcher flags to a finished run.

`run_training(params)` loads the federated data, builds the algorithm named by
`params["algorithm"]` from the registry, starts the owned TFF runtime and drives
the rounds with `tfbfl.experiment.ExperimentRunner`. Every launcher (and the grid
launchers, once per grid cell) goes through it, so flags mean the same thing
everywhere.

An algorithm module registers a builder `fn(data, params) -> algorithm`:

    from tfbfl import training
    training.register_algorithm("fedavg", build_fedavg)
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict

from tfbfl import data as data_lib
from tfbfl import experiment

# name -> module that registers it on import (keeps start-up light).
_ALGORITHM_MODULES = {
    "virtual": "tfbfl.algorithms.virtual",
    "fedavg": "tfbfl.algorithms.fedavg",
    "fedprox": "tfbfl.algorithms.fedavg",
    "local": "tfbfl.algorithms.local",
    "global": "tfbfl.algorithms.local",
    "fola": "tfbfl.algorithms.fola",
    "fedcurv": "tfbfl.algorithms.fola",
    "laplace_offline": "tfbfl.algorithms.fola",
}
_BUILDERS: Dict[str, Callable[..., Any]] = {}
# mlp: every algorithm; conv (FEMNIST net): VIRTUAL and the FedAvg-family baselines;
# lstm (Shakespeare): VIRTUAL;
# cnn (McMahan et al. CIFAR-10 CNN): FOLA / FedCurv.
ARCHITECTURES = ("mlp", "conv", "lstm", "cnn")

# Defaults of every common flag (the launchers' absl flags mirror these).
DEFAULTS: Dict[str, Any] = dict(
    algorithm="virtual", dataset="digits", data_dir=None, partition="class_dirichlet",
    alpha=0.5, min_size=10, classes_per_client=2, test_fraction=0.25,
    num_clients=10, clients_per_round=10, rounds=20, epochs_per_round=20, batch_size=20,
    client_lr=0.05, server_lr=None, hidden_units=(100, 100), seed=0, eval_every=1,
    output_dir=None, checkpoint_every=0, resume=False, verbose=True,
    # Runtime (tfbfl.runtime) and client-state store (tfbfl.client_store)
    executor="local", workers=None, call_timeout_s=600.0, client_store="memory",
    # VIRTUAL
    damping=1.0, tie_damping=False, kl_weight=1e-4, prior_scale=1.0, init_scale=0.05,
    fedavg_init=False, server_loss_weight=1.0, gate_init=1.0, eval_samples=0,
    prune_percentile=0.0, prune_per_layer=True,
    architecture="mlp", image_shape=None, filters=(32, 64), lstm_units=(100, 100),
    # FedProx
    mu=0.01,
    # FOLA / offline Laplace / FedCurv (tfbfl.algorithms.fola)
    fola_lambda=10.0, fola_gamma=float("inf"), fola_eps=1e-8, fola_clip_norm=0.0,
    compress_p=1.0, fedcurv_lambda=1.0,
)


def register_algorithm(name: str, builder: Callable[..., Any]) -> None:
  _BUILDERS[name] = builder


def algorithm_names():
  return tuple(sorted(_ALGORITHM_MODULES))


def build_algorithm(data: data_lib.FederatedData, params: Dict[str, Any]):
  name = params["algorithm"]
  if name not in _ALGORITHM_MODULES:
    raise ValueError(f"--algorithm must be one of {algorithm_names()}, got {name!r}.")
  if name not in _BUILDERS:
    try:
      importlib.import_module(_ALGORITHM_MODULES[name])
    except ModuleNotFoundError as e:
      raise ValueError(f"--algorithm={name} is not available in this version of tfbfl ({e}).") from e
  return _BUILDERS[name](data, params)


def resolve_params(params: Dict[str, Any]) -> Dict[str, Any]:
  """Fills defaults, normalises types and rejects impossible combinations."""
  unknown = set(params) - set(DEFAULTS)
  if unknown:
    raise ValueError(f"unknown parameters {sorted(unknown)}; known: {sorted(DEFAULTS)}.")
  p = dict(DEFAULTS, **{k: v for k, v in params.items() if v is not None or k == "data_dir"})
  if isinstance(p["hidden_units"], str):
    p["hidden_units"] = tuple(int(h) for h in p["hidden_units"].split(",") if h.strip())
  p["hidden_units"] = tuple(int(h) for h in p["hidden_units"])
  for name in ("image_shape", "filters", "lstm_units"):
    v = p[name].split(",") if isinstance(p[name], str) else p[name]
    p[name] = tuple(int(x) for x in v if str(x).strip()) or None if v else None
  if p["architecture"] not in ARCHITECTURES:
    raise ValueError(f"--architecture must be one of {ARCHITECTURES}, got {p['architecture']!r}.")
  if p["server_lr"] is None:
    # VIRTUAL's server multiplies C deltas (a sum of natural-parameter moves), so
    # eta_s = 1/C makes a round move as far as one averaged FedAvg step.
    p["server_lr"] = 1.0 / p["clients_per_round"] if p["algorithm"] == "virtual" else 1.0
  for name in ("client_lr", "server_lr", "prior_scale", "init_scale"):
    if not p[name] > 0:
      raise ValueError(f"--{name} must be > 0, got {p[name]}.")
  for name in ("num_clients", "rounds", "epochs_per_round", "batch_size", "eval_every"):
    if int(p[name]) < 1:
      raise ValueError(f"--{name} must be >= 1, got {p[name]}.")
  if p["kl_weight"] < 0:
    raise ValueError(f"--kl_weight must be >= 0, got {p['kl_weight']}.")
  if p["mu"] < 0:
    raise ValueError(f"--mu must be >= 0, got {p['mu']}.")
  if p["clients_per_round"] > p["num_clients"]:
    raise ValueError(
        f"--clients_per_round={p['clients_per_round']} exceeds --num_clients={p['num_clients']}.")
  if p["dataset"] not in data_lib.DATASETS:
    raise ValueError(f"--dataset must be one of {sorted(data_lib.DATASETS)}, got {p['dataset']!r}.")
  if p["algorithm"] not in _ALGORITHM_MODULES:
    raise ValueError(f"--algorithm must be one of {algorithm_names()}, got {p['algorithm']!r}.")
  if isinstance(p["workers"], str):
    p["workers"] = [w for w in p["workers"].split(",") if w.strip()]
  p["workers"] = tuple(str(w).strip() for w in p["workers"] or ()) or None
  if p["executor"] not in ("local", "remote"):
    raise ValueError(f"--executor must be 'local' or 'remote', got {p['executor']!r}.")
  if p["executor"] == "remote" and not p["workers"]:
    raise ValueError("--executor=remote needs --workers=host:port[,host:port...].")
  if p["executor"] == "local" and p["workers"]:
    raise ValueError("--workers is only used with --executor=remote.")
  if not p["call_timeout_s"] > 0:
    raise ValueError(f"--call_timeout_s must be > 0, got {p['call_timeout_s']}.")
  if p["client_store"] not in ("memory", "disk"):
    raise ValueError(f"--client_store must be 'memory' or 'disk', got {p['client_store']!r}.")
  if p["client_store"] == "disk" and not p["output_dir"]:
    raise ValueError("--client_store=disk needs --output_dir (states go to <output_dir>/client_states).")
  return p


def load_data(p: Dict[str, Any]) -> data_lib.FederatedData:
  return data_lib.load_federated(
      p["dataset"], data_dir=p["data_dir"], partition=p["partition"], num_clients=p["num_clients"],
      alpha=p["alpha"], min_size=p["min_size"], classes_per_client=p["classes_per_client"],
      test_fraction=p["test_fraction"], seed=p["seed"])


def run_training(params: Dict[str, Any], *, round_hook=None) -> Dict[str, Any]:
  """Runs one configuration; returns the summary dict (also in summary.json)."""
  from tfbfl import runtime  # pylint: disable=g-import-not-at-top

  p = resolve_params(params)
  fd = load_data(p)
  if p["dataset"] == "npz":
    # Natural clients: the file decides how many there are.
    p["num_clients"] = len(fd.client_ids)
    if p["clients_per_round"] > p["num_clients"]:
      raise ValueError(f"--clients_per_round={p['clients_per_round']} exceeds the "
                       f"{p['num_clients']} clients in {p['data_dir']}.")
  if p["executor"] == "remote":
    runtime.set_runtime("remote", workers=p["workers"], call_timeout_s=p["call_timeout_s"])
  else:
    runtime.set_local_runtime()
  algorithm = build_algorithm(fd, p)
  run_config = experiment.RunConfig(
      rounds=p["rounds"], clients_per_round=p["clients_per_round"], eval_every=p["eval_every"],
      seed=p["seed"], output_dir=p["output_dir"], checkpoint_every=p["checkpoint_every"],
      resume=p["resume"], verbose=p["verbose"], client_store=p["client_store"])
  flags = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}
  runner = experiment.ExperimentRunner(algorithm, fd, run_config, flags=flags, round_hook=round_hook)
  return runner.run()

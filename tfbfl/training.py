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
import math
import numbers
import os
from typing import Any, Callable, Dict

import numpy as np

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
    # Streamed evaluation: clients per evaluation call (0: all in one call); see tfbfl.experiment
    eval_chunk=64,
    # VIRTUAL (MLP): clients stacked per TFF client computation (1: one by one; see
    # VirtualConfig.clients_per_group for the measurement behind the default)
    clients_per_group=1,
    # Robust rounds: drop bound of tfbfl.algorithms.robust (mirrors DEFAULT_MAX_UPDATE_RATIO)
    max_update_ratio=100.0,
    output_dir=None, checkpoint_every=0, resume=False, overwrite=False, verbose=True,
    # Runtime (tfbfl.runtime) and client-state store (tfbfl.client_store)
    executor="local", workers=None, call_timeout_s=600.0, client_store="memory",
    tls_ca=None, tls_cert=None, tls_key=None,
    # VIRTUAL
    precision_step=0.0, kl_weight=1e-4, prior_scale=1.0, init_scale=0.05,
    fedavg_init=False, server_loss_weight=1.0, gate_init=1.0, eval_samples=0,
    prune_percentile=0.0, prune_per_layer=True,
    architecture="mlp", image_shape=None, filters=(32, 64), lstm_units=(100, 100),
    # FedProx
    mu=0.01,
    # FOLA / offline Laplace / FedCurv (tfbfl.algorithms.fola)
    fola_lambda=10.0, fola_gamma=float("inf"), fola_eps=1e-8, fola_clip_norm=0.0,
    compress_p=1.0, fedcurv_lambda=1.0,
)


def virtual_default_step(clients_per_round: int) -> float:
  """VIRTUAL's default damped-EP step alpha = 1/C (server and client factors alike).

  Measured on the bundled digits (K = C = 10, seed 0, see tfbfl/algorithms/virtual.py,
  "The default step"): Algorithm 1's alpha = 1 and alpha = 0.5 turned the server
  posterior NaN within 2 rounds (the C client mean moves add up); alpha = 1/C was
  stable. `--server_lr=1` is Algorithm 1.
  """
  return 1.0 / int(clients_per_round)


# The default step at the default clients_per_round (grid launchers' quick mode).
VIRTUAL_DEFAULT_STEP = virtual_default_step(DEFAULTS["clients_per_round"])


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
  for name in ("hidden_units", "image_shape", "filters", "lstm_units"):
    p[name] = _int_list(p, name)
  if p["hidden_units"] is None:
    p["hidden_units"] = ()
  if p["architecture"] not in ARCHITECTURES:
    raise ValueError(f"--architecture must be one of {ARCHITECTURES}, got {p['architecture']!r}.")
  _check_integers(p)
  if p["server_lr"] is None:
    # VIRTUAL: the damped-EP step alpha (see tfbfl/algorithms/virtual.py for the
    # measurements behind virtual_default_step); 1 for the FedAvg family.
    p["server_lr"] = (virtual_default_step(max(int(p["clients_per_round"]), 1))
                      if p["algorithm"] == "virtual" else 1.0)
  _check_reals(p)
  _check_output_dir(p)
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
  if p["executor"] != "remote" and any(p[k] for k in ("tls_ca", "tls_cert", "tls_key")):
    raise ValueError("--tls_ca/--tls_cert/--tls_key are only used with --executor=remote.")
  if p["executor"] == "remote" and any(p[k] for k in ("tls_ca", "tls_cert", "tls_key")):
    from tfbfl import runtime  # pylint: disable=g-import-not-at-top  (no TF/TFF import)
    runtime.channel_credentials(p["tls_ca"], p["tls_cert"], p["tls_key"])  # names the bad flag
  if p["client_store"] not in ("memory", "disk"):
    raise ValueError(f"--client_store must be 'memory' or 'disk', got {p['client_store']!r}.")
  if p["client_store"] == "disk" and not p["output_dir"]:
    raise ValueError("--client_store=disk needs --output_dir (states go to <output_dir>/client_states).")
  return p


# Sane bounds of numeric flags, checked at parse time (README, "Flag checks").
MAX_RATE = 1e3       # learning rates / steps and prior / initial scales
MAX_WEIGHT = 1e6     # penalty strengths and loss weights (KL beta, mu, lambdas)
MAX_SEED = 2**63 - 1

# name -> (low, high, low is exclusive): every int flag, checked and made an int.
_INT_FLAGS = dict(
    num_clients=(1, 10**7, False), clients_per_round=(1, 10**7, False),
    rounds=(1, 10**9, False), epochs_per_round=(1, 10**6, False),
    batch_size=(1, 10**9, False), eval_every=(1, 10**9, False), eval_chunk=(0, 10**9, False),
    clients_per_group=(1, 10**6, False),
    checkpoint_every=(0, 10**9, False), seed=(0, MAX_SEED, False),
    min_size=(0, 10**9, False), classes_per_client=(1, 10**6, False),
    eval_samples=(0, 10**6, False))
# name -> (low, high, low is exclusive, +inf allowed): every float flag.
_REAL_FLAGS = dict(
    client_lr=(0.0, MAX_RATE, True, False), server_lr=(0.0, MAX_RATE, True, False),
    max_update_ratio=(0.0, math.inf, True, True),
    precision_step=(0.0, 1.0, False, False),
    prior_scale=(0.0, MAX_RATE, True, False), init_scale=(0.0, MAX_RATE, True, False),
    kl_weight=(0.0, MAX_WEIGHT, False, False), mu=(0.0, MAX_WEIGHT, False, False),
    server_loss_weight=(0.0, MAX_WEIGHT, False, False), gate_init=(-MAX_RATE, MAX_RATE, False, False),
    alpha=(0.0, 1e9, True, False), test_fraction=(0.0, 0.99, False, False),
    prune_percentile=(0.0, 100.0, False, False), call_timeout_s=(0.0, 1e7, True, False),
    fola_lambda=(0.0, MAX_WEIGHT, False, False), fola_gamma=(0.0, math.inf, True, True),
    fola_eps=(0.0, 1.0, True, False), fola_clip_norm=(0.0, 1e9, False, False),
    compress_p=(0.0, 1.0, True, False), fedcurv_lambda=(0.0, MAX_WEIGHT, False, False))


def _int_list(p: Dict[str, Any], name: str):
  """A comma-separated str or a sequence of ints -> a tuple of ints >= 1 (None if empty)."""
  v = p[name]
  if v is None:
    return None
  items = v.split(",") if isinstance(v, str) else v
  try:
    out = tuple(int(str(x).strip()) for x in items if str(x).strip())
  except (TypeError, ValueError):
    raise ValueError(f"--{name} must be a comma-separated list of integers, got {v!r}.") from None
  if any(x < 1 or x > 10**7 for x in out):
    raise ValueError(f"--{name} entries must be in [1, 1e7], got {v!r}.")
  return out or None


def _check_integers(p: Dict[str, Any]) -> None:
  """Every int flag is an integer (an integral float is accepted) in its range."""
  for name, (low, high, _) in _INT_FLAGS.items():
    if name not in p or p[name] is None:
      continue
    v = p[name]
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral)):
      if not (math.isfinite(float(v)) and float(v).is_integer()):
        raise ValueError(f"--{name} must be an integer, got {v!r}.")
      v = int(v)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
      raise ValueError(f"--{name} must be an integer, got {v!r}.")
    if not low <= v <= high:
      raise ValueError(f"--{name} must be in [{low}, {high}], got {v}.")
    p[name] = int(v)


def _check_reals(p: Dict[str, Any]) -> None:
  """Every float flag is a finite number (fola_gamma, max_update_ratio may be +inf) in its range."""
  for name, (low, high, low_open, inf_ok) in _REAL_FLAGS.items():
    if name not in p or p[name] is None:
      continue
    v = p[name]
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
      raise ValueError(f"--{name} must be a number, got {v!r}.")
    x = float(v)
    if math.isnan(x) or (math.isinf(x) and not (inf_ok and x > 0)):
      raise ValueError(f"--{name} must be finite, got {x}.")
    if (x <= low if low_open else x < low) or x > high:
      lo = "(" if low_open else "["
      raise ValueError(f"--{name} must be in {lo}{low:g}, {high:g}], got {x:g}.")


def _check_output_dir(p: Dict[str, Any]) -> None:
  """--output_dir is not a file and does not lie under one; --resume and
  --overwrite need it and exclude each other. (Creation is tried by
  `run_training` before TFF starts.)"""
  for name in ("resume", "overwrite"):
    v = p[name]
    if not (isinstance(v, (bool, np.bool_)) or (isinstance(v, numbers.Integral) and v in (0, 1))):
      raise ValueError(f"--{name} must be a bool, got {v!r}.")
    p[name] = bool(v)
  if p["resume"] and p["overwrite"]:
    raise ValueError("--resume and --overwrite exclude each other (continue the run in "
                     "--output_dir, or replace it).")
  out = p["output_dir"]
  if out is None or out == "":
    p["output_dir"] = None
    for name in ("resume", "overwrite"):
      if p[name]:
        raise ValueError(f"--{name} needs --output_dir.")
    return
  if not isinstance(out, (str, os.PathLike)):
    raise ValueError(f"--output_dir must be a path, got {out!r}.")
  out = os.path.abspath(os.fspath(out))
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"--output_dir={out} is a regular file, not a directory.")
  parent = os.path.dirname(out)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ValueError(f"--output_dir={out} lies under the regular file {parent}.")


def load_data(p: Dict[str, Any]) -> data_lib.FederatedData:
  return data_lib.load_federated(
      p["dataset"], data_dir=p["data_dir"], partition=p["partition"], num_clients=p["num_clients"],
      alpha=p["alpha"], min_size=p["min_size"], classes_per_client=p["classes_per_client"],
      test_fraction=p["test_fraction"], seed=p["seed"])


def run_training(params: Dict[str, Any], *, round_hook=None) -> Dict[str, Any]:
  """Runs one configuration; returns the summary dict (also in summary.json).

  Every flag, path and data check (`resolve_params`, `--output_dir` created
  and not in use by or holding another run unless `--resume`/`--overwrite`,
  the data loaded, a `--resume` checkpoint's flags and data fingerprint) runs
  before TensorFlow Federated starts, each failing with one `ValueError` /
  `FileNotFoundError` line naming the flag or file.
  """
  from tfbfl import run_dir  # pylint: disable=g-import-not-at-top
  from tfbfl import runtime  # pylint: disable=g-import-not-at-top

  p = resolve_params(params)
  if p["output_dir"]:
    run_dir.prepare(p["output_dir"])
    run_dir.check_free(p["output_dir"])
    if not p["overwrite"]:
      run_dir.refuse_or_clear(p["output_dir"], resume=p["resume"], overwrite=False)
  fd = load_data(p)
  if p["dataset"] == "npz":
    # Natural clients: the file decides how many there are.
    p["num_clients"] = len(fd.client_ids)
    if p["clients_per_round"] > p["num_clients"]:
      raise ValueError(f"--clients_per_round={p['clients_per_round']} exceeds the "
                       f"{p['num_clients']} clients in {p['data_dir']}.")
  flags = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}
  fingerprint = None
  if p["resume"]:
    fingerprint = run_dir.data_fingerprint(fd)
    experiment.ExperimentRunner.check_resumable(p["output_dir"], flags, fingerprint)
  if p["executor"] == "remote":
    runtime.set_runtime("remote", workers=p["workers"], call_timeout_s=p["call_timeout_s"],
                        tls_ca=p["tls_ca"], tls_cert=p["tls_cert"], tls_key=p["tls_key"])
  else:
    runtime.set_local_runtime()
  algorithm = build_algorithm(fd, p)
  run_config = experiment.RunConfig(
      rounds=p["rounds"], clients_per_round=p["clients_per_round"], eval_every=p["eval_every"],
      seed=p["seed"], output_dir=p["output_dir"], checkpoint_every=p["checkpoint_every"],
      resume=p["resume"], verbose=p["verbose"], client_store=p["client_store"],
      overwrite=p["overwrite"], data_fingerprint=fingerprint, eval_chunk=p["eval_chunk"])
  runner = experiment.ExperimentRunner(algorithm, fd, run_config, flags=flags, round_hook=round_hook)
  try:
    return runner.run()
  finally:
    runner.close()  # the output directory's lock

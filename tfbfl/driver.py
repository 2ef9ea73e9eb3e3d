"""The driver: from a flat dict of launcher flags to a finished run.

`run_training(params)` checks every flag, loads the federated data (`DataSpec`),
builds the algorithm named by `params["algorithm"]` from
`tfbfl.algorithms.registry`, starts the owned TFF runtime and drives the rounds
with `tfbfl.round_loop.ExperimentRunner`. Every launcher (and the grid
launchers, once per grid cell) goes through it, so flags mean the same thing
everywhere.

The settings are declared once, as `tfbfl.options` fields of their owners: the
driver's `round_loop.RunConfig`, the runtime's `runtime.RuntimeOptions`, the data's
`data.DataSpec` and each registered algorithm's config dataclass. `settings()`
collects them (a flag declared twice with different defaults or rules is an error
at import), `DEFAULTS` is their default values, and `tfbfl.flags` makes the absl
flags from the same table. Nothing here imports TensorFlow before the runtime starts.

A setting travels down once: `resolve_params` fills and checks the flag values;
`load_data` builds the `DataSpec`, loads the data and settles what the data decide
(an npz file's client count and the defaults that follow from it); `configs` then
builds every typed config from those values in one pass (`Configs`: data, algorithm,
round loop, runtime), and the round loop runs on them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Dict, Optional, Tuple

from tfbfl import _lazy
from tfbfl import algorithms  # noqa: F401  (registers every algorithm)
from tfbfl import data as data_lib
from tfbfl import round_loop
from tfbfl import options
from tfbfl import run_directory
from tfbfl import runtime as runtime_lib
from tfbfl.algorithms import registry

# TensorFlow loads once a model is checked (after the flags, `tfbfl._lazy`).
models = _lazy.load("tfbfl.models")

DEFAULT_ALGORITHM = "virtual"
# Owners of the algorithm-independent settings (the algorithms' come from the registry).
COMMON_SETTINGS = (round_loop.RunConfig, runtime_lib.RuntimeOptions, data_lib.DataSpec)


def settings() -> Dict[str, Tuple[Any, options.Option]]:
  """flag name -> (default, Option) of every setting of the driver and the algorithms."""
  table: Dict[str, Tuple[Any, options.Option]] = {}
  owners: Dict[str, str] = {}
  classes = list(COMMON_SETTINGS) + [spec.config_cls for spec in registry.specs()]
  for cls in classes:
    for name, (f, option) in options.option_fields(cls).items():
      entry = (f.default, option)
      if name in table and table[name] != entry:
        raise ValueError(f"--{name} is declared by {owners[name]} and {cls.__qualname__} "
                         "with different defaults or rules; declare it once (a shared base).")
      table[name], owners[name] = entry, owners.get(name, cls.__qualname__)
  return table


def algorithm_names():
  return registry.names()


# Defaults of every flag (a view of the declarations above, not a source of its own).
DEFAULTS: Dict[str, Any] = dict(algorithm=DEFAULT_ALGORITHM,
                                verbose=True,
                                **{
                                    name: default for name, (default, _) in settings().items()
                                })


# `launchers.train` and its flags, for a run's `flags.txt`.
REPLAY = round_loop.Replay(round_loop.TRAIN_LAUNCHER.command, ("algorithm", *DEFAULTS))


def _bounds(kind):
  inf = float("inf")
  return {
      name: (-inf if o.low is None else o.low, inf if o.high is None else o.high, o.low_open,
             o.inf_ok) for name, (_, o) in settings().items() if o.kind == kind
  }


# name -> (low, high, low is exclusive, +inf allowed) of the int / float flags (views).
_INT_FLAGS = {name: b[:3] for name, b in _bounds("int").items()}
_REAL_FLAGS = _bounds("float")


def resolve_params(params: Dict[str, Any]) -> Dict[str, Any]:
  """Fills defaults, checks every value (one ValueError naming the flag) and rejects
  impossible combinations. Values of other algorithms' flags are checked and kept."""
  table = settings()
  unknown = set(params) - set(DEFAULTS)
  if unknown:
    raise ValueError(f"unknown parameters {sorted(unknown)}; known: {sorted(DEFAULTS)}.")
  p = dict(DEFAULTS, **{k: v for k, v in params.items() if v is not None or k == "data_dir"})
  spec = registry.get(p["algorithm"])  # names the valid algorithms
  for name, (_, option) in table.items():
    if name in params:
      p[name] = option.check(p[name], name)
  p["hidden_units"] = p["hidden_units"] or ()
  if p["clients_per_round"] is None:
    p["clients_per_round"] = round_loop.default_clients_per_round(p["num_clients"])
  # Unset values the algorithm derives (VIRTUAL's step 1/C): recorded as used.
  p.update(spec.config_cls.derived_defaults(p))
  _check_applicable(p, params, spec)
  _check_temperature_scaling(p, spec)
  if spec.check_params is not None:
    spec.check_params(p)
  if p["dataset"] != "npz" and p["clients_per_round"] > p["num_clients"]:  # npz: after loading
    raise ValueError(
        f"--clients_per_round={p['clients_per_round']} exceeds --num_clients={p['num_clients']}.")
  if p["dataset"] not in data_lib.DATASETS:
    raise ValueError(f"--dataset must be one of {sorted(data_lib.DATASETS)}, got {p['dataset']!r}.")
  _check_output_dir(p)
  runtime_options(p).check()
  if p["client_store"] == "disk" and not p["output_dir"]:
    raise ValueError(
        "--client_store=disk needs --output_dir (states go to <output_dir>/client_states).")
  return p


def _check_applicable(p: Dict[str, Any], given: Dict[str, Any], spec) -> None:
  """A flag the chosen dataset does not use, set to another value than its default, is
  an error; one the chosen algorithm does not use is one warning line (harmless)."""
  changed = [
      n for n, v in given.items()
      if v is not None and n in DEFAULTS and p[n] != DEFAULTS[n] and n != "algorithm"
  ]
  ignored = set(data_lib.IGNORED_SETTINGS.get(p["dataset"], ()))
  bad = [n for n in changed if n in ignored]
  if bad:
    raise ValueError(f"--{bad[0]} is not used by --dataset={p['dataset']} (it ignores "
                     f"{', '.join('--' + n for n in sorted(ignored))}); leave it unset.")
  used = set(options.option_fields(spec.config_cls))
  for cls in COMMON_SETTINGS:
    used |= set(options.option_fields(cls))
  unused = sorted(n for n in changed if n not in used)
  if unused:
    print(f"warning: --algorithm={spec.name} does not use {', '.join('--' + n for n in unused)}.",
          file=sys.stderr,
          flush=True)


@dataclasses.dataclass(frozen=True)
class Configs:
  """A run's typed settings, each built once from its resolved flags (`configs`): the
  data it trains on, the algorithm's config, the round loop's and the runtime's."""
  data: data_lib.DataSpec
  algorithm: Any
  run: round_loop.RunConfig
  runtime: runtime_lib.RuntimeOptions


def data_spec(p: Dict[str, Any]) -> data_lib.DataSpec:
  return options.from_flags(data_lib.DataSpec, p, seed=p["seed"])


def run_config(p: Dict[str, Any], **fixed) -> round_loop.RunConfig:
  return options.from_flags(round_loop.RunConfig, p, verbose=p.get("verbose", True), **fixed)


def runtime_options(p: Dict[str, Any]) -> runtime_lib.RuntimeOptions:
  return options.from_flags(runtime_lib.RuntimeOptions, p)


def configs(p: Dict[str, Any], data: data_lib.FederatedData, *, model=None,
            **run_fixed) -> Configs:
  """Every typed config of a run from its resolved flags `p` (`resolve_params`, then
  `load_data`) and its `data` (the model's shapes), in one pass; the algorithm's own
  checks run here, before TensorFlow Federated starts. `model`: the checked
  `tfbfl.models.ModelTemplate` of `--model` (`model_template`), None for the built-in
  `--architecture`. `run_fixed`: RunConfig fields that come from elsewhere (the data
  fingerprint)."""
  spec = registry.get(p["algorithm"])
  return Configs(data=data_spec(p), algorithm=spec.make_config(p, data, model=model),
                 run=run_config(p, **run_fixed), runtime=runtime_options(p))


# Derived defaults that depend on the network family (`ModelTemplate.family`).
FAMILY_DEFAULTS = ("init_scale",)
# The flags a model's own layers replace: given with --model, they are an error.
MODEL_REPLACES = ("architecture", "hidden_units", "filters", "image_shape")


def _check_model_flags(p: Dict[str, Any], given: Dict[str, Any]) -> None:
  if p.get("model") is None:
    return
  clash = [n for n in MODEL_REPLACES if given.get(n) is not None and p[n] != DEFAULTS[n]]
  if clash:
    raise ValueError(f"--model={p['model']} brings its own layers; --{clash[0]} describes a "
                     "built-in network: leave it unset.")


def model_template(p: Dict[str, Any], data: data_lib.FederatedData, model=None):
  """The checked `tfbfl.models.ModelTemplate` of `--model` (or of the callable
  `model`, which `p["model"]` names) on `data`'s shapes; None without either. Builds
  the model once, eagerly: one `ModelError` line naming --model when it cannot be
  imported, is not callable, is not a Keras model of one input of the data's example
  shape and `num_classes` logits."""
  if model is None and p.get("model") is None:
    return None
  builder = models.resolve_builder(p["model"] if model is None else model)
  return models.template(builder, input_shape=data.input_shape, num_classes=data.num_classes,
                         label=p["model"])


def _check_temperature_scaling(p: Dict[str, Any], spec) -> None:
  """--temperature_scaling and --calibration_fraction come together, and only for an
  algorithm that fits temperatures: the split is held out of training for it alone."""
  fraction = p.get("calibration_fraction") or 0
  scaling = bool(p.get("temperature_scaling"))
  if "temperature_scaling" not in options.option_fields(spec.config_cls):
    if fraction > 0:
      raise ValueError(
          f"--calibration_fraction={fraction:g} holds out a calibration split that only "
          f"--temperature_scaling reads, which --algorithm={spec.name} does not have "
          "(FedAvg, FedProx, FedPA, VIRTUAL do); leave --calibration_fraction at 0.")
    return  # a --temperature_scaling it ignores is `_check_applicable`'s warning
  if (fraction > 0) != scaling:
    raise ValueError(
        "--temperature_scaling fits its temperatures on the clients' calibration splits, "
        "which --calibration_fraction (in (0, 0.9]) holds out, and nothing else reads that "
        f"split: set both or neither (got --calibration_fraction={fraction:g}, "
        f"--temperature_scaling={scaling}).")


def build_algorithm(data: data_lib.FederatedData, params: Dict[str, Any]):
  """The algorithm `params["algorithm"]` over `data` (its config checked first)."""
  c = configs(params, data)
  return registry.get(params["algorithm"]).build(data, c.algorithm, c.run)


def _check_output_dir(p: Dict[str, Any]) -> None:
  """--output_dir is not a file and does not lie under one; --resume and
  --overwrite need it and exclude each other. (Creation is tried by
  `run_training` before TFF starts.)"""
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


def load_data(p: Dict[str, Any], given: Optional[Dict[str, Any]] = None
              ) -> data_lib.FederatedData:
  """The federated data of the resolved flags `p`. Where the data decide how many
  clients there are (`--dataset=npz`: the file's), `p` is settled here, once: its
  `num_clients`, and, unless `given` (the flags as passed) set them, the defaults that
  derive from it (`clients_per_round`, the algorithm's derived defaults)."""
  fd = data_lib.load_federated(data_spec(p))
  if p["dataset"] == "npz":
    given = {} if given is None else given
    p["num_clients"] = len(fd.client_ids)
    if given.get("clients_per_round") is None:
      p["clients_per_round"] = round_loop.default_clients_per_round(p["num_clients"])
      if given.get("server_lr") is None:
        spec = registry.get(p["algorithm"])
        p.update(spec.config_cls.derived_defaults(dict(p, server_lr=None)))
    if p["clients_per_round"] > p["num_clients"]:
      raise ValueError(f"--clients_per_round={p['clients_per_round']} exceeds the "
                       f"{p['num_clients']} clients in {p['data_dir']}.")
  return fd


def run_training(params: Dict[str, Any],
                 *,
                 data: Optional[data_lib.FederatedData] = None,
                 model=None,
                 round_hook=None) -> Dict[str, Any]:
  """Runs one configuration; returns the summary dict (also in summary.json).

  Args:
    params: flag name -> value (missing: the defaults, `DEFAULTS`).
    data: the federated data to train on (e.g. `tfbfl.data.from_client_arrays`); None:
      loaded from the data flags (`DataSpec`). Given, the data flags must be left
      unset, and `num_clients` is the data's.
    model: the network, as `tff.learning`'s `model_fn`: a zero-argument callable
      returning an uncompiled Keras model with logits out (or its
      `"MODULE:FUNCTION"`, as `params["model"]`, the flag, takes it); None: the
      built-in `--architecture`. The run records it as `--model=MODULE:QUALNAME`.
    round_hook: `fn(round, row)` called after every round (tests, progress).

  Every flag, path and data check (`resolve_params`, `--output_dir` created
  and not in use by or holding another run unless `--resume`/`--overwrite`,
  the data loaded, a `--resume` checkpoint's flags and data fingerprint) runs
  before TensorFlow Federated starts, each failing with one `ValueError` /
  `FileNotFoundError` line naming the flag or file.
  """
  if data is not None:
    given = [
        n for n in options.option_fields(data_lib.DataSpec)
        if params.get(n) is not None and n != "num_clients"
    ]
    if given:
      raise ValueError(f"run_training(data=...) trains on the given data; leave "
                       f"{', '.join('--' + n for n in given)} unset.")
    params = dict(params, num_clients=len(data.client_ids))
  if model is not None:
    if params.get("model") is not None and params["model"] != models.builder_label(model):
      raise ValueError(f"run_training(model=...) and --model={params['model']} name two "
                       "models; pass one.")
    params = dict(params, model=models.builder_label(model))
  p = resolve_params(params)
  _check_model_flags(p, params)
  if p["output_dir"]:
    run_directory.prepare(p["output_dir"])
    run_directory.check_free(p["output_dir"])
    if not p["overwrite"]:
      run_directory.refuse_or_clear(p["output_dir"], resume=p["resume"], overwrite=False)
  spec = registry.get(p["algorithm"])
  if data is not None:
    fd = data
    p["dataset"] = "user"  # recorded; the data fingerprint identifies it
  else:
    fd = load_data(p, params)
  template = model_template(p, fd, model)
  if template is not None:
    # Defaults that follow the network family (VIRTUAL's init_scale) follow the model's.
    unset = {n: None for n in FAMILY_DEFAULTS if n in p and params.get(n) is None}
    if unset:
      p.update({n: v for n, v in spec.config_cls.derived_defaults(
          dict(p, architecture=template.family, **unset)).items() if n in unset})
  flags = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}
  if template is not None:
    # Recorded and compared on --resume with the flags (not a flag: never replayed).
    flags["model_fingerprint"] = template.fingerprint()
  fingerprint = None
  if p["resume"]:
    fingerprint = run_directory.data_fingerprint(fd)
    round_loop.ExperimentRunner.check_resumable(p["output_dir"], flags, fingerprint)
  c = configs(p, fd, model=template, data_fingerprint=fingerprint)
  if c.runtime.executor == "remote":
    runtime_lib.set_runtime("remote",
                            workers=c.runtime.workers,
                            call_timeout_s=c.runtime.call_timeout_s,
                            tls_ca=c.runtime.tls_ca,
                            tls_cert=c.runtime.tls_cert,
                            tls_key=c.runtime.tls_key)
  else:
    runtime_lib.set_local_runtime()
  algorithm = spec.build(fd, c.algorithm, c.run)
  runner = round_loop.ExperimentRunner(algorithm, fd, c.run, flags=flags, round_hook=round_hook,
                                       replay=REPLAY)
  try:
    return runner.run()
  finally:
    runner.close()  # the output directory's lock

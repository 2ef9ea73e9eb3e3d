"""The PFNM experiments' settings, their flags and the launchers' ``main``
(``reproduction.pfnm_figures`` runs the experiments).

Every launcher setting is declared once, as a ``tfbfl.options`` field (flag name,
default, help text, rule) of ``DataOptions``, ``TrainingOptions``,
``MatchingOptions``, ``BaselineOptions`` (shared; ``define_*_flags``,
``define_launcher_flags``: all of a launcher's) or of the launcher's own
``BatchesOptions``, ``DepthOptions``, ``StreamingOptions`` or
``SensitivityOptions``.  ``define_options`` makes the absl flags from such a
dataclass; ``options_from_flags`` parses them back into it (``tfbfl.options.from_flags``:
one ``ValueError`` naming the flag), and ``settings_from_flags`` turns the shared
ones into an ``ExperimentSettings``.  Defaults are the paper's (Table 1 and
section 4) except where digits (64 inputs instead of MNIST's 784) needs
otherwise; each such choice is stated in the flag's help.  Flags named like
``tfbfl.driver``'s settings take their help text (and, where the paper sets
none, their default) from ``driver.settings()``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import app
from absl import flags as absl_flags
import numpy as np

from tfbfl import data as data_lib
from tfbfl import options
from tfbfl import driver
from tfbfl import runtime
from tfbfl.algorithms import pfnm
from reproduction import _runs
from tfbfl.matching import MatchingHyperparams

__all__ = [
    "ExperimentSettings",
    "ONESHOT_METHODS",
    "CONSTRAINED_METHODS",
    "EXTRA_METHODS",
    "STREAMING_METHODS",
    "DEPTH_METHODS",
    "PFNM_DATASETS",
    "DataOptions",
    "TrainingOptions",
    "MatchingOptions",
    "BaselineOptions",
    "BatchesOptions",
    "DepthOptions",
    "StreamingOptions",
    "SensitivityOptions",
    "define_options",
    "options_from_flags",
    "define_launcher_flags",
    "define_data_flags",
    "define_training_flags",
    "define_matching_flags",
    "define_baseline_flags",
    "settings_from_flags",
    "matching_hparams_from_flags",
    "model_hidden_units",
    "parse_int_list",
    "parse_float_list",
    "check_at_least_one",
    "launcher_main",
    "check_dataset",
]

# Methods satisfying PFNM's constraints (Fig. 2), then those with extra resources (Fig. 3).
CONSTRAINED_METHODS = ("pfnm", "pfnm_small_gamma", "fedavg_shared", "fedavg_independent", "dpmeans",
                       "local")
EXTRA_METHODS = ("uniform_ensemble", "weighted_ensemble", "distillation", "downpour_sgd")
ONESHOT_METHODS = CONSTRAINED_METHODS + EXTRA_METHODS
STREAMING_METHODS = ("pfnm_streaming", "downpour_sgd", "uniform_ensemble", "weighted_ensemble",
                     "local")
DEPTH_METHODS = ("pfnm", "uniform_ensemble", "weighted_ensemble", "distillation", "downpour_sgd",
                 "local", "fedavg_independent")
PARTITION_CHOICES = ("homogeneous", "class_dirichlet")


# ------------------------------------------------------------------ settings
@dataclasses.dataclass
class ExperimentSettings:
  """Everything an experiment needs besides its own grid (J, C, steps, ...).

  Attributes:
    dataset, data_dir, partition, alpha, min_size, test_fraction: data
      (``tfbfl.data.load_federated``); pooled per-client test parts are the
      test set.
    seed: master seed; trial ``t`` of setting ``J`` uses seeds derived from
      ``(seed, J, t)``.
    hidden_units: hidden widths of the clients' networks (with ``model``: the
      model's, ``pfnm.hidden_units_of_model``).
    model: the user's network as ``--model`` named it (``MODULE:FUNCTION``), or
      None for ``--hidden_units``; recorded in settings.json.
    training: remaining ``LocalTrainingConfig`` fields (epochs, batch_size,
      learning_rate, l2, init_std, bias_init, shared_init).
    hp: matching hyperparameters.
    small_gamma0: gamma0 of the "pfnm_small_gamma" variant (paper: 1e-5).
    fedavg_hidden_units: hidden widths of the FedAvg clients (None: same as
      ``hidden_units``; the paper used 300 for more capacity).
    dpmeans_lambda, dpmeans_max_iter: DP-means penalty and sweeps.
    kd_hidden: width of every hidden layer of the distilled network (500).
    kd_epochs: distillation epochs (None: ``training["epochs"]``).
    comm_rounds, dsgd_epochs_per_round, dsgd_server_lr: downpour SGD.
    methods: methods to run (subset of the experiment's list).
  """

  dataset: str = "digits"
  data_dir: Optional[str] = None
  partition: str = "class_dirichlet"
  alpha: float = 0.2
  min_size: int = 10
  test_fraction: float = 0.25
  seed: int = 0
  hidden_units: tuple = (100,)
  model: Optional[str] = None
  training: Dict[str, Any] = dataclasses.field(default_factory=dict)
  hp: MatchingHyperparams = dataclasses.field(default_factory=MatchingHyperparams)
  small_gamma0: float = 1e-5
  fedavg_hidden_units: Optional[tuple] = None
  dpmeans_lambda: float = 1.5
  dpmeans_max_iter: int = 30
  kd_hidden: int = 500
  kd_epochs: Optional[int] = None
  comm_rounds: int = 10
  dsgd_epochs_per_round: int = 1
  dsgd_server_lr: float = 1.0
  methods: Optional[tuple] = None

  def training_config(self, fd, hidden_units=None, **overrides) -> pfnm.LocalTrainingConfig:
    """``LocalTrainingConfig`` for the data ``fd`` (input size, classes)."""
    kwargs = dict(self.training)
    kwargs.update(overrides)
    return pfnm.LocalTrainingConfig(
        input_dim=int(np.prod(fd.input_shape)),
        num_classes=fd.num_classes,
        hidden_units=tuple(self.hidden_units if hidden_units is None else hidden_units),
        **kwargs)

  def load(self, num_clients: int, seed: int, min_size: Optional[int] = None):
    """The federated data of one trial."""
    check_dataset(self.dataset)
    return data_lib.load_federated(self.dataset,
                                   data_dir=self.data_dir,
                                   partition=self.partition,
                                   num_clients=num_clients,
                                   alpha=self.alpha,
                                   min_size=self.min_size if min_size is None else min_size,
                                   test_fraction=self.test_fraction,
                                   seed=seed)

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["hp"] = dataclasses.asdict(self.hp)
    return d


PFNM_DATASETS = ("digits", "mnist", "cifar10")


def check_dataset(name: str) -> None:
  """Raises ValueError naming ``--dataset`` unless ``name`` is a dataset the
  PFNM experiments partition (digits, mnist, cifar10) and the data registry has
  a loader for it."""
  if name not in PFNM_DATASETS:
    raise ValueError(f"--dataset must be one of {PFNM_DATASETS} (pooled datasets split into J "
                     f"batches by --partition), got {name!r}")
  if name not in data_lib.DATASETS:
    raise ValueError(f"--dataset={name!r} is not in the data registry (tfbfl.data.DATASETS has "
                     f"{sorted(data_lib.DATASETS)}); register its loader with "
                     "tfbfl.data.register_dataset, or use --dataset=digits (no files needed).")


def parse_int_list(flag: str, value, minimum: int = 1) -> List[int]:
  """``"2,5,10"`` (or a list of such strings) -> ``[2, 5, 10]``, at least one int, each
  ``>= minimum`` (``tfbfl.options``' rule for int lists); ValueError names ``--flag``."""
  out = options.Option("ints", "ints", low=minimum, high=math.inf).check(value, flag)
  if not out:
    raise ValueError(f"--{flag} must list at least one int >= {minimum}, got {value!r}.")
  return list(out)


def parse_float_list(flag: str, value, positive: bool = True) -> List[float]:
  """``"0.1,1"`` -> ``[0.1, 1.0]``: at least one finite number (``positive``: each > 0);
  ValueError names ``--flag``."""
  rule = options.Option("reals", "numbers", low=0.0 if positive else None, low_open=positive)
  out = rule.check(value, flag)
  if not out:
    raise ValueError(f"--{flag} must list at least one number, got {value!r}.")
  return list(out)


def check_at_least_one(**counts) -> None:
  """ValueError naming ``--name`` for the first of ``counts`` (name=value) below 1."""
  for name, value in counts.items():
    if value < 1:
      raise ValueError(f"--{name} must be >= 1, got {value}")


def _check_methods(flag_value, allowed: Sequence[str]) -> tuple:
  if flag_value in (None, "", "all"):
    return tuple(allowed)
  items = flag_value if isinstance(flag_value, (list, tuple)) else str(flag_value).split(",")
  methods = tuple(m.strip() for m in items if m.strip())
  unknown = [m for m in methods if m not in allowed]
  if unknown or not methods:
    raise ValueError(f"--methods must be a comma list of {list(allowed)} (or 'all'), "
                     f"got unknown {unknown or flag_value!r}")
  return methods


# ------------------------------------------------------------------- options
# Every launcher setting is declared once, as a `tfbfl.options` field of one of the
# dataclasses below (flag name, default, help text, rule); `define_options` makes the
# absl flags from them and `options_from_flags` parses the flags back into the typed
# dataclass, with one ValueError naming the flag for a bad value. The launchers'
# flags have no sanity ceilings (`high=None`).
_POSITIVE = dict(low=0.0, low_open=True, high=None)  # a finite number > 0
_ANY = dict(low=None, high=None)  # any (finite) number
_AT_LEAST_1 = dict(low=1, high=None)


def _require_entries(config, *names: str) -> None:
  """ValueError naming ``--name`` for the first list flag of ``config`` left empty."""
  for name in names:
    if not getattr(config, name):
      raise ValueError(f"--{name} must list at least one value, got none.")


@dataclasses.dataclass(frozen=True)
class DataOptions:
  """The data flags (``define_data_flags``) and ``--output_dir``."""
  dataset: str = options.text(
      "digits", "digits (bundled, no download), mnist or cifar10 (files under --data_dir; see "
      "tfbfl.data).")
  data_dir: Optional[str] = options.text(None, _runs.flag_help("data_dir"))
  partition: str = options.choice(
      "class_dirichlet", PARTITION_CHOICES, "homogeneous (IID) or class_dirichlet (per class "
      "p_k ~ Dir_J(alpha); paper's heterogeneous partition).")
  alpha: float = options.real(0.2, _runs.flag_help("alpha", paper=0.2), **_POSITIVE)
  min_size: int = options.integer(driver.DEFAULTS["min_size"], _runs.flag_help("min_size"),
                                  **_ANY)
  seed: int = options.integer(
      driver.DEFAULTS["seed"],
      _runs.flag_help("seed", note="the master seed: every trial derives its seeds from it"),
      high=None)
  output_dir: Optional[str] = options.text(None,
                                           "Directory for results.csv, results.md and figures.")

  def __post_init__(self):
    check_dataset(self.dataset)


@dataclasses.dataclass(frozen=True)
class TrainingOptions:
  """Local training flags (paper Table 1, MNIST column); ``LocalTrainingConfig``'s rules."""
  hidden_units: Tuple[int, ...] = options.int_list(
      (100,), "Hidden widths of every client network (paper main text: one layer of 100).",
      high=math.inf)
  model: Optional[str] = options.text(
      None, "The clients' network as MODULE:FUNCTION (tff.learning's model_fn: a "
      "zero-argument function returning an uncompiled Keras model with logits out, imported "
      "from the current directory or PYTHONPATH); it must be a stack of Dense layers with "
      "ReLU and linear logits, whose widths and depth replace --hidden_units (PFNM's own "
      "initialisation and training are kept).")
  epochs: int = options.integer(10, "Local epochs (Table 1: 10).", high=None)
  batch_size: int = options.integer(32, _runs.flag_help("batch_size", paper="32, Table 1"),
                                    **_AT_LEAST_1)
  learning_rate: float = options.real(
      0.01, "Adam learning rate (Table 1: 0.01; 0.001 is used for --dataset=cifar10 unless "
      "given).", flag="lr", **_POSITIVE)
  l2: float = options.real(
      1e-6, "L2 coefficient as PyTorch weight_decay (Table 1: 1e-6; 1e-5 is used for "
      "--dataset=cifar10 unless given).", high=None)
  init_std: float = options.real(
      0.1, "Std of the kernel initialisation: Table 1's N(0, 0.01) read as a variance (the "
      "paper's N(mean, variance) notation); 0.01 for the std reading.", **_POSITIVE)
  bias_init: float = options.real(0.1, "Initial biases (Table 1: 0.1).", **_ANY)
  shared_init: bool = options.boolean(
      False, "All clients start from the same weights (PFNM does not need it; default: "
      "independent initialisations).")

  def __post_init__(self):
    _require_entries(self, "hidden_units")

  def local_training(self) -> Dict[str, Any]:
    """``ExperimentSettings.training``: the ``LocalTrainingConfig`` fields but the widths."""
    fields = [f.name for f in dataclasses.fields(self) if f.name not in ("hidden_units", "model")]
    return {name: getattr(self, name) for name in fields}


@dataclasses.dataclass(frozen=True)
class MatchingOptions:
  """PFNM matching hyperparameters and the ``--reference_settings`` preset
  (``MatchingHyperparams``' rules; ``--popularity_cap=0``: no cap)."""
  sigma0_sq: float = options.real(10.0, "Prior variance sigma0^2 of global neurons (paper: 10).",
                                  **_POSITIVE)
  sigma_sq: float = options.real(
      0.1, "Client noise variance sigma^2. Paper: 1 on MNIST, 'set using training data'; on "
      "digits' 64-input networks sigma^2 = 1 merges every neuron into L_j global ones, 0.1 is "
      "near the best training accuracy at a compact size (see launchers.pfnm_sensitivity).",
      **_POSITIVE)
  gamma0: float = options.real(1.0, "Beta-process mass gamma0 (paper: 1).", **_POSITIVE)
  max_sweeps: int = options.integer(10, "Random-order matching sweeps after the first pass.",
                                    high=None)
  max_global_neurons: int = options.integer(
      700, "Truncation level of the global layer (paper: 700).", **_AT_LEAST_1)
  truncation: str = options.choice(
      "paper", ("paper", "reference"),
      "Truncation rule (supplement 4.2, or the public reference code's).")
  popularity_cap: int = options.integer(
      0, "Cap on popularity counts m in log(m/(J-m)) (reference code: 10; 0 = no cap, the "
      "paper).", high=None)
  softmax_precision: str = options.choice(
      "class_frequency", ("uniform", "class_frequency"),
      "Precision of client softmax weights: uniform 1/sigma^2 (paper text) or scaled by the "
      "client's class frequency (reference code; a client that never saw class k carries no "
      "information about it). Default class_frequency: it matters on heterogeneous "
      "partitions and equals uniform on balanced data.")
  bias_prior_mean: float = options.real(0.0, "Prior mean of biases (paper 0; reference code "
                                        "0.1).", **_ANY)
  reference_settings: bool = options.boolean(
      False, "Start from the public reference code's choices (sigma0^2 = sigma^2 = gamma0 = "
      "1, popularity cap 10, reference truncation, class-frequency softmax precision, bias "
      "prior 0.1); matching flags given explicitly still override.")

  def hyperparams(self, seed: int, given: Collection[str] = ()) -> MatchingHyperparams:
    """``MatchingHyperparams`` with sweep seed ``seed``. With ``reference_settings``:
    the reference code's values, overridden by the matching flags in ``given`` (those set
    on the command line)."""
    fields = [f.name for f in dataclasses.fields(self) if f.name != "reference_settings"]
    values = {name: getattr(self, name) for name in fields}
    values["popularity_cap"] = values["popularity_cap"] or None
    if self.reference_settings:
      base = dataclasses.asdict(MatchingHyperparams.reference_code())
      base.update({name: value for name, value in values.items() if name in given})
      values = base
    values["seed"] = seed
    return MatchingHyperparams(**values)


@dataclasses.dataclass(frozen=True)
class BaselineOptions:
  """The baselines' flags and ``--methods`` (checked against a launcher's methods by
  ``settings_from_flags``)."""
  methods: str = options.text("all", "Comma list of methods, or 'all'.")
  small_gamma0: float = options.real(1e-5, "gamma0 of pfnm_small_gamma (paper: 1e-5).",
                                     **_POSITIVE)
  fedavg_hidden_units: Optional[Tuple[int, ...]] = options.int_list(
      (), "Hidden widths of the FedAvg clients (default: --hidden_units; the paper used 300 "
      "for capacity).", high=math.inf)
  dpmeans_lambda: float = options.real(
      1.5, "DP-means penalty lambda (squared distance between neuron atoms; ~ that of two "
      "unrelated digits neurons).", **_POSITIVE)
  kd_hidden: int = options.integer(
      500, "Width of each hidden layer of the distilled network (paper: 500).", **_AT_LEAST_1)
  kd_epochs: Optional[int] = options.integer(None, "Distillation epochs (default: --epochs).",
                                             none_ok=True, **_AT_LEAST_1)
  comm_rounds: int = options.integer(
      10, "Downpour SGD communication rounds (paper: one per epoch, 10).", **_AT_LEAST_1)
  dsgd_epochs_per_round: int = options.integer(
      1, "Local epochs between two D-SGD communications.", **_AT_LEAST_1)
  dsgd_server_lr: float = options.real(1.0, "D-SGD server step on the mean client weights.",
                                       **_POSITIVE)


# The launchers' own flags (their grids), each defined by its launcher with
# `define_options(..., module_name=__name__)` so that its --help lists them.
@dataclasses.dataclass(frozen=True)
class BatchesOptions:
  """``launchers.pfnm_batches``."""
  J: Tuple[int, ...] = options.int_list((2, 5, 10, 15, 20, 25, 30),
                                        "Numbers of batches (clients).", high=math.inf)
  trials: int = options.integer(10, "Trials (data partitions) per J (paper: 10).",
                                **_AT_LEAST_1)

  def __post_init__(self):
    _require_entries(self, "J")


@dataclasses.dataclass(frozen=True)
class DepthOptions:
  """``launchers.pfnm_depth``."""
  C: Tuple[int, ...] = options.int_list((1, 2, 3, 4, 5, 6), "Numbers of hidden layers.",
                                        high=math.inf)
  J: int = options.integer(10, "Number of batches (paper: 10).", **_AT_LEAST_1)
  width: int = options.integer(100, "Neurons per hidden layer of every client network.",
                               **_AT_LEAST_1)
  trials: int = options.integer(10, "Trials (data partitions) per C (paper: 10).",
                                **_AT_LEAST_1)

  def __post_init__(self):
    _require_entries(self, "C")


@dataclasses.dataclass(frozen=True)
class StreamingOptions:
  """``launchers.pfnm_streaming``."""
  J: int = options.integer(3, "Number of groups (paper: 3).", **_AT_LEAST_1)
  steps: int = options.integer(15, "Streaming steps S (paper: 15).", **_AT_LEAST_1)
  trials: int = options.integer(10, "Trials (data partitions).", **_AT_LEAST_1)
  fresh_neurons: int = options.integer(
      1, "Neurons of a group's next network initialised at the prior mean (paper: gamma0 = "
      "1); the rest are drawn from the global network.", **_ANY)
  init_noise: float = options.real(0.01, "Std of the noise added to those initial weights.",
                                   high=None, inf_ok=True)


@dataclasses.dataclass(frozen=True)
class SensitivityOptions:
  """``launchers.pfnm_sensitivity``."""
  J: Tuple[int, ...] = options.int_list((25,), "Numbers of batches (paper: 25).", high=math.inf)
  trials: int = options.integer(10, "Trials (data partitions) per J.", **_AT_LEAST_1)
  sigma0_sq_grid: Tuple[float, ...] = options.real_list((1, 10, 100), "Values of sigma0^2.",
                                                        **_POSITIVE)
  gamma0_grid: Tuple[float, ...] = options.real_list((0.1, 1, 10), "Values of gamma0.",
                                                     **_POSITIVE)
  sigma_sq_grid: Tuple[float, ...] = options.real_list((0.03, 0.1, 0.3, 1), "Values of sigma^2.",
                                                       **_POSITIVE)

  def __post_init__(self):
    _require_entries(self, "J", "sigma0_sq_grid", "gamma0_grid", "sigma_sq_grid")


# --------------------------------------------------------------------- flags
def define_options(cls,
                   flag_values=None,
                   *,
                   skip: Collection[str] = (),
                   defaults: Optional[Mapping[str, Any]] = None,
                   helps: Optional[Mapping[str, str]] = None,
                   module_name: Optional[str] = None) -> List[str]:
  """Defines an absl flag for every ``tfbfl.options`` setting of the dataclass ``cls``
  but ``skip`` (on ``flag_values``, default ``absl.flags.FLAGS``); returns their names.

  ``defaults`` / ``helps`` replace some flags' default / help text.  ``module_name``
  (a launcher's ``__name__``) makes them that module's flags, listed by its ``--help``
  (default: this module's, listed by ``--helpfull``).  The values are checked when
  ``options_from_flags`` parses them (a ``ValueError`` naming the flag, in-process as
  on the command line), not by absl validators at parse time as ``tfbfl.flags`` does.
  """
  fv = absl_flags.FLAGS if flag_values is None else flag_values
  defaults, helps = dict(defaults or {}), dict(helps or {})
  where = {}
  if module_name is not None:  # absl's name for the module run as a script
    where["module_name"] = sys.argv[0] if module_name == "__main__" else module_name
  define = dict(int=absl_flags.DEFINE_integer,
                float=absl_flags.DEFINE_float,
                bool=absl_flags.DEFINE_bool,
                str=absl_flags.DEFINE_string)
  names = []
  for name, (f, option) in options.option_fields(cls).items():
    if name in skip:
      continue
    default, text = defaults.get(name, f.default), helps.get(name, option.help)
    if option.kind == "enum":
      absl_flags.DEFINE_enum(name, default, list(option.choices), text, flag_values=fv, **where)
    elif option.kind in define:
      define[option.kind](name, default, text, flag_values=fv, **where)
    else:  # "ints", "strs", "reals": comma-separated lists
      listed = None if default is None else [
          format(x, "g") if option.kind == "reals" else str(x) for x in default
      ]
      absl_flags.DEFINE_list(name, listed, text, flag_values=fv, **where)
    names.append(name)
  return names


def options_from_flags(cls, flag_values=None):
  """The dataclass ``cls`` from the parsed values of its flags (``define_options``;
  a flag not defined takes the field's default) via ``tfbfl.options.from_flags``.

  Raises:
    ValueError: naming the offending flag.
  """
  fv = absl_flags.FLAGS if flag_values is None else flag_values
  names = options.option_fields(cls)
  return options.from_flags(cls, {name: fv[name].value for name in names if name in fv})


def _given(cls, flag_values) -> List[str]:
  """The flags of ``cls`` set on the command line."""
  return [name for name in options.option_fields(cls) if name in flag_values and
          flag_values[name].present]


def define_launcher_flags(methods: Optional[Sequence[str]] = None,
                          flag_values=None,
                          hidden_units: bool = True) -> None:
  """A launcher's shared flags: data, local training (``hidden_units``: with
  ``--hidden_units``), matching and, given its ``methods``, the baselines'."""
  define_data_flags(flag_values)
  define_training_flags(flag_values, hidden_units=hidden_units)
  define_matching_flags(flag_values)
  if methods is not None:
    define_baseline_flags(methods, flag_values)


def define_data_flags(flag_values=None, partition: str = "class_dirichlet") -> None:
  """``DataOptions``: --dataset, --data_dir, --partition, --alpha, --min_size, --seed,
  --output_dir (on ``flag_values``, default ``absl.flags.FLAGS``)."""
  define_options(DataOptions, flag_values, defaults={"partition": partition})


def define_training_flags(flag_values=None, hidden_units: bool = True) -> None:
  """``TrainingOptions``: local training flags (paper Table 1, MNIST column)."""
  define_options(TrainingOptions, flag_values, skip=() if hidden_units else ("hidden_units",))


def define_matching_flags(flag_values=None) -> None:
  """``MatchingOptions``: PFNM matching hyperparameters and --reference_settings."""
  define_options(MatchingOptions, flag_values)


def define_baseline_flags(methods: Sequence[str], flag_values=None) -> None:
  """``BaselineOptions``: baseline flags and --methods (its help lists ``methods``)."""
  define_options(BaselineOptions,
                 flag_values,
                 helps={"methods": f"Comma list of methods, or 'all': {list(methods)}."})


def settings_from_flags(FLAGS, methods: Sequence[str]) -> ExperimentSettings:
  """Validated ``ExperimentSettings`` from the flags defined above (those a launcher
  did not define take their defaults); ``methods``: the launcher's.

  Raises:
    ValueError: naming the offending flag.
  """
  data = options_from_flags(DataOptions, FLAGS)
  if not data.output_dir:
    raise ValueError("--output_dir is required")
  local = options_from_flags(TrainingOptions, FLAGS)
  hidden_units = local.hidden_units
  if local.model is not None:
    hidden_units = model_hidden_units(data, local.model, _given(TrainingOptions, FLAGS))
  if data.dataset == "cifar10":  # Table 1's CIFAR-10 column unless given explicitly
    given = _given(TrainingOptions, FLAGS)
    local = dataclasses.replace(local,
                                learning_rate=local.learning_rate if "lr" in given else 0.001,
                                l2=local.l2 if "l2" in given else 1e-5)
  base = options_from_flags(BaselineOptions, FLAGS)
  return ExperimentSettings(dataset=data.dataset,
                            data_dir=data.data_dir,
                            partition=data.partition,
                            alpha=data.alpha,
                            min_size=data.min_size,
                            seed=data.seed,
                            hidden_units=hidden_units,
                            model=local.model,
                            training=local.local_training(),
                            hp=matching_hparams_from_flags(FLAGS, seed=data.seed),
                            small_gamma0=base.small_gamma0,
                            fedavg_hidden_units=base.fedavg_hidden_units or None,
                            dpmeans_lambda=base.dpmeans_lambda,
                            kd_hidden=base.kd_hidden,
                            kd_epochs=base.kd_epochs,
                            comm_rounds=base.comm_rounds,
                            dsgd_epochs_per_round=base.dsgd_epochs_per_round,
                            dsgd_server_lr=base.dsgd_server_lr,
                            methods=_check_methods(base.methods, methods))


def model_hidden_units(data: DataOptions, model: str, given: Collection[str] = ()) -> tuple:
  """The hidden widths of ``--model`` on the examples of ``data.dataset``
  (``pfnm.hidden_units_of_model``; the data are loaded once, unpartitioned, for
  their shapes).

  Raises:
    ValueError: ``--hidden_units`` is also given, or (``tfbfl.models.ModelError``)
      the model is not a ReLU ``Dense`` stack PFNM can match; one line naming
      --model.
  """
  if "hidden_units" in given:
    raise ValueError(f"--model={model} brings its own layers; --hidden_units describes a "
                     "built-in network: leave it unset.")
  fd = data_lib.load_federated(data.dataset, data_dir=data.data_dir, partition="homogeneous",
                               num_clients=1, seed=data.seed)
  return tuple(pfnm.hidden_units_of_model(model, fd.input_shape, fd.num_classes))


def matching_hparams_from_flags(FLAGS, seed: Optional[int] = None) -> MatchingHyperparams:
  """Matching flags -> ``MatchingHyperparams`` (``--reference_settings``: the
  reference code's values, overridden by explicitly given matching flags); sweep
  seed ``seed`` (default ``--seed``)."""
  matching = options_from_flags(MatchingOptions, FLAGS)
  return matching.hyperparams(FLAGS.seed if seed is None else seed,
                              _given(MatchingOptions, FLAGS))


# ------------------------------------------------------------------ launchers
def launcher_main(argv, prepare: Callable[[], Callable[[], Any]], FLAGS=None) -> None:
  """The ``main`` of a PFNM launcher.

  ``prepare()`` reads and checks the flags and returns the experiment, a
  callable without arguments; a ``ValueError`` from it (or any extra command-line
  argument) becomes an ``absl.app.UsageError``.  The experiment then runs with the
  local TFF runtime (shut down afterwards), its ``ValueError`` or
  ``FileNotFoundError`` (bad data files or settings) also becoming a
  ``UsageError``, and the path of ``results.md`` under ``FLAGS.output_dir``
  (default ``absl.flags.FLAGS``) is printed.
  """
  FLAGS = absl_flags.FLAGS if FLAGS is None else FLAGS
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    experiment_fn = prepare()
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  runtime.set_local_runtime()
  try:
    experiment_fn()
  except (ValueError, FileNotFoundError) as e:  # bad data files or settings
    raise app.UsageError(str(e)) from e
  finally:
    runtime.shutdown()
  print(f"wrote {FLAGS.output_dir}/results.md")

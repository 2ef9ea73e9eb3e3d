"""What every federated algorithm shares: its contract, its common settings, its seeds.

The driver (`tfbfl.round_loop.ExperimentRunner`) drives any object that satisfies
`FederatedAlgorithm`; `tfbfl.algorithms.registry` names the algorithms the launchers
can build. This module imports neither TensorFlow nor the driver, so the settings of
every algorithm (and the flags made from them, `tfbfl.flags`) are known, and
checked, before TensorFlow starts. The one local-training loop the algorithms share
is `tfbfl.algorithms.client_batch` (fixed-size masked minibatches over stateless
per-epoch permutations, one `tf.while_loop`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np

from tfbfl import options

# Every network family a launcher can name; each config accepts its own subset.
#   mlp: every algorithm; conv (VIRTUAL's FEMNIST net): VIRTUAL and the FedAvg family;
#   lstm (Shakespeare): VIRTUAL; cnn (McMahan et al.'s CIFAR-10 CNN): FOLA / FedCurv.
ARCHITECTURES = ("mlp", "conv", "lstm", "cnn")

# Robust rounds' drop bound (see `tfbfl.algorithms.robust` for the measurements).
DEFAULT_MAX_UPDATE_RATIO = 100.0


# The one seed rule (`client_seed`; `tfbfl.tff_learning` applies it in TensorFlow).
SEED_STRIDE = 1_000_003


def client_seed(seed: int, round_num: int, client_index: int) -> np.ndarray:
  """The stateless seed `[seed, round_num * SEED_STRIDE + k]` the driver gives client k
  in round `round_num` (1-based; evaluations use `evaluation_seed`); algorithms that
  draw on their own (Global) reuse it."""
  return np.array([seed, round_num * SEED_STRIDE + client_index], dtype=np.int64)


def evaluation_seed(seed: int, client_index: int) -> np.ndarray:
  """Client k's seed at every evaluation, `client_seed(seed, -1, k)`. No round changes
  it, so an evaluation is a function of the states evaluated: a Monte Carlo
  predictive of a client that has not trained since gives the same sums, which the
  driver caches (`SupportsStreamedEvaluation.mt_cacheable`)."""
  return client_seed(seed, -1, client_index)


# The architectures that read each example as an image.
IMAGE_ARCHITECTURES = ("conv", "cnn")


def conv_image_shape(image_shape: Optional[Sequence[int]], example_shape: Sequence[int],
                     architecture: str = "conv") -> Tuple[int, int, int]:
  """The image `(H, W, C)` a convolutional network reads each example as.

  `image_shape` (`--image_shape`, `(H, W)` or `(H, W, C)`) when given; else the
  example's own shape when it is an image (`(H, W)` or `(H, W, C)`); else a flat
  example of `n = s * s` entries, viewed as `(s, s, 1)`. The image holds exactly the
  example's entries, `H * W * C = prod(example_shape)`: the networks reshape a batch
  to `(-1, H, W, C)`, so an image of another size would silently change the batch
  size inside the computation. `architecture` is the flag's value, for the errors.

  Raises:
    ValueError: naming `--image_shape` when it is malformed or its size differs
      from the example's, or when a flat example is not a square.
  """
  example = tuple(int(d) for d in example_shape)
  entries = int(np.prod(example)) if example else 0
  if image_shape:
    image = tuple(int(d) for d in image_shape)
    if len(image) not in (2, 3) or min(image) < 1:
      raise ValueError(f"--image_shape must be H,W or H,W,C of positive ints, got {image}.")
  elif len(example) in (2, 3):
    image = example
  else:
    side = math.isqrt(entries) if len(example) == 1 else 0
    if side < 1 or side * side != entries:
      raise ValueError(f"--architecture={architecture} reads each example as an image; the "
                       f"data's examples have shape {example}, not a square number of entries: "
                       f"pass --image_shape=H,W[,C] with H*W*C = {entries}.")
    image = (side, side)
  if len(image) == 2:
    image = image + (1,)
  if int(np.prod(image)) != entries:
    raise ValueError(f"--image_shape={','.join(map(str, image))} holds {int(np.prod(image))} "
                     f"entries; the data's examples (shape {example}) hold {entries}.")
  return image


@runtime_checkable
class FederatedAlgorithm(Protocol):
  """The contract between an algorithm and the round driver.

  States and metrics are nested structures of arrays (namedtuples, lists, dicts);
  `client_states`, `seeds` and `data` hold the selected clients in one order, and a
  client's seed is `client_seed(run seed, round, k)`.

  Optional hooks are the small protocols below (`OPTIONAL_HOOKS`); an algorithm
  class that defines any member of one defines all of them, which
  `check_hooks` verifies when the algorithm registers (`registry.register`).
  """

  def initial_server_state(self) -> Any:
    """The server state before round 1."""

  def initial_client_state(self, client_index: int) -> Any:
    """Client `client_index`'s state before it is first selected."""

  def next(self, server_state, client_states, seeds, data) -> Tuple[Any, Sequence[Any], Dict]:
    """One round: `(server_state, client_states, metrics)` of the selected clients."""

  def evaluate(self, server_state, client_states, seeds, test_data) -> Sequence[Mapping]:
    """Per-client sums {server_loss, server_correct, mt_loss, mt_correct, num_examples}."""


def temperature_scaling_option():
  """`--temperature_scaling`: one declaration for every algorithm that fits temperatures
  (`tfbfl.temperature`; its evaluation data carry the calibration split)."""
  return options.boolean(
      False, "FedAvg, FedProx, FedPA, VIRTUAL: post-hoc temperature scaling: every "
      "evaluation divides the S logits by one temperature and the MT logits by another "
      "(VIRTUAL with --eval_samples: the log of the averaged probabilities), each the grid "
      "value of the smallest NLL summed over the clients' calibration splits "
      "(--calibration_fraction, never trained on); metrics.csv gets server_temperature "
      "and mt_temperature.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClientTraining:
  """Settings every algorithm with local training shares (one flag each).

  Subclasses add their own settings and check in `__post_init__` which
  `architecture` values they support (after calling `super().__post_init__()`).
  `seed` is the run's `--seed`, set by the driver.
  """
  hidden_units: Sequence[int] = options.int_list(
      (100, 100), "Hidden layer widths of the MLP (empty: a linear model).")
  epochs: int = options.integer(20, "Local epochs E per round.", low=1, flag="epochs_per_round")
  batch_size: int = options.integer(20, "Client minibatch size B.", low=1)
  client_lr: float = options.real(0.05, "Client SGD learning rate.", low_open=True)
  server_lr: Optional[float] = options.real(
      None, "Server step. VIRTUAL: the damped-EP step alpha in (0, 1], taken by the server "
      "posterior and each client factor alike (default 1/clients_per_round, measured); "
      "FedAvg family and FedPA: server learning rate (default 1.0; 0.03 with "
      "--server_optimizer=adam).",
      low_open=True,
      none_ok=True)
  # The user's network (`tfbfl.models`): "MODULE:FUNCTION" from the flag, or the
  # callable itself from Python (`driver.run_training(model=...)`).
  model: Optional[Any] = options.text(
      None, "The network, as tff.learning's model_fn: MODULE:FUNCTION naming a zero-argument "
      "function that returns an uncompiled Keras Sequential or functional model with logits "
      "out (imported from the current directory or PYTHONPATH); its layers replace "
      "--architecture, --hidden_units, --filters and --image_shape. Unset: the built-in "
      "--architecture.")
  architecture: str = options.choice(
      "mlp", ARCHITECTURES, "Network: mlp (all algorithms), conv (FEMNIST net: VIRTUAL and "
      "the FedAvg family), lstm (Shakespeare, VIRTUAL), cnn (McMahan et al. CIFAR-10 CNN, "
      "FOLA/FedCurv).")
  image_shape: Optional[Sequence[int]] = options.int_list(
      None, "conv, cnn: the image H,W[,C] each example is read as; it must hold the "
      "example's entries (default: the data's own image shape, else a flat square n as "
      "sqrt(n) x sqrt(n): digits 8,8).")
  filters: Sequence[int] = options.int_list((32, 64), "conv: filters per conv layer.")
  max_update_ratio: float = options.real(
      DEFAULT_MAX_UPDATE_RATIO, "Robust rounds: drop a client update that is non-finite or "
      "whose move of the weights (VIRTUAL: of the posterior mean) exceeds this times "
      "max(norm of the server's weights, 1) "
      "(inf: finiteness only).",
      low_open=True,
      high=None,
      inf_ok=True)
  seed: int = 0

  def __post_init__(self):
    # Flags give tuples or None; library callers may pass lists.
    object.__setattr__(self, "hidden_units", tuple(int(h) for h in self.hidden_units or ()))
    object.__setattr__(self, "filters", tuple(int(f) for f in self.filters or ()))
    if self.image_shape is not None:
      object.__setattr__(self, "image_shape", tuple(int(d) for d in self.image_shape) or None)
    for name, option in (
        (f.name, f.metadata["option"]) for f in dataclasses.fields(self) if "option" in f.metadata):
      value = getattr(self, name)
      if option.kind in ("int", "float") and value is not None:
        # The flag's rule (and message), without its command-line sanity ceiling.
        option.check(value, option.flag or name, upper=False)
    if any(h < 1 for h in self.hidden_units):
      raise ValueError(f"--hidden_units must be positive, got {self.hidden_units}.")

  @classmethod
  def derived_defaults(cls, params: Mapping[str, Any]) -> Dict[str, Any]:
    """Flag values this algorithm derives from others when they are unset (None).

    `driver.resolve_params` fills them in, so the recorded flags of a run show
    the values it used. Subclasses extend it (VIRTUAL: `server_lr = 1/C`).
    """
    del params
    return {}

  def check_architecture(self, supported: Sequence[str], who: str) -> None:
    if self.architecture not in supported:
      raise ValueError(f"--architecture must be one of {tuple(supported)} for {who}, "
                       f"got {self.architecture!r}.")

  def resolve_image_shape(self, example_shape: Sequence[int]) -> None:
    """For a convolutional architecture, sets `image_shape` to the `(H, W, C)` each
    example of shape `example_shape` is read as (`conv_image_shape`, which checks
    it); other architectures keep it as given."""
    if self.architecture in IMAGE_ARCHITECTURES:
      object.__setattr__(self, "image_shape", conv_image_shape(self.image_shape, example_shape,
                                                                   self.architecture))


# ------------------------------------------------------------------ optional hooks
@runtime_checkable
class SupportsTwoPhase(Protocol):
  """`next` split for multi-worker contexts (`tfbfl.runtime.RemoteRuntime`): the
  driver calls `next_two_phase` instead of `next` there (same signature)."""

  def next_two_phase(self, server_state, client_states, seeds,
                     data) -> Tuple[Any, Sequence[Any], Dict]:
    ...


@runtime_checkable
class SupportsStreamedEvaluation(Protocol):
  """Evaluation a chunk of clients at a time: S from the server state alone, MT
  from the clients' states alone; with `mt_cacheable` true, a client's MT sums
  stay valid until it trains again (the driver caches them)."""
  mt_cacheable: bool

  def evaluate_server(self, server_state, client_indices, seeds, test_data) -> Sequence[Mapping]:
    """Per-client {server_loss, server_correct, num_examples}."""

  def evaluate_clients(self, client_states, client_indices, seeds,
                       test_data) -> Sequence[Mapping]:
    """Per-client {mt_loss, mt_correct, num_examples}."""


@runtime_checkable
class ReportsRoundBytes(Protocol):
  """Communication counts (`tfbfl.communication`): bytes up and down of a round
  with `num_selected` clients, given its metrics; the driver adds `bytes_up`,
  `bytes_down` and running totals to `metrics.csv` and `summary.json`."""

  def round_bytes(self, num_selected: int, metrics) -> Tuple[int, int]:
    ...


@runtime_checkable
class ReportsDiagnostics(Protocol):
  """Extra per-round columns of `metrics.csv` (TensorBoard group `diagnostics/`),
  from the server state and the client store."""

  def factor_diagnostics(self, server_state, clients) -> Dict[str, float]:
    ...


@runtime_checkable
class SupportsExport(Protocol):
  """The models metrics S and MT evaluate, as `tfbfl.predictor.make_predictor`
  modules (`tfbfl.export.export_run` writes them as SavedModels). `samples=None`:
  what the evaluation computes; > 0: an MC predictive where the model is Bayesian.
  With `export_server_needs_clients`, `server_predictor` also takes
  `client_states=` (every client's state: Local's ensemble). `reuse` is a
  predictor `client_predictor` returned for an earlier client with the same
  `samples` (`export_run` passes the previous one): the hook may assign this
  client's model into it and return it rather than trace a new one."""
  export_server_needs_clients: bool

  def server_predictor(self, server_state, *, samples: Optional[int] = None, seed: int = 0):
    ...

  def client_predictor(self, server_state, client_state, *, samples: Optional[int] = None,
                       seed: int = 0, reuse: Any = None):
    ...


@runtime_checkable
class SupportsLearningProcess(Protocol):
  """What `tfbfl.tff_learning.build_process` needs for a `tff.learning` process:

    learning_round: the TFF computation of one round, `(server_state,
      client_states, seeds, data) -> (server_state, client_states, metrics)`
      with federated arguments (`next`, or VIRTUAL's `next_per_client`);
    stateful_clients: whether the process keeps every client's state;
    model_weights(server_state) -> (trainable, non_trainable): TF on the
      server state, the model `get_model_weights` returns;
    with_model_weights(server_state, trainable, non_trainable) -> server_state.
  """
  stateful_clients: bool

  @property
  def learning_round(self) -> Any:
    ...

  def model_weights(self, server_state) -> Tuple[Sequence[Any], Sequence[Any]]:
    ...

  def with_model_weights(self, server_state, trainable, non_trainable) -> Any:
    ...


OPTIONAL_HOOKS = (SupportsTwoPhase, SupportsStreamedEvaluation, ReportsRoundBytes,
                  ReportsDiagnostics, SupportsExport, SupportsLearningProcess)


def _members(protocol) -> Tuple[str, ...]:
  names = set(getattr(protocol, "__annotations__", {}))
  names |= {n for n, v in vars(protocol).items()
            if not n.startswith("_") and (callable(v) or isinstance(v, property))}
  return tuple(sorted(names))


def hook_members(protocol) -> Tuple[str, ...]:
  """The members an algorithm defines to provide `protocol`."""
  return _members(protocol)


def check_hooks(algorithm_cls: type) -> Tuple[type, ...]:
  """The optional hooks `algorithm_cls` provides (class attributes, methods or
  properties); raises `TypeError` naming the missing members where it defines
  only part of one. (The four members of the contract may be set per instance;
  the driver checks them on the object.)"""
  provided = []
  for protocol in OPTIONAL_HOOKS:
    members = _members(protocol)
    have = [m for m in members if hasattr(algorithm_cls, m)]
    if have and len(have) < len(members):
      raise TypeError(f"{algorithm_cls.__name__} defines {have} of {protocol.__name__} but not "
                      f"{sorted(set(members) - set(have))}.")
    if have:
      provided.append(protocol)
  return tuple(provided)

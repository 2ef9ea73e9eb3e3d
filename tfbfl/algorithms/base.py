"""What every federated algorithm shares: its contract, its common settings, its seeds.

The driver (`tfbfl.experiment.ExperimentRunner`) drives any object that satisfies
`FederatedAlgorithm`; `tfbfl.algorithms.registry` names the algorithms the launchers
can build. This module imports neither TensorFlow nor the driver, so the settings of
every algorithm (and the flags made from them, `tfbfl.flags`) are known, and
checked, before TensorFlow starts. The one local-training loop the algorithms share
is `tfbfl.algorithms.client_batch` (fixed-size masked minibatches over stateless
per-epoch permutations, one `tf.while_loop`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np

from tfbfl import options

# Every network family a launcher can name; each config accepts its own subset.
#   mlp: every algorithm; conv (VIRTUAL's FEMNIST net): VIRTUAL and the FedAvg family;
#   lstm (Shakespeare): VIRTUAL; cnn (McMahan et al.'s CIFAR-10 CNN): FOLA / FedCurv.
ARCHITECTURES = ("mlp", "conv", "lstm", "cnn")

# Robust rounds' drop bound (see `tfbfl.algorithms.robust` for the measurements).
DEFAULT_MAX_UPDATE_RATIO = 100.0


def client_seed(seed: int, round_num: int, client_index: int) -> np.ndarray:
  """The stateless seed `[seed, round_num * 1_000_003 + k]` the driver gives client k in
  round `round_num` (1-based); algorithms that draw on their own (Global) reuse it."""
  return np.array([seed, round_num * 1_000_003 + client_index], dtype=np.int64)


@runtime_checkable
class FederatedAlgorithm(Protocol):
  """The contract between an algorithm and the round driver.

  States and metrics are nested structures of arrays (namedtuples, lists, dicts);
  `client_states`, `seeds` and `data` hold the selected clients in one order, and a
  client's seed is `client_seed(run seed, round, k)`.

  Optional members the driver uses when present:
    `next_two_phase(...)`: same signature as `next`, used under multi-worker contexts;
    `evaluate_server(server_state, test_data)` / `evaluate_clients(...)` and a true
      `mt_cacheable`: streamed evaluation with the MT metric cached per client;
    `round_bytes(num_selected, round_metrics) -> (up, down)`: communication counts;
    `factor_diagnostics(server_state)`: extra columns for `metrics.csv`.
  """

  def initial_server_state(self) -> Any:
    """The server state before round 1."""

  def initial_client_state(self, client_index: int) -> Any:
    """Client `client_index`'s state before it is first selected."""

  def next(self, server_state, client_states, seeds, data) -> Tuple[Any, Sequence[Any], Dict]:
    """One round: `(server_state, client_states, metrics)` of the selected clients."""

  def evaluate(self, server_state, client_states, seeds, test_data) -> Sequence[Mapping]:
    """Per-client sums {server_loss, server_correct, mt_loss, mt_correct, num_examples}."""


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
  architecture: str = options.choice(
      "mlp", ARCHITECTURES, "Network: mlp (all algorithms), conv (FEMNIST net: VIRTUAL and "
      "the FedAvg family), lstm (Shakespeare, VIRTUAL), cnn (McMahan et al. CIFAR-10 CNN, "
      "FOLA/FedCurv).")
  image_shape: Optional[Sequence[int]] = options.int_list(
      None, "conv: image shape H,W[,C] of flat inputs (digits: 8,8).")
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

    `training.resolve_params` fills them in, so the recorded flags of a run show
    the values it used. Subclasses extend it (VIRTUAL: `server_lr = 1/C`).
    """
    del params
    return {}

  def check_architecture(self, supported: Sequence[str], who: str) -> None:
    if self.architecture not in supported:
      raise ValueError(f"--architecture must be one of {tuple(supported)} for {who}, "
                       f"got {self.architecture!r}.")

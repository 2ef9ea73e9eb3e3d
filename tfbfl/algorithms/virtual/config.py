"""VIRTUAL's settings and state types; imports no TensorFlow.

The damped-EP step alpha (`server_lr`) is taken by the server posterior,
`s <- s * Delta^alpha`, and by every client factor, `s_i <- s_i * Delta_i^alpha`;
unset, it is `default_step(C) = 1/C`. Why, and the measurements behind each
default below: docs/virtual.md.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np

from tfbfl import options
from tfbfl.algorithms import base

# The state types keep the module name of the former `tfbfl/algorithms/virtual.py`:
# `tfbfl.state_files` records a namedtuple as `module:qualname` and finds it in that
# module on load (the package re-exports them), so checkpoints keep loading.
_STATE_MODULE = "tfbfl.algorithms.virtual"

ServerState = collections.namedtuple("ServerState", ["posterior", "aggregator_state", "round_num"],
                                     module=_STATE_MODULE)
# `client_index` travels with the state so the driver can re-key client outputs
# (TFF's mergeable/remote contexts may return them in completion order).
ClientState = collections.namedtuple(
    "ClientState", ["shared_factor", "shared_posterior", "private", "trained", "client_index"],
    module=_STATE_MODULE)
ClientOutput = collections.namedtuple(
    "ClientOutput", [
        "delta", "client_state", "metrics", "num_examples", "delta_nonzeros", "cavity_floored",
        "dropped", "update_ratio"
    ],
    module=_STATE_MODULE)


# The initial posterior std per network family (docs/virtual.md, "Initial scale"):
# the conv net's wide fan-in layers need it below their Glorot means' scale.
DEFAULT_INIT_SCALE = {"mlp": 0.05, "lstm": 0.05, "conv": 0.005}


def default_init_scale(architecture: str) -> float:
  """`init_scale`'s default for `architecture` (`DEFAULT_INIT_SCALE`)."""
  return DEFAULT_INIT_SCALE.get(architecture, DEFAULT_INIT_SCALE["mlp"])


def default_step(clients_per_round: int) -> float:
  """VIRTUAL's default damped-EP step alpha = 1/C (server and client factors alike).

  Measured stable where Algorithm 1's alpha = 1 was not (docs/virtual.md, "The
  default step"); `--server_lr=1` is Algorithm 1.
  """
  return 1.0 / int(clients_per_round)


@dataclasses.dataclass(frozen=True)
class VirtualConfig(base.ClientTraining):
  """Settings of VIRTUAL: `base.ClientTraining`'s plus those below (flags of the launchers).

  `server_lr` is the damped-EP step alpha in (0, 1]; unset, it is
  `default_step(clients_per_round)` (`clients_per_round` unset: `num_clients`).
  """
  input_dim: int
  num_classes: int
  num_clients: int
  clients_per_round: Optional[int] = None  # the run's C; sets the default step
  activation: str = "relu"
  precision_step: float = options.real(
      0.0, "VIRTUAL: natural-gradient step rho in [0, 1] of the shared posterior's "
      "precisions (0: plain SGD on the softplus scales, as the paper).",
      high=1.0)
  # The paper's plain SGD leaves the softplus scales where they start (their gradient is
  # O(sigma^2 curvature) and beta / N_i small); Adam's per-entry normalisation lets them
  # reach the objective's optimum within a run (docs/virtual.md, "Variances").
  scale_optimizer: str = options.choice(
      "sgd", ("sgd", "adam"), "VIRTUAL (MLP, lean step): update of the softplus scales of the "
      "shared and private posteriors: sgd (the means' SGD step, the paper) or adam (Adam of "
      "their own, step --scale_lr, moments reset each round).")
  scale_lr: float = options.real(1e-3,
                                 "VIRTUAL --scale_optimizer=adam: Adam's step on the scales.",
                                 low_open=True)
  # beta; the paper finds 1e-6..1e-3 harmless (Fig. 2)
  kl_weight: float = options.real(1e-4, "VIRTUAL: KL multiplier beta.", high=options.MAX_WEIGHT)
  # The paper weights both KL terms of eq. (3) by one beta; at beta = 1e-4 the private
  # weights, trained on one client's data round after round, are all but unregularised
  # (docs/virtual.md, "Variances and calibration").
  private_kl_weight: Optional[float] = options.real(
      None, "VIRTUAL: KL multiplier of the private weights' KL term KL(c_i || p(phi_i)) "
      "(default: --kl_weight, the paper's one beta; 1: Bayes by backprop's ELBO for them).",
      high=options.MAX_WEIGHT,
      none_ok=True)
  prior_scale: float = options.real(1.0, "VIRTUAL: std of the N(0, s^2) priors.", low_open=True)
  init_scale: Optional[float] = options.real(
      None, "VIRTUAL: initial posterior std (default: 0.05; 0.005 with --architecture=conv, "
      "where 0.05 left the FEMNIST conv net at chance, docs/virtual.md).",
      low_open=True,
      none_ok=True)
  fedavg_init: bool = options.boolean(False, "VIRTUAL + FedAvg init variant.")
  # 0: the paper's eq. (3); 1 measured, see docs/virtual.md ("The objective")
  server_loss_weight: float = options.real(
      1.0,
      "VIRTUAL: weight of the server network's own cross-entropy (0 = paper eq. 3).",
      high=options.MAX_WEIGHT)
  private: bool = True
  likelihood: str = "categorical"  # or "gaussian" (regression, noise_scale)
  noise_scale: float = 1.0
  gate_init: float = options.real(1.0,
                                  "VIRTUAL: initial lateral gate value.",
                                  low=-options.MAX_RATE)
  local_solver: str = "sgd"  # or "conjugate" (exact, linear-Gaussian models only)
  # XLA for the client step function (the lean step's and the Keras layers' step) of
  # plain-TF callers of client_update. TFF's worker binary has no XLA JIT, so under
  # TFF it has no effect. Off: on the fused lean step XLA ran 0.86x in plain TF
  # (issue 22), and its normals differ from TF's, so the noise and results change.
  jit_compile: bool = False
  # MLP + SGD: train on flat parameter vectors with the analytic KL gradient
  # (`tfbfl.algorithms.virtual.step`: same objective, minibatches and noise); False:
  # the Keras layers step by step (conv and lstm always take that path).
  lean_step: bool = True
  # With the lean step, this many of a round's clients are stacked into one TFF
  # client computation and train batched (`client_batch`). 1 (each client alone) is
  # the default because batching is slower on 2 CPU cores, also with the fused step
  # (BUILD.md, "Performance"). Results equal the one-by-one run up to float summation
  # order.
  clients_per_group: int = options.integer(
      1, "virtual (MLP): stack this many of a round's clients into one batched client "
      "computation (1: one by one, the faster on CPU).",
      low=1,
      high=10**6)
  kernel_size: int = 5
  vocab_size: int = 88
  embedding_dim: int = 8
  lstm_units: Sequence[int] = options.int_list((100, 100), "lstm: units per LSTM layer.")
  # zero Delta_i entries below this SNR percentile (IV-F)
  prune_percentile: float = options.real(
      0.0,
      "VIRTUAL: zero Delta_i entries whose SNR is below this percentile (Sec. IV-F).",
      high=100.0)
  prune_per_layer: bool = options.boolean(
      True, "VIRTUAL: percentile per weight tensor (else over all shared weights).")
  # The Monte Carlo predictive by default: at the posterior means' accuracy it is better
  # calibrated on every Table II row (docs/virtual.md, "The predictive").
  eval_samples: int = options.integer(
      10, "VIRTUAL: forward passes averaged at evaluation and export (the Monte Carlo "
      "predictive); 0: the posterior means (the reproduction cells' evaluation).",
      high=10**6)
  temperature_scaling: bool = base.temperature_scaling_option()
  input_shape: Optional[Sequence[int]] = None  # None: (input_dim,); images are flattened
  # How the clients' natural-parameter deltas are summed (`tfbfl.aggregators.sum_factory`).
  aggregator: str = options.choice(
      "sum", ("sum", "secure_sum"), "VIRTUAL: sum of the clients' natural-parameter deltas: "
      "sum (plain federated sum) or secure_sum (TFF's SecureSumFactory: each coordinate "
      "clipped to [-secure_sum_bound, secure_sum_bound] and quantised to 32 bits; clients "
      "then train one computation each).")
  secure_sum_bound: Optional[float] = options.real(
      None, "VIRTUAL --aggregator=secure_sum: clipping bound B of each summed coordinate "
      "(error <= clients * B / (2^32 - 1); default tfbfl.aggregators.DEFAULT_SECURE_SUM_BOUND "
      "= 2^16).",
      low_open=True,
      high=2.0**126,
      none_ok=True)

  @property
  def example_shape(self):
    return tuple(self.input_shape) if self.input_shape else (self.input_dim,)

  def __post_init__(self):
    if self.init_scale is None:
      object.__setattr__(self, "init_scale", default_init_scale(self.architecture))
    super().__post_init__()
    object.__setattr__(self, "lstm_units", tuple(int(u) for u in self.lstm_units or ()))
    for name in ("input_dim", "num_classes", "num_clients"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}.")
    if not (self.noise_scale > 0 and np.isfinite(self.noise_scale)):
      raise ValueError(f"noise_scale must be finite and > 0, got {self.noise_scale}.")
    if self.clients_per_round is not None and self.clients_per_round < 1:
      raise ValueError(f"clients_per_round must be >= 1, got {self.clients_per_round}.")
    if self.server_lr is not None and self.server_lr > 1.0:
      raise ValueError(f"--server_lr (the EP step alpha) must be in (0, 1], got {self.server_lr}.")
    if self.likelihood not in ("categorical", "gaussian"):
      raise ValueError(f"likelihood must be 'categorical' or 'gaussian', got {self.likelihood!r}.")
    if self.temperature_scaling and self.likelihood != "categorical":
      raise ValueError("--temperature_scaling rescales a categorical predictive; "
                       f"likelihood={self.likelihood!r} has none.")
    if not 0.0 <= self.prune_percentile < 100.0:
      raise ValueError(f"prune_percentile must be in [0, 100), got {self.prune_percentile}.")
    self.check_architecture(("mlp", "conv", "lstm"), "VIRTUAL")
    self.resolve_image_shape(self.example_shape)
    if self.aggregator != "sum" and self.clients_per_group > 1:
      raise ValueError(f"--clients_per_group={self.clients_per_group} needs --aggregator=sum "
                       "(a group uploads the plain sum of its clients' deltas).")
    if self.scale_optimizer == "adam":
      if not (self.lean_step and self.architecture == "mlp" and self.local_solver == "sgd"):
        raise ValueError("--scale_optimizer=adam needs the lean MLP step (--architecture=mlp, "
                         f"lean_step, local_solver='sgd'); got --architecture={self.architecture}"
                         f", lean_step={self.lean_step}, local_solver={self.local_solver!r}.")
      if self.precision_step > 0:
        raise ValueError("--scale_optimizer=adam and --precision_step > 0 both update the "
                         "shared scales; set one of them.")
    if self.local_solver not in ("sgd", "conjugate"):
      raise ValueError(f"local_solver must be 'sgd' or 'conjugate', got {self.local_solver!r}.")
    if self.local_solver == "conjugate" and not (self.likelihood == "gaussian" and not self.private
                                                 and not tuple(self.hidden_units) and
                                                 self.num_classes == 1 and self.kl_weight > 0):
      raise ValueError(
          "local_solver='conjugate' needs a linear-Gaussian model: likelihood='gaussian', "
          "private=False, hidden_units=(), num_classes=1 and kl_weight > 0.")

  @classmethod
  def derived_defaults(cls, params):
    """`server_lr` unset: `default_step(clients_per_round)`; `init_scale` unset:
    `default_init_scale(architecture)`; `private_kl_weight` unset: `kl_weight`."""
    out = super().derived_defaults(params)
    if params.get("server_lr") is None:
      out["server_lr"] = default_step(params["clients_per_round"])
    if params.get("init_scale") is None:
      out["init_scale"] = default_init_scale(params.get("architecture", "mlp"))
    if params.get("private_kl_weight") is None:
      out["private_kl_weight"] = params.get("kl_weight", cls.kl_weight)
    return out

  @property
  def private_beta(self) -> float:
    """The private KL term's multiplier (`private_kl_weight`, unset: `kl_weight`)."""
    return self.kl_weight if self.private_kl_weight is None else float(self.private_kl_weight)

  @property
  def step(self) -> float:
    """The damped-EP step alpha taken by the server posterior and the client
    factor alike (Appendix D's damping gamma equals it; see docs/virtual.md)."""
    if self.server_lr is not None:
      return float(self.server_lr)
    return default_step(self.clients_per_round or self.num_clients)

  @property
  def natural_precision_step(self) -> bool:
    """Whether the shared scales take the natural-gradient precision step
    (`precision_step > 0`; needs `kl_weight > 0`, else plain SGD)."""
    return self.precision_step > 0 and self.kl_weight > 0

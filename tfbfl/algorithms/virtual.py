"""VIRTUAL: variational federated multi-task learning as TFF computations.

Model (Corinzia, Beuret & Buhmann, "Variational Federated Multi-Task Learning",
Algorithm 1, Proposition 1, eq. 3). Shared (server) weights `theta` with posterior
proxy `s(theta) = prod_i s_i(theta)`, private client weights `phi_i` with posterior
`c_i(phi_i)`, all mean-field Gaussians held in natural parameters
(`tfbfl.gaussian`). In round t, each selected client i:

1. receives `s^(t)` and forms the cavity `cav_i = s^(t) / s_i^(t-1)` and the prior
   of its shared weights `p(theta)^(1/K) * cav_i`;
2. trains `q_i(theta) = s_i(theta) * cav_i` (the shared layers' posterior) and
   `c_i(phi_i)` for E epochs of plain SGD on eq. (3) per example,

       CE(y, client(x)) [+ w_S CE(y, server(x))]
         + beta / N_i * [KL(q_i || p^(1/K) cav_i) + KL(c_i || p(phi_i))],

   sampling activations by local reparameterization;
3. sends `Delta_i = s_i^new / s_i^(t-1)` with `s_i^new = q_i / cav_i`
   (natural-parameter difference; equals `q_i / s^(t)` when nothing is floored);
4. keeps `s_i <- s_i^(t-1) * Delta_i^alpha`.

The server only receives the aggregate `Delta = prod_i Delta_i` (a
`tfbfl.aggregators.GaussianProductFactory` sum) and applies
`s^(t+1) = s^(t) * Delta^alpha`. Information of clients not selected stays in `s`
(no averaging).

#### One step for server and clients (damped EP)

Server and client factors take the *same* step `alpha` (`server_lr`, in (0, 1]):
Appendix D's damping `s_i <- (s_i^new)^gamma (s_i^old)^(1-gamma)` with
`gamma = alpha`, and the server's learning rate `eta_s = alpha`. Then

    s^(t+1) - sum_i s_i^(t+1) = s^(t) - sum_i s_i^(t) + alpha (sum_i Delta_i - sum_i Delta_i)

(natural parameters), so the server posterior stays the product of all K stored
client factors after every round, for any alpha, any C < K, and with SNR pruning
(the masked `Delta_i` is what both sides apply). `factor_diagnostics` measures it
(`factor_gap` in metrics.csv; float rounding, ~1e-7 on digits). On the conjugate
model the exact local solver makes every `s_i^new` the true site, so the server
reaches the closed-form posterior geometrically, `(1 - alpha)^visits`
(`tests/test_virtual_ep.py`). The paper's tie `gamma = 1 - eta_s` (and the
reference code's default) breaks this product whenever `alpha != 1/2`; so did
this module's earlier `server_lr = 1/C` with undamped factors (after 6 conjugate
rounds: mean error 0.47, precision error 70%).

Why `1/C` was tempting and what is real: each `Delta_i` replaces only client i's
own factor, so the product of C deltas counts nothing twice. What does happen is a
*mean overshoot*: local SGD moves the means but hardly the precisions, so summing
C natural-parameter deltas moves the server mean about C times the average
client move (see "The default step" below for what that does on digits).

#### The default step, the objective and the scales (measured)

Measured on the bundled digits at the launcher defaults (K = C = 10, class
Dirichlet(0.5), E = 20, B = 20, client lr 0.05, beta 1e-4, 15 rounds, seed 0;
`/tmp`-style runs of `launchers.train`, numbers in the README and the issue note):

* **Step.** Algorithm 1's `alpha = 1` is not stable here with the server loss
  below: S loss 16.3 after round 1, the server posterior NaN in round 2; `alpha =
  0.5` NaN as well; `alpha = 1/C = 0.1` stable (best S 0.949, MT 0.940; FedAvg
  0.938 / 0.962). The C client mean moves add up (the overshoot above), so the
  default is `alpha = 1/C` (`default_step`), now taken by server
  and factors alike; `--server_lr=1` is Algorithm 1.
* **Objective.** With eq. (3) alone (`server_loss_weight = 0`) the server network
  is only ever trained through the lateral adapters, so it alone predicts nothing:
  best S 0.13 / 0.17 / 0.12 at alpha 1 / 0.5 / 0.1 (chance 0.1) while MT is 0.94.
  `server_loss_weight` therefore defaults to 1 (adds `CE(y, server(x))`, which
  counts the data a second time for the shared weights); the Table II launcher
  reports both settings, labelled (`virtual` and `virtual_eq3`).
* **Scales.** With one SGD step for means and softplus scales (the paper's plain
  SGD, `precision_step = 0`, the default) the shared precisions hardly move:
  `mean_shared_log_precision` 5.9916 -> 5.9926 over 15 rounds (1/init_scale^2 =
  400 is 5.9915): the scale gradient is `O(sigma^2 * curvature)` and the KL pull
  `beta/N_i ~ 1e-6`. A larger SGD step on the scales (tried: 10) moves them a
  little (6.02 -> 6.15) but diverges on the conjugate model (beta = 1).
  `precision_step = rho > 0` replaces SGD on the shared scales by a natural-
  gradient step on the precision (`_natural_precision_step`): stable for any
  curvature, exact fixed point on linear-Gaussian models (tests/test_virtual_ep.py:
  within +7..+35% of the closed form vs -35..-40% for SGD). On digits it makes the
  precisions learn what beta = 1e-4 asks for (log precision 10.5 -> 14.0 with
  rho = 0.05: the tempered posterior is ~1e4 times sharper than the data alone
  would make it) and that *hurts* the server predictive at 15 rounds: best S 0.940
  vs 0.949, S NLL 0.308 vs 0.185, S ECE 0.109 vs 0.017; MT unchanged (0.940, NLL
  0.361 vs 0.360) (seed 0; more in the README). So the default stays plain SGD:
  the variances that *would* learn are those of a cold posterior; that VIRTUAL at
  the paper's beta leaves them at their initial value is measured, not hidden.

Other choices made explicit:

* The client trains its factor `s_i`, so each round's optimisation over `theta`
  starts at `q_i = s_i^(t-1) * cav_i = s^(t)`. `fedavg_init=True` ("VIRTUAL +
  FedAvg init", Sec. IV-F) resets the factor to the server posterior first,
  `s_i^(t-1) := s^(t)`: the cavity is then flat, the KL target is `p^(1/K)`, and the
  delta is `q_i / s^(t)`. The factor reset is not an EP move, so the product
  invariant (and `factor_gap`) does not apply to that variant. The client keeps its
  trained `q_i` (with its private weights) as its deployed model, which the MT
  metric evaluates; a client never trained is evaluated with its initial model
  (`s^(0)` and its seeded private network), as for every algorithm.
* Non-positive precisions: the cavity is floored at `min_precision` and counted
  (`cavity_floored`; it is multiplied by the proper prior `p^(1/K)`, so the KL
  target stays proper, and the floored cavity is what both `s_i^new` and the
  server see, so the product invariant holds); the server posterior is floored at
  the prior precision `1/prior_scale^2` keeping the previous mean for floored
  entries and counted (`server_floored`; this does break the product, and
  `factor_gap` shows it). Site factors and deltas may have negative precisions
  (`gaussian.ratio(..., on_nonpositive="allow")`): only their products with
  proper factors are densities.
* Robust rounds (`tfbfl.algorithms.robust.check_posterior`): a client whose
  `Delta_i` or new state has a non-finite entry, or whose trained posterior's mean
  moved by `||mu(q_i) - mu(s^(t))|| > max_update_ratio * max(||mu(s^(t))||, 1)`
  (FedAvg's rule on the means; `s^(t)` the server posterior it started from), is
  dropped: it sends the identity factor (zeros), keeps its previous state (factor,
  posterior, private weights) and its training metrics are left out
  (`clients_dropped`). Both sides then apply nothing for it, so the product
  invariant holds. Precisions get no ratio: with `precision_step` they grow
  ~e^4.5 in round 1 on digits, and the old rule on natural parameters (ratio ~1e4)
  dropped every client of every round (issue 21).
* Initial factors: `s^(0) = N(mu_init, init_scale^2)` (Glorot means, seeded) and
  `s_i^(0) = s^(0)^(1/K)`, so that `s^(0) = prod_i s_i^(0)`.
* Client data enter each round as in-memory tensors `(x, y)`; minibatches are
  drawn with stateless shuffles from the per-client seed, so a run is fully
  determined by `--seed`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from tfbfl import _lazy
from tfbfl import options
from tfbfl.algorithms import base
from tfbfl.algorithms import registry

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
tff = _lazy.load("tensorflow_federated")
tfp = _lazy.load("tensorflow_probability")
aggregators = _lazy.load("tfbfl.aggregators")
architectures = _lazy.load("tfbfl.architectures")
communication = _lazy.load("tfbfl.communication")
gaussian = _lazy.load("tfbfl.gaussian")
metrics_lib = _lazy.load("tfbfl.metrics")
models = _lazy.load("tfbfl.models")
sparsity = _lazy.load("tfbfl.sparsity")
client_batch = _lazy.load("tfbfl.algorithms.client_batch")
robust = _lazy.load("tfbfl.algorithms.robust")
rounds = _lazy.load("tfbfl.algorithms.rounds")
virtual_step = _lazy.load("tfbfl.algorithms.virtual_step")

ServerState = collections.namedtuple("ServerState", ["posterior", "aggregator_state", "round_num"])
# `client_index` travels with the state so the driver can re-key client outputs
# (TFF's mergeable/remote contexts may return them in completion order).
ClientState = collections.namedtuple(
    "ClientState", ["shared_factor", "shared_posterior", "private", "trained", "client_index"])
ClientOutput = collections.namedtuple("ClientOutput", [
    "delta", "client_state", "metrics", "num_examples", "delta_nonzeros", "cavity_floored",
    "dropped", "update_ratio"
])

_CAVITY_MIN_PRECISION = 1e-8


def _as_client_state(state) -> ClientState:
  """A `ClientState` of numpy leaves from a TFF result or a `ClientState`."""
  if not isinstance(state, ClientState):
    state = ClientState(*state)
  g = lambda x: gaussian.NaturalGaussian([np.asarray(t)
                                          for t in x[0]], [np.asarray(t) for t in x[1]])
  return ClientState(g(state.shared_factor), g(state.shared_posterior),
                     [np.asarray(w) for w in state.private], np.asarray(state.trained),
                     np.asarray(state.client_index))


def default_step(clients_per_round: int) -> float:
  """VIRTUAL's default damped-EP step alpha = 1/C (server and client factors alike).

  Measured on the bundled digits (K = C = 10, seed 0, see "The default step" above):
  Algorithm 1's alpha = 1 and alpha = 0.5 turned the server posterior NaN within 2
  rounds (the C client mean moves add up); alpha = 1/C was stable. `--server_lr=1`
  is Algorithm 1.
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
  # beta; the paper finds 1e-6..1e-3 harmless (Fig. 2)
  kl_weight: float = options.real(1e-4, "VIRTUAL: KL multiplier beta.", high=options.MAX_WEIGHT)
  prior_scale: float = options.real(1.0, "VIRTUAL: std of the N(0, s^2) priors.", low_open=True)
  init_scale: float = options.real(0.05, "VIRTUAL: initial posterior std.", low_open=True)
  fedavg_init: bool = options.boolean(False, "VIRTUAL + FedAvg init variant.")
  # 0: the paper's eq. (3); 1 measured, see the module docstring
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
  # (`tfbfl.algorithms.virtual_step`: same objective, minibatches and noise); False:
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
  eval_samples: int = options.integer(0,
                                      "MC samples at evaluation (0: posterior mean).",
                                      high=10**6)
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
    if not 0.0 <= self.prune_percentile < 100.0:
      raise ValueError(f"prune_percentile must be in [0, 100), got {self.prune_percentile}.")
    self.check_architecture(("mlp", "conv", "lstm"), "VIRTUAL")
    if self.aggregator != "sum" and self.clients_per_group > 1:
      raise ValueError(f"--clients_per_group={self.clients_per_group} needs --aggregator=sum "
                       "(a group uploads the plain sum of its clients' deltas).")
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
    """`server_lr` unset: `default_step(clients_per_round)`."""
    out = super().derived_defaults(params)
    if params.get("server_lr") is None:
      out["server_lr"] = default_step(params["clients_per_round"])
    return out

  @property
  def step(self) -> float:
    """The damped-EP step alpha taken by the server posterior and the client
    factor alike (Appendix D's damping gamma equals it; see the module docstring)."""
    if self.server_lr is not None:
      return float(self.server_lr)
    return default_step(self.clients_per_round or self.num_clients)

  @property
  def natural_precision_step(self) -> bool:
    """Whether the shared scales take the natural-gradient precision step
    (`precision_step > 0`; needs `kl_weight > 0`, else plain SGD)."""
    return self.precision_step > 0 and self.kl_weight > 0


def conjugate_linear_posterior(prior: gaussian.NaturalGaussian, x, y, noise_scale, kl_weight):
  """Exact minimiser of the client free energy for a linear-Gaussian model.

  For `y = x^T w + b + e`, `e ~ N(0, noise_scale^2)` and the objective
  `kl_weight * KL(q || prior) - E_q[log p(y | x, w, b)]` over mean-field Gaussians
  `q`, the optimum is the mean-field projection of `prior * lik^(1/kl_weight)`:
  with `z = [x, 1]`,

      Lambda = diag(prior precisions) + z^T z / (kl_weight * noise_scale^2),
      eta    = prior eta1 + z^T y / (kl_weight * noise_scale^2),
      q: mean = Lambda^-1 eta (exact), precision = diag(Lambda).

  `prior` is structured like a single dense layer's `[kernel (d, 1), bias (1,)]`.
  """
  x = tf.cast(x, tf.float32)
  y = tf.reshape(tf.cast(y, tf.float32), [-1, 1])
  d = tf.shape(x)[1]
  z = tf.concat([x, tf.ones_like(y)], axis=1)
  scale = 1.0 / (kl_weight * noise_scale**2)
  flat = lambda parts: tf.concat([tf.reshape(t, [-1]) for t in parts], 0)
  lam = tf.linalg.diag(flat(prior.eta2)) + scale * tf.matmul(z, z, transpose_a=True)
  eta = flat(prior.eta1) + scale * tf.reshape(tf.matmul(z, y, transpose_a=True), [-1])
  mean = tf.linalg.solve(lam, eta[:, None])[:, 0]
  prec = tf.linalg.diag_part(lam)
  kernel_shape, bias_shape = tf.shape(prior.eta1[0]), tf.shape(prior.eta1[1])
  split = lambda v: [tf.reshape(v[:d], kernel_shape), tf.reshape(v[d:], bias_shape)]
  return gaussian.NaturalGaussian(split(mean * prec), split(prec))


def _natural_precision_step(u_var, grad_u, prior_precision, min_scale, kl_scale, rho):
  """The shared scales' step: a damped fixed-point (natural-gradient) step on the
  precision instead of SGD on the softplus scale.

  Per example the client minimises `E_q[L] + kl_scale * KL(q || t)` (`t` the KL
  target `p^(1/K) * cavity`, precision `prec_t`; `kl_scale = beta / N_i`). Its
  stationary precision is `prec* = prec_t + E_q[d^2 L / d theta^2] / kl_scale`, and
  Price's theorem gives that curvature from the scale gradient already computed:
  `E[dL/dsigma] = sigma * E[d^2 L]`. With `g_sigma` the minibatch gradient of the
  data loss (the KL part `kl_scale * (sigma prec_t - 1/sigma)` removed),

      h    = g_sigma / sigma
      prec <- (1 - rho) * prec + rho * max(prec_t + h / kl_scale, prec_t),

  a convex combination of positive precisions: stable for any curvature (unlike
  SGD on `u`, whose step is `O(sigma^2)` on the data and diverges on a stiff KL).
  On a linear-Gaussian model `h` is the exact curvature, so the fixed point is the
  exact (mean-field) posterior precision. The `max(., prec_t)` keeps the target
  proper when minibatch noise makes `h` negative (a slight upward bias: +7..+35% on
  the conjugate test's 4 weights with 12-row clients, less with more data).
  """
  u = tf.convert_to_tensor(u_var)
  sigma = tf.nn.softplus(u) + min_scale
  # The data part of the gradient: the total less the KL's (dsigma/du = sigmoid(u)).
  grad_data_u = grad_u - kl_scale * (sigma * prior_precision - 1.0 / sigma) * tf.math.sigmoid(u)
  u_var.assign(
      virtual_step.natural_precision_update(u, grad_data_u, prior_precision, min_scale, rho,
                                            kl_scale))


def _data_loss(cfg: VirtualConfig, y, outputs, mask=None, axis=None):
  """Summed (masked) negative log-likelihood and number of correct predictions,
  over every example (`axis=None`) or along `axis` (per client of a batch)."""
  if mask is None:
    mask = tf.ones(tf.shape(outputs)[:-1], tf.float32)
  if cfg.likelihood == "categorical":
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=outputs)
    hit = tf.cast(tf.equal(tf.argmax(outputs, -1, output_type=y.dtype), y), tf.float32)
    return tf.reduce_sum(mask * nll, axis=axis), tf.reduce_sum(mask * hit, axis=axis)
  err = tf.cast(y, outputs.dtype) - tf.squeeze(outputs, -1)
  loss = tf.reduce_sum(mask * 0.5 * tf.square(err) / cfg.noise_scale**2, axis=axis)
  return loss, tf.zeros_like(loss)


def _architecture(cfg: VirtualConfig):
  """(network class, initial shared posterior fn, initial private weights fn,
  keyword arguments) of the configured architecture."""
  common = dict(init_scale=cfg.init_scale)
  if cfg.architecture == "conv":
    kw = dict(input_shape=tuple(cfg.image_shape or cfg.example_shape),
              num_classes=cfg.num_classes,
              filters=tuple(cfg.filters),
              kernel_size=cfg.kernel_size,
              hidden_units=tuple(cfg.hidden_units),
              **common)
    return (architectures.VirtualConvNetworks, architectures.initial_shared_posterior_conv,
            architectures.initial_private_weights_conv, kw)
  if cfg.architecture == "lstm":
    kw = dict(vocab_size=cfg.vocab_size,
              embedding_dim=cfg.embedding_dim,
              lstm_units=tuple(cfg.lstm_units),
              **common)
    return (architectures.VirtualLSTMNetworks, architectures.initial_shared_posterior_lstm,
            architectures.initial_private_weights_lstm, kw)
  kw = dict(input_dim=cfg.input_dim,
            num_classes=cfg.num_classes,
            hidden_units=tuple(cfg.hidden_units),
            **common)
  return (models.VirtualNetworks, models.initial_shared_posterior, models.initial_private_weights,
          kw)


def initial_posterior(cfg: VirtualConfig) -> gaussian.NaturalGaussian:
  """`s^(0) = N(mu_init, init_scale^2)` with seeded Glorot means."""
  _, init_shared, _, kw = _architecture(cfg)
  return init_shared(seed=cfg.seed, **kw)


def initial_client_state(cfg: VirtualConfig, client_index: int,
                         init_posterior: gaussian.NaturalGaussian) -> ClientState:
  """`s_i^(0) = s^(0)^(1/K)`, posterior copy `s^(0)`, seeded private network."""
  factor = gaussian.power(init_posterior, 1.0 / cfg.num_clients)
  _, _, init_private, kw = _architecture(cfg)
  private = init_private(gate_init=cfg.gate_init,
                         seed=cfg.seed * 100003 + 7919 * (client_index + 1),
                         **kw)
  as_np = lambda s: tf.nest.map_structure(lambda t: np.asarray(t, np.float32), s)
  return ClientState(gaussian.NaturalGaussian(*as_np(factor)),
                     gaussian.NaturalGaussian(*as_np(init_posterior)),
                     [np.asarray(w, np.float32) for w in private], np.bool_(False),
                     np.int32(client_index))


def build_networks(cfg: VirtualConfig):
  """The configured server + client networks (unseeded: values are assigned)."""
  network, _, _, kw = _architecture(cfg)
  extra = dict(activation=cfg.activation) if cfg.architecture != "lstm" else {}
  return network(prior_scale=cfg.prior_scale, gate_init=cfg.gate_init, seed=None, **extra, **kw)


def _flatten_for_mlp(cfg: VirtualConfig, x):
  return tf.reshape(x, [tf.shape(x)[0], cfg.input_dim]) if cfg.architecture == "mlp" else x


def _client_prior(cfg: VirtualConfig, server_posterior, state: ClientState):
  """`(old_factor, cavity, cavity_floored, prior)` of one client's round (step 1).

  FedAvg init resets the client's factor to the server posterior, so its cavity
  is flat and the KL target `p^(1/K) cav_i` is `p^(1/K)` alone.
  """
  old_factor = server_posterior if cfg.fedavg_init else state.shared_factor
  cavity, cavity_floored = gaussian.ratio_with_count(server_posterior,
                                                     old_factor,
                                                     on_nonpositive="floor",
                                                     min_precision=_CAVITY_MIN_PRECISION)
  prior = gaussian.product(gaussian.isotropic_power(cavity, cfg.prior_scale, 1.0 / cfg.num_clients),
                           cavity)
  return old_factor, cavity, cavity_floored, prior


def _client_output(cfg: VirtualConfig, server_posterior, state: ClientState, old_factor, cavity,
                   cavity_floored, q_new, private, loss_sum, correct_sum, n, seen) -> ClientOutput:
  """Steps 3-4 of one client's round from its trained `q_new` and `private`
  weights: the new factor, `Delta_i` (pruned), the damped factor step, and the
  robust-round check."""
  # Site factors and deltas are unnormalised and may have negative precisions.
  new_factor = gaussian.ratio(q_new, cavity, on_nonpositive="allow")  # s_i^new = q_i / cav_i
  delta = gaussian.ratio(new_factor, old_factor,
                         on_nonpositive="allow")  # Delta_i = s_i^new / s_i^old
  if cfg.prune_percentile > 0:
    delta = sparsity.apply_mask(
        delta, sparsity.keep_mask(sparsity.snr(q_new), cfg.prune_percentile, cfg.prune_per_layer))
  # Damped EP: the factor takes the step the server takes, s_i <- s_i * Delta_i^alpha,
  # so the server posterior stays the product of the stored factors.
  stored = gaussian.product(old_factor, gaussian.power(delta, cfg.step))
  new_state = ClientState(stored, q_new, list(private), tf.constant(True), state.client_index)
  metrics = collections.OrderedDict(train_loss=loss_sum / seen, train_accuracy=correct_sum / seen)
  # Robust rounds: a non-finite Delta_i or state, or a q_i whose mean moved far from
  # s^(t)'s (`robust.check_posterior`; natural parameters are no scale: precisions
  # legitimately grow by large factors) is dropped: identity factor sent, previous
  # state kept, metrics left out.
  ok, ratio = robust.check_posterior(q_new, server_posterior, cfg.max_update_ratio)
  finite = tf.logical_and(robust.all_finite(delta), robust.all_finite(new_state))
  ok = tf.logical_and(ok, finite)
  ratio = tf.where(finite, ratio, tf.constant(np.inf, tf.float32))
  delta = robust.zeros_unless(ok, delta)
  new_state = robust.keep_if(ok, new_state, state)
  metrics = robust.zeros_unless(ok, metrics)
  return ClientOutput(delta, new_state, metrics, tf.where(ok, tf.cast(n, tf.float32), 0.0),
                      sparsity.count_nonzero(delta), tf.cast(cavity_floored, tf.float32),
                      1.0 - tf.cast(ok, tf.float32), ratio)


def batched(cfg: VirtualConfig) -> bool:
  """Whether clients train with the lean, client-batched step
  (`tfbfl.algorithms.virtual_step`): the MLP with SGD and `lean_step`."""
  return cfg.lean_step and cfg.architecture == "mlp" and cfg.local_solver == "sgd"


def client_update_batch(cfg: VirtualConfig,
                        server_posterior,
                        states: ClientState,
                        seeds,
                        x,
                        y,
                        n,
                        net: Optional[models.VirtualNetworks] = None) -> ClientOutput:
  """C clients' rounds in one computation (the lean step, `batched(cfg)`), plain TF.

  `states`: a `ClientState` whose leaves carry a leading client axis; `seeds`
  `[C, 2]` (C static); `x`, `y`: stacked data `[C, n_max, ...]`, `[C, n_max]`
  padded past each client's `n` `[C]` (`client_batch.pack_data`). Returns a
  `ClientOutput` whose leaves carry the client axis; client c's equals
  `client_update` of client c alone up to float summation order. `net` (default:
  built here) gives the layout only (no variable is read); pass one built outside
  a `tf.function` that calls this.
  """
  if not batched(cfg):
    raise ValueError("client_update_batch needs the MLP, local_solver='sgd' and lean_step.")
  net = net or build_networks(cfg)
  layout = virtual_step.Layout(net)
  clients = int(seeds.shape[0])
  x = tf.reshape(x, [clients, tf.shape(x)[1], cfg.input_dim])
  unstacked = [tf.nest.map_structure(lambda t, c=c: t[c], states) for c in range(clients)]
  unstacked = [
      ClientState(gaussian.NaturalGaussian(*s.shared_factor),
                  gaussian.NaturalGaussian(*s.shared_posterior), list(s.private), s.trained,
                  s.client_index) for s in unstacked
  ]

  @tf.function
  def train():
    priors = [_client_prior(cfg, server_posterior, s) for s in unstacked]
    stack_g = lambda gs: gaussian.NaturalGaussian([tf.stack(t) for t in zip(*[g.eta1 for g in gs])],
                                                  [tf.stack(t) for t in zip(*[g.eta2 for g in gs])])
    target = stack_g([p[3] for p in priors])
    shared_prior = (
        virtual_step._flat(target.eta1, clients),  # pylint: disable=protected-access
        virtual_step._flat(target.eta2, clients))  # pylint: disable=protected-access
    # Every client starts from s^(t): q_i = s_i * cavity with s_i = s^(t) / cavity.
    start = stack_g([server_posterior] * clients)
    shared_loc, shared_u = layout.shared_from_natural(start, clients)
    params = virtual_step.Parameters(shared_loc, shared_u,
                                     *layout.private_from_list(states.private, clients))
    params, loss_sum, correct_sum = virtual_step.train_clients(cfg, layout, params, shared_prior, x,
                                                               y, n, seeds, _data_loss)
    q_new = layout.shared_to_natural(params.shared_loc, params.shared_u)
    private = (layout.private_to_list(params.private_loc, params.private_u, params.gates)
               if cfg.private else list(states.private))
    outputs = []
    for c, s in enumerate(unstacked):
      old_factor, cavity, cavity_floored, _ = priors[c]
      q_c = gaussian.NaturalGaussian([t[c] for t in q_new.eta1], [t[c] for t in q_new.eta2])
      seen = tf.cast(n[c] * cfg.epochs, tf.float32)
      outputs.append(
          _client_output(cfg, server_posterior, s, old_factor, cavity, cavity_floored, q_c,
                         [w[c] for w in private], loss_sum[c], correct_sum[c], n[c], seen))
    return tf.nest.map_structure(lambda *t: tf.stack(t), *outputs)

  return train()


def client_update(cfg: VirtualConfig,
                  server_posterior,
                  state: ClientState,
                  seed,
                  x,
                  y,
                  net: Optional[models.VirtualNetworks] = None) -> ClientOutput:
  """One client's round (steps 1-4 of the module docstring), plain TensorFlow.

  Used inside the TFF client computation; callable as is (eagerly or in a
  `tf.function`), which `benchmarks/round_time.py` uses to time TFF's overhead.
  With `batched(cfg)` it is `client_update_batch` of one client; otherwise the
  Keras layers train step by step. `net` (default: built here) holds the
  variables; pass one built outside a `tf.function` that calls this.
  """
  if batched(cfg):
    x = _flatten_for_mlp(cfg, x)
    one = lambda t: tf.expand_dims(tf.convert_to_tensor(t), 0)
    out = client_update_batch(cfg,
                              server_posterior,
                              tf.nest.map_structure(one, state),
                              one(seed),
                              one(x),
                              one(y),
                              one(tf.shape(y)[0]),
                              net=net)
    return tf.nest.map_structure(lambda t: t[0], out)
  net = net or build_networks(cfg)
  train_vars = net.shared_trainable_variables + (net.private_trainable_variables
                                                 if cfg.private else [])
  x = _flatten_for_mlp(cfg, x)
  # min_scale of each shared parameter (sigma = softplus(u) + min_scale), in order.
  shared_min_scales = [
      layer.min_scale
      for layer in net.server_layers
      for _ in range(len(layer.posterior_variables) // 2)
  ]

  def loss_terms(xb, yb, mask, step_seed, kl_scale):
    """Masked mean data loss, correct count, and the eq. (3) objective."""
    server_out, client_out = net.forward(xb, seed=step_seed)
    count = tf.reduce_sum(mask)
    head = client_out if cfg.private else server_out
    nll, correct = _data_loss(cfg, yb, head, mask)
    data_loss = nll / count
    if cfg.private and cfg.server_loss_weight > 0:
      data_loss += cfg.server_loss_weight * _data_loss(cfg, yb, server_out, mask)[0] / count
    kl = net.kl_shared() + (net.kl_private() if cfg.private else 0.0)
    return data_loss, correct, data_loss + kl_scale * kl

  # Every minibatch has the static shape [batch_size] (the last one of an epoch is
  # masked), so with `jit_compile` (plain-TF callers only) XLA compiles the step
  # once per process; the SGD trajectory is the same as with a short last batch.
  @tf.function(jit_compile=cfg.jit_compile)
  def sgd_step(xb, yb, mask, step_seed, kl_scale):
    with tf.GradientTape() as tape:
      data_loss, correct, loss = loss_terms(xb, yb, mask, step_seed, kl_scale)
    # convert: embedding lookups give IndexedSlices
    grads = [
        None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(loss, train_vars)
    ]
    # In a shared mean the KL term has curvature kl_scale * (prior precision), and
    # the prior p^(1/K) * cavity is as sharp as s^(t) (1/init_scale^2 at round 0,
    # growing over rounds), so an explicit step diverges once
    # client_lr * kl_scale * precision > 2. Take that quadratic implicitly (a
    # proximal step): divide the mean's gradient by 1 + lr * kl_scale * precision.
    # Plain SGD where the prior is weak; same fixed points; stable for any lr.
    for j, precision in enumerate(net.shared_prior().eta2):
      if grads[2 * j] is not None:  # shared_trainable_variables: [loc, u] per param
        grads[2 * j] = grads[2 * j] / (1.0 + cfg.client_lr * kl_scale * precision)
    if cfg.natural_precision_step:
      for j, prec_t in enumerate(net.shared_prior().eta2):
        if grads[2 * j + 1] is not None:
          _natural_precision_step(train_vars[2 * j + 1], grads[2 * j + 1], prec_t,
                                  shared_min_scales[j], kl_scale, cfg.precision_step)
          grads[2 * j + 1] = None
    for v, g in zip(train_vars, grads):
      if g is not None:
        v.assign_sub(cfg.client_lr * g)
    return data_loss * tf.reduce_sum(mask), correct

  def sgd_epochs(n):
    """E epochs of plain SGD on eq. (3) over the shared minibatch schedule
    (`client_batch`, one client); returns summed data loss and correct."""
    schedule = client_batch.MinibatchSchedule(seed[None], n[None], n, cfg.epochs, cfg.batch_size)
    kl_scale = cfg.kl_weight / tf.cast(n, tf.float32)

    def step_fn(params, xb, yb, mask, step):
      return params, sgd_step(xb, yb, mask, tf.random.experimental.stateless_fold_in(seed, step),
                              kl_scale)

    zero = tf.zeros([1])
    _, (loss_sum, correct_sum) = client_batch.train_loop(schedule, x[None], y[None], (), step_fn,
                                                         (zero, zero))
    return loss_sum[0], correct_sum[0]

  @tf.function
  def train():
    old_factor, cavity, cavity_floored, prior = _client_prior(cfg, server_posterior, state)
    # The factor s_i is what is trained: q_i = s_i * cavity starts at s^(t).
    net.set_shared_posterior(server_posterior)
    net.set_shared_prior(prior)
    net.set_private_weights(state.private)
    n = tf.shape(y)[0]
    seen = tf.cast(n, tf.float32)
    if cfg.local_solver == "conjugate":
      q_new = conjugate_linear_posterior(prior, x, y, cfg.noise_scale, cfg.kl_weight)
      loss_sum, correct_sum = _data_loss(cfg, y, net.server_logits(x))[0], tf.constant(0.0)
    else:
      loss_sum, correct_sum = sgd_epochs(n)
      q_new = net.shared_posterior()
      seen *= cfg.epochs
    return _client_output(cfg, server_posterior, state, old_factor, cavity, cavity_floored, q_new,
                          net.get_private_weights(), loss_sum, correct_sum, n, seen)

  return train()


def _predictive_sums(cfg: VirtualConfig, net, posterior, head, seed, x, y, prefix):
  """`{prefix}_loss`, `{prefix}_correct` (and `{prefix}_calibration` for a
  categorical likelihood) of the predictive with shared `posterior` and the
  network's current private weights: head 0 is the server network (S), head 1
  the client network (MT). The posterior mean network (`eval_samples == 0`), or
  an average over `eval_samples` forward passes seeded from `seed`. Runs in the
  caller's `tf.function`."""
  net.set_shared_posterior(posterior)
  to_prob = tf.nn.softmax if cfg.likelihood == "categorical" else tf.identity
  # server_logits(x, s) equals forward(x, s)[0] and reads no private weight.
  out = (lambda s: net.server_logits(x, seed=s)) if head == 0 else (
      lambda s: net.forward(x, seed=s)[head])
  if cfg.eval_samples == 0:
    avg = to_prob(out(None))
  else:
    avg = tf.zeros([tf.shape(x)[0], cfg.num_classes])
    for s in tf.range(cfg.eval_samples):
      avg += to_prob(out(tf.random.experimental.stateless_fold_in(seed, s))) / cfg.eval_samples
  pred = tf.math.log(avg + 1e-12) if cfg.likelihood == "categorical" else avg
  sums = collections.OrderedDict()
  if cfg.likelihood == "gaussian":
    err = tf.cast(y, tf.float32) - tf.squeeze(pred, -1)
    sums[f"{prefix}_loss"] = tf.reduce_sum(0.5 * tf.square(err) / cfg.noise_scale**2)
    sums[f"{prefix}_correct"] = tf.constant(0.0)
    return sums
  sums[f"{prefix}_loss"] = -tf.reduce_sum(tf.gather(pred, y, axis=1, batch_dims=1))
  sums[f"{prefix}_correct"] = tf.reduce_sum(
      tf.cast(tf.equal(tf.argmax(pred, -1, output_type=y.dtype), y), tf.float32))
  sums[f"{prefix}_calibration"] = metrics_lib.calibration_sums(tf.exp(pred), y)
  return sums


def _order_sums(s, m, n, client_index):
  out = collections.OrderedDict()
  for key in ("server_loss", "server_correct", "mt_loss", "mt_correct"):
    if key in s or key in m:
      out[key] = s[key] if key in s else m[key]
  out["num_examples"] = n
  out["client_index"] = client_index
  for key in ("server_calibration", "mt_calibration"):
    if key in s or key in m:
      out[key] = s[key] if key in s else m[key]
  return out


def evaluate_client(cfg: VirtualConfig, server_posterior, state: ClientState, seed, x, y):
  """Per-client sums {server_loss, server_correct, mt_loss, mt_correct,
  num_examples, client_index[, server_calibration, mt_calibration]}: S and MT in
  one call (`VirtualAlgorithm.evaluate`; the driver's streamed path uses
  `evaluate_server_client` and `evaluate_own_client`, which compute the same)."""
  net = build_networks(cfg)
  x = _flatten_for_mlp(cfg, x)

  @tf.function
  def run():
    net.set_private_weights(state.private)
    s = _predictive_sums(cfg, net, server_posterior, 0, seed, x, y, "server")
    # MT: the client's own q_i, which for a client never trained is its initial
    # model (s^(0) and its seeded private network), as for every algorithm.
    m = _predictive_sums(cfg, net, state.shared_posterior, 1 if cfg.private else 0, seed, x, y,
                         "mt")
    return _order_sums(s, m, tf.cast(tf.shape(y)[0], tf.float32), state.client_index)

  return run()


def evaluate_server_client(cfg: VirtualConfig, server_posterior, client_index, seed, x, y):
  """S of one client: {server_loss, server_correct, num_examples, client_index[,
  server_calibration]} from the server posterior alone (no client state)."""
  net = build_networks(cfg)
  x = _flatten_for_mlp(cfg, x)

  @tf.function
  def run():
    s = _predictive_sums(cfg, net, server_posterior, 0, seed, x, y, "server")
    return _order_sums(s, {}, tf.cast(tf.shape(y)[0], tf.float32), client_index)

  return run()


def evaluate_own_client(cfg: VirtualConfig, state: ClientState, seed, x, y):
  """MT of one client: {mt_loss, mt_correct, num_examples, client_index[,
  mt_calibration]} from its state alone (its q_i and private network)."""
  net = build_networks(cfg)
  x = _flatten_for_mlp(cfg, x)

  @tf.function
  def run():
    net.set_private_weights(state.private)
    m = _predictive_sums(cfg, net, state.shared_posterior, 1 if cfg.private else 0, seed, x, y,
                         "mt")
    return _order_sums({}, m, tf.cast(tf.shape(y)[0], tf.float32), state.client_index)

  return run()


class VirtualAlgorithm:
  """Builds VIRTUAL's TFF computations and its initial states.

  `next(server_state@SERVER, client_states@CLIENTS, seeds@CLIENTS, data@CLIENTS)`
  returns `(server_state@SERVER, client_states@CLIENTS, metrics@SERVER)`; client data
  come last (TFF's mergeable-context splitter reads the client count from the last
  argument). `evaluate(server_state@SERVER, client_states@CLIENTS, seeds@CLIENTS,
  test_data@CLIENTS)` returns per-client `(server_loss, server_correct, mt_loss,
  mt_correct, n, client_index)` sums at CLIENTS (`client_index` lets the driver
  re-key results that a multi-worker context returns in completion order).
  `next_two_phase` runs the round of `next` as `client_phase` + `server_phase`
  (for multi-worker contexts, where `next` would train every client twice).

  Args:
    config: `VirtualConfig`.
    aggregator: factory for the product of deltas (default
      `GaussianProductFactory()`, a plain federated sum).
  """

  name = "virtual"

  def __init__(self,
               config: VirtualConfig,
               aggregator: Optional[aggregators.GaussianProductFactory] = None):
    self.config = config
    self._aggregator = aggregator or aggregators.GaussianProductFactory()
    # Batched groups upload the sum of their clients' deltas: the same sum only
    # where the aggregator is a plain sum (not, e.g., clipped or noised per upload).
    self._plain_sum = isinstance(self._aggregator.value_sum_factory, tff.aggregators.SumFactory)
    if self._aggregator.weighted:
      raise ValueError("VIRTUAL needs an unweighted GaussianProductFactory (a product of deltas).")
    self._init_posterior = initial_posterior(config)
    self._build_computations()

  # ----------------------------------------------------------------- states
  def initial_server_state(self) -> ServerState:
    posterior = tf.nest.map_structure(np.asarray, self._init_posterior)
    return ServerState(gaussian.NaturalGaussian(*posterior), self._aggregation.initialize(),
                       np.int32(0))

  def initial_client_state(self, client_index: int) -> ClientState:
    return initial_client_state(self.config, client_index, self._init_posterior)

  def factor_diagnostics(self, server_state: ServerState, clients) -> dict:
    """`factor_gap`: how far the server posterior is from the product of all K
    stored client factors, `max |eta(s) - sum_i eta(s_i)| / max |eta(s)|` over
    both natural parameters (float64). Damped EP keeps it at float rounding;
    a server floor (`server_floored`) shows up here. `clients` maps client index
    to state; a client without one holds its initial factor `s^(0)^(1/K)`.
    Not defined for `fedavg_init`, whose factor reset is not an EP move ({})."""
    if self.config.fedavg_init:
      return {}
    k = self.config.num_clients
    init = self.initial_client_state(0).shared_factor
    flat = lambda parts: np.concatenate(
        [np.reshape(np.asarray(t, np.float64), [-1]) for t in parts])
    total = [np.zeros_like(flat(init.eta1)), np.zeros_like(flat(init.eta2))]
    missing = 0
    for i in range(k):
      state = clients.get(i) if hasattr(clients, "get") else None
      if state is None:
        missing += 1
        continue
      total[0] += flat(state.shared_factor.eta1)
      total[1] += flat(state.shared_factor.eta2)
    total[0] += missing * flat(init.eta1)
    total[1] += missing * flat(init.eta2)
    server = [flat(server_state.posterior.eta1), flat(server_state.posterior.eta2)]
    scale = max(np.max(np.abs(server[0])), np.max(np.abs(server[1])))
    gap = max(np.max(np.abs(server[0] - total[0])), np.max(np.abs(server[1] - total[1])))
    return dict(factor_gap=float(gap / scale))

  def round_bytes(self, num_selected: int, metrics) -> tuple:
    """Each selected client downloads s (dense) and uploads Delta_i: dense, or,
    when pruned, its non-zero entries as (eta1, eta2, flat index) triples."""
    size = communication.dense_bytes(self._init_posterior)
    up = num_selected * size
    if self.config.prune_percentile > 0:
      nnz = int(metrics["delta_nonzeros"])
      up = min(up, communication.sparse_bytes(nnz, value_bytes=8))
    return up, num_selected * size

  # ----------------------------------------------------------- client work
  # ------------------------------------------------------ TFF computations
  def _build_computations(self):
    cfg = self.config
    leaf_types = [tff.TensorType(np.float32, tuple(t.shape)) for t in self._init_posterior.eta1]
    posterior_type = tff.to_type(gaussian.NaturalGaussian(list(leaf_types), list(leaf_types)))
    init_state = self.initial_client_state(0)
    client_state_type = tff.to_type(
        ClientState(posterior_type, posterior_type,
                    [tff.TensorType(np.float32, w.shape) for w in init_state.private],
                    tff.TensorType(np.bool_), tff.TensorType(np.int32)))
    seed_type = tff.TensorType(np.int64, [2])
    y_dtype = np.int32 if cfg.likelihood == "categorical" else np.float32
    x_dtype = np.int32 if cfg.architecture == "lstm" else np.float32
    data_type = tff.to_type(
        (tff.TensorType(x_dtype, [None, *cfg.example_shape]), tff.TensorType(y_dtype, [None])))
    self._aggregation = self._aggregator.create(posterior_type)
    aggregation = self._aggregation
    server_state_type = tff.to_type(
        ServerState(posterior_type, aggregation.initialize.type_signature.result.member,
                    tff.TensorType(np.int32)))

    @tff.tensorflow.computation(posterior_type, client_state_type, seed_type, data_type)
    def client_update_comp(server_posterior, state, seed, data):
      state = ClientState(gaussian.NaturalGaussian(*state.shared_factor),
                          gaussian.NaturalGaussian(*state.shared_posterior), list(state.private),
                          state.trained, state.client_index)
      return client_update(cfg, gaussian.NaturalGaussian(*server_posterior), state, seed, *data)

    @tff.tensorflow.computation(server_state_type.posterior, posterior_type,
                                tff.TensorType(np.int32))
    def server_update(posterior, delta_sum, round_num):
      posterior = gaussian.NaturalGaussian(*posterior)
      # s <- s * Delta^alpha, the step each client factor took too.
      moved = gaussian.product(posterior,
                               gaussian.power(gaussian.NaturalGaussian(*delta_sum), cfg.step))
      floored, count = gaussian.floor_precision(moved, posterior, 1.0 / cfg.prior_scale**2)
      return floored, round_num + 1, count, gaussian.mean_log_precision(floored)

    def finish_round(server_state, delta, metrics, num_examples, delta_nonzeros, cavity_floored,
                     dropped, update_ratio):
      """Aggregation of the deltas and the server update (the round's only
      aggregation stage), shared by `next` and `server_phase`. Dropped clients
      send zeros (the identity factor) with weight 0, so a round whose clients
      were all dropped leaves the posterior unchanged."""
      agg = aggregation.next(server_state.aggregator_state, delta)
      posterior, round_num, floored, log_prec = tff.federated_map(
          server_update, (server_state.posterior, agg.result, server_state.round_num))
      new_state = tff.federated_zip(ServerState(posterior, agg.state, round_num))
      train = robust.federated_weighted_mean(metrics, num_examples)
      round_metrics = tff.federated_zip(
          collections.OrderedDict(train=train,
                                  server_floored=floored,
                                  cavity_floored=tff.federated_sum(cavity_floored),
                                  mean_shared_log_precision=log_prec,
                                  num_examples=tff.federated_sum(num_examples),
                                  delta_nonzeros=tff.federated_sum(delta_nonzeros),
                                  **robust.drop_metrics(dropped, update_ratio)))
      return new_state, round_metrics

    @rounds.round_computation(server_state_type, client_state_type, seed_type, data_type)
    def next_fn(server_state, client_states, seeds, data):
      out = tff.federated_map(
          client_update_comp,
          (tff.federated_broadcast(server_state.posterior), client_states, seeds, data))
      new_state, metrics = finish_round(server_state, out.delta, out.metrics, out.num_examples,
                                        out.delta_nonzeros, out.cavity_floored, out.dropped,
                                        out.update_ratio)
      return new_state, out.client_state, metrics

    # The same round as two computations, for multi-worker (mergeable) contexts:
    # there, CLIENTS-placed outputs of a computation that also aggregates are
    # recomputed after the merge, so `next` would train every client twice.
    @rounds.round_computation(server_state_type, client_state_type, seed_type, data_type)
    def client_phase(server_state, client_states, seeds, data):
      return tff.federated_map(
          client_update_comp,
          (tff.federated_broadcast(server_state.posterior), client_states, seeds, data))

    out_type = client_update_comp.type_signature.result
    upload_type = tff.to_type(
        collections.OrderedDict(delta=out_type.delta,
                                metrics=out_type.metrics,
                                num_examples=out_type.num_examples,
                                delta_nonzeros=out_type.delta_nonzeros,
                                cavity_floored=out_type.cavity_floored,
                                dropped=out_type.dropped,
                                update_ratio=out_type.update_ratio))

    @tff.federated_computation(tff.FederatedType(server_state_type, tff.SERVER),
                               tff.FederatedType(upload_type, tff.CLIENTS))
    def server_phase(server_state, uploads):
      return finish_round(server_state, uploads.delta, uploads.metrics, uploads.num_examples,
                          uploads.delta_nonzeros, uploads.cavity_floored, uploads.dropped,
                          uploads.update_ratio)

    @tff.tensorflow.computation(posterior_type, client_state_type, seed_type, data_type)
    def client_eval_comp(server_posterior, state, seed, data):
      state = ClientState(gaussian.NaturalGaussian(*state.shared_factor),
                          gaussian.NaturalGaussian(*state.shared_posterior), list(state.private),
                          state.trained, state.client_index)
      return evaluate_client(cfg, gaussian.NaturalGaussian(*server_posterior), state, seed, *data)

    @rounds.round_computation(server_state_type, client_state_type, seed_type, data_type)
    def evaluate_fn(server_state, client_states, seeds, data):
      return tff.federated_map(
          client_eval_comp,
          (tff.federated_broadcast(server_state.posterior), client_states, seeds, data))

    # The driver's streamed evaluation (`tfbfl.experiment`): S from the server
    # posterior alone, MT from each client's state alone (so it can be cached).
    index_type = tff.TensorType(np.int32)

    @tff.tensorflow.computation(posterior_type, index_type, seed_type, data_type)
    def server_eval_comp(server_posterior, client_index, seed, data):
      return evaluate_server_client(cfg, gaussian.NaturalGaussian(*server_posterior), client_index,
                                    seed, *data)

    @tff.tensorflow.computation(client_state_type, index_type, seed_type, data_type)
    def own_eval_comp(state, client_index, seed, data):
      state = ClientState(gaussian.NaturalGaussian(*state.shared_factor),
                          gaussian.NaturalGaussian(*state.shared_posterior), list(state.private),
                          state.trained, client_index)
      return evaluate_own_client(cfg, state, seed, *data)

    @rounds.round_computation(server_state_type, index_type, seed_type, data_type)
    def evaluate_server_fn(server_state, indices, seeds, data):
      return tff.federated_map(
          server_eval_comp, (tff.federated_broadcast(server_state.posterior), indices, seeds, data))

    @tff.federated_computation(tff.FederatedType(client_state_type, tff.CLIENTS),
                               tff.FederatedType(index_type, tff.CLIENTS),
                               tff.FederatedType(seed_type, tff.CLIENTS),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def evaluate_clients_fn(client_states, indices, seeds, data):
      return tff.federated_map(own_eval_comp, (client_states, indices, seeds, data))

    self._evaluate_server_fn = evaluate_server_fn
    self._evaluate_clients_fn = evaluate_clients_fn

    # Kept for the client-batched rounds (`_group_round`), built per group size.
    self._types = dict(posterior=posterior_type,
                       client_state=client_state_type,
                       server_state=server_state_type,
                       x_dtype=x_dtype,
                       y_dtype=y_dtype)
    self._finish_round = finish_round
    self._group_rounds = {}

    self.client_update = client_update_comp
    self.server_update = server_update
    self.next_per_client = next_fn
    self.client_phase = client_phase
    self.server_phase = server_phase
    self.evaluate = evaluate_fn

  # ------------------------------------------- streamed evaluation protocol
  @property
  def mt_cacheable(self) -> bool:
    """MT is a function of the client's state alone only with posterior-mean
    evaluation; Monte Carlo predictives (`eval_samples > 0`) draw from seeds
    that change every evaluation, so the driver recomputes every client then."""
    return self.config.eval_samples == 0

  def evaluate_server(self, server_state, client_indices, seeds, test_data):
    """S sums of the given clients {server_loss, server_correct, num_examples,
    client_index[, server_calibration]}: only the server state and the clients'
    test data travel (no client state)."""
    return self._evaluate_server_fn(server_state, [np.int32(i) for i in client_indices],
                                    list(seeds), list(test_data))

  def evaluate_clients(self, client_states, client_indices, seeds, test_data):
    """MT sums of the given clients {mt_loss, mt_correct, num_examples,
    client_index[, mt_calibration]} from their states alone (no server state)."""
    return self._evaluate_clients_fn(list(client_states), [np.int32(i) for i in client_indices],
                                     list(seeds), list(test_data))

  # ------------------------------------------------- client-batched rounds
  def _group_round(self, size: int):
    """`next` over groups of `size` stacked clients (`client_update_batch`): each
    group is one TFF client that returns its clients' states and one upload,
    the sum of its clients' deltas (the aggregator sums groups as it sums
    clients), their example-weighted mean metrics and summed counts. Padding
    clients (`n = 0`) upload nothing."""
    if size in self._group_rounds:
      return self._group_rounds[size]
    cfg, types = self.config, self._types
    leaf = lambda shape, dtype=np.float32: tff.TensorType(dtype, (size, *np.shape(shape)))
    init = self.initial_client_state(0)
    group_posterior = lambda g: gaussian.NaturalGaussian([leaf(t) for t in g.eta1],
                                                         [leaf(t) for t in g.eta2])
    group_state_type = tff.to_type(
        ClientState(group_posterior(init.shared_factor), group_posterior(init.shared_posterior),
                    [leaf(w) for w in init.private], leaf(init.trained, np.bool_),
                    leaf(init.client_index, np.int32)))
    seed_type = tff.TensorType(np.int64, (size, 2))
    data_type = tff.to_type((tff.TensorType(types["x_dtype"], (size, None, *cfg.example_shape)),
                             tff.TensorType(types["y_dtype"],
                                            (size, None)), tff.TensorType(np.int32, (size,))))

    @tff.tensorflow.computation(types["posterior"], group_state_type, seed_type, data_type)
    def group_update(server_posterior, states, seeds, data):
      states = ClientState(gaussian.NaturalGaussian(*states.shared_factor),
                           gaussian.NaturalGaussian(*states.shared_posterior), list(states.private),
                           states.trained, states.client_index)
      x, y, n = data
      out = client_update_batch(cfg, gaussian.NaturalGaussian(*server_posterior), states, seeds, x,
                                y, n)
      real = tf.cast(n > 0, tf.float32)
      per_client = lambda t: real if t.shape.rank == 1 else tf.reshape(
          real, [-1] + [1] * (t.shape.rank - 1))
      delta = tf.nest.map_structure(lambda t: tf.reduce_sum(t * per_client(t), 0), out.delta)
      weight = out.num_examples * real
      total = tf.reduce_sum(weight)
      # A padding client's metrics are 0/0: weight 0 must not carry its NaN.
      metrics = tf.nest.map_structure(
          lambda t: tf.math.divide_no_nan(tf.reduce_sum(tf.where(weight > 0, t * weight, 0.0)),
                                          total), out.metrics)
      upload = collections.OrderedDict(
          delta=delta,
          metrics=metrics,
          num_examples=total,
          delta_nonzeros=tf.reduce_sum(out.delta_nonzeros * tf.cast(n > 0, tf.int32)),
          cavity_floored=tf.reduce_sum(out.cavity_floored * real),
          dropped=tf.reduce_sum(out.dropped * real),
          update_ratio=tf.reduce_max(tf.where(n > 0, out.update_ratio, 0.0)))
      return out.client_state, upload

    @rounds.round_computation(types["server_state"], group_state_type, seed_type, data_type)
    def next_groups(server_state, states, seeds, data):
      out = tff.federated_map(
          group_update, (tff.federated_broadcast(server_state.posterior), states, seeds, data))
      up = out[1]
      new_state, metrics = self._finish_round(server_state, up.delta, up.metrics, up.num_examples,
                                              up.delta_nonzeros, up.cavity_floored, up.dropped,
                                              up.update_ratio)
      return new_state, out[0], metrics

    self._group_rounds[size] = next_groups
    return next_groups

  def next(self, server_state, client_states, seeds, data):
    """One round: `(server_state, client_states, metrics)` from the server state
    and the selected clients' states, seeds and `(x, y)` data (lists).

    With the lean step (`batched(config)`) and the plain-sum aggregator the
    clients train in batched groups of `config.clients_per_group` (`_group_round`;
    the last group padded with clients without data); otherwise one TFF client
    computation per client (`next_per_client`). Both give the same results up to
    float summation order."""
    c = len(client_states)
    if not (batched(self.config) and self._plain_sum and c > 0):
      return self.next_per_client(server_state, client_states, seeds, data)
    size = max(1, min(self.config.clients_per_group, c))
    groups = -(-c // size)
    pad = groups * size - c
    # Padding clients: a copy of the first client with no data (n = 0).
    states = list(client_states) + [client_states[0]] * pad
    seeds = list(seeds) + [seeds[0]] * pad
    data = list(data) + [(np.zeros(
        (0,) + np.shape(data[0][0])[1:],
        np.asarray(data[0][0]).dtype), np.zeros((0,),
                                                np.asarray(data[0][1]).dtype))] * pad
    group_states, group_seeds, group_data = [], [], []
    for g in range(groups):
      part = slice(g * size, (g + 1) * size)
      group_states.append(client_batch.stack([_as_client_state(s) for s in states[part]]))
      group_seeds.append(np.stack([np.asarray(s, np.int64) for s in seeds[part]]))
      group_data.append(client_batch.pack_data(data[part]))
    server_state, out_states, metrics = self._group_round(size)(server_state, group_states,
                                                                group_seeds, group_data)
    new_states = [s for g in out_states for s in client_batch.unstack(_as_client_state(g), size)]
    return server_state, [_as_client_state(s) for s in new_states[:c]], metrics

  def next_two_phase(self, server_state, client_states, seeds, data):
    """The round of `next` as two TFF calls, for multi-worker contexts (the
    driver uses it when `runtime.mergeable_context_active()`): `client_phase`
    trains each selected client once on some worker and returns its outputs;
    `server_phase` aggregates the deltas and updates the server. Same results
    as `next` up to float summation order; client states come back in
    completion order, each with its `client_index`."""
    outputs = self.client_phase(server_state, client_states, seeds, data)
    uploads = [
        collections.OrderedDict(delta=o.delta,
                                metrics=o.metrics,
                                num_examples=o.num_examples,
                                delta_nonzeros=o.delta_nonzeros,
                                cavity_floored=o.cavity_floored,
                                dropped=o.dropped,
                                update_ratio=o.update_ratio) for o in outputs
    ]
    server_state, metrics = self.server_phase(server_state, uploads)
    return server_state, [o.client_state for o in outputs], metrics

  # ------------------------------------------------------------- export
  # Hooks of `tfbfl.export.export_run`: the models metrics S and MT evaluate, as
  # `tfbfl.export.make_predictor` modules (SavedModels of plain TF).
  def server_predictor(self, server_state, *, samples: Optional[int] = None, seed: int = 0):
    """The model metric S evaluates: the server network with the server
    posterior's means (`eval_samples == 0`), else the average of `eval_samples`
    sampled forward passes. `samples` (> 0) asks for that many passes instead (a
    Monte Carlo predictive whose fixed seed is `[seed, 0]`)."""
    posterior = server_state.posterior
    posterior = gaussian.NaturalGaussian([np.asarray(t) for t in posterior[0]],
                                         [np.asarray(t) for t in posterior[1]])
    samples = self.config.eval_samples if samples is None else int(samples)
    how = ("at the server posterior's means"
           if samples == 0 else f"{samples}-pass Monte Carlo predictive over the server posterior")
    return self._export_predictor(posterior,
                                  None,
                                  head=0,
                                  samples=samples,
                                  mc_seed=(seed, 0),
                                  info=dict(metric="S", model=f"server network, {how}"),
                                  name="server")

  def client_predictor(self,
                       server_state,
                       client_state,
                       *,
                       samples: Optional[int] = None,
                       seed: int = 0):
    """The model metric MT evaluates for this client: the client network (its
    shared posterior q_i and its private weights, joined by the lateral
    connections; the server network with q_i where `private` is off), at the means
    (`eval_samples == 0`) or the average of `eval_samples` sampled passes (fixed
    seed `[seed, client_index + 1]`). A client never trained has its initial model.
    The server state is not read (MT is a function of the client's state)."""
    del server_state
    state = _as_client_state(client_state)
    samples = self.config.eval_samples if samples is None else int(samples)
    head = 1 if self.config.private else 0
    what = ("client network (q_i and private weights, lateral connections)"
            if head == 1 else "server network with the client's posterior q_i")
    return self._export_predictor(state.shared_posterior,
                                  state.private,
                                  head=head,
                                  samples=samples,
                                  mc_seed=(seed, int(state.client_index) + 1),
                                  info=dict(metric="MT",
                                            model=f"{what}, " +
                                            ("at the posterior means" if samples == 0 else
                                             f"{samples}-pass Monte Carlo predictive"),
                                            trained=bool(np.asarray(state.trained))),
                                  name="client")

  def _export_predictor(self, posterior, private, head, samples, mc_seed, info, name):
    """A predictor computing `_predictive_sums`' predictive: the network's
    variables are assigned as the evaluation assigns them (from the natural
    parameters), and the forward pass, the softmax, the Monte Carlo average and
    the decision `argmax log(p + 1e-12)` are the same ops."""
    from tfbfl import export  # pylint: disable=g-import-not-at-top

    cfg = self.config
    if cfg.likelihood != "categorical":
      raise ValueError("export needs a categorical likelihood (class probabilities), got "
                       f"likelihood={cfg.likelihood!r}.")
    with export.eager_scope():  # as for any Keras model built by an export
      net = build_networks(cfg)
    as_tensors = lambda ts: [tf.constant(np.asarray(t, np.float32)) for t in ts]
    if private is not None:
      net.set_private_weights(as_tensors(private))  # exact copies
    # The layers' (loc, scale) from the natural parameters, with the ops of the
    # evaluation's `set_shared_posterior` (loc = eta1 / eta2).
    net.set_shared_posterior(
        gaussian.NaturalGaussian(as_tensors(posterior.eta1), as_tensors(posterior.eta2)))

    def out(x, s):
      return net.server_logits(x, seed=s) if head == 0 else net.forward(x, seed=s)[head]

    def predictive(x, seed):
      x = _flatten_for_mlp(cfg, x)
      if samples == 0:
        avg = tf.nn.softmax(out(x, None))
      else:

        def body(s, avg):
          p = tf.nn.softmax(out(x, tf.random.experimental.stateless_fold_in(seed, s)))
          return s + 1, avg + p / samples

        _, avg = tf.while_loop(lambda s, _: s < samples, body,
                               (tf.constant(0), tf.zeros([tf.shape(x)[0], cfg.num_classes])))
      pred = tf.math.log(avg + 1e-12)
      return avg, tf.argmax(pred, -1, output_type=tf.int32)

    kw = dict(input_shape=cfg.example_shape,
              input_dtype="int32" if cfg.architecture == "lstm" else "float32",
              num_classes=cfg.num_classes,
              variables=net.trainable_variables,
              info=dict(info, samples=int(samples)),
              name=name)
    if samples == 0:
      return export.make_predictor(lambda x: predictive(x, None), **kw)
    return export.make_predictor(None, seeded_forward=predictive, default_seed=mc_seed, **kw)


def _build(data, config: VirtualConfig, run) -> VirtualAlgorithm:
  """The spec's builder: the LSTM's vocabulary from the data (the step's C is in `config`)."""
  del run
  if config.architecture == "lstm":
    config = dataclasses.replace(config, vocab_size=data.num_classes)
  bound = {} if config.secure_sum_bound is None else dict(bound=config.secure_sum_bound)
  return VirtualAlgorithm(
      config,
      aggregator=aggregators.GaussianProductFactory(
          value_sum_factory=aggregators.sum_factory(config.aggregator, **bound)))


registry.register(
    registry.AlgorithmSpec(
        "virtual", VirtualConfig, _build, "VIRTUAL (Corinzia et al.): variational federated "
        "multi-task learning, server + private client Bayesian networks."))

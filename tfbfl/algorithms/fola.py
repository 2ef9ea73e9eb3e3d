r"""Gaussian product + FOLA, the offline Laplace variant and FedCurv, as TFF computations.

Liu & Zheng, "A Bayesian Federated Learning Framework with Multivariate Gaussian
Product" (`fola.txt`): every client n uploads a diagonal Gaussian approximation
`q_n = N(mu_n, Lambda_n^-1)` of its local posterior, the server multiplies them
(tempered by `a_n = n_k / N`, N the number of training examples of the clients
of the round) and broadcasts the product `q_S = N(mu_S, Lambda_S^-1)`, which is
both the next global model and the clients' next prior.

Server, eq. (9) (Algorithm 1, "Server executes"):

```none
Lambda_S = sum_n a_n Lambda_n,        mu_S = Lambda_S^-1 sum_n a_n Lambda_n mu_n
```

computed as one weighted mean of natural parameters `(Lambda_n mu_n, Lambda_n)`
through `tfbfl.aggregators.GaussianProductFactory(weighted=True)` (TFF's
`MeanFactory` underneath, so only the aggregate reaches the server and secure
sums plug in). Explicit epsilon (`fola_eps`): an entry whose precision is zero in
every client has no mean at all, so the server multiplies the product by a very
broad factor `N(theta_prev, eps^-1)` centred on the current server weights,

```none
mu_S = (sum_n a_n Lambda_n mu_n + eps * theta_prev) / (Lambda_S + eps),
```

i.e. eq. (9) up to a relative `eps / Lambda_S`, and "keep the previous value"
where nobody has information (the public code divides by `Lambda_S + 1e-5`,
which sends such entries to 0 instead). The stored `Lambda_S` is eq. (9)
exactly; the number of entries with `Lambda_S <= eps` is the round metric
`weak_precision`.

Client (Algorithm 1, ClientUpdate; Prior Iteration, eqs. 11-12), round r >= 1:

```none
theta <- mu_S;  for each of E epochs, for each minibatch b (batch size B):
    g      = grad of the mean cross-entropy over b                 (task loss)
    F     += |b| * g**2                                            (eq. 15)
    theta <- theta - lr * clip(g + lambda * Lambda_S * (theta - m_S))
F_n       = F / T                     (T = number of local steps)
mu_n      = theta,    Lambda_n = (1/r) F_n + ((r-1)/r) Lambda_S    (eq. 17)
```

The penalty gradient is that of `lambda * 1/2 (theta - m_S)^T diag(Lambda_S)
(theta - m_S)` (`fola_lambda`); `clip` is an optional global-norm clip of the
update (`fola_clip_norm`, 0 = none; the public code clips at 10), the Fisher
accumulates the unclipped task gradient. Reading `Lambda_S` as a per-example
precision (below), the Bayesian prior of eq. (11) on a mean loss over `n_k`
examples is `lambda = N / n_k` (about the number of clients); the default is 10.
Plain SGD on the penalty is stable only while `lr * lambda * max(Lambda_S) < 2`;
a client whose weights become non-finite uploads nothing (weight 0, metric
`non_finite_clients`). More generally (robust rounds, `tfbfl.algorithms.robust`)
a client is dropped, uploads nothing and keeps its previous state when any
uploaded entry is non-finite or its mean moved too far,
`||mu_n - mu_S|| > max_update_ratio * max(||mu_S||, 1)` (round metric
`clients_dropped`); a round whose clients were all dropped leaves the server
model (weights, precisions, prior mean) unchanged. FedCurv applies the same
rule to `theta_s - theta`.

Fisher normalisation (a choice; the paper is not consistent between eq. 15,
which averages over steps and examples, and Algorithm 1, which sums `g g^T`).
Eq. 15 wants the per-example empirical Fisher averaged over the T steps,
`(1/T) sum_t (1/|D|) sum_(x,y) sq(grad log p(y|x, theta_t))`. Each SGD step only
sees its minibatch, whose per-example squared gradients are estimated by
`|b| * sq(g_b)` (unbiased when the per-example gradients are independent with
zero mean, exact for |b| = 1), hence `F_n = (1/T) sum_t |b_t| sq(g_t)`: a
per-example Fisher whose scale does not grow with E or shrink with B. The
public code instead keeps `sum_t (|b_t| / |D_k|) sq(g_t)` (about `E / B` times
ours); the aggregation is invariant to such a common factor, the penalty is not:
`lambda_ours = lambda_public * E / B` gives the same penalty.

Round-1 prior (a choice). The paper's initial prior is `N(0, gamma I)` (Sec.
3.4), "Initialize theta, mu_S and Sigma_S" in Algorithm 1, and clients start
from one common initialisation ("all local parameters are coordinate-wise
identical"). Here: the server weights start at a seeded Glorot initialisation
`theta_0` (clients start there; an all-zero MLP cannot train), and the round-1
penalty uses the prior `m_S = 0`, `Lambda_S = 1/gamma` (`fola_gamma` is the prior
variance; `inf` gives a flat prior, i.e. no round-1 penalty, as the public code).
From round 2 on, `m_S = mu_S` and the start point is `mu_S`. Eq. (17) gives the
prior weight `(r-1)/r = 0` at r = 1, so the uploaded precision of round 1 is
`F_n` alone and unrolling eqs. (17) and (9) with full participation gives
`Lambda_S,R = (1/R) sum_r sum_n a_n F_n,r`: eq. (18) without its `+ gamma I`,
which eq. (17) cannot produce (a paper inconsistency); the initial prior acts
only as the round-1 regulariser.

Variants on the same code:

* `laplace_offline` ("offline" Laplace, Sec. 4.3): the same, but `F_n` is
  computed once after local training at the final weights, with one pass over
  the local data in minibatches of B, `F_n = (1/S) sum_s |b_s| sq(g_s)`.
* `fisher="identity"` (library only): `F_n = 1`, so all precisions are equal and
  eq. (9) is FedAvg's weighted average (the paper's remark after eq. 6); with
  `fola_lambda = 0` a round is exactly a FedAvg round (tested).
* FedCurv (Shoham et al. 2019), `FedCurvAlgorithm`: client s minimises
  `CE + lambda * sum_{j != s} (theta - theta_j)^T diag(I_j) (theta - theta_j)`
  (`fedcurv_lambda`), with `I_j` the offline Fisher above at client j's last
  weights `theta_j`. The server keeps `u = sum_j I_j`, `v = sum_j I_j theta_j`,
  which are the natural parameters of the product of the factors
  `N(theta_j, I_j^-1)`; client s forms the cavity `(v - I_s theta_s, u - I_s)`
  from its own stored `(I_s, theta_s)` (`tfbfl.gaussian.ratio_with_count`,
  floored at 1e-30) and uploads the delta of its factor, summed by an
  unweighted `GaussianProductFactory`; the model is the FedAvg weighted mean.
  Penalty gradient: `2 lambda ((u - I_s) theta - (v - I_s theta_s))`.

Compression (Sec. 3.5, `compress_p` < 1): each client replaces, per variable,
all but the top `compress_p` fraction of its uploaded precisions by their mean
(`tfbfl.compression.top_p_mean`, inside the client computation, so the server
aggregates what would really be sent) and `round_bytes` counts the CSR encoding.

Models: the user's Keras model (`--model=MODULE:FUNCTION`, or `model=` a
`model_fn` in Python: `tfbfl.models`; `--architecture` is then neither used nor
checked) or the built-in `--architecture` (`LaplaceConfig.network`): `mlp`
(`tfbfl.networks.builders.MLP`, the paper's 784-500-300-10 on MNIST,
64-500-300-10 on digits through `hidden_units`) or `cnn` (`builders.McMahanCNN`,
McMahan et al.'s CNN; flat square inputs such as digits' 64 pixels are viewed as
`8 x 8 x 1` images by its `Reshape`). Either is a `tfbfl.models.ModelTemplate`
(`network_template`) built by `template.build(--seed)` wherever a Keras model is
needed, reading the examples as the data hold them; a `--model` spelling the
MLP preset out is the preset run, metric for metric (`tests/test_own_model.py`).
The posterior, the Fisher and every upload are over the trainable weights only;
the weights of frozen layers (`trainable=False`) stay at their seeded initial
values everywhere. A trainable layer with non-trainable weights that training
updates (BatchNormalization's moving statistics) would silently keep its initial
statistics, so it is refused (`tfbfl.models.ModelError` naming --model; FedAvg
averages such weights). Plain SGD on variables, minibatches from stateless
shuffles of the per-client seed (`shuffle_order`), so a run is fully
determined by `--seed` (a model that draws random numbers in training, e.g. with
`Dropout`, is refused: `tfbfl.models`).

Metrics: S = the server weights `mu_S` on every client's test data; MT = each
client's last trained weights `mu_n` on its own test data.

#### Examples

```python
from tfbfl import data, runtime
from tfbfl.algorithms import fola
from tfbfl.round_loop import ExperimentRunner, RunConfig

runtime.set_local_runtime()
fd = data.load_federated("digits", partition="label_dirichlet", alpha=0.1)
algo = fola.FolaAlgorithm(fola.LaplaceConfig(
    input_shape=fd.input_shape, num_classes=fd.num_classes, hidden_units=(500, 300)))
summary = ExperimentRunner(algo, fd, RunConfig(rounds=5, clients_per_round=10)).run()
```

#### References

[1]: Liangxi Liu, Feng Zheng. A Bayesian Federated Learning Framework with
     Multivariate Gaussian Product. arXiv:2102.01936.
[2]: Neta Shoham et al. Overcoming Forgetting in Federated Learning on Non-IID
     Data. arXiv:1910.07796.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import List, Optional, Sequence

import numpy as np

from tfbfl import _lazy
from tfbfl import options
from tfbfl import predictor as predictor_lib
from tfbfl.algorithms import base
from tfbfl.algorithms import fedavg
from tfbfl.algorithms import registry

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
tff = _lazy.load("tensorflow_federated")
aggregators = _lazy.load("tfbfl.aggregators")
communication = _lazy.load("tfbfl.communication")
compression = _lazy.load("tfbfl.compression")
gaussian = _lazy.load("tfbfl.gaussian")
metrics_lib = _lazy.load("tfbfl.metrics")
builders = _lazy.load("tfbfl.networks.builders")
models = _lazy.load("tfbfl.models")
client_batch = _lazy.load("tfbfl.algorithms.client_batch")
robust = _lazy.load("tfbfl.algorithms.robust")
rounds = _lazy.load("tfbfl.algorithms.rounds")

FISHER_MODES = ("online", "offline", "identity")
MODELS = ("mlp", "cnn")
_CAVITY_MIN_PRECISION = 1e-30

ServerModel = collections.namedtuple("ServerModel",
                                     ["weights", "precision", "prior_mean", "round_num"])
FolaServerState = collections.namedtuple("FolaServerState", ["model", "aggregator_state"])
CurvModel = collections.namedtuple("CurvModel", ["weights", "curvature", "round_num"])
FedCurvServerState = collections.namedtuple("FedCurvServerState",
                                            ["model", "mean_state", "curvature_state"])
ClientState = collections.namedtuple("ClientState", ["weights", "fisher"])
ClientOutput = collections.namedtuple(
    "ClientOutput",
    ["upload", "client_state", "metrics", "num_examples", "non_finite", "dropped", "update_ratio"])


@dataclasses.dataclass(frozen=True)
class LaplaceConfig(base.ClientTraining):
  """Settings of FOLA, its offline variant and FedCurv: `base.ClientTraining`'s plus
  those below (flag names in the error messages). `fisher` is pinned per algorithm
  name ("online": FOLA, "offline": laplace_offline, "identity": the product-identity
  ablation). The paper's MLP is `hidden_units=(500, 300)`, E = 5, B = 32 (the
  FOLA figure launchers use those)."""
  input_shape: Sequence[int]
  num_classes: int
  fisher: str = "online"
  fola_lambda: float = options.real(10.0,
                                    "FOLA: strength lambda of the prior penalty.",
                                    high=options.MAX_WEIGHT)
  fola_gamma: float = options.real(float("inf"),
                                   "FOLA: variance of the round-1 prior N(0, gamma I) (inf: flat).",
                                   low_open=True,
                                   high=None,
                                   inf_ok=True)
  eps: float = options.real(1e-8,
                            "FOLA: server epsilon for zero aggregate precision.",
                            low_open=True,
                            high=1.0,
                            flag="fola_eps")
  clip_norm: float = options.real(0.0,
                                  "FOLA/FedCurv: client gradient clip norm (0: none).",
                                  high=1e9,
                                  flag="fola_clip_norm")
  compress_p: float = options.real(1.0,
                                   "FOLA: fraction of precisions kept per layer (1: none).",
                                   low_open=True,
                                   high=1.0)
  fedcurv_lambda: float = options.real(1.0,
                                       "FedCurv: penalty strength lambda.",
                                       high=options.MAX_WEIGHT)
  laplace_samples: int = options.integer(
      0, "FOLA, laplace_offline: evaluate S with the Laplace predictive, the mean softmax over "
      "this many draws of the weights from N(mu_S, 1 / (N Lambda_S + "
      "--laplace_prior_precision)), N the clients' training examples (0: mu_S alone; MT and "
      "the export keep the point estimates).",
      high=10**4)
  laplace_prior_precision: float = options.real(
      1.0, "FOLA --laplace_samples: the prior precision tau added to N Lambda_S.", low_open=True,
      high=1e12)
  num_train_examples: int = 0  # N: every client's training examples (`registry.model_fields`)

  def __post_init__(self):
    super().__post_init__()
    if self.model is None:  # a user's model replaces the architecture
      self.check_architecture(MODELS, "FOLA/FedCurv")
    if self.laplace_samples > 0 and self.fisher not in ("online", "offline"):
      raise ValueError(f"--laplace_samples needs a Laplace posterior (FOLA, laplace_offline); "
                       f"the Fisher here is {self.fisher!r}.")
    if self.fisher not in FISHER_MODES:
      raise ValueError(f"--fisher must be one of {FISHER_MODES}, got {self.fisher!r}.")
    self.resolve_image_shape(self.input_shape)

  @property
  def example_shape(self):
    """The shape of one example (`input_shape`), as the other configs name it."""
    return tuple(self.input_shape)

  @property
  def network(self) -> str:
    """The built-in network family ("mlp" or "cnn"; `--architecture`), used when
    `model` (the user's network) is None."""
    return self.architecture


def network_template(config: LaplaceConfig) -> "models.ModelTemplate":
  """The checked template of the network `config` trains (`builders.template_for`):
  the user's `config.model`, else the built-in `config.network` on the examples'
  own shape."""
  return builders.config_template(config)


def shuffle_order(seed, epochs, num_examples):
  """`[epochs, num_examples]` int32, a stateless random permutation per epoch: row e
  lists the order in which epoch e visits the examples (`client_batch.epoch_permutations`)."""
  return client_batch.epoch_permutations(seed, epochs, num_examples)


def _cross_entropy(logits, y):
  """(mean cross-entropy, number correct) of a batch."""
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
  correct = tf.reduce_sum(
      tf.cast(tf.equal(tf.argmax(logits, -1, output_type=y.dtype), y), tf.float32))
  return loss, correct


def laplace_std(precision, num_examples, prior_precision):
  """Per-entry std of the Laplace posterior `N(mu_S, 1 / (N Lambda_S + tau))`: the server
  precision `Lambda_S` is per example (module docstring), so N examples scale it by N;
  `tau` (`prior_precision`) keeps entries no example informs finite."""
  return [tf.math.rsqrt(float(num_examples) * p + prior_precision) for p in precision]


def laplace_predictive(probabilities, mean, std, samples, seed):
  """`(1/S) sum_s probabilities(w_s)`, `w_s = mean + std * e_s`, `e_s` standard normal
  drawn from `seed` (tensor `j` of draw `s` from `fold_in(seed, s * len(mean) + j)`)."""
  total = 0.0
  for s in range(samples):
    draw = [
        m + sd * tf.random.stateless_normal(
            tf.shape(m), tf.random.experimental.stateless_fold_in(seed, s * len(mean) + j))
        for j, (m, sd) in enumerate(zip(mean, std))
    ]
    total += probabilities(draw)
  return total / samples


def posterior_from_aggregate(aggregate, previous_mean, eps):
  """Server step of eq. (9) from `sum_n a_n (Lambda_n mu_n, Lambda_n)`.

  Returns `(mu_S, Lambda_S, weak)`: `mu_S = (eta1 + eps * previous_mean) /
  (eta2 + eps)` (the product with the broad factor `N(previous_mean, 1/eps)`,
  see the module docstring), `Lambda_S = eta2`, and the number of entries with
  `Lambda_S <= eps`. A non-finite aggregate entry (only possible when every
  client of the round diverged: the weighted mean is then 0/0) is treated as no
  information, so the server keeps its previous weights there.
  """
  aggregate = gaussian.NaturalGaussian(*aggregate)
  ok = [
      tf.math.logical_and(tf.math.is_finite(e1), tf.math.is_finite(e2))
      for e1, e2 in zip(aggregate.eta1, aggregate.eta2)
  ]
  aggregate = gaussian.NaturalGaussian(
      [tf.where(k, e, tf.zeros_like(e)) for k, e in zip(ok, aggregate.eta1)],
      [tf.where(k, e, tf.zeros_like(e)) for k, e in zip(ok, aggregate.eta2)])
  anchor = gaussian.NaturalGaussian(
      tf.nest.map_structure(lambda m: eps * m, list(previous_mean)),
      tf.nest.map_structure(lambda m: tf.fill(tf.shape(m), tf.constant(eps, m.dtype)),
                            list(previous_mean)))
  mean = gaussian.mean(gaussian.product(list_natural(aggregate), anchor))
  precision = list(aggregate.eta2)
  weak = tf.add_n([tf.reduce_sum(tf.cast(p <= eps, tf.int32)) for p in precision])
  return mean, precision, weak


def drop_if_non_finite(upload, num_examples):
  """A client whose upload has a non-finite entry (diverged SGD) sends zeros with
  weight 0, as `tff.learning`'s client work does; returns `(upload, weight,
  non_finite)` with `non_finite` 1.0 for such a client, else 0.0."""
  leaves = tf.nest.flatten(upload)
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in leaves])
  upload = tf.nest.map_structure(lambda t: tf.where(finite, t, tf.zeros_like(t)), upload)
  return upload, tf.where(finite, num_examples, 0.0), 1.0 - tf.cast(finite, tf.float32)


def drop_if_outlier(upload, num_examples, weights, server_weights, max_ratio):
  """Robust rounds (`tfbfl.algorithms.robust`): the client is dropped when any
  entry of `upload` is non-finite or its mean moved too far,
  `||weights - server_weights|| > max_ratio * max(||server_weights||, 1)`.
  A dropped client sends zeros with weight 0. Returns `(upload, weight,
  non_finite, dropped, ratio)` (`non_finite`, `dropped`: 1.0 or 0.0)."""
  upload, num_examples, non_finite = drop_if_non_finite(upload, num_examples)
  move = [w - s for w, s in zip(weights, server_weights)]
  ok, ratio = robust.check_update(move, list(server_weights), max_ratio)
  ok = tf.logical_and(ok, non_finite < 0.5)
  upload = robust.zeros_unless(ok, upload)
  return (upload, tf.where(ok, num_examples, 0.0), non_finite, 1.0 - tf.cast(ok, tf.float32), ratio)


def list_natural(g):
  """`NaturalGaussian` with list leaves (TFF hands structures back as Structs)."""
  return gaussian.NaturalGaussian(list(g.eta1), list(g.eta2))


def build_gaussian_product(weights_type,
                           eps,
                           factory: Optional[aggregators.GaussianProductFactory] = None):
  """The server's Gaussian product as a TFF aggregation + server step.

  Args:
    weights_type: `tff.Type` of the parameters (e.g. a list of `TensorType`s).
    eps: the epsilon of `posterior_from_aggregate`.
    factory: a weighted `GaussianProductFactory` (default
      `GaussianProductFactory(weighted=True)`).

  Returns:
    `(process, product)`: the `tff.templates.AggregationProcess` and a federated
    computation `product(agg_state@SERVER, natural@CLIENTS, num_examples@CLIENTS,
    previous_mean@SERVER) -> (agg_state, mu_S, Lambda_S, weak)@SERVER` with
    `natural = NaturalGaussian(Lambda_n mu_n, Lambda_n)`, weights
    `a_n = num_examples_n / sum_m num_examples_m`.
  """
  factory = factory or aggregators.GaussianProductFactory(weighted=True)
  if not factory.weighted:
    raise ValueError("the Gaussian product needs a weighted GaussianProductFactory.")
  natural_type = tff.to_type(gaussian.NaturalGaussian(weights_type, weights_type))
  process = factory.create(natural_type, tff.TensorType(np.float32))
  state_type = process.initialize.type_signature.result.member

  @tff.tensorflow.computation(natural_type, weights_type)
  def server_step(aggregate, previous_mean):
    return posterior_from_aggregate(aggregate, previous_mean, eps)

  @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                             tff.FederatedType(natural_type, tff.CLIENTS),
                             tff.FederatedType(np.float32, tff.CLIENTS),
                             tff.FederatedType(weights_type, tff.SERVER))
  def product(state, natural, num_examples, previous_mean):
    out = process.next(state, natural, num_examples)
    mean, precision, weak = tff.federated_map(server_step, (out.result, previous_mean))
    return out.state, mean, precision, weak

  return process, product


class _LaplaceBase:
  """What FOLA, its offline variant and FedCurv share: the model, the local SGD
  loop with a quadratic penalty and a diagonal Fisher, evaluation, types."""

  name = "laplace"

  def __init__(self, config: LaplaceConfig):
    self.config = config
    self._init_weights = None
    self.template = network_template(config)
    self._build_types()
    self._build_computations()

  # ------------------------------------------------------------- model
  def _model(self):
    """A new Keras model of the network, seeded by the run (it reads the examples
    as the data hold them)."""
    return self.template.build(self.config.seed)

  def _build_types(self):
    problems = []

    @tff.tensorflow.computation
    def initial_weights():
      model = self._model()
      problems.append(
          fedavg.weight_problem(model, self.template.label, self.name, fedavg.FROZEN_ONLY))
      return [tf.identity(v) for v in model.trainable_variables]

    if problems and problems[0]:
      raise models.ModelError(problems[0])
    self._init_weights = [np.asarray(w, np.float32) for w in initial_weights()]
    self.weights_type = tff.to_type(
        [tff.TensorType(np.float32, w.shape) for w in self._init_weights])
    self.client_state_type = tff.to_type(ClientState(self.weights_type, self.weights_type))
    self.seed_type = tff.TensorType(np.int64, [2])
    self.data_type = tff.to_type(
        (tff.TensorType(np.float32,
                        [None, *self.config.input_shape]), tff.TensorType(np.int32, [None])))

  @property
  def initial_weights(self) -> List[np.ndarray]:
    return [w.copy() for w in self._init_weights]

  def initial_client_state(self, client_index: int) -> ClientState:
    del client_index
    return ClientState(self.initial_weights, [np.zeros_like(w) for w in self._init_weights])

  def _model_bytes(self) -> int:
    return communication.dense_bytes(self._init_weights)

  # ------------------------------------------------------- local training
  def _local_training(self, model, start, prior, penalty_scale, seed, x, y, fisher_mode):
    """Local SGD from `start` on `CE + penalty`, penalty gradient
    `penalty_scale * (prior.eta2 * theta - prior.eta1)`; returns
    `(weights, fisher, metrics)` with the Fisher of `fisher_mode` (module
    docstring)."""
    c = self.config
    variables = model.trainable_variables
    use_penalty = prior is not None and penalty_scale > 0

    def task_gradient(xb, yb):
      with tf.GradientTape() as tape:
        loss, correct = _cross_entropy(model(xb, training=True), yb)
      return tape.gradient(loss, variables), loss, correct

    @tf.function(autograph=False)
    def run():
      for v, w in zip(variables, start):
        v.assign(w)
      n = tf.shape(y)[0]
      steps_per_epoch = (n + c.batch_size - 1) // c.batch_size
      # The shared minibatch schedule (one client): `shuffle_order`'s batches, the
      # last one of an epoch padded and masked (its masked mean is the short batch's).
      schedule = client_batch.MinibatchSchedule(seed[None], n[None], n, c.epochs, c.batch_size)
      num_steps = schedule.max_steps

      def step_fn(fisher, xb, yb, mask, step):
        del step
        with tf.GradientTape() as tape:
          loss, size, correct = client_batch.masked_cross_entropy(model(xb, training=True), yb,
                                                                  mask)
        grads = tape.gradient(loss, variables)
        if fisher_mode == "online":
          fisher = tuple(f + size * tf.square(g) for f, g in zip(fisher, grads))
        if use_penalty:
          grads = [
              g + penalty_scale * (p2 * v - p1)
              for g, v, p1, p2 in zip(grads, variables, prior.eta1, prior.eta2)
          ]
        if c.clip_norm > 0:
          grads, _ = tf.clip_by_global_norm(grads, c.clip_norm)
        with tf.control_dependencies(
            [v.assign_sub(c.client_lr * g) for v, g in zip(variables, grads)]):
          return tuple(tf.identity(f) for f in fisher), (loss * size, tf.identity(correct))

      carried = tuple(tf.zeros_like(v)[None] for v in variables) if fisher_mode == "online" else ()
      zero = tf.zeros([1])
      fisher, (loss_sum, correct_sum) = client_batch.train_loop(schedule, x[None], y[None], carried,
                                                                step_fn, (zero, zero))
      fisher = [f[0] for f in fisher]
      loss_sum, correct_sum = loss_sum[0], correct_sum[0]
      if fisher_mode == "online":
        steps = tf.cast(tf.maximum(num_steps, 1), tf.float32)
        fisher = [f / steps for f in fisher]
      elif fisher_mode == "offline":

        def add_batch(i, fisher):
          idx = tf.range(i * c.batch_size, tf.minimum((i + 1) * c.batch_size, n))
          grads, _, _ = task_gradient(tf.gather(x, idx), tf.gather(y, idx))
          size = tf.cast(tf.shape(idx)[0], tf.float32)
          return i + 1, tuple(f + size * tf.square(g) for f, g in zip(fisher, grads))

        _, fisher = tf.while_loop(lambda i, _: i < steps_per_epoch, add_batch,
                                  (tf.constant(0), tuple(tf.zeros_like(v) for v in variables)))
        fisher = [f / tf.cast(tf.maximum(steps_per_epoch, 1), tf.float32) for f in fisher]
      else:
        fisher = [tf.ones_like(v) for v in variables]
      seen = tf.maximum(tf.cast(n * c.epochs, tf.float32), 1.0)
      weights = [tf.identity(v.read_value()) for v in variables]
      metrics = collections.OrderedDict(train_loss=loss_sum / seen,
                                        train_accuracy=correct_sum / seen)
      return weights, fisher, metrics

    return run()

  # ------------------------------------------------------------ evaluation
  def _build_evaluation(self):
    """Per client: S of the server weights (with `laplace_samples`, of the Laplace
    predictive, `laplace_predictive`), MT of the client's own weights."""
    samples = self.config.laplace_samples
    # With the Laplace predictive the server sends its mean and the draws' std per entry.
    server_type = (tff.to_type((self.weights_type, self.weights_type))
                   if samples else self.weights_type)

    @tff.tensorflow.computation(server_type, self.client_state_type, self.seed_type,
                                self.data_type)
    def client_eval(server, state, seed, data):
      model = self._model()
      x, y = data

      @tf.function(autograph=False)
      def run():

        def logits_of(weights):
          for v, w in zip(model.trainable_variables, weights):
            v.assign(w)
          return model(x, training=False)

        if samples:
          mean, std = server
          probs = laplace_predictive(lambda w: tf.nn.softmax(logits_of(w)), list(mean),
                                     list(std), samples, seed)
          out = metrics_lib.probability_sums(probs, y, "server")
        else:
          out = metrics_lib.logit_sums(logits_of(list(server)), y, "server")
        out.update(metrics_lib.logit_sums(logits_of(list(state.weights)), y, "mt"))
        out["num_examples"] = tf.cast(tf.shape(y)[0], tf.float32)
        return out

      return run()

    @tff.tensorflow.computation(self.weights_type, self.weights_type)
    def laplace_posterior(mean, precision):
      return mean, laplace_std(precision, self.config.num_train_examples,
                               self.config.laplace_prior_precision)

    @rounds.round_computation(self.server_state_type, self.client_state_type, self.seed_type,
                              self.data_type)
    def evaluate_fn(server_state, client_states, seeds, data):
      server = server_state.model.weights
      if samples:
        server = tff.federated_map(laplace_posterior, (server, server_state.model.precision))
      return tff.federated_map(client_eval,
                               (tff.federated_broadcast(server), client_states, seeds, data))

    return evaluate_fn

  def _build_computations(self):
    raise NotImplementedError

  # ------------------------------------------------------------- export
  # Hooks of `tfbfl.export.export_run` (the evaluation is deterministic: `samples`
  # and `seed` are not used; the server precisions are not exported).
  def _export_predictor(self, weights, info, name):
    """`weights` as a `tfbfl.export` predictor computing what the evaluation
    computes: the model's logits on `x`,
    probabilities `softmax(logits)`, predictions `argmax(logits)`."""
    with predictor_lib.eager_scope():  # Keras functional models (see there)
      model = self._model()
    for v, w in zip(model.trainable_variables, list(weights)):
      v.assign(w)  # exact copies

    def forward(x):
      logits = model(x, training=False)
      return tf.nn.softmax(logits), tf.argmax(logits, -1, output_type=tf.int32)

    return predictor_lib.make_predictor(forward,
                                 input_shape=tuple(self.config.input_shape),
                                 input_dtype="float32",
                                 num_classes=self.config.num_classes,
                                 variables=model.variables,
                                 info=dict(info, samples=0),
                                 name=name)

  export_server_needs_clients = False

  def server_predictor(self, server_state, *, samples: Optional[int] = None, seed: int = 0):
    """The model metric S evaluates: the server weights (FOLA: the product's mean
    mu_S; FedCurv: the weighted mean of the clients' weights)."""
    del samples, seed
    return self._export_predictor(server_state.model.weights,
                                  dict(metric="S", model="server weights (posterior mean)"),
                                  "server")

  def client_predictor(self,
                       server_state,
                       client_state,
                       *,
                       samples: Optional[int] = None,
                       seed: int = 0,
                       reuse=None):
    """The model metric MT evaluates for this client: its last trained weights
    (the initial model if never selected)."""
    del server_state, samples, seed, reuse  # a new Keras model is cheap to trace
    return self._export_predictor(
        client_state.weights,
        dict(metric="MT",
             model="the client's last trained weights (the initial model if never "
             "selected)"), "client")


class FolaAlgorithm(_LaplaceBase):
  """Gaussian product server + FOLA clients (module docstring).

  `next(server_state@SERVER, client_states@CLIENTS, seeds@CLIENTS, data@CLIENTS)`
  returns `(server_state, client_states, metrics)`; `evaluate` the per-client S
  and MT sums (see `tfbfl.round_loop`). `product` is the server's Gaussian
  product alone (`build_gaussian_product`), for tests and other drivers.

  Args:
    config: `LaplaceConfig`; `config.fisher` picks FOLA ("online"), the offline
      Laplace variant ("offline") or unit precisions ("identity").
    aggregator: weighted `GaussianProductFactory` (default: plain weighted mean).
    name: the algorithm's name in outputs.
  """

  # ------------------------------------------------- tff.learning process
  # `base.SupportsLearningProcess`: stateless clients (training does not read the
  # client state); the model is mu_S; setting it keeps the precision and the
  # penalty centre `prior_mean`.
  stateful_clients = False

  @property
  def learning_round(self):
    return self.next

  def model_weights(self, server_state):
    return server_state.model.weights, []

  def with_model_weights(self, server_state, trainable, non_trainable):
    del non_trainable
    return server_state._replace(model=server_state.model._replace(weights=list(trainable)))

  def __init__(self,
               config: LaplaceConfig,
               aggregator: Optional[aggregators.GaussianProductFactory] = None,
               name: Optional[str] = None):
    self._aggregator = aggregator or aggregators.GaussianProductFactory(weighted=True)
    self.name = name or {
        "online": "fola",
        "offline": "laplace_offline"
    }.get(config.fisher, "product")
    super().__init__(config)

  def initial_server_state(self) -> FolaServerState:
    c = self.config
    prior_precision = 0.0 if math.isinf(c.fola_gamma) else 1.0 / c.fola_gamma
    model = ServerModel(self.initial_weights,
                        [np.full_like(w, prior_precision) for w in self._init_weights],
                        [np.zeros_like(w) for w in self._init_weights], np.int32(0))
    return FolaServerState(model, self._process.initialize())

  def round_bytes(self, num_selected: int, metrics) -> tuple:
    """Up: mu_n dense + Lambda_n (CSR if compress_p < 1); down: mu_S, Lambda_S dense."""
    del metrics
    dense = self._model_bytes()
    up = dense + compression.structure_bytes(self._init_weights, self.config.compress_p)
    return num_selected * up, num_selected * 2 * dense

  def _client_update(self, server_model, state, seed, x, y):
    c = self.config
    model = self._model()
    precision = list(server_model.precision)
    prior = gaussian.NaturalGaussian([p * m for p, m in zip(precision, server_model.prior_mean)],
                                     precision)
    weights, fisher, metrics = self._local_training(model, list(server_model.weights), prior,
                                                    c.fola_lambda, seed, x, y, c.fisher)
    r = tf.cast(server_model.round_num + 1, tf.float32)
    upload = [f / r + (r - 1.0) / r * p for f, p in zip(fisher, precision)]  # eq. (17)
    upload = compression.top_p_mean_structure(upload, c.compress_p)  # Sec. 3.5
    natural = gaussian.NaturalGaussian([p * w for p, w in zip(upload, weights)], upload)
    natural, num_examples, non_finite, dropped, ratio = drop_if_outlier(
        natural, tf.cast(tf.shape(y)[0], tf.float32), weights, list(server_model.weights),
        c.max_update_ratio)
    # A dropped client keeps its previous state; its metrics are left out.
    ok = dropped < 0.5
    new_state = robust.keep_if(ok, ClientState(weights, fisher),
                               ClientState(list(state.weights), list(state.fisher)))
    metrics = robust.zeros_unless(ok, metrics)
    return ClientOutput(natural, new_state, metrics, num_examples, non_finite, dropped, ratio)

  def _build_computations(self):
    c = self.config
    self._process, self.product = build_gaussian_product(self.weights_type, c.eps, self._aggregator)
    process, product = self._process, self.product
    model_type = tff.to_type(
        ServerModel(self.weights_type, self.weights_type, self.weights_type,
                    tff.TensorType(np.int32)))
    self.server_state_type = tff.to_type(
        FolaServerState(model_type, process.initialize.type_signature.result.member))

    @tff.tensorflow.computation(model_type, self.client_state_type, self.seed_type, self.data_type)
    def client_update(server_model, state, seed, data):
      return self._client_update(server_model, state, seed, *data)

    @tff.tensorflow.computation(self.weights_type, self.weights_type, model_type,
                                tff.TensorType(np.float32))
    def new_model(mean, precision, previous, total_weight):
      """The new server model; the previous one (round counter + 1) when every
      client of the round was dropped (`total_weight` 0)."""
      moved = total_weight > 0
      keep = lambda new, old: [tf.where(moved, n, o) for n, o in zip(new, old)]
      return ServerModel(keep(mean, previous.weights), keep(precision, previous.precision),
                         keep(mean, previous.prior_mean), previous.round_num + 1)

    @rounds.round_computation(self.server_state_type, self.client_state_type, self.seed_type,
                              self.data_type)
    def next_fn(server_state, client_states, seeds, data):
      model = server_state.model
      out = tff.federated_map(client_update,
                              (tff.federated_broadcast(model), client_states, seeds, data))
      agg_state, mean, precision, weak = product(server_state.aggregator_state, out.upload,
                                                 out.num_examples, model.weights)
      num_examples = tff.federated_sum(out.num_examples)
      updated = tff.federated_map(new_model, (mean, precision, model, num_examples))
      new_state = tff.federated_zip(FolaServerState(updated, agg_state))
      metrics = tff.federated_zip(
          collections.OrderedDict(train=robust.federated_weighted_mean(
              out.metrics, out.num_examples),
                                  weak_precision=weak,
                                  non_finite_clients=tff.federated_sum(out.non_finite),
                                  num_examples=num_examples,
                                  **robust.drop_metrics(out.dropped, out.update_ratio)))
      return new_state, out.client_state, metrics

    self.client_update = client_update
    self.next = next_fn
    self.evaluate = self._build_evaluation()


def _refuse_laplace_samples(laplace_samples: int) -> None:
  if laplace_samples > 0:
    raise ValueError("--laplace_samples needs a Laplace posterior at the server (FOLA, "
                     "laplace_offline); FedCurv's server keeps the clients' mean weights.")


class FedCurvAlgorithm(_LaplaceBase):
  """FedCurv (Shoham et al. 2019) on the same local loop (module docstring).

  Server state: the FedAvg weights and `curvature = (v, u) = (sum_j I_j theta_j,
  sum_j I_j)` as a `NaturalGaussian`; client state: its last `(theta_j, I_j)`.
  """

  name = "fedcurv"

  def __init__(self, config: LaplaceConfig):
    _refuse_laplace_samples(config.laplace_samples)
    super().__init__(config)

  def initial_server_state(self) -> FedCurvServerState:
    zeros = [np.zeros_like(w) for w in self._init_weights]
    model = CurvModel(self.initial_weights, gaussian.NaturalGaussian(zeros, list(zeros)),
                      np.int32(0))
    return FedCurvServerState(model, self._mean_process.initialize(),
                              self._curv_process.initialize())

  def round_bytes(self, num_selected: int, metrics) -> tuple:
    """Dense: up theta_j and the factor delta (2 tensors), down theta, u, v."""
    del metrics
    three = 3 * self._model_bytes()
    return num_selected * three, num_selected * three

  def _client_update(self, server_model, state, seed, x, y):
    c = self.config
    model = self._model()
    own = gaussian.NaturalGaussian([f * w for f, w in zip(state.fisher, state.weights)],
                                   list(state.fisher))
    cavity, _ = gaussian.ratio_with_count(list_natural(server_model.curvature),
                                          own,
                                          on_nonpositive="floor",
                                          min_precision=_CAVITY_MIN_PRECISION)
    weights, fisher, metrics = self._local_training(model, list(server_model.weights),
                                                    list_natural(cavity), 2.0 * c.fedcurv_lambda,
                                                    seed, x, y, "offline")
    new = gaussian.NaturalGaussian([f * w for f, w in zip(fisher, weights)], fisher)
    delta = list_natural(gaussian.product(new, gaussian.power(own, -1.0)))  # new / old
    upload, num_examples, non_finite, dropped, ratio = drop_if_outlier(
        (weights, delta), tf.cast(tf.shape(y)[0], tf.float32), weights, list(server_model.weights),
        c.max_update_ratio)
    # A dropped client keeps its old state: the server never received its new factor.
    ok = dropped < 0.5
    state = robust.keep_if(ok, ClientState(weights, fisher),
                           ClientState(list(state.weights), list(state.fisher)))
    metrics = robust.zeros_unless(ok, metrics)
    return ClientOutput(upload, state, metrics, num_examples, non_finite, dropped, ratio)

  def _build_computations(self):
    natural_type = tff.to_type(gaussian.NaturalGaussian(self.weights_type, self.weights_type))
    self._mean_process = tff.aggregators.MeanFactory().create(self.weights_type,
                                                              tff.TensorType(np.float32))
    self._curv_process = aggregators.GaussianProductFactory().create(natural_type)
    mean_process, curv_process = self._mean_process, self._curv_process
    model_type = tff.to_type(CurvModel(self.weights_type, natural_type, tff.TensorType(np.int32)))
    self.server_state_type = tff.to_type(
        FedCurvServerState(model_type, mean_process.initialize.type_signature.result.member,
                           curv_process.initialize.type_signature.result.member))

    @tff.tensorflow.computation(model_type, self.client_state_type, self.seed_type, self.data_type)
    def client_update(server_model, state, seed, data):
      return self._client_update(server_model, state, seed, *data)

    @tff.tensorflow.computation(self.weights_type, model_type, natural_type,
                                tff.TensorType(np.float32))
    def new_model(weights, previous, delta_sum, total_weight):
      """Adds the factor deltas (0 for dropped clients); keeps the previous
      weights when every client was dropped (`total_weight` 0)."""
      curvature = gaussian.product(list_natural(previous.curvature), list_natural(delta_sum))
      weights = [tf.where(total_weight > 0, w, o) for w, o in zip(weights, previous.weights)]
      return CurvModel(weights, list_natural(curvature), previous.round_num + 1)

    @rounds.round_computation(self.server_state_type, self.client_state_type, self.seed_type,
                              self.data_type)
    def next_fn(server_state, client_states, seeds, data):
      model = server_state.model
      out = tff.federated_map(client_update,
                              (tff.federated_broadcast(model), client_states, seeds, data))
      weights, delta = out.upload[0], out.upload[1]
      mean = mean_process.next(server_state.mean_state, weights, out.num_examples)
      curv = curv_process.next(server_state.curvature_state, delta)
      num_examples = tff.federated_sum(out.num_examples)
      updated = tff.federated_map(new_model, (mean.result, model, curv.result, num_examples))
      new_state = tff.federated_zip(FedCurvServerState(updated, mean.state, curv.state))
      metrics = tff.federated_zip(
          collections.OrderedDict(train=robust.federated_weighted_mean(
              out.metrics, out.num_examples),
                                  non_finite_clients=tff.federated_sum(out.non_finite),
                                  num_examples=num_examples,
                                  **robust.drop_metrics(out.dropped, out.update_ratio)))
      return new_state, out.client_state, metrics

    self.client_update = client_update
    self.next = next_fn
    self.evaluate = self._build_evaluation()


# ---------------------------------------------------------------- registry
registry.register(
    registry.AlgorithmSpec(
        "fola", LaplaceConfig, lambda data, config, run: FolaAlgorithm(config),
        "FOLA (Liu et al.): Gaussian-product aggregation of online Laplace approximations.",
        algorithm_cls=FolaAlgorithm))
registry.register(
    registry.AlgorithmSpec("laplace_offline",
                           LaplaceConfig,
                           lambda data, config, run: FolaAlgorithm(config),
                           "Gaussian product of offline Laplace approximations (FOLA's ablation).",
                           fixed=dict(fisher="offline"),
                           algorithm_cls=FolaAlgorithm))
registry.register(
    registry.AlgorithmSpec("fedcurv", LaplaceConfig,
                           lambda data, config, run: FedCurvAlgorithm(config),
                           "FedCurv (Shoham et al., 2019): FedAvg with a Fisher-weighted penalty.",
                           algorithm_cls=FedCurvAlgorithm,
                           check_params=lambda p: _refuse_laplace_samples(p["laplace_samples"])))

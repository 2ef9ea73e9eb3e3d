"""FedAvg and FedProx on the deterministic MLP (or conv net), as TFF computations.

Federated averaging (McMahan et al., 2017) with a server optimizer (Reddi et al.,
2021) and its proximal variant FedProx (Li et al., 2020). In round t the server
holds weights `w^(t)`; each selected client i (n_i training examples):

1. starts from `w_i = w^(t)` and runs E epochs of plain minibatch SGD
   (`client_lr`, batch size B) on

       L_i(w) = CE_i(w) + mu / 2 * ||w - w^(t)||^2,

   i.e. `w_i <- w_i - client_lr * (grad CE_batch(w_i) + mu * (w_i - w^(t)))`
   (`mu = 0` is FedAvg);
2. sends `Delta_i = w^(t) - w_i` (TFF's sign convention: a pseudo-gradient) with
   weight n_i, unless the update is dropped (`tfbfl.algorithms.robust`): a
   client whose `Delta_i` has a non-finite entry or whose norm exceeds
   `max_update_ratio * max(||w^(t)||, 1)` sends zeros with weight 0, keeps its
   previous client state (deployed model) and is counted in `clients_dropped`;

and the server applies one step of SGD with learning rate `server_lr` to the
weighted mean `Delta = sum_i n_i Delta_i / sum_i n_i`:

    w^(t+1) = w^(t) - server_lr * Delta

(`server_lr = 1` is plain model averaging), rejecting a non-finite `Delta`.
If every client of the round is dropped, the mean is 0 (`MeanFactory` with
`no_nan_division`) and the server weights do not move.

Pieces and why:

* Distribution, aggregation and the server update are TFF's learning building
  blocks: `tff.learning.templates.build_broadcast_process`,
  `tff.aggregators.MeanFactory` and
  `tff.learning.templates.build_apply_optimizer_finalizer` with
  `tff.learning.optimizers.build_sgdm(server_lr)`, composed into a
  `tff.templates.IterativeProcess`-shaped pair of federated computations.
* The client work is our own `tff.tensorflow.computation` instead of
  `tff.learning.templates.build_model_delta_client_work`, because (a) metric MT
  needs every client's post-training weights as a client-placed output, which
  `ClientResult(update, update_weight)` does not carry; (b) client data enter as
  in-memory tensors `(x, y)` and minibatches are drawn by a stateless shuffle of
  the per-client seed given by the driver (TFF forbids graph-level seeds, so a
  `tf.data` shuffle could not be made reproducible), and (c) a gather-based loop
  over in-memory tensors is the tight client loop SPEC "Performance" asks for.
  `tests/test_fedavg.py` checks that it reproduces
  `tff.learning.algorithms.build_weighted_fed_avg` given the same minibatches.
* Shuffling: epoch e visits the client's examples in the order
  `argsort(U[e])`, `U = stateless_uniform([E, n], seed)` (`epoch_permutations`),
  in ceil(n / B) minibatches (the last one may be smaller).
* Keras models are built only inside TFF computations (SPEC "Keras pitfall"),
  including the one that computes the initial weights.

Metrics: S = the server model `w^(t)` on every client's test data; MT = the model
each client last deployed, i.e. its own weights after its last local training
(the driver keeps them in the client-state store; a client whose training
diverged deploys its diverged weights); a client never selected is evaluated
with its initial state, the initial server model.

Reference check: `tff.learning.algorithms.build_weighted_fed_prox` in TFF 0.87
adds `mu * (w^(t) - w)` to the client gradient, the opposite sign of FedProx's
`mu * (w - w^(t))` (with `mu = 3`, `client_lr = 0.1` it diverges on digits in one
round), so FedProx is checked against a hand-written SGD instead.

`ModelComputations` holds the computations shared with `tfbfl.algorithms.local`
(Local and Global baselines): initial weights, client training, evaluation.

#### References

[1]: H. Brendan McMahan et al. Communication-Efficient Learning of Deep Networks
     from Decentralized Data. AISTATS 2017. https://arxiv.org/abs/1602.05629
[2]: Tian Li et al. Federated Optimization in Heterogeneous Networks. MLSys 2020.
     https://arxiv.org/abs/1812.06127
[3]: Sashank Reddi et al. Adaptive Federated Optimization. ICLR 2021.
     https://arxiv.org/abs/2003.00295
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tfbfl import architectures
from tfbfl import communication
from tfbfl import metrics as metrics_lib
from tfbfl import models
from tfbfl import training
from tfbfl.algorithms import client_batch
from tfbfl.algorithms import robust
from tfbfl.algorithms import rounds

ServerState = collections.namedtuple(
    "ServerState", ["model_weights", "finalizer_state", "aggregator_state", "round_num"])
ClientOutput = collections.namedtuple(
    "ClientOutput", ["update", "model_weights", "metrics", "num_examples", "dropped",
                     "update_ratio"])


ARCHITECTURES = ("mlp", "conv")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of the deterministic-model algorithms (flags of `launchers/train.py`).

  `architecture` is "mlp" (`models.build_deterministic_mlp`, inputs flattened) or
  "conv" (`architectures.build_deterministic_conv`, VIRTUAL's FEMNIST conv net, on
  `image_shape` images; `filters` per conv stage). `mu` is FedProx's proximal
  strength (0 = FedAvg); `server_lr` is unused by Local and Global.
  `max_update_ratio` is the drop rule's bound (`tfbfl.algorithms.robust`).
  """
  input_dim: int
  num_classes: int
  hidden_units: Sequence[int] = (100, 100)
  activation: str = "relu"
  epochs: int = 20
  batch_size: int = 20
  client_lr: float = 0.05
  server_lr: float = 1.0
  mu: float = 0.0
  seed: int = 0
  input_shape: Optional[Sequence[int]] = None   # None: (input_dim,)
  architecture: str = "mlp"
  image_shape: Optional[Sequence[int]] = None   # conv: (H, W[, C]); None: input_shape
  filters: Sequence[int] = (32, 64)
  max_update_ratio: float = robust.DEFAULT_MAX_UPDATE_RATIO

  @property
  def example_shape(self):
    return tuple(self.input_shape) if self.input_shape else (self.input_dim,)

  def __post_init__(self):
    rules = (("input_dim", self.input_dim, self.input_dim >= 1, ">= 1"),
             ("num_classes", self.num_classes, self.num_classes >= 1, ">= 1"),
             ("epochs_per_round", self.epochs, self.epochs >= 1, ">= 1"),
             ("batch_size", self.batch_size, self.batch_size >= 1, ">= 1"),
             ("client_lr", self.client_lr, self.client_lr > 0, "> 0"),
             ("server_lr", self.server_lr, self.server_lr > 0, "> 0"),
             ("mu", self.mu, self.mu >= 0, ">= 0"),
             ("max_update_ratio", self.max_update_ratio, self.max_update_ratio > 0, "> 0"),
             ("hidden_units", tuple(self.hidden_units),
              all(int(h) >= 1 for h in self.hidden_units), "positive"),
             ("architecture", self.architecture, self.architecture in ARCHITECTURES,
              f"one of {ARCHITECTURES} for the deterministic baselines"))
    for flag, value, ok, rule in rules:
      if not ok:
        raise ValueError(f"--{flag} must be {rule}, got {value!r}.")


def config_from_params(data, p, mu: float = 0.0) -> ModelConfig:
  """`ModelConfig` from `tfbfl.training` flags and the data's shapes."""
  return ModelConfig(
      input_dim=int(np.prod(data.input_shape)), input_shape=tuple(data.input_shape),
      num_classes=data.num_classes, hidden_units=tuple(p["hidden_units"]),
      epochs=p["epochs_per_round"], batch_size=p["batch_size"], client_lr=p["client_lr"],
      server_lr=p["server_lr"], mu=mu, seed=p["seed"], architecture=p["architecture"],
      image_shape=tuple(p["image_shape"]) if p["image_shape"] else None,
      filters=tuple(p["filters"]),
      max_update_ratio=float(p.get("max_update_ratio", robust.DEFAULT_MAX_UPDATE_RATIO)))


epoch_permutations = client_batch.epoch_permutations


def _as_model_weights(weights) -> tff.learning.models.ModelWeights:
  return tff.learning.models.ModelWeights(list(weights.trainable), list(weights.non_trainable))


def increment_round():
  """`tff.tensorflow.computation(int32) -> int32`: the round counter's `r + 1`."""
  return tff.tensorflow.computation(lambda r: r + 1, tff.TensorType(np.int32))


def train_metrics(client_output):
  """In a federated computation: {train: example-weighted mean of the clients'
  train metrics, num_examples: their sum, clients_dropped, update_ratio_max},
  all at SERVER (a dropped client has weight 0; 0 if all are dropped)."""
  return collections.OrderedDict(
      train=robust.federated_weighted_mean(client_output.metrics, client_output.num_examples),
      num_examples=tff.federated_sum(client_output.num_examples),
      **robust.drop_metrics(client_output.dropped, client_output.update_ratio))


class ModelComputations:
  """TF computations over the deterministic model shared by FedAvg, FedProx, Local, Global.

  Attributes:
    initial_weights: `tff.learning.models.ModelWeights` of numpy arrays, the
      seeded initial model (`models.build_deterministic_mlp(seed=config.seed)`,
      or the conv net).
    weights_type, seed_type, data_type: TFF types of the arguments below.
    client_update: `tff.tensorflow.computation(weights, seed, (x, y)) ->
      ClientOutput(update, model_weights, metrics, num_examples, dropped,
      update_ratio)`: E epochs of SGD from `weights` (the proximal anchor is
      `weights` too); `update` = `weights.trainable - new.trainable`,
      `num_examples` = n, `metrics` = {train_loss, train_accuracy}, means over
      the n * E examples visited (before each step's update). A dropped update
      (`tfbfl.algorithms.robust`; with `check_norm=False` only a non-finite
      one) gives `update` = 0, `model_weights` = `weights`, `num_examples` = 0,
      zero metrics and `dropped` = 1.
    score: `tff.tensorflow.computation(weights, (x, y)) -> (loss_sum, correct,
      num_examples)`: summed cross-entropy and number of correct predictions.
    predict_proba: `tff.tensorflow.computation(weights, x) -> p(y | x)` [n, classes].
  """

  def __init__(self, config: ModelConfig, check_norm: bool = True):
    self.config = cfg = config
    self.check_norm = check_norm

    @tff.tensorflow.computation
    def initial_weights_fn():
      model = self._model()
      return tff.learning.models.ModelWeights(
          list(model.trainable_weights), list(model.non_trainable_weights))

    self.initial_weights = _as_model_weights(initial_weights_fn())
    self.weights_type = tff.to_type(tff.learning.models.ModelWeights(
        [tff.TensorType(np.float32, w.shape) for w in self.initial_weights.trainable],
        [tff.TensorType(w.dtype, w.shape) for w in self.initial_weights.non_trainable]))
    self.seed_type = tff.TensorType(np.int64, [2])
    x_type = tff.TensorType(np.float32, [None, *cfg.example_shape])
    self.data_type = tff.to_type((x_type, tff.TensorType(np.int32, [None])))

    @tff.tensorflow.computation(self.weights_type, self.seed_type, self.data_type)
    def client_update(weights, seed, data):
      return self._train(_as_model_weights(weights), seed, *data)

    @tff.tensorflow.computation(self.weights_type, self.data_type)
    def score(weights, data):
      return self._score(_as_model_weights(weights), *data)

    @tff.tensorflow.computation(self.weights_type, x_type)
    def predict_proba(weights, x):
      return tf.nn.softmax(self._logits(_as_model_weights(weights), x))

    self.x_type = x_type
    self.client_update, self.score, self.predict_proba = client_update, score, predict_proba

  # --------------------------------------------------------------- helpers
  def _model(self) -> tf.keras.Model:
    c = self.config
    if c.architecture == "conv":
      return architectures.build_deterministic_conv(
          input_shape=tuple(c.image_shape or c.example_shape), num_classes=c.num_classes,
          hidden_units=tuple(c.hidden_units), seed=c.seed, filters=tuple(c.filters),
          activation=c.activation, data_shape=c.example_shape)
    return models.build_deterministic_mlp(
        c.input_dim, c.num_classes, tuple(c.hidden_units), activation=c.activation, seed=c.seed)

  def _flat(self, x):
    """MLP inputs are flattened; the conv net reshapes `example_shape` itself."""
    if self.config.architecture == "mlp":
      return tf.reshape(x, [tf.shape(x)[0], self.config.input_dim])
    return x

  @staticmethod
  def _assign(model, weights):
    for v, w in zip(model.trainable_weights, weights.trainable):
      v.assign(w)
    for v, w in zip(model.non_trainable_weights, weights.non_trainable):
      v.assign(w)

  def _train(self, weights, seed, x, y):
    cfg = self.config
    model = self._model()
    x = self._flat(x)

    @tf.function
    def train():
      self._assign(model, weights)
      variables = model.trainable_weights
      n = tf.shape(y)[0]
      # The shared minibatch schedule (one client): fixed-size batches, the last
      # one of an epoch masked; the masked mean is the short batch's mean.
      schedule = client_batch.MinibatchSchedule(seed[None], n[None], n, cfg.epochs,
                                                cfg.batch_size)

      def step_fn(params, xb, yb, mask, step):
        del step
        with tf.GradientTape() as tape:
          loss, size, correct = client_batch.masked_cross_entropy(
              model(xb, training=True), yb, mask)
        grads = tape.gradient(loss, variables)
        if cfg.mu > 0:   # gradient of mu/2 ||w - w^(t)||^2
          grads = [g + cfg.mu * (v - w0) for g, v, w0 in zip(grads, variables, weights.trainable)]
        with tf.control_dependencies(
            [v.assign_sub(cfg.client_lr * g) for v, g in zip(variables, grads)]):
          return params, (loss * size, tf.identity(correct))

      zero = tf.zeros([1])
      _, (loss_sum, correct_sum) = client_batch.train_loop(
          schedule, x[None], y[None], (), step_fn, (zero, zero))
      loss_sum, correct_sum = loss_sum[0], correct_sum[0]
      new_weights = tff.learning.models.ModelWeights(
          [tf.identity(v) for v in model.trainable_weights],
          [tf.identity(v) for v in model.non_trainable_weights])
      update = [w0 - w for w0, w in zip(weights.trainable, new_weights.trainable)]
      # Robust rounds: drop a non-finite or outlying update (robust.check_update).
      ok, ratio = robust.check_update(update, weights.trainable, cfg.max_update_ratio,
                                      check_norm=self.check_norm)
      ok = tf.logical_and(ok, robust.all_finite(new_weights.non_trainable))
      update = robust.zeros_unless(ok, update)
      new_weights = robust.keep_if(ok, new_weights, weights)
      seen = tf.maximum(tf.cast(n * cfg.epochs, tf.float32), 1.0)   # n = 0: metrics 0, not NaN
      metrics = robust.zeros_unless(ok, collections.OrderedDict(
          train_loss=loss_sum / seen, train_accuracy=correct_sum / seen))
      num_examples = tf.where(ok, tf.cast(n, tf.float32), 0.0)
      return ClientOutput(update, new_weights, metrics, num_examples,
                          1.0 - tf.cast(ok, tf.float32), ratio)

    return train()

  def _logits(self, weights, x):
    """The model with `weights` applied to `x` (a fresh Keras model; `tf.function`
    orders the assignments before the call in TFF's graph)."""
    model = self._model()
    x = self._flat(x)

    @tf.function
    def run():
      self._assign(model, weights)
      return model(x, training=False)

    return run()

  def _score(self, weights, x, y):
    """Summed cross-entropy, correct count, n and calibration bins (`tfbfl.metrics`)."""
    logits = self._logits(weights, x)
    loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=y.dtype), y), tf.float32))
    calibration = metrics_lib.calibration_sums(tf.nn.softmax(logits), y)
    return loss, correct, tf.cast(tf.shape(y)[0], tf.float32), calibration

  # -------------------------------------------------- federated evaluation
  def build_evaluate(self):
    """`federated_computation(server_weights@SERVER, client_weights@CLIENTS,
    test_data@CLIENTS)` -> per-client sums {server_loss, server_correct, mt_loss,
    mt_correct, num_examples}@CLIENTS (the evaluation protocol of
    `tfbfl.experiment`)."""
    @tff.tensorflow.computation(self.weights_type, self.weights_type, self.data_type)
    def client_eval(server_weights, own_weights, data):
      s_loss, s_correct, n, s_cal = self._score(_as_model_weights(server_weights), *data)
      m_loss, m_correct, _, m_cal = self._score(_as_model_weights(own_weights), *data)
      return collections.OrderedDict(server_loss=s_loss, server_correct=s_correct,
                                     mt_loss=m_loss, mt_correct=m_correct, num_examples=n,
                                     server_calibration=s_cal, mt_calibration=m_cal)

    @tff.federated_computation(
        tff.FederatedType(self.weights_type, tff.SERVER),
        tff.FederatedType(self.weights_type, tff.CLIENTS),
        tff.FederatedType(self.data_type, tff.CLIENTS))
    def evaluate_fn(server_weights, client_weights, data):
      return tff.federated_map(
          client_eval, (tff.federated_broadcast(server_weights), client_weights, data))

    return evaluate_fn

  def build_streamed_evaluate(self):
    """The driver's streamed evaluation (`tfbfl.experiment`), two federated
    computations with the sums of `build_evaluate` split by model:

    * `evaluate_server(server_weights@SERVER, client_index@CLIENTS,
      seed@CLIENTS, test_data@CLIENTS)` -> {server_loss, server_correct,
      num_examples, client_index, server_calibration}@CLIENTS;
    * `evaluate_clients(client_weights@CLIENTS, client_index@CLIENTS,
      seed@CLIENTS, test_data@CLIENTS)` -> {mt_loss, mt_correct, num_examples,
      client_index, mt_calibration}@CLIENTS (a function of the client's weights
      alone, so the driver may cache it). Seeds are not read (deterministic models).
    """
    index_type = tff.TensorType(np.int32)

    def sums(prefix, weights, client_index, data):
      loss, correct, n, cal = self._score(_as_model_weights(weights), *data)
      return collections.OrderedDict([(f"{prefix}_loss", loss), (f"{prefix}_correct", correct),
                                      ("num_examples", n), ("client_index", client_index),
                                      (f"{prefix}_calibration", cal)])

    @tff.tensorflow.computation(self.weights_type, index_type, self.data_type)
    def server_eval(server_weights, client_index, data):
      return sums("server", server_weights, client_index, data)

    @tff.tensorflow.computation(self.weights_type, index_type, self.data_type)
    def own_eval(own_weights, client_index, data):
      return sums("mt", own_weights, client_index, data)

    def over_clients(placement, comp):
      """`comp` mapped over the clients, the weights at `placement` (SERVER: broadcast)."""
      @tff.federated_computation(
          tff.FederatedType(self.weights_type, placement),
          tff.FederatedType(index_type, tff.CLIENTS),
          tff.FederatedType(self.seed_type, tff.CLIENTS),
          tff.FederatedType(self.data_type, tff.CLIENTS))
      def run(weights, indices, seeds, data):
        del seeds
        if placement is tff.SERVER:
          weights = tff.federated_broadcast(weights)
        return tff.federated_map(comp, (weights, indices, data))
      return run

    return over_clients(tff.SERVER, server_eval), over_clients(tff.CLIENTS, own_eval)

  def dense_bytes(self) -> int:
    """Bytes of one dense copy of the model's weights."""
    return communication.dense_bytes(self.initial_weights)


class FedAvgAlgorithm:
  """FedAvg (`mu = 0`) and FedProx (`mu > 0`) in the protocol of `tfbfl.experiment`.

  `next(server_state@SERVER, client_states@CLIENTS, seeds@CLIENTS, data@CLIENTS)`
  is a federated computation returning `(server_state@SERVER,
  client_states@CLIENTS, metrics@SERVER)`; the incoming client states are not
  read (every selected client starts from the server model) and the outgoing ones
  are the clients' post-training weights (their deployed models, metric MT).
  Client data come last (TFF's mergeable-context splitter reads the client count
  from the last argument). `evaluate(server_state, client_states, seeds,
  test_data)` returns per-client sums at CLIENTS.

  Args:
    config: `ModelConfig`.
    name: "fedavg" or "fedprox" (metric rows and logs only).

  #### Examples

  ```python
  from tfbfl import experiment, runtime, training
  runtime.set_local_runtime()
  p = training.resolve_params(dict(algorithm="fedprox", mu=0.01, rounds=5))
  data = training.load_data(p)
  algo = training.build_algorithm(data, p)      # FedAvgAlgorithm(name="fedprox")
  summary = experiment.ExperimentRunner(algo, data, experiment.RunConfig(rounds=5)).run()
  ```
  """

  def __init__(self, config: ModelConfig, name: str = "fedavg"):
    self.config = config
    self.name = name
    self.computations = comps = ModelComputations(config)
    weights_type = comps.weights_type
    distributor = tff.learning.templates.build_broadcast_process(weights_type)
    # no_nan_division: a round whose clients were all dropped averages to 0.
    aggregation = tff.aggregators.MeanFactory(no_nan_division=True).create(
        weights_type.trainable, tff.TensorType(np.float32))
    finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
        tff.learning.optimizers.build_sgdm(learning_rate=config.server_lr), weights_type)
    self._distributor, self._aggregation, self._finalizer = distributor, aggregation, finalizer
    server_state_type = tff.to_type(ServerState(
        weights_type, finalizer.initialize.type_signature.result.member,
        aggregation.initialize.type_signature.result.member, tff.TensorType(np.int32)))
    client_update = comps.client_update

    @tff.tensorflow.computation(tff.TensorType(np.float32), weights_type, weights_type)
    def keep_previous_if_dropped(dropped, new, previous):
      return robust.keep_if(dropped < 0.5, _as_model_weights(new), _as_model_weights(previous))

    @rounds.round_computation(server_state_type, weights_type, comps.seed_type, comps.data_type)
    def next_fn(server_state, client_states, seeds, data):
      # Every selected client starts from the server model; a dropped one keeps
      # its previous state (deployed model).
      dist = distributor.next(distributor.initialize(), server_state.model_weights)
      out = tff.federated_map(client_update, (dist.result, seeds, data))
      kept = tff.federated_map(keep_previous_if_dropped, (out.dropped, out.model_weights,
                                                          client_states))
      agg = aggregation.next(server_state.aggregator_state, out.update, out.num_examples)
      fin = finalizer.next(server_state.finalizer_state, server_state.model_weights, agg.result)
      new_state = tff.federated_zip(ServerState(
          fin.result, fin.state, agg.state, tff.federated_map(increment_round(), server_state.round_num)))
      metrics = tff.federated_zip(collections.OrderedDict(
          **train_metrics(out), update_non_finite=fin.measurements.update_non_finite))
      return new_state, kept, metrics

    self.next = next_fn
    self._evaluate = comps.build_evaluate()
    self._evaluate_server_fn, self._evaluate_clients_fn = comps.build_streamed_evaluate()

  def initial_server_state(self) -> ServerState:
    return ServerState(self.computations.initial_weights, self._finalizer.initialize(),
                       self._aggregation.initialize(), np.int32(0))

  def initial_client_state(self, client_index: int):
    """A client never selected deploys the initial server model."""
    del client_index
    return self.computations.initial_weights

  def evaluate(self, server_state, client_states, seeds, test_data):
    del seeds  # deterministic models
    return self._evaluate(server_state.model_weights, list(client_states), list(test_data))

  # The driver's streamed evaluation (tfbfl.experiment): S from the server model
  # alone, MT from each client's deployed weights alone (deterministic: cacheable).
  mt_cacheable = True

  def evaluate_server(self, server_state, client_indices, seeds, test_data):
    return self._evaluate_server_fn(server_state.model_weights,
                                    [np.int32(i) for i in client_indices], list(seeds),
                                    list(test_data))

  def evaluate_clients(self, client_states, client_indices, seeds, test_data):
    return self._evaluate_clients_fn(list(client_states), [np.int32(i) for i in client_indices],
                                     list(seeds), list(test_data))

  def round_bytes(self, num_selected: int, metrics) -> tuple:
    """Dense accounting: each selected client downloads w^(t) and uploads Delta_i."""
    del metrics
    size = self.computations.dense_bytes()
    return num_selected * size, num_selected * size


def _build_fedavg(data, p):
  return FedAvgAlgorithm(config_from_params(data, p, mu=0.0), name="fedavg")


def _build_fedprox(data, p):
  return FedAvgAlgorithm(config_from_params(data, p, mu=p["mu"]), name="fedprox")


training.register_algorithm("fedavg", _build_fedavg)
training.register_algorithm("fedprox", _build_fedprox)

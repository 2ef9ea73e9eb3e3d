"""VIRTUAL's TFF computations and states (`VirtualAlgorithm`).

A round: the server broadcasts its posterior `s^(t)`; each selected client runs
`client.client_update` and uploads `Delta_i`; the aggregator (a
`tfbfl.aggregators.GaussianProductFactory` sum) gives `Delta = prod_i Delta_i`, and
the server takes the damped-EP step `s^(t+1) = s^(t) * Delta^alpha` (precisions
floored at the prior's, `server_floored`). With the lean step and a plain sum,
clients train in stacked groups of `clients_per_group`
(`client.client_update_batch`). Design notes and measurements: docs/virtual.md.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np

from tfbfl import _lazy
from tfbfl import predictor as predictor_lib
from tfbfl.algorithms.virtual import evaluation
from tfbfl.algorithms.virtual.client import client_update
from tfbfl.algorithms.virtual.client import client_update_batch
from tfbfl.algorithms.virtual.config import ClientState
from tfbfl.algorithms.virtual.config import ServerState
from tfbfl.algorithms.virtual.config import VirtualConfig
from tfbfl.algorithms.virtual.evaluation import evaluate_client
from tfbfl.algorithms.virtual.evaluation import evaluate_own_client
from tfbfl.algorithms.virtual.evaluation import evaluate_server_client
from tfbfl.algorithms.virtual.model import batched
from tfbfl.algorithms.virtual.model import build_networks
from tfbfl.algorithms.virtual.model import flatten_for_mlp
from tfbfl.algorithms.virtual.model import initial_client_state
from tfbfl.algorithms.virtual.model import initial_factor
from tfbfl.algorithms.virtual.model import initial_posterior

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
tff = _lazy.load("tensorflow_federated")
aggregators = _lazy.load("tfbfl.aggregators")
communication = _lazy.load("tfbfl.communication")
gaussian = _lazy.load("tfbfl.gaussian")
metrics_lib = _lazy.load("tfbfl.metrics")
client_batch = _lazy.load("tfbfl.algorithms.client_batch")
robust = _lazy.load("tfbfl.algorithms.robust")
rounds = _lazy.load("tfbfl.algorithms.rounds")


def _as_client_state(state) -> ClientState:
  """A `ClientState` of numpy leaves from a TFF result or a `ClientState`."""
  if not isinstance(state, ClientState):
    state = ClientState(*state)
  g = lambda x: gaussian.NaturalGaussian([np.asarray(t)
                                          for t in x[0]], [np.asarray(t) for t in x[1]])
  return ClientState(g(state.shared_factor), g(state.shared_posterior),
                     [np.asarray(w) for w in state.private], np.asarray(state.trained),
                     np.asarray(state.client_index))


def upload(output) -> collections.OrderedDict:
  """What a client sends the server: the fields of its `ClientOutput` (or of its
  TFF type) but its new state."""
  return collections.OrderedDict(
      (name, getattr(output, name))
      for name in ("delta", "metrics", "num_examples", "delta_nonzeros", "cavity_floored",
                   "dropped", "update_ratio"))


class MtInput(NamedTuple):
  """What MT reads of a client's state (`evaluation.evaluate_own_client`)."""
  shared_posterior: Any
  private: Any


class PerClientComputations(NamedTuple):
  """VIRTUAL's computations with one TFF client per client (see the properties of
  `VirtualAlgorithm` of the same names)."""
  client_update: Any
  next: Any
  client_phase: Any
  server_phase: Any
  evaluate: Any


def as_client_state(struct) -> ClientState:
  """A `ClientState` from the structure a TFF computation receives (its factors as
  `NaturalGaussian`s again)."""
  return ClientState(gaussian.NaturalGaussian(*struct.shared_factor),
                     gaussian.NaturalGaussian(*struct.shared_posterior), list(struct.private),
                     struct.trained, struct.client_index)


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
    if config.scale_optimizer != "sgd" and not batched(config):
      raise ValueError(f"--scale_optimizer={config.scale_optimizer} runs in the lean step, which "
                       "needs a stack of Dense layers (the MLP, or a --model of Dense layers), "
                       "lean_step and local_solver='sgd'.")
    self._init_posterior = initial_posterior(config)
    self._init_factor = initial_factor(config, self._init_posterior)
    self._build_computations()

  # ----------------------------------------------------------------- states
  def initial_server_state(self) -> ServerState:
    posterior = tf.nest.map_structure(np.asarray, self._init_posterior)
    return ServerState(gaussian.NaturalGaussian(*posterior), self._aggregation.initialize(),
                       np.int32(0))

  def initial_client_state(self, client_index: int) -> ClientState:
    return initial_client_state(self.config, client_index, self._init_posterior,
                                self._init_factor)

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
    split_types = (tff.TensorType(x_dtype, [None, *cfg.example_shape]),
                   tff.TensorType(y_dtype, [None]))
    data_type = tff.to_type(split_types)
    # Evaluation data: the test split, then (temperature scaling) the calibration split.
    eval_data_type = tff.to_type(split_types * 2 if cfg.temperature_scaling else split_types)
    self._aggregation = self._aggregator.create(posterior_type)
    aggregation = self._aggregation
    server_state_type = tff.to_type(
        ServerState(posterior_type, aggregation.initialize.type_signature.result.member,
                    tff.TensorType(np.int32)))

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

    # The driver's streamed evaluation (`tfbfl.round_loop`): S from the server
    # posterior alone, MT from each client's state alone (so it can be cached).
    index_type = tff.TensorType(np.int32)

    @tff.tensorflow.computation(posterior_type, index_type, seed_type, eval_data_type)
    def server_eval_comp(server_posterior, client_index, seed, data):
      return evaluate_server_client(cfg, gaussian.NaturalGaussian(*server_posterior), client_index,
                                    seed, *data)

    mt_input_type = tff.to_type(MtInput(posterior_type, client_state_type.private))

    @tff.tensorflow.computation(mt_input_type, index_type, seed_type, eval_data_type)
    def own_eval_comp(mt_input, client_index, seed, data):
      return evaluate_own_client(cfg, gaussian.NaturalGaussian(*mt_input.shared_posterior),
                                 list(mt_input.private), client_index, seed, *data)

    @rounds.round_computation(server_state_type, index_type, seed_type, eval_data_type)
    def evaluate_server_fn(server_state, indices, seeds, data):
      return tff.federated_map(
          server_eval_comp, (tff.federated_broadcast(server_state.posterior), indices, seeds, data))

    @tff.federated_computation(tff.FederatedType(mt_input_type, tff.CLIENTS),
                               tff.FederatedType(index_type, tff.CLIENTS),
                               tff.FederatedType(seed_type, tff.CLIENTS),
                               tff.FederatedType(eval_data_type, tff.CLIENTS))
    def evaluate_clients_fn(mt_inputs, indices, seeds, data):
      return tff.federated_map(own_eval_comp, (mt_inputs, indices, seeds, data))

    self._evaluate_server_fn = evaluate_server_fn
    self._evaluate_clients_fn = evaluate_clients_fn

    # Kept for the computations built on first use: the per-client ones and the
    # client-batched rounds (`_group_round`, per group size).
    self._types = dict(posterior=posterior_type,
                       client_state=client_state_type,
                       server_state=server_state_type,
                       seed=seed_type,
                       data=data_type,
                       eval_data=eval_data_type,
                       x_dtype=x_dtype,
                       y_dtype=y_dtype)
    self._finish_round = finish_round
    self._group_rounds = {}

    self.server_update = server_update

  # ------------------------------------------------ per-client computations
  # Built on first use: the default rounds run batched groups (`_group_round`) and
  # the streamed evaluation, so tracing these at build would only slow every run's
  # start (docs/performance.md, "Start-up").
  @functools.cached_property
  def _per_client(self) -> PerClientComputations:
    cfg, types = self.config, self._types
    posterior_type, client_state_type = types["posterior"], types["client_state"]
    server_state_type = types["server_state"]
    seed_type, data_type, eval_data_type = types["seed"], types["data"], types["eval_data"]
    finish_round = self._finish_round

    @tff.tensorflow.computation(posterior_type, client_state_type, seed_type, data_type)
    def client_update_comp(server_posterior, state, seed, data):
      state = as_client_state(state)
      return client_update(cfg, gaussian.NaturalGaussian(*server_posterior), state, seed, *data)

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
    upload_type = tff.to_type(upload(out_type))

    @tff.federated_computation(tff.FederatedType(server_state_type, tff.SERVER),
                               tff.FederatedType(upload_type, tff.CLIENTS))
    def server_phase(server_state, uploads):
      return finish_round(server_state, uploads.delta, uploads.metrics, uploads.num_examples,
                          uploads.delta_nonzeros, uploads.cavity_floored, uploads.dropped,
                          uploads.update_ratio)

    @tff.tensorflow.computation(posterior_type, client_state_type, seed_type, eval_data_type)
    def client_eval_comp(server_posterior, state, seed, data):
      state = as_client_state(state)
      return evaluate_client(cfg, gaussian.NaturalGaussian(*server_posterior), state, seed, *data)

    @rounds.round_computation(server_state_type, client_state_type, seed_type, eval_data_type)
    def evaluate_fn(server_state, client_states, seeds, data):
      return tff.federated_map(
          client_eval_comp,
          (tff.federated_broadcast(server_state.posterior), client_states, seeds, data))

    return PerClientComputations(client_update=client_update_comp,
                                 next=next_fn,
                                 client_phase=client_phase,
                                 server_phase=server_phase,
                                 evaluate=evaluate_fn)

  @property
  def client_update(self):
    """One client's update (a TFF computation): `client.client_update`."""
    return self._per_client.client_update

  @property
  def next_per_client(self):
    """A round with one TFF client computation per client."""
    return self._per_client.next

  @property
  def client_phase(self):
    """`next_two_phase`'s training half."""
    return self._per_client.client_phase

  @property
  def server_phase(self):
    """`next_two_phase`'s aggregation half."""
    return self._per_client.server_phase

  @property
  def evaluate(self):
    """S and MT of the given clients in one call (`evaluation.evaluate_client`)."""
    return self._per_client.evaluate

  # ------------------------------------------- streamed evaluation protocol
  # MT is a function of the client's state alone: at the posterior means, or with
  # Monte Carlo passes drawn from the client's model seed, which no round changes.
  mt_cacheable = True

  def evaluate_server(self, server_state, client_indices, seeds, test_data):
    """S sums of the given clients {server_loss, server_correct, num_examples,
    client_index[, server_calibration]}: only the server state and the clients'
    test data travel (no client state)."""
    return self._evaluate_server_fn(server_state, [np.int32(i) for i in client_indices],
                                    list(seeds), list(test_data))

  def evaluate_clients(self, client_states, client_indices, seeds, test_data):
    """MT sums of the given clients {mt_loss, mt_correct, num_examples,
    client_index[, mt_calibration]} from their states alone (no server state)."""
    mt_inputs = [MtInput(s.shared_posterior, s.private) for s in map(_as_client_state, client_states)]
    return self._evaluate_clients_fn(mt_inputs, [np.int32(i) for i in client_indices],
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
    uploads = [upload(o) for o in outputs]
    server_state, metrics = self.server_phase(server_state, uploads)
    return server_state, [o.client_state for o in outputs], metrics

  # ------------------------------------------------- tff.learning process
  # `base.SupportsLearningProcess`: every client's state is kept; the model is the
  # server posterior's means (`eta1 / eta2`); setting it keeps the precisions.
  stateful_clients = True

  @property
  def learning_round(self):
    return self.next_per_client

  def model_weights(self, server_state):
    posterior = server_state.posterior
    return [tf.math.divide_no_nan(e1, e2) for e1, e2 in zip(posterior.eta1, posterior.eta2)], []

  def with_model_weights(self, server_state, trainable, non_trainable):
    del non_trainable
    posterior = server_state.posterior
    eta1 = [w * p for w, p in zip(trainable, posterior.eta2)]
    return server_state._replace(posterior=posterior._replace(eta1=eta1))

  # ------------------------------------------------------------- export
  # Hooks of `tfbfl.export.export_run`: the models metrics S and MT evaluate, as
  # `tfbfl.predictor.make_predictor` modules (SavedModels of plain TF).
  export_server_needs_clients = False

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
                       seed: int = 0,
                       reuse=None):
    """The model metric MT evaluates for this client: the client network (its
    shared posterior q_i and its private weights, joined by the lateral
    connections; the server network with q_i where `private` is off), at the means
    (`eval_samples == 0`) or the average of `eval_samples` sampled passes (fixed
    seed `[seed, client_index + 1]`). A client never trained has its initial model.
    The server state is not read (MT is a function of the client's state).
    `reuse`: a client predictor this algorithm returned before with the same
    `samples`; this client's model is assigned into it and it is returned, without
    a new trace (its previous model is gone)."""
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
                                  name="client",
                                  reuse=reuse)

  def _export_predictor(self, posterior, private, head, samples, mc_seed, info, name, reuse=None):
    """A predictor computing the evaluation's predictive (`evaluation`): the network's
    variables are assigned as the evaluation assigns them (from the natural
    parameters), and the forward pass, the softmax, the Monte Carlo average and
    the decision `argmax metrics.log_probabilities(p)` are the same ops. With
    `reuse` (a predictor this method made for the same head, samples and name),
    the values are assigned into its network and it is returned."""
    cfg = self.config
    if cfg.likelihood != "categorical":
      raise ValueError("export needs a categorical likelihood (class probabilities), got "
                       f"likelihood={cfg.likelihood!r}.")
    info = dict(info, samples=int(samples))
    mc_seed = None if samples == 0 else mc_seed
    key = (head, int(samples), name)
    source = None if reuse is None else reuse.source
    if isinstance(source, _ExportNetwork) and source.algorithm is self and source.key == key:
      _assign_export_network(source.net, posterior, private)
      return reuse.describe(info, mc_seed)
    with predictor_lib.eager_scope():  # as for any Keras model built by an export
      net = build_networks(cfg)
    _assign_export_network(net, posterior, private)

    def predictive(x, seed):
      # The evaluation's function (example-keyed noise: independent of the batch).
      avg = evaluation.predictive(net, head, flatten_for_mlp(cfg, x), samples, seed,
                                  cfg.num_classes)
      pred = metrics_lib.log_probabilities(avg)
      return avg, tf.argmax(pred, -1, output_type=tf.int32)

    kw = dict(input_shape=cfg.example_shape,
              input_dtype="int32" if cfg.architecture == "lstm" else "float32",
              num_classes=cfg.num_classes,
              variables=net.trainable_variables,
              info=info,
              source=_ExportNetwork(self, key, net),
              name=name)
    if samples == 0:
      return predictor_lib.make_predictor(lambda x: predictive(x, None), **kw)
    return predictor_lib.make_predictor(None, seeded_forward=predictive, default_seed=mc_seed, **kw)


class _ExportNetwork(NamedTuple):
  """An exported predictor's `source`: the algorithm that made it, what it was made
  as (head, number of samples, name) and the network its graphs read."""
  algorithm: Any
  key: Tuple[int, int, str]
  net: Any


def _assign_export_network(net, posterior, private):
  """Assigns an export's network: the private weights (exact copies) and the layers'
  (loc, scale) from the natural parameters, with the ops of the evaluation's
  `set_shared_posterior` (loc = eta1 / eta2)."""
  as_tensors = lambda ts: [tf.constant(np.asarray(t, np.float32)) for t in ts]
  if private is not None:
    net.set_private_weights(as_tensors(private))
  net.set_shared_posterior(
      gaussian.NaturalGaussian(as_tensors(posterior.eta1), as_tensors(posterior.eta2)))


def build(data, config: VirtualConfig, run) -> VirtualAlgorithm:
  """The spec's builder: the LSTM's vocabulary from the data (the step's C is in `config`)."""
  del run
  if config.architecture == "lstm":
    config = dataclasses.replace(config, vocab_size=data.num_classes)
  bound = {} if config.secure_sum_bound is None else dict(bound=config.secure_sum_bound)
  return VirtualAlgorithm(
      config,
      aggregator=aggregators.GaussianProductFactory(
          value_sum_factory=aggregators.sum_factory(config.aggregator, **bound)))

"""Local and Global baselines on the deterministic model (VIRTUAL v1, Table 2).

Both use the model and the client training of `tfbfl.algorithms.fedavg`
(`ModelComputations`: the user's `--model` or the built-in MLP / conv net, see
`fedavg`'s "Models"; E epochs of plain SGD with the stateless per-epoch shuffle
`fedavg.epoch_permutations`), so the four deterministic baselines differ only in
who trains which model on what data. A model's non-trainable weights (e.g.
BatchNormalization's moving statistics) stay with the model that trained them:
each Local client's own, Global's pooled model's.

**Local**: client i owns a model `w_i`, starting from the initial model `w^(0)`
(the same seeded initial weights as FedAvg's server). Each round every selected
client trains its own model for E epochs on its own training data only,

    w_i <- SGD_E(w_i; D_i, seed_i^(t)),

and nothing is exchanged. Metrics:

* MT = client i's own model `w_i` on its own test data;
* S  = the uniform ensemble of all K local models' predictive distributions,

      p_S(y | x) = (1/K) sum_k softmax(f(x; w_k))_y,

  on every client's test data (loss `-log p_S(y | x)`, floored at 1e-30). The
  ensemble is the only "server model" Local can offer without training one:
  averaging the weights of independently trained networks has no meaning.
  Clients never selected contribute their initial model.

**Global** (non-federated reference): one model `w` trained on the pooled
training data `D = D_1 u ... u D_K` of *all* clients (taken from the
`FederatedData` at construction; the `data` argument of `next` is not used).
Round t runs E epochs of SGD on `D` with the stateless seed
`base.client_seed(seed, t, 0)` (so with one client, Global and Local see
identical minibatches). S = MT = `w` on each client's test data.

Neither baseline transmits models: `round_bytes` is (0, 0).

Neither aggregates anything, so the outlier rule of robust rounds
(`tfbfl.algorithms.robust`) does not apply; only a model with a non-finite
entry is never stored: the client (Global: the server) keeps its previous model
and the round metric `clients_dropped` counts it.
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence, Tuple

import numpy as np

from tfbfl import _lazy
from tfbfl.algorithms import base
from tfbfl.algorithms import fedavg
from tfbfl.algorithms import registry

tff = _lazy.load("tensorflow_federated")
metrics_lib = _lazy.load("tfbfl.metrics")
rounds = _lazy.load("tfbfl.algorithms.rounds")

GlobalState = collections.namedtuple("GlobalState", ["model_weights", "round_num"])

_MIN_PROB = 1e-30


class LocalAlgorithm:
  """One model per client, trained only on its own data (protocol of `tfbfl.round_loop`).

  `next(round_num@SERVER, client_states@CLIENTS, seeds@CLIENTS, data@CLIENTS)` is
  a federated computation: each selected client trains its own weights
  (`client_states`) and returns them; the server state is only the round counter.
  `evaluate` returns per-client sums: MT from each client's own model, S from the
  uniform ensemble of all clients' models (module docstring); the clients'
  predictive distributions on the pooled test inputs come back at CLIENTS and are
  averaged by the caller (a federated sum needs fully defined shapes).

  Args:
    config: `fedavg.ModelConfig` (`server_lr` and `mu` are not used; `mu` must be 0).

  #### Examples

  ```python
  from tfbfl import round_loop, runtime, driver
  runtime.set_local_runtime()
  p = driver.resolve_params(dict(algorithm="local", partition="permuted"))
  data = driver.load_data(p)
  algo = driver.build_algorithm(data, p)      # LocalAlgorithm
  summary = round_loop.ExperimentRunner(algo, data, round_loop.RunConfig(rounds=5)).run()
  ```
  """

  name = "local"

  def __init__(self, config: fedavg.ModelConfig):
    if config.mu != 0:
      raise ValueError(f"--mu must be 0 for the Local baseline, got {config.mu}.")
    self.config = config
    self.computations = comps = fedavg.ModelComputations(config,
                                                         check_norm=False,
                                                         who="local",
                                                         non_trainable=fedavg.PER_MODEL)
    client_update, score, predict_proba = comps.client_update, comps.score, comps.predict_proba

    @rounds.round_computation(np.int32, comps.weights_type, comps.seed_type, comps.data_type)
    def next_fn(round_num, client_states, seeds, data):
      out = tff.federated_map(client_update, (client_states, seeds, data))
      metrics = tff.federated_zip(fedavg.train_metrics(out))
      return tff.federated_map(fedavg.increment_round(), round_num), out.model_weights, metrics

    @tff.federated_computation(tff.FederatedType(comps.weights_type, tff.CLIENTS),
                               tff.FederatedType(comps.x_type, tff.SERVER),
                               tff.FederatedType(comps.data_type, tff.CLIENTS))
    def evaluate_fn(client_weights, pooled_x, data):
      probs = tff.federated_map(predict_proba, (client_weights, tff.federated_broadcast(pooled_x)))
      return probs, tff.federated_map(score, (client_weights, data))

    self.next = next_fn
    self._evaluate = evaluate_fn

  def initial_server_state(self):
    return np.int32(0)

  def initial_client_state(self, client_index: int):
    """Every client starts from the seeded initial model `w^(0)`."""
    del client_index
    return self.computations.initial_weights

  def evaluate(self, server_state, client_states, seeds, test_data):
    del server_state, seeds  # deterministic models, no server model
    test_data = list(test_data)
    pooled_x = np.concatenate([x for x, _ in test_data], axis=0)
    probs, mt = self._evaluate(list(client_states), pooled_x, test_data)
    ensemble = np.mean([np.asarray(p) for p in probs], axis=0)
    out, start = [], 0
    for (x, y), own in zip(test_data, mt):
      p = ensemble[start:start + len(y)]
      start += len(y)
      p_true = p[np.arange(len(y)), y]
      out.append(
          dict(server_loss=float(-np.sum(np.log(np.maximum(p_true, _MIN_PROB)))),
               server_correct=float(np.sum(np.argmax(p, axis=-1) == y)),
               mt_loss=float(own["mt_loss"]),
               mt_correct=float(own["mt_correct"]),
               num_examples=float(own["num_examples"]),
               server_calibration=metrics_lib.numpy_calibration_sums(p, y),
               mt_calibration=np.asarray(own["mt_calibration"])))
    return out

  def round_bytes(self, num_selected: int, metrics) -> Tuple[int, int]:
    """Local training exchanges nothing."""
    del num_selected, metrics
    return 0, 0

  # ------------------------------------------------------------- export
  # Hooks of `tfbfl.export.export_run` (deterministic models: `samples` and
  # `seed` are not used). The "server model" is the ensemble of every client's
  # model, so `export_run` hands `server_predictor` all client states.
  export_server_needs_clients = True

  def server_predictor(self,
                       server_state,
                       *,
                       client_states: Optional[Sequence] = None,
                       samples: Optional[int] = None,
                       seed: int = 0):
    """The model metric S evaluates: the uniform ensemble of all K clients'
    predictive distributions; `client_states` are every client's state in
    client-index order (a client never selected: its initial model)."""
    del server_state, samples, seed
    if client_states is None:
      raise ValueError("Local's server model is the ensemble of every client's model: pass "
                       "client_states (all K client states, in client-index order).")
    return self.computations.ensemble_predictor(
        list(client_states),
        info=dict(metric="S", model="uniform ensemble of all clients' predictive distributions"),
        name="server")

  def client_predictor(self,
                       server_state,
                       client_state,
                       *,
                       samples: Optional[int] = None,
                       seed: int = 0,
                       reuse=None):
    """The model metric MT evaluates for this client: its own model."""
    del server_state, samples, seed, reuse  # a new Keras model is cheap to trace
    return self.computations.predictor(
        client_state,
        info=dict(metric="MT",
                  model="the client's own model (the initial model if never "
                  "selected)"),
        name="client")


class GlobalAlgorithm:
  """One model trained on the pooled training data of all clients (reference).

  Args:
    config: `fedavg.ModelConfig` (`server_lr` and `mu` are not used; `mu` must be 0).
    pooled_train: `(x, y)` numpy arrays, the training data of all clients.
  """

  name = "global"

  def __init__(self, config: fedavg.ModelConfig, pooled_train: Tuple[np.ndarray, np.ndarray]):
    if config.mu != 0:
      raise ValueError(f"--mu must be 0 for the Global baseline, got {config.mu}.")
    x, y = pooled_train
    if len(y) == 0:
      raise ValueError("the Global baseline needs at least one training example.")
    self.config = config
    self.computations = fedavg.ModelComputations(config,
                                                 check_norm=False,
                                                 who="global",
                                                 non_trainable=fedavg.PER_MODEL)
    self._pooled = (np.asarray(x, np.float32), np.asarray(y, np.int32))
    self._evaluate = self.computations.build_evaluate()

  def initial_server_state(self) -> GlobalState:
    return GlobalState(self.computations.initial_weights, np.int32(0))

  def initial_client_state(self, client_index: int):
    del client_index
    return ()  # clients hold no model of their own

  def next(self, server_state: GlobalState, client_states: Sequence, seeds, data):
    """E epochs of SGD on the pooled data with seed `client_seed(seed, t, 0)`; a
    non-finite result is not stored (the previous model stays, `clients_dropped` 1)."""
    del seeds, data  # the pooled data and the global seed stream are the algorithm's own
    round_num = int(server_state.round_num) + 1
    seed = base.client_seed(self.config.seed, round_num, 0)
    out = self.computations.client_update(server_state.model_weights, seed, self._pooled)
    # The pooled update stands for every selected client: dropped, it drops them all.
    metrics = collections.OrderedDict(train=out.metrics,
                                      num_examples=out.num_examples,
                                      clients_dropped=out.dropped * len(client_states))
    return GlobalState(out.model_weights, np.int32(round_num)), list(client_states), metrics

  def evaluate(self, server_state: GlobalState, client_states, seeds, test_data):
    del seeds
    weights = server_state.model_weights
    return self._evaluate(weights, [weights] * len(client_states), list(test_data))

  def round_bytes(self, num_selected: int, metrics) -> Tuple[int, int]:
    """No model is exchanged (the data are assumed centralised)."""
    del num_selected, metrics
    return 0, 0

  # ------------------------------------------------------------- export
  # Hooks of `tfbfl.export.export_run`: S and MT both evaluate the pooled model.
  export_server_needs_clients = False

  def server_predictor(self, server_state, *, samples: Optional[int] = None, seed: int = 0):
    """The model metrics S and MT evaluate: the model trained on the pooled data."""
    del samples, seed
    return self.computations.predictor(server_state.model_weights,
                                       info=dict(metric="S", model="the pooled-data model"),
                                       name="server")

  def client_predictor(self,
                       server_state,
                       client_state,
                       *,
                       samples: Optional[int] = None,
                       seed: int = 0,
                       reuse=None):
    """Every client's MT model is the pooled-data model (clients hold none)."""
    del client_state, samples, seed, reuse
    return self.computations.predictor(server_state.model_weights,
                                       info=dict(metric="MT", model="the pooled-data model"),
                                       name="client")


registry.register(
    registry.AlgorithmSpec("local", fedavg.ModelConfig,
                           lambda data, config, run: LocalAlgorithm(config),
                           "Local: one model per client on its own data (no communication).",
                           algorithm_cls=LocalAlgorithm))
registry.register(
    registry.AlgorithmSpec("global", fedavg.ModelConfig,
                           lambda data, config, run: GlobalAlgorithm(config, data.pooled("train")),
                           "Global: one model on the pooled data of all clients (reference).",
                           algorithm_cls=GlobalAlgorithm))

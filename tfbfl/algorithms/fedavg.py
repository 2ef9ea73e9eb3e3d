"""FedAvg and FedProx on a deterministic Keras network, as TFF computations.

Federated averaging (McMahan et al., 2017) with a server optimizer (Reddi et al.,
2021) and its proximal variant FedProx (Li et al., 2020). In round t the server
holds weights `w^(t)`; each selected client i (n_i training examples):

1. starts from `w_i = w^(t)` and runs E epochs of plain minibatch SGD
   (`client_lr`, batch size B) on

       L_i(w) = CE_i(w) + mu / 2 * ||w - w^(t)||^2,

   i.e. `w_i <- w_i - client_lr * (grad CE_batch(w_i) + mu * (w_i - w^(t)))`
   (`mu = 0` is FedAvg); with `client_momentum` beta > 0, SGD with momentum:
   `m <- beta m + g`, `w_i <- w_i - client_lr * m` (`g` the gradient above,
   `m = 0` at the start of every round, as TFF's client optimizers are);
2. sends `Delta_i = w^(t) - w_i` (TFF's sign convention: a pseudo-gradient) with
   weight n_i, unless the update is dropped (`tfbfl.algorithms.robust`): a
   client whose `Delta_i` has a non-finite entry or whose norm exceeds
   `max_update_ratio * max(||w^(t)||, 1)` sends zeros with weight 0, keeps its
   previous client state (deployed model) and is counted in `clients_dropped`;

and the server applies one step of SGD with learning rate `server_lr` to the
weighted mean `Delta = sum_i n_i Delta_i / sum_i n_i`:

    w^(t+1) = w^(t) - server_lr * Delta

(`server_lr = 1` is plain model averaging), rejecting a non-finite `Delta`.
Other server optimizers (Reddi et al.'s framework, TFF's optimizers, their state in
the server state and so in checkpoints): `server_momentum` beta > 0,
`m <- beta m + Delta`, `w <- w - server_lr * m` (FedAvgM, Hsu et al., 2019);
`server_optimizer="adam"` (FedAdam), whose first step is
`server_lr * Delta / (|Delta| + epsilon / sqrt(1 - beta_2))`, about
`server_lr * sign(Delta)`.
If every client of the round is dropped, the mean is 0 (`MeanFactory` with
`no_nan_division`) and the server weights do not move (with momentum or Adam they
take the optimizer's step on a zero `Delta`).

Pieces and why:

* Distribution, aggregation and the server update are TFF's learning building
  blocks: `tff.learning.templates.build_broadcast_process`,
  `tff.aggregators.MeanFactory` and
  `tff.learning.templates.build_apply_optimizer_finalizer` with
  `tff.learning.optimizers.build_sgdm(server_lr)` (or `build_adam`), composed into a
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

Models. The network is the user's Keras model (`--model=MODULE:FUNCTION`, or
`model=` a `model_fn` in Python: `tfbfl.models`) or, without one, the built-in
`--architecture` (`mlp`: `tfbfl.networks.builders.MLP`; `conv`: `ConvNet`), each a
`tfbfl.models.ModelTemplate` (`network_template`) built by
`template.build(--seed)` wherever a Keras model is needed (initial weights, client
training, evaluation, MT, export). The model reads the examples as the data hold
them (the MLP preset starts with a `Flatten` for image-shaped examples, the conv
net with its `Reshape`); a run with `--model` spelling a preset out (e.g.
`Dense(100, "relu", kernel_initializer="glorot_normal")` twice, then the logits) is
the preset run, weight for weight and metric for metric (`tests/test_own_model.py`).
`--architecture` is not used (nor checked) with `--model`. Layers that draw random
numbers in training (`Dropout`, `GaussianNoise`, ...) are refused by
`tfbfl.models.template`: `--seed` cannot fix their noise (two same-seed FedAvg runs
with `Dropout(0.2)` ended at different S, also with the layer's own `seed=`).

Non-trainable weights (e.g. `BatchNormalization`'s moving statistics, or the
weights of a layer with `trainable=False`) travel with the trainable ones in
`tff.learning.models.ModelWeights`: each client trains from the server's, and the
server adds to its own the example-weighted mean of the clients' changes (so
BatchNormalization's statistics become the clients' weighted mean; a frozen
layer's change is exactly 0 and stays put; a dropped client has weight 0). The
server optimizer steps the trainable weights only. This differs from
`tff.learning.algorithms.build_weighted_fed_avg`, whose finalizer leaves the
server's non-trainable weights at their initial values. MT keeps each client's
own. Local and Global keep them per model (Local: each client's; Global: the
pooled model's). The trainable weights must be float32 and the non-trainable ones
floating point: another dtype is refused (`tfbfl.models.ModelError` naming
--model).

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
[4]: Tzu-Ming Harry Hsu, Hang Qi, Matthew Brown. Measuring the Effects of
     Non-Identical Data Distribution for Federated Visual Classification. 2019.
     https://arxiv.org/abs/1909.06335
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Sequence

import numpy as np

from tfbfl import _lazy
from tfbfl import options
from tfbfl import predictor as predictor_lib
from tfbfl.algorithms import base
from tfbfl.algorithms import registry

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
tff = _lazy.load("tensorflow_federated")
builders = _lazy.load("tfbfl.networks.builders")
communication = _lazy.load("tfbfl.communication")
metrics_lib = _lazy.load("tfbfl.metrics")
temperature = _lazy.load("tfbfl.temperature")
models = _lazy.load("tfbfl.models")
client_batch = _lazy.load("tfbfl.algorithms.client_batch")
robust = _lazy.load("tfbfl.algorithms.robust")
rounds = _lazy.load("tfbfl.algorithms.rounds")

ServerState = collections.namedtuple(
    "ServerState", ["model_weights", "finalizer_state", "aggregator_state", "round_num"])
ClientOutput = collections.namedtuple(
    "ClientOutput",
    ["update", "model_weights", "metrics", "num_examples", "dropped", "update_ratio"])

ARCHITECTURES = ("mlp", "conv")
SERVER_OPTIMIZERS = ("sgd", "adam")
# Adam's settings at `tff.learning.optimizers.build_adam`'s defaults.
ADAM_DEFAULTS = dict(server_beta_1=0.9, server_beta_2=0.999, server_epsilon=1e-7)
# Adam's server learning rate when --server_lr is unset, ours, measured: FedAvg on
# digits at the launcher's defaults (10 clients, 20 rounds), seeds 0 and 1, final S:
# lr 0.03: 0.958 / 0.947, 0.1: 0.956 / 0.947, 0.3: 0.924 / 0.931 (server SGD, lr 1:
# 0.940 / 0.940); 0.01 trailed at 10 rounds (0.911 vs SGD's 0.931, seed 0).
ADAM_DEFAULT_LR = 0.03
DEFAULT_SERVER_LR = dict(sgd=1.0, adam=ADAM_DEFAULT_LR)
# The server optimizer's and client momentum's settings and their defaults (the
# fields of `ModelConfig`, flags of `FedAvgConfig`).
OPTIMIZER_DEFAULTS = dict(server_optimizer="sgd",
                          server_momentum=0.0,
                          client_momentum=0.0,
                          **ADAM_DEFAULTS)
OPTIMIZER_SETTINGS = tuple(OPTIMIZER_DEFAULTS)


@dataclasses.dataclass(frozen=True)
class ModelConfig(base.ClientTraining):
  """Settings of the deterministic-model algorithms (FedAvg, FedProx, Local, Global).

  The network is `model` (the user's, `tfbfl.models`: a checked `ModelTemplate`,
  or a `MODULE:FUNCTION` string or builder from library callers) or, unset, the
  built-in `architecture`: "mlp" (`builders.MLP`, `Flatten` for image-shaped
  examples) or "conv" (`builders.ConvNet`, VIRTUAL's FEMNIST conv net, on
  `image_shape` images; `filters` per conv stage); `network_template` makes it
  (module docstring, "Models"). `mu` is FedProx's proximal
  strength (0 = FedAvg); the server step is `server_lr` (None: 1.0, plain model
  averaging) with `server_optimizer` ("sgd" with `server_momentum`, or "adam" with
  `server_beta_1`, `server_beta_2`, `server_epsilon`; `server_optimizer_fn`);
  `client_momentum` is the clients' SGD momentum (`FedAvgConfig` makes these flags);
  Local and Global use neither `mu` nor the server settings. `max_update_ratio` is the
  drop rule's bound (`tfbfl.algorithms.robust`). The common settings are
  `base.ClientTraining`'s.
  """
  input_dim: int
  num_classes: int
  activation: str = "relu"
  mu: float = 0.0  # FedProx's proximal strength (`FedProxConfig` makes it a flag)
  input_shape: Optional[Sequence[int]] = None  # None: (input_dim,)
  # Evaluation fits one temperature for S and one for MT on the clients' calibration
  # splits (`FedAvgConfig` makes it a flag; `tfbfl.temperature`).
  temperature_scaling: bool = False
  # The server optimizer and client momentum (`FedAvgConfig` makes them flags; Local
  # and Global take no server step and keep the defaults).
  server_optimizer: str = OPTIMIZER_DEFAULTS["server_optimizer"]
  server_momentum: float = OPTIMIZER_DEFAULTS["server_momentum"]
  server_beta_1: float = OPTIMIZER_DEFAULTS["server_beta_1"]
  server_beta_2: float = OPTIMIZER_DEFAULTS["server_beta_2"]
  server_epsilon: float = OPTIMIZER_DEFAULTS["server_epsilon"]
  client_momentum: float = OPTIMIZER_DEFAULTS["client_momentum"]

  @property
  def example_shape(self):
    return tuple(self.input_shape) if self.input_shape else (self.input_dim,)

  @classmethod
  def derived_defaults(cls, params):
    """`server_lr` unset: 1.0 (model averaging) for server SGD, `ADAM_DEFAULT_LR` for Adam."""
    out = super().derived_defaults(params)
    if params.get("server_lr") is None:
      out["server_lr"] = DEFAULT_SERVER_LR.get(params.get("server_optimizer"), 1.0)
    return out

  @property
  def server_step(self) -> float:
    """The server learning rate: `server_lr`; when unset, 1.0 (model averaging) for
    server SGD and `ADAM_DEFAULT_LR` for Adam."""
    if self.server_lr is None:
      return DEFAULT_SERVER_LR[self.server_optimizer]
    return float(self.server_lr)

  def server_optimizer_fn(self) -> tff.learning.optimizers.Optimizer:
    """The server optimizer (TFF's): `build_sgdm(server_step)` (with `server_momentum`
    when positive) or `build_adam(server_step, server_beta_1, server_beta_2,
    server_epsilon)`. Its state is `ServerState.finalizer_state` (checkpointed)."""
    if self.server_optimizer == "adam":
      return tff.learning.optimizers.build_adam(learning_rate=self.server_step,
                                                beta_1=self.server_beta_1,
                                                beta_2=self.server_beta_2,
                                                epsilon=self.server_epsilon)
    if self.server_momentum > 0:
      return tff.learning.optimizers.build_sgdm(learning_rate=self.server_step,
                                                momentum=self.server_momentum)
    # No momentum: exactly the optimizer (and state) of FedAvg before these settings.
    return tff.learning.optimizers.build_sgdm(learning_rate=self.server_step)

  def __post_init__(self):
    super().__post_init__()
    for name in ("input_dim", "num_classes"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}.")
    if self.model is None:  # a user's model replaces the architecture
      self.check_architecture(ARCHITECTURES, "the deterministic baselines")
    self.resolve_image_shape(self.example_shape)
    options.Option("float", "mu", low=0.0, high=options.MAX_WEIGHT).check(self.mu, "mu")
    check_optimizers({name: getattr(self, name) for name in OPTIMIZER_SETTINGS})


def check_optimizers(values) -> None:
  """The rules of `FedAvgConfig`'s optimizer settings (`values`: flag name -> value;
  missing ones are the defaults): momenta and betas in [0, 1), epsilon > 0, and no
  setting of the other server optimizer away from its default. One ValueError naming
  the flag. `ModelConfig` applies it to its fields, `FedAvgConfig.derived_defaults`
  to the flags (so the launcher refuses a bad combination while parsing them)."""
  v = dict(OPTIMIZER_DEFAULTS, **{k: x for k, x in values.items() if k in OPTIMIZER_DEFAULTS})
  if v["server_optimizer"] not in SERVER_OPTIMIZERS:
    raise ValueError(f"--server_optimizer must be one of {SERVER_OPTIMIZERS}, "
                     f"got {v['server_optimizer']!r}.")
  for name in ("server_momentum", "client_momentum", "server_beta_1", "server_beta_2"):
    value = options.Option("float", name, low=0.0, high=1.0).check(v[name], name)
    if value >= 1.0:
      raise ValueError(f"--{name} must be in [0, 1), got {value:g}.")
  options.Option("float", "eps", low=0.0, low_open=True,
                 high=1.0).check(v["server_epsilon"], "server_epsilon")
  if v["server_optimizer"] == "adam" and v["server_momentum"] != 0:
    raise ValueError(f"--server_momentum={v['server_momentum']:g} is server SGD's momentum; "
                     "--server_optimizer=adam takes --server_beta_1 instead.")
  if v["server_optimizer"] == "sgd":
    for name, default in ADAM_DEFAULTS.items():
      if v[name] != default:
        raise ValueError(f"--{name}={v[name]:g} is an Adam setting; it needs "
                         "--server_optimizer=adam.")


@dataclasses.dataclass(frozen=True)
class FedAvgConfig(ModelConfig):
  """`ModelConfig` with the server optimizer and client momentum as flags (FedAvg,
  FedProx, FedPA): `--server_optimizer=sgd --server_momentum=0.9` is FedAvgM (Hsu et
  al., 2019), `--server_optimizer=adam` FedAdam (Reddi et al., 2021)."""
  temperature_scaling: bool = base.temperature_scaling_option()
  server_optimizer: str = options.choice(
      "sgd", SERVER_OPTIMIZERS,
      "FedAvg family and FedPA: the server optimizer applied to the mean client delta "
      "(TFF's build_sgdm / build_adam; its state is checkpointed). sgd with "
      "--server_momentum > 0 is FedAvgM; adam is FedAdam (default --server_lr then "
      f"{ADAM_DEFAULT_LR:g}).")
  server_momentum: float = options.real(
      0.0, "FedAvg family and FedPA, --server_optimizer=sgd: server momentum beta in [0, 1) "
      "(m <- beta m + Delta, w <- w - server_lr m; 0: plain SGD). FedAvgM: e.g. 0.9; the FedPA "
      "authors' setting: --server_lr=0.5 --server_momentum=0.9 --client_momentum=0.9.",
      high=1.0)
  server_beta_1: float = options.real(ADAM_DEFAULTS["server_beta_1"],
                                      "--server_optimizer=adam: Adam's beta_1 in [0, 1) "
                                      "(TFF's default).",
                                      high=1.0)
  server_beta_2: float = options.real(ADAM_DEFAULTS["server_beta_2"],
                                      "--server_optimizer=adam: Adam's beta_2 in [0, 1) "
                                      "(TFF's default).",
                                      high=1.0)
  server_epsilon: float = options.real(ADAM_DEFAULTS["server_epsilon"],
                                       "--server_optimizer=adam: Adam's epsilon > 0 (TFF's "
                                       "default; Reddi et al.'s adaptivity tau).",
                                       low_open=True,
                                       high=1.0)
  client_momentum: float = options.real(
      0.0, "FedAvg family and FedPA: client SGD momentum beta in [0, 1) (m <- beta m + g, "
      "w <- w - client_lr m), the buffer reset to 0 every round; 0: plain SGD.",
      high=1.0)

  @classmethod
  def derived_defaults(cls, params):
    """`ModelConfig`'s, after `check_optimizers` on the flags (a bad combination is
    refused while the launcher parses them, before TensorFlow starts)."""
    check_optimizers(params)
    return super().derived_defaults(params)


@dataclasses.dataclass(frozen=True)
class FedProxConfig(FedAvgConfig):
  """`FedAvgConfig` with FedProx's proximal strength as a flag."""
  mu: float = options.real(0.01, "FedProx proximal strength mu.", high=options.MAX_WEIGHT)


def _as_model_weights(weights) -> tff.learning.models.ModelWeights:
  return tff.learning.models.ModelWeights(list(weights.trainable), list(weights.non_trainable))


def network_template(cfg: ModelConfig) -> "models.ModelTemplate":
  """The checked template of the network `cfg` trains (`builders.template_for`): the
  user's `cfg.model`, else the built-in `cfg.architecture` on the examples' own
  shape (`cfg.example_shape`) with the size settings."""
  return builders.config_template(cfg)


# What an algorithm does with the model's non-trainable weights (`weight_problem`).
AVERAGED = "averaged"  # FedAvg family: the server takes their weighted mean
PER_MODEL = "per_model"  # Local, Global: each trained model keeps its own
FROZEN_ONLY = "frozen_only"  # FOLA family: only those of frozen layers (never updated)


def weight_problem(model, label: str, who: str, non_trainable: str) -> Optional[str]:
  """Why `model` (a built Keras model of the `--model` labelled `label`) cannot be
  trained by `who`, or None. Trainable weights must be float32 (the algorithms'
  TFF types); non-trainable ones (e.g. BatchNormalization's moving statistics),
  by `non_trainable`: `AVERAGED` and `PER_MODEL` take any floating dtype;
  `FROZEN_ONLY` takes only the weights of layers with `trainable=False` (which
  training never changes), since the algorithm carries the trainable weights alone
  and rebuilds the rest from the seed."""
  flag = f"{models.MODEL_FLAG}={label}"
  for w in model.trainable_weights:
    if w.dtype != tf.float32:
      return (f"{flag}: {who} trains float32 weights; the trainable weight {w.name!r} is "
              f"{w.dtype.name}.")
  if non_trainable == FROZEN_ONLY:
    for layer in model.submodules:
      if (isinstance(layer, tf.keras.layers.Layer) and layer.trainable and
          not isinstance(layer, tf.keras.Model) and layer.non_trainable_weights):
        return (f"{flag}: {who} carries only the trainable weights (its Gaussians and "
                f"Fisher are over them), but the trainable layer {layer.name!r} "
                f"({type(layer).__name__}) holds non-trainable weights that training may "
                "update (such as BatchNormalization's moving statistics); use a model without "
                "them (e.g. LayerNormalization), freeze the layer (trainable=False), or train "
                "it with fedavg, which averages them.")
    return None
  for w in model.non_trainable_weights:
    if not w.dtype.is_floating:
      return (f"{flag}: {who} averages or keeps the non-trainable weights as floats; "
              f"{w.name!r} is {w.dtype.name}.")
  return None


def increment_round():
  """`tff.tensorflow.computation(int32) -> int32`: the round counter's `r + 1`."""
  return tff.tensorflow.computation(lambda r: r + 1, tff.TensorType(np.int32))


def train_metrics(client_output):
  """In a federated computation: {train: example-weighted mean of the clients'
  train metrics, num_examples: their sum, clients_dropped, update_ratio_max},
  all at SERVER (a dropped client has weight 0; 0 if all are dropped)."""
  return collections.OrderedDict(train=robust.federated_weighted_mean(client_output.metrics,
                                                                      client_output.num_examples),
                                 num_examples=tff.federated_sum(client_output.num_examples),
                                 **robust.drop_metrics(client_output.dropped,
                                                       client_output.update_ratio))


class ModelComputations:
  """TF computations over the deterministic model shared by FedAvg, FedProx, Local, Global.

  Attributes:
    template: the `tfbfl.models.ModelTemplate` of the network (`network_template`);
      every Keras model here is `template.build(config.seed)`, built inside the
      TFF computation that uses it.
    initial_weights: `tff.learning.models.ModelWeights` of numpy arrays, the
      seeded initial model (trainable and non-trainable weights).
    weights_type, seed_type, data_type: TFF types of the arguments below.
    eval_data_type: the evaluations' data: `data_type`, or with
      `temperature_scaling` `(x, y, x_calibration, y_calibration)`.
    client_update: `tff.tensorflow.computation(weights, seed, (x, y)) ->
      ClientOutput(update, model_weights, metrics, num_examples, dropped,
      update_ratio)`: E epochs of SGD from `weights` (the proximal anchor is
      `weights` too); `update` = `weights.trainable - new.trainable`,
      `num_examples` = n, `metrics` = {train_loss, train_accuracy}, means over
      the n * E examples visited (before each step's update). A dropped update
      (`tfbfl.algorithms.robust`; with `check_norm=False` only a non-finite
      one) gives `update` = 0, `model_weights` = `weights`, `num_examples` = 0,
      zero metrics and `dropped` = 1.
    score: `tff.tensorflow.computation(weights, (x, y)) -> {mt_loss, mt_correct,
      num_examples, mt_calibration}`: summed cross-entropy, number of correct
      predictions and reliability bins of one client's own model.
    predict_proba: `tff.tensorflow.computation(weights, x) -> p(y | x)` [n, classes].

  `build_client_update(delta_fn)` gives `client_update` with another upload
  (FedPA's hook, `tfbfl.algorithms.fedpa`): same training, metrics, MT weights
  and drop rule, `update` = `delta_fn(w^(t), iterate means per epoch)`.
  """

  def __init__(self,
               config: ModelConfig,
               check_norm: bool = True,
               who: str = "fedavg",
               non_trainable: str = AVERAGED):
    self.config = cfg = config
    self.check_norm = check_norm
    self.template = network_template(cfg)
    problems = []

    @tff.tensorflow.computation
    def initial_weights_fn():
      model = self._model()
      problems.append(weight_problem(model, self.template.label, who, non_trainable))
      return tff.learning.models.ModelWeights(list(model.trainable_weights),
                                              list(model.non_trainable_weights))

    if problems and problems[0]:
      raise models.ModelError(problems[0])
    self.initial_weights = _as_model_weights(initial_weights_fn())
    self.weights_type = tff.to_type(
        tff.learning.models.ModelWeights(
            [tff.TensorType(np.float32, w.shape) for w in self.initial_weights.trainable],
            [tff.TensorType(w.dtype, w.shape) for w in self.initial_weights.non_trainable]))
    self.seed_type = tff.TensorType(np.int64, [2])
    x_type = tff.TensorType(np.float32, [None, *cfg.example_shape])
    y_type = tff.TensorType(np.int32, [None])
    self.data_type = tff.to_type((x_type, y_type))
    # Evaluation data: the test split, then (temperature scaling) the calibration split.
    self.eval_data_type = (tff.to_type((x_type, y_type, x_type, y_type))
                           if cfg.temperature_scaling else self.data_type)

    client_update = self.build_client_update()

    @tff.tensorflow.computation(self.weights_type, self.data_type)
    def score(weights, data):
      return self._score("mt", _as_model_weights(weights), *data)

    @tff.tensorflow.computation(self.weights_type, x_type)
    def predict_proba(weights, x):
      return tf.nn.softmax(self._logits(_as_model_weights(weights), x))

    self.x_type = x_type
    self.client_update, self.score, self.predict_proba = client_update, score, predict_proba

  def build_client_update(self, delta_fn=None, *, with_round: bool = False):
    """`client_update` (see the class docstring), its upload given by `delta_fn`.

    Args:
      delta_fn: None: `update = w^(t) - w_last` (FedAvg, FedProx). Otherwise a
        graph function `(w0, means, w_last) -> update` of lists over the trainable
        weights: `w0[j]` the start `w^(t)`, `means[j]` of shape `[E, *w0[j].shape]`
        with `means[j][e]` = the mean of the iterates after each SGD step of
        epoch e (IASG samples; `w0` for a client without examples), `w_last[j]`
        the last iterate. The loop then also carries these per-epoch sums (E
        copies of the weights).
      with_round: the computation takes a fourth argument, the server's round
        counter (int32, rounds done), passed to `delta_fn` as `round_num=`
        (`build_next(..., with_round=True)` broadcasts it).
    """
    if with_round:

      @tff.tensorflow.computation(self.weights_type, self.seed_type, self.data_type,
                                  tff.TensorType(np.int32))
      def client_update_at(weights, seed, data, round_num):
        delta = lambda w0, means, w_last: delta_fn(w0, means, w_last, round_num=round_num)
        return self._train(_as_model_weights(weights), seed, *data, delta_fn=delta)

      return client_update_at

    @tff.tensorflow.computation(self.weights_type, self.seed_type, self.data_type)
    def client_update(weights, seed, data):
      return self._train(_as_model_weights(weights), seed, *data, delta_fn=delta_fn)

    return client_update

  # --------------------------------------------------------------- helpers
  def _model(self) -> tf.keras.Model:
    """A new Keras model of the network, seeded by the run (it reads the examples
    as the data hold them: the presets flatten or reshape them themselves)."""
    return self.template.build(self.config.seed)

  @staticmethod
  def _assign(model, weights):
    for v, w in zip(model.trainable_weights, weights.trainable):
      v.assign(w)
    for v, w in zip(model.non_trainable_weights, weights.non_trainable):
      v.assign(w)

  def _train(self, weights, seed, x, y, delta_fn=None):
    cfg = self.config
    model = self._model()

    @tf.function(autograph=False)
    def train():
      self._assign(model, weights)
      variables = model.trainable_weights
      n = tf.shape(y)[0]
      # The shared minibatch schedule (one client): fixed-size batches, the last
      # one of an epoch masked; the masked mean is the short batch's mean.
      schedule = client_batch.MinibatchSchedule(seed[None], n[None], n, cfg.epochs, cfg.batch_size)

      # Client momentum (`client_momentum` > 0): the buffers m ride in the loop's
      # carry next to the epoch sums, zeros at the start of every round.
      momentum = cfg.client_momentum

      def step_fn(carry, xb, yb, mask, step):
        params, velocity = carry if momentum > 0 else (carry, None)
        with tf.GradientTape() as tape:
          loss, size, correct = client_batch.masked_cross_entropy(model(xb, training=True), yb,
                                                                  mask)
        grads = tape.gradient(loss, variables)
        if cfg.mu > 0:  # gradient of mu/2 ||w - w^(t)||^2
          grads = [g + cfg.mu * (v - w0) for g, v, w0 in zip(grads, variables, weights.trainable)]
        if momentum > 0:  # m <- beta m + g; the step is client_lr * m
          grads = velocity = [momentum * m + g for m, g in zip(velocity, grads)]
        with tf.control_dependencies(
            [v.assign_sub(cfg.client_lr * g) for v, g in zip(variables, grads)]):
          if delta_fn is not None:  # add the new iterate to its epoch's sum
            epoch = tf.reshape(step // schedule.steps_per_epoch[0], [1, 1])
            params = [
                tf.tensor_scatter_nd_add(s, epoch,
                                         v.read_value()[None]) for s, v in zip(params, variables)
            ]
          if momentum > 0:
            params = (params, [tf.identity(m) for m in velocity])
          return params, (loss * size, tf.identity(correct))

      zero = tf.zeros([1])
      sums = () if delta_fn is None else [
          tf.zeros([1, cfg.epochs, *w.shape], w.dtype) for w in weights.trainable
      ]
      if momentum > 0:
        sums = (sums, [tf.zeros([1, *w.shape], w.dtype) for w in weights.trainable])
      sums, (loss_sum, correct_sum) = client_batch.train_loop(schedule, x[None], y[None], sums,
                                                              step_fn, (zero, zero))
      if momentum > 0:
        sums = sums[0]
      loss_sum, correct_sum = loss_sum[0], correct_sum[0]
      new_weights = tff.learning.models.ModelWeights(
          [tf.identity(v) for v in model.trainable_weights],
          [tf.identity(v) for v in model.non_trainable_weights])
      if delta_fn is None:
        update = [w0 - w for w0, w in zip(weights.trainable, new_weights.trainable)]
      else:  # every epoch has steps_per_epoch steps; none at all when n = 0
        count = tf.cast(schedule.steps_per_epoch[0], tf.float32)
        means = [
            tf.where(n > 0, s[0] / count, tf.broadcast_to(w0[None], s[0].shape))
            for s, w0 in zip(sums, weights.trainable)
        ]
        update = list(delta_fn(list(weights.trainable), means, list(new_weights.trainable)))
      # Robust rounds: drop a non-finite or outlying update (robust.check_update).
      ok, ratio = robust.check_update(update,
                                      weights.trainable,
                                      cfg.max_update_ratio,
                                      check_norm=self.check_norm)
      ok = tf.logical_and(ok, robust.all_finite(new_weights.non_trainable))
      update = robust.zeros_unless(ok, update)
      new_weights = robust.keep_if(ok, new_weights, weights)
      seen = tf.maximum(tf.cast(n * cfg.epochs, tf.float32), 1.0)  # n = 0: metrics 0, not NaN
      metrics = robust.zeros_unless(
          ok, collections.OrderedDict(train_loss=loss_sum / seen,
                                      train_accuracy=correct_sum / seen))
      num_examples = tf.where(ok, tf.cast(n, tf.float32), 0.0)
      return ClientOutput(update, new_weights, metrics, num_examples, 1.0 - tf.cast(ok, tf.float32),
                          ratio)

    return train()

  def _logits(self, weights, x):
    """The model with `weights` applied to `x` (a fresh Keras model; `tf.function`
    orders the assignments before the call in TFF's graph)."""
    model = self._model()

    @tf.function(autograph=False)
    def run():
      self._assign(model, weights)
      return model(x, training=False)

    return run()

  def _score(self, prefix, weights, x, y, x_calibration=None, y_calibration=None):
    """`{prefix}_loss` (summed cross-entropy), `{prefix}_correct`, `num_examples` and
    `{prefix}_calibration` (`tfbfl.metrics`); given a calibration split, also the grids
    that fit one temperature over the clients (`tfbfl.temperature.select`)."""
    logits = self._logits(weights, x)
    out = metrics_lib.logit_sums(logits, y, prefix)
    out["num_examples"] = tf.cast(tf.shape(y)[0], tf.float32)
    if x_calibration is not None:
      out.update(temperature.fit_sums(prefix, logits, y, self._logits(weights, x_calibration),
                                      y_calibration))
    return out

  # -------------------------------------------------- federated evaluation
  def build_evaluate(self):
    """`federated_computation(server_weights@SERVER, client_weights@CLIENTS,
    test_data@CLIENTS)` -> per-client sums {server_loss, server_correct, mt_loss,
    mt_correct, num_examples}@CLIENTS (the evaluation protocol of
    `tfbfl.round_loop`)."""

    @tff.tensorflow.computation(self.weights_type, self.weights_type, self.eval_data_type)
    def client_eval(server_weights, own_weights, data):
      out = self._score("server", _as_model_weights(server_weights), *data)
      out.update(self._score("mt", _as_model_weights(own_weights), *data))
      return out

    @tff.federated_computation(tff.FederatedType(self.weights_type, tff.SERVER),
                               tff.FederatedType(self.weights_type, tff.CLIENTS),
                               tff.FederatedType(self.eval_data_type, tff.CLIENTS))
    def evaluate_fn(server_weights, client_weights, data):
      return tff.federated_map(client_eval,
                               (tff.federated_broadcast(server_weights), client_weights, data))

    return evaluate_fn

  def build_streamed_evaluate(self):
    """The driver's streamed evaluation (`tfbfl.round_loop`), two federated
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
      out = self._score(prefix, _as_model_weights(weights), *data)
      out["client_index"] = client_index
      return out

    @tff.tensorflow.computation(self.weights_type, index_type, self.eval_data_type)
    def server_eval(server_weights, client_index, data):
      return sums("server", server_weights, client_index, data)

    @tff.tensorflow.computation(self.weights_type, index_type, self.eval_data_type)
    def own_eval(own_weights, client_index, data):
      return sums("mt", own_weights, client_index, data)

    def over_clients(placement, comp):
      """`comp` mapped over the clients, the weights at `placement` (SERVER: broadcast)."""

      @tff.federated_computation(tff.FederatedType(self.weights_type, placement),
                                 tff.FederatedType(index_type, tff.CLIENTS),
                                 tff.FederatedType(self.seed_type, tff.CLIENTS),
                                 tff.FederatedType(self.eval_data_type, tff.CLIENTS))
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

  # ------------------------------------------------------------- export
  def _export_kwargs(self, info, name):
    cfg = self.config
    return dict(input_shape=cfg.example_shape,
                input_dtype="float32",
                num_classes=cfg.num_classes,
                info=dict(info or {}, samples=0),
                name=name)

  def predictor(self, weights, info=None, name="model"):
    """`weights` (`ModelWeights`) as a `tfbfl.export` predictor computing what
    `score` computes: the model's logits on `x`,
    probabilities `softmax(logits)`, predictions `argmax(logits)`."""
    with predictor_lib.eager_scope():  # Keras functional models (see there)
      model = self._model()
    self._assign(model, _as_model_weights(weights))  # exact copies

    def forward(x):
      logits = model(x, training=False)
      return tf.nn.softmax(logits), tf.argmax(logits, -1, output_type=tf.int32)

    return predictor_lib.make_predictor(forward,
                                 variables=model.variables,
                                 **self._export_kwargs(info, name))

  def ensemble_predictor(self, weights_list, info=None, name="ensemble"):
    """The uniform ensemble of the models `weights_list` as a `tfbfl.export`
    predictor: `p = (sum_k softmax(f(x; w_k))) / K`, summed in list order (as
    `numpy.mean` over the list does), predictions `argmax p`. When the network
    is a `Sequential` stack of `Dense` layers (the MLP, or a user's model of that
    form; a leading `Flatten` allowed), the K models are stacked (one variable
    per layer parameter, `[K, ...]`) and applied in a `tf.while_loop` with the
    ops of Keras' `Dense` (graph size independent of K); other networks hold K
    Keras models."""
    weights_list = [_as_model_weights(w) for w in weights_list]
    k = len(weights_list)
    if k == 0:
      raise ValueError("an ensemble needs at least one model.")
    with predictor_lib.eager_scope():  # Keras functional models (see there)
      template = self._model()
    dense = _dense_stack(template)
    if dense is not None:
      if len(template.trainable_weights) != 2 * len(dense) or any(
          w.non_trainable for w in weights_list):
        raise ValueError("the stacked ensemble needs a stack of Dense layers.")
      stacked = [
          tf.Variable(np.stack([np.asarray(w.trainable[j], np.float32) for w in weights_list]),
                      trainable=False,
                      name=f"stacked_{j}") for j in range(2 * len(dense))
      ]

      def logits_of(x, j):
        h = x
        for l, layer in enumerate(dense):
          h = tf.nn.bias_add(tf.matmul(h, tf.gather(stacked[2 * l], j)),
                             tf.gather(stacked[2 * l + 1], j))
          if layer.activation is not None:
            h = layer.activation(h)
        return h

      def forward(x):
        x = tf.reshape(x, [tf.shape(x)[0], -1])  # the stack's Flatten, if any
        total = tf.nn.softmax(logits_of(x, 0))
        _, total = tf.while_loop(lambda j, _: j < k, lambda j, t:
                                 (j + 1, t + tf.nn.softmax(logits_of(x, j))),
                                 (tf.constant(1), total))
        p = total / tf.constant(k, tf.float32)
        return p, tf.argmax(p, -1, output_type=tf.int32)

      variables = stacked
    else:
      members = []
      for w in weights_list:
        with predictor_lib.eager_scope():  # Keras functional models (see there)
          m = self._model()
        self._assign(m, w)
        members.append(m)

      def forward(x):
        total = None
        for m in members:
          p = tf.nn.softmax(m(x, training=False))
          total = p if total is None else total + p
        p = total / tf.constant(k, tf.float32)
        return p, tf.argmax(p, -1, output_type=tf.int32)

      variables = [v for m in members for v in m.variables]
    info = dict(info or {}, members=k)
    return predictor_lib.make_predictor(forward, variables=variables, **self._export_kwargs(info, name))


def _dense_stack(model) -> Optional[list]:
  """The `Dense` layers of `model` when it is a `Sequential` of `Dense` layers with
  biases on flat inputs (a leading `Flatten` allowed) and no non-trainable weights;
  else None."""
  if not isinstance(model, tf.keras.Sequential) or model.non_trainable_weights:
    return None
  layers = list(model.layers)
  if layers and isinstance(layers[0], tf.keras.layers.Flatten):
    layers = layers[1:]
  elif len(model.inputs[0].shape) != 2:
    return None
  dense = lambda l: type(l) is tf.keras.layers.Dense  # pylint: disable=unidiomatic-typecheck
  if not layers or not all(dense(l) and l.use_bias for l in layers):
    return None
  return layers


class FedAvgAlgorithm:
  """FedAvg (`mu = 0`) and FedProx (`mu > 0`) in the protocol of `tfbfl.round_loop`.

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
  from tfbfl import round_loop, runtime, driver
  runtime.set_local_runtime()
  p = driver.resolve_params(dict(algorithm="fedprox", mu=0.01, rounds=5))
  data = driver.load_data(p)
  algo = driver.build_algorithm(data, p)      # FedAvgAlgorithm(name="fedprox")
  summary = round_loop.ExperimentRunner(algo, data, round_loop.RunConfig(rounds=5)).run()
  ```
  """

  def __init__(self, config: ModelConfig, name: str = "fedavg"):
    self.config = config
    self.name = name
    self.computations = comps = ModelComputations(config, who=name)
    weights_type = comps.weights_type
    distributor = tff.learning.templates.build_broadcast_process(weights_type)
    # no_nan_division: a round whose clients were all dropped averages to 0.
    aggregation = tff.aggregators.MeanFactory(no_nan_division=True).create(
        weights_type.trainable, tff.TensorType(np.float32))
    finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
        config.server_optimizer_fn(), weights_type)
    self._distributor, self._aggregation, self._finalizer = distributor, aggregation, finalizer
    self.next = self.build_next(comps.client_update)
    self._evaluate = comps.build_evaluate()
    self._evaluate_server_fn, self._evaluate_clients_fn = comps.build_streamed_evaluate()

  def build_next(self, client_update, *, with_round: bool = False):
    """The round computation `next` (see the class docstring) with `client_update`
    (a `ModelComputations.client_update`-typed computation) as the client work;
    FedPA's hook (`tfbfl.algorithms.fedpa`): the same server step on another upload.
    `with_round`: `client_update` also takes the server's round counter
    (`ModelComputations.build_client_update(..., with_round=True)`)."""
    comps, weights_type = self.computations, self.computations.weights_type
    distributor, aggregation, finalizer = self._distributor, self._aggregation, self._finalizer
    server_state_type = tff.to_type(
        ServerState(weights_type, finalizer.initialize.type_signature.result.member,
                    aggregation.initialize.type_signature.result.member, tff.TensorType(np.int32)))

    @tff.tensorflow.computation(tff.TensorType(np.float32), weights_type, weights_type)
    def keep_previous_if_dropped(dropped, new, previous):
      return robust.keep_if(dropped < 0.5, _as_model_weights(new), _as_model_weights(previous))

    # Non-trainable weights (e.g. BatchNormalization's moving statistics): the server
    # adds the example-weighted mean of the clients' changes (module docstring).
    average_non_trainable = len(weights_type.non_trainable) > 0
    if average_non_trainable:

      @tff.tensorflow.computation(weights_type, weights_type)
      def non_trainable_change(new, start):
        return [n - w for n, w in zip(new.non_trainable, start.non_trainable)]

      @tff.tensorflow.computation(weights_type, weights_type.non_trainable)
      def add_non_trainable(weights, change):
        return tff.learning.models.ModelWeights(
            list(weights.trainable), [w + d for w, d in zip(weights.non_trainable, change)])

    @rounds.round_computation(server_state_type, weights_type, comps.seed_type, comps.data_type)
    def next_fn(server_state, client_states, seeds, data):
      # Every selected client starts from the server model; a dropped one keeps
      # its previous state (deployed model).
      dist = distributor.next(distributor.initialize(), server_state.model_weights)
      if with_round:
        round_num = tff.federated_broadcast(server_state.round_num)
        out = tff.federated_map(client_update, (dist.result, seeds, data, round_num))
      else:
        out = tff.federated_map(client_update, (dist.result, seeds, data))
      kept = tff.federated_map(keep_previous_if_dropped,
                               (out.dropped, out.model_weights, client_states))
      agg = aggregation.next(server_state.aggregator_state, out.update, out.num_examples)
      fin = finalizer.next(server_state.finalizer_state, server_state.model_weights, agg.result)
      new_weights = fin.result  # the optimizer's step on the trainable weights
      if average_non_trainable:  # a dropped client changed nothing and has weight 0
        change = tff.federated_map(non_trainable_change, (out.model_weights, dist.result))
        new_weights = tff.federated_map(
            add_non_trainable,
            (new_weights, robust.federated_weighted_mean(change, out.num_examples)))
      new_state = tff.federated_zip(
          ServerState(new_weights, fin.state, agg.state,
                      tff.federated_map(increment_round(), server_state.round_num)))
      metrics = tff.federated_zip(
          collections.OrderedDict(**train_metrics(out),
                                  update_non_finite=fin.measurements.update_non_finite))
      return new_state, kept, metrics

    return next_fn

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

  # The driver's streamed evaluation (tfbfl.round_loop): S from the server model
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

  # ------------------------------------------------- tff.learning process
  # `base.SupportsLearningProcess`: stateless clients; the model is w^(t).
  stateful_clients = False

  @property
  def learning_round(self):
    return self.next

  def model_weights(self, server_state):
    weights = server_state.model_weights
    return weights.trainable, weights.non_trainable

  def with_model_weights(self, server_state, trainable, non_trainable):
    return server_state._replace(
        model_weights=tff.learning.models.ModelWeights(list(trainable), list(non_trainable)))

  # ------------------------------------------------------------- export
  # Hooks of `tfbfl.export.export_run` (deterministic models: `samples` and
  # `seed` are not used).
  export_server_needs_clients = False

  def server_predictor(self, server_state, *, samples: Optional[int] = None, seed: int = 0):
    """The model metric S evaluates: the server weights w^(t)."""
    del samples, seed
    return self.computations.predictor(server_state.model_weights,
                                       info=dict(metric="S", model="server weights"),
                                       name="server")

  def client_predictor(self,
                       server_state,
                       client_state,
                       *,
                       samples: Optional[int] = None,
                       seed: int = 0,
                       reuse=None):
    """The model metric MT evaluates for this client: its deployed weights (after
    its last local training; the initial server model if never selected)."""
    del server_state, samples, seed, reuse  # a new Keras model is cheap to trace
    return self.computations.predictor(
        client_state,
        info=dict(metric="MT",
                  model="the client's deployed weights (after its last local training; the "
                  "initial model if never selected)"),
        name="client")


registry.register(
    registry.AlgorithmSpec(
        "fedavg", FedAvgConfig, lambda data, config, run: FedAvgAlgorithm(config, name="fedavg"),
        "FedAvg (McMahan et al., 2017): server SGD on the mean client model delta.",
        algorithm_cls=FedAvgAlgorithm))
registry.register(
    registry.AlgorithmSpec(
        "fedprox", FedProxConfig, lambda data, config, run: FedAvgAlgorithm(config, name="fedprox"),
        "FedProx (Li et al., 2020): FedAvg with the proximal term mu/2 ||w - w_server||^2.",
        algorithm_cls=FedAvgAlgorithm))

"""PFNM in TFF: local training of J independent MLPs, one-shot upload, matching.

Probabilistic Federated Neural Matching (Yurochkin et al., ICML 2019,
``shared/papers/pfnm.txt``) is a one-shot method: every client trains its own
deterministic ReLU MLP on its own data, uploads the trained weights and its
per-class label counts once, and the server matches the hidden neurons of all
clients with the Beta-Bernoulli-process model (``tfbfl.matching``, pure
numpy/scipy) into one global network.

This module holds everything that is not the matching engine:

* ``LocalTrainingConfig``: the batch-network training of the paper's Table 1
  (Adam, minibatch 32, 10 epochs, weights ``N(0, 0.01)``, biases 0.1, L2).
* ``LocalTrainer``: the TFF computations.  ``train`` is one
  ``tff.federated_computation`` that maps a client ``tff.tensorflow.computation``
  over the clients; client data enter as in-memory tensors ``(x, y)`` placed at
  CLIENTS, together with per-client int64 ``[2]`` seeds for the stateless
  initialisation and shuffling (TFF forbids graph-level seeds).  The clients
  return their trained weights and class counts: exactly what PFNM's server
  needs, and the only client information it receives.  ``train_from`` starts
  the clients from given weights (streaming PFNM, sequential ensembles) and
  ``dsgd_round`` broadcasts server weights and returns their example-weighted
  mean (downpour SGD baseline).
* ``match_networks``: the global network from the engine (single or multilayer).
* ``forward``, ``accuracy``, ``model_size``: numpy evaluation of any ReLU MLP.
* ``hidden_units_of_model``: the widths of a user's Keras model
  (``--model=MODULE:FUNCTION``, ``tfbfl.models``), the clients' networks then.

A user's model (the PFNM launchers' ``--model``) must be the network PFNM
matches: a stack of ``Dense`` layers on flat inputs (a ``Flatten`` first for
image-shaped examples), ReLU hidden layers with biases and linear logits, any
depth and widths (``tfbfl.models.dense_widths``); anything else is refused in one
``tfbfl.models.ModelError`` line naming --model and the first offending layer.
Only its widths are read: the clients' networks are initialised and trained as
above (Table 1's initialisation, Adam, L2), so a model spelling the default
widths out is the default run, to the last digit.

Choices this implementation makes explicit:

* Weight initialisation.  Table 1 writes ``N(0, 0.01)``.  The paper's own
  notation puts the *variance* second (``N(mu_0, Sigma_0)``, ``N(T, Sigma_j)``
  with ``sigma^2``), so ``0.01`` is read as a variance: ``init_std = 0.1``.
  The PyTorch call ``normal_(0, 0.01)`` would mean a standard deviation of
  0.01; pass ``init_std=0.01`` (``--init_std=0.01``) for that reading.
* L2 regularisation as PyTorch's Adam ``weight_decay`` (the paper's software):
  ``l2 * w`` is added to the gradient of every parameter (kernels and biases),
  i.e. the loss gains ``l2 / 2 * ||w||^2``.
* Adam with PyTorch's defaults (``beta1 = 0.9``, ``beta2 = 0.999``,
  ``eps = 1e-8``, bias correction), written on plain tensors in a
  ``tf.while_loop`` (no Keras, no variables): the fastest client loop here and
  free of the Keras-inside-TFF pitfalls of the SPEC.  Optimizer state starts
  at zero in every call.
* Minibatches: each epoch is a stateless random permutation of the client's
  examples cut into batches of ``batch_size``; the last batch may be smaller
  (PyTorch's ``drop_last=False``).
* Initialisation seeds: client ``j`` of trial ``seed`` initialises from
  ``[seed, 1_000_003 + j]`` (independent) or, with ``shared_init``, all
  clients from ``[seed, 1_000_003]``; shuffling uses ``[seed, 2_000_006 + j]``.

#### Examples

```python
from tfbfl import data, runtime
from tfbfl.algorithms import pfnm

runtime.set_local_runtime()
fd = data.load_federated("digits", partition="class_dirichlet", num_clients=5,
                         alpha=0.2, seed=0)
cfg = pfnm.LocalTrainingConfig(input_dim=64, num_classes=10, hidden_units=(100,))
trainer = pfnm.LocalTrainer(cfg)
clients = trainer.train([fd.train[c] for c in fd.client_ids], seed=0)
glob = pfnm.match_networks([c.weights for c in clients],
                           [c.class_counts for c in clients])
x, y = fd.pooled("test")
print(pfnm.accuracy(glob, x, y), pfnm.model_size(glob))
```

#### References

Yurochkin, Agarwal, Ghosh, Greenewald, Hoang, Khazaeni. Bayesian Nonparametric
Federated Learning of Neural Networks. ICML 2019.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from tfbfl import _lazy
from tfbfl.matching import MatchingHyperparams, pfnm_multilayer, pfnm_single_layer

# TensorFlow loads when a client trains (`tfbfl._lazy`), so the PFNM launchers check
# their flags before it starts.
tf = _lazy.load("tensorflow")
client_batch = _lazy.load("tfbfl.algorithms.client_batch")

__all__ = [
    "LocalTrainingConfig",
    "ClientResult",
    "LocalTrainer",
    "Network",
    "init_seeds",
    "shuffle_seeds",
    "initial_weights",
    "train_tensors",
    "match_networks",
    "forward",
    "predict_proba",
    "accuracy",
    "cross_entropy",
    "model_size",
    "check_client_data",
    "hidden_units_of_model",
]

# A network is a list of (W (n_in, n_out), b (n_out,)) pairs, input layer first;
# this is the matching engine's multilayer format.
Network = List[Tuple[np.ndarray, np.ndarray]]

_INIT_SALT = 1_000_003
_SHUFFLE_SALT = 2_000_006


@dataclasses.dataclass(frozen=True)
class LocalTrainingConfig:
  """Training of the clients' (batch) networks; defaults are the paper's Table 1
  for MNIST except the hidden width (main text: 100 neurons).

  Attributes:
    input_dim: number of input features ``D``.
    num_classes: number of classes ``K``.
    hidden_units: widths of the hidden layers (``C = len(hidden_units) >= 1``).
    epochs: local epochs (>= 0; 0 returns the initial weights).
    batch_size: minibatch size.
    learning_rate: Adam step size.
    l2: L2 coefficient, PyTorch ``weight_decay`` semantics (see module doc).
    init_std: standard deviation of the kernel initialisation (0.1 = Table 1's
      ``N(0, 0.01)`` read as a variance; see module doc).
    bias_init: initial value of every bias.
    shared_init: all clients start from the same weights (FedAvg's setting);
      default False (PFNM needs no shared initialisation).
    beta1, beta2, adam_epsilon: Adam constants.
  """

  input_dim: int
  num_classes: int
  hidden_units: Tuple[int, ...] = (100,)
  epochs: int = 10
  batch_size: int = 32
  learning_rate: float = 0.01
  l2: float = 1e-6
  init_std: float = 0.1
  bias_init: float = 0.1
  shared_init: bool = False
  beta1: float = 0.9
  beta2: float = 0.999
  adam_epsilon: float = 1e-8

  def __post_init__(self):
    object.__setattr__(self, "hidden_units", tuple(int(h) for h in self.hidden_units))
    for name in ("input_dim", "num_classes", "batch_size"):
      value = getattr(self, name)
      if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not self.hidden_units or min(self.hidden_units) < 1:
      raise ValueError(f"hidden_units must be a non-empty list of positive ints, "
                       f"got {self.hidden_units!r}")
    if isinstance(self.epochs, bool) or int(self.epochs) != self.epochs or self.epochs < 0:
      raise ValueError(f"epochs must be an int >= 0, got {self.epochs!r}")
    for name in ("learning_rate", "init_std", "adam_epsilon"):
      value = getattr(self, name)
      if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if not np.isfinite(self.l2) or self.l2 < 0:
      raise ValueError(f"l2 must be a finite number >= 0, got {self.l2!r}")
    if not np.isfinite(self.bias_init):
      raise ValueError(f"bias_init must be finite, got {self.bias_init!r}")
    for name in ("beta1", "beta2"):
      if not 0 <= getattr(self, name) < 1:
        raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")

  @property
  def layer_shapes(self) -> List[Tuple[int, int]]:
    """``(n_in, n_out)`` of every dense layer, input layer first."""
    widths = [self.input_dim, *self.hidden_units, self.num_classes]
    return list(zip(widths[:-1], widths[1:]))


class ClientResult(NamedTuple):
  """What one client uploads after local training (plus its own diagnostics).

  Attributes:
    weights: trained network, list of ``(W, b)`` float32 pairs.
    class_counts: ``(K,)`` int64 per-class example counts ``n_jk``.
    num_examples: number of training examples.
    initial_loss: mean training cross-entropy at the initial weights.
    final_loss: mean training cross-entropy at the trained weights.
  """

  weights: Network
  class_counts: np.ndarray
  num_examples: int
  initial_loss: float
  final_loss: float


# ------------------------------------------------------------------- seeds
def init_seeds(seed: int, num_clients: int, shared: bool) -> np.ndarray:
  """``(J, 2)`` int64 stateless initialisation seeds (identical rows if
  ``shared``)."""
  offsets = np.zeros(num_clients, np.int64) if shared else np.arange(num_clients) + 1
  return np.stack([np.full(num_clients, seed, np.int64), _INIT_SALT + offsets], axis=1)


def shuffle_seeds(seed: int, num_clients: int) -> np.ndarray:
  """``(J, 2)`` int64 stateless shuffling seeds, one per client."""
  return np.stack([
      np.full(num_clients, seed, np.int64), _SHUFFLE_SALT + np.arange(num_clients, dtype=np.int64)
  ],
                  axis=1)


# ------------------------------------------------------------- TF building blocks
def _initial_tensors(cfg: LocalTrainingConfig, seed) -> List[tf.Tensor]:
  """Flat ``[W1, b1, ..., W_{C+1}, b_{C+1}]`` from a ``[2]`` int64 seed."""
  out = []
  for l, (n_in, n_out) in enumerate(cfg.layer_shapes):
    layer_seed = tf.random.experimental.stateless_fold_in(seed, l)
    out.append(cfg.init_std * tf.random.stateless_normal([n_in, n_out], seed=layer_seed))
    out.append(tf.fill([n_out], tf.constant(cfg.bias_init, tf.float32)))
  return out


def initial_weights(cfg: LocalTrainingConfig, seed) -> Network:
  """The initial network of a client with stateless seed ``seed`` (``[2]`` ints),
  the same values the TFF client computation starts from."""
  flat = _initial_tensors(cfg, tf.constant(np.asarray(seed, np.int64)))
  return _unflatten([t.numpy() for t in flat])


def _logits(flat, x):
  h = x
  n_layers = len(flat) // 2
  for l in range(n_layers):
    h = tf.matmul(h, flat[2 * l]) + flat[2 * l + 1]
    if l < n_layers - 1:
      h = tf.nn.relu(h)
  return h


def _mean_ce(flat, x, targets):
  return tf.reduce_mean(
      tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=_logits(flat, x)))


def train_tensors(cfg: LocalTrainingConfig, flat, seed, x, targets, epochs=None):
  """Adam on the mean cross-entropy to ``targets`` (graph or eager TF).

  Args:
    cfg: ``LocalTrainingConfig`` (batch size, Adam, L2).
    flat: initial ``[W1, b1, ...]`` float32 tensors.
    seed: ``[2]`` int64 seed of the per-epoch stateless shuffles.
    x: ``(n, D)`` float32 inputs.
    targets: ``(n, K)`` float32 target distributions (one-hot labels, or the
      teacher's probabilities for knowledge distillation).
    epochs: number of epochs (default ``cfg.epochs``).

  Returns:
    The trained flat list of tensors.
  """
  epochs = cfg.epochs if epochs is None else int(epochs)
  flat = [tf.convert_to_tensor(t, tf.float32) for t in flat]
  n = tf.shape(x)[0]
  # The shared minibatch schedule (one client): the per-epoch stateless shuffles,
  # the last batch of an epoch padded and masked (its masked mean is the short batch's).
  schedule = client_batch.MinibatchSchedule(
      tf.convert_to_tensor(seed, tf.int64)[None], n[None], n, epochs, cfg.batch_size)
  b1, b2 = cfg.beta1, cfg.beta2

  def step_fn(params, xb, tb, mask, step):
    ws, ms, vs = params
    with tf.GradientTape() as tape:
      tape.watch(ws)
      ce = tf.nn.softmax_cross_entropy_with_logits(labels=tb, logits=_logits(list(ws), xb))
      loss = tf.reduce_sum(mask * ce) / tf.maximum(tf.reduce_sum(mask), 1.0)
    grads = tape.gradient(loss, ws)
    t = tf.cast(step + 1, tf.float32)
    corr1, corr2 = 1.0 - tf.pow(b1, t), 1.0 - tf.pow(b2, t)
    new_w, new_m, new_v = [], [], []
    for w, g, m, v in zip(ws, grads, ms, vs):
      if cfg.l2:
        g = g + cfg.l2 * w
      m = b1 * m + (1.0 - b1) * g
      v = b2 * v + (1.0 - b2) * tf.square(g)
      w = w - cfg.learning_rate * (m / corr1) / (tf.sqrt(v / corr2) + cfg.adam_epsilon)
      new_w.append(w)
      new_m.append(m)
      new_v.append(v)
    return (tuple(new_w), tuple(new_m), tuple(new_v)), ()

  one = lambda ts: tuple(t[None] for t in ts)
  zeros = [tf.zeros_like(w) for w in flat]
  (trained, _, _), _ = client_batch.train_loop(schedule, x[None], targets[None],
                                               (one(flat), one(zeros), one(zeros)), step_fn, ())
  return [w[0] for w in trained]


# ------------------------------------------------------------------ TFF trainer
class LocalTrainer:
  """The clients' local training as TFF computations.

  All computations take, at CLIENTS, a ``[2]`` int64 shuffle seed and the
  client's training data ``(x float32 (n, D), y int32 (n,))`` as in-memory
  tensors, and return at CLIENTS an ``OrderedDict(weights, class_counts,
  num_examples, initial_loss, final_loss)``.

  Attributes (TFF computations, each built on first use):
    train_fn: ``(init_seeds@CLIENTS, seeds@CLIENTS, data@CLIENTS)``; each client
      initialises from its own seed and trains ``cfg.epochs`` epochs.
    train_from_fn: ``(weights@CLIENTS, seeds@CLIENTS, data@CLIENTS)``; each
      client starts from the given weights.
    dsgd_round_fn: ``(weights@SERVER, seeds@CLIENTS, data@CLIENTS)``; the
      weights are broadcast, every client trains from them, and the server gets
      the example-weighted mean of the trained weights (one communication).

  The returned CLIENTS-placed values are the clients' one-shot upload: PFNM
  needs every client's individual network (TFF 0.87 has no
  ``federated_collect``), so the driver receives them as a per-client list.
  """

  def __init__(self, config: LocalTrainingConfig):
    self.config = config
    self._computations = {}

  @property
  def train_fn(self):
    return self._computation("train_fn")

  @property
  def train_from_fn(self):
    return self._computation("train_from_fn")

  @property
  def dsgd_round_fn(self):
    return self._computation("dsgd_round_fn")

  def _client_fn(self, flat, seed, x, y):
    cfg = self.config
    x = tf.reshape(x, [tf.shape(x)[0], cfg.input_dim])
    targets = tf.one_hot(y, cfg.num_classes, dtype=tf.float32)
    trained = train_tensors(cfg, flat, seed, x, targets)
    counts = tf.math.bincount(y,
                              minlength=cfg.num_classes,
                              maxlength=cfg.num_classes,
                              dtype=tf.int32)
    return collections.OrderedDict(weights=trained,
                                   class_counts=counts,
                                   num_examples=tf.cast(tf.shape(y)[0], tf.float32),
                                   initial_loss=_mean_ce(flat, x, targets),
                                   final_loss=_mean_ce(trained, x, targets))

  def _computation(self, name):
    """Builds (traces) the named federated computation on first use."""
    if name in self._computations:
      return self._computations[name]
    # TFF (and the execution context its import installs) only once a federated
    # computation is built: matching and evaluation run without it.
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    cfg = self.config
    weights_type = tff.to_type([
        tff.TensorType(np.float32, s)
        for n_in, n_out in cfg.layer_shapes
        for s in ((n_in, n_out), (n_out,))
    ])
    seed_type = tff.TensorType(np.int64, [2])
    data_type = tff.to_type(
        (tff.TensorType(np.float32, [None, cfg.input_dim]), tff.TensorType(np.int32, [None])))
    clients = lambda t: tff.FederatedType(t, tff.CLIENTS)

    if name == "train_fn":

      @tff.tensorflow.computation(seed_type, seed_type, data_type)
      def client_train(init_seed, seed, data):
        return self._client_fn(_initial_tensors(cfg, init_seed), seed, *data)

      @tff.federated_computation(clients(seed_type), clients(seed_type), clients(data_type))
      def comp(init_seeds_, seeds, data):
        return tff.federated_map(client_train, (init_seeds_, seeds, data))
    else:

      @tff.tensorflow.computation(weights_type, seed_type, data_type)
      def client_train_from(weights, seed, data):
        return self._client_fn(list(weights), seed, *data)

      if name == "train_from_fn":

        @tff.federated_computation(clients(weights_type), clients(seed_type), clients(data_type))
        def comp(weights, seeds, data):
          return tff.federated_map(client_train_from, (weights, seeds, data))
      else:

        @tff.federated_computation(tff.FederatedType(weights_type, tff.SERVER), clients(seed_type),
                                   clients(data_type))
        def comp(weights, seeds, data):
          out = tff.federated_map(client_train_from,
                                  (tff.federated_broadcast(weights), seeds, data))
          return tff.federated_mean(out.weights, weight=out.num_examples)

    self._computations[name] = comp
    return comp

  # ------------------------------------------------------------ python API
  def train(self,
            client_data,
            seed: int,
            init_weights: Optional[Sequence[Network]] = None,
            init_seed: Optional[int] = None) -> List[ClientResult]:
    """Trains one network per client; returns their uploads in client order.

    Args:
      client_data: list of ``(x, y)`` training arrays, one per client.
      seed: trial seed (non-negative int): shuffles use ``shuffle_seeds(seed, J)``.
      init_weights: optional list of per-client starting networks; default:
        fresh initialisation from ``init_seeds(init_seed, J, cfg.shared_init)``.
      init_seed: seed of the fresh initialisation (default ``seed``).
    """
    data = check_client_data(client_data, self.config)
    J = len(data)
    seeds = list(shuffle_seeds(seed, J))
    if init_weights is None:
      inits = list(init_seeds(seed if init_seed is None else init_seed, J, self.config.shared_init))
      out = self.train_fn(inits, seeds, data)
    else:
      if len(init_weights) != J:
        raise ValueError(f"init_weights must hold one network per client ({J}), "
                         f"got {len(init_weights)}")
      flat = [self._flatten_checked(w, f"init_weights[{j}]") for j, w in enumerate(init_weights)]
      out = self.train_from_fn(flat, seeds, data)
    return [_client_result(o) for o in out]

  def dsgd_round(self, global_weights: Network, client_data, seed: int) -> Network:
    """One downpour-SGD communication: broadcast, local training, weighted mean."""
    data = check_client_data(client_data, self.config)
    flat = self._flatten_checked(global_weights, "global_weights")
    mean = self.dsgd_round_fn(flat, list(shuffle_seeds(seed, len(data))), data)
    return _unflatten([np.asarray(t, np.float32) for t in mean])

  def _flatten_checked(self, net: Network, name: str) -> List[np.ndarray]:
    flat = _flatten(net)
    shapes = [s for n_in, n_out in self.config.layer_shapes for s in ((n_in, n_out), (n_out,))]
    if [tuple(a.shape) for a in flat] != shapes:
      raise ValueError(f"{name} must have layer shapes {shapes}, "
                       f"got {[tuple(a.shape) for a in flat]}")
    return flat


def check_client_data(client_data, cfg: LocalTrainingConfig):
  """Validated list of ``(x float32 (n, D), y int32 (n,))`` with ``n >= 1``."""
  if not client_data:
    raise ValueError("client_data must be a non-empty list of (x, y) pairs")
  out = []
  for j, (x, y) in enumerate(client_data):
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    y = np.asarray(y, np.int32)
    if x.shape[1] != cfg.input_dim or y.shape != (x.shape[0],) or x.shape[0] < 1:
      raise ValueError(f"client_data[{j}] must be x (n, {cfg.input_dim}) and y (n,) with "
                       f"n >= 1, got {x.shape} and {y.shape}")
    if y.min() < 0 or y.max() >= cfg.num_classes:
      raise ValueError(f"client_data[{j}]: labels must be in [0, {cfg.num_classes})")
    out.append((x, y))
  return out


def _flatten(net: Network) -> List[np.ndarray]:
  return [np.asarray(a, np.float32) for W, b in net for a in (W, b)]


def _unflatten(flat) -> Network:
  flat = list(flat)
  return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def _client_result(o) -> ClientResult:
  return ClientResult(weights=_unflatten([np.asarray(t, np.float32) for t in o["weights"]]),
                      class_counts=np.asarray(o["class_counts"], np.int64),
                      num_examples=int(round(float(o["num_examples"]))),
                      initial_loss=float(o["initial_loss"]),
                      final_loss=float(o["final_loss"]))


# ----------------------------------------------------------------- user's model
def hidden_units_of_model(model, input_shape, num_classes,
                          flag: str = "--model") -> Tuple[int, ...]:
  """The hidden widths of the user's network, for the clients' ``LocalTrainingConfig``.

  Args:
    model: ``MODULE:FUNCTION``, a zero-argument callable returning an uncompiled
      Keras model with logits out, or a checked ``tfbfl.models.ModelTemplate``.
    input_shape, num_classes: the data's example shape and number of classes.
    flag: the flag named in errors.

  Raises:
    tfbfl.models.ModelError: (a ValueError) one line naming ``flag``: the model
      cannot be built or is not a ReLU stack of ``Dense`` layers on flat inputs
      with at least one hidden layer (module docstring).
  """
  from tfbfl import models  # pylint: disable=g-import-not-at-top  (TensorFlow)
  tmpl = model if isinstance(model, models.ModelTemplate) else models.template(
      models.resolve_builder(model, flag), input_shape=input_shape, num_classes=num_classes,
      flag=flag)
  widths = models.dense_widths(tmpl, "PFNM", flag)
  for layer in tmpl.build(None).layers:
    if isinstance(layer, tf.keras.layers.Dense) and len(layer.input_shape) != 2:
      raise models.ModelError(f"{flag}={tmpl.label}: PFNM matches the neurons of Dense layers on "
                              f"flat inputs; Dense layer {layer.name!r} reads inputs of shape "
                              f"{tuple(layer.input_shape[1:])}: put a Flatten before it.")
  if not widths:
    raise models.ModelError(f"{flag}={tmpl.label}: PFNM matches hidden neurons; the model has no "
                            "hidden layer (it needs Dense layers with ReLU before the logits).")
  return widths


# -------------------------------------------------------------------- matching
def match_networks(weights: Sequence[Network],
                   class_counts=None,
                   hp: Optional[MatchingHyperparams] = None) -> Network:
  """PFNM global network of ``J`` client networks (one-shot).

  One hidden layer: ``pfnm_single_layer`` (paper Algorithm 1); deeper networks:
  ``pfnm_multilayer`` (supplement Algorithm 1, every layer matched).
  ``class_counts`` (list of ``(K,)``) weight the softmax bias (and softmax
  precisions with ``hp.softmax_precision == "class_frequency"``).
  """
  if not weights:
    raise ValueError("weights must be a non-empty list of client networks")
  if len(weights[0]) == 2:
    flat = [(n[0][0], n[0][1], n[1][0], n[1][1]) for n in weights]
    W1, b1, W2, b2 = pfnm_single_layer(flat, class_counts, hp)
    return [(W1, b1), (W2, b2)]
  glob = pfnm_multilayer(list(weights), class_counts, hp)
  return [(np.asarray(W), np.asarray(b)) for W, b in glob]


# ------------------------------------------------------------------ evaluation
def forward(net: Network, x: np.ndarray) -> np.ndarray:
  """Logits of a ReLU MLP ``[(W, b), ...]`` in numpy (float64)."""
  h = np.asarray(x, np.float64).reshape(len(x), -1)
  for l, (W, b) in enumerate(net):
    h = h @ np.asarray(W, np.float64) + np.asarray(b, np.float64)
    if l < len(net) - 1:
      h = np.maximum(h, 0.0)
  return h


def predict_proba(net: Network, x: np.ndarray) -> np.ndarray:
  """Softmax class probabilities ``(n, K)``."""
  z = forward(net, x)
  z = z - z.max(axis=1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=1, keepdims=True)


def accuracy(net: Network, x: np.ndarray, y: np.ndarray) -> float:
  """Top-1 accuracy of ``net`` on ``(x, y)``."""
  return float(np.mean(forward(net, x).argmax(axis=1) == np.asarray(y)))


def cross_entropy(net: Network, x: np.ndarray, y: np.ndarray) -> float:
  """Mean cross-entropy of ``net`` on ``(x, y)``."""
  p = predict_proba(net, x)
  return float(-np.mean(np.log(p[np.arange(len(y)), np.asarray(y)] + 1e-300)))


def model_size(net: Network) -> dict:
  """``{"neurons": hidden neurons in total, "layers": per-hidden-layer widths,
  "params": number of weights and biases}``."""
  layers = [int(np.shape(W)[1]) for W, _ in net[:-1]]
  params = int(sum(np.size(W) + np.size(b) for W, b in net))
  return {"neurons": int(sum(layers)), "layers": layers, "params": params}

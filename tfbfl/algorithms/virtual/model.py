"""VIRTUAL's model: the server + client networks, the initial states, the likelihood.

Shared (server) weights `theta` have the posterior proxy `s(theta) = prod_i
s_i(theta)`, private client weights `phi_i` the posterior `c_i(phi_i)`, all
mean-field Gaussians in natural parameters (`tfbfl.gaussian`). Initially
`s^(0) = N(mu_init, init_scale^2)` (Glorot means, seeded) and `s_i^(0) =
s^(0)^(1/K)`, so that `s^(0) = prod_i s_i^(0)`. The data term of eq. (3) is the
cross-entropy (`likelihood="categorical"`) or `(y - f(x))^2 / (2 noise_scale^2)`
(`"gaussian"`). Design notes: docs/virtual.md.
"""

from __future__ import annotations

import collections
import functools
from typing import Optional

import numpy as np

from tfbfl import _lazy
from tfbfl.algorithms.virtual.config import ClientState
from tfbfl.algorithms.virtual.config import VirtualConfig

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
gaussian = _lazy.load("tfbfl.gaussian")
networks = _lazy.load("tfbfl.networks")
builders = _lazy.load("tfbfl.networks.builders")
progressive = _lazy.load("tfbfl.networks.progressive")


def data_loss(cfg: VirtualConfig, y, outputs, mask=None, axis=None):
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


def network_template(cfg: VirtualConfig):
  """The checked `tfbfl.models.ModelTemplate` VIRTUAL's columns are built from: the
  user's `--model`, else the built-in `--architecture` (mlp, conv) by the same path;
  None for the built-in LSTM (`networks.VirtualLSTMNetworks`)."""
  if cfg.model is None and cfg.architecture == "lstm":
    return None
  return builders.config_template(cfg)


def batched(cfg: VirtualConfig) -> bool:
  """Whether clients train with the lean, client-batched step
  (`tfbfl.algorithms.virtual.step`): SGD with `lean_step` on a network that is a stack
  of Dense layers (`progressive.is_dense_stack`: the preset MLP or a user's)."""
  if not (cfg.lean_step and cfg.local_solver == "sgd"):
    return False
  tmpl = network_template(cfg)
  return tmpl is not None and progressive.is_dense_stack(tmpl)


def _architecture(cfg: VirtualConfig):
  """(network class, initial shared posterior fn, initial private weights fn,
  keyword arguments) of the configured network."""
  common = dict(init_scale=cfg.init_scale)
  tmpl = network_template(cfg)
  if tmpl is None:
    kw = dict(vocab_size=cfg.vocab_size,
              embedding_dim=cfg.embedding_dim,
              lstm_units=tuple(cfg.lstm_units),
              **common)
    return (networks.VirtualLSTMNetworks, networks.initial_shared_posterior_lstm,
            networks.initial_private_weights_lstm, kw)
  return (functools.partial(progressive.ProgressiveNetworks, tmpl),
          functools.partial(progressive.initial_shared_posterior_of, tmpl),
          functools.partial(progressive.initial_private_weights_of_template, tmpl), common)


def initial_posterior(cfg: VirtualConfig) -> gaussian.NaturalGaussian:
  """`s^(0) = N(mu_init, init_scale^2)` with seeded Glorot means."""
  _, init_shared, _, kw = _architecture(cfg)
  return init_shared(seed=cfg.seed, **kw)


def initial_factor(cfg: VirtualConfig,
                   init_posterior: gaussian.NaturalGaussian) -> gaussian.NaturalGaussian:
  """Every client's initial factor `s^(0)^(1/K)`, as float32 numpy arrays."""
  factor = gaussian.power(init_posterior, 1.0 / cfg.num_clients)
  return gaussian.NaturalGaussian(*_as_numpy(factor))


def client_network_seed(cfg: VirtualConfig, client_index: int) -> int:
  """The seed of client `client_index`'s initial private network."""
  return cfg.seed * 100003 + 7919 * (client_index + 1)


def initial_client_state(cfg: VirtualConfig,
                         client_index: int,
                         init_posterior: gaussian.NaturalGaussian,
                         init_factor: Optional[gaussian.NaturalGaussian] = None) -> ClientState:
  """`s_i^(0) = s^(0)^(1/K)`, posterior copy `s^(0)`, seeded private network.

  `init_factor`: `initial_factor(cfg, init_posterior)`, for callers making many
  states (computed here if None). The state owns copies of every array.
  """
  if init_factor is None:
    init_factor = initial_factor(cfg, init_posterior)
  _, _, init_private, kw = _architecture(cfg)
  private = init_private(gate_init=cfg.gate_init,
                         seed=client_network_seed(cfg, client_index),
                         **kw)
  return ClientState(gaussian.NaturalGaussian(*_as_numpy(init_factor)),
                     gaussian.NaturalGaussian(*_as_numpy(init_posterior)),
                     [np.asarray(w, np.float32) for w in private], np.bool_(False),
                     np.int32(client_index))


def _as_numpy(structure):
  """`structure` with every tensor or array as a new float32 numpy array."""
  return tf.nest.map_structure(lambda t: np.array(t, np.float32), structure)


def build_networks(cfg: VirtualConfig):
  """The configured server + client networks (unseeded: values are assigned)."""
  network, _, _, kw = _architecture(cfg)
  extra = dict(activation=cfg.activation) if network_template(cfg) is not None else {}
  return network(prior_scale=cfg.prior_scale, gate_init=cfg.gate_init, seed=None, **extra, **kw)


def flatten_for_mlp(cfg: VirtualConfig, x):
  """`x` as `[n, input_dim]` rows for a stack of Dense layers (`batched`: the lean step
  reads flat examples); as is otherwise (the network's own layers reshape it)."""
  return tf.reshape(x, [tf.shape(x)[0], cfg.input_dim]) if batched(cfg) else x


def log_precision_metrics(net, posterior, private) -> "collections.OrderedDict":
  """Mean `log(1 / sigma^2)` per layer of a client's posterior: the variance trajectories.

  `log_prec_shared_<l>`: the shared posterior `posterior` (a `NaturalGaussian` in
  `net.shared_posterior()`'s order) over server layer `l` (1-based), kernel and bias
  together; `log_prec_private_<l>`: client layer `l` of the `private` weights (values of
  `net.private_trainable_variables`); `log_prec_lateral`: every lateral adapter together.
  Returns scalar tensors.
  """
  out = collections.OrderedDict()
  eta2 = [tf.reshape(t, [-1]) for t in tf.nest.flatten(posterior.eta2)]
  start = 0
  for l, layer in enumerate(net.server_layers):
    count = len(layer.parameter_names)
    out[f"log_prec_shared_{l + 1}"] = tf.reduce_mean(tf.math.log(tf.concat(eta2[start:start + count],
                                                                           0)))
    start += count
  position = {v.ref(): j for j, v in enumerate(net.private_trainable_variables)}

  def mean_log_precision(layers_):
    log_prec = []
    for layer in layers_:
      for name in layer.parameter_names:
        u = private[position[getattr(layer, f"{name}_untransformed_scale").ref()]]
        sigma = tf.nn.softplus(tf.reshape(u, [-1])) + layer.min_scale
        log_prec.append(-2.0 * tf.math.log(sigma))
    return tf.reduce_mean(tf.concat(log_prec, 0))

  if private:
    for l, layer in enumerate(net.client_layers):
      out[f"log_prec_private_{l + 1}"] = mean_log_precision([layer])
    adapters = [a for lat in net.laterals for a in (lat.adapter_in, lat.adapter_out)]
    if adapters:
      out["log_prec_lateral"] = mean_log_precision(adapters)
  return out

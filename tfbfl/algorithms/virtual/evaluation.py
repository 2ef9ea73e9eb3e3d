"""VIRTUAL's evaluation: metrics S (the server network) and MT (each client's own model).

S is the predictive of the server network with the server posterior `s`; MT that
of the client network with the client's trained `q_i` and private weights (the
server network with `q_i` where `private` is off; a client never trained has its
initial model). Each is the network at the posterior means (`eval_samples == 0`)
or the average of `eval_samples` sampled forward passes: per client the summed
negative log-likelihood of `log(p + 1e-12)`, correct `argmax` predictions and,
for a categorical likelihood, the calibration sums.
"""

from __future__ import annotations

import collections

from tfbfl import _lazy
from tfbfl.algorithms.virtual.config import ClientState
from tfbfl.algorithms.virtual.config import VirtualConfig
from tfbfl.algorithms.virtual.model import build_networks
from tfbfl.algorithms.virtual.model import flatten_for_mlp

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
metrics_lib = _lazy.load("tfbfl.metrics")


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
  if cfg.likelihood == "gaussian":
    err = tf.cast(y, tf.float32) - tf.squeeze(avg, -1)
    return collections.OrderedDict([
        (f"{prefix}_loss", tf.reduce_sum(0.5 * tf.square(err) / cfg.noise_scale**2)),
        (f"{prefix}_correct", tf.constant(0.0))])
  return metrics_lib.probability_sums(avg, y, prefix)


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
  x = flatten_for_mlp(cfg, x)

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
  x = flatten_for_mlp(cfg, x)

  @tf.function
  def run():
    s = _predictive_sums(cfg, net, server_posterior, 0, seed, x, y, "server")
    return _order_sums(s, {}, tf.cast(tf.shape(y)[0], tf.float32), client_index)

  return run()


def evaluate_own_client(cfg: VirtualConfig, state: ClientState, seed, x, y):
  """MT of one client: {mt_loss, mt_correct, num_examples, client_index[,
  mt_calibration]} from its state alone (its q_i and private network)."""
  net = build_networks(cfg)
  x = flatten_for_mlp(cfg, x)

  @tf.function
  def run():
    net.set_private_weights(state.private)
    m = _predictive_sums(cfg, net, state.shared_posterior, 1 if cfg.private else 0, seed, x, y,
                         "mt")
    return _order_sums({}, m, tf.cast(tf.shape(y)[0], tf.float32), state.client_index)

  return run()

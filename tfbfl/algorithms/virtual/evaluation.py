"""VIRTUAL's evaluation: metrics S (the server network) and MT (each client's own model).

S is the predictive of the server network with the server posterior `s`; MT that
of the client network with the client's trained `q_i` and private weights (the
server network with `q_i` where `private` is off; a client never trained has its
initial model). Each is the network at the posterior means (`eval_samples == 0`)
or the average of `eval_samples` sampled forward passes: per client the summed
negative log-likelihood of `log(p + 1e-12)`, correct `argmax` predictions and,
for a categorical likelihood, the calibration sums. With `--temperature_scaling` the
evaluation data also hold each client's calibration split, and S and MT each carry the
grids that fit one temperature over the clients (`tfbfl.temperature`).

The Monte Carlo predictive is the exported model's (`predictive`, which
`VirtualAlgorithm`'s export hooks call): its noise is keyed by the example
(`tfbfl.layers.base.example_keyed_noise`), so each example's probabilities are a
function of (the posterior, the model's seed, the example) and do not depend on
the batch; the model's seed is `predictive_seed` (the server network `[seed, 0]`,
client i's `[seed, i + 1]`, the export's `mc_seed`), the same at every evaluation
and for every client's data. The per-client evaluation seed the driver passes
(`evaluation_seed`) is not read. So S of the pooled test set in any batch size,
through the export, is the S evaluated client by client (docs/library.md).
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
layers_base = _lazy.load("tfbfl.layers.base")
metrics_lib = _lazy.load("tfbfl.metrics")
temperature = _lazy.load("tfbfl.temperature")


def predictive_seed(seed: int, client_index=None):
  """The seed of a model's Monte Carlo passes (int64 `[2]`): `[seed, 0]` for the
  server network (S), `[seed, client_index + 1]` for client `client_index`'s
  network (MT); the export's `mc_seed`. `seed` is the run's."""
  if client_index is None:
    return tf.constant([int(seed), 0], tf.int64)
  return tf.stack([tf.constant(int(seed), tf.int64), tf.cast(client_index, tf.int64) + 1])


def predictive(net, head, x, samples, seed, num_classes, to_prob=None):
  """The predictive of head 0 (the server network) or 1 (the client network) with
  the network's current shared posterior and private weights on features `x` (as
  the network reads them): the network at the posterior means (`samples == 0`), or
  the average of `samples` forward passes, pass `s` seeded by
  `stateless_fold_in(seed, s)`, each example's noise keyed by the example
  (`example_keyed_noise(example_keys(x))`: independent of the batch).
  Probabilities (`to_prob`, default softmax). The evaluation and the export run
  this one function."""
  to_prob = tf.nn.softmax if to_prob is None else to_prob
  # server_logits(x, s) equals forward(x, s)[0] and reads no private weight.
  out = (lambda s: net.server_logits(x, seed=s)) if head == 0 else (
      lambda s: net.forward(x, seed=s)[head])
  if samples == 0:
    return to_prob(out(None))

  # An explicit loop: tfbfl's tf.functions are built without autograph
  # (docs/performance.md, "Start-up").
  def add_sample(s, avg):
    p = to_prob(out(tf.random.experimental.stateless_fold_in(seed, s)))
    return s + 1, avg + p / samples

  with layers_base.example_keyed_noise(layers_base.example_keys(x)):
    _, avg = tf.while_loop(lambda s, _: s < samples, add_sample,
                           (tf.constant(0), tf.zeros([tf.shape(x)[0], num_classes])))
  return avg


def _predictive(cfg: VirtualConfig, net, head, seed, x):
  """`predictive` of the configured `eval_samples` passes seeded from `seed` (the
  model's, `predictive_seed`); probabilities for a categorical likelihood, else
  means. Runs in the caller's `tf.function`."""
  to_prob = tf.nn.softmax if cfg.likelihood == "categorical" else tf.identity
  return predictive(net, head, x, cfg.eval_samples, seed, cfg.num_classes, to_prob)


def _predictive_sums(cfg: VirtualConfig, net, posterior, head, seed, data, prefix):
  """`{prefix}_loss`, `{prefix}_correct` (and `{prefix}_calibration` for a
  categorical likelihood) of `_predictive` with shared `posterior` on `data`'s test
  split `(x, y)`; with `--temperature_scaling` `data` also holds the calibration split
  and the sums carry the temperature grids (`tfbfl.temperature.fit_sums`, on the log
  probabilities). Runs in the caller's `tf.function`."""
  net.set_shared_posterior(posterior)
  x, y = data[0], data[1]
  avg = _predictive(cfg, net, head, seed, x)
  if cfg.likelihood == "gaussian":
    err = tf.cast(y, tf.float32) - tf.squeeze(avg, -1)
    return collections.OrderedDict([
        (f"{prefix}_loss", tf.reduce_sum(0.5 * tf.square(err) / cfg.noise_scale**2)),
        (f"{prefix}_correct", tf.constant(0.0))])
  out = metrics_lib.probability_sums(avg, y, prefix)
  if cfg.temperature_scaling:
    x_calibration, y_calibration = data[2], data[3]
    out.update(temperature.fit_sums(
        prefix, metrics_lib.log_probabilities(avg), y,
        metrics_lib.log_probabilities(_predictive(cfg, net, head, seed, x_calibration)),
        y_calibration))
  return out


TEMPERATURE_GRIDS = tuple(f"{prefix}_{grid}" for prefix in ("server", "mt")
                          for grid in ("fit_nll", "tempered_loss", "tempered_calibration"))


def _order_sums(s, m, n, client_index):
  out = collections.OrderedDict()
  for key in ("server_loss", "server_correct", "mt_loss", "mt_correct"):
    if key in s or key in m:
      out[key] = s[key] if key in s else m[key]
  out["num_examples"] = n
  out["client_index"] = client_index
  for key in ("server_calibration", "mt_calibration", *TEMPERATURE_GRIDS):
    if key in s or key in m:
      out[key] = s[key] if key in s else m[key]
  return out


def _flat_data(cfg: VirtualConfig, data):
  """The test split `(x, y)`, then with `--temperature_scaling` the calibration split,
  each `x` flattened for an MLP."""
  if len(data) != (4 if cfg.temperature_scaling else 2):
    raise ValueError(f"evaluation data of {len(data)} arrays; expected the test split "
                     "(x, y)" + (" and the calibration split" if cfg.temperature_scaling else ""))
  return tuple(flatten_for_mlp(cfg, a) if j % 2 == 0 else a for j, a in enumerate(data))


def evaluate_client(cfg: VirtualConfig, server_posterior, state: ClientState, seed, *data):
  """Per-client sums {server_loss, server_correct, mt_loss, mt_correct,
  num_examples, client_index[, server_calibration, mt_calibration, temperature grids]}:
  S and MT in one call (`VirtualAlgorithm.evaluate`; the driver's streamed path uses
  `evaluate_server_client` and `evaluate_own_client`, which compute the same).
  `seed` (the driver's `evaluation_seed`) is not read: the passes are seeded by
  `predictive_seed`."""
  net = build_networks(cfg)
  data = _flat_data(cfg, data)

  @tf.function(autograph=False)
  def run():
    net.set_private_weights(state.private)
    s = _predictive_sums(cfg, net, server_posterior, 0, predictive_seed(cfg.seed), data, "server")
    # MT: the client's own q_i, which for a client never trained is its initial
    # model (s^(0) and its seeded private network), as for every algorithm.
    m = _predictive_sums(cfg, net, state.shared_posterior, 1 if cfg.private else 0,
                         predictive_seed(cfg.seed, state.client_index), data, "mt")
    return _order_sums(s, m, tf.cast(tf.shape(data[1])[0], tf.float32), state.client_index)

  return run()


def evaluate_server_client(cfg: VirtualConfig, server_posterior, client_index, seed, *data):
  """S of one client: {server_loss, server_correct, num_examples, client_index[,
  server_calibration, its grids]} from the server posterior alone (no client state).
  `seed` (the driver's `evaluation_seed`) is not read: the passes are seeded by
  `predictive_seed`."""
  net = build_networks(cfg)
  data = _flat_data(cfg, data)

  @tf.function(autograph=False)
  def run():
    s = _predictive_sums(cfg, net, server_posterior, 0, predictive_seed(cfg.seed), data, "server")
    return _order_sums(s, {}, tf.cast(tf.shape(data[1])[0], tf.float32), client_index)

  return run()


def evaluate_own_client(cfg: VirtualConfig, shared_posterior, private, client_index, seed, *data):
  """MT of one client: {mt_loss, mt_correct, num_examples, client_index[,
  mt_calibration, its grids]} from what of its state MT reads: its shared posterior
  q_i (a `NaturalGaussian`) and its private weights. Its shared factor is not an
  input: the streamed evaluation sends each client only these (the factor would double
  what travels per client). `seed` (the driver's `evaluation_seed`) is not read: the
  passes are seeded by `predictive_seed`."""
  net = build_networks(cfg)
  data = _flat_data(cfg, data)

  @tf.function(autograph=False)
  def run():
    net.set_private_weights(private)
    m = _predictive_sums(cfg, net, shared_posterior, 1 if cfg.private else 0,
                         predictive_seed(cfg.seed, client_index), data, "mt")
    return _order_sums({}, m, tf.cast(tf.shape(data[1])[0], tf.float32), client_index)

  return run()

"""One VIRTUAL client's round, in plain TensorFlow.

With `s^(t)` the server posterior and `s_i^(t-1)` the client's stored factor, each
selected client i computes (Algorithm 1):

1. the cavity `cav_i = s^(t) / s_i^(t-1)` (non-positive precisions floored and
   counted) and the KL target `p(theta)^(1/K) * cav_i` (`fedavg_init`:
   `s_i^(t-1) := s^(t)`, a flat cavity);
2. training of `q_i = s_i * cav_i` from `s^(t)` and of the private weights, sampling
   activations by local reparameterization: the lean step (`step`, the MLP with
   `lean_step`), the Keras layers (`keras_step`), or the exact linear-Gaussian solver
   (`conjugate_linear_posterior`);
3. `Delta_i = s_i^new / s_i^(t-1)` with `s_i^new = q_i / cav_i` (natural-parameter
   difference; equals `q_i / s^(t)` when nothing is floored; SNR-pruned with
   `prune_percentile`);
4. the damped factor step `s_i <- s_i^(t-1) * Delta_i^alpha`, unless the robust-round
   check drops the client (identity factor sent, previous state kept).

The choices behind each step: docs/virtual.md.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np

from tfbfl import _lazy
from tfbfl.algorithms.virtual import keras_step
from tfbfl.algorithms.virtual import step as lean_step
from tfbfl.algorithms.virtual.config import ClientOutput
from tfbfl.algorithms.virtual.config import ClientState
from tfbfl.algorithms.virtual.config import VirtualConfig
from tfbfl.algorithms.virtual.model import batched
from tfbfl.algorithms.virtual.model import build_networks
from tfbfl.algorithms.virtual.model import data_loss
from tfbfl.algorithms.virtual.model import flatten_for_mlp
from tfbfl.algorithms.virtual.model import log_precision_metrics

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
gaussian = _lazy.load("tfbfl.gaussian")
networks = _lazy.load("tfbfl.networks")
sparsity = _lazy.load("tfbfl.sparsity")
robust = _lazy.load("tfbfl.algorithms.robust")

_CAVITY_MIN_PRECISION = 1e-8


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


def _client_output(cfg: VirtualConfig, net, server_posterior, state: ClientState, old_factor,
                   cavity, cavity_floored, q_new, private, loss_sum, correct_sum, n,
                   seen) -> ClientOutput:
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
  metrics.update(log_precision_metrics(net, q_new, list(private) if cfg.private else []))
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


def client_update_batch(cfg: VirtualConfig,
                        server_posterior,
                        states: ClientState,
                        seeds,
                        x,
                        y,
                        n,
                        net: Optional[networks.VirtualNetworks] = None) -> ClientOutput:
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
  layout = lean_step.Layout(net)
  clients = int(seeds.shape[0])
  x = tf.reshape(x, [clients, tf.shape(x)[1], cfg.input_dim])
  unstacked = [tf.nest.map_structure(lambda t, c=c: t[c], states) for c in range(clients)]
  unstacked = [
      ClientState(gaussian.NaturalGaussian(*s.shared_factor),
                  gaussian.NaturalGaussian(*s.shared_posterior), list(s.private), s.trained,
                  s.client_index) for s in unstacked
  ]

  @tf.function(autograph=False)
  def train():
    priors = [_client_prior(cfg, server_posterior, s) for s in unstacked]
    stack_g = lambda gs: gaussian.NaturalGaussian([tf.stack(t) for t in zip(*[g.eta1 for g in gs])],
                                                  [tf.stack(t) for t in zip(*[g.eta2 for g in gs])])
    target = stack_g([p[3] for p in priors])
    shared_prior = (lean_step.flatten(target.eta1, clients),
                    lean_step.flatten(target.eta2, clients))
    # Every client starts from s^(t): q_i = s_i * cavity with s_i = s^(t) / cavity.
    start = stack_g([server_posterior] * clients)
    shared_loc, shared_u = layout.shared_from_natural(start, clients)
    params = lean_step.Parameters(shared_loc, shared_u,
                                  *layout.private_from_list(states.private, clients))
    params, loss_sum, correct_sum = lean_step.train_clients(cfg, layout, params, shared_prior, x,
                                                            y, n, seeds, data_loss)
    q_new = layout.shared_to_natural(params.shared_loc, params.shared_u)
    private = (layout.private_to_list(params.private_loc, params.private_u, params.gates)
               if cfg.private else list(states.private))
    outputs = []
    for c, s in enumerate(unstacked):
      old_factor, cavity, cavity_floored, _ = priors[c]
      q_c = gaussian.NaturalGaussian([t[c] for t in q_new.eta1], [t[c] for t in q_new.eta2])
      seen = tf.cast(n[c] * cfg.epochs, tf.float32)
      outputs.append(
          _client_output(cfg, net, server_posterior, s, old_factor, cavity, cavity_floored, q_c,
                         [w[c] for w in private], loss_sum[c], correct_sum[c], n[c], seen))
    return tf.nest.map_structure(lambda *t: tf.stack(t), *outputs)

  return train()


def client_update(cfg: VirtualConfig,
                  server_posterior,
                  state: ClientState,
                  seed,
                  x,
                  y,
                  net: Optional[networks.VirtualNetworks] = None) -> ClientOutput:
  """One client's round (steps 1-4 of the module docstring), plain TensorFlow.

  Used inside the TFF client computation; callable as is (eagerly or in a
  `tf.function`), which `benchmarks/round_time.py` uses to time TFF's overhead.
  With `batched(cfg)` it is `client_update_batch` of one client; otherwise the
  Keras layers train step by step. `net` (default: built here) holds the
  variables; pass one built outside a `tf.function` that calls this.
  """
  if batched(cfg):
    x = flatten_for_mlp(cfg, x)
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
  x = flatten_for_mlp(cfg, x)
  sgd_epochs = keras_step.make_sgd_epochs(cfg, net, seed, x, y)

  @tf.function(autograph=False)
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
      loss_sum, correct_sum = data_loss(cfg, y, net.server_logits(x))[0], tf.constant(0.0)
    else:
      loss_sum, correct_sum = sgd_epochs(n)
      q_new = net.shared_posterior()
      seen *= cfg.epochs
    return _client_output(cfg, net, server_posterior, state, old_factor, cavity, cavity_floored,
                          q_new, net.get_private_weights(), loss_sum, correct_sum, n, seen)

  return train()

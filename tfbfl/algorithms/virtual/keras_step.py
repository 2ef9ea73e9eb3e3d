"""VIRTUAL's client SGD through the Keras layers (conv, lstm, and the MLP without `lean_step`).

Per minibatch, plain SGD on eq. (3), the masked mean of

    CE(y, client(x)) [+ w_S CE(y, server(x))]
      + beta / N_i * KL(q_i || p^(1/K) cav_i) + beta_p / N_i * KL(c_i || p(phi_i)),

(`beta_p = beta` as in the paper unless `--private_kl_weight` sets it; `step.KLScales`)

except that each shared mean takes the KL quadratic implicitly (a proximal step,
`g / (1 + lr kl_scale prec_t)`, `kl_scale = beta / N_i`), and with
`precision_step > 0` the shared scales take the natural-gradient precision step
(`assign_natural_precision_step`) instead of SGD. The MLP's default path is the
lean step (`tfbfl.algorithms.virtual.step`: same objective, minibatches and noise).
Measurements of both choices: docs/virtual.md.
"""

from __future__ import annotations

from typing import Callable

from tfbfl import _lazy
from tfbfl.algorithms.virtual import step as lean_step
from tfbfl.algorithms.virtual.config import VirtualConfig
from tfbfl.algorithms.virtual.model import data_loss

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
client_batch = _lazy.load("tfbfl.algorithms.client_batch")


def assign_natural_precision_step(u_var, grad_u, prior_precision, min_scale, kl_scale, rho):
  """The shared scales' step: a damped fixed-point (natural-gradient) step on the
  precision instead of SGD on the softplus scale.

  Per example the client minimises `E_q[L] + kl_scale * KL(q || t)` (`t` the KL
  target `p^(1/K) * cavity`, precision `prec_t`; `kl_scale = beta / N_i`). Its
  stationary precision is `prec* = prec_t + E_q[d^2 L / d theta^2] / kl_scale`, and
  Price's theorem gives that curvature from the scale gradient already computed:
  `E[dL/dsigma] = sigma * E[d^2 L]`. With `g_sigma` the minibatch gradient of the
  data loss (the KL part `kl_scale * (sigma prec_t - 1/sigma)` removed),

      h    = g_sigma / sigma
      prec <- (1 - rho) * prec + rho * max(prec_t + h / kl_scale, prec_t),

  a convex combination of positive precisions: stable for any curvature (unlike
  SGD on `u`, whose step is `O(sigma^2)` on the data and diverges on a stiff KL).
  On a linear-Gaussian model `h` is the exact curvature, so the fixed point is the
  exact (mean-field) posterior precision. The `max(., prec_t)` keeps the target
  proper when minibatch noise makes `h` negative (a slight upward bias, measured in
  docs/virtual.md). Assigns the new softplus scale to `u_var`.
  """
  u = tf.convert_to_tensor(u_var)
  sigma = tf.nn.softplus(u) + min_scale
  # The data part of the gradient: the total less the KL's (dsigma/du = sigmoid(u)).
  grad_data_u = grad_u - kl_scale * (sigma * prior_precision - 1.0 / sigma) * tf.math.sigmoid(u)
  u_var.assign(
      lean_step.natural_precision_update(u, grad_data_u, prior_precision, min_scale, rho,
                                         kl_scale))


def make_sgd_epochs(cfg: VirtualConfig, net, seed, x, y) -> Callable:
  """`sgd_epochs(n)`: E epochs of plain SGD on eq. (3) over the shared minibatch
  schedule (`client_batch`, one client) of the `n` examples `(x, y)` (`x` as the
  network reads it), training `net`'s shared (and, with `cfg.private`, private)
  variables in place; it returns the summed data loss and correct count. Call it
  inside the client's `tf.function`, after the network's posterior, prior and
  private weights are set; `seed` seeds the minibatches and the noise."""
  train_vars = net.shared_trainable_variables + (net.private_trainable_variables
                                                 if cfg.private else [])
  # min_scale of each shared parameter (sigma = softplus(u) + min_scale), in order.
  shared_min_scales = [
      layer.min_scale
      for layer in net.server_layers
      for _ in range(len(layer.posterior_variables) // 2)
  ]

  def loss_terms(xb, yb, mask, step_seed, kl_scale):
    """Masked mean data loss, correct count, and the eq. (3) objective."""
    server_out, client_out = net.forward(xb, seed=step_seed)
    count = tf.reduce_sum(mask)
    head = client_out if cfg.private else server_out
    nll, correct = data_loss(cfg, yb, head, mask)
    mean_loss = nll / count
    if cfg.private and cfg.server_loss_weight > 0:
      mean_loss += cfg.server_loss_weight * data_loss(cfg, yb, server_out, mask)[0] / count
    kl = kl_scale.shared * net.kl_shared()
    if cfg.private:
      kl += kl_scale.private * net.kl_private()
    return mean_loss, correct, mean_loss + kl

  # Every minibatch has the static shape [batch_size] (the last one of an epoch is
  # masked), so with `jit_compile` (plain-TF callers only) XLA compiles the step
  # once per process; the SGD trajectory is the same as with a short last batch.
  @tf.function(jit_compile=cfg.jit_compile, autograph=False)
  def sgd_step(xb, yb, mask, step_seed, kl_scale):
    with tf.GradientTape() as tape:
      mean_loss, correct, loss = loss_terms(xb, yb, mask, step_seed, kl_scale)
    # convert: embedding lookups give IndexedSlices
    grads = [
        None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(loss, train_vars)
    ]
    # In a shared mean the KL term has curvature kl_scale * (prior precision), and
    # the prior p^(1/K) * cavity is as sharp as s^(t) (1/init_scale^2 at round 0,
    # growing over rounds), so an explicit step diverges once
    # client_lr * kl_scale * precision > 2. Take that quadratic implicitly (a
    # proximal step): divide the mean's gradient by 1 + lr * kl_scale * precision.
    # Plain SGD where the prior is weak; same fixed points; stable for any lr.
    for j, precision in enumerate(net.shared_prior().eta2):
      if grads[2 * j] is not None:  # shared_trainable_variables: [loc, u] per param
        grads[2 * j] = grads[2 * j] / (1.0 + cfg.client_lr * kl_scale.shared * precision)
    if cfg.natural_precision_step:
      for j, prec_t in enumerate(net.shared_prior().eta2):
        if grads[2 * j + 1] is not None:
          assign_natural_precision_step(train_vars[2 * j + 1], grads[2 * j + 1], prec_t,
                                        shared_min_scales[j], kl_scale.shared,
                                        cfg.precision_step)
          grads[2 * j + 1] = None
    for v, g in zip(train_vars, grads):
      if g is not None:
        v.assign_sub(cfg.client_lr * g)
    return mean_loss * tf.reduce_sum(mask), correct

  def sgd_epochs(n):
    """E epochs of plain SGD on eq. (3) over the shared minibatch schedule
    (`client_batch`, one client); returns summed data loss and correct."""
    schedule = client_batch.MinibatchSchedule(seed[None], n[None], n, cfg.epochs, cfg.batch_size)
    kl_scale = lean_step.kl_scales(cfg, n)

    def step_fn(params, xb, yb, mask, step):
      return params, sgd_step(xb, yb, mask, tf.random.experimental.stateless_fold_in(seed, step),
                              kl_scale)

    zero = tf.zeros([1])
    _, (loss_sum, correct_sum) = client_batch.train_loop(schedule, x[None], y[None], (), step_fn,
                                                         (zero, zero))
    return loss_sum[0], correct_sum[0]

  return sgd_epochs

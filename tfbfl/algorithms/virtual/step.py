"""VIRTUAL's lean client step for the MLP: flat parameter vectors, analytic KL, clients batched.

The objective (eq. 3), minibatches and noise of the Keras layers' step
(`keras_step`), on a few flat float32 vectors `[C, P]` (C clients; `[P]` for one
client unbatched):

```none
mu_s, u_s    shared means and softplus-scales   [k_1, b_1, ..., k_L, b_L]
mu_p, u_p    private means and softplus-scales  [client k_l, b_l]_l, [V_l, c_l, U_l, d_l]_l
g            the lateral gates (point estimates) [g_1, ..., g_L]
```

**Forward** (`forward`), exactly the layers' local reparameterization
(`tfbfl.layers.BayesianDense`): per role one `sigma = softplus(u) + min_scale` and
one variance `sigma^2` over the flat vector; per layer

```none
m = x mu_W + mu_b,   v = x^2 sigma_W^2 + sigma_b^2,   y = m + sqrt(v + variance_epsilon) e
```

with one standard normal `e` per pre-activation (`draw_noise`, from the seeds the
Keras network uses). The server layer applies its activation (all but the last),
the lateral is `g * (U act(V h_s + c) + d)` and the client output is `act(client
pre-activation + lateral)` but on the last layer.

**Gradient.** Only the data loss is differentiated (`tf.GradientTape` over the flat
vectors). The KL terms of eq. (3), `KL(q || t) = sum 1/2 [prec_t sigma^2 +
prec_t (mu - mu_t)^2 - 1 - log(prec_t sigma^2)]`, against the shared target
`t = p^(1/K) cav_i` and the private prior `p(phi)` (the client layers' own prior,
`N(0, prior_scale^2)`), have the analytic gradient (`kl_gradients`)

```none
dKL/dmu = prec_t mu - eta1_t = prec_t (mu - mu_t)
dKL/du  = (sigma prec_t - 1/sigma) * sigmoid(u)        (dsigma/du = sigmoid(u))
```

and the total gradient is `grad data_loss + kl_scale * grad KL`, `kl_scale = beta/N_i`
on the shared KL and `beta_p / N_i` on the private one (`KLScales`; `beta_p` is
`cfg.private_beta`, the paper's `beta` unless `--private_kl_weight` says otherwise).

**Update** (`sgd_step`, the reference), as the Keras step: the shared means take the
implicit proximal step `mu_s -= lr g / (1 + lr kl_scale prec_t)`; the shared scales
take SGD or, with `cfg.natural_precision_step`, the natural-gradient precision step
(`natural_precision_update`); the private means, scales and gates take plain SGD
(only with `cfg.private`; otherwise the client network is neither run nor trained).
`fused_step` (`FusedPlan`'s packed vectors; the default without the natural
precision step) takes the same step as `mu <- A mu + B - C g'` and `u <- u -
sigmoid(u) (sigma (g_v + K1) - K2 / sigma)` with the per-round constants of
`round_constants`; with `cfg.scale_optimizer == "adam"` the scales (shared and
private) take Adam steps of `cfg.scale_lr` on that same gradient instead
(`adam_update`, moments reset each round).

**Clients batched** (`train_clients`): every vector carries the client axis, the
minibatches are `[C, B, ...]` and the matmuls batched (`client_batch`): C clients
train in one loop of `max_c S_c` steps, each on its own minibatches, seeds, KL target
and `kl_scale = beta / N_c`, and each equals its one-client run up to float
summation order. One client is `C = 1`.

Why flat vectors and how the fused step packs them (with measurements):
docs/virtual.md, "The lean step".
"""

from __future__ import annotations

import collections
from typing import Callable, List, Optional, Sequence

import numpy as np

from tfbfl import _lazy

# TensorFlow and the modules built on it load when an algorithm is built (`tfbfl._lazy`).
tf = _lazy.load("tensorflow")
tfp = _lazy.load("tensorflow_probability")
gaussian = _lazy.load("tfbfl.gaussian")
layers = _lazy.load("tfbfl.layers")
client_batch = _lazy.load("tfbfl.algorithms.client_batch")

__all__ = [
    "KLScales",
    "adam_start",
    "adam_update",
    "Layout",
    "Parameters",
    "data_loss_and_gradients",
    "draw_noise",
    "FusedPlan",
    "flatten",
    "forward",
    "fused_step",
    "kl_gradients",
    "natural_precision_update",
    "round_constants",
    "sgd_step",
    "train_clients",
]

KLScales = collections.namedtuple("KLScales", ["shared", "private"])
KLScales.__doc__ = """The weights of eq. (3)'s KL terms in a client's per-example objective:
`beta / N_i` on `KL(q(theta) || p^(1/K) cav_i)` and `beta_p / N_i` on `KL(c_i || p(phi_i))`
(`kl_scales`)."""


def kl_scales(cfg, n) -> KLScales:
  """`KLScales` of clients holding `n` examples (`n`'s shape; at least one example)."""
  count = tf.cast(tf.maximum(n, 1), tf.float32)
  return KLScales(cfg.kl_weight / count, cfg.private_beta / count)


Parameters = collections.namedtuple("Parameters",
                                    ["shared_loc", "shared_u", "private_loc", "private_u", "gates"])
Parameters.__doc__ = """The trainable state as flat float32 vectors `[C, P]` (see the
module docstring for the order of each)."""


def flatten(tensors, clients=None):
  """Concatenated flat values; with `clients`, each tensor's leading axis is kept."""
  if clients is None:
    return tf.concat([tf.reshape(tf.convert_to_tensor(t), [-1]) for t in tensors], 0)
  return tf.concat([tf.reshape(tf.convert_to_tensor(t), [clients, -1]) for t in tensors], 1)


def _per_entry(values, shapes):
  """A Python float if all `values` agree, else a per-entry float32 numpy vector."""
  if len(set(values)) <= 1:
    return float(values[0]) if values else 0.0
  return np.concatenate([np.full([int(np.prod(s))], v, np.float32) for v, s in zip(values, shapes)])


class Layout:
  """Static description of a `tfbfl.networks.VirtualNetworks` for the flat-vector step.

  Holds, in flat-vector order, the Keras variables of each role (to read and write
  them in tests), the shapes for the per-layer views, the positions of each role's
  tensors in `net.private_trainable_variables` (the order of a client state's
  `private` list), and each layer's activation, `min_scale` and `variance_epsilon`.
  The step itself reads no variable.

  Args:
    net: a built `tfbfl.networks.VirtualNetworks` (every server, client and lateral layer a
      `BayesianDense` or a `LateralConnection` of them).
  """

  def __init__(self, net):
    self.net = net
    self.depth = len(net.server_layers)
    dense = list(net.server_layers) + list(net.client_layers)
    dense += [l for lat in net.laterals for l in (lat.adapter_in, lat.adapter_out)]
    for layer in dense:
      if not isinstance(layer, layers.BayesianDense):
        raise ValueError(f"the lean step needs BayesianDense layers, got {type(layer).__name__}.")
    # Shared: server layers [kernel, bias] in order (= shared_posterior()'s order).
    self.server_layers = list(net.server_layers)
    # Private Bayesian layers: client layers, then per lateral V and U.
    self.private_layers = list(
        net.client_layers) + [l for lat in net.laterals for l in (lat.adapter_in, lat.adapter_out)]
    self.gate_vars = [lat.gate for lat in net.laterals]

    def tensors(layers):
      locs = [getattr(l, f"{n}_loc") for l in layers for n in l.parameter_names]
      us = [getattr(l, f"{n}_untransformed_scale") for l in layers for n in l.parameter_names]
      shapes = [v.shape.as_list() for v in locs]
      mins = [l.min_scale for l in layers for _ in l.parameter_names]
      return locs, us, shapes, mins

    (self.shared_loc_vars, self.shared_u_vars, self.shared_shapes,
     shared_mins) = tensors(self.server_layers)
    (self.private_loc_vars, self.private_u_vars, self.private_shapes,
     private_mins) = tensors(self.private_layers)
    self.shared_min_scale = _per_entry(shared_mins, self.shared_shapes)
    self.private_min_scale = _per_entry(private_mins, self.private_shapes)
    self.shared_sizes = [int(np.prod(s)) for s in self.shared_shapes]
    self.private_sizes = [int(np.prod(s)) for s in self.private_shapes]
    self.shared_total, self.private_total = sum(self.shared_sizes), sum(self.private_sizes)
    self.gate_sizes = [int(v.shape[0]) for v in self.gate_vars]
    position = {v.ref(): j for j, v in enumerate(net.private_trainable_variables)}
    self.private_index = dict(private_loc=[position[v.ref()] for v in self.private_loc_vars],
                              private_u=[position[v.ref()] for v in self.private_u_vars],
                              gates=[position[v.ref()] for v in self.gate_vars])
    self.private_count = len(position)
    self.private_var_shapes = [v.shape.as_list() for v in net.private_trainable_variables]

  # -- the network's variables (tests, and the Keras path's comparison) -------------

  def read_parameters(self) -> Parameters:
    """The network's trainable values as flat `[1, P]` vectors."""
    return Parameters(*[
        tf.expand_dims(flatten(vs), 0)
        for vs in (self.shared_loc_vars, self.shared_u_vars, self.private_loc_vars,
                   self.private_u_vars, self.gate_vars)
    ])

  def write_parameters(self, params: Parameters):
    """Assigns `[1, P]` flat vectors to the network's variables; returns the op."""
    ops = []
    for variables, flat, sizes in ((self.shared_loc_vars, params.shared_loc, self.shared_sizes),
                                   (self.shared_u_vars, params.shared_u, self.shared_sizes),
                                   (self.private_loc_vars, params.private_loc, self.private_sizes),
                                   (self.private_u_vars, params.private_u, self.private_sizes),
                                   (self.gate_vars, params.gates, self.gate_sizes)):
      for v, part in zip(variables, tf.split(flat[0], sizes)):
        ops.append(v.assign(tf.reshape(part, v.shape)))
    return tf.group(*ops)

  def private_prior(self):
    """`(eta1, eta2)` of the private layers' priors `p(phi)`, flat `[P]` (read once)."""
    eta1 = [getattr(l, f"{n}_prior_eta1") for l in self.private_layers for n in l.parameter_names]
    eta2 = [getattr(l, f"{n}_prior_eta2") for l in self.private_layers for n in l.parameter_names]
    return flatten(eta1), flatten(eta2)

  def shared_prior(self):
    """`(eta1, eta2)` of the server layers' priors (the Keras path's KL target), flat `[P]`."""
    prior = self.net.shared_prior()
    return flatten(prior.eta1), flatten(prior.eta2)

  # -- client states <-> flat vectors ------------------------------------------------

  def shared_from_natural(self, g: gaussian.NaturalGaussian, clients: int):
    """`(loc, u)` `[C, P]` of a shared posterior whose leaves carry a leading client
    axis, as `BayesianDense.set_posterior` assigns them (`u = softplus^-1(max(sigma
    - min_scale, tiny))`)."""
    locs, scales = gaussian.to_loc_scale(g)
    loc, scale = flatten(locs, clients), flatten(scales, clients)
    tiny = np.finfo(np.float32).tiny
    return loc, tfp.math.softplus_inverse(tf.maximum(scale - self.shared_min_scale, tiny))

  def shared_to_natural(self, loc, u) -> gaussian.NaturalGaussian:
    """The shared posterior `[C, *shape]` leaves of flat `(loc, u)`, as
    `BayesianDense.posterior` reads it (`sigma = softplus(u) + min_scale`)."""
    sigma = tf.nn.softplus(u) + self.shared_min_scale
    locs = [t for pair in self.views(loc, "shared") for t in pair]
    scales = [t for pair in self.views(sigma, "shared") for t in pair]
    return gaussian.from_loc_scale(locs, scales)

  def private_from_list(self, private: Sequence, clients: int):
    """`(private_loc, private_u, gates)` `[C, P]` of a stacked `private` list."""
    return tuple(
        flatten([private[j]
               for j in self.private_index[role]], clients)
        for role in ("private_loc", "private_u", "gates"))

  def private_to_list(self, private_loc, private_u, gates) -> List[tf.Tensor]:
    """The stacked `private` list (`[C, *shape]` per variable) of the flat vectors."""
    out = [None] * self.private_count
    for role, flat, sizes in (("private_loc", private_loc, self.private_sizes),
                              ("private_u", private_u, self.private_sizes), ("gates", gates,
                                                                             self.gate_sizes)):
      for j, part in zip(self.private_index[role], tf.split(flat, sizes, axis=-1)):
        out[j] = tf.reshape(part, [-1] + self.private_var_shapes[j])
    return out

  # -- views -------------------------------------------------------------------------

  def views(self, flat, role):
    """Per-layer `[(kernel, bias), ...]` `[C, *shape]` views of a flat `[C, P]`
    `role` vector (`"shared"`: one per server layer; `"private"`: client layers,
    then V, U per lateral)."""
    sizes, shapes = ((self.shared_sizes, self.shared_shapes) if role == "shared" else
                     (self.private_sizes, self.private_shapes))
    lead = flat.shape[:-1].as_list()  # [C], or [] for one client unbatched
    parts = [tf.reshape(p, lead + s) for p, s in zip(tf.split(flat, sizes, axis=-1), shapes)]
    return list(zip(parts[0::2], parts[1::2]))


# -- forward -------------------------------------------------------------------------


def _client_noise(layout: Layout, seed, batch_size: int, private: bool):
  """One client's standard normals of one step, as `net.forward(x, seed)` draws
  them: layer `j` of `3 L` gets `stateless_split(seed, 3 L)[j]` (server layers,
  client layers, laterals), a lateral splits its seed in two for `V` and `U`."""
  L = layout.depth
  net = layout.net
  seeds = tf.random.experimental.stateless_split(tf.convert_to_tensor(seed), num=3 * L)
  normal = lambda units, s: tf.random.stateless_normal([batch_size, units], seed=s)
  noise = [normal(layout.server_layers[l].units, seeds[l]) for l in range(L)]
  if not private:
    return noise
  noise += [normal(net.client_layers[l].units, seeds[L + l]) for l in range(L)]
  lat_seeds = [tf.random.experimental.stateless_split(seeds[2 * L + l], num=2) for l in range(L)]
  noise += [normal(net.laterals[l].adapter_units, lat_seeds[l][0]) for l in range(L)]
  noise += [normal(net.laterals[l].units, lat_seeds[l][1]) for l in range(L)]
  return noise


def draw_noise(layout: Layout, seeds, batch_size: int, private: bool = True):
  """The standard normals of one step for C clients, each as the Keras network
  draws them from its own seed (`seeds [C, 2]`, C static).

  Returns the list `[server_1..L, client_1..L, V_1..L, U_1..L]` of `[C, B, units]`
  tensors (server only with `private=False`).
  """
  per_client = [
      _client_noise(layout, seeds[c], batch_size, private) for c in range(int(seeds.shape[0]))
  ]
  return [tf.stack(parts) for parts in zip(*per_client)]


def _dense(layer, x, loc, var, eps):
  """`x W + b` by local reparameterization (`BayesianDense`), no activation, batched
  over clients: `x [C, B, n_in]`, `loc`/`var` `(kernel [C, n_in, n_out], bias
  [C, n_out])` means and variances; `eps` a `[C, B, n_out]` standard normal, or
  `None` for the posterior-mean pass.
  """
  # `+ b` rather than `tf.nn.bias_add` (the same sums): with oneDNN, grappler's
  # remapper breaks on `relu(bias_add(matmul) + ...)` ("Node ... Relu has an empty op
  # name") and then skips optimising the whole step function.
  mean = tf.matmul(x, loc[0]) + loc[1][..., None, :]
  if eps is None:
    return mean
  variance = tf.matmul(tf.square(x), var[0]) + var[1][..., None, :]
  return mean + tf.sqrt(variance + layer.variance_epsilon) * eps


def _activate(layer, out):
  return out if layer.activation is None else layer.activation(out)


def forward(layout: Layout, params: Parameters, x, noise=None, private: bool = True):
  """`(server_logits, client_logits)` `[C, B, classes]` of the flat parameters, as
  `net.forward` for each client.

  One softplus and one variance per role over the flat vectors, then the layers'
  local reparameterization (module docstring). `x`: `[C, B, input_dim]`; `noise`:
  the list of `draw_noise`, or `None` for the posterior-mean pass. With
  `private=False` only the server network runs and `client_logits` is `None`.
  """
  net = layout.net
  L = layout.depth

  def loc_var(loc, u, min_scale, role):
    locs = layout.views(loc, role)
    if noise is None:
      return locs, [None] * len(locs)
    sigma = tf.nn.softplus(u) + min_scale
    return locs, layout.views(tf.square(sigma), role)

  eps = (lambda i: None) if noise is None else (lambda i: noise[i])
  s_loc, s_var = loc_var(params.shared_loc, params.shared_u, layout.shared_min_scale, "shared")
  h_s = [x]
  for l, layer in enumerate(layout.server_layers):
    h_s.append(_activate(layer, _dense(layer, h_s[-1], s_loc[l], s_var[l], eps(l))))
  if not private:
    return h_s[-1], None
  p_loc, p_var = loc_var(params.private_loc, params.private_u, layout.private_min_scale, "private")
  gates = tf.split(params.gates, layout.gate_sizes, axis=-1)
  h_c = x
  for l in range(L):
    client = net.client_layers[l]
    v_layer, u_layer = net.laterals[l].adapter_in, net.laterals[l].adapter_out
    iv, iu = L + 2 * l, L + 2 * l + 1  # V_l, U_l among the private layers' views
    pre = _activate(client, _dense(client, h_c, p_loc[l], p_var[l], eps(L + l)))
    hidden = _activate(v_layer, _dense(v_layer, h_s[l + 1], p_loc[iv], p_var[iv], eps(2 * L + l)))
    lateral = gates[l][..., None, :] * _activate(
        u_layer, _dense(u_layer, hidden, p_loc[iu], p_var[iu], eps(3 * L + l)))
    h_c = net.client_output(l, pre + lateral)
  return h_s[-1], h_c


# -- KL and the precision step --------------------------------------------------------


def kl_gradients(loc, u, min_scale, eta1_t, eta2_t):
  """Analytic gradient of `sum KL(N(loc, sigma^2) || t)`, `sigma = softplus(u) + min_scale`.

  With the target `t` in natural parameters `(eta1_t, eta2_t)`
  (`prec_t = eta2_t`, `mu_t = eta1_t / eta2_t`),

  ```none
  KL      = 1/2 sum [prec_t sigma^2 + prec_t (mu - mu_t)^2 - 1 - log(prec_t sigma^2)]
  dKL/dmu = prec_t mu - eta1_t
  dKL/du  = (sigma prec_t - 1/sigma) sigmoid(u)
  ```

  Returns `(dKL/dloc, dKL/du)`, shaped like `loc`.
  """
  sigma = tf.nn.softplus(u) + min_scale
  return eta2_t * loc - eta1_t, (sigma * eta2_t - 1.0 / sigma) * tf.math.sigmoid(u)


def natural_precision_update(u, grad_data_u, prior_precision, min_scale, rho, kl_scale):
  """The natural-gradient precision step of the shared scales, on tensors.

  `keras_step.assign_natural_precision_step` with the *data* gradient `grad_data_u` of the
  softplus-scales (the lean step has it before the KL part is added, so nothing is
  subtracted): `g_sigma = grad_data_u / sigmoid(u)`, `h = g_sigma / sigma`,

  ```none
  prec <- (1 - rho) prec + rho max(prec_t + h / kl_scale, prec_t)
  ```

  Returns the new `u = softplus^-1(max(prec^-1/2 - min_scale, tiny))`.
  """
  sigma = tf.nn.softplus(u) + min_scale
  g_data = tf.math.divide_no_nan(grad_data_u, tf.math.sigmoid(u))
  h = g_data / sigma
  precision = 1.0 / tf.square(sigma)
  # Signed h keeps the average unbiased; only a target below the KL target's
  # own precision is clipped (minibatch noise), so the mix stays positive.
  target = tf.maximum(prior_precision + h / kl_scale, prior_precision)
  new_precision = (1.0 - rho) * precision + rho * target
  tiny = np.finfo(np.float32).tiny
  new_excess = tf.maximum(tf.math.rsqrt(new_precision) - min_scale, tiny)
  return tfp.math.softplus_inverse(new_excess)


# -- the step and the loop --------------------------------------------------------------


def data_loss_and_gradients(cfg, layout: Layout, params: Parameters, xb, yb, mask, noise,
                            data_loss: Callable):
  """`(data_loss [C], correct [C], grads)`: each client's masked mean data loss of
  eq. (3) (head CE, plus `server_loss_weight` times the server CE with
  `cfg.private`), the correct count of its head, and the gradient of each client's
  loss with respect to its own flat `params` (the clients are independent, so one
  tape over the sum gives them all; the private entries are `None` with
  `private=False`). `data_loss(cfg, y, outputs, mask, axis)`: `model.data_loss`.
  """
  private = cfg.private
  sources = list(params) if private else [params.shared_loc, params.shared_u]
  with tf.GradientTape() as tape:
    tape.watch(sources)
    server_out, client_out = forward(layout, params, xb, noise, private=private)
    count = tf.maximum(tf.reduce_sum(mask, axis=-1), 1.0)  # an idle client: 0 / 1
    head = client_out if private else server_out
    nll, correct = data_loss(cfg, yb, head, mask, axis=-1)
    loss = nll / count
    if private and cfg.server_loss_weight > 0:
      loss += cfg.server_loss_weight * data_loss(cfg, yb, server_out, mask, axis=-1)[0] / count
    total = tf.reduce_sum(loss)
  grads = tape.gradient(total, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
  grads = list(grads) + [None] * (5 - len(grads))
  return loss, correct, Parameters(*grads)


def sgd_step(cfg,
             layout: Layout,
             params: Parameters,
             xb,
             yb,
             mask,
             step_seeds,
             kl_scale,
             shared_prior,
             private_prior,
             data_loss: Callable,
             noise=True):
  """One SGD step of `client.client_update` for C clients on flat parameters.

  Args:
    cfg: the `VirtualConfig`.
    layout: the network's `Layout`.
    params: current `Parameters` (`[C, P]` each).
    xb, yb, mask: fixed-size minibatches `[C, B, ...]` and their `[C, B]` masks.
    step_seeds: `[C, 2]` integer seeds of the step's noise (`draw_noise`).
    kl_scale: `KLScales`, each `[C, 1]`.
    shared_prior: `(eta1, eta2)` `[C, P]`, each client's KL target `p^(1/K) cav_c`.
    private_prior: `(eta1, eta2)` `[P]`, the private prior.
    data_loss: `model.data_loss`.
    noise: `False` for the posterior-mean pass (no sampling; tests).

  Returns:
    `(new Parameters, data_loss * sum(mask) [C], correct [C])`.
  """
  if not noise:
    eps = None
  elif step_seeds.shape.rank == 1:  # one client, unbatched
    eps = _client_noise(layout, step_seeds, xb.shape[0], cfg.private)
  else:
    eps = draw_noise(layout, step_seeds, xb.shape[1], cfg.private)
  loss, correct, g = data_loss_and_gradients(cfg, layout, params, xb, yb, mask, eps, data_loss)
  lr = cfg.client_lr
  eta1_s, eta2_s = shared_prior
  kl_loc, kl_u = kl_gradients(params.shared_loc, params.shared_u, layout.shared_min_scale, eta1_s,
                              eta2_s)
  # Implicit (proximal) step on the KL quadratic of the shared means.
  k, k_p = kl_scale
  g_loc = (g.shared_loc + k * kl_loc) / (1.0 + lr * k * eta2_s)
  shared_loc = params.shared_loc - lr * g_loc
  if cfg.natural_precision_step:
    shared_u = natural_precision_update(params.shared_u, g.shared_u, eta2_s,
                                        layout.shared_min_scale, cfg.precision_step, k)
  else:
    shared_u = params.shared_u - lr * (g.shared_u + k * kl_u)
  new = params._replace(shared_loc=shared_loc, shared_u=shared_u)
  if cfg.private:
    eta1_p, eta2_p = private_prior
    kl_loc_p, kl_u_p = kl_gradients(params.private_loc, params.private_u, layout.private_min_scale,
                                    eta1_p, eta2_p)
    new = new._replace(
        private_loc=params.private_loc - lr * (g.private_loc + k_p * kl_loc_p),
        private_u=params.private_u - lr * (g.private_u + k_p * kl_u_p),
        gates=params.gates - lr * g.gates,
    )
  return new, loss * tf.reduce_sum(mask, axis=-1), correct


# -- the fused step: one packed vector per role, one pass per operation ----------------

_ALIGN = 16  # floats (64 bytes): aligned tf.split pieces of a 1-D vector share its buffer


def _padded(size: int) -> int:
  return -(-size // _ALIGN) * _ALIGN


class _Group:
  """Layers that read the same input, run as one matmul: `tags` `("S"|"C"|"V"|"U", l)`,
  `units` each, kernel `[n_in, width]` (the layers' kernels side by side, then zero
  columns up to `width`, a multiple of 16 floats, so every block is aligned)."""

  def __init__(self, tags, layers, n_in):
    self.tags, self.layers, self.n_in = list(tags), list(layers), int(n_in)
    self.units = [int(l.units) for l in layers]
    self.pad = _padded(sum(self.units)) - sum(self.units)
    self.width = sum(self.units) + self.pad
    eps = [float(l.variance_epsilon) for l in layers]
    self.variance_epsilon = (eps[0] if len(set(eps)) == 1 else np.concatenate(
        [np.full([u], e, np.float32) for u, e in zip(self.units, eps)] +
        [np.ones([self.pad], np.float32)]))


class FusedPlan:
  """The packed layout of the fused step (`train_clients` without the natural
  precision step).

  All Bayesian parameters of the client's step (server layers, and with `private`
  the client layers and lateral adapters) live in one vector per role, `loc` and
  `u` `[P]` (`[C, P]` batched), grouped by matmul: layers that read the same input
  share one block `[n_in + 1, width]`, their kernels side by side and their biases
  as the last row (the input gets a column of ones, so the bias is added by the
  matmul and its gradient comes out of the matmul's: no bias add, no reduction);
  `x` feeds server and client layer 1, `h_s^l` server layer `l + 1` and the
  adapter `V_l`, so the step runs 9 matmul pairs instead of 12 for the 3-layer
  MLP. Every block is a multiple of 16 floats long (zero columns complete a kernel whose
  width is not; their outputs are dropped), so the per-step views (`tf.split`,
  `tf.reshape`) of a one-client vector alias it (no copy: TF shares the buffer of
  aligned dim-0 pieces) and the gradient of the views is one concat. `pack` /
  `unpack` map the `Parameters` layout (shared, private) to it and back, once a
  round (one gather each).
  """

  def __init__(self, layout: Layout, private: bool):
    self.layout, self.private = layout, private
    net, L = layout.net, layout.depth
    self.depth = L
    server = layout.server_layers
    client = list(net.client_layers)
    v_layers = [lat.adapter_in for lat in net.laterals]
    u_layers = [lat.adapter_out for lat in net.laterals]
    n_in = lambda layer: int(layer.kernel_loc.shape[0])
    groups = [_Group([("S", 0)] + ([("C", 0)] if private else []), [server[0]] +
                     ([client[0]] if private else []), n_in(server[0]))]
    for l in range(1, L):
      groups.append(
          _Group([("S", l)] + ([("V", l - 1)] if private else []), [server[l]] +
                 ([v_layers[l - 1]] if private else []), n_in(server[l])))
    if private:
      groups.append(_Group([("V", L - 1)], [v_layers[L - 1]], n_in(v_layers[L - 1])))
      groups += [_Group([("U", l)], [u_layers[l]], n_in(u_layers[l])) for l in range(L)]
      groups += [_Group([("C", l)], [client[l]], n_in(client[l])) for l in range(1, L)]
    self.groups = groups
    self.group_of = {tag: g for g in groups for tag in g.tags}
    # Where each layer's kernel and bias start in the (shared | private) source vector.
    shared_off = np.cumsum([0] + layout.shared_sizes)
    private_off = layout.shared_total + np.cumsum([0] + layout.private_sizes)
    source = {("S", l): shared_off[2 * l] for l in range(L)}
    if private:
      source.update({("C", l): private_off[2 * l] for l in range(L)})
      source.update({("V", l): private_off[2 * L + 4 * l] for l in range(L)})
      source.update({("U", l): private_off[2 * L + 4 * l + 2] for l in range(L)})
    self.source_size = layout.shared_total + (layout.private_total if private else 0)
    dummy = self.source_size  # a trailing 0 of the source: the padding
    index, sizes, min_scale = [], [], []
    for g in groups:
      # Kernel rows, then the bias as row n_in (the input gets a column of ones).
      rows = np.arange(g.n_in + 1)[:, None]
      block = np.concatenate([
          source[t] + np.minimum(rows, g.n_in) * u + np.arange(u)[None, :]
          for t, u in zip(g.tags, g.units)
      ] + [np.full([g.n_in + 1, g.pad], dummy)], 1).reshape([-1])
      mins = [np.full([u], l.min_scale, np.float32) for l, u in zip(g.layers, g.units)]
      mins = np.concatenate(mins + [np.zeros([g.pad], np.float32)])
      index.append(block)
      min_scale.append(np.tile(mins, g.n_in + 1))
      sizes.append(block.size)
    self.index = np.concatenate(index).astype(np.int32)  # packed <- source
    self.size = int(self.index.size)
    self.sizes = sizes  # one [n_in + 1, width] block per group, a multiple of 16 floats
    real = self.index < dummy
    self.inverse = np.zeros([self.source_size], np.int32)  # source <- packed
    self.inverse[self.index[real]] = np.nonzero(real)[0]
    mins = np.concatenate(min_scale)
    self.min_scale = (float(mins[real][0]) if np.all(mins[real] == mins[real][0]) else mins)

  def pack(self, shared, private=None):
    """`[C, P]` packed of the role vectors `shared` `[C, P_s]` (and `private`)."""
    parts = [shared] + ([private] if self.private else [])
    parts.append(tf.zeros_like(shared[..., :1]))
    return tf.gather(tf.concat(parts, -1), self.index, axis=-1)

  def unpack(self, packed):
    """`(shared, private)` role vectors of a packed `[C, P]` (private `None` without)."""
    source = tf.gather(packed, self.inverse, axis=-1)
    shared_total = self.layout.shared_total
    if not self.private:
      return source, None
    return source[..., :shared_total], source[..., shared_total:]

  def views(self, flat):
    """`{group: [C, n_in + 1, width]}` blocks (kernel rows, then the bias) of a packed
    vector."""
    lead = flat.shape[:-1].as_list()
    parts = tf.split(flat, self.sizes, axis=-1)
    return {id(g): tf.reshape(p, lead + [g.n_in + 1, g.width]) for g, p in zip(self.groups, parts)}

  def group_noise(self, noise):
    """Per group `[C, B, width]` standard normals from `draw_noise`'s per-layer list."""
    L = self.depth
    position = lambda kind, l: {"S": 0, "C": L, "V": 2 * L, "U": 3 * L}[kind] + l
    out = {}
    for g in self.groups:
      eps = [noise[position(*t)] for t in g.tags]
      if g.pad:
        eps.append(tf.zeros(tf.concat([tf.shape(eps[0])[:-1], [g.pad]], 0)))
      out[id(g)] = eps[0] if len(eps) == 1 else tf.concat(eps, -1)
    return out

  def forward(self, loc, var, gates, x, noise):
    """`(server_logits, client_logits)` of packed means `loc` and variances `var`
    (`noise`: `group_noise`'s, or `None` for the posterior-mean pass); as `forward`."""
    net, L = self.layout.net, self.depth
    loc_v = self.views(loc)
    var_v = self.views(var) if noise is not None else None
    out = {}

    def run(tag, h):
      g = self.group_of[tag]
      h = tf.concat([h, tf.ones(h.shape[:-1].as_list() + [1])], -1)  # the bias row's input
      y = tf.matmul(h, loc_v[id(g)])
      if noise is not None:
        variance = tf.matmul(tf.square(h), var_v[id(g)])
        y += tf.sqrt(variance + g.variance_epsilon) * noise[id(g)]
      parts = tf.split(y, g.units + [g.pad], axis=-1) if g.pad or len(g.tags) > 1 else [y]
      out.update(zip(g.tags, parts))

    run(("S", 0), x)
    server = self.layout.server_layers
    h_s = []
    for l in range(L):
      h_s.append(_activate(server[l], out[("S", l)]))
      if l + 1 < L or self.private:
        run(("S", l + 1) if l + 1 < L else ("V", l), h_s[-1])
    if not self.private:
      return h_s[-1], None
    gate = tf.split(gates, self.layout.gate_sizes, axis=-1)
    h_c = None
    for l in range(L):
      lat = net.laterals[l]
      run(("U", l), _activate(lat.adapter_in, out[("V", l)]))
      if l > 0:
        run(("C", l), h_c)
      g_l = gate[l] if gate[l].shape.rank == 1 else gate[l][:, None, :]
      lateral = g_l * _activate(lat.adapter_out, out[("U", l)])
      pre = _activate(net.client_layers[l], out[("C", l)])
      h_c = net.client_output(l, pre + lateral)
    return h_s[-1], h_c


def round_constants(cfg, plan: FusedPlan, kl_scale, shared_prior, private_prior):
  """The per-entry coefficients of the fused update, computed once a round.

  With `D = 1 / (1 + lr k prec_t)` on the shared means (the implicit proximal step)
  and `D = 1` on the private ones (`k = kl_scale.shared` and target `(eta1_t, prec_t)`
  on the shared entries, `kl_scale.private` and the private prior on the private), the
  SGD step of `sgd_step` on a mean is

  ```none
  mu <- mu - lr D (g + k (prec_t mu - eta1_t)) = A mu + B - C g',
  A = 1 - lr k prec_t D,  B = lr k eta1_t D,  C = D / 2
  ```

  with `g' = 2 lr g` the gradient of the data loss scaled by `2 lr` (`fused_step`
  differentiates `2 lr` times the loss). On a softplus-scale, with `dL/dvar` scaled
  the same way (`g_v`) and `sigma = softplus(u) + min_scale`,

  ```none
  u <- u - lr sigmoid(u) (2 sigma dL/dvar + k (sigma prec_t - 1 / sigma))
     = u - sigmoid(u) (sigma (g_v + K1) - K2 / sigma),   K1 = lr k prec_t,  K2 = lr k.
  ```

  Returns `(A, B, C, K1, K2)`, packed `[C, P]` (`[P]` and scalars for one client
  unbatched, `kl_scale` scalars), `K2` `[C, 1]` where both KL terms have the same weight
  (packed otherwise).
  """
  lr = cfg.client_lr
  k, k_p = kl_scale
  eta1_s, eta2_s = shared_prior
  d = 1.0 / (1.0 + lr * k * eta2_s)
  a_s, b_s, c_s = 1.0 - lr * k * eta2_s * d, lr * k * eta1_s * d, 0.5 * d
  k1_s = lr * k * eta2_s
  if plan.private:
    eta1_p, eta2_p = private_prior
    lead = tf.shape(eta1_s)[:-1]
    tile = lambda t: tf.broadcast_to(t, tf.concat([lead, tf.shape(t)], 0))
    eta1_p, eta2_p = tile(eta1_p), tile(eta2_p)
    a_p, b_p = 1.0 - lr * k_p * eta2_p, lr * k_p * eta1_p
    c_p, k1_p = 0.5 * tf.ones_like(eta1_p), lr * k_p * eta2_p
    pack = plan.pack
    k2 = lr * k  # one value a client unless the private KL has a weight of its own
    if cfg.private_beta != cfg.kl_weight:
      k2 = pack(lr * k * tf.ones_like(eta1_s), lr * k_p * tf.ones_like(eta1_p))
    return (pack(a_s, a_p), pack(b_s, b_p), pack(c_s, c_p), pack(k1_s, k1_p), k2)
  return tuple(plan.pack(t) for t in (a_s, b_s, c_s, k1_s)) + (lr * k,)


ADAM_BETA1, ADAM_BETA2, ADAM_EPSILON = 0.9, 0.999, 1e-8


def adam_start(u):
  """Adam's zero moments and step count for the scales `u` (`[C, P]`, or `[P]`)."""
  count = tf.zeros(tf.shape(u)[:-1], tf.float32)
  return tf.zeros_like(u), tf.zeros_like(u), count


def adam_update(u, grad, moments, lr):
  """One Adam step (Kingma & Ba, 2015) on `u` with gradient `grad`.

  ```none
  m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2,   t <- t + 1
  u <- u - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
  ```

  `moments = (m, v, t)`, `t` per client (`[C]`, a scalar for one client), so a client
  idle in a step of a batched loop (kept by `client_batch.train_loop`) keeps its
  count. Returns `(new u, new moments)`.
  """
  m, v, t = moments
  t = t + 1.0
  m = ADAM_BETA1 * m + (1.0 - ADAM_BETA1) * grad
  v = ADAM_BETA2 * v + (1.0 - ADAM_BETA2) * tf.square(grad)
  tb = t[..., None] if t.shape.rank == 1 else t
  m_hat = m / (1.0 - tf.pow(ADAM_BETA1, tb))
  v_hat = v / (1.0 - tf.pow(ADAM_BETA2, tb))
  return u - lr * m_hat / (tf.sqrt(v_hat) + ADAM_EPSILON), (m, v, t)


def fused_step(cfg, plan: FusedPlan, state, xb, yb, mask, step_seeds, constants,
               data_loss: Callable):
  """One SGD step of `sgd_step` (no natural precision step) on the packed state.

  `state`: `(loc, u, gates)`, with `cfg.scale_optimizer == "adam"` followed by the
  scales' Adam moments (`adam_start`), which then update `u` (`adam_update`) with the
  same gradient SGD takes; `constants`: `round_constants`. Per step: one softplus,
  one variance, the matmuls, one concat per gradient, then the update of
  `round_constants` in one expression per role: 3 + 4 + 6 passes over the packed
  parameters (docs/virtual.md, "The fused step").

  Returns `(new state, data_loss * sum(mask), correct)`.
  """
  loc, u, gates = state[:3]
  a, b, c, k1, k2 = constants
  sigma = tf.math.log1p(tf.exp(u)) + plan.min_scale  # softplus(u) + min_scale
  var = tf.square(sigma)
  if step_seeds.shape.rank == 1:  # one client, unbatched
    eps = _client_noise(plan.layout, step_seeds, xb.shape[0], plan.private)
  else:
    eps = draw_noise(plan.layout, step_seeds, xb.shape[1], plan.private)
  sources = [loc, var] + ([gates] if plan.private else [])
  with tf.GradientTape() as tape:
    tape.watch(sources)
    server_out, client_out = plan.forward(loc, var, gates, xb, plan.group_noise(eps))
    count = tf.maximum(tf.reduce_sum(mask, axis=-1), 1.0)
    head = client_out if plan.private else server_out
    nll, correct = data_loss(cfg, yb, head, mask, axis=-1)
    loss = nll / count
    if plan.private and cfg.server_loss_weight > 0:
      loss += cfg.server_loss_weight * data_loss(cfg, yb, server_out, mask, axis=-1)[0] / count
    total = tf.reduce_sum(loss) * (2.0 * cfg.client_lr)
  grads = tape.gradient(total, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
  new_loc = a * loc + (b - c * grads[0])
  # lr times dL/du, the KL part included (`round_constants`).
  lr_grad_u = tf.raw_ops.SoftplusGrad(gradients=sigma * (grads[1] + k1) - k2 / sigma, features=u)
  new_gates = gates - 0.5 * grads[2] if plan.private else gates
  if cfg.scale_optimizer == "adam":
    new_u, moments = adam_update(u, lr_grad_u / cfg.client_lr, state[3:], cfg.scale_lr)
    return (new_loc, new_u, new_gates) + moments, loss * tf.reduce_sum(mask, axis=-1), correct
  return (new_loc, u - lr_grad_u, new_gates), loss * tf.reduce_sum(mask, axis=-1), correct


def train_clients(cfg, layout: Layout, params: Parameters, shared_prior, x, y, n, seeds,
                  data_loss: Callable, fused: Optional[bool] = None):
  """E epochs of masked-minibatch SGD on eq. (3) for C stacked clients.

  Args:
    cfg: the `VirtualConfig` (`cfg.jit_compile`: the step function is compiled by
      XLA where the runtime has XLA, i.e. plain TensorFlow; TFF's worker has none).
    layout: the network's `Layout`.
    params: the clients' starting `Parameters` `[C, P]`.
    shared_prior: `(eta1, eta2)` `[C, P]`, each client's KL target.
    x, y, n: stacked data `[C, n_max, input_dim]`, `[C, n_max]` and sizes `[C]`.
    seeds: `[C, 2]` client seeds. Minibatches are those of `client.client_update`
      for each client alone (`client_batch.MinibatchSchedule`), step seeds
      `stateless_fold_in(seed_c, step)`.
    fused: the fused step (`fused_step`, packed parameters; default without the
      natural precision step) or `sgd_step` (the reference; always with it).

  Returns:
    `(Parameters, summed data loss [C], summed correct [C])` over each client's steps.
  """
  clients = int(seeds.shape[0])
  if fused is None:
    fused = not cfg.natural_precision_step
  if fused and cfg.natural_precision_step:
    raise ValueError("the fused step has no natural precision step (precision_step > 0).")
  if not fused and cfg.scale_optimizer != "sgd":
    raise ValueError(f"scale_optimizer={cfg.scale_optimizer!r} runs in the fused step only.")
  schedule = client_batch.MinibatchSchedule(seeds, n, tf.shape(y)[1], cfg.epochs, cfg.batch_size)
  kl_scale = kl_scales(cfg, n[:, None])
  kl_scale_1 = KLScales(*(t[0, 0] for t in kl_scale))  # one client, unbatched
  private_prior = layout.private_prior() if cfg.private else (tf.zeros([0]), tf.zeros([0]))
  if not cfg.private:  # the client network is neither run nor trained
    params = params._replace(private_loc=tf.zeros([clients, 0]),
                             private_u=tf.zeros([clients, 0]),
                             gates=tf.zeros([clients, 0]))
  single = clients == 1  # unbatched: 2-D matmuls (oneDNN's batched matmul costs ~30 us
  # a call more at these sizes; the one-client step ran 2x slower batched)
  one = (lambda t: t[0]) if single else (lambda t: t)

  def step_seeds_of(step):
    if single:
      return tf.random.experimental.stateless_fold_in(seeds[0], step)
    return tf.stack(
        [tf.random.experimental.stateless_fold_in(seeds[c], step) for c in range(clients)])

  zeros = tf.zeros([clients])
  if fused:
    plan = FusedPlan(layout, cfg.private)
    private = params.private_loc if cfg.private else None
    private_u = params.private_u if cfg.private else None
    start = (plan.pack(params.shared_loc, private), plan.pack(params.shared_u, private_u),
             params.gates)
    if cfg.scale_optimizer == "adam":
      start += adam_start(start[1])
    constants = round_constants(cfg, plan, kl_scale_1 if single else kl_scale,
                                tuple(one(t) for t in shared_prior), private_prior)

    # A function of its own per step (a call op in the loop body): grappler then
    # optimises the step as the old per-client step was (measured: inline, 2x slower).
    @tf.function(jit_compile=cfg.jit_compile, autograph=False)
    def fused_fn(state, xb, yb, mask, step):
      new, loss, correct = fused_step(cfg, plan, state, xb, yb, mask, step_seeds_of(step),
                                      constants, data_loss)
      return new, (loss, correct)

    state, (loss_sum, correct_sum) = client_batch.train_loop(schedule, x, y, start, fused_fn,
                                                             (zeros, zeros))
    loc, u, gates = state[:3]
    shared_loc, private_loc = plan.unpack(loc)
    shared_u, private_u = plan.unpack(u)
    if not cfg.private:
      private_loc, private_u = params.private_loc, params.private_u
    return Parameters(shared_loc, shared_u, private_loc, private_u, gates), loss_sum, correct_sum

  shared_prior_1 = tuple(t[0] for t in shared_prior)

  @tf.function(jit_compile=cfg.jit_compile, autograph=False)
  def step_fn(params, xb, yb, mask, step):
    if single:
      new, loss, correct = sgd_step(cfg, layout, Parameters(*params), xb, yb, mask,
                                    step_seeds_of(step), kl_scale_1, shared_prior_1,
                                    private_prior, data_loss)
      return tuple(new), (loss, correct)
    new, loss, correct = sgd_step(cfg, layout, Parameters(*params), xb, yb, mask,
                                  step_seeds_of(step), kl_scale, shared_prior, private_prior,
                                  data_loss)
    return tuple(new), (loss, correct)

  state, (loss_sum, correct_sum) = client_batch.train_loop(schedule, x, y, tuple(params), step_fn,
                                                           (zeros, zeros))
  return Parameters(*state), loss_sum, correct_sum

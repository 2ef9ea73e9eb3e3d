"""A lean, client-batched VIRTUAL step for the MLP: flat parameter vectors, analytic KL.

`virtual.client_update` trains the Keras `VirtualNetworks` step by step through its
layers: every step reads 40-odd variables, takes a softplus, a variance and a KL per
parameter tensor and differentiates the KL value. This module runs the *same*
objective and the *same* SGD trajectory on a few flat float32 vectors carried by the
training loop instead:

```none
mu_s, u_s    shared means and softplus-scales   [k_1, b_1, ..., k_L, b_L]
mu_p, u_p    private means and softplus-scales  [client k_l, b_l]_l, [V_l, c_l, U_l, d_l]_l
g            the lateral gates (point estimates) [g_1, ..., g_L]
```

They are read from the network once, split into per-layer views with static
`tf.split`/`tf.reshape` inside the step, and written back once after the loop, so
`net.shared_posterior()` and `net.get_private_weights()` give the trained values.

**Forward** (`forward`), exactly the layers' local reparameterization
(`tfbfl.layers.BayesianDense`): per role one `sigma = softplus(u) + min_scale` and
one variance `sigma^2` over the flat vector; per layer

```none
m = x mu_W + mu_b,   v = x^2 sigma_W^2 + sigma_b^2,   y = m + sqrt(v + variance_epsilon) e
```

with one standard normal `e` per pre-activation. The server layer applies its
activation (all but the last), the lateral is `g * (U act(V h_s + c) + d)` and the
client output is `act(client pre-activation + lateral)` but on the last layer.
`draw_noise` draws every `e` from the seeds the Keras network uses
(`stateless_split(seed, 3 L)`, each lateral's seed split in two for `V`, `U`), so
with the same step seed both paths see the same noise (outside XLA).

**Gradient.** Only the data loss is differentiated (`tf.GradientTape` over the flat
vectors). The KL terms of eq. (3), `KL(q || t) = sum 1/2 [prec_t sigma^2 +
prec_t (mu - mu_t)^2 - 1 - log(prec_t sigma^2)]`, against the shared target
`t = p^(1/K) cav_i` and the private prior `p(phi)` (the client layers' own prior,
`N(0, prior_scale^2)`), have the analytic gradient (`kl_gradients`)

```none
dKL/dmu = prec_t mu - eta1_t = prec_t (mu - mu_t)
dKL/du  = (sigma prec_t - 1/sigma) * sigmoid(u)        (dsigma/du = sigmoid(u))
```

and the total gradient is `grad data_loss + kl_scale * grad KL`, `kl_scale = beta/N_i`.

**Update** (`sgd_step`), as `virtual.client_update`'s Keras step: the shared means
take the implicit proximal step `mu_s -= lr g / (1 + lr kl_scale prec_t)`; the
shared scales take SGD or, with `cfg.natural_precision_step`, the natural-gradient
precision step (`natural_precision_update`); the private means, scales and gates
take plain SGD (only with `cfg.private`; otherwise the client network is neither run
nor trained). Minibatches are the masked fixed-size batches of the stateless
per-epoch shuffles of `client_update`, in the same order from the same seed.

**Clients batched** (`train_clients`): every vector above carries a leading client
axis `[C, P]`, the minibatches are `[C, B, ...]` and the matmuls batched
(`tfbfl.algorithms.client_batch`): C clients train in one loop of `max_c S_c` steps,
each on its own minibatches, seeds, KL target and `kl_scale = beta / N_c`, and each
equals its one-client run up to float summation order. One client is `C = 1`.
"""

from __future__ import annotations

import collections
from typing import Callable, List, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbfl import gaussian
from tfbfl.algorithms import client_batch
from tfbfl.layers import BayesianDense

__all__ = [
    "Layout",
    "Parameters",
    "draw_noise",
    "forward",
    "kl_gradients",
    "natural_precision_update",
    "sgd_step",
    "train_clients",
]

Parameters = collections.namedtuple("Parameters",
                                    ["shared_loc", "shared_u", "private_loc", "private_u", "gates"])
Parameters.__doc__ = """The trainable state as flat float32 vectors `[C, P]` (see the
module docstring for the order of each)."""


def _flat(tensors, clients=None):
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
  """Static description of a `models.VirtualNetworks` for the flat-vector step.

  Holds, in flat-vector order, the Keras variables of each role (to read and write
  them in tests), the shapes for the per-layer views, the positions of each role's
  tensors in `net.private_trainable_variables` (the order of a client state's
  `private` list), and each layer's activation, `min_scale` and `variance_epsilon`.
  The step itself reads no variable.

  Args:
    net: a built `models.VirtualNetworks` (every server, client and lateral layer a
      `BayesianDense` or a `LateralConnection` of them).
  """

  def __init__(self, net):
    self.net = net
    self.depth = len(net.server_layers)
    dense = list(net.server_layers) + list(net.client_layers)
    dense += [l for lat in net.laterals for l in (lat.adapter_in, lat.adapter_out)]
    for layer in dense:
      if not isinstance(layer, BayesianDense):
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
        tf.expand_dims(_flat(vs), 0)
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
    return _flat(eta1), _flat(eta2)

  def shared_prior(self):
    """`(eta1, eta2)` of the server layers' priors (the Keras path's KL target), flat `[P]`."""
    prior = self.net.shared_prior()
    return _flat(prior.eta1), _flat(prior.eta2)

  # -- client states <-> flat vectors ------------------------------------------------

  def shared_from_natural(self, g: gaussian.NaturalGaussian, clients: int):
    """`(loc, u)` `[C, P]` of a shared posterior whose leaves carry a leading client
    axis, as `BayesianDense.set_posterior` assigns them (`u = softplus^-1(max(sigma
    - min_scale, tiny))`)."""
    locs, scales = gaussian.to_loc_scale(g)
    loc, scale = _flat(locs, clients), _flat(scales, clients)
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
        _flat([private[j]
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
    h_c = net._client_output(l, pre + lateral)  # pylint: disable=protected-access
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

  `virtual._natural_precision_step` with the *data* gradient `grad_data_u` of the
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
  `private=False`). `data_loss(cfg, y, outputs, mask, axis)`: `virtual._data_loss`.
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
  """One SGD step of `virtual.client_update` for C clients on flat parameters.

  Args:
    cfg: the `VirtualConfig`.
    layout: the network's `Layout`.
    params: current `Parameters` (`[C, P]` each).
    xb, yb, mask: fixed-size minibatches `[C, B, ...]` and their `[C, B]` masks.
    step_seeds: `[C, 2]` integer seeds of the step's noise (`draw_noise`).
    kl_scale: `[C, 1]`, `beta / N_c`.
    shared_prior: `(eta1, eta2)` `[C, P]`, each client's KL target `p^(1/K) cav_c`.
    private_prior: `(eta1, eta2)` `[P]`, the private prior.
    data_loss: `virtual._data_loss`.
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
  g_loc = (g.shared_loc + kl_scale * kl_loc) / (1.0 + lr * kl_scale * eta2_s)
  shared_loc = params.shared_loc - lr * g_loc
  if cfg.natural_precision_step:
    shared_u = natural_precision_update(params.shared_u, g.shared_u, eta2_s,
                                        layout.shared_min_scale, cfg.precision_step, kl_scale)
  else:
    shared_u = params.shared_u - lr * (g.shared_u + kl_scale * kl_u)
  new = params._replace(shared_loc=shared_loc, shared_u=shared_u)
  if cfg.private:
    eta1_p, eta2_p = private_prior
    kl_loc_p, kl_u_p = kl_gradients(params.private_loc, params.private_u, layout.private_min_scale,
                                    eta1_p, eta2_p)
    new = new._replace(
        private_loc=params.private_loc - lr * (g.private_loc + kl_scale * kl_loc_p),
        private_u=params.private_u - lr * (g.private_u + kl_scale * kl_u_p),
        gates=params.gates - lr * g.gates,
    )
  return new, loss * tf.reduce_sum(mask, axis=-1), correct


def train_clients(cfg, layout: Layout, params: Parameters, shared_prior, x, y, n, seeds,
                  data_loss: Callable):
  """E epochs of masked-minibatch SGD on eq. (3) for C stacked clients.

  Args:
    cfg: the `VirtualConfig`.
    layout: the network's `Layout`.
    params: the clients' starting `Parameters` `[C, P]`.
    shared_prior: `(eta1, eta2)` `[C, P]`, each client's KL target.
    x, y, n: stacked data `[C, n_max, input_dim]`, `[C, n_max]` and sizes `[C]`.
    seeds: `[C, 2]` client seeds. Minibatches are those of `virtual.client_update`
      for each client alone (`client_batch.MinibatchSchedule`), step seeds
      `stateless_fold_in(seed_c, step)`.

  Returns:
    `(Parameters, summed data loss [C], summed correct [C])` over each client's steps.
  """
  clients = int(seeds.shape[0])
  schedule = client_batch.MinibatchSchedule(seeds, n, tf.shape(y)[1], cfg.epochs, cfg.batch_size)
  kl_scale = (cfg.kl_weight / tf.cast(tf.maximum(n, 1), tf.float32))[:, None]
  private_prior = layout.private_prior() if cfg.private else (tf.zeros([0]), tf.zeros([0]))
  shared_prior_1 = tuple(t[0] for t in shared_prior)

  # A function of its own per step (a call op in the loop body): grappler then
  # optimises the step as the old per-client step was (measured: inline, 2x slower).
  @tf.function
  def step_fn(params, xb, yb, mask, step):
    if clients == 1:  # unbatched: 2-D matmuls (oneDNN's batched matmul costs ~30 us
      # a call more at these sizes; the one-client step ran 2x slower batched)
      step_seeds = tf.random.experimental.stateless_fold_in(seeds[0], step)
      new, loss, correct = sgd_step(cfg, layout, Parameters(*params), xb, yb, mask, step_seeds,
                                    kl_scale[0, 0], shared_prior_1, private_prior, data_loss)
      return tuple(new), (loss, correct)
    step_seeds = tf.stack(
        [tf.random.experimental.stateless_fold_in(seeds[c], step) for c in range(clients)])
    new, loss, correct = sgd_step(cfg, layout, Parameters(*params), xb, yb, mask, step_seeds,
                                  kl_scale, shared_prior, private_prior, data_loss)
    return tuple(new), (loss, correct)

  if not cfg.private:  # the client network is neither run nor trained
    params = params._replace(private_loc=tf.zeros([clients, 0]),
                             private_u=tf.zeros([clients, 0]),
                             gates=tf.zeros([clients, 0]))
  zeros = tf.zeros([clients])
  state, (loss_sum, correct_sum) = client_batch.train_loop(schedule, x, y, tuple(params), step_fn,
                                                           (zeros, zeros))
  return Parameters(*state), loss_sum, correct_sum

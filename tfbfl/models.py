"""Server and client networks: VIRTUAL's Bayesian MLPs and the deterministic MLP.

* `VirtualNetworks`: the server network (shared Bayesian layers, parameters theta)
  and one client's private Bayesian network (parameters phi_i) fed by the server
  activations through lateral connections, with the natural-parameter accessors the
  federated algorithm needs.
* `initial_shared_posterior`, `initial_private_weights`: the initial values of a
  fresh `VirtualNetworks`, computed with stateless ops only (no variables: from the
  seeds and shapes of the unbuilt layers), so a driver can make initial server and
  client states anywhere, deterministically in `seed`.
* `build_deterministic_mlp`: the point-estimate counterpart (FedAvg, FedProx, FOLA,
  local and global baselines), with the server network's layer shapes.

The machinery every laterally connected architecture shares (layer plans, their
initial values, and the `_LateralNetworks` base class with the natural-parameter
accessors) lives here too; `tfbfl.architectures` builds its conv and LSTM networks
on it.
"""

import numpy as np
import tensorflow as tf

from tfbfl import gaussian
from tfbfl.layers import BayesianDense, LateralConnection
from tfbfl.layers.base import (
  check_natural_gaussian,
  check_positive_int,
  check_seed,
  derive_seed,
  initial_loc,
  initial_untransformed_scale,
  scale_from_untransformed,
)

__all__ = [
  "VirtualNetworks",
  "build_deterministic_mlp",
  "initial_private_weights",
  "initial_shared_posterior",
]

# Salts separating the seeds of the three families of layers.
_SERVER, _CLIENT, _LATERAL = 0, 1, 2


def _plan(input_dim, num_classes, hidden_units):
  """Validated `(inputs, widths)`: per-depth widths, from input to logits."""
  input_dim = check_positive_int("input_dim", input_dim)
  num_classes = check_positive_int("num_classes", num_classes)
  if isinstance(hidden_units, (int, np.integer)) or not hasattr(
    hidden_units, "__iter__"
  ):
    raise ValueError(
      f"`hidden_units` must be a sequence of positive ints, got {hidden_units!r}."
    )
  hidden = [check_positive_int("hidden_units", h) for h in hidden_units]
  widths = hidden + [num_classes]
  inputs = [input_dim] + hidden
  return inputs, widths


# -- layer plans shared by every laterally connected architecture --------------------
#
# A plan is a list with one dict per depth, `{"server": (layer, input_shape),
# "client": (layer, input_shape), "lateral": (layer, input_shape)}`, of unbuilt
# layers. `_LateralNetworks._build_plan` builds it into a model; the initial-value
# functions read the same layers' seeds and shapes, so both agree bit for bit.


def _lateral(units, adapter_units, activation, gate_init, seed, depth, common):
  """The `LateralConnection` feeding the client layer of width `units` at `depth`."""
  return LateralConnection(
    units,
    adapter_units=units if adapter_units is None else adapter_units,
    activation=activation,
    gate_init=gate_init,
    seed=derive_seed(seed, _LATERAL, depth),
    name=f"lateral_{depth}",
    **common,
  )


def _plan_depth(depth, seed, layer_cls, input_shape, lateral, server_kwargs=None, **kwargs):
  """One depth of a plan: server and client `layer_cls(**kwargs)` reading
  `input_shape`, seeded and named from `seed` and `depth`, and the `(layer, shape)`
  pair `lateral`. `server_kwargs` go to the server layer only (e.g. its activation:
  the client's is applied after the lateral term is added)."""
  return dict(
    server=(
      layer_cls(
        seed=derive_seed(seed, _SERVER, depth),
        name=f"server_{depth}",
        **kwargs,
        **(server_kwargs or {}),
      ),
      input_shape,
    ),
    client=(
      layer_cls(seed=derive_seed(seed, _CLIENT, depth), name=f"client_{depth}", **kwargs),
      input_shape,
    ),
    lateral=lateral,
  )


def _mean_field_initial_values(layer, input_shape):
  """`[loc, u]` per parameter of an *unbuilt* mean-field layer, as its `build` makes.

  Uses the layer's own `_parameter_shapes`, seeds and scales, so it agrees with
  `build` bit for bit, and only stateless ops (graph-safe, deterministic).
  """
  specs = layer._parameter_shapes(tf.TensorShape(input_shape))  # pylint: disable=protected-access
  u0 = tf.constant(initial_untransformed_scale(layer.init_scale, layer.min_scale), tf.float32)
  values = []
  for index, (_, shape, fan_in, fan_out, random_loc) in enumerate(specs):
    if random_loc:
      loc = initial_loc(shape, fan_in, fan_out, seed=derive_seed(layer.seed, index))
    else:
      loc = tf.zeros(shape, tf.float32)
    values += [loc, tf.fill(shape, u0)]
  return values


def _initial_shared_posterior(plan):
  """The server layers' initial posterior, as `shared_posterior()` of the model."""
  locs, scales = [], []
  for depth in plan:
    layer, shape = depth["server"]
    values = _mean_field_initial_values(layer, shape)
    locs += values[0::2]
    scales += [scale_from_untransformed(u, layer.min_scale) for u in values[1::2]]
  return gaussian.from_loc_scale(locs, scales)


def _initial_private_weights(plan):
  """The initial `get_private_weights()` of the model: numpy eagerly, else tensors."""
  client, lateral = [], []
  for depth in plan:
    layer, shape = depth["client"]
    client += _mean_field_initial_values(layer, shape)
    lat, shape = depth["lateral"]
    shape = tf.TensorShape(shape)
    lateral += _mean_field_initial_values(lat.adapter_in, shape)
    lateral += _mean_field_initial_values(
      lat.adapter_out, shape[:-1].concatenate([lat.adapter_units])
    )
    lateral.append(tf.fill([lat.units], tf.constant(lat.gate_init, tf.float32)))
  values = client + lateral
  if tf.executing_eagerly():
    return [v.numpy() for v in values]
  return values


class _LateralNetworks(tf.Module):
  """Server layers, client layers and laterals, one of each per depth.

  Holds what does not depend on the architecture: building the layers of a plan,
  per-layer seeds, the one-pass forward of a plain chain of layers, the
  natural-parameter accessors and the variable partition. Subclasses build a plan
  in `__init__`, set `_client_output` (e.g. the client's activation), and override
  `forward` and `server_logits` where the pass is not a plain chain of layers.
  """

  def _build_plan(self, plan):
    server_layers, client_layers, laterals = [], [], []
    with self.name_scope:
      for depth in plan:
        for key, store in (
          ("server", server_layers),
          ("client", client_layers),
          ("lateral", laterals),
        ):
          layer, shape = depth[key]
          with tf.name_scope(layer.name):
            layer.build(shape)
          store.append(layer)
    self.server_layers = server_layers
    self.client_layers = client_layers
    self.laterals = laterals
    self._depth = len(plan)
    self._counts = [len(layer.parameter_names) for layer in server_layers]

  def _layer_seeds(self, seed):
    """`3 L` seeds: server layers, then client layers, then laterals."""
    if seed is None:
      return [None] * (3 * self._depth)
    seeds = tf.random.experimental.stateless_split(
      tf.convert_to_tensor(seed), num=3 * self._depth
    )
    return [seeds[i] for i in range(3 * self._depth)]

  def forward(self, x, seed=None):
    """`(server_logits, client_logits)` from one pass; see the class docstring."""
    seeds = self._layer_seeds(seed)
    depth = self._depth
    h_s = h_c = x
    for l in range(depth):
      h_s = self.server_layers[l](h_s, seed=seeds[l])
      pre = self.client_layers[l](h_c, seed=seeds[depth + l]) + self.laterals[l](
        h_s, seed=seeds[2 * depth + l]
      )
      h_c = self._client_output(l, pre)
    return h_s, h_c

  def _client_output(self, depth, pre):
    """The client's output at `depth` from its sum with the lateral term."""
    del depth
    return pre

  def server_logits(self, x, seed=None):
    """The server network alone (metric S); equals `forward(x, seed)[0]`."""
    seeds = self._layer_seeds(seed)
    h_s = x
    for l, layer in enumerate(self.server_layers):
      h_s = layer(h_s, seed=seeds[l])
    return h_s

  def client_logits(self, x, seed=None):
    """The client's prediction (metric MT); equals `forward(x, seed)[1]`."""
    return self.forward(x, seed=seed)[1]

  # -- shared parameters -------------------------------------------------------

  def _parameter_layout(self):
    """How the tensors of `shared_posterior()` group by server layer (for errors)."""
    return str(self._counts)

  def _split(self, g, name):
    eta1, eta2 = check_natural_gaussian(g, name)
    expected = sum(self._counts)
    if len(eta1) != expected or len(eta2) != expected:
      raise ValueError(
        f"`{name}` must hold {expected} tensors per natural parameter "
        f"({self._parameter_layout()} per server layer), got {len(eta1)} and "
        f"{len(eta2)}."
      )
    parts, start = [], 0
    for count in self._counts:
      parts.append(
        gaussian.NaturalGaussian(eta1[start : start + count], eta2[start : start + count])
      )
      start += count
    return parts

  @staticmethod
  def _concat(gs):
    return gaussian.NaturalGaussian(
      [e for g in gs for e in g.eta1], [e for g in gs for e in g.eta2]
    )

  def shared_posterior(self):
    """Posterior over theta: a `NaturalGaussian` over every server parameter, in
    layer order and, within a layer, in `parameter_names` order."""
    return self._concat([layer.posterior() for layer in self.server_layers])

  def set_shared_posterior(self, g):
    """Assigns the server layers' posterior; returns the grouped assign op."""
    parts = self._split(g, "g")
    return tf.group(
      *[layer.set_posterior(p) for layer, p in zip(self.server_layers, parts)]
    )

  def shared_prior(self):
    """Prior over theta, with the structure of `shared_posterior()`."""
    return self._concat([layer.prior() for layer in self.server_layers])

  def set_shared_prior(self, g):
    """Assigns the server layers' prior; returns the grouped assign op."""
    parts = self._split(g, "g")
    return tf.group(*[layer.set_prior(p) for layer, p in zip(self.server_layers, parts)])

  def kl_shared(self):
    """`KL(q(theta) || prior(theta))` summed over the server layers."""
    return tf.add_n([layer.kl_divergence() for layer in self.server_layers])

  def kl_private(self):
    """`KL(c_i || p(phi_i))` over the client layers and the laterals' `U`, `V`."""
    return tf.add_n(
      [layer.kl_divergence() for layer in self.client_layers]
      + [lateral.kl_divergence() for lateral in self.laterals]
    )

  # -- variables -----------------------------------------------------------------

  @property
  def shared_trainable_variables(self):
    """`[loc, untransformed_scale]` per parameter per server layer, in order."""
    return [v for layer in self.server_layers for v in layer.posterior_variables]

  @property
  def private_trainable_variables(self):
    """Client layers' posterior variables, then per lateral `V`, `U`, gate."""
    return [v for layer in self.client_layers for v in layer.posterior_variables] + [
      v for lateral in self.laterals for v in lateral.trainable_parameter_variables
    ]

  def get_private_weights(self):
    """Values of `private_trainable_variables` (tensors), for client-state storage."""
    return [tf.convert_to_tensor(v) for v in self.private_trainable_variables]

  def set_private_weights(self, weights):
    """Assigns `private_trainable_variables`; returns the grouped assign op."""
    variables = self.private_trainable_variables
    weights = list(weights)
    if len(weights) != len(variables):
      raise ValueError(
        f"`weights` must hold {len(variables)} tensors, got {len(weights)}."
      )
    ops = []
    for i, (v, w) in enumerate(zip(variables, weights)):
      w = tf.convert_to_tensor(w, v.dtype)
      if not v.shape.is_compatible_with(w.shape):
        raise ValueError(
          f"`weights[{i}]` must have shape {v.shape} ({v.name}), got {w.shape}."
        )
      ops.append(v.assign(w))
    return tf.group(*ops)


# -- the MLP -----------------------------------------------------------------------


def _dense_plan(inputs, widths, first, activation, adapter_units, gate_init, seed, common):
  """Plan depths `first, first + 1, ...` of `BayesianDense` layers `inputs -> widths`.

  Every server layer but the last (the logits) applies `activation`; the laterals
  feed client layers of the same widths.
  """
  plan = []
  for k, (n_in, n_out) in enumerate(zip(inputs, widths)):
    l = first + k
    last = k == len(widths) - 1
    lateral = _lateral(n_out, adapter_units, activation, gate_init, seed, l, common)
    plan.append(
      _plan_depth(
        l,
        seed,
        BayesianDense,
        (None, n_in),
        (lateral, (None, n_out)),
        server_kwargs=dict(activation=None if last else activation),
        units=n_out,
        **common,
      )
    )
  return plan


def _mlp_plan(
  input_dim,
  num_classes,
  hidden_units,
  activation,
  prior_scale,
  init_scale,
  adapter_units,
  gate_init,
  seed,
):
  """Unbuilt `BayesianDense` server and client layers and laterals, per depth."""
  inputs, widths = _plan(input_dim, num_classes, hidden_units)
  if adapter_units is not None:
    adapter_units = check_positive_int("adapter_units", adapter_units)
  seed = check_seed(seed)
  common = dict(prior_scale=prior_scale, init_scale=init_scale)
  return _dense_plan(inputs, widths, 0, activation, adapter_units, gate_init, seed, common)


class VirtualNetworks(_LateralNetworks):
  """VIRTUAL's server network and one client's private network, laterally connected.

  With depth `L = len(hidden_units) + 1` and `h^0 = x`:

  ```none
  server:  h_s^l = act(W_s^l h_s^(l-1) + b_s^l),    l < L;   h_s^L = server logits
  client:  h_c^l = act(W_c^l h_c^(l-1) + b_c^l + lateral_l(h_s^l)),  l < L
           h_c^L =     W_c^L h_c^(L-1) + b_c^L + lateral_L(h_s^L)    (client logits)
  lateral_l(h) = g_l * (U_l act(V_l h + c_l) + d_l)
  ```

  Every `W`, `b`, `U`, `V`, `c`, `d` is a mean-field Gaussian `BayesianDense`
  parameter; the gates `g_l` are point estimates (`LateralConnection`). The server
  layers carry the shared parameters `theta`, whose posterior
  (`shared_posterior()`, natural parameters, list `[k_1, b_1, ..., k_L, b_L]`) and
  prior (`set_shared_prior`, e.g. `p^(1/K) * cavity`) the algorithm sets each
  round; the client layers and laterals carry the private `phi_i` with prior
  `N(0, prior_scale^2)`. The client free energy of eq. (3) of VIRTUAL is then
  `beta * (kl_shared() + kl_private()) - E_q[log p(D_i | theta, phi_i)]`.

  `forward(x, seed)` runs one pass: the server activations are computed (sampled,
  by local reparameterization, when a `[2]` integer `seed` is given) once and fed
  to the client at the same depth; each layer uses its own seed from
  `stateless_split(seed, 3 L)`, so `server_logits(x, seed)` equals
  `forward(x, seed)[0]`. Without a seed every layer uses its posterior mean.

  All variables are created in `__init__` (input dimensions are known), so the
  model can be built inside a `tf.function` or TFF computation and its variables
  assigned from incoming tensors. Initial values are deterministic in `seed` and
  equal `initial_shared_posterior(...)` and `initial_private_weights(...)`.

  Args:
    input_dim: positive int, number of input features.
    num_classes: positive int, number of logits.
    hidden_units: sequence of positive ints, widths of the hidden layers (the
      server and client networks have the same widths).
    activation: Keras activation of the hidden layers and of the adapters.
    prior_scale: standard deviation of the zero-mean priors (private layers, and
      the shared layers until `set_shared_prior` is called).
    init_scale: initial posterior standard deviation of every Bayesian weight.
    adapter_units: width of every adapter's hidden layer; `None` uses the width
      of the client layer it feeds.
    gate_init: initial value of the lateral gates.
    seed: Python int (or `None` for unseeded initialisation).
    name: module name.

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl import models

  net = models.VirtualNetworks(input_dim=64, num_classes=10, hidden_units=(32,))
  x = tf.random.normal([8, 64])
  server_logits, client_logits = net.forward(x, seed=tf.constant([0, 1]))
  free_energy_kl = net.kl_shared() + net.kl_private()
  s = net.shared_posterior()        # NaturalGaussian over [k1, b1, k2, b2]
  net.set_shared_prior(s)           # kl_shared() is now 0
  ```

  #### References

  [1]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
       Multi-Task Learning. https://arxiv.org/abs/1906.06268
  [2]: Andrei A. Rusu et al. Progressive Neural Networks.
       https://arxiv.org/abs/1606.04671
  """

  def __init__(
    self,
    input_dim,
    num_classes,
    hidden_units=(100, 100),
    activation="relu",
    prior_scale=1.0,
    init_scale=1e-3,
    adapter_units=None,
    gate_init=1.0,
    seed=0,
    name=None,
  ):
    super().__init__(name=name)
    inputs, widths = _plan(input_dim, num_classes, hidden_units)
    with self.name_scope:
      plan = _mlp_plan(
        inputs[0], widths[-1], widths[:-1], activation, prior_scale, init_scale,
        adapter_units, gate_init, seed,
      )
    self.input_dim = inputs[0]
    self.num_classes = widths[-1]
    self.hidden_units = tuple(widths[:-1])
    self.activation = tf.keras.activations.get(activation)
    self._build_plan(plan)

  def _client_output(self, depth, pre):
    return pre if depth == self._depth - 1 else self.activation(pre)

  def _parameter_layout(self):
    return "[kernel, bias]"


def initial_shared_posterior(
  input_dim, num_classes, hidden_units=(100, 100), init_scale=1e-3, seed=0
):
  """`VirtualNetworks(..., seed=seed).shared_posterior()` without building a model.

  Stateless ops only: deterministic in `seed` and usable eagerly or inside a
  graph/TFF computation. Returns a `NaturalGaussian` of float32 tensors over
  `[k_1, b_1, ..., k_L, b_L]`.
  """
  plan = _mlp_plan(
    input_dim, num_classes, hidden_units, "relu", 1.0, init_scale, None, 1.0, seed
  )
  return _initial_shared_posterior(plan)


def initial_private_weights(
  input_dim,
  num_classes,
  hidden_units=(100, 100),
  init_scale=1e-3,
  adapter_units=None,
  gate_init=1.0,
  seed=0,
):
  """`VirtualNetworks(..., seed=seed).get_private_weights()` without a model.

  Stateless ops only, deterministic in `seed`; numpy arrays when executing
  eagerly, tensors inside a graph.
  """
  plan = _mlp_plan(
    input_dim, num_classes, hidden_units, "relu", 1.0, init_scale, adapter_units,
    gate_init, seed,
  )
  return _initial_private_weights(plan)


def _deterministic_dense_layers(widths, first, activation, seed):
  """Keras `Dense` layers `dense_0, dense_1, ...` of `widths`, `activation` but on
  the last (the logits); Glorot-normal kernels seeded as the server layers at
  depths `first, first + 1, ...`, zero biases."""
  layers = []
  for k, n_out in enumerate(widths):
    last = k == len(widths) - 1
    layers.append(
      tf.keras.layers.Dense(
        n_out,
        activation=None if last else activation,
        kernel_initializer=tf.keras.initializers.GlorotNormal(
          seed=derive_seed(seed, _SERVER, first + k)
        ),
        bias_initializer="zeros",
        name=f"dense_{k}",
      )
    )
  return layers


def build_deterministic_mlp(
  input_dim, num_classes, hidden_units=(100, 100), activation="relu", seed=0
):
  """The point-estimate MLP with the server network's shapes (logits output).

  Glorot-normal kernels seeded from `seed` (Keras stateless initializers, so the
  model is deterministic in `seed`), zero biases. The returned
  `tf.keras.Sequential` starts with an `Input`, so its weights exist on return.
  Build it where it is used (inside the TFF computation when it is used there:
  see the `_assert_built_as_v1` pitfall in the SPEC).
  """
  inputs, widths = _plan(input_dim, num_classes, hidden_units)
  seed = check_seed(seed)
  layers = [tf.keras.Input(shape=(inputs[0],))]
  layers += _deterministic_dense_layers(widths, 0, activation, seed)
  return tf.keras.Sequential(layers, name="deterministic_mlp")


# Salt of the McMahan CNN's seeds (kept apart from the MLP families above).
_CNN = 3


def build_mcmahan_cnn(input_shape, num_classes, seed=0):
  """The CNN of McMahan et al. (2017), used by FOLA's CIFAR-10 experiments.

  ```none
  conv 5x5, 32 filters, ReLU, 'same'  ->  max-pool 2x2
  conv 5x5, 64 filters, ReLU, 'same'  ->  max-pool 2x2
  flatten -> dense 512, ReLU -> dense num_classes (logits)
  ```

  Glorot-normal kernels seeded from `seed` (deterministic, one derived seed per
  layer), zero biases. Trainable variables come in the order
  `[conv1 kernel, conv1 bias, conv2 kernel, conv2 bias, dense kernel, dense bias,
  logits kernel, logits bias]`. As for `build_deterministic_mlp`, build it where
  it is used (inside the TFF computation when it is used there).

  Args:
    input_shape: `(height, width, channels)` (e.g. `(32, 32, 3)` for CIFAR-10) or
      `(height, width)` for single-channel images, positive ints.
    num_classes: positive int, number of logits.
    seed: Python int (or `None` for unseeded initialisation).

  Returns:
    A `tf.keras.Sequential` whose weights exist on return.

  Raises:
    ValueError: if `input_shape` is not 2 or 3 positive ints, or `num_classes`
      or `seed` is invalid.

  #### Examples

  ```python
  model = build_mcmahan_cnn((32, 32, 3), 10, seed=0)
  logits = model(tf.zeros([4, 32, 32, 3]))     # shape [4, 10]
  ```

  #### References

  [1]: H. Brendan McMahan et al. Communication-Efficient Learning of Deep
       Networks from Decentralized Data. AISTATS 2017.
  """
  if isinstance(input_shape, (int, np.integer)) or not hasattr(input_shape, "__iter__"):
    raise ValueError(
      f"`input_shape` must be (height, width[, channels]), got {input_shape!r}."
    )
  shape = [check_positive_int("input_shape", d) for d in input_shape]
  if len(shape) not in (2, 3):
    raise ValueError(
      f"`input_shape` must be (height, width[, channels]), got {tuple(input_shape)}."
    )
  if len(shape) == 2:
    shape.append(1)
  num_classes = check_positive_int("num_classes", num_classes)
  seed = check_seed(seed)
  init = lambda l: tf.keras.initializers.GlorotNormal(seed=derive_seed(seed, _CNN, l))
  conv = lambda l, filters: tf.keras.layers.Conv2D(
    filters, 5, padding="same", activation="relu", kernel_initializer=init(l),
    bias_initializer="zeros", name=f"conv_{l}")
  layers = [
    tf.keras.Input(shape=tuple(shape)),
    conv(0, 32),
    tf.keras.layers.MaxPool2D(2, padding="same", name="pool_0"),
    conv(1, 64),
    tf.keras.layers.MaxPool2D(2, padding="same", name="pool_1"),
    tf.keras.layers.Flatten(name="flatten"),
    tf.keras.layers.Dense(512, activation="relu", kernel_initializer=init(2),
                          bias_initializer="zeros", name="dense_0"),
    tf.keras.layers.Dense(num_classes, kernel_initializer=init(3),
                          bias_initializer="zeros", name="logits"),
  ]
  return tf.keras.Sequential(layers, name="mcmahan_cnn")


__all__.append("build_mcmahan_cnn")

"""Machinery shared by every laterally connected network family.

VIRTUAL's networks (`tfbfl.networks.mlp`, `.conv`, `.lstm`) are a server network
and one client's private network, joined depth by depth by lateral connections.
What does not depend on the family lives here:

* `SERVER`, `CLIENT`, `LATERAL`, `MCMAHAN_CNN`: the salts that keep the seeds of
  the layer families (and of FOLA's McMahan CNN) apart.
* layer plans: `lateral_connection`, `plan_depth`, `dense_plan` build the unbuilt
  layers of one depth or of a dense stack;
  `initial_shared_posterior_from_plan` and `initial_private_weights_from_plan` read
  a plan's initial values with stateless ops only (no variables), bit-identical to
  what building it creates; `initial_private_weights_of` gives the latter at any
  seed from one cached plan (a client's initial state, many times a run).
* `LateralNetworks`: the base class building a plan into a model, with the
  one-pass forward and the natural-parameter accessors.
* `deterministic_dense_layers`: the Keras `Dense` stack of the point-estimate
  models; `positive_ints`: argument validation.
"""

import collections
import functools

import numpy as np
import tensorflow as tf

from tfbfl import gaussian
from tfbfl.layers import BayesianDense, LateralConnection
from tfbfl.layers.base import (
    check_natural_gaussian,
    check_seed,
    derive_seed,
    initial_loc,
    initial_untransformed_scale,
    is_int,
    scale_from_untransformed,
)
from tfbfl.layers.lateral import ADAPTER_IN_SALT, ADAPTER_OUT_SALT

__all__ = [
    "CLIENT",
    "LATERAL",
    "LateralNetworks",
    "MCMAHAN_CNN",
    "SERVER",
    "dense_plan",
    "deterministic_dense_layers",
    "initial_private_weights_from_plan",
    "initial_private_weights_of",
    "initial_shared_posterior_from_plan",
    "lateral_connection",
    "plan_depth",
    "positive_ints",
]

# Salts separating the seeds of the three families of layers (`derive_seed(seed,
# SERVER, depth)`, ...), and of FOLA's McMahan CNN (`tfbfl.networks.conv`), kept
# apart from the laterally connected families.
SERVER, CLIENT, LATERAL = 0, 1, 2
MCMAHAN_CNN = 3

# -- validation --------------------------------------------------------------------


def positive_ints(name, values, allow_empty=True):
  """`values` as a tuple of Python ints, or `ValueError` naming `name`: a sequence
  (not an int or a string) of positive ints, non-empty unless `allow_empty`."""
  if is_int(values) or not hasattr(values, "__iter__") or isinstance(values, str):
    raise ValueError(f"`{name}` must be a sequence of positive ints, got {values!r}.")
  values = tuple(values)
  if not all(is_int(v) and v > 0 for v in values) or (not allow_empty and not values):
    raise ValueError(f"`{name}` must be a sequence of positive ints, got {values!r}.")
  return tuple(int(v) for v in values)


# -- layer plans shared by every laterally connected architecture --------------------
#
# A plan is a list with one dict per depth, `{"server": (layer, input_shape),
# "client": (layer, input_shape), "lateral": (layer, input_shape)}`, of unbuilt
# layers. `LateralNetworks._build_plan` builds it into a model; the initial-value
# functions read the same layers' seeds and shapes, so both agree bit for bit.


def lateral_connection(units, adapter_units, activation, gate_init, seed, depth, common):
  """The `LateralConnection` feeding the client layer of width `units` at `depth`."""
  return LateralConnection(
      units,
      adapter_units=units if adapter_units is None else adapter_units,
      activation=activation,
      gate_init=gate_init,
      seed=derive_seed(seed, LATERAL, depth),
      name=f"lateral_{depth}",
      **common,
  )


def plan_depth(depth, seed, layer_cls, input_shape, lateral, server_kwargs=None, **kwargs):
  """One depth of a plan: server and client `layer_cls(**kwargs)` reading
  `input_shape`, seeded and named from `seed` and `depth`, and the `(layer, shape)`
  pair `lateral`. `server_kwargs` go to the server layer only (e.g. its activation:
  the client's is applied after the lateral term is added)."""
  return dict(
      server=(
          layer_cls(
              seed=derive_seed(seed, SERVER, depth),
              name=f"server_{depth}",
              **kwargs,
              **(server_kwargs or {}),
          ),
          input_shape,
      ),
      client=(
          layer_cls(seed=derive_seed(seed, CLIENT, depth), name=f"client_{depth}", **kwargs),
          input_shape,
      ),
      lateral=lateral,
      depth=depth,
  )


# What one initial value of a plan is: a Glorot-normal mean drawn on the stateless seed
# `derive_seed(layer_seed, index)`, where the layer's seed is `chain` of salts applied
# to the network seed; or a constant `value` of `shape`.
_Draw = collections.namedtuple("_Draw", ["chain", "layer_seed", "index", "shape", "fan_in",
                                         "fan_out"])
_Fill = collections.namedtuple("_Fill", ["shape", "value"])


def _mean_field_specs(layer, input_shape, chain=()):
  """`[loc, u]` per parameter of an *unbuilt* mean-field layer, as its `build` makes.

  Uses the layer's own `_parameter_shapes`, seeds and scales, so it agrees with
  `build` bit for bit. `chain`: the salts deriving the layer's seed from the network's.
  """
  specs = layer._parameter_shapes(tf.TensorShape(input_shape))  # pylint: disable=protected-access
  u0 = initial_untransformed_scale(layer.init_scale, layer.min_scale)
  values = []
  for index, (_, shape, fan_in, fan_out, random_loc) in enumerate(specs):
    loc = _Draw(chain, layer.seed, index, shape, fan_in, fan_out) if random_loc else _Fill(
        shape, 0.0)
    values += [loc, _Fill(shape, u0)]
  return values


def _private_specs(plan):
  """The specs of `get_private_weights()`'s values: the client layers', then the laterals'."""
  client, lateral = [], []
  for depth in plan:
    d = depth["depth"]
    layer, shape = depth["client"]
    client += _mean_field_specs(layer, shape, ((CLIENT, d),))
    lat, shape = depth["lateral"]
    shape = tf.TensorShape(shape)
    chain = ((LATERAL, d),)
    lateral += _mean_field_specs(lat.adapter_in, shape, chain + ((ADAPTER_IN_SALT,),))
    lateral += _mean_field_specs(lat.adapter_out, shape[:-1].concatenate([lat.adapter_units]),
                                 chain + ((ADAPTER_OUT_SALT,),))
    lateral.append(_Fill([lat.units], lat.gate_init))
  return client + lateral


def _tensor(spec):
  """The value of `spec`, with stateless ops only (graph-safe, deterministic)."""
  if isinstance(spec, _Draw):
    return initial_loc(spec.shape, spec.fan_in, spec.fan_out,
                       seed=derive_seed(spec.layer_seed, spec.index))
  return tf.fill(spec.shape, tf.constant(spec.value, tf.float32))


def initial_shared_posterior_from_plan(plan):
  """The server layers' initial posterior, as `shared_posterior()` of the model."""
  locs, scales = [], []
  for depth in plan:
    layer, shape = depth["server"]
    values = [_tensor(spec) for spec in _mean_field_specs(layer, shape)]
    locs += values[0::2]
    scales += [scale_from_untransformed(u, layer.min_scale) for u in values[1::2]]
  return gaussian.from_loc_scale(locs, scales)


def initial_private_weights_from_plan(plan):
  """The initial `get_private_weights()` of the model: numpy eagerly, else tensors."""
  values = [_tensor(spec) for spec in _private_specs(plan)]
  if tf.executing_eagerly():
    return [v.numpy() for v in values]
  return values


class _PrivateValuesTemplate:
  """A plan's initial private values at any network seed, without building layers.

  Only the random means depend on the network seed: each is drawn on
  `derive_seed(layer_seed, index)`, and each layer's seed is a fixed chain of salts
  applied to the network seed (`_private_specs`; checked against the plan's own
  layers here). A call derives the seeds and draws every mean in one traced function
  on them with `_tensor`'s stateless kernel, so the values equal
  `initial_private_weights_from_plan`'s at that seed.
  """

  def __init__(self, plan, plan_seed):
    specs = _private_specs(plan)
    self._drawn_at = [i for i, spec in enumerate(specs) if isinstance(spec, _Draw)]
    draws = [specs[i] for i in self._drawn_at]
    for spec in draws:
      if self._layer_seed(spec.chain, plan_seed) != spec.layer_seed:
        raise ValueError(f"A plan layer's seed {spec.layer_seed} is not derived as "
                         f"{spec.chain} from the network seed {plan_seed}.")
    self._draws = [(spec.chain, spec.index) for spec in draws]
    self._fills = [
        np.full(spec.shape, spec.value, np.float32) if isinstance(spec, _Fill) else None
        for spec in specs
    ]

    @tf.function(input_signature=[tf.TensorSpec([len(draws), 2], tf.int64)], autograph=False)
    def draw(seeds):
      return [
          initial_loc(spec.shape, spec.fan_in, spec.fan_out, seed=seeds[i])
          for i, spec in enumerate(draws)
      ]

    self._draw = draw

  @staticmethod
  def _layer_seed(chain, seed):
    for salts in chain:
      seed = derive_seed(seed, *salts)
    return seed

  def __call__(self, seed):
    seeds = np.array([[derive_seed(self._layer_seed(chain, seed), index), 0]
                      for chain, index in self._draws], np.int64)
    values = [None if v is None else v.copy() for v in self._fills]
    for i, drawn in zip(self._drawn_at, self._draw(tf.constant(seeds))):
      values[i] = drawn.numpy()
    return values


def _frozen(value):
  """`value` with lists (and nested ones) as tuples, so it can key a cache."""
  if isinstance(value, (list, tuple, np.ndarray)):
    return tuple(_frozen(v) for v in value)
  return value


@functools.lru_cache(maxsize=16)
def _private_values_template(make_plan, args):
  return _PrivateValuesTemplate(make_plan(*args, 0), 0)


def initial_private_weights_of(make_plan, args, seed):
  """`initial_private_weights_from_plan(make_plan(*args, seed))`.

  Executing eagerly with an integer `seed`, the values come from a template cached
  per `(make_plan, args)`, which builds the plan's layers once (building them and
  drawing each mean eagerly was most of the cost of a client's initial state).
  """
  if seed is None or not tf.executing_eagerly():
    return initial_private_weights_from_plan(make_plan(*args, seed))
  check_seed(seed)
  return _private_values_template(make_plan, _frozen(args))(seed)


class LateralNetworks(tf.Module):
  """Server layers, client layers and laterals, one of each per depth.

  Holds what does not depend on the architecture: building the layers of a plan,
  per-layer seeds, the one-pass forward of a plain chain of layers, the
  natural-parameter accessors and the variable partition. Subclasses build a plan
  in `__init__`, override `client_output` (e.g. the client's activation) and
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
    seeds = tf.random.experimental.stateless_split(tf.convert_to_tensor(seed), num=3 * self._depth)
    return [seeds[i] for i in range(3 * self._depth)]

  def forward(self, x, seed=None):
    """`(server_logits, client_logits)` from one pass; see the class docstring."""
    seeds = self._layer_seeds(seed)
    depth = self._depth
    h_s = h_c = x
    for l in range(depth):
      h_s = self.server_layers[l](h_s, seed=seeds[l])
      pre = self.client_layers[l](h_c, seed=seeds[depth + l]) + self.laterals[l](
          h_s, seed=seeds[2 * depth + l])
      h_c = self.client_output(l, pre)
    return h_s, h_c

  def client_output(self, depth, pre):
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
      raise ValueError(f"`{name}` must hold {expected} tensors per natural parameter "
                       f"({self._parameter_layout()} per server layer), got {len(eta1)} and "
                       f"{len(eta2)}.")
    parts, start = [], 0
    for count in self._counts:
      parts.append(gaussian.NaturalGaussian(eta1[start:start + count], eta2[start:start + count]))
      start += count
    return parts

  @staticmethod
  def _concat(gs):
    return gaussian.NaturalGaussian([e for g in gs for e in g.eta1],
                                    [e for g in gs for e in g.eta2])

  def shared_posterior(self):
    """Posterior over theta: a `NaturalGaussian` over every server parameter, in
    layer order and, within a layer, in `parameter_names` order."""
    return self._concat([layer.posterior() for layer in self.server_layers])

  def set_shared_posterior(self, g):
    """Assigns the server layers' posterior; returns the grouped assign op."""
    parts = self._split(g, "g")
    return tf.group(*[layer.set_posterior(p) for layer, p in zip(self.server_layers, parts)])

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
    return tf.add_n([layer.kl_divergence() for layer in self.client_layers] +
                    [lateral.kl_divergence() for lateral in self.laterals])

  # -- variables -----------------------------------------------------------------

  @property
  def shared_trainable_variables(self):
    """`[loc, untransformed_scale]` per parameter per server layer, in order."""
    return [v for layer in self.server_layers for v in layer.posterior_variables]

  @property
  def private_trainable_variables(self):
    """Client layers' posterior variables, then per lateral `V`, `U`, gate."""
    return [v for layer in self.client_layers for v in layer.posterior_variables
           ] + [v for lateral in self.laterals for v in lateral.trainable_parameter_variables]

  def get_private_weights(self):
    """Values of `private_trainable_variables` (tensors), for client-state storage."""
    return [tf.convert_to_tensor(v) for v in self.private_trainable_variables]

  def set_private_weights(self, weights):
    """Assigns `private_trainable_variables`; returns the grouped assign op."""
    variables = self.private_trainable_variables
    weights = list(weights)
    if len(weights) != len(variables):
      raise ValueError(f"`weights` must hold {len(variables)} tensors, got {len(weights)}.")
    ops = []
    for i, (v, w) in enumerate(zip(variables, weights)):
      w = tf.convert_to_tensor(w, v.dtype)
      if not v.shape.is_compatible_with(w.shape):
        raise ValueError(f"`weights[{i}]` must have shape {v.shape} ({v.name}), got {w.shape}.")
      ops.append(v.assign(w))
    return tf.group(*ops)


# -- dense stacks ------------------------------------------------------------------


def dense_plan(inputs, widths, first, activation, adapter_units, gate_init, seed, common):
  """Plan depths `first, first + 1, ...` of `BayesianDense` layers `inputs -> widths`.

  Every server layer but the last (the logits) applies `activation`; the laterals
  feed client layers of the same widths.
  """
  plan = []
  for k, (n_in, n_out) in enumerate(zip(inputs, widths)):
    l = first + k
    last = k == len(widths) - 1
    lateral = lateral_connection(n_out, adapter_units, activation, gate_init, seed, l, common)
    plan.append(
        plan_depth(
            l,
            seed,
            BayesianDense,
            (None, n_in),
            (lateral, (None, n_out)),
            server_kwargs=dict(activation=None if last else activation),
            units=n_out,
            **common,
        ))
  return plan


def deterministic_dense_layers(widths, first, activation, seed):
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
                seed=derive_seed(seed, SERVER, first + k)),
            bias_initializer="zeros",
            name=f"dense_{k}",
        ))
  return layers

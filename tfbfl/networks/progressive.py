"""VIRTUAL's server column and a client's laterally connected column, from a Keras model.

`ProgressiveNetworks(template, ...)` reads the layers of a checked
`tfbfl.models.ModelTemplate` (the user's `--model`, or a built-in network: they
take this one path) and builds, in the model's order:

* for each layer with weights `l = 0, 1, ...` (`Dense`, `Conv2D`, ...): a server
  layer and a client layer, each the Bayesian counterpart of the Keras layer with
  its configuration (`tfbfl.layers.convert.bayesian_layer_args`), and a
  `LateralConnection` from the server layer's output to the client layer's
  pre-activation;
* for each weightless layer (`Reshape`, `Flatten`, pooling, ...): the same Keras
  layer, applied to both columns.

With `act_l` the Keras layer's activation (`linear` for the logits) and `h^0 = x`:

```none
server:  h_s^l = act_l(W_s^l h_s^(l-1))                       (a weight layer)
client:  h_c^l = act_l(W_c^l h_c^(l-1) + lateral_l(h_s^l))
lateral_l(h) = g_l * (U_l act(V_l h + c_l) + d_l)              (act: `activation`)
both:    h^l = op(h^(l-1))                                     (a weightless layer)
```

This is the lateral rule of VIRTUAL's first public implementation (the
Progressive-Networks adapter [(Rusu et al., 2016)][2], applied to the server's
activation at the same depth), and it is what `VirtualNetworks` (a `Dense` stack)
and `VirtualConvNetworks` (a convolution's lateral is a per-pixel `1 x 1` adapter
on the server's feature map before pooling) compute; with the same seed a
`ProgressiveNetworks` of the same model has their plan, layer for layer and seed
for seed. The server column alone gives the server prediction (metric S), the
client column the client's (MT). Initial values, seeds and the natural-parameter
interface are `tfbfl.networks.base.LateralNetworks`'; `initial_shared_posterior_of`
and `initial_private_weights_of_template` give them without building a model.

#### References

[1]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
     Multi-Task Learning. https://arxiv.org/abs/1906.06268
[2]: Andrei A. Rusu et al. Progressive Neural Networks.
     https://arxiv.org/abs/1606.04671
"""

from __future__ import annotations

import functools
from typing import List, Tuple

import tensorflow as tf

from tfbfl import models
from tfbfl.layers import BayesianDense
from tfbfl.layers.base import check_positive_int, check_seed
from tfbfl.layers.convert import bayesian_layer_args, is_weightless
from tfbfl.networks.base import (
    LateralNetworks,
    initial_private_weights_of,
    initial_shared_posterior_from_plan,
    lateral_connection,
    plan_depth,
)

__all__ = [
    "ProgressiveNetworks",
    "initial_private_weights_of_template",
    "initial_shared_posterior_of",
    "is_dense_stack",
]

# Weightless layers the lean (flat-vector) step may skip: they only reshape the
# examples before the first Dense layer.
_RESHAPES = (tf.keras.layers.Flatten, tf.keras.layers.Reshape)


@functools.lru_cache(maxsize=32)
def _program(tmpl: models.ModelTemplate) -> Tuple[tuple, ...]:
  """`(("weight", layer_cls, kwargs, activation, in_shape, out_shape) | ("op", config))`
  per layer of `tmpl`, from one eager build of it (the shapes)."""
  model = tmpl.build(None)
  steps = []
  for layer in model.layers:
    if isinstance(layer, tf.keras.layers.InputLayer):
      continue
    if is_weightless(layer):
      steps.append(("op", tf.keras.layers.serialize(layer)))
      continue
    cls, kwargs = bayesian_layer_args(layer)
    kwargs = dict(kwargs)
    activation = kwargs.pop("activation", None)
    activation = tf.keras.activations.serialize(tf.keras.activations.get(activation))
    steps.append(("weight", cls, tuple(sorted(kwargs.items())), activation,
                  tuple(layer.input_shape), tuple(layer.output_shape)))
  if not any(step[0] == "weight" for step in steps):
    raise models.ModelError(f"{models.MODEL_FLAG}={tmpl.label} has no layer with weights; "
                            "VIRTUAL needs at least one.")
  return tuple(steps)


def is_dense_stack(tmpl: models.ModelTemplate) -> bool:
  """Whether `tmpl` is `Flatten`/`Reshape` layers, then `Dense` layers only: VIRTUAL's
  lean step runs it (on flattened examples)."""
  steps = _program(tmpl)
  first = next(i for i, s in enumerate(steps) if s[0] == "weight")
  before_ok = all(
      isinstance(tf.keras.layers.deserialize(s[1]), _RESHAPES) for s in steps[:first])
  # Every Dense reads [batch, features]: a Reshape to more axes is not an MLP.
  return before_ok and all(s[0] == "weight" and s[1] is BayesianDense and len(s[4]) == 2
                           for s in steps[first:])


def _plan(tmpl, activation, prior_scale, init_scale, adapter_units, gate_init, seed):
  """The plan (`tfbfl.networks.base`) of `tmpl`'s weight layers."""
  if adapter_units is not None:
    adapter_units = check_positive_int("adapter_units", adapter_units)
  seed = check_seed(seed)
  common = dict(prior_scale=prior_scale, init_scale=init_scale)
  plan = []
  for step in _program(tmpl):
    if step[0] != "weight":
      continue
    _, cls, kwargs, act, in_shape, out_shape = step
    l = len(plan)
    lateral = lateral_connection(out_shape[-1], adapter_units, activation, gate_init, seed, l,
                                 common)
    plan.append(
        plan_depth(l,
                   seed,
                   cls,
                   in_shape, (lateral, out_shape),
                   server_kwargs=dict(activation=act),
                   **dict(kwargs),
                   **common))
  return plan


class ProgressiveNetworks(LateralNetworks):
  """VIRTUAL's server network and one client's private network, from a Keras model.

  See the module docstring for the construction and the lateral rule.

  Args:
    template: a `tfbfl.models.ModelTemplate` (`tfbfl.models.template`, or
      `tfbfl.networks.builders.template_for`).
    activation: Keras activation of the lateral adapters' hidden layers.
    prior_scale: standard deviation of the zero-mean priors.
    init_scale: initial posterior standard deviation of every Bayesian weight.
    adapter_units: width of every adapter's hidden layer; `None` uses the width
      (units or channels) of the client layer it feeds.
    gate_init: initial value of every lateral gate.
    seed: Python int (or `None` for unseeded initialisation).
    name: module name.

  Raises:
    tfbfl.layers.convert.UnsupportedLayerError: naming a layer with weights that has
      no Bayesian counterpart (or a setting the counterpart cannot honour).

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl import models, networks

  def build():
    return tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)), tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])

  tmpl = models.template(build, input_shape=(8, 8, 1), num_classes=10)
  net = networks.ProgressiveNetworks(tmpl, seed=0)
  server_logits, client_logits = net.forward(tf.zeros([2, 8, 8, 1]), seed=tf.constant([0, 1]))
  ```
  """

  def __init__(self,
               template: models.ModelTemplate,
               activation="relu",
               prior_scale=1.0,
               init_scale=1e-3,
               adapter_units=None,
               gate_init=1.0,
               seed=0,
               name=None):
    super().__init__(name=name)
    steps = _program(template)
    plan = _plan(template, activation, prior_scale, init_scale, adapter_units, gate_init, seed)
    self.template = template
    self.input_shape = template.input_shape
    self.num_classes = template.num_classes
    self.activation = tf.keras.activations.get(activation)
    self._activations: List = []
    self._program: List = []
    for step in steps:
      if step[0] == "op":
        self._program.append(("op", tf.keras.layers.deserialize(step[1])))
      else:
        self._program.append(("weight", len(self._activations)))
        self._activations.append(tf.keras.activations.get(step[3]))
    self._build_plan(plan)

  @staticmethod
  def _floats(x):
    x = tf.convert_to_tensor(x)
    return x if x.dtype.is_floating else tf.cast(x, tf.float32)

  def client_output(self, depth, pre):
    return self._activations[depth](pre)

  def forward(self, x, seed=None):
    """`(server_logits, client_logits)` from one pass; see the module docstring."""
    seeds = self._layer_seeds(seed)
    depth = self._depth
    h_s = h_c = self._floats(x)
    for kind, item in self._program:
      if kind == "op":
        h_s, h_c = item(h_s), item(h_c)
        continue
      l = item
      a_s = self.server_layers[l](h_s, seed=seeds[l])
      pre = self.client_layers[l](h_c, seed=seeds[depth + l]) + self.laterals[l](
          a_s, seed=seeds[2 * depth + l])
      h_s, h_c = a_s, self.client_output(l, pre)
    return h_s, h_c

  def server_logits(self, x, seed=None):
    """The server network alone (metric S); equals `forward(x, seed)[0]`."""
    seeds = self._layer_seeds(seed)
    h_s = self._floats(x)
    for kind, item in self._program:
      h_s = item(h_s) if kind == "op" else self.server_layers[item](h_s, seed=seeds[item])
    return h_s


def initial_shared_posterior_of(template, init_scale=1e-3, seed=0):
  """`ProgressiveNetworks(template, init_scale=..., seed=seed).shared_posterior()`
  without building a model (stateless ops only, deterministic in `seed`)."""
  return initial_shared_posterior_from_plan(
      _plan(template, "relu", 1.0, init_scale, None, 1.0, seed))


def initial_private_weights_of_template(template, init_scale=1e-3, adapter_units=None,
                                        gate_init=1.0, seed=0):
  """`ProgressiveNetworks(template, ...).get_private_weights()` without a model:
  numpy arrays when executing eagerly (from a template of the plan cached per
  network), tensors inside a graph."""
  args = (template, "relu", 1.0, init_scale, adapter_units, gate_init)
  return initial_private_weights_of(_plan, args, seed)


"""VIRTUAL's Bayesian MLP networks and the deterministic MLP.

* `VirtualNetworks`: the server network (shared Bayesian layers, parameters theta)
  and one client's private Bayesian network (parameters phi_i) fed by the server
  activations through lateral connections, with the natural-parameter accessors the
  federated algorithm needs.
* `initial_shared_posterior`, `initial_private_weights`: the initial values of a
  fresh `VirtualNetworks`, computed with stateless ops only (no variables: from the
  seeds and shapes of the unbuilt layers), so a driver can make initial server and
  client states anywhere, deterministically in `seed`.
* `build_deterministic_mlp`: the point-estimate counterpart (FedAvg, FedProx, FOLA,
  local and global baselines), with the server network's layer shapes: the
  built-in `tfbfl.networks.builders.MLP` through its template (one definition; the
  algorithms build it the same way, `builders.template_for(...).build(seed)`).

`VirtualNetworks` is `tfbfl.networks.progressive.ProgressiveNetworks` of the
built-in MLP (`builders.MLP`): the construction a user's `--model` takes, with the
MLP's constructor arguments. The machinery every laterally connected family shares
(layer plans, their initial values, the `LateralNetworks` base class) is in
`tfbfl.networks.base`.
"""

import numpy as np

from tfbfl.layers.base import check_positive_int, check_seed
from tfbfl.networks import builders, progressive

__all__ = [
    "VirtualNetworks",
    "build_deterministic_mlp",
    "initial_private_weights",
    "initial_shared_posterior",
]


def _layer_widths(input_dim, num_classes, hidden_units):
  """Validated `(inputs, widths)`: per-depth widths, from input to logits."""
  input_dim = check_positive_int("input_dim", input_dim)
  num_classes = check_positive_int("num_classes", num_classes)
  if isinstance(hidden_units, (int, np.integer)) or not hasattr(hidden_units, "__iter__"):
    raise ValueError(f"`hidden_units` must be a sequence of positive ints, got {hidden_units!r}.")
  hidden = [check_positive_int("hidden_units", h) for h in hidden_units]
  widths = hidden + [num_classes]
  inputs = [input_dim] + hidden
  return inputs, widths


def _template(input_dim, num_classes, hidden_units, activation="relu"):
  """The built-in MLP's template on `(input_dim,)` inputs (`builders.MLP`)."""
  inputs, widths = _layer_widths(input_dim, num_classes, hidden_units)
  return builders.template_for(None, architecture="mlp", input_shape=(inputs[0],),
                               num_classes=widths[-1], hidden_units=tuple(widths[:-1]),
                               activation=activation)


class VirtualNetworks(progressive.ProgressiveNetworks):
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
  from tfbfl import networks

  net = networks.VirtualNetworks(input_dim=64, num_classes=10, hidden_units=(32,))
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
    if adapter_units is not None:
      adapter_units = check_positive_int("adapter_units", adapter_units)
    super().__init__(_template(input_dim, num_classes, hidden_units, activation),
                     activation=activation,
                     prior_scale=prior_scale,
                     init_scale=init_scale,
                     adapter_units=adapter_units,
                     gate_init=gate_init,
                     seed=check_seed(seed),
                     name=name)
    self.input_dim = int(input_dim)
    self.hidden_units = tuple(int(h) for h in hidden_units)

  def _parameter_layout(self):
    return "[kernel, bias]"


def initial_shared_posterior(input_dim,
                             num_classes,
                             hidden_units=(100, 100),
                             init_scale=1e-3,
                             seed=0):
  """`VirtualNetworks(..., seed=seed).shared_posterior()` without building a model.

  Stateless ops only: deterministic in `seed` and usable eagerly or inside a
  graph/TFF computation. Returns a `NaturalGaussian` of float32 tensors over
  `[k_1, b_1, ..., k_L, b_L]`.
  """
  return progressive.initial_shared_posterior_of(_template(input_dim, num_classes, hidden_units),
                                                 init_scale, check_seed(seed))


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
  return progressive.initial_private_weights_of_template(
      _template(input_dim, num_classes, hidden_units), init_scale, adapter_units, gate_init, seed)


def build_deterministic_mlp(input_dim,
                            num_classes,
                            hidden_units=(100, 100),
                            activation="relu",
                            seed=0):
  """The point-estimate MLP with the server network's shapes (logits output).

  `builders.template_for(None, architecture="mlp", ...).build(seed)`: the built-in
  `builders.MLP` on `(input_dim,)` inputs, Glorot-normal kernels seeded from `seed`
  by the rule of `tfbfl.models` (the `k`-th Dense layer as VIRTUAL's server layer
  `k`: deterministic in `seed`), zero biases. The returned `tf.keras.Sequential`
  starts with an `Input`, so its weights exist on return. Build it where it is
  used (inside the TFF computation when it is used there: see the
  `_assert_built_as_v1` pitfall in the SPEC).
  """
  inputs, widths = _layer_widths(input_dim, num_classes, hidden_units)
  seed = check_seed(seed)
  return builders.template_for(None,
                               architecture="mlp",
                               input_shape=(inputs[0],),
                               num_classes=widths[-1],
                               hidden_units=tuple(widths[:-1]),
                               activation=activation).build(seed)

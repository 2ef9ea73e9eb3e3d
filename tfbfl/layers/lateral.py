"""Lateral connection (Progressive-Networks adapter) from a server to a client layer."""

import tensorflow as tf

from tfbfl.layers.base import (
    check_finite_float,
    check_positive_int,
    derive_seed,
    deserialize_divergence_fn,
    serialize_divergence_fn,
)
from tfbfl.layers.dense import BayesianDense

__all__ = ["ADAPTER_IN_SALT", "ADAPTER_OUT_SALT", "LateralConnection"]

# The adapters' seeds are `derive_seed(seed, ADAPTER_IN_SALT)` (V) and
# `derive_seed(seed, ADAPTER_OUT_SALT)` (U) of the connection's `seed`.
ADAPTER_IN_SALT, ADAPTER_OUT_SALT = 0, 1


@tf.keras.utils.register_keras_serializable(package="tfbfl")
class LateralConnection(tf.keras.layers.Layer):
  """Gated Bayesian adapter carrying a server activation into a client layer.

  Given the server activation `h_s` at depth `l` (width `n_s`), returns

  ```none
  lateral(h_s) = g * (U act(V h_s + c) + d)
  ```

  where `V` (`n_s -> adapter_units`, bias `c`) and `U`
  (`adapter_units -> units`, bias `d`) are private `BayesianDense` layers (mean-field
  posterior, prior `N(0, prior_scale^2)`, their own KL) and `g` (`[units]`) is a
  trainable gate vector, a point estimate without prior or KL, initialised to
  `gate_init` (default `1.0`: the server features enter the client at full
  strength from the first step, and the client learns how far to trust them;
  `gate_init=0.0` starts from an independent client network). The client layer then
  computes `h_c^l = act(W_c h_c^(l-1) + b_c + lateral(h_s^l))`, the adapter form of
  Progressive Networks [(Rusu et al., 2016)][1] used by the first public VIRTUAL
  implementation [(Corinzia et al., 2019)][2].

  `call(h_s, seed)` with a `[2]` integer seed samples `V` and `U` by local
  reparameterization with two seeds split from `seed`
  (`tf.random.experimental.stateless_split`); without a seed it is the deterministic
  posterior-mean pass, unless Keras' `training` is true (e.g. inside `fit`): then
  `V` and `U` each sample from a fresh seed. `kl_divergence()` is `KL(V) + KL(U)`;
  `layer.losses` holds the two terms `V` and `U` register as callable losses,
  `kl_weight * KL` each (or their `divergence_fn` terms; by default the unweighted
  KLs, which tfbfl's VIRTUAL networks do not read: they call `kl_divergence()`).

  Args:
    units: positive int, width of the client layer the output is added to.
    adapter_units: positive int, width of the adapter's hidden layer; `None` uses
      `units`.
    activation: Keras activation of the adapter's hidden layer.
    prior_scale, init_scale, min_scale, variance_epsilon: as in `BayesianDense`,
      for `V` and `U`.
    gate_init: float, initial value of every gate entry.
    seed: Python int or `None`; `V` and `U` get seeds derived from it.
    kl_weight, divergence_fn: passed to `V` and `U` (see `BayesianDense`).
    **kwargs: `tf.keras.layers.Layer` arguments.

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl.layers import LateralConnection

  lateral = LateralConnection(units=5, adapter_units=4, seed=0)
  lateral.build((None, 3))                      # server width 3
  h_s = tf.ones([2, 3])
  out = lateral(h_s, seed=tf.constant([1, 2]))  # [2, 5], added to a client pre-activation
  kl = lateral.kl_divergence()                  # == tf.add_n(lateral.losses)
  ```

  #### References

  [1]: Andrei A. Rusu et al. Progressive Neural Networks.
       https://arxiv.org/abs/1606.04671
  [2]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
       Multi-Task Learning. https://arxiv.org/abs/1906.06268
  """

  def __init__(
      self,
      units,
      adapter_units=None,
      activation="relu",
      prior_scale=1.0,
      init_scale=1e-3,
      min_scale=1e-6,
      variance_epsilon=1e-8,
      gate_init=1.0,
      seed=None,
      kl_weight=None,
      divergence_fn=None,
      **kwargs,
  ):
    super().__init__(**kwargs)
    units = check_positive_int("units", units)
    adapter_units = units if adapter_units is None else check_positive_int(
        "adapter_units", adapter_units)
    gate_init = check_finite_float("gate_init", gate_init)
    self.units = units
    self.adapter_units = adapter_units
    self.gate_init = gate_init
    self.seed = seed
    common = dict(
        prior_scale=prior_scale,
        init_scale=init_scale,
        min_scale=min_scale,
        variance_epsilon=variance_epsilon,
        kl_weight=kl_weight,
        divergence_fn=divergence_fn,
        dtype=self.dtype_policy,
    )
    # BayesianDense validates prior_scale/init_scale/min_scale/variance_epsilon/seed/
    # kl_weight/divergence_fn.
    self.adapter_in = BayesianDense(
        adapter_units,
        activation=activation,
        seed=derive_seed(seed, ADAPTER_IN_SALT),
        name="V",
        **common,
    )
    self.adapter_out = BayesianDense(units,
                                     activation=None,
                                     seed=derive_seed(seed, ADAPTER_OUT_SALT),
                                     name="U",
                                     **common)

  def build(self, input_shape):
    input_shape = tf.TensorShape(input_shape)
    with tf.name_scope(self.adapter_in.name):
      self.adapter_in.build(input_shape)
    with tf.name_scope(self.adapter_out.name):
      self.adapter_out.build(input_shape[:-1].concatenate([self.adapter_units]))
    self.gate = self.add_weight(
        name="gate",
        shape=[self.units],
        initializer=tf.keras.initializers.Constant(self.gate_init),
        trainable=True,
    )
    super().build(input_shape)

  def call(self, inputs, seed=None):
    if seed is None:
      hidden = self.adapter_in(inputs)
      out = self.adapter_out(hidden)
    else:
      seeds = tf.random.experimental.stateless_split(seed, num=2)
      hidden = self.adapter_in(inputs, seed=seeds[0])
      out = self.adapter_out(hidden, seed=seeds[1])
    return self.gate * out

  def kl_divergence(self):
    """`KL(q(V) || p(V)) + KL(q(U) || p(U))` (a scalar)."""
    return self.adapter_in.kl_divergence() + self.adapter_out.kl_divergence()

  @property
  def trainable_parameter_variables(self):
    """`V`'s posterior variables, then `U`'s, then the gate (a fixed order)."""
    return (self.adapter_in.posterior_variables + self.adapter_out.posterior_variables +
            [self.gate])

  def compute_output_shape(self, input_shape):
    return tf.TensorShape(input_shape)[:-1].concatenate([self.units])

  def get_config(self):
    config = super().get_config()
    config.update(
        units=self.units,
        adapter_units=self.adapter_units,
        activation=tf.keras.activations.serialize(self.adapter_in.activation),
        prior_scale=self.adapter_in.prior_scale,
        init_scale=self.adapter_in.init_scale,
        min_scale=self.adapter_in.min_scale,
        variance_epsilon=self.adapter_in.variance_epsilon,
        gate_init=self.gate_init,
        seed=self.seed,
        kl_weight=self.adapter_in.kl_weight,
        divergence_fn=serialize_divergence_fn(self.adapter_in.divergence_fn),
    )
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    if "divergence_fn" in config:
      config["divergence_fn"] = deserialize_divergence_fn(config["divergence_fn"])
    return cls(**config)

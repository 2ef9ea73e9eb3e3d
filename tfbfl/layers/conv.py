"""Bayesian 2-D convolution with the local reparameterization trick."""

import tensorflow as tf

from tfbfl.layers.base import MeanFieldGaussianLayer, check_positive_int, is_int

__all__ = ["BayesianConv2D"]

_PADDINGS = ("VALID", "SAME")


def _pair(name, value):
  """`value` as a pair of positive ints (an int means the same on both axes)."""
  if is_int(value):
    value = (value, value)
  try:
    pair = tuple(value)
  except TypeError:
    raise ValueError(
        f"`{name}` must be a positive int or a pair of positive ints, got {value!r}.") from None
  if len(pair) != 2 or any(not is_int(v) or v <= 0 for v in pair):
    raise ValueError(f"`{name}` must be a positive int or a pair of positive ints, got {value!r}.")
  return tuple(int(v) for v in pair)


def conv_output_size(size, kernel, stride, padding):
  """Spatial output length of one axis, as `tf.nn.conv2d` computes it."""
  if padding.upper() == "SAME":
    return -(-size // stride)
  return -(-(size - kernel + 1) // stride)


@tf.keras.utils.register_keras_serializable(package="tfbfl")
class BayesianConv2D(MeanFieldGaussianLayer):
  """2-D convolution with a mean-field Gaussian posterior and local reparameterization.

  The kernel `W` (`[k_h, k_w, c_in, filters]`) and bias `b` (`[filters]`) have
  posterior `q(W, b) = prod N(mu, sigma^2)`, `sigma = softplus(u) + min_scale`, and
  a Gaussian prior held in non-trainable natural parameters (`kernel_prior_eta1`,
  ...), initialised to `N(0, prior_scale^2)`; everything but the forward pass is
  `MeanFieldGaussianLayer` (see `BayesianDense`).

  `call(x, seed)` with a `[2]` integer `seed` samples the pre-activation with the
  local reparameterization trick [(Kingma et al., 2015)][1]. Every output unit of a
  convolution is a linear function of the weights, so given `x` it is Gaussian with

  ```none
  m = conv(x, mu_W) + mu_b
  v = conv(x^2, sigma_W^2) + sigma_b^2
  y = activation(m + sqrt(v + variance_epsilon) * e),   e ~ N(0, I)
  ```

  (`conv` is `tf.nn.conv2d` with this layer's strides and padding; inputs are
  `channels_last`, `[batch, height, width, channels]`). The noise `e` is independent
  per output unit, i.e. per example, position and filter: the marginals are exact,
  the correlation between positions that share weights is dropped, which lowers the
  variance of the gradient estimate (the same trade-off as
  `tfp.layers.Convolution2DReparameterization` vs. local reparameterization in [1]).
  `e` is drawn with `tf.random.stateless_normal(seed)`, so equal seeds give equal
  outputs and no graph-level seed is needed (TFF forbids them). `variance_epsilon`
  keeps `sqrt` differentiable where `v` is exactly zero (zero input patches after
  a ReLU and a bias scale that underflows). `call(x, training=True)` without a seed
  (Keras' `fit`) samples from a fresh seed at every call; `call(x)` (no seed,
  `training` false or unset) is the posterior-mean pass `activation(m)`.

  The layer adds `divergence_loss()` to `layer.losses`: `kl_weight * KL(q || p)`,
  or the sum of TFP-style `divergence_fn(q_w, p_w, None)` over kernel and bias, or
  the unweighted KL when neither is given (the historical default, which
  `tfbfl.networks.conv` does not depend on: it calls `kl_divergence()`). For a
  Keras model trained with a batch-mean loss on `N` examples use `kl_weight=1/N`,
  so that the objective is `-ELBO / N` (see `BayesianDense`).

  The initial `kernel_loc` is Glorot-normal with the receptive-field fans of Keras
  (`fan_in = k_h k_w c_in`, `fan_out = k_h k_w filters`), seeded by `seed`;
  `bias_loc` starts at zero.

  A `1 x 1` `BayesianConv2D` is a `BayesianDense` applied to the channel axis at every
  position (same mean, same variance, independent noise per position); this is why
  `tfbfl.layers.LateralConnection` serves as the `1 x 1` convolutional adapter of
  `tfbfl.networks.conv.VirtualConvNetworks`.

  Args:
    filters: positive int, number of output channels.
    kernel_size: positive int or pair `(k_h, k_w)`.
    strides: positive int or pair; default 1.
    padding: `"valid"` or `"same"` (case-insensitive), as in `tf.nn.conv2d`.
    activation: Keras activation (name or callable); `None` is linear.
    prior_scale: standard deviation of the initial zero-mean prior.
    init_scale: initial posterior standard deviation of every weight.
    min_scale: floor added to `softplus(u)`; `0 <= min_scale < init_scale`.
    variance_epsilon: added to the output variance inside `sqrt`.
    seed: Python int or `None`; seeds the stateless initial `kernel_loc`.
    kl_weight: `None` (weight 1) or a float `>= 0` multiplying the KL added to
      `layer.losses`; typically `1 / num_train_examples`.
    divergence_fn: `None` or a TFP-style callable `(q, p, _) -> scalar` replacing
      `kl_weight * KL` (applied per parameter tensor, summed); at most one of
      `kl_weight` and `divergence_fn`.
    **kwargs: `tf.keras.layers.Layer` arguments (`name`, `dtype`, ...).

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl.layers import BayesianConv2D

  conv = BayesianConv2D(4, kernel_size=3, padding="same", activation="relu", seed=0)
  conv.build((None, 8, 8, 1))
  x = tf.ones([2, 8, 8, 1])
  mean_out = conv(x)                            # [2, 8, 8, 4], posterior mean
  sample = conv(x, seed=tf.constant([1, 2]))    # one local-reparameterized sample
  kl = conv.kl_divergence()                     # == tf.add_n(conv.losses)
  conv.set_prior(conv.posterior())              # now KL == 0
  ```

  #### References

  [1]: Diederik P. Kingma, Tim Salimans, Max Welling. Variational Dropout and the
       Local Reparameterization Trick. In _Neural Information Processing
       Systems_, 2015. https://arxiv.org/abs/1506.02557
  [2]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
       Multi-Task Learning. https://arxiv.org/abs/1906.06268
  """

  def __init__(
      self,
      filters,
      kernel_size,
      strides=1,
      padding="valid",
      activation=None,
      prior_scale=1.0,
      init_scale=1e-3,
      min_scale=1e-6,
      variance_epsilon=1e-8,
      seed=None,
      kl_weight=None,
      divergence_fn=None,
      **kwargs,
  ):
    super().__init__(
        activation=activation,
        prior_scale=prior_scale,
        init_scale=init_scale,
        min_scale=min_scale,
        variance_epsilon=variance_epsilon,
        seed=seed,
        kl_weight=kl_weight,
        divergence_fn=divergence_fn,
        **kwargs,
    )
    filters = check_positive_int("filters", filters)
    if not isinstance(padding, str) or padding.upper() not in _PADDINGS:
      raise ValueError(f"`padding` must be 'valid' or 'same', got {padding!r}.")
    self.filters = filters
    self.kernel_size = _pair("kernel_size", kernel_size)
    self.strides = _pair("strides", strides)
    self.padding = padding.upper()
    self.input_spec = tf.keras.layers.InputSpec(ndim=4)

  def _parameter_shapes(self, input_shape):
    c_in = self._known_last_dim(input_shape, ("batch", "height", "width", "channels"))
    k_h, k_w = self.kernel_size
    return [
        (
            "kernel",
            [k_h, k_w, c_in, self.filters],
            k_h * k_w * c_in,
            k_h * k_w * self.filters,
            True,
        ),
        ("bias", [self.filters], k_h * k_w * c_in, k_h * k_w * self.filters, False),
    ]

  def _affine(self, inputs, params):
    conv = tf.nn.conv2d(inputs, params["kernel"], strides=self.strides, padding=self.padding)
    return tf.nn.bias_add(conv, params["bias"])

  def _apply_variational(self, inputs, locs, variances, seed):
    return self._local_reparameterization(self._affine, inputs, locs, variances, seed)

  def compute_output_shape(self, input_shape):
    input_shape = tf.TensorShape(input_shape)
    spatial = []
    for size, k, s in zip(input_shape[1:3], self.kernel_size, self.strides):
      spatial.append(None if size is None else conv_output_size(size, k, s, self.padding))
    return tf.TensorShape([input_shape[0], *spatial, self.filters])

  def get_config(self):
    config = super().get_config()
    config.update(
        filters=self.filters,
        kernel_size=self.kernel_size,
        strides=self.strides,
        padding=self.padding.lower(),
    )
    return config

"""BayesianConv2D: closed-form KL, local-reparameterization moments, conv semantics."""

import importlib
import os
import re
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from gaussian_helpers import random_posterior as _random_posterior  # noqa: E402
from gaussian_helpers import tfp_kl as _tfp_kl  # noqa: E402
from tfbfl import gaussian  # noqa: E402
from tfbfl.layers import BayesianConv2D, BayesianDense  # noqa: E402


def _conv(input_shape=(None, 6, 6, 2), filters=3, kernel_size=3, **kwargs):
  kwargs.setdefault("seed", 0)
  layer = BayesianConv2D(filters, kernel_size, **kwargs)
  layer.build(input_shape)
  return layer


def _valid_conv_numpy(x, w):
  """Reference 'valid', stride-1 convolution (cross-correlation), loop over taps."""
  kh, kw = w.shape[:2]
  n, h, wd, _ = x.shape
  out = np.zeros((n, h - kh + 1, wd - kw + 1, w.shape[-1]))
  for i in range(kh):
    for j in range(kw):
      out += np.einsum("nhwc,cf->nhwf", x[:, i:i + h - kh + 1, j:j + wd - kw + 1], w[i, j])
  return out


# -- KL ------------------------------------------------------------------------------


def test_kl_matches_tfp_with_default_and_custom_prior():
  rng = np.random.default_rng(0)
  layer = _conv(prior_scale=0.6)
  locs, scales = _random_posterior(layer, rng)
  expected = _tfp_kl(locs, scales, [0.0, 0.0], [0.6, 0.6])
  kl = float(layer.kl_divergence())
  assert np.isfinite(kl)
  np.testing.assert_allclose(kl, expected, rtol=1e-4)
  np.testing.assert_allclose(float(tf.add_n(layer.losses)), expected, rtol=1e-4)

  prior_locs = [rng.normal(size=l.shape).astype(np.float32) for l in locs]
  prior_scales = [rng.uniform(0.1, 2.0, size=l.shape).astype(np.float32) for l in locs]
  layer.set_prior(gaussian.from_loc_scale(prior_locs, prior_scales))
  expected = _tfp_kl(locs, scales, prior_locs, prior_scales)
  np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-4)
  layer.set_prior(layer.posterior())
  assert float(layer.kl_divergence()) == pytest.approx(0.0, abs=1e-3)


# -- forward -------------------------------------------------------------------------


@pytest.mark.parametrize("padding, strides", [("valid", 1), ("same", 1), ("same", 2),
                                              ("valid", (2, 1))])
def test_mean_forward_equals_keras_conv2d(padding, strides):
  layer = _conv(padding=padding, strides=strides, activation="relu")
  locs, _ = _random_posterior(layer, np.random.default_rng(1))
  keras = tf.keras.layers.Conv2D(3, 3, padding=padding, strides=strides, activation="relu")
  keras.build((None, 6, 6, 2))
  keras.set_weights(locs)
  x = tf.random.stateless_normal([4, 6, 6, 2], seed=[1, 1])
  out = layer(x)
  np.testing.assert_allclose(out.numpy(), keras(x).numpy(), rtol=1e-5, atol=1e-5)
  assert out.shape == layer.compute_output_shape(x.shape)


def test_local_reparameterization_matches_closed_form_moments():
  rng = np.random.default_rng(2)
  layer = _conv(input_shape=(None, 5, 5, 2), filters=2, kernel_size=3)
  locs, scales = _random_posterior(layer, rng, scale_range=(0.2, 1.0))
  x = rng.normal(size=(1, 5, 5, 2)).astype(np.float32)
  mean = _valid_conv_numpy(x, locs[0]) + locs[1]
  var = _valid_conv_numpy(x**2, scales[0]**2) + scales[1]**2
  n = 20000  # one call: each copy of x gets independent noise
  samples = layer(np.repeat(x, n, axis=0), seed=tf.constant([5, 6])).numpy()
  se_mean = np.sqrt(var / n)
  assert np.all(np.abs(samples.mean(0) - mean[0]) < 5 * se_mean)
  np.testing.assert_allclose(samples.var(0), var[0], rtol=5 * np.sqrt(2.0 / n))
  # Noise is independent across output positions (local reparameterization).
  z = ((samples - mean) / np.sqrt(var)).reshape(n, -1)
  corr = np.corrcoef(z[:, 0], z[:, 1])[0, 1]
  assert abs(corr) < 5 / np.sqrt(n)


def test_same_seed_same_output_and_different_seed_differs():
  layer = _conv()
  _random_posterior(layer, np.random.default_rng(3))
  x = tf.random.stateless_normal([2, 6, 6, 2], seed=[0, 3])
  a = layer(x, seed=tf.constant([1, 2]))
  np.testing.assert_array_equal(a.numpy(), layer(x, seed=tf.constant([1, 2])).numpy())
  assert not np.allclose(a.numpy(), layer(x, seed=tf.constant([1, 3])).numpy())
  assert not np.allclose(a.numpy(), layer(x).numpy())


def test_one_by_one_conv_is_dense_on_channels():
  # Justifies LateralConnection (BayesianDense on the last axis) as a 1x1 conv adapter.
  conv = _conv(filters=4, kernel_size=1)
  dense = BayesianDense(4, seed=0)
  dense.build((None, 2))
  locs, scales = _random_posterior(conv, np.random.default_rng(4))
  dense.set_posterior(
      gaussian.from_loc_scale([locs[0][0, 0], locs[1]], [scales[0][0, 0], scales[1]]))
  x = tf.random.stateless_normal([3, 6, 6, 2], seed=[2, 2])
  np.testing.assert_allclose(conv(x).numpy(), dense(x).numpy(), rtol=1e-5, atol=1e-6)
  seed = tf.constant([8, 9])
  np.testing.assert_allclose(conv(x, seed=seed).numpy(),
                             dense(x, seed=seed).numpy(),
                             rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("epsilon, finite", [(1e-8, True), (0.0, False)])
def test_zero_variance_gradients_need_the_epsilon(epsilon, finite):
  # Zero input patches and an underflowed bias scale give an output variance of 0.
  layer = _conv(min_scale=0.0, variance_epsilon=epsilon)
  layer.bias_untransformed_scale.assign(tf.fill([3], -200.0))
  layer.bias_loc.assign(tf.fill([3], 0.5))
  x = tf.zeros([2, 6, 6, 2])
  with tf.GradientTape() as tape:
    # (No KL here: with sigma_b == 0 it is legitimately infinite.)
    loss = tf.reduce_sum(layer(x, seed=tf.constant([0, 0])))
  grads = tape.gradient(loss, layer.trainable_variables)
  assert all(g is not None for g in grads)
  all_finite = all(np.all(np.isfinite(g.numpy())) for g in grads)
  assert all_finite == finite


def test_gradients_are_finite_for_relu_inputs():
  layer = _conv(activation="relu")
  x = tf.nn.relu(tf.random.stateless_normal([4, 6, 6, 2], seed=[1, 7]))
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(layer(x, seed=tf.constant([3, 3]))) + layer.kl_divergence()
  grads = tape.gradient(loss, layer.trainable_variables)
  assert len(grads) == 4
  assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)


# -- config, validation, docs -------------------------------------------------------


def test_config_round_trip():
  layer = _conv(padding="same", strides=(2, 1), activation="relu", prior_scale=0.5)
  config = layer.get_config()
  assert config["padding"] == "same" and config["strides"] == (2, 1)
  clone = BayesianConv2D.from_config(config)
  assert clone.get_config() == config
  assert layer.parameter_names == ("kernel", "bias")
  assert layer.kernel_loc.shape == (3, 3, 2, 3)


@pytest.mark.parametrize("kwargs, name", [
    (dict(filters=0, kernel_size=3), "filters"),
    (dict(filters=2, kernel_size=(3, 0)), "kernel_size"),
    (dict(filters=2, kernel_size=3, strides="a"), "strides"),
    (dict(filters=2, kernel_size=3, padding="full"), "padding"),
    (dict(filters=2, kernel_size=3, prior_scale=0.0), "prior_scale"),
    (dict(filters=2, kernel_size=3, seed=0.5), "seed"),
])
def test_argument_validation(kwargs, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    BayesianConv2D(**kwargs)


def test_input_shape_validation():
  with pytest.raises(ValueError, match="`input_shape`"):
    BayesianConv2D(2, 3).build((None, 6, 6))


def test_docstring_example_runs():
  doc = importlib.import_module("tfbfl.layers.conv").BayesianConv2D.__doc__
  code = re.search(r"#### Examples\s*```python\n(.*?)```", doc, re.S).group(1)
  exec(textwrap.dedent(code), {})  # pylint: disable=exec-used

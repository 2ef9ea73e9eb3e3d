"""BayesianLSTM and GaussianEmbedding: KL, Keras equivalence, sampling semantics."""

import functools
import importlib
import os
import re
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import gaussian_helpers  # noqa: E402
from gaussian_helpers import tfp_kl as _tfp_kl  # noqa: E402
from tfbfl import gaussian  # noqa: E402
from tfbfl.layers import BayesianLSTM, GaussianEmbedding  # noqa: E402

_N_IN, _UNITS, _T = 3, 4, 6


def _lstm(**kwargs):
  kwargs.setdefault("seed", 0)
  layer = BayesianLSTM(_UNITS, **kwargs)
  layer.build((None, None, _N_IN))
  return layer


def _embedding(**kwargs):
  kwargs.setdefault("seed", 0)
  layer = GaussianEmbedding(10, 3, **kwargs)
  layer.build((None, None))
  return layer


_random_posterior = functools.partial(gaussian_helpers.random_posterior,
                                      loc_scale=0.5,
                                      scale_range=(0.05, 0.5))


def _keras_lstm(weights, return_sequences, forget_bias):
  keras = tf.keras.layers.LSTM(_UNITS, return_sequences=return_sequences)
  keras.build((None, None, _N_IN))
  kernel, recurrent, bias = [np.asarray(w) for w in weights]
  offset = np.repeat(np.array([0.0, forget_bias, 0.0, 0.0], np.float32), _UNITS)
  keras.set_weights([kernel, recurrent, bias + offset])
  return keras


def _x(batch=3):
  return tf.random.stateless_normal([batch, _T, _N_IN], seed=[5, 1])


# -- KL ------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [_lstm, _embedding])
def test_kl_matches_tfp(make):
  rng = np.random.default_rng(0)
  layer = make(prior_scale=0.8)
  locs, scales = _random_posterior(layer, rng)
  n = len(locs)
  expected = _tfp_kl(locs, scales, [0.0] * n, [0.8] * n)
  kl = float(layer.kl_divergence())
  assert np.isfinite(kl)
  np.testing.assert_allclose(kl, expected, rtol=1e-4)
  np.testing.assert_allclose(float(tf.add_n(layer.losses)), expected, rtol=1e-4)

  prior_locs = [rng.normal(size=l.shape).astype(np.float32) for l in locs]
  prior_scales = [rng.uniform(0.2, 2.0, size=l.shape).astype(np.float32) for l in locs]
  layer.set_prior(gaussian.from_loc_scale(prior_locs, prior_scales))
  np.testing.assert_allclose(float(layer.kl_divergence()),
                             _tfp_kl(locs, scales, prior_locs, prior_scales),
                             rtol=1e-4)
  layer.set_prior(layer.posterior())
  assert float(layer.kl_divergence()) == pytest.approx(0.0, abs=1e-3)


# -- LSTM ----------------------------------------------------------------------------


@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("forget_bias", [0.0, 1.5])
def test_lstm_mean_equals_keras_lstm_with_posterior_means(return_sequences, forget_bias):
  layer = _lstm(return_sequences=return_sequences, forget_bias=forget_bias)
  locs, _ = _random_posterior(layer, np.random.default_rng(1))
  keras = _keras_lstm(locs, return_sequences, forget_bias)
  x = _x()
  out = layer(x)
  expected_shape = (3, _T, _UNITS) if return_sequences else (3, _UNITS)
  assert out.shape == expected_shape == layer.compute_output_shape(x.shape)
  np.testing.assert_allclose(out.numpy(), keras(x).numpy(), rtol=1e-5, atol=1e-6)


def test_lstm_sample_is_one_weight_draw_for_all_steps():
  layer = _lstm(return_sequences=True)
  _random_posterior(layer, np.random.default_rng(2))
  seed = tf.constant([3, 4])
  draw = layer.sample_parameters(seed)
  # A Keras LSTM with these fixed weights at every step reproduces the sampled call.
  keras = _keras_lstm([draw[n] for n in layer.parameter_names], True, 1.0)
  x = _x()
  sampled = layer(x, seed=seed)
  np.testing.assert_allclose(sampled.numpy(), keras(x).numpy(), rtol=1e-5, atol=1e-6)
  assert not np.allclose(sampled.numpy(), layer(x).numpy())
  # The draw really is loc + scale * N(0, 1).
  locs, scales = layer.posterior_loc_scale()
  z = np.concatenate([
      ((draw[n] - m) / s).numpy().ravel() for n, m, s in zip(layer.parameter_names, locs, scales)
  ])
  assert abs(z.mean()) < 0.15 and abs(z.std() - 1.0) < 0.1


def test_lstm_draw_is_shared_across_the_batch():
  layer = _lstm(return_sequences=True)
  _random_posterior(layer, np.random.default_rng(3), scale_range=(0.5, 1.0))
  x = tf.concat([_x(1), _x(1)], axis=0)
  out = layer(x, seed=tf.constant([0, 9])).numpy()
  np.testing.assert_array_equal(out[0], out[1])


def test_lstm_seeds():
  layer = _lstm()
  _random_posterior(layer, np.random.default_rng(4))
  x = _x()
  a = layer(x, seed=tf.constant([1, 2]))
  np.testing.assert_array_equal(a.numpy(), layer(x, seed=tf.constant([1, 2])).numpy())
  assert not np.allclose(a.numpy(), layer(x, seed=tf.constant([2, 1])).numpy())
  np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())


def test_lstm_gradients_finite_in_tf_function():
  layer = _lstm(return_sequences=True)
  variables = layer.trainable_variables

  @tf.function
  def grads(x, seed):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(layer(x, seed=seed) - 0.3)) + layer.kl_divergence()
    return tape.gradient(loss, variables)

  result = grads(_x(5), tf.constant([5, 0], tf.int64))
  assert len(result) == 6
  assert all(g is not None and np.all(np.isfinite(g.numpy())) and np.any(g.numpy()) for g in result)


def test_lstm_sample_gradient_finite_when_the_scale_underflows():
  # min_scale=0 is allowed; softplus(-200) is 0 in float32 and d sqrt(v)/dv is
  # infinite at 0, which made the draw's gradient NaN.
  layer = _lstm(min_scale=0.0)
  u = layer.kernel_untransformed_scale
  u.assign(tf.fill(u.shape, -200.0))
  with tf.GradientTape() as tape:
    out = tf.reduce_sum(layer(_x(), seed=tf.constant([1, 2])))
  grads = tape.gradient(out, layer.trainable_variables)
  assert np.isfinite(float(out))
  assert all(np.all(np.isfinite(g.numpy())) for g in grads)


def test_lstm_config_round_trip_and_validation():
  layer = _lstm(return_sequences=True, forget_bias=0.5, prior_scale=2.0)
  config = layer.get_config()
  assert config["units"] == _UNITS and config["forget_bias"] == 0.5
  assert BayesianLSTM.from_config(config).get_config() == config
  assert layer.parameter_names == ("kernel", "recurrent_kernel", "bias")
  assert layer.kernel_loc.shape == (_N_IN, 4 * _UNITS)
  assert layer.recurrent_kernel_loc.shape == (_UNITS, 4 * _UNITS)
  for kwargs, name in [(dict(units=0), "units"),
                       (dict(units=2, return_sequences="yes"), "return_sequences"),
                       (dict(units=2, forget_bias=float("nan")), "forget_bias"),
                       (dict(units=2, init_scale=-1.0), "init_scale")]:
    with pytest.raises(ValueError, match=f"`{name}`"):
      BayesianLSTM(**kwargs)
  with pytest.raises(ValueError, match="`input_shape`"):
    BayesianLSTM(2).build((None, 3))


# -- embedding -----------------------------------------------------------------------


def test_embedding_mean_is_lookup_and_float_ids_are_cast():
  layer = _embedding()
  locs, _ = _random_posterior(layer, np.random.default_rng(5))
  ids = np.array([[1, 5, 5], [0, 9, 2]])
  table = layer.embeddings_loc.numpy()
  np.testing.assert_allclose(table, locs[0], rtol=1e-6)  # natural-parameter round trip
  np.testing.assert_array_equal(layer(tf.constant(ids)).numpy(), table[ids])
  np.testing.assert_array_equal(layer(tf.constant(ids, tf.float32)).numpy(), table[ids])
  assert layer.compute_output_shape((2, 3)) == (2, 3, 3)


def test_embedding_samples_each_lookup_with_the_row_marginal():
  layer = _embedding()
  locs, scales = _random_posterior(layer, np.random.default_rng(6), scale_range=(0.2, 1.0))
  n = 20000
  ids = tf.constant([[3, 7]] * n)
  samples = layer(ids, seed=tf.constant([1, 1])).numpy()  # [n, 2, 3]
  for pos, token in enumerate((3, 7)):
    mean, var = locs[0][token], scales[0][token]**2
    assert np.all(np.abs(samples[:, pos].mean(0) - mean) < 5 * np.sqrt(var / n))
    np.testing.assert_allclose(samples[:, pos].var(0), var, rtol=5 * np.sqrt(2.0 / n))
  # Two occurrences of one token are independent draws (per-lookup noise).
  same = layer(tf.constant([[4, 4]] * n), seed=tf.constant([2, 2])).numpy()
  corr = np.corrcoef(same[:, 0, 0], same[:, 1, 0])[0, 1]
  assert abs(corr) < 5 / np.sqrt(n)
  np.testing.assert_array_equal(samples, layer(ids, seed=tf.constant([1, 1])).numpy())


def test_embedding_gradients_and_config():
  layer = _embedding()
  with tf.GradientTape() as tape:
    out = layer(tf.constant([[1, 2, 2]]), seed=tf.constant([0, 1]))
    loss = tf.reduce_sum(out) + layer.kl_divergence()
  grads = tape.gradient(loss, layer.trainable_variables)
  assert all(g is not None and np.all(np.isfinite(tf.convert_to_tensor(g).numpy())) for g in grads)
  config = layer.get_config()
  assert GaussianEmbedding.from_config(config).get_config() == config
  for kwargs, name in [(dict(input_dim=0, output_dim=2), "input_dim"),
                       (dict(input_dim=3, output_dim=1.5), "output_dim"),
                       (dict(input_dim=3, output_dim=2, seed="x"), "seed")]:
    with pytest.raises(ValueError, match=f"`{name}`"):
      GaussianEmbedding(**kwargs)


@pytest.mark.parametrize("name", ["BayesianLSTM", "GaussianEmbedding"])
def test_docstring_examples_run(name):
  doc = getattr(importlib.import_module("tfbfl.layers.recurrent"), name).__doc__
  code = re.search(r"#### Examples\s*```python\n(.*?)```", doc, re.S).group(1)
  exec(textwrap.dedent(code), {})  # pylint: disable=exec-used

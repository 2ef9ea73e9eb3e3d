"""Bayesian layers: closed-form KL, local reparameterization, natural-parameter I/O."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from gaussian_helpers import random_posterior as _random_posterior  # noqa: E402
from gaussian_helpers import tfp_kl as _tfp_kl  # noqa: E402
from tfbfl import gaussian  # noqa: E402
from tfbfl.layers import BayesianDense, LateralConnection  # noqa: E402


def _layer(n_in=4, units=3, **kwargs):
  kwargs.setdefault("seed", 0)
  layer = BayesianDense(units, **kwargs)
  layer.build((None, n_in))
  return layer


# -- KL ------------------------------------------------------------------------------


def test_kl_matches_tfp_with_default_prior():
  layer = _layer(prior_scale=0.7)
  locs, scales = _random_posterior(layer, np.random.default_rng(0))
  expected = _tfp_kl(locs, scales, [0.0, 0.0], [0.7, 0.7])
  np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-4)


def test_kl_matches_tfp_with_non_default_prior():
  rng = np.random.default_rng(1)
  layer = _layer()
  locs, scales = _random_posterior(layer, rng)
  prior_locs = [rng.normal(size=l.shape).astype(np.float32) for l in locs]
  prior_scales = [rng.uniform(0.1, 2.0, size=l.shape).astype(np.float32) for l in locs]
  layer.set_prior(gaussian.from_loc_scale(prior_locs, prior_scales))
  expected = _tfp_kl(locs, scales, prior_locs, prior_scales)
  np.testing.assert_allclose(float(layer.kl_divergence()), expected, rtol=1e-4)
  # The default prior would give a different value: the prior is really used.
  assert abs(expected - _tfp_kl(locs, scales, [0.0, 0.0], [1.0, 1.0])) > 1.0


def test_kl_is_zero_when_prior_equals_posterior():
  layer = _layer()
  _random_posterior(layer, np.random.default_rng(2))
  layer.set_prior(layer.posterior())
  assert float(layer.kl_divergence()) == pytest.approx(0.0, abs=1e-3)


# -- forward -------------------------------------------------------------------------


def test_local_reparameterization_matches_closed_form_moments():
  rng = np.random.default_rng(3)
  layer = _layer(n_in=5, units=3)
  locs, scales = _random_posterior(layer, rng, scale_range=(0.2, 1.0))
  x = rng.normal(size=(4, 5)).astype(np.float32) * 2.0
  m = x @ locs[0] + locs[1]
  v = (x**2) @ scales[0]**2 + scales[1]**2
  n = 4000
  out = layer(np.tile(x, (n, 1)), seed=tf.constant([5, 6]))
  samples = out.numpy().reshape(n, 4, 3)
  np.testing.assert_allclose(samples.mean(0), m, atol=float(4 * np.sqrt(v.max() / n)))
  np.testing.assert_allclose(samples.var(0), v, rtol=0.12)


def test_no_seed_gives_posterior_mean_forward():
  rng = np.random.default_rng(4)
  layer = _layer(activation="relu")
  locs, _ = _random_posterior(layer, rng)
  x = rng.normal(size=(6, 4)).astype(np.float32)
  np.testing.assert_allclose(layer(x).numpy(),
                             np.maximum(x @ locs[0] + locs[1], 0.0),
                             rtol=1e-5,
                             atol=1e-6)


def test_same_seed_same_output_and_different_seed_different_output():
  layer = _layer()
  _random_posterior(layer, np.random.default_rng(5))
  x = tf.ones([2, 4])
  a = layer(x, seed=tf.constant([1, 2]))
  b = layer(x, seed=tf.constant([1, 2]))
  c = layer(x, seed=tf.constant([1, 3]))
  np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert not np.allclose(a.numpy(), c.numpy())


@pytest.mark.parametrize("variance_epsilon", [1e-8, 0.0])
def test_zero_inputs_after_relu_give_finite_gradients(variance_epsilon):
  # Output variance exactly zero: zero inputs (as after a ReLU) and a bias scale
  # that underflows to 0 (min_scale=0). Without the epsilon sqrt'(0) = inf -> NaN.
  layer = _layer(activation="relu", min_scale=0.0, variance_epsilon=variance_epsilon)
  layer.bias_untransformed_scale.assign(tf.fill([3], -1e3))
  layer.bias_loc.assign(tf.ones([3]))  # active units: the gradient reaches sqrt
  x = tf.nn.relu(-tf.ones([2, 4]))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(layer(x, seed=tf.constant([0, 1])))
  grads = tape.gradient(loss, layer.trainable_variables)
  finite = all(np.all(np.isfinite(g.numpy())) for g in grads)
  assert finite == (variance_epsilon > 0)


def test_posterior_round_trip():
  rng = np.random.default_rng(6)
  layer = _layer()
  locs, scales = _random_posterior(layer, rng, scale_range=(1e-3, 2.0))
  np.testing.assert_allclose(layer.kernel_loc.numpy(), locs[0], rtol=1e-5)
  got_locs, got_scales = layer.posterior_loc_scale()
  for a, b in zip(got_locs + got_scales, locs + scales):
    np.testing.assert_allclose(a.numpy(), b, rtol=1e-4, atol=1e-7)
  g = gaussian.from_loc_scale(locs, scales)
  for a, b in zip(tf.nest.flatten(layer.posterior()), tf.nest.flatten(g)):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-3)


def test_prior_round_trip_and_initial_prior():
  layer = _layer(prior_scale=0.5)
  prior = layer.prior()
  np.testing.assert_array_equal(prior.eta1[0].numpy(), np.zeros([4, 3]))
  np.testing.assert_allclose(prior.eta2[1].numpy(), np.full([3], 4.0))
  rng = np.random.default_rng(7)
  g = gaussian.NaturalGaussian(
      [rng.normal(size=(4, 3)), rng.normal(size=(3,))],
      [rng.uniform(0.5, 2, size=(4, 3)),
       rng.uniform(0.5, 2, size=(3,))])
  layer.set_prior(g)
  for a, b in zip(tf.nest.flatten(layer.prior()), tf.nest.flatten(g)):
    np.testing.assert_allclose(a.numpy(), b, rtol=1e-6)
  assert id(layer.kernel_prior_eta1) not in map(id, layer.trainable_variables)
  assert id(layer.kernel_prior_eta1) in map(id, layer.non_trainable_variables)


def test_initial_scale_and_deterministic_init():
  a, b, c = _layer(seed=3, init_scale=5e-3), _layer(seed=3), _layer(seed=4)
  _, scales = a.posterior_loc_scale()
  np.testing.assert_allclose(scales[0].numpy(), 5e-3, rtol=1e-5)
  np.testing.assert_array_equal(a.kernel_loc.numpy(), b.kernel_loc.numpy())
  assert not np.allclose(a.kernel_loc.numpy(), c.kernel_loc.numpy())
  np.testing.assert_array_equal(a.bias_loc.numpy(), np.zeros([3]))


# -- losses --------------------------------------------------------------------------


def test_callable_loss_equals_kl_and_survives_retracing():
  layer = _layer()
  _random_posterior(layer, np.random.default_rng(8))
  assert len(layer.losses) == 1
  np.testing.assert_allclose(float(layer.losses[0]), float(layer.kl_divergence()), rtol=1e-6)

  @tf.function
  def objective(x, seed):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(x, seed=seed)) + tf.add_n(layer.losses)
    return loss, tape.gradient(loss, layer.trainable_variables)

  seed = tf.constant([0, 0])
  for batch in (2, 5):  # two traces, two FuncGraphs
    x = tf.ones([batch, 4])
    loss, grads = objective(x, seed)
    expected = tf.reduce_sum(layer(x, seed=seed)) + layer.kl_divergence()
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
    assert all(g is not None for g in grads)
  assert objective.experimental_get_tracing_count() == 2
  # The loss is recomputed: it follows a prior change.
  layer.set_prior(layer.posterior())
  assert float(tf.add_n(layer.losses)) == pytest.approx(0.0, abs=1e-3)


# -- config and validation -----------------------------------------------------------


def test_get_config_from_config_round_trip():
  layer = BayesianDense(7, activation="tanh", prior_scale=0.3, init_scale=2e-3, seed=11, name="bd")
  config = layer.get_config()
  clone = BayesianDense.from_config(config)
  assert clone.get_config() == config
  layer.build((None, 3))
  clone.build((None, 3))
  np.testing.assert_array_equal(layer.kernel_loc.numpy(), clone.kernel_loc.numpy())

  lateral = LateralConnection(5, adapter_units=2, gate_init=0.5, seed=3)
  config = lateral.get_config()
  assert LateralConnection.from_config(config).get_config() == config


@pytest.mark.parametrize("kwargs, name", [
    (dict(units=0), "units"),
    (dict(units=2.5), "units"),
    (dict(units=True), "units"),
    (dict(units=3, prior_scale=0.0), "prior_scale"),
    (dict(units=3, init_scale=-1.0), "init_scale"),
    (dict(units=3, init_scale=1e-7, min_scale=1e-6), "init_scale"),
    (dict(units=3, min_scale=-1.0), "min_scale"),
    (dict(units=3, seed="a"), "seed"),
])
def test_dense_argument_validation(kwargs, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    BayesianDense(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(units=0), "units"),
    (dict(units=True), "units"),
    (dict(units=3, adapter_units=-2), "adapter_units"),
    (dict(units=3, adapter_units=2.0), "adapter_units"),
    (dict(units=3, gate_init="x"), "gate_init"),
    (dict(units=3, gate_init=float("nan")), "gate_init"),
])
def test_lateral_argument_validation(kwargs, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    LateralConnection(**kwargs)


def test_numpy_int_sizes_are_python_ints():
  # A size read from an array (a config computed with numpy) is accepted, and what the
  # layer keeps, and its config serializes, is a Python int.
  dense = BayesianDense(np.int64(3))
  lateral = LateralConnection(np.int32(5), adapter_units=np.int64(2))
  assert (type(dense.units), type(lateral.units), type(lateral.adapter_units)) == (int,) * 3
  assert dense.get_config()["units"] == 3 and lateral.get_config()["adapter_units"] == 2


def test_set_posterior_rejects_wrong_structure():
  layer = _layer()
  with pytest.raises(ValueError, match="`g`"):
    layer.set_posterior(gaussian.NaturalGaussian([tf.zeros([4, 3])], [tf.ones([4, 3])]))
  with pytest.raises(ValueError, match="`g`"):
    layer.set_prior((1.0, 2.0))


# -- lateral connection --------------------------------------------------------------


def _lateral(gate_init=1.0, **kwargs):
  lateral = LateralConnection(5, adapter_units=4, gate_init=gate_init, seed=1, **kwargs)
  lateral.build((None, 3))
  return lateral


def test_lateral_matches_its_formula():
  lateral = _lateral(gate_init=0.5)
  rng = np.random.default_rng(9)
  for layer in (lateral.adapter_in, lateral.adapter_out):
    _random_posterior(layer, rng)
  h = rng.normal(size=(6, 3)).astype(np.float32)
  v, u = lateral.adapter_in, lateral.adapter_out
  hidden = np.maximum(h @ v.kernel_loc.numpy() + v.bias_loc.numpy(), 0.0)
  expected = 0.5 * (hidden @ u.kernel_loc.numpy() + u.bias_loc.numpy())
  np.testing.assert_allclose(lateral(h).numpy(), expected, rtol=1e-5, atol=1e-6)
  sampled = lateral(h, seed=tf.constant([3, 4]))
  assert sampled.shape == (6, 5)
  np.testing.assert_array_equal(sampled.numpy(), lateral(h, seed=tf.constant([3, 4])).numpy())
  assert not np.allclose(sampled.numpy(), expected)


def test_lateral_kl_losses_and_variables():
  lateral = _lateral()
  assert len(lateral.losses) == 2
  np.testing.assert_allclose(float(tf.add_n(lateral.losses)),
                             float(lateral.kl_divergence()),
                             rtol=1e-6)
  names = [v.name for v in lateral.trainable_parameter_variables]
  assert len(names) == 9 and "gate" in names[-1]
  assert set(map(id,
                 lateral.trainable_parameter_variables)) == set(map(id,
                                                                    lateral.trainable_variables))
  np.testing.assert_array_equal(lateral.gate.numpy(), np.ones([5]))


def test_lateral_with_zero_gate_outputs_zero_and_blocks_gradients():
  lateral = _lateral(gate_init=0.0)
  h = tf.random.stateless_normal([4, 3], seed=[0, 1])
  with tf.GradientTape() as tape:
    tape.watch(h)
    out = lateral(h, seed=tf.constant([1, 1]))
  grad_h, grad_gate = tape.gradient(out, [h, lateral.gate])
  np.testing.assert_array_equal(out.numpy(), np.zeros([4, 5]))
  np.testing.assert_array_equal(grad_h.numpy(), np.zeros([4, 3]))
  assert np.any(grad_gate.numpy() != 0)  # the gate itself can still open

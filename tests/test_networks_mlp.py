"""VIRTUAL networks: one-pass forward, lateral gating, natural-parameter accessors."""

import importlib
import os
import re
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from gaussian_helpers import random_shared  # noqa: E402
from tfbfl import gaussian  # noqa: E402
from tfbfl import networks  # noqa: E402

_DIMS = dict(input_dim=6, num_classes=3, hidden_units=(5, 4))


def _net(**kwargs):
  return networks.VirtualNetworks(**{**_DIMS, **kwargs})


def _x(batch=7):
  return tf.random.stateless_normal([batch, 6], seed=[4, 2])


def _random_shared(net, seed):
  return random_shared(net, seed, scale=0.5)


def _assert_gaussians_close(a, b, rtol=1e-5):
  fa, fb = tf.nest.flatten(a), tf.nest.flatten(b)
  assert len(fa) == len(fb)
  for x, y in zip(fa, fb):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol)


def test_forward_shapes_and_consistency():
  net = _net()
  x, seed = _x(), tf.constant([3, 9])
  server, client = net.forward(x, seed=seed)
  assert server.shape == (7, 3) and client.shape == (7, 3)
  np.testing.assert_array_equal(net.server_logits(x, seed=seed).numpy(), server.numpy())
  np.testing.assert_array_equal(net.client_logits(x, seed=seed).numpy(), client.numpy())
  server_mean, client_mean = net.forward(x)
  np.testing.assert_array_equal(net.server_logits(x).numpy(), server_mean.numpy())
  assert not np.allclose(server_mean.numpy(), server.numpy())
  np.testing.assert_array_equal(net.forward(x, seed=seed)[1].numpy(), client.numpy())


def test_mean_forward_matches_formula():
  net = _net(adapter_units=2, gate_init=0.7)
  x = _x().numpy()
  relu = lambda a: np.maximum(a, 0.0)
  dense = lambda layer, h: h @ layer.kernel_loc.numpy() + layer.bias_loc.numpy()
  h_s, h_c = x, x
  for l in range(3):
    last = l == 2
    h_s = dense(net.server_layers[l], h_s)
    h_s = h_s if last else relu(h_s)
    lateral = net.laterals[l]
    lat = 0.7 * dense(lateral.adapter_out, relu(dense(lateral.adapter_in, h_s)))
    h_c = dense(net.client_layers[l], h_c) + lat
    h_c = h_c if last else relu(h_c)
  server, client = net.forward(x)
  np.testing.assert_allclose(server.numpy(), h_s, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(client.numpy(), h_c, rtol=1e-5, atol=1e-6)
  assert net.laterals[0].adapter_in.kernel_loc.shape == (5, 2)


def _client_grads_wrt_shared(net, seed):
  with tf.GradientTape() as tape:
    client = net.client_logits(_x(), seed=seed)
  return tape.gradient(client, net.shared_trainable_variables)


@pytest.mark.parametrize("seed", [None, [1, 2]])
def test_zero_gate_makes_client_independent_of_server(seed):
  net = _net(gate_init=0.0)
  grads = _client_grads_wrt_shared(net, seed)
  for g in grads:
    assert g is None or not np.any(g.numpy())


def test_open_gate_makes_client_depend_on_every_shared_variable():
  net = _net(gate_init=1.0)
  net.set_shared_posterior(_random_shared(net, 0))
  grads = _client_grads_wrt_shared(net, tf.constant([1, 2]))
  for v, g in zip(net.shared_trainable_variables, grads):
    assert g is not None and np.any(g.numpy()), v.name


def test_kl_terms():
  net = _net()
  net.set_shared_posterior(_random_shared(net, 1))
  expected = gaussian.kl_divergence(net.shared_posterior(), net.shared_prior())
  np.testing.assert_allclose(float(net.kl_shared()), float(expected), rtol=1e-5)
  private = sum(float(tf.add_n(l.losses)) for l in net.client_layers + net.laterals)
  np.testing.assert_allclose(float(net.kl_private()), private, rtol=1e-5)
  assert all(len(lat.losses) == 2 for lat in net.laterals)
  net.set_shared_prior(net.shared_posterior())
  assert float(net.kl_shared()) == pytest.approx(0.0, abs=1e-3)
  assert float(net.kl_private()) > 1.0


def test_shared_posterior_and_prior_round_trip():
  net = _net()
  g = _random_shared(net, 2)
  net.set_shared_posterior(g)
  _assert_gaussians_close(net.shared_posterior(), g, rtol=1e-3)
  p = _random_shared(net, 3)
  net.set_shared_prior(p)
  _assert_gaussians_close(net.shared_prior(), p, rtol=1e-6)
  shapes = [t.shape for t in net.shared_posterior().eta1]
  assert shapes == [(6, 5), (5,), (5, 4), (4,), (4, 3), (3,)]


def test_shared_setters_reject_wrong_structure():
  net = _net()
  g = net.shared_posterior()
  with pytest.raises(ValueError, match="`g`"):
    net.set_shared_posterior(gaussian.NaturalGaussian(g.eta1[:4], g.eta2[:4]))
  with pytest.raises(ValueError, match="`g`"):
    net.set_shared_prior(g.eta1)


def test_private_weights_round_trip():
  a, b = _net(seed=1), _net(seed=2)
  assert not all(
      np.array_equal(x, y) for x, y in zip(a.get_private_weights(), b.get_private_weights()))
  b.set_private_weights(a.get_private_weights())
  for x, y in zip(a.get_private_weights(), b.get_private_weights()):
    np.testing.assert_array_equal(x.numpy(), y.numpy())
  b.set_shared_posterior(a.shared_posterior())
  x, seed = _x(), tf.constant([7, 7])
  np.testing.assert_allclose(b.client_logits(x, seed).numpy(),
                             a.client_logits(x, seed).numpy(),
                             rtol=1e-5,
                             atol=1e-6)
  with pytest.raises(ValueError, match="`weights`"):
    b.set_private_weights(a.get_private_weights()[:-1])
  with pytest.raises(ValueError, match=r"`weights\[0\]`"):
    b.set_private_weights([np.zeros([2, 2])] + a.get_private_weights()[1:])


def test_variable_partition():
  net = _net()
  shared = set(map(id, net.shared_trainable_variables))
  private = set(map(id, net.private_trainable_variables))
  assert not shared & private
  assert shared | private == set(map(id, net.trainable_variables))
  assert len(shared) == 4 * 3
  assert len(private) == 4 * 3 + 9 * 3
  assert net.private_trainable_variables[-1].name.endswith("gate:0")


def test_initial_values_match_a_fresh_model_and_are_deterministic():
  net = _net(seed=5, init_scale=2e-3)
  initial = networks.initial_shared_posterior(**_DIMS, init_scale=2e-3, seed=5)
  _assert_gaussians_close(net.shared_posterior(), initial, rtol=0)
  again = networks.initial_shared_posterior(**_DIMS, init_scale=2e-3, seed=5)
  _assert_gaussians_close(again, initial, rtol=0)
  other = networks.initial_shared_posterior(**_DIMS, init_scale=2e-3, seed=6)
  assert not np.allclose(other.eta1[0].numpy(), initial.eta1[0].numpy())

  weights = networks.initial_private_weights(**_DIMS, init_scale=2e-3, seed=5)
  assert all(isinstance(w, np.ndarray) for w in weights)
  fresh = net.get_private_weights()
  assert len(weights) == len(fresh)
  for w, f in zip(weights, fresh):
    np.testing.assert_array_equal(w, f.numpy())
  net2 = _net(seed=5, adapter_units=2, gate_init=0.25)
  weights2 = networks.initial_private_weights(**_DIMS, adapter_units=2, gate_init=0.25, seed=5)
  for w, f in zip(weights2, net2.get_private_weights()):
    np.testing.assert_array_equal(w, f.numpy())


def test_forward_and_gradient_in_tf_function():
  net = _net()
  variables = net.trainable_variables

  @tf.function
  def step(x, seed):
    with tf.GradientTape() as tape:
      server, client = net.forward(x, seed=seed)
      loss = (tf.reduce_mean(server**2) + tf.reduce_mean(client**2) + net.kl_shared() +
              net.kl_private())
    return loss, tape.gradient(loss, variables)

  for batch in (3, 4):
    loss, grads = step(_x(batch), tf.constant([0, batch], tf.int64))
    assert np.isfinite(float(loss))
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)
  assert step.experimental_get_tracing_count() == 2


def test_builds_and_trains_in_a_tf1_style_graph():
  # TFF traces TF computations in TF1-style graphs, where Keras swaps in its v1
  # layer base; the model must be constructible there and its setters usable.
  with tf.Graph().as_default():
    net = _net()
    g = tf.nest.map_structure(tf.identity, net.shared_posterior())
    with tf.control_dependencies([net.set_shared_prior(g)]):
      with tf.GradientTape() as tape:
        _, client = net.forward(_x(), seed=tf.constant([1, 1]))
        kl_shared = net.kl_shared()
        loss = tf.reduce_sum(client) + kl_shared + net.kl_private()
      grads = tape.gradient(loss, net.trainable_variables)
    init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session() as sess:
      sess.run(init)
      values = sess.run([loss, kl_shared] + list(grads))
  assert np.isfinite(values[0]) and values[1] == pytest.approx(0.0, abs=1e-3)
  assert all(np.all(np.isfinite(v)) for v in values[2:])


def test_deterministic_mlp_has_server_shapes():
  net = _net()
  mlp = networks.build_deterministic_mlp(**_DIMS, seed=1)
  assert [tuple(w.shape) for w in mlp.weights
         ] == [tuple(v.shape) for v in net.shared_trainable_variables[::2]]
  assert mlp(_x()).shape == (7, 3)
  again = networks.build_deterministic_mlp(**_DIMS, seed=1)
  np.testing.assert_array_equal(mlp.weights[0].numpy(), again.weights[0].numpy())
  assert mlp.layers[-1].activation is tf.keras.activations.linear


@pytest.mark.parametrize("kwargs, name", [
    (dict(input_dim=0, num_classes=3), "input_dim"),
    (dict(input_dim=3, num_classes=1.5), "num_classes"),
    (dict(input_dim=3, num_classes=2, hidden_units=5), "hidden_units"),
    (dict(input_dim=3, num_classes=2, hidden_units=(5, 0)), "hidden_units"),
    (dict(input_dim=3, num_classes=2, adapter_units=0), "adapter_units"),
    (dict(input_dim=3, num_classes=2, seed=1.5), "seed"),
    (dict(input_dim=3, num_classes=2, prior_scale=-1.0), "prior_scale"),
])
def test_argument_validation(kwargs, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    networks.VirtualNetworks(**kwargs)


def test_single_layer_network():
  net = networks.VirtualNetworks(input_dim=6, num_classes=3, hidden_units=())
  server, client = net.forward(_x(), seed=tf.constant([0, 1]))
  assert server.shape == client.shape == (7, 3)
  assert len(net.shared_posterior().eta1) == 2


@pytest.mark.parametrize("obj", [
    "tfbfl.layers.dense.BayesianDense",
    "tfbfl.layers.lateral.LateralConnection",
    "tfbfl.networks.mlp.VirtualNetworks",
])
def test_docstring_examples_run(obj):
  module, name = obj.rsplit(".", 1)
  doc = getattr(importlib.import_module(module), name).__doc__
  code = re.search(r"#### Examples\s*```python\n(.*?)```", doc, re.S).group(1)
  exec(textwrap.dedent(code), {})  # pylint: disable=exec-used

"""VIRTUAL conv and LSTM networks: the VirtualNetworks interface, laterals, training."""

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

_CONV = dict(input_shape=(8, 8), num_classes=5, filters=(3, 4), kernel_size=3, hidden_units=(6,))
_LSTM = dict(vocab_size=12, embedding_dim=4, lstm_units=(5, 6))
_BATCH = 6


class _Conv:
  name = "conv"
  dims = _CONV
  num_classes = 5
  net = staticmethod(lambda **kw: networks.VirtualConvNetworks(**{**_CONV, **kw}))
  shared0 = staticmethod(networks.initial_shared_posterior_conv)
  private0 = staticmethod(networks.initial_private_weights_conv)

  @staticmethod
  def x(batch=_BATCH):  # flattened 8x8 images, as the digits dataset stores them
    return tf.random.stateless_uniform([batch, 64], seed=[4, 2])

  @staticmethod
  def deterministic(net):
    model = networks.build_deterministic_conv(**_CONV, data_shape=(64,), seed=3)
    model.set_weights([v.numpy() for v in net.shared_trainable_variables[::2]])
    return model


class _Lstm:
  name = "lstm"
  dims = _LSTM
  num_classes = 12
  net = staticmethod(lambda **kw: networks.VirtualLSTMNetworks(**{**_LSTM, **kw}))
  shared0 = staticmethod(networks.initial_shared_posterior_lstm)
  private0 = staticmethod(networks.initial_private_weights_lstm)

  @staticmethod
  def x(batch=_BATCH):  # float ids, as a float32 dataset stores them
    ids = tf.random.stateless_uniform([batch, 7], seed=[4, 2], maxval=12, dtype=tf.int32)
    return tf.cast(ids, tf.float32)

  @staticmethod
  def deterministic(net):
    model = networks.build_deterministic_lstm(**_LSTM, seed=3)
    weights = [v.numpy() for v in net.shared_trainable_variables[::2]]
    for i in (3, 6):  # LSTM biases: Keras folds in BayesianLSTM's forget_bias = 1
      weights[i] = weights[i] + np.repeat([0.0, 1.0, 0.0, 0.0], weights[i].size // 4)
    model.set_weights(weights)
    return model


_ARCHS = [_Conv, _Lstm]
_IDS = [a.name for a in _ARCHS]


def _random_shared(net, seed):
  return random_shared(net, seed, scale=0.3)


def _dense(g):
  return None if g is None else tf.convert_to_tensor(g).numpy()


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_forward_shapes_and_consistency(a):
  net = a.net()
  x, seed = a.x(), tf.constant([3, 9])
  server, client = net.forward(x, seed=seed)
  assert server.shape == client.shape == (_BATCH, a.num_classes)
  np.testing.assert_array_equal(net.server_logits(x, seed=seed).numpy(), server.numpy())
  np.testing.assert_array_equal(net.client_logits(x, seed=seed).numpy(), client.numpy())
  mean_server, _ = net.forward(x)
  np.testing.assert_array_equal(net.server_logits(x).numpy(), mean_server.numpy())
  assert not np.allclose(mean_server.numpy(), server.numpy())
  assert not np.allclose(net.forward(x, seed=tf.constant([3, 8]))[1].numpy(), client.numpy())


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_server_mean_equals_deterministic_counterpart(a):
  net = a.net()
  net.set_shared_posterior(_random_shared(net, 0))
  model = a.deterministic(net)
  assert [tuple(w.shape) for w in model.weights
         ] == [tuple(v.shape) for v in net.shared_trainable_variables[::2]]
  x = a.x()
  np.testing.assert_allclose(model(x).numpy(), net.server_logits(x).numpy(), rtol=1e-4, atol=1e-5)


def _client_grads_wrt_shared(net, x, seed):
  with tf.GradientTape() as tape:
    client = net.client_logits(x, seed=seed)
  return tape.gradient(client, net.shared_trainable_variables)


@pytest.mark.parametrize("seed", [None, [1, 2]])
@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_zero_gate_makes_client_independent_of_server(a, seed):
  net = a.net(gate_init=0.0)
  net.set_shared_posterior(_random_shared(net, 1))
  for g in _client_grads_wrt_shared(net, a.x(), seed):
    assert g is None or not np.any(_dense(g))
  # ... and the client output does not move when the server weights do.
  x = a.x()
  before = net.client_logits(x, seed=seed).numpy()
  net.set_shared_posterior(_random_shared(net, 2))
  np.testing.assert_array_equal(net.client_logits(x, seed=seed).numpy(), before)


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_open_gate_makes_client_depend_on_every_shared_variable(a):
  net = a.net(gate_init=1.0)
  net.set_shared_posterior(_random_shared(net, 3))
  grads = _client_grads_wrt_shared(net, a.x(), tf.constant([1, 2]))
  for v, g in zip(net.shared_trainable_variables, grads):
    assert g is not None and np.any(_dense(g)), v.name


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_kl_terms(a):
  net = a.net()
  net.set_shared_posterior(_random_shared(net, 4))
  expected = gaussian.kl_divergence(net.shared_posterior(), net.shared_prior())
  np.testing.assert_allclose(float(net.kl_shared()), float(expected), rtol=1e-5)
  private = sum(float(tf.add_n(l.losses)) for l in net.client_layers + net.laterals)
  np.testing.assert_allclose(float(net.kl_private()), private, rtol=1e-5)
  assert np.isfinite(float(net.kl_private()))
  net.set_shared_prior(net.shared_posterior())
  assert float(net.kl_shared()) == pytest.approx(0.0, abs=1e-3)


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_shared_round_trip_and_structure_check(a):
  net = a.net()
  g = _random_shared(net, 5)
  net.set_shared_posterior(g)
  for x, y in zip(tf.nest.flatten(net.shared_posterior()), tf.nest.flatten(g)):
    np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-3)
  p = _random_shared(net, 6)
  net.set_shared_prior(p)
  for x, y in zip(tf.nest.flatten(net.shared_prior()), tf.nest.flatten(p)):
    np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-6)
  with pytest.raises(ValueError, match="`g`"):
    net.set_shared_posterior(gaussian.NaturalGaussian(g.eta1[:-1], g.eta2[:-1]))
  with pytest.raises(ValueError, match="`g`"):
    net.set_shared_prior(g.eta1)


def test_shared_structure_is_the_papers_layers():
  conv = networks.VirtualConvNetworks(input_shape=(28, 28, 1), num_classes=10)
  assert [tuple(t.shape) for t in conv.shared_posterior().eta1] == [(5, 5, 1, 32), (32,),
                                                                    (5, 5, 32, 64), (64,),
                                                                    (7 * 7 * 64, 100), (100,),
                                                                    (100, 100), (100,), (100, 10),
                                                                    (10,)]
  lstm_shapes = [tuple(t.shape) for t in networks.initial_shared_posterior_lstm().eta1]
  assert lstm_shapes == [(88, 8), (8, 400), (100, 400), (400,), (100, 400), (100, 400), (400,),
                         (100, 88), (88,)]


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_private_weights_round_trip_and_partition(a):
  net_a, net_b = a.net(seed=1), a.net(seed=2)
  assert not all(
      np.array_equal(x, y)
      for x, y in zip(net_a.get_private_weights(), net_b.get_private_weights()))
  net_b.set_private_weights(net_a.get_private_weights())
  net_b.set_shared_posterior(net_a.shared_posterior())
  x, seed = a.x(), tf.constant([7, 7])
  np.testing.assert_allclose(net_b.client_logits(x, seed).numpy(),
                             net_a.client_logits(x, seed).numpy(),
                             rtol=1e-4,
                             atol=1e-5)
  with pytest.raises(ValueError, match="`weights`"):
    net_b.set_private_weights(net_a.get_private_weights()[:-1])
  with pytest.raises(ValueError, match=r"`weights\[0\]`"):
    net_b.set_private_weights([np.zeros([1, 1])] + net_a.get_private_weights()[1:])
  shared = set(map(id, net_a.shared_trainable_variables))
  private = set(map(id, net_a.private_trainable_variables))
  assert not shared & private
  assert shared | private == set(map(id, net_a.trainable_variables))
  assert net_a.private_trainable_variables[-1].name.endswith("gate:0")


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_initial_values_match_a_fresh_model_and_are_deterministic(a):
  kw = dict(a.dims, init_scale=2e-3)
  net = a.net(seed=5, init_scale=2e-3, adapter_units=3, gate_init=0.25)
  initial = a.shared0(**kw, seed=5)
  for x, y in zip(tf.nest.flatten(initial), tf.nest.flatten(net.shared_posterior())):
    np.testing.assert_array_equal(x.numpy(), y.numpy())
  for x, y in zip(tf.nest.flatten(initial), tf.nest.flatten(a.shared0(**kw, seed=5))):
    np.testing.assert_array_equal(x.numpy(), y.numpy())
  other = a.shared0(**kw, seed=6)
  assert not np.allclose(other.eta1[0].numpy(), initial.eta1[0].numpy())
  weights = a.private0(**kw, adapter_units=3, gate_init=0.25, seed=5)
  fresh = net.get_private_weights()
  assert len(weights) == len(fresh)
  assert all(isinstance(w, np.ndarray) for w in weights)
  for w, f in zip(weights, fresh):
    np.testing.assert_array_equal(w, f.numpy())


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_sgd_steps_reduce_the_loss(a):
  net = a.net(seed=0, init_scale=1e-2)
  x = a.x(8)
  y = tf.random.stateless_uniform([8], seed=[1, 5], maxval=a.num_classes, dtype=tf.int32)
  variables = net.trainable_variables

  def data_loss(seed):
    server, client = net.forward(x, seed=seed)
    ce = lambda logits: tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return ce(server) + ce(client)

  @tf.function(autograph=False)  # as the library's own steps (keras_step): plain Python
  def step(seed):
    with tf.GradientTape() as tape:
      loss = data_loss(seed) + 1e-4 * (net.kl_shared() + net.kl_private())
    grads = tape.gradient(loss, variables)
    for v, g in zip(variables, grads):
      v.assign_sub(0.2 * tf.convert_to_tensor(g))
    return loss

  before = float(data_loss(None))
  for i in range(25):
    loss = step(tf.constant([i, 0]))
    assert np.isfinite(float(loss))
  after = float(data_loss(None))
  assert after < 0.8 * before, (before, after)


@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_deterministic_builders_are_deterministic(a):
  builder = {
      "conv": lambda s: networks.build_deterministic_conv(**_CONV, seed=s),
      "lstm": lambda s: networks.build_deterministic_lstm(**_LSTM, seed=s)
  }[a.name]
  m1, m2, m3 = builder(1), builder(1), builder(2)
  for w1, w2 in zip(m1.weights, m2.weights):
    np.testing.assert_array_equal(w1.numpy(), w2.numpy())
  assert not np.allclose(m1.weights[0].numpy(), m3.weights[0].numpy())
  assert m1.layers[-1].activation is tf.keras.activations.linear


def test_lstm_return_sequences():
  net = networks.VirtualLSTMNetworks(**_LSTM, return_sequences=True)
  server, client = net.forward(_Lstm.x(), seed=tf.constant([0, 1]))
  assert server.shape == client.shape == (_BATCH, 7, 12)
  model = networks.build_deterministic_lstm(**_LSTM, return_sequences=True)
  assert model(_Lstm.x()).shape == (_BATCH, 7, 12)


@pytest.mark.parametrize("make, kwargs, name", [
    (networks.VirtualConvNetworks, dict(input_shape=(64,)), "input_shape"),
    (networks.VirtualConvNetworks, dict(input_shape=(4, 4), filters=(2, 2, 2)), "input_shape"),
    (networks.VirtualConvNetworks, dict(filters=(3, 0)), "filters"),
    (networks.VirtualConvNetworks, dict(kernel_size=(3, 3)), "kernel_size"),
    (networks.VirtualConvNetworks, dict(padding="full"), "padding"),
    (networks.VirtualConvNetworks, dict(hidden_units=5), "hidden_units"),
    (networks.VirtualConvNetworks, dict(num_classes=0), "num_classes"),
    (networks.VirtualConvNetworks, dict(adapter_units=0), "adapter_units"),
    (networks.VirtualConvNetworks, dict(seed=1.5), "seed"),
    (networks.VirtualLSTMNetworks, dict(vocab_size=0), "vocab_size"),
    (networks.VirtualLSTMNetworks, dict(lstm_units=()), "lstm_units"),
    (networks.VirtualLSTMNetworks, dict(embedding_dim=2.0), "embedding_dim"),
    (networks.VirtualLSTMNetworks, dict(return_sequences=1), "return_sequences"),
    (networks.VirtualLSTMNetworks, dict(forget_bias="x"), "forget_bias"),
    (networks.VirtualLSTMNetworks, dict(prior_scale=-1.0), "prior_scale"),
    (networks.build_deterministic_conv, dict(input_shape=(8, 8), data_shape=(60,)), "data_shape"),
])
def test_argument_validation(make, kwargs, name):
  with pytest.raises(ValueError, match=f"`{name}`"):
    make(**kwargs)


@pytest.mark.parametrize("name", ["VirtualConvNetworks", "VirtualLSTMNetworks"])
def test_docstring_examples_run(name):
  doc = getattr(networks, name).__doc__
  code = re.search(r"#### Examples\s*```python\n(.*?)```", doc, re.S).group(1)
  exec(textwrap.dedent(code), {})  # pylint: disable=exec-used


@pytest.mark.usefixtures("eager_functions")  # its subject is the step's maths
def test_virtual_lstm_client_update_is_stable_under_a_sharp_shared_prior():
  """Regression: VIRTUAL's LSTM client round gave a NaN loss at client_lr=0.2.

  The shared prior `p^(1/K) * cavity` of round 0 has precision
  `1/K + (K-1)/(K init_scale^2)` (200.5 here), so in every shared mean the KL term
  `kl_weight/N * KL` has curvature 200.5/16 = 12.5: an explicit SGD step multiplies
  the distance to the prior mean by `|1 - lr * 12.5|` (5.3 at lr=0.5), and the
  server weights, then the laterals and the client, blow up within a few steps.
  The client step must take that quadratic implicitly (stable for any lr).
  """
  from tfbfl.algorithms import virtual  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  x = rng.integers(1, 12, size=(16, 6)).astype(np.int32)
  y = ((x[:, -1] + 1) % 12).astype(np.int32)
  cfg = virtual.VirtualConfig(input_dim=6,
                              input_shape=(6,),
                              num_classes=12,
                              num_clients=2,
                              architecture="lstm",
                              vocab_size=12,
                              embedding_dim=4,
                              lstm_units=(8,),
                              epochs=5,
                              batch_size=8,
                              client_lr=0.5,
                              server_lr=0.5,
                              init_scale=0.05,
                              kl_weight=1.0,
                              jit_compile=False)
  posterior = virtual.initial_posterior(cfg)
  out = virtual.client_update(cfg,
                              posterior,
                              virtual.initial_client_state(cfg, 0, posterior),
                              tf.constant([0, 0], tf.int64),
                              x,
                              y,
                              net=virtual.build_networks(cfg))
  assert np.isfinite(float(out.metrics["train_loss"]))
  q = out.client_state.shared_posterior
  for t in list(q.eta1) + list(q.eta2) + list(out.client_state.private):
    assert np.all(np.isfinite(np.asarray(t)))
  # The shared posterior stays near s^(0) (10.5 nats over 572 weights; NaN before).
  assert float(gaussian.kl_divergence(q, posterior)) < 0.1 * sum(int(np.size(e)) for e in q.eta1)


# Last in the file: once TFF has traced Keras layers in its graphs, Keras models
# built earlier outside TFF are not to be called again (SPEC pitfall).
@pytest.mark.parametrize("a", _ARCHS, ids=_IDS)
def test_networks_trace_inside_a_tff_computation(a):
  tff = pytest.importorskip("tensorflow_federated")
  x_spec = {"conv": [None, 64], "lstm": [None, 7]}[a.name]
  shared = a.shared0(**a.dims, seed=0)
  leaf_types = [tff.TensorType(np.float32, tuple(t.shape)) for t in shared.eta1]
  posterior_type = tff.to_type(gaussian.NaturalGaussian(list(leaf_types), list(leaf_types)))
  private_types = [tff.TensorType(np.float32, w.shape) for w in a.private0(**a.dims, seed=0)]

  @tff.tensorflow.computation(posterior_type, private_types, tff.TensorType(np.int64, [2]),
                              tff.TensorType(np.float32, x_spec), tff.TensorType(np.int32, [None]))
  def client_step(posterior, private, seed, x, y):
    net = a.net(seed=None)
    posterior = gaussian.NaturalGaussian(*posterior)
    with tf.control_dependencies([
        net.set_shared_posterior(posterior),
        net.set_shared_prior(posterior),
        net.set_private_weights(private)
    ]):
      with tf.GradientTape() as tape:
        server, client = net.forward(x, seed=seed)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y, logits=client)) + net.kl_shared() + net.kl_private()
      grads = tape.gradient(loss, net.trainable_variables)
      updates = [
          v.assign_sub(0.1 * tf.convert_to_tensor(g))
          for v, g in zip(net.trainable_variables, grads)
      ]
    with tf.control_dependencies(updates):
      return net.shared_posterior(), net.get_private_weights(), loss

  result = client_step.type_signature.result
  assert len(result[1]) == len(private_types)
  assert str(result[2]) == "float32"

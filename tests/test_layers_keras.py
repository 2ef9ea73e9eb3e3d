"""The Bayesian layers as plain Keras layers: `fit`, training-mode sampling, KL
weighting (`kl_weight`, `divergence_fn`), saving and reloading without
`custom_objects`, and the docs/library.md snippet."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_probability as tfp  # noqa: E402

from tfbfl.data import load_digits_arrays  # noqa: E402
from tfbfl.layers import (  # noqa: E402
    BayesianConv2D, BayesianDense, BayesianLSTM, GaussianEmbedding, LateralConnection)

tfd = tfp.distributions

# docs/library.md's example, executed verbatim by `test_readme_snippet` (keep them equal).
README_SNIPPET = '''\
import tensorflow as tf
from tfbfl.data import load_digits_arrays
from tfbfl.layers import BayesianDense

x, y = load_digits_arrays()                     # sklearn digits: 1797 x 64, 10 classes
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
kl_weight = 1.0 / len(x_train)                  # per-example ELBO: E_q[log p(y|x,w)] - KL/N
model = tf.keras.Sequential([tf.keras.Input([64]),
                             BayesianDense(64, activation="relu", kl_weight=kl_weight),
                             BayesianDense(10, kl_weight=kl_weight)])
model.compile(tf.keras.optimizers.Adam(0.01), metrics=["accuracy"],
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x_train, y_train, epochs=20, batch_size=64, verbose=0)  # samples weights; adds KL/N
loss, accuracy = model.evaluate(x_test, y_test, verbose=0)        # posterior-mean network
print(f"test accuracy {accuracy:.3f}")
'''


def _scce():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.keras.utils.register_keras_serializable(package="tfbfl_tests")
def doubled_kl(q, p, _):
  """A serialisable, registered `divergence_fn`: `2 KL(q || p)`."""
  return 2.0 * tfd.kl_divergence(q, p)


# -- 1. a Keras `fit` of a BNN matches TFP's local-reparameterization network ---------

_EPOCHS, _BATCH, _HIDDEN, _LR = 30, 64, 32, 1e-2


def _digits_split():
  x, y = load_digits_arrays()
  order = np.random.default_rng(0).permutation(len(x))
  test, train = order[:450], order[450:]
  return x[train], y[train], x[test], y[test]


def _fit_and_score(make_layers, seeds, data, mc_samples):
  """Mean test accuracy over `seeds` of `Sequential(make_layers())` after `fit`, with
  the predictive averaged over `mc_samples` training-mode passes (0: one inference
  pass). One compiled model serves every seed (its traced train step is reused): each
  seed gets its own initial weights, shuffling and a fresh optimizer state."""
  x_train, y_train, x_test, y_test = data
  model, accuracies = None, []
  for seed in seeds:
    tf.keras.utils.set_random_seed(seed)
    fresh = tf.keras.Sequential([tf.keras.Input([64]), *make_layers()])
    if model is None:
      model = fresh
      model.compile(tf.keras.optimizers.Adam(_LR), loss=_scce())
    else:
      model.set_weights(fresh.get_weights())
      for v in model.optimizer.variables:  # Adam's step count and moments
        v.assign(tf.zeros_like(v))
    model.fit(x_train, y_train, epochs=_EPOCHS, batch_size=_BATCH, verbose=0)
    if mc_samples:
      probs = tf.reduce_mean(
          [tf.nn.softmax(model(x_test, training=True)) for _ in range(mc_samples)], 0)
    else:
      probs = tf.nn.softmax(model(x_test, training=False))
    accuracies.append(float(np.mean(np.argmax(probs.numpy(), -1) == y_test)))
  return np.mean(accuracies)


def test_keras_fit_matches_tfp_dense_local_reparameterization():
  data = _digits_split()
  n = len(data[0])
  scaled_kl = lambda q, p, _: tfd.kl_divergence(q, p) / n  # noqa: E731

  def ours():
    return [
        BayesianDense(_HIDDEN, activation="relu", kl_weight=1 / n),
        BayesianDense(_HIDDEN, activation="relu", kl_weight=1 / n),
        BayesianDense(10, kl_weight=1 / n)
    ]

  def theirs():
    return [
        tfp.layers.DenseLocalReparameterization(_HIDDEN,
                                                activation="relu",
                                                kernel_divergence_fn=scaled_kl),
        tfp.layers.DenseLocalReparameterization(_HIDDEN,
                                                activation="relu",
                                                kernel_divergence_fn=scaled_kl),
        tfp.layers.DenseLocalReparameterization(10, kernel_divergence_fn=scaled_kl)
    ]

  seeds = (0, 1, 2)
  # TFP's layers always sample: their predictive is a Monte Carlo average. Ours
  # predicts with the posterior mean (`training=False`, what `predict` does).
  acc_ours = _fit_and_score(ours, seeds, data, mc_samples=0)
  acc_tfp = _fit_and_score(theirs, seeds, data, mc_samples=10)
  print(f"digits test accuracy: tfbfl {acc_ours:.4f}, TFP {acc_tfp:.4f}")
  assert acc_ours > 0.8 and acc_tfp > 0.8  # chance is 0.1
  assert abs(acc_ours - acc_tfp) <= 0.02, (acc_ours, acc_tfp)


def test_fit_samples_weights_in_training_mode():
  # With kl_weight=0 the scales get a gradient only through sampled outputs: under
  # the old behaviour (posterior mean in `fit`) they never moved.
  x, y = load_digits_arrays()
  tf.keras.utils.set_random_seed(0)
  layer = BayesianDense(10, kl_weight=0.0, seed=0)
  model = tf.keras.Sequential([tf.keras.Input([64]), layer])
  model.compile(tf.keras.optimizers.Adam(1e-2), loss=_scce())
  before = layer.kernel_untransformed_scale.numpy().copy()
  model.fit(x[:256], y[:256], epochs=1, batch_size=64, verbose=0)
  assert np.max(np.abs(layer.kernel_untransformed_scale.numpy() - before)) > 1e-3


# -- 2. training-mode sampling -------------------------------------------------------


def _layer_cases():
  rng = np.random.default_rng(0)
  return [
      ("dense", lambda: BayesianDense(3, activation="tanh", seed=0),
       rng.normal(size=(4, 5)).astype(np.float32)),
      ("conv", lambda: BayesianConv2D(2, 3, padding="same", seed=0),
       rng.normal(size=(2, 6, 6, 1)).astype(np.float32)),
      ("lstm", lambda: BayesianLSTM(3, return_sequences=True, seed=0),
       rng.normal(size=(2, 5, 4)).astype(np.float32)),
      ("embedding", lambda: GaussianEmbedding(7, 3, seed=0),
       rng.integers(0, 7, size=(2, 5)).astype(np.int32)),
      ("lateral", lambda: LateralConnection(3, adapter_units=2, seed=0),
       rng.normal(size=(4, 5)).astype(np.float32)),
  ]


def _widen_posterior(layer):
  """Scales of 0.3 everywhere, so that samples differ visibly from the mean."""
  u = float(tfp.math.softplus_inverse(0.3))
  for v in layer.trainable_variables:
    if "untransformed_scale" in v.name:
      v.assign(tf.fill(v.shape, u))


@pytest.mark.parametrize("name, make, x", _layer_cases(), ids=[c[0] for c in _layer_cases()])
def test_training_true_samples_training_false_is_the_mean(name, make, x):
  del name
  layer = make()
  mean = layer(x)
  _widen_posterior(layer)
  mean = layer(x).numpy()
  a = layer(x, training=True).numpy()
  b = layer(x, training=True).numpy()
  assert a.shape == mean.shape
  assert not np.allclose(a, b) and not np.allclose(a, mean)
  np.testing.assert_array_equal(layer(x, training=False).numpy(), mean)
  np.testing.assert_array_equal(layer(x, training=False).numpy(), mean)
  # An explicit seed: reproducible, and `training` does not change it.
  seed = tf.constant([3, 4])
  s = layer(x, seed=seed).numpy()
  np.testing.assert_array_equal(layer(x, seed=seed).numpy(), s)
  np.testing.assert_array_equal(layer(x, seed=seed, training=True).numpy(), s)
  np.testing.assert_array_equal(layer(x, seed=seed, training=False).numpy(), s)
  assert not np.allclose(s, mean)


def test_training_mode_in_a_model_and_inside_tf_function():
  x = np.random.default_rng(1).normal(size=(8, 5)).astype(np.float32)
  model = tf.keras.Sequential(
      [tf.keras.Input([5]),
       BayesianDense(4, activation="relu", seed=0),
       BayesianDense(2, seed=1)])
  for layer in model.layers:
    _widen_posterior(layer)
  run = tf.function(lambda x, training: model(x, training=training))
  for call in (model, run):
    assert not np.allclose(call(x, training=True).numpy(), call(x, training=True).numpy())
    np.testing.assert_array_equal(call(x, training=False).numpy(), call(x, training=False).numpy())
  np.testing.assert_array_equal(model.predict(x, verbose=0), model(x).numpy())
  # A symbolic `training` flag (tf.cond) behaves the same.
  flag = tf.function(lambda x, t: model.layers[0](x, training=t))
  mean = model.layers[0](x).numpy()
  np.testing.assert_array_equal(flag(x, tf.constant(False)).numpy(), mean)
  assert not np.allclose(flag(x, tf.constant(True)).numpy(), mean)


def test_training_mode_is_reproducible_under_set_random_seed():
  x = np.ones([3, 5], np.float32)
  layer = BayesianDense(4, seed=0)
  layer.build((None, 5))
  _widen_posterior(layer)
  tf.keras.utils.set_random_seed(7)
  a = layer(x, training=True).numpy()
  tf.keras.utils.set_random_seed(7)
  np.testing.assert_array_equal(layer(x, training=True).numpy(), a)
  assert not np.allclose(a, layer(x).numpy())  # and it is a sample, not the mean


# -- 3. saving and reloading without custom_objects -------------------------------


def _dense_conv_model(**kl):
  return tf.keras.Sequential([
      tf.keras.Input([8, 8, 1]),
      BayesianConv2D(3, 3, activation="relu", seed=0, **kl),
      tf.keras.layers.Flatten(),
      BayesianDense(6, activation="relu", seed=1, **kl),
      BayesianDense(4, seed=2, **kl),
  ])


def _sequence_model(**kl):
  return tf.keras.Sequential([
      tf.keras.Input([5], dtype=tf.int32),
      GaussianEmbedding(9, 4, seed=0, **kl),
      BayesianLSTM(6, seed=1, **kl),
      LateralConnection(3, adapter_units=2, seed=2, **kl),
  ])


_MODELS = {
    "conv": (_dense_conv_model,
             lambda: np.random.default_rng(2).uniform(size=(3, 8, 8, 1)).astype(np.float32)),
    "sequence": (_sequence_model,
                 lambda: np.random.default_rng(3).integers(0, 9, size=(3, 5)).astype(np.int32)),
}


@pytest.fixture(scope="module")
def trained_models():
  """`get(kind, weighting) -> (model, x)`: the model fitted once and shared by both
  save formats (each test only saves it and reads it: `save`, `predict`, `losses`)."""
  cache = {}

  def get(kind, weighting):
    if (kind, weighting) not in cache:
      make, inputs = _MODELS[kind]
      kl = dict(kl_weight=0.01) if weighting == "kl_weight" else dict(divergence_fn=doubled_kl)
      model = make(**kl)
      x = inputs()
      model.compile(tf.keras.optimizers.Adam(1e-2), loss=_scce())
      model.fit(x, np.arange(3) % 3, epochs=2, verbose=0)  # move the weights off their init
      first = next(l for l in model.layers if hasattr(l, "set_prior"))
      first.set_prior(first.posterior())  # a non-default prior: it must be saved too
      cache[kind, weighting] = model, x
    return cache[kind, weighting]

  return get


@pytest.mark.parametrize("fmt", ["keras", "h5"])
@pytest.mark.parametrize("kind", sorted(_MODELS))
@pytest.mark.parametrize("weighting", ["kl_weight", "divergence_fn"])
def test_save_load_round_trip_without_custom_objects(tmp_path, trained_models, fmt, kind,
                                                     weighting):
  model, x = trained_models(kind, weighting)
  path = str(tmp_path / f"model.{fmt}")
  model.save(path)
  loaded = tf.keras.models.load_model(path)  # no custom_objects
  assert [type(l) for l in loaded.layers] == [type(l) for l in model.layers]
  np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
  np.testing.assert_allclose(float(tf.add_n(loaded.losses)),
                             float(tf.add_n(model.losses)),
                             rtol=1e-6)
  for a, b in zip(loaded.layers, model.layers):
    assert a.get_config() == b.get_config()


def test_lambda_divergence_fn_needs_unsafe_mode(tmp_path):
  model = tf.keras.Sequential([
      tf.keras.Input([3]),
      BayesianDense(2, seed=0, divergence_fn=lambda q, p, _: q.kl_divergence(p) / 7.0)
  ])
  path = str(tmp_path / "m.keras")
  with pytest.warns(UserWarning, match="lambda"):
    model.save(path)
  with pytest.raises(ValueError, match="safe_mode"):
    tf.keras.models.load_model(path)
  loaded = tf.keras.models.load_model(path, safe_mode=False)
  np.testing.assert_allclose(float(loaded.losses[0]), float(model.losses[0]), rtol=1e-6)


# -- 4. KL weighting -------------------------------------------------------------------


def _kl_model(**kl):
  model = tf.keras.Sequential([
      tf.keras.Input([8, 8, 1]),
      BayesianConv2D(2, 3, activation="relu", seed=0, **kl),
      tf.keras.layers.Flatten(),
      BayesianDense(4, seed=1, **kl),
  ])
  return model


def test_losses_scale_linearly_with_kl_weight():
  full = _kl_model()  # default: the unweighted KL, as before
  kl = float(tf.add_n([l.kl_divergence() for l in full.layers if hasattr(l, "kl_divergence")]))
  assert kl > 1.0
  np.testing.assert_allclose(float(tf.add_n(full.losses)), kl, rtol=1e-6)
  for weight in (0.0, 1e-3, 0.5, 1.0, 3.0):
    total = float(tf.add_n(_kl_model(kl_weight=weight).losses))
    np.testing.assert_allclose(total, weight * kl, rtol=1e-6, atol=1e-12)
  # The layer-level KL itself is never weighted (the federated algorithms read it).
  layer = BayesianDense(3, kl_weight=0.25, seed=0)
  layer.build((None, 4))
  np.testing.assert_allclose(float(layer.losses[0]), 0.25 * float(layer.kl_divergence()), rtol=1e-6)
  np.testing.assert_allclose(float(layer.divergence_loss()), float(layer.losses[0]))
  assert layer.kl_weight == 0.25


@pytest.mark.parametrize("make", [
    lambda **kw: BayesianDense(3, seed=0, **kw),
    lambda **kw: BayesianLSTM(3, seed=0, **kw),
    lambda **kw: GaussianEmbedding(5, 3, seed=0, **kw),
],
                         ids=["dense", "lstm", "embedding"])
def test_divergence_fn_is_used(make):
  shape = {BayesianDense: (None, 4), BayesianLSTM: (None, 2, 4), GaussianEmbedding: (None, 2)}
  calls = []

  def fn(q, p, third):
    calls.append((q, p, third))
    return tfd.kl_divergence(q, p) / 10.0

  layer = make(divergence_fn=fn)
  layer.build(shape[type(layer)])
  _widen_posterior(layer)  # well-conditioned KLs (at the initial scale 1e-3 float32
  # closed forms of KL differ in the 4th digit)
  assert len(layer.losses) == 1
  np.testing.assert_allclose(float(layer.losses[0]), float(layer.kl_divergence()) / 10.0, rtol=1e-5)
  calls.clear()
  layer.divergence_loss()
  # Called once per parameter tensor with TFP distributions over it; no weight sample.
  n = len(layer.parameter_names)
  assert len(calls) == n
  for (q, p, third), name in zip(calls, layer.parameter_names):
    assert isinstance(q, tfd.Distribution) and isinstance(p, tfd.Distribution)
    assert q.event_shape == getattr(layer, f"{name}_loc").shape and third is None
  # It really replaces the KL: a constant divergence gives a constant loss.
  const = make(divergence_fn=lambda q, p, _: tf.constant(1.5))
  const.build(shape[type(layer)])
  assert float(const.losses[0]) == pytest.approx(1.5 * n)
  # The prior it sees is the layer's current prior.
  layer.set_prior(layer.posterior())
  assert float(layer.losses[0]) == pytest.approx(0.0, abs=1e-4)


def test_lateral_connection_passes_the_weighting_on():
  lateral = LateralConnection(3, adapter_units=2, seed=0, kl_weight=0.1)
  lateral.build((None, 4))
  np.testing.assert_allclose(float(tf.add_n(lateral.losses)),
                             0.1 * float(lateral.kl_divergence()),
                             rtol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kl_weight=-0.1), "kl_weight"),
    (dict(kl_weight=float("nan")), "kl_weight"),
    (dict(kl_weight=float("inf")), "kl_weight"),
    (dict(kl_weight="1/N"), "kl_weight"),
    (dict(kl_weight=True), "kl_weight"),
    (dict(kl_weight=tf.constant(0.1)), "kl_weight"),
    (dict(divergence_fn="kl"), "divergence_fn"),
    (dict(kl_weight=0.1, divergence_fn=doubled_kl), "at most one of `kl_weight` and"),
])
@pytest.mark.parametrize("cls, args", [
    (BayesianDense, (3,)),
    (BayesianConv2D, (2, 3)),
    (BayesianLSTM, (3,)),
    (GaussianEmbedding, (5, 3)),
    (LateralConnection, (3,)),
],
                         ids=["dense", "conv", "lstm", "embedding", "lateral"])
def test_invalid_weighting_arguments(cls, args, kwargs, match):
  with pytest.raises(ValueError, match=match):
    cls(*args, **kwargs)


# -- README ---------------------------------------------------------------------------


def test_readme_snippet(capsys):
  namespace = {}
  exec(compile(README_SNIPPET, "README_SNIPPET", "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["accuracy"] > 0.85, namespace["accuracy"]
  assert "test accuracy" in capsys.readouterr().out

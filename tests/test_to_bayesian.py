"""`tfbfl.layers.to_bayesian`: the conversion table, the copy's posterior-mean function
against the Keras original, the refusals, training with `fit`, saving, seeds, and the
documentation (the docstring's example and the docs/library.md section)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import difflib  # noqa: E402
import re  # noqa: E402
import textwrap  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_probability as tfp  # noqa: E402

from tfbfl import gaussian  # noqa: E402
from tfbfl.layers import (  # noqa: E402
    SUPPORTED_WEIGHT_LAYERS, WEIGHTLESS_LAYERS, BayesianConv2D, BayesianDense, BayesianLSTM,
    GaussianEmbedding, LateralConnection, UnsupportedLayerError, bayesian_layer_args,
    is_weightless, to_bayesian)
from tfbfl.layers import convert  # noqa: E402
from tfbfl.layers.base import derive_seed  # noqa: E402

L = tf.keras.layers
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CALLER_KEYS = {"name", "seed", "prior_scale", "init_scale", "kl_weight", "trainable"}

# docs/library.md's example, executed by `test_docs_snippet_trains_on_digits` (keep equal).
README_SNIPPET_TO_BAYESIAN = '''\
import tensorflow as tf
from tfbfl.data import load_digits_arrays
from tfbfl.layers import to_bayesian

x, y = load_digits_arrays()
x = x.reshape(-1, 8, 8, 1)                      # the digits as 8 x 8 images
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
keras_model = tf.keras.Sequential([             # any Sequential model or functional chain
    tf.keras.Input([8, 8, 1]),
    tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(10)])
bnn = to_bayesian(keras_model, kl_weight=1.0 / len(x_train), seed=0)  # per-example ELBO
print([type(layer).__name__ for layer in bnn.layers])  # BayesianConv2D, ..., BayesianDense
bnn.compile(tf.keras.optimizers.Adam(0.01), metrics=["accuracy"],
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
bnn.fit(x_train, y_train, epochs=5, batch_size=64, verbose=0)  # sampled weights, + KL/N
loss, accuracy = bnn.evaluate(x_test, y_test, verbose=0)       # posterior-mean network
print(f"test accuracy {accuracy:.3f}")
'''


def _scce():
  return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# -- 1. the per-layer table ----------------------------------------------------------


@pytest.mark.parametrize("layer, cls, kwargs", [
    (L.Dense(7), BayesianDense, dict(units=7, activation=None)),
    (L.Dense(3, activation="relu", kernel_initializer="ones", kernel_regularizer="l2"),
     BayesianDense, dict(units=3, activation="relu")),
    (L.Dense(2, activation="softmax", dtype="float64"), BayesianDense,
     dict(units=2, activation="softmax", dtype="float64")),
    (L.Conv2D(4, 3), BayesianConv2D,
     dict(filters=4, kernel_size=(3, 3), strides=(1, 1), padding="valid", activation=None)),
    (L.Conv2D(5, (2, 3), strides=(2, 1), padding="same", activation="tanh"), BayesianConv2D,
     dict(filters=5, kernel_size=(2, 3), strides=(2, 1), padding="same", activation="tanh")),
    (L.LSTM(6), BayesianLSTM, dict(units=6, return_sequences=False, forget_bias=1.0)),
    (L.LSTM(2, return_sequences=True, unit_forget_bias=False, unroll=True), BayesianLSTM,
     dict(units=2, return_sequences=True, forget_bias=0.0)),
    (L.Embedding(50, 8, input_length=10), GaussianEmbedding, dict(input_dim=50, output_dim=8)),
],
                         ids=["dense", "dense-relu", "dense-f64", "conv", "conv-strided",
                              "lstm", "lstm-seq", "embedding"])
def test_conversion_table(layer, cls, kwargs):
  got_cls, got = bayesian_layer_args(layer)
  assert got_cls is cls and got == kwargs
  assert SUPPORTED_WEIGHT_LAYERS[type(layer)] is cls
  assert not _CALLER_KEYS & set(got)
  # The kwargs build the layer, and the caller's keys can be added.
  built = cls(**got, name="x", seed=1, prior_scale=2.0, init_scale=1e-2, kl_weight=0.5)
  assert built.seed == 1 and built.prior_scale == 2.0 and built.kl_weight == 0.5
  # Built layers give the same answer as unbuilt ones.
  if isinstance(layer, L.Embedding):
    layer.build((None, 10))
  elif isinstance(layer, L.Conv2D):
    layer.build((None, 8, 8, 1))
  elif isinstance(layer, L.LSTM):
    layer.build((None, 4, 3))
  else:
    layer.build((None, 4))
  assert bayesian_layer_args(layer) == (cls, kwargs)


def test_custom_activation_is_passed_as_the_callable():
  def halve(z):
    return 0.5 * z

  _, kwargs = bayesian_layer_args(L.Dense(3, activation=halve))
  assert kwargs["activation"] is halve


def _fn(q, p, _):
  return tfp.distributions.kl_divergence(q, p) / 3.0


@pytest.mark.parametrize("layer", [
    BayesianDense(3, activation="relu", min_scale=1e-5, seed=4, prior_scale=2.0, kl_weight=0.1,
                  name="mine"),
    BayesianConv2D(2, 3, strides=2, padding="same", variance_epsilon=1e-6, init_scale=0.01),
    BayesianLSTM(4, return_sequences=True, forget_bias=0.5, seed=1),
    GaussianEmbedding(9, 2, divergence_fn=_fn),
    LateralConnection(3, adapter_units=2, gate_init=0.5, seed=3, kl_weight=0.2),
],
                         ids=["dense", "conv", "lstm", "embedding", "lateral"])
def test_bayesian_layers_are_taken_as_they_are(layer):
  cls, kwargs = bayesian_layer_args(layer)
  assert cls is type(layer)
  assert not _CALLER_KEYS & set(kwargs)
  expected = {k: v for k, v in layer.get_config().items() if k not in _CALLER_KEYS}
  if layer.get_config().get("divergence_fn") is None:
    expected.pop("divergence_fn", None)
  else:
    expected["divergence_fn"] = _fn  # the live callable
  assert kwargs == expected
  again = cls(**kwargs, name=layer.name, seed=layer.seed)
  config = layer.get_config()
  for key in ("prior_scale", "init_scale", "kl_weight"):
    config.pop(key)
  new_config = again.get_config()
  for key in ("prior_scale", "init_scale", "kl_weight"):
    new_config.pop(key)
  assert new_config == config


def test_is_weightless():
  assert is_weightless(L.InputLayer(input_shape=(3,)))
  cases = [L.Flatten(), L.Reshape((2, 2)), L.MaxPooling2D(), L.AveragePooling1D(),
           L.GlobalAveragePooling2D(), L.Dropout(0.3), L.Activation("relu"), L.ReLU(),
           L.Softmax(), L.LeakyReLU(), L.Permute((2, 1)), L.ZeroPadding2D(), L.Cropping1D()]
  for layer in cases:
    assert is_weightless(layer), layer
    with pytest.raises(UnsupportedLayerError, match="carried over unchanged"):
      bayesian_layer_args(layer)
  assert not is_weightless(L.Dense(3))
  prelu = L.PReLU()
  prelu.build((None, 3))
  assert not is_weightless(prelu)  # an activation with weights
  assert not is_weightless(_Halve())  # no weights, but an unknown class: refused
  assert not is_weightless(L.Masking())
  with pytest.raises(TypeError, match="Layer"):
    is_weightless("flatten")


# -- 2. the copy computes the original's function at its posterior mean --------------


def _randomize(model, seed):
  rng = np.random.default_rng(seed)
  for layer in model.layers:
    layer.set_weights(
        [rng.normal(scale=0.4, size=w.shape).astype(np.float32) for w in layer.get_weights()])


def _set_means(keras_model, copy):
  """Copies every Keras weight into the posterior mean of the copy's layer of the same
  name (scales 1e-3), with BayesianLSTM's forget-bias convention. Returns the number of
  layers set."""
  count = 0
  for layer in keras_model.layers:
    weights = layer.get_weights()
    if not weights:
      continue
    target = copy.get_layer(layer.name)
    if isinstance(layer, L.LSTM):
      assert target.parameter_names == ("kernel", "recurrent_kernel", "bias")
      offset = np.repeat([0.0, target.forget_bias, 0.0, 0.0], layer.units).astype(np.float32)
      weights[-1] = weights[-1] - offset
    assert len(target.parameter_names) == len(weights)
    target.set_posterior(gaussian.from_loc_scale(weights, [np.full(w.shape, 1e-3, np.float32)
                                                           for w in weights]))
    count += 1
  return count


def _mlp():
  return tf.keras.Sequential([
      tf.keras.Input([12]),
      L.Dense(16, activation="relu"),
      L.Dropout(0.3),
      L.Dense(8, activation="tanh"),
      L.LeakyReLU(0.2),
      L.Dense(5),
  ], name="mlp")


def _conv():
  inputs = tf.keras.Input([8, 8, 1], name="image")
  x = L.Conv2D(4, 3, padding="same", activation="relu")(inputs)
  x = L.MaxPooling2D()(x)
  x = L.Conv2D(6, (2, 3), strides=(1, 2), activation="sigmoid")(x)
  x = L.ZeroPadding2D(1)(x)
  x = L.AveragePooling2D()(x)
  x = L.Flatten()(x)
  x = L.Dropout(0.5)(x)
  outputs = L.Dense(5)(x)
  return tf.keras.Model(inputs, outputs, name="conv")


def _sequence():
  return tf.keras.Sequential([
      tf.keras.Input([7], dtype=tf.int32),
      L.Embedding(11, 6),
      L.LSTM(5, return_sequences=True),
      L.LSTM(4, unit_forget_bias=False),
      L.Dense(3),
  ], name="sequence")


_MODELS = {
    "mlp": (_mlp, lambda rng: rng.normal(size=(6, 12)).astype(np.float32)),
    "conv": (_conv, lambda rng: rng.uniform(size=(6, 8, 8, 1)).astype(np.float32)),
    "sequence": (_sequence, lambda rng: rng.integers(0, 11, size=(6, 7)).astype(np.int32)),
}


def _carried(original, copy):
  """The configuration each copied layer must carry from the original one."""
  if isinstance(original, L.Dense):
    assert isinstance(copy, BayesianDense)
    assert copy.units == original.units
    assert copy.activation.__name__ == original.activation.__name__
  elif isinstance(original, L.Conv2D):
    assert isinstance(copy, BayesianConv2D)
    assert copy.filters == original.filters
    assert copy.kernel_size == tuple(original.kernel_size)
    assert copy.strides == tuple(original.strides)
    assert copy.padding == original.padding.upper()
    assert copy.activation.__name__ == original.activation.__name__
  elif isinstance(original, L.LSTM):
    assert isinstance(copy, BayesianLSTM)
    assert copy.units == original.units
    assert copy.return_sequences == original.return_sequences
    assert copy.forget_bias == (1.0 if original.unit_forget_bias else 0.0)
  elif isinstance(original, L.Embedding):
    assert isinstance(copy, GaussianEmbedding)
    assert (copy.input_dim, copy.output_dim) == (original.input_dim, original.output_dim)
  else:
    assert type(copy) is type(original) and copy is not original
    assert copy.get_config() == original.get_config()


@pytest.mark.parametrize("kind", sorted(_MODELS))
def test_mean_forward_pass_equals_the_keras_model(kind):
  make, inputs = _MODELS[kind]
  model = make()
  _randomize(model, 0)
  copy = to_bayesian(model, seed=0)
  assert type(copy) is type(model) and copy.name == f"{model.name}_bayesian"
  assert copy.input_shape == model.input_shape and copy.output_shape == model.output_shape
  assert copy.inputs[0].dtype == model.inputs[0].dtype
  assert [l.name for l in copy.layers] == [l.name for l in model.layers]
  for original, layer in zip(model.layers, copy.layers):
    _carried(original, layer)
  x = inputs(np.random.default_rng(1))
  before = copy(x).numpy()
  assert _set_means(model, copy) == sum(1 for l in model.layers if l.weights)
  expected = model(x).numpy()
  got = copy(x).numpy()
  assert np.max(np.abs(before - expected)) > 1e-2  # the means were really set
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
  np.testing.assert_allclose(copy(x, training=False).numpy(), expected, atol=1e-5, rtol=0)
  # Training mode samples: different from the mean (Dropout aside, the scales do it).
  for layer in copy.layers:
    if isinstance(layer, BayesianDense):
      locs, _ = layer.posterior_loc_scale()
      layer.set_posterior(gaussian.from_loc_scale(locs, [tf.fill(l.shape, 0.3) for l in locs]))
  assert np.max(np.abs(copy(x, training=True).numpy() - expected)) > 1e-3


def test_unbuilt_sequential_gives_an_unbuilt_copy():
  model = tf.keras.Sequential([L.Dense(4, activation="relu"), L.Flatten(), L.Dense(2)])
  copy = to_bayesian(model, seed=1)
  assert not copy.built and isinstance(copy, tf.keras.Sequential)
  assert [type(l) for l in copy.layers] == [BayesianDense, L.Flatten, BayesianDense]
  assert copy(np.ones((3, 5), np.float32)).shape == (3, 2)


def test_weightless_call_arguments_are_replayed():
  inputs = tf.keras.Input([4])
  x = L.Dense(6)(inputs)
  x = L.Dropout(0.5)(x, training=True)  # Monte Carlo dropout, even in predict
  model = tf.keras.Model(inputs, L.Dense(2)(x))
  copy = to_bayesian(model, seed=0)
  x = np.ones((64, 4), np.float32)
  tf.keras.utils.set_random_seed(0)
  a, b = copy.predict(x, verbose=0), copy.predict(x, verbose=0)
  assert not np.allclose(a, b)  # the dropout is active outside training


def test_a_bayesian_model_gives_a_new_model_of_the_same_structure():
  model = tf.keras.Sequential([
      tf.keras.Input([5], dtype=tf.int32),
      GaussianEmbedding(9, 4, seed=0, min_scale=1e-5),
      BayesianLSTM(6, seed=1, forget_bias=0.5),
      LateralConnection(3, adapter_units=2, seed=2, gate_init=0.25),
      L.Softmax(),
  ])
  copy = to_bayesian(model, seed=7, prior_scale=0.5, kl_weight=0.01)
  assert copy is not model
  assert [type(l) for l in copy.layers] == [type(l) for l in model.layers]
  for a, b in zip(model.layers, copy.layers):
    assert a is not b
    ca, cb = a.get_config(), b.get_config()
    for key in ("seed", "prior_scale", "kl_weight"):
      ca.pop(key, None)
      cb.pop(key, None)
    assert ca == cb
  assert copy.layers[1].prior_scale == 0.5 and copy.layers[1].kl_weight == 0.01
  # A divergence_fn is kept; with a kl_weight too it is a conflict, named.
  with_fn = tf.keras.Sequential([tf.keras.Input([3]), BayesianDense(2, divergence_fn=_fn,
                                                                    name="fn_layer")])
  assert to_bayesian(with_fn).layers[0].divergence_fn is _fn
  with pytest.raises(ValueError, match="fn_layer.*divergence_fn"):
    to_bayesian(with_fn, kl_weight=0.1)


# -- 3. refusals ---------------------------------------------------------------------


class _Halve(L.Layer):
  """A custom layer without weights: is it deterministic? `to_bayesian` cannot know."""

  def call(self, x):
    return 0.5 * x


class _Scale(L.Layer):
  """A custom layer with a weight."""

  def build(self, input_shape):
    self.w = self.add_weight(name="w", shape=[int(input_shape[-1])])

  def call(self, x):
    return x * self.w


def _seq(*layers, shape=(4,)):
  # New layers from the listed ones' configs when the test runs: a layer made at
  # collection is invalid once TFF has traced Keras layers in a graph in this process
  # (the SPEC's pitfall), which an earlier module of the same xdist worker may have done.
  return lambda: tf.keras.Sequential(
      [tf.keras.Input(shape), *[type(l).from_config(l.get_config()) for l in layers]])


def _branching():
  inputs = tf.keras.Input([4])
  a = L.Dense(3, name="left")(inputs)
  b = L.Dense(3, name="right")(inputs)
  return tf.keras.Model(inputs, L.Add(name="plus")([a, b]))


def _concat_two_inputs():
  a, b = tf.keras.Input([4], name="in_a"), tf.keras.Input([2], name="in_b")
  return tf.keras.Model([a, b], L.Dense(2)(L.Concatenate(name="cat")([a, b])))


def _two_outputs():
  inputs = tf.keras.Input([4])
  h = L.Dense(3, name="trunk")(inputs)
  return tf.keras.Model(inputs, [L.Dense(2, name="head_a")(h), L.Dense(2, name="head_b")(h)])


def _shared():
  inputs = tf.keras.Input([3])
  dense = L.Dense(3, name="twice")
  return tf.keras.Model(inputs, dense(dense(inputs)))


def _tf_op():
  inputs = tf.keras.Input([3])
  return tf.keras.Model(inputs, L.Dense(2)(tf.nn.relu(inputs)))


@pytest.mark.parametrize("make, name, match", [
    (_seq(L.Dense(4), L.BatchNormalization(name="bn")), "bn", "has weights and no Bayesian"),
    (_seq(L.LayerNormalization(name="ln")), "ln", "has weights and no Bayesian"),
    (_seq(L.Conv1D(2, 2, name="c1"), shape=(6, 3)), "c1", "has weights and no Bayesian"),
    (_seq(L.Conv2DTranspose(2, 2, name="up"), shape=(4, 4, 1)), "up", "no Bayesian"),
    (_seq(L.DepthwiseConv2D(2, name="dw"), shape=(4, 4, 1)), "dw", "no Bayesian"),
    (_seq(L.GRU(2, name="gru"), shape=(5, 3)), "gru", "no Bayesian"),
    (_seq(_Scale(name="scale")), "scale", "has weights and no Bayesian"),
    (_seq(_Halve(name="halve")), "halve", "custom layer's call cannot be checked"),
    (_seq(L.Lambda(lambda z: z * 2, name="lam")), "lam", "arbitrary code"),
    (_tf_op, "tf.nn.relu", "arbitrary code"),
    (_seq(L.Masking(name="mask"), shape=(5, 3)), "mask", "mask"),
    (_seq(L.Dense(2, use_bias=False, name="nob")), "nob", "use_bias=False"),
    (_seq(L.Dense(2, activity_regularizer="l2", name="act")), "act", "activity_regularizer"),
    (_seq(L.Conv2D(2, 3, dilation_rate=2, name="dil"), shape=(8, 8, 1)), "dil",
     "dilation_rate"),
    (_seq(L.Conv2D(4, 3, groups=2, name="grp"), shape=(8, 8, 2)), "grp", "groups=2"),
    (_seq(L.LSTM(2, go_backwards=True, name="back"), shape=(5, 3)), "back", "go_backwards"),
    (_seq(L.LSTM(2, dropout=0.1, name="drop"), shape=(5, 3)), "drop", "dropout"),
    (_seq(L.LSTM(2, activation="relu", name="rel"), shape=(5, 3)), "rel", "activation='relu'"),
    (_seq(L.LSTM(2, recurrent_activation="hard_sigmoid", name="hs"), shape=(5, 3)), "hs",
     "recurrent_activation"),
    (_seq(L.Embedding(5, 2, mask_zero=True, name="emb"), shape=(3,)), "emb", "mask_zero"),
    (_seq(tf.keras.Sequential([L.Dense(2)], name="inner")), "inner", "nested model"),
    (_branching, "plus", "branching graphs are not supported"),
    (_concat_two_inputs, "in_a", "branching graphs are not supported"),
    (_two_outputs, "head_a", "branching graphs are not supported"),
    (_shared, "twice", "used 2 times.*branching graphs are not supported"),
],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_refusals_name_the_layer(make, name, match):
  model = make()
  with pytest.raises(UnsupportedLayerError, match=match) as info:
    to_bayesian(model)
  assert repr(name) in str(info.value)
  assert isinstance(info.value, ValueError)


def test_refusals_list_what_is_supported():
  with pytest.raises(UnsupportedLayerError) as info:
    to_bayesian(_seq(L.BatchNormalization(name="bn"))())
  message = str(info.value)
  assert "(BatchNormalization)" in message
  for keras_cls, cls in SUPPORTED_WEIGHT_LAYERS.items():
    assert f"{keras_cls.__name__} -> {cls.__name__}" in message
  for cls in WEIGHTLESS_LAYERS:
    assert cls.__name__ in message


@pytest.mark.parametrize("layer, match", [
    (L.Conv2D(2, 3, data_format="channels_first", name="cf"), "channels_first"),
    (L.LSTM(2, stateful=True, name="sf"), "stateful"),
    (L.LSTM(2, recurrent_dropout=0.2, name="rd"), "recurrent_dropout"),
    (L.LSTM(2, return_state=True, name="st"), "return_state"),
    (L.LSTM(2, time_major=True, name="tm"), "time_major"),
    (L.Embedding(4, 2, sparse=True, name="sp"), "sparse"),
    (L.Dense(2, dtype="mixed_float16", name="mp"), "mixed-precision"),
])
def test_unsupported_settings_of_single_layers(layer, match):
  with pytest.raises(UnsupportedLayerError, match=match) as info:
    bayesian_layer_args(layer)
  assert repr(layer.name) in str(info.value)


class _Subclassed(tf.keras.Model):

  def __init__(self):
    super().__init__(name="my_subclassed")
    self.dense = L.Dense(2)

  def call(self, x):
    return self.dense(x)


def test_what_is_not_a_sequential_or_functional_model_is_refused():
  model = _Subclassed()
  model(np.ones((1, 3), np.float32))
  with pytest.raises(TypeError, match="'my_subclassed'.*subclassed"):
    to_bayesian(model)
  with pytest.raises(TypeError, match="bayesian_layer_args"):
    to_bayesian(L.Dense(3))
  with pytest.raises(TypeError, match="tf.keras.Model"):
    to_bayesian("model")
  with pytest.raises(TypeError, match="Layer"):
    bayesian_layer_args(np.zeros(3))
  for kwargs, match in [(dict(kl_weight=-1.0), "kl_weight"), (dict(prior_scale=0.0), "prior"),
                        (dict(init_scale=float("nan")), "init_scale"), (dict(seed=1.5), "seed")]:
    with pytest.raises(ValueError, match=match):
      to_bayesian(_mlp(), **kwargs)


# -- 4. training, saving, seeds ------------------------------------------------------


def test_docs_snippet_trains_on_digits(capsys):
  namespace = {}
  tf.keras.utils.set_random_seed(0)  # fit's shuffling and weight noise
  exec(compile(README_SNIPPET_TO_BAYESIAN, "README_SNIPPET_TO_BAYESIAN", "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["accuracy"] > 0.8, namespace["accuracy"]  # chance is 0.1
  out = capsys.readouterr().out
  assert "BayesianConv2D" in out and "test accuracy" in out
  bnn, n = namespace["bnn"], len(namespace["x_train"])
  # The loss holds the KL / N of every layer ...
  assert len(bnn.losses) == 2
  kl = sum(float(l.kl_divergence()) for l in bnn.layers if hasattr(l, "kl_divergence"))
  np.testing.assert_allclose(float(tf.add_n(bnn.losses)), kl / n, rtol=1e-5)
  # ... and `evaluate` adds it to the cross-entropy of the posterior-mean network.
  x_test, y_test = namespace["x_test"], namespace["y_test"]
  cross_entropy = float(_scce()(y_test, bnn.predict(x_test, verbose=0)))
  np.testing.assert_allclose(namespace["loss"], cross_entropy + kl / n, rtol=1e-4)
  # The posterior moved away from its initial scale (it was trained, not just its means).
  scales = bnn.layers[-1].posterior_loc_scale()[1][0].numpy()
  assert np.max(np.abs(scales - 1e-3)) > 1e-3


@pytest.mark.parametrize("kind, fmt", [("conv", "keras"), ("conv", "h5"), ("sequence", "keras")])
def test_copy_saves_and_reloads(tmp_path, kind, fmt):
  make, inputs = _MODELS[kind]
  model = make()
  _randomize(model, 4)
  copy = to_bayesian(model, seed=3, kl_weight=0.01)
  _set_means(model, copy)  # off the initial values
  x = inputs(np.random.default_rng(2))
  path = str(tmp_path / f"copy.{fmt}")
  copy.save(path)
  loaded = tf.keras.models.load_model(path)  # no custom_objects
  assert [type(l) for l in loaded.layers] == [type(l) for l in copy.layers]
  assert [l.get_config() for l in loaded.layers] == [l.get_config() for l in copy.layers]
  np.testing.assert_array_equal(loaded(x).numpy(), copy(x).numpy())
  np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(float(tf.add_n(loaded.losses)), float(tf.add_n(copy.losses)),
                             rtol=1e-6)


def _weights(model):
  return [w.numpy() for w in model.weights]


def test_the_copy_is_a_function_of_seed():
  model = _conv()
  a, b, c = (to_bayesian(model, seed=s) for s in (5, 5, 6))
  for x, y in zip(_weights(a), _weights(b)):
    np.testing.assert_array_equal(x, y)
  assert any(not np.array_equal(x, y) for x, y in zip(_weights(a), _weights(c)))
  seeds = [l.seed for l in a.layers if isinstance(l, (BayesianDense, BayesianConv2D))]
  assert seeds == [derive_seed(5, k) for k in range(3)] and len(set(seeds)) == 3
  unseeded = to_bayesian(model)
  assert [l.seed for l in unseeded.layers if hasattr(l, "kl_divergence")] == [None] * 3
  # The caller's settings reach every Bayesian layer.
  copy = to_bayesian(model, seed=0, prior_scale=0.5, init_scale=0.02, kl_weight=0.25, name="b")
  assert copy.name == "b"
  for layer in copy.layers:
    if hasattr(layer, "kl_divergence"):
      assert (layer.prior_scale, layer.init_scale, layer.kl_weight) == (0.5, 0.02, 0.25)
      np.testing.assert_allclose(layer.posterior_loc_scale()[1][0].numpy(), 0.02, rtol=1e-5)
      np.testing.assert_allclose(float(layer.losses[0]), 0.25 * float(layer.kl_divergence()),
                                 rtol=1e-6)
  assert convert._DEFAULT_INIT_SCALE == BayesianDense(1).init_scale


# -- 5. documentation ----------------------------------------------------------------


def _python_blocks(text):
  return [textwrap.dedent(b).strip("\n")
          for _, b in re.findall(r"^( *)```python\n(.*?)^\1```", text, flags=re.S | re.M)]


def test_docstring_example_runs(capsys):
  blocks = _python_blocks(to_bayesian.__doc__)
  assert len(blocks) == 1
  namespace = {}
  exec(compile(blocks[0], "to_bayesian.__doc__", "exec"), namespace)  # pylint: disable=exec-used
  assert "['BayesianConv2D', 'MaxPooling2D', 'Flatten', 'BayesianDense']" in (
      capsys.readouterr().out)
  assert namespace["logits"].shape == (32, 10)


def _library_section():
  with open(os.path.join(_ROOT, "docs", "library.md"), encoding="utf-8") as f:
    text = f.read()
  heading = "## Converting a Keras model: `to_bayesian`"
  assert heading in text
  section = text.split(heading, 1)[1]
  return section.split("\n## ", 1)[0]


def test_docs_section_shows_the_snippet_and_the_tables():
  section = _library_section()
  assert README_SNIPPET_TO_BAYESIAN.strip("\n") in _python_blocks(section)
  for keras_cls, cls in SUPPORTED_WEIGHT_LAYERS.items():
    assert re.search(rf"`{keras_cls.__name__}`[^\n]*`{cls.__name__}", section), keras_cls
  for cls in WEIGHTLESS_LAYERS:
    assert f"`{cls.__name__}`" in section, cls
  # tests/test_readme.py takes a block at least half the same lines as one of its
  # snippets for a changed copy of it: this one must not look like the layers' one.
  from test_layers_keras import README_SNIPPET  # pylint: disable=g-import-not-at-top
  ratio = difflib.SequenceMatcher(None, README_SNIPPET_TO_BAYESIAN.splitlines(),
                                  README_SNIPPET.splitlines()).ratio()
  assert ratio < 0.5, ratio

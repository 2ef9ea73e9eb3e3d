"""Bayesian copies of Keras models: `to_bayesian` and its per-layer primitives.

`to_bayesian(model)` turns a Keras `Sequential` model, or a functional model that
is a plain chain of layers, into the same architecture built from tfbfl's Bayesian
layers: every `Dense`, `Conv2D`, `LSTM` and `Embedding` becomes its mean-field
Gaussian counterpart (`SUPPORTED_WEIGHT_LAYERS`) with the layer's configuration,
every weightless layer (`WEIGHTLESS_LAYERS`: reshaping, pooling, dropout,
activations, ...) is recreated from its config, and anything else is refused with
an `UnsupportedLayerError` that names the layer. The per-layer primitives
`bayesian_layer_args` and `is_weightless` are public so that other constructions
(VIRTUAL's progressive networks) make exactly the same decisions layer by layer.

The copy is a new, untrained model: weights are never copied (a point estimate is
not a posterior; set one with the layers' `set_posterior` if wanted).
"""

import inspect
import types
from collections import Counter

import tensorflow as tf

from tfbfl.layers.base import (
    MeanFieldGaussianLayer,
    check_divergence_args,
    check_finite_float,
    check_seed,
    derive_seed,
)
from tfbfl.layers.conv import BayesianConv2D
from tfbfl.layers.dense import BayesianDense
from tfbfl.layers.lateral import LateralConnection
from tfbfl.layers.recurrent import BayesianLSTM, GaussianEmbedding

__all__ = [
    "SUPPORTED_WEIGHT_LAYERS",
    "UnsupportedLayerError",
    "WEIGHTLESS_LAYERS",
    "bayesian_layer_args",
    "is_weightless",
    "to_bayesian",
]

_L = tf.keras.layers

# Keras layer class -> the tfbfl Bayesian layer that replaces it. Exact classes:
# a subclass (e.g. `Conv2DTranspose`, a subclass of `Conv2D`) computes something
# else and is refused.
SUPPORTED_WEIGHT_LAYERS = types.MappingProxyType({
    _L.Dense: BayesianDense,
    _L.Conv2D: BayesianConv2D,
    _L.LSTM: BayesianLSTM,
    _L.Embedding: GaussianEmbedding,
})

# Keras layers without weights whose output is a fixed function of their config and
# input (random ones only in training mode, as in the original): carried over
# unchanged, recreated by `from_config(get_config())`. Exact classes, as above.
WEIGHTLESS_LAYERS = (
    _L.InputLayer,
    # reshaping
    _L.Reshape,
    _L.Flatten,
    _L.Permute,
    _L.RepeatVector,
    _L.Identity,
    _L.ZeroPadding1D,
    _L.ZeroPadding2D,
    _L.ZeroPadding3D,
    _L.Cropping1D,
    _L.Cropping2D,
    _L.Cropping3D,
    _L.UpSampling1D,
    _L.UpSampling2D,
    _L.UpSampling3D,
    # pooling
    _L.MaxPooling1D,
    _L.MaxPooling2D,
    _L.MaxPooling3D,
    _L.AveragePooling1D,
    _L.AveragePooling2D,
    _L.AveragePooling3D,
    _L.GlobalMaxPooling1D,
    _L.GlobalMaxPooling2D,
    _L.GlobalMaxPooling3D,
    _L.GlobalAveragePooling1D,
    _L.GlobalAveragePooling2D,
    _L.GlobalAveragePooling3D,
    # regularization (active in training mode only; ActivityRegularization adds its loss)
    _L.Dropout,
    _L.SpatialDropout1D,
    _L.SpatialDropout2D,
    _L.SpatialDropout3D,
    _L.GaussianNoise,
    _L.GaussianDropout,
    _L.AlphaDropout,
    _L.ActivityRegularization,
    # activations
    _L.Activation,
    _L.ReLU,
    _L.Softmax,
    _L.LeakyReLU,
    _L.ELU,
    _L.ThresholdedReLU,
    # deterministic preprocessing
    _L.Rescaling,
    _L.Resizing,
    _L.CenterCrop,
)

_WEIGHTLESS = frozenset(WEIGHTLESS_LAYERS)
_BAYESIAN = (MeanFieldGaussianLayer, LateralConnection)  # taken as they are
_MERGE = (_L.Add, _L.Subtract, _L.Multiply, _L.Average, _L.Maximum, _L.Minimum, _L.Concatenate,
          _L.Dot)
# Set by whoever builds the Bayesian layer (`to_bayesian`, VIRTUAL), never carried.
_CALLER_KEYS = ("name", "seed", "prior_scale", "init_scale", "kl_weight")
_DEFAULT_INIT_SCALE = inspect.signature(BayesianDense.__init__).parameters["init_scale"].default
_DEFAULT_PRIOR_SCALE = inspect.signature(BayesianDense.__init__).parameters["prior_scale"].default


class UnsupportedLayerError(ValueError):
  """A layer (or a model's graph) `to_bayesian` cannot convert faithfully.

  The message names the layer (its name and class), says why, and lists what is
  supported.
  """


def _names(classes):
  return ", ".join(c.__name__ for c in classes)


def _supported_summary():
  pairs = ", ".join(f"{k.__name__} -> {v.__name__}" for k, v in SUPPORTED_WEIGHT_LAYERS.items())
  return (f"Supported: the weight layers {pairs} (exactly these classes); tfbfl's Bayesian "
          f"layers, taken as they are; and the weightless layers "
          f"{_names(WEIGHTLESS_LAYERS)}, carried over unchanged.")


def _describe(layer):
  return f"Layer {layer.name!r} ({type(layer).__name__})"


def _refuse(layer, reason, summary=True):
  message = f"{_describe(layer)} {reason}."
  if summary:
    message += " " + _supported_summary()
  return UnsupportedLayerError(message)


def _check_layer(layer):
  if not isinstance(layer, tf.keras.layers.Layer):
    raise TypeError(f"Expected a `tf.keras.layers.Layer`, got {type(layer).__name__}: {layer!r}.")


def is_weightless(layer):
  """True for a layer `to_bayesian` carries over unchanged.

  That is a layer of a known stateless Keras class (`WEIGHTLESS_LAYERS`, exactly
  that class, not a subclass) that holds no weights. A custom layer without
  weights is *not* weightless in this sense: its `call` may depend on anything, so
  `to_bayesian` refuses it rather than guess (see `UnsupportedLayerError`).

  Args:
    layer: a `tf.keras.layers.Layer`, built or not.

  Returns:
    A Python bool.

  Raises:
    TypeError: `layer` is not a Keras layer.
  """
  _check_layer(layer)
  return type(layer) in _WEIGHTLESS and not layer.weights


def _activation(fn):
  """A Keras activation as a name (`None` for linear), or the callable itself if it
  has no built-in name."""
  name = tf.keras.activations.serialize(fn)
  if not isinstance(name, str):
    return fn
  return None if name == "linear" else name


def _common_checks(layer, kwargs):
  """Refusals shared by all Keras weight layers; adds a non-default `dtype`."""
  if getattr(layer, "activity_regularizer", None) is not None:
    raise _refuse(layer, "has an activity_regularizer, which the Bayesian layers cannot carry "
                  "(it is a loss term on the activations; add it to the copy's loss instead)")
  policy = layer.dtype_policy
  if policy.compute_dtype != policy.variable_dtype:
    raise _refuse(layer, f"has the mixed-precision dtype policy {policy.name!r}, which the "
                  "Bayesian layers do not support (compute and variable dtypes must agree)")
  if policy.name != "float32":
    kwargs["dtype"] = policy.name
  return kwargs


def _dense_args(layer):
  if not layer.use_bias:
    raise _refuse(layer, "has use_bias=False: BayesianDense always has a bias")
  return dict(units=int(layer.units), activation=_activation(layer.activation))


def _conv2d_args(layer):
  if layer.data_format != "channels_last":
    raise _refuse(layer, f"has data_format={layer.data_format!r}: BayesianConv2D is "
                  "channels_last only")
  if tuple(layer.dilation_rate) != (1, 1):
    raise _refuse(layer, f"has dilation_rate={tuple(layer.dilation_rate)}: BayesianConv2D "
                  "supports only dilation_rate=1")
  if layer.groups != 1:
    raise _refuse(layer, f"has groups={layer.groups}: BayesianConv2D supports only groups=1")
  if not layer.use_bias:
    raise _refuse(layer, "has use_bias=False: BayesianConv2D always has a bias")
  if layer.padding not in ("valid", "same"):
    raise _refuse(layer, f"has padding={layer.padding!r}: BayesianConv2D supports 'valid' and "
                  "'same'")
  return dict(filters=int(layer.filters),
              kernel_size=tuple(int(k) for k in layer.kernel_size),
              strides=tuple(int(s) for s in layer.strides),
              padding=layer.padding,
              activation=_activation(layer.activation))


def _lstm_args(layer):
  config = layer.get_config()
  fixed = dict(activation="tanh", recurrent_activation="sigmoid", use_bias=True, dropout=0.0,
               recurrent_dropout=0.0, return_state=False, go_backwards=False, stateful=False,
               time_major=False)
  for key, value in fixed.items():
    if config.get(key, value) != value:
      raise _refuse(layer, f"has {key}={config[key]!r}: BayesianLSTM computes the LSTM with "
                    f"{key}={value!r} only")
  # Keras' `unit_forget_bias=True` starts the forget gates' biases at 1; BayesianLSTM
  # adds a constant `forget_bias` instead and keeps its learned bias centred at 0.
  return dict(units=int(layer.units),
              return_sequences=bool(layer.return_sequences),
              forget_bias=1.0 if config["unit_forget_bias"] else 0.0)


def _embedding_args(layer):
  if layer.mask_zero:
    raise _refuse(layer, "has mask_zero=True: GaussianEmbedding produces no mask and the "
                  "Bayesian layers do not consume one")
  if getattr(layer, "sparse", False):
    raise _refuse(layer, "has sparse=True: GaussianEmbedding returns dense embeddings")
  return dict(input_dim=int(layer.input_dim), output_dim=int(layer.output_dim))


_ARGS = {
    _L.Dense: _dense_args,
    _L.Conv2D: _conv2d_args,
    _L.LSTM: _lstm_args,
    _L.Embedding: _embedding_args,
}
assert set(_ARGS) == set(SUPPORTED_WEIGHT_LAYERS)


def _bayesian_passthrough(layer):
  """A tfbfl Bayesian layer's own class and config, without the caller's keys."""
  config = layer.get_config()
  for key in _CALLER_KEYS + ("trainable",):
    config.pop(key, None)
  inner = layer.adapter_in if isinstance(layer, LateralConnection) else layer
  divergence_fn = getattr(inner, "divergence_fn", None)
  config.pop("divergence_fn", None)
  if divergence_fn is not None:  # the live callable, not its serialised form
    config["divergence_fn"] = divergence_fn
  return type(layer), config


def _refusal_reason(layer):
  """Why `layer` is neither weightless nor convertible (for the error message)."""
  if isinstance(layer, tf.keras.Model):
    return ("is a nested model: put its layers into the outer chain, or convert it on its "
            "own with to_bayesian")
  if isinstance(layer, _MERGE):
    return "merges several inputs: branching graphs are not supported"
  if type(layer) is _L.Masking:
    return "produces a mask, which the Bayesian layers ignore"
  if type(layer) is _L.Lambda or type(layer).__name__ in ("TFOpLambda", "SlicingOpLambda"):
    return ("runs arbitrary code (a Lambda layer, or a TensorFlow op applied to a Keras "
            "tensor), which cannot be checked: use a Keras layer (Activation, Rescaling, "
            "Reshape, ...) instead")
  if type(layer) in _WEIGHTLESS:  # a known class that holds weights anyway
    return "holds weights although its class is weightless, so it cannot be carried over"
  if layer.weights:
    return "has weights and no Bayesian counterpart"
  return ("has no Bayesian counterpart and is not a layer known to be weightless and "
          "deterministic (a custom layer's call cannot be checked, even without weights)")


def bayesian_layer_args(layer):
  """The tfbfl Bayesian class and constructor kwargs that replace a Keras layer.

  For a built or unbuilt Keras layer with weights of a supported class (exactly
  `Dense`, `Conv2D`, `LSTM` or `Embedding`, see `SUPPORTED_WEIGHT_LAYERS`),
  returns `(layer_cls, kwargs)` such that `layer_cls(**kwargs, name=..., seed=...,
  prior_scale=..., init_scale=..., kl_weight=...)` computes, at its posterior mean,
  the same function of the input as the Keras layer with the same weights:

  | Keras              | Bayesian            | kwargs carried                           |
  | ------------------ | ------------------- | ---------------------------------------- |
  | `Dense`            | `BayesianDense`     | `units`, `activation`                    |
  | `Conv2D`           | `BayesianConv2D`    | `filters`, `kernel_size`, `strides`,     |
  |                    |                     | `padding`, `activation`                  |
  | `LSTM`             | `BayesianLSTM`      | `units`, `return_sequences`,             |
  |                    |                     | `forget_bias` (1 if `unit_forget_bias`)  |
  | `Embedding`        | `GaussianEmbedding` | `input_dim`, `output_dim`                |

  plus `dtype` when the layer's dtype policy is not `float32`. `activation` is a
  name (`None` for linear) or, for an activation without a built-in name, the
  callable. The LSTM's bias convention: BayesianLSTM adds the constant
  `forget_bias` to the forget gate, so a Keras LSTM with bias `b` equals the
  Bayesian one with `bias_loc = b - [0, forget_bias, 0, 0]` (blockwise).

  Not carried, by design: initializers (the posterior means start Glorot-normal,
  the scales at `init_scale`), weight regularizers and constraints (the Gaussian
  prior takes the regularizer's place; a constraint has no meaning for a
  distribution), `trainable` (the copy is a new model to train), and settings that
  do not change the function (`LSTM.unroll`, `implementation`,
  `Embedding.input_length`).

  A tfbfl Bayesian layer (a `MeanFieldGaussianLayer` or a `LateralConnection`) is
  taken as it is: its own class and its `get_config()` (with its live
  `divergence_fn` if it has one).

  In both cases `kwargs` never holds `name`, `seed`, `prior_scale`, `init_scale`,
  `kl_weight` or `trainable`: the caller adds those.

  Args:
    layer: a `tf.keras.layers.Layer`.

  Returns:
    `(layer_cls, kwargs)`: a Bayesian layer class and a dict of constructor
    arguments.

  Raises:
    UnsupportedLayerError: the layer has no Bayesian counterpart (including
      weightless layers, which are carried over, not converted), or a setting that
      changes its function cannot be carried (`use_bias=False`; `Conv2D`
      `dilation_rate != 1`, `groups != 1`, `data_format="channels_first"`; an `LSTM`
      with a non-default `activation`/`recurrent_activation`, `dropout`,
      `recurrent_dropout`, `return_state`, `go_backwards`, `stateful`,
      `time_major`; `Embedding(mask_zero=True)`; an `activity_regularizer`; a
      mixed-precision policy). The message names the layer and the setting.
    TypeError: `layer` is not a Keras layer.
  """
  _check_layer(layer)
  if isinstance(layer, _BAYESIAN):
    return _bayesian_passthrough(layer)
  make_args = _ARGS.get(type(layer))
  if make_args is None:
    if is_weightless(layer):
      raise _refuse(layer, "has no weights: it is carried over unchanged, not converted "
                    "(see is_weightless)")
    raise _refuse(layer, _refusal_reason(layer))
  return SUPPORTED_WEIGHT_LAYERS[type(layer)], _common_checks(layer, make_args(layer))


# -- whole models ------------------------------------------------------------------


def _input_of(model):
  """The model's `InputLayer` (None for a Sequential model without an input yet)."""
  inputs = model.inputs or []
  if not inputs:
    return None
  if len(inputs) != 1:
    raise UnsupportedLayerError(
        f"Model {model.name!r} ({type(model).__name__}) has {len(inputs)} inputs "
        f"({', '.join(repr(t._keras_history.layer.name) for t in inputs)}): to_bayesian "
        "converts a chain with one input and one output; branching graphs are not supported.")
  layer = inputs[0]._keras_history.layer
  config = layer.get_config()
  if config.get("sparse") or config.get("ragged"):
    raise _refuse(layer, "is a sparse or ragged input, which the Bayesian layers do not accept")
  return layer


def _functional_chain(model, input_layer):
  """`[(layer, call_kwargs)]` from input to output of a functional chain, or
  UnsupportedLayerError naming the layer where the graph branches."""
  outputs = model.outputs
  if len(outputs) != 1:
    raise UnsupportedLayerError(
        f"Model {model.name!r} ({type(model).__name__}) has {len(outputs)} outputs "
        f"({', '.join(repr(t._keras_history.layer.name) for t in outputs)}): to_bayesian "
        "converts a chain with one input and one output; branching graphs are not supported.")
  branching = ("branching graphs are not supported (to_bayesian converts a chain: one input, "
               "one output, each layer called once on the previous layer's output)")
  chain = []
  tensor = outputs[0]
  while True:
    layer, node_index, tensor_index = tensor._keras_history
    if layer is input_layer:
      break
    if isinstance(layer, _L.InputLayer):  # cannot happen in a valid model with one input
      raise _refuse(layer, f"is a second input: {branching}", summary=False)
    node = layer._inbound_nodes[node_index]
    if tensor_index != 0 or len(tf.nest.flatten(node.outputs)) != 1:
      raise _refuse(layer, f"has several outputs: {branching}", summary=False)
    sources = node.keras_inputs
    if len(sources) != 1 or len(node.call_args) != 1 or node.call_args[0] is not sources[0]:
      raise _refuse(layer, f"takes {len(sources)} inputs: {branching}", summary=False)
    chain.append((layer, dict(node.call_kwargs)))
    tensor = sources[0]
  chain.reverse()
  counts = Counter(id(layer) for layer, _ in chain)
  for layer, _ in chain:
    if counts[id(layer)] > 1:
      raise _refuse(layer, f"is used {counts[id(layer)]} times (a shared layer): {branching}",
                    summary=False)
  on_chain = {id(layer) for layer, _ in chain} | {id(input_layer)}
  for layer in model.layers:
    if id(layer) not in on_chain:
      raise _refuse(layer, f"is off the chain from the input to the output: {branching}",
                    summary=False)
  return chain


def _copy_layer(layer, call_kwargs, make_bayesian):
  if is_weightless(layer):
    return type(layer).from_config(layer.get_config()), call_kwargs
  new = make_bayesian(layer)  # UnsupportedLayerError for anything else
  if call_kwargs:
    raise _refuse(layer, f"is called with the arguments {sorted(call_kwargs)}, which a "
                  "Bayesian layer does not take", summary=False)
  return new, {}


def to_bayesian(model,
                *,
                kl_weight=None,
                prior_scale=_DEFAULT_PRIOR_SCALE,
                init_scale=_DEFAULT_INIT_SCALE,
                seed=None,
                name=None):
  """The Bayesian copy of a Keras `Sequential` model or functional chain.

  Builds a new model of the same architecture in which every layer with weights is
  a tfbfl mean-field Gaussian layer: a one-for-one replacement of the point
  estimates by posteriors `q(w) = N(mu, sigma^2)` under priors `N(0,
  prior_scale^2)`, trained by the evidence lower bound as in Bayes by Backprop
  [(Blundell et al., 2015)][1], with local reparameterization where the layer
  allows it [(Kingma et al., 2015)][2]. Layer by layer:

  | Keras layer                      | in the copy                                    |
  | -------------------------------- | ---------------------------------------------- |
  | `Dense`                          | `BayesianDense(units, activation)`             |
  | `Conv2D`                         | `BayesianConv2D(filters, kernel_size, strides, |
  |                                  | padding, activation)`                          |
  | `LSTM`                           | `BayesianLSTM(units, return_sequences,         |
  |                                  | forget_bias=1 if unit_forget_bias else 0)`     |
  | `Embedding`                      | `GaussianEmbedding(input_dim, output_dim)`     |
  | a tfbfl Bayesian layer           | the same class and configuration               |
  | `WEIGHTLESS_LAYERS` (`Flatten`,  | recreated by `from_config(get_config())`,      |
  | pooling, `Dropout`, activations, | called with the same arguments                 |
  | `Reshape`, padding, ...)         |                                                |

  (`bayesian_layer_args` gives the details and the settings that are refused.)
  Each Bayesian layer keeps the original layer's name and gets `prior_scale`,
  `init_scale`, `kl_weight` and its own seed `derive_seed(seed, k)`, `k = 0, 1,
  ...` the index among the layers with weights, so the copy's initial weights are a
  function of `seed`. The input (shape, batch size, dtype, name) is kept. The copy
  is a new, untrained model: weights are never copied, and a model that already
  consists of tfbfl Bayesian layers gives a new model of the same structure (each
  Bayesian layer rebuilt from its configuration with this call's `prior_scale`,
  `init_scale`, `kl_weight` and seed), not the model itself. A `Sequential` model
  gives a `Sequential` model (one without an input yet gives one that builds on its
  first call), a functional model a functional model.

  The copy trains with a plain Keras `fit`: it samples its weights in training
  mode and its `model.losses` hold `kl_weight * KL(q || p)` per layer. With a
  batch-mean loss on `N` training examples, pass `kl_weight = 1 / N` for the
  per-example ELBO (the default `None` adds the full KL, which swamps the data
  term). `predict` and `evaluate` use the posterior means.

  #### Examples

  ```python
  import numpy as np
  import tensorflow as tf
  from tfbfl.layers import to_bayesian

  keras_model = tf.keras.Sequential([
      tf.keras.Input([8, 8, 1]),
      tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(10),
  ])
  x = np.random.default_rng(0).uniform(size=(32, 8, 8, 1)).astype(np.float32)
  y = np.arange(32) % 10
  bnn = to_bayesian(keras_model, kl_weight=1 / len(x), seed=0)
  print([type(layer).__name__ for layer in bnn.layers])
  # ['BayesianConv2D', 'MaxPooling2D', 'Flatten', 'BayesianDense']
  bnn.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  bnn.fit(x, y, epochs=1, verbose=0)    # sampled weights; loss + KL / N
  logits = bnn.predict(x, verbose=0)    # posterior-mean network
  ```

  Args:
    model: a `tf.keras.Sequential` model, or a functional `tf.keras.Model` whose
      layers form one chain (one input, one output, each layer called once on the
      previous layer's output).
    kl_weight: `None` or a float `>= 0`, every Bayesian layer's KL multiplier
      (typically `1 / num_train_examples`); `None` is weight 1.
    prior_scale: positive float, the standard deviation of every weight's
      zero-mean Gaussian prior.
    init_scale: positive float, every weight's initial posterior standard
      deviation (default: the layers' own default, `1e-3`).
    seed: Python int or `None`; seeds the Bayesian layers' initial posterior
      means (`None`: unseeded draws).
    name: the copy's name; default `model.name + "_bayesian"`.

  Returns:
    A new `tf.keras.Model` (`Sequential` for a `Sequential` input), uncompiled.

  Raises:
    TypeError: `model` is not a Keras model, or is a subclassed model (its `call`
      cannot be read): build it as a `Sequential` or functional model, or convert
      its layers with `bayesian_layer_args`.
    UnsupportedLayerError: a layer has weights and no Bayesian counterpart
      (`BatchNormalization`, `LayerNormalization`, `Conv1D`, `DepthwiseConv2D`,
      `GRU`, a custom layer, ...), is a custom or `Lambda` layer without weights,
      a `Masking` layer, a nested model, or has a setting the Bayesian layer cannot
      honour (see `bayesian_layer_args`); or the functional graph branches
      (several inputs or outputs, a merge layer such as `Add` or `Concatenate`, a
      layer used twice). The message names the layer.
    ValueError: an invalid `kl_weight`, `prior_scale`, `init_scale` or `seed`, or
      `kl_weight` given for a Bayesian layer that has a `divergence_fn`.

  #### References

  [1]: Charles Blundell, Julien Cornebise, Koray Kavukcuoglu, Daan Wierstra.
       Weight Uncertainty in Neural Networks. In _International Conference on
       Machine Learning_, 2015. https://arxiv.org/abs/1505.05424
  [2]: Diederik P. Kingma, Tim Salimans, Max Welling. Variational Dropout and the
       Local Reparameterization Trick. In _Neural Information Processing
       Systems_, 2015. https://arxiv.org/abs/1506.02557
  """
  if not isinstance(model, tf.keras.Model):
    hint = (" (for a single layer use bayesian_layer_args)"
            if isinstance(model, tf.keras.layers.Layer) else "")
    raise TypeError("to_bayesian expects a tf.keras.Model (Sequential or functional), got "
                    f"{type(model).__name__}{hint}.")
  sequential = isinstance(model, tf.keras.Sequential)
  if not sequential and not getattr(model, "_is_graph_network", False):
    raise TypeError(
        f"to_bayesian expects a Sequential or functional Keras model; {model.name!r} "
        f"({type(model).__name__}) is a subclassed model, whose call() cannot be read. Build "
        "it as tf.keras.Sequential([...]) or tf.keras.Model(inputs, outputs), or convert its "
        "layers one by one with bayesian_layer_args.")
  kl_weight, _ = check_divergence_args(kl_weight, None)
  for arg, value in (("prior_scale", prior_scale), ("init_scale", init_scale)):
    if not check_finite_float(arg, value) > 0:
      raise ValueError(f"`{arg}` must be > 0, got {value!r}.")
  seed = check_seed(seed)

  input_layer = _input_of(model)
  if sequential:
    chain = [(layer, {}) for layer in model.layers]
  else:
    chain = _functional_chain(model, input_layer)

  count = [0]

  def make_bayesian(layer):
    cls, kwargs = bayesian_layer_args(layer)
    if kwargs.get("divergence_fn") is not None and kl_weight is not None:
      raise ValueError(f"{_describe(layer)} has a divergence_fn, which replaces kl_weight: "
                       f"pass kl_weight=None to keep it, got kl_weight={kl_weight!r}.")
    new = cls(name=layer.name,
              seed=derive_seed(seed, count[0]),
              prior_scale=prior_scale,
              init_scale=init_scale,
              kl_weight=kl_weight,
              **kwargs)
    count[0] += 1
    return new

  copies = [_copy_layer(layer, kw, make_bayesian) for layer, kw in chain]
  name = f"{model.name}_bayesian" if name is None else name
  if input_layer is None:
    return tf.keras.Sequential([layer for layer, _ in copies], name=name)
  config = input_layer.get_config()
  new_input = tf.keras.Input(batch_shape=config["batch_input_shape"],
                             dtype=config["dtype"],
                             name=config["name"])
  if sequential:
    return tf.keras.Sequential([new_input] + [layer for layer, _ in copies], name=name)
  x = new_input
  for layer, kwargs in copies:
    x = layer(x, **kwargs)
  inputs = tf.nest.pack_sequence_as(getattr(model, "_nested_inputs", new_input), [new_input])
  outputs = tf.nest.pack_sequence_as(getattr(model, "_nested_outputs", x), [x])
  return tf.keras.Model(inputs, outputs, name=name)

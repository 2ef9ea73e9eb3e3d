"""The model a run trains: the user's Keras model, or a built-in one, by one path.

Every algorithm takes its network the way `tff.learning` does: a `model_fn`, a
zero-argument callable that returns an *uncompiled* Keras model whose output is
the logits `[batch, num_classes]`. On the command line it is
`--model=MODULE:FUNCTION` (the module imported as Python imports it: from the
current directory or `PYTHONPATH`); in Python, `model=` any such callable. The
built-in networks (`--architecture=mlp|conv|cnn`) are builders of the same kind
(`tfbfl.networks.builders`), and take the same path:

1. `template(builder, ...)` calls the builder once, eagerly, checks the model
   against the data (a Keras `Sequential` or functional model, one input of the
   examples' shape, `num_classes` logits) and keeps its Keras config: a
   `ModelTemplate`, hashable and free of variables.
2. `ModelTemplate.build(seed)` makes the model from that config anywhere (eagerly
   or inside a TFF computation), with every weight initializer seeded from the
   run's `--seed`: the `j`-th random initializer of the `k`-th layer with weights
   gets `derive_seed(seed, SERVER, k)` (`j = 0`, the kernel) or
   `derive_seed(seed, SERVER, k, j)`, so a run is a function of `--seed` whatever
   seeds the builder set. The built-in networks use Glorot-normal kernels and zero
   biases, so a Keras model that spells one out (with
   `kernel_initializer="glorot_normal"`) is that network, weight for weight.
3. VIRTUAL reads `ModelTemplate.layers()` to build its Bayesian server column and
   laterally connected client columns (`tfbfl.networks.progressive`); PFNM reads
   the widths of a ReLU stack of `Dense` layers (`dense_widths`).

`fingerprint` names the built model's variables (names and shapes): a checkpoint
records it, so a run resumed with another model is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from typing import Any, Callable, Optional, Protocol, Sequence, Tuple, runtime_checkable

import tensorflow as tf

from tfbfl.layers.base import derive_seed

__all__ = [
    "MODEL_FLAG",
    "ModelError",
    "NamedBuilder",
    "ModelTemplate",
    "builder_label",
    "dense_widths",
    "import_builder",
    "resolve_builder",
    "template",
]

MODEL_FLAG = "--model"
# The salt of the server column's layers (`tfbfl.networks.base.SERVER`): a
# deterministic model's layer k is seeded as VIRTUAL's server layer k.
_SERVER_SALT = 0


class ModelError(ValueError):
  """A model (`--model` or `model=`) that cannot be trained on the data; the message
  names the flag and what was expected."""


@runtime_checkable
class NamedBuilder(Protocol):
  """A model builder that names itself (the built-in networks: `label` is what a run
  records, e.g. `preset:mlp(100,100)`)."""
  label: str

  def __call__(self) -> Any:
    ...


def import_builder(spec: str, flag: str = MODEL_FLAG) -> Callable[[], Any]:
  """The callable `MODULE:FUNCTION` names (`FUNCTION` may be dotted: `Class.method`).

  Raises:
    ModelError: naming `flag` when `spec` is not of that form, the module cannot be
      imported, it has no such attribute, or the attribute is not callable.
  """
  if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
    raise ModelError(f"{flag} must be MODULE:FUNCTION (e.g. mymodels:build), got {spec!r}.")
  module_name, attr = spec.split(":")
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except  (any import failure is the user's)
    raise ModelError(f"{flag}={spec}: cannot import module {module_name!r} "
                     f"({type(e).__name__}: {e}); it is imported from the current directory "
                     "or PYTHONPATH.") from e
  obj = module
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise ModelError(f"{flag}={spec}: module {module_name!r} has no attribute {attr!r}.")
    obj = getattr(obj, part)
  if not callable(obj):
    raise ModelError(f"{flag}={spec}: {attr!r} is not callable (it is of type "
                     f"{type(obj).__name__}); name a function returning a Keras model.")
  return obj


def builder_label(builder: Any) -> str:
  """How a run records `builder`: the `--model` string itself, else
  `MODULE:QUALNAME` of a callable (what `--model` would name it)."""
  if isinstance(builder, str):
    return builder
  if isinstance(builder, NamedBuilder):
    return builder.label
  module = getattr(builder, "__module__", None) or type(builder).__module__
  name = getattr(builder, "__qualname__", None) or type(builder).__qualname__
  return f"{module}:{name}"


def resolve_builder(model: Any, flag: str = MODEL_FLAG) -> Callable[[], Any]:
  """A zero-argument model builder from `--model`'s string or a callable."""
  if isinstance(model, str):
    return import_builder(model, flag)
  if not callable(model):
    raise ModelError(f"{flag} must be MODULE:FUNCTION or a zero-argument callable returning "
                     f"an uncompiled Keras model, got {type(model).__name__}.")
  return model


# -- the template ------------------------------------------------------------------


def _seed_initializers(config: Any, seeds: Sequence[int]) -> int:
  """Sets the seeds of the random initializers in one layer's `config` (in place),
  in the config's order; returns how many were set."""
  count = 0
  for key, value in config.items():
    if (key.endswith("_initializer") and isinstance(value, dict) and
        isinstance(value.get("config"), dict) and "seed" in value["config"]):
      value["config"]["seed"] = int(seeds[count]) if count < len(seeds) else None
      count += 1
  return count


@dataclasses.dataclass(frozen=True)
class ModelTemplate:
  """A checked Keras model as its config: rebuilt anywhere, seeded by the run.

  Attributes:
    label: what the run records as its model (`--model`'s value, or the built-in
      network's name).
    functional: whether the config is a functional model's (else a `Sequential`'s).
    config_json: the model's Keras config (`get_config()`), as JSON.
    custom_layers: `(name, class)` of the layer classes that are not Keras' own,
      for deserialization.
    input_shape: the shape of one example the model reads.
    num_classes: the width of its logits.
    weight_layers: the names of the layers that hold weights, in model order.
  """
  label: str
  functional: bool
  config_json: str
  custom_layers: Tuple[Tuple[str, type], ...]
  input_shape: Tuple[int, ...]
  num_classes: int
  weight_layers: Tuple[str, ...]

  def seeded_config(self, seed: Optional[int]) -> dict:
    """The Keras config with every random initializer seeded from `seed` (module
    docstring); `seed=None` leaves the builder's initializers as they are."""
    config = json.loads(self.config_json)
    if seed is None:
      return config
    k = {name: i for i, name in enumerate(self.weight_layers)}
    for layer in config["layers"]:
      name = layer["config"].get("name")
      if name in k:
        base = derive_seed(seed, _SERVER_SALT, k[name])
        seeds = [base] + [derive_seed(seed, _SERVER_SALT, k[name], j) for j in range(1, 16)]
        _seed_initializers(layer["config"], seeds)
    return config

  def build(self, seed: Optional[int] = None) -> tf.keras.Model:
    """A new Keras model from the config, weights initialised from `seed`."""
    config = self.seeded_config(seed)
    custom = dict(self.custom_layers)
    cls = tf.keras.Model if self.functional else tf.keras.Sequential
    with tf.keras.utils.custom_object_scope(custom):
      return cls.from_config(config, custom_objects=custom)

  def layers(self) -> list:
    """Unbuilt Keras layers of the model, in order, each from its own config (the
    input layer left out): what VIRTUAL's and PFNM's constructions read."""
    config = json.loads(self.config_json)
    custom = dict(self.custom_layers)
    out = []
    with tf.keras.utils.custom_object_scope(custom):
      for layer in config["layers"]:
        if layer["class_name"] == "InputLayer":
          continue
        out.append(tf.keras.layers.deserialize({k: v for k, v in layer.items()
                                                if k in ("module", "class_name", "config",
                                                         "registered_name")},
                                               custom_objects=custom))
    return out

  @property
  def family(self) -> str:
    """"conv" when a layer is a convolution, else "mlp": the built-in family whose
    defaults (VIRTUAL's initial scale) the model takes."""
    config = json.loads(self.config_json)
    return "conv" if any(layer["class_name"].startswith("Conv")
                         for layer in config["layers"]) else "mlp"

  def fingerprint(self) -> str:
    """sha256 over the built model's variables' names and shapes (16 hex digits)."""
    model = self.build(None)
    entries = [(w.name, [int(d) for d in w.shape]) for w in model.weights]
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]


# Layers that draw random numbers in training from TensorFlow's global generator.
_UNSEEDED_NOISE = (tf.keras.layers.Dropout, tf.keras.layers.GaussianNoise,
                   tf.keras.layers.GaussianDropout, tf.keras.layers.AlphaDropout)


def _is_chain_or_sequential(model) -> bool:
  return isinstance(model, tf.keras.Sequential) or getattr(model, "_is_graph_network", False)


def template(builder: Callable[[], Any],
             *,
             input_shape: Sequence[int],
             num_classes: int,
             label: Optional[str] = None,
             flag: str = MODEL_FLAG) -> ModelTemplate:
  """Calls `builder()` once, checks the model against the data, keeps its config.

  Args:
    builder: zero-argument callable returning an uncompiled Keras model with logits
      out (`tff.learning`'s `model_fn` convention).
    input_shape: the shape of one example of the data.
    num_classes: the data's number of classes.
    label: what to record as the model (default `builder_label(builder)`).
    flag: the flag named in errors.

  Raises:
    ModelError: one line naming `flag` when the builder fails, returns something
      that is not a Keras `Sequential` or functional model, has not one input of
      `input_shape`, or whose output is not `[batch, num_classes]`.
  """
  label = builder_label(builder) if label is None else label
  input_shape = tuple(int(d) for d in input_shape)
  try:
    model = builder()
  except Exception as e:  # pylint: disable=broad-except  (the user's code)
    raise ModelError(f"{flag}={label}: calling it raised {type(e).__name__}: {e}") from e
  if not isinstance(model, tf.keras.Model):
    hint = (" (a tff.learning model: return the Keras model you wrapped, tfbfl wraps it)"
            if type(model).__module__.startswith("tensorflow_federated") else "")
    raise ModelError(f"{flag}={label} must return a tf.keras.Model (uncompiled, logits out), "
                     f"got {type(model).__name__}{hint}.")
  if not _is_chain_or_sequential(model):
    raise ModelError(f"{flag}={label} returned a subclassed Keras model "
                     f"({type(model).__name__}); tfbfl rebuilds models from their config, so it "
                     "needs a Sequential or functional model.")
  if not model.built or not model.inputs:
    raise ModelError(f"{flag}={label}: the model does not declare its input shape; start it "
                     f"with tf.keras.Input(shape={input_shape}).")
  if len(model.inputs) != 1 or len(model.outputs) != 1:
    raise ModelError(f"{flag}={label}: the model must have one input and one output, got "
                     f"{len(model.inputs)} and {len(model.outputs)}.")
  got_in = tuple(model.inputs[0].shape[1:])
  if got_in != input_shape:
    raise ModelError(f"{flag}={label} reads examples of shape {got_in}; the data's examples "
                     f"have shape {input_shape}.")
  out = tuple(model.outputs[0].shape)
  if len(out) != 2 or out[-1] != int(num_classes):
    raise ModelError(f"{flag}={label} outputs shape {out[1:]} per example; expected "
                     f"{int(num_classes)} logits, one per class of the data.")
  for layer in model.layers:
    if isinstance(layer, _UNSEEDED_NOISE):
      raise ModelError(f"{flag}={label}: layer {layer.name!r} ({type(layer).__name__}) draws "
                       "noise in training from a generator the run's --seed cannot fix, so "
                       "runs would not repeat; remove it (VIRTUAL's Bayesian layers bring "
                       "their own seeded noise).")
  custom = {}
  for layer in model.layers:
    cls = type(layer)
    if not cls.__module__.startswith(("keras.", "tensorflow.")):
      custom[cls.__name__] = cls
  try:
    config_json = json.dumps(model.get_config())
  except (TypeError, NotImplementedError) as e:
    raise ModelError(f"{flag}={label}: the model's config cannot be serialized ({e}); every "
                     "layer needs a get_config().") from e
  weight_layers = tuple(layer.name for layer in model.layers if layer.weights)
  return ModelTemplate(label=label,
                       functional=not isinstance(model, tf.keras.Sequential),
                       config_json=config_json,
                       custom_layers=tuple(sorted(custom.items())),
                       input_shape=input_shape,
                       num_classes=int(num_classes),
                       weight_layers=weight_layers)


def dense_widths(tmpl: ModelTemplate, who: str, flag: str = MODEL_FLAG) -> Tuple[int, ...]:
  """The hidden widths of a model that is a ReLU stack of `Dense` layers with a linear
  logits layer (`Flatten`/`Reshape` allowed before the first), or ModelError naming
  `flag` and `who` (the algorithm that needs it) and the first layer that is not."""
  widths = []
  dense = [layer for layer in tmpl.layers() if not isinstance(layer, (tf.keras.layers.Flatten,
                                                                     tf.keras.layers.Reshape))]
  seen_dense = False
  for layer in tmpl.layers():
    if isinstance(layer, (tf.keras.layers.Flatten, tf.keras.layers.Reshape)) and not seen_dense:
      continue
    if type(layer) is not tf.keras.layers.Dense:  # pylint: disable=unidiomatic-typecheck
      raise ModelError(f"{flag}={tmpl.label}: {who} needs a stack of Dense layers with ReLU "
                       f"(the paper's networks); layer {layer.name!r} is a "
                       f"{type(layer).__name__}.")
    seen_dense = True
  for i, layer in enumerate(dense):
    act = tf.keras.activations.serialize(layer.activation)
    last = i == len(dense) - 1
    if (act != "linear") if last else (act != "relu"):
      raise ModelError(f"{flag}={tmpl.label}: {who} needs ReLU hidden layers and linear logits; "
                       f"Dense layer {layer.name!r} has activation {act!r}.")
    if not layer.use_bias:
      raise ModelError(f"{flag}={tmpl.label}: {who} matches neurons with their biases; Dense "
                       f"layer {layer.name!r} has use_bias=False.")
    if not last:
      widths.append(int(layer.units))
  return tuple(widths)

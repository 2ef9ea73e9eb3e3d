"""The built-in networks as model builders, like any user's `--model`.

Each is a frozen dataclass whose call returns an uncompiled Keras `Sequential` with
logits out, exactly what a user's `model_fn` returns (`tfbfl.models`): kernels
Glorot-normal and biases zero, seeded by the run (`ModelTemplate.build`). Being
values, they compare and hash by their settings, so a template is cached per
network.

* `MLP`: `Input(example shape)` (`Flatten` for images), then `Dense` hidden layers
  with `activation` and linear logits (`--architecture=mlp`).
* `ConvNet`: VIRTUAL's FEMNIST conv net (`--architecture=conv`): `Reshape` to the
  image, per stage `Conv2D(activation) -> MaxPool2D`, `Flatten`, the dense layers.
* `McMahanCNN`: the CNN of McMahan et al. (2017) of FOLA's CIFAR-10 experiments
  (`--architecture=cnn`).
* `preset(architecture, ...)`: the builder `--architecture` names.
* `template_for(...)`: the checked `tfbfl.models.ModelTemplate` an algorithm trains:
  its config's `model` (the user's), else the preset; `config_template(cfg)` reads
  those settings from an algorithm's config.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

from tfbfl import models

__all__ = ["ConvNet", "MCMAHAN_FILTERS", "MLP", "McMahanCNN", "config_template", "preset",
           "template_for"]

MCMAHAN_FILTERS = (32, 64)


def _ints(values) -> Tuple[int, ...]:
  return tuple(int(v) for v in values or ())


def _dense(widths, activation, first=0):
  layers = []
  for k, units in enumerate(widths):
    last = k == len(widths) - 1
    layers.append(
        tf.keras.layers.Dense(units,
                              activation=None if last else activation,
                              kernel_initializer="glorot_normal",
                              bias_initializer="zeros",
                              name=f"dense_{first + k}"))
  return layers


@dataclasses.dataclass(frozen=True)
class MLP:
  """`input_shape -> hidden_units (activation) -> num_classes` logits."""
  input_shape: Tuple[int, ...]
  num_classes: int
  hidden_units: Tuple[int, ...] = (100, 100)
  activation: str = "relu"

  def __post_init__(self):
    object.__setattr__(self, "input_shape", _ints(self.input_shape))
    object.__setattr__(self, "hidden_units", _ints(self.hidden_units))

  @property
  def label(self) -> str:
    return f"preset:mlp({','.join(map(str, self.hidden_units))})"

  def __call__(self) -> tf.keras.Sequential:
    layers = [tf.keras.Input(shape=self.input_shape)]
    if len(self.input_shape) != 1:
      layers.append(tf.keras.layers.Flatten(name="flatten"))
    layers += _dense(list(self.hidden_units) + [int(self.num_classes)], self.activation)
    return tf.keras.Sequential(layers, name="deterministic_mlp")


@dataclasses.dataclass(frozen=True)
class ConvNet:
  """VIRTUAL's conv net on `image_shape` images read from examples of `input_shape`."""
  input_shape: Tuple[int, ...]
  image_shape: Tuple[int, ...]
  num_classes: int
  filters: Tuple[int, ...] = (32, 64)
  kernel_size: int = 5
  pool_size: int = 2
  padding: str = "same"
  hidden_units: Tuple[int, ...] = (100, 100)
  activation: str = "relu"

  def __post_init__(self):
    for name in ("input_shape", "image_shape", "filters", "hidden_units"):
      object.__setattr__(self, name, _ints(getattr(self, name)))
    if len(self.image_shape) == 2:
      object.__setattr__(self, "image_shape", self.image_shape + (1,))
    if int(np.prod(self.input_shape)) != int(np.prod(self.image_shape)):
      raise ValueError(f"the image {self.image_shape} must have as many entries as an example "
                       f"{self.input_shape}.")

  @property
  def label(self) -> str:
    return (f"preset:conv(filters={','.join(map(str, self.filters))};"
            f"hidden={','.join(map(str, self.hidden_units))})")

  def __call__(self) -> tf.keras.Sequential:
    layers = [tf.keras.Input(shape=self.input_shape), tf.keras.layers.Reshape(self.image_shape)]
    for l, f in enumerate(self.filters):
      layers.append(
          tf.keras.layers.Conv2D(f,
                                 self.kernel_size,
                                 padding=self.padding,
                                 activation=self.activation,
                                 kernel_initializer="glorot_normal",
                                 bias_initializer="zeros",
                                 name=f"conv_{l}"))
      layers.append(tf.keras.layers.MaxPool2D(self.pool_size, name=f"pool_{l}"))
    layers.append(tf.keras.layers.Flatten())
    layers += _dense(list(self.hidden_units) + [int(self.num_classes)], self.activation)
    return tf.keras.Sequential(layers, name="deterministic_conv")


@dataclasses.dataclass(frozen=True)
class McMahanCNN:
  """conv 5x5 32 -> pool 2 -> conv 5x5 64 -> pool 2 -> dense 512 -> logits (ReLU, 'same')."""
  input_shape: Tuple[int, ...]
  image_shape: Tuple[int, ...]
  num_classes: int

  def __post_init__(self):
    object.__setattr__(self, "input_shape", _ints(self.input_shape))
    image = _ints(self.image_shape)
    object.__setattr__(self, "image_shape", image + (1,) if len(image) == 2 else image)

  label = "preset:cnn"

  def __call__(self) -> tf.keras.Sequential:
    layers = [tf.keras.Input(shape=self.input_shape)]
    if self.input_shape != self.image_shape:
      layers.append(tf.keras.layers.Reshape(self.image_shape))
    for l, f in enumerate(MCMAHAN_FILTERS):
      layers.append(
          tf.keras.layers.Conv2D(f,
                                 5,
                                 padding="same",
                                 activation="relu",
                                 kernel_initializer="glorot_normal",
                                 bias_initializer="zeros",
                                 name=f"conv_{l}"))
      layers.append(tf.keras.layers.MaxPool2D(2, padding="same", name=f"pool_{l}"))
    layers.append(tf.keras.layers.Flatten(name="flatten"))
    for units, activation, name in ((512, "relu", "dense_0"), (int(self.num_classes), None,
                                                                 "logits")):
      layers.append(
          tf.keras.layers.Dense(units,
                                activation=activation,
                                kernel_initializer="glorot_normal",
                                bias_initializer="zeros",
                                name=name))
    return tf.keras.Sequential(layers, name="mcmahan_cnn")


def preset(architecture: str, *, input_shape, num_classes, hidden_units=(100, 100),
           image_shape=None, filters=(32, 64), kernel_size=5, activation="relu"):
  """The builder `--architecture=architecture` names (`mlp`, `conv`, `cnn`)."""
  if architecture == "mlp":
    return MLP(input_shape, num_classes, hidden_units, activation)
  if architecture == "conv":
    return ConvNet(input_shape, image_shape, num_classes, filters, kernel_size,
                   hidden_units=hidden_units, activation=activation)
  if architecture == "cnn":
    return McMahanCNN(input_shape, image_shape, num_classes)
  raise ValueError(f"--architecture={architecture} has no Keras builder (mlp, conv, cnn).")


@functools.lru_cache(maxsize=32)
def _template(builder, input_shape, num_classes) -> models.ModelTemplate:
  return models.template(builder, input_shape=input_shape, num_classes=num_classes)


def template_for(model, *, architecture: str, input_shape, num_classes: int,
                 hidden_units=(100, 100), image_shape: Optional[Tuple[int, ...]] = None,
                 filters=(32, 64), kernel_size: int = 5,
                 activation: str = "relu") -> models.ModelTemplate:
  """The network an algorithm's config names, as one checked template.

  `model` (a config's `model` field): a `ModelTemplate` (the driver checked the
  user's model), a `MODULE:FUNCTION` string or a builder (library callers of a
  config), or None: the preset of `architecture` with the size settings. Templates
  of the same builder and shapes are cached (built once a process).
  """
  if isinstance(model, models.ModelTemplate):
    return model
  input_shape = tuple(int(d) for d in input_shape)
  if model is None:
    model = preset(architecture, input_shape=input_shape, num_classes=num_classes,
                   hidden_units=tuple(hidden_units or ()), image_shape=image_shape,
                   filters=tuple(filters or ()), kernel_size=kernel_size, activation=activation)
  else:
    model = models.resolve_builder(model)
  try:
    hash(model)
  except TypeError:  # an unhashable builder: not cached
    return models.template(model, input_shape=input_shape, num_classes=num_classes)
  return _template(model, input_shape, int(num_classes))


def config_template(cfg) -> models.ModelTemplate:
  """`template_for` from an algorithm config's fields (`model`, `architecture`,
  `example_shape`, `num_classes`, `hidden_units`, `image_shape`, `filters`,
  `kernel_size` and `activation` where the config has them)."""
  return template_for(cfg.model,
                      architecture=cfg.architecture,
                      input_shape=cfg.example_shape,
                      num_classes=cfg.num_classes,
                      hidden_units=tuple(cfg.hidden_units),
                      image_shape=cfg.image_shape,
                      filters=tuple(cfg.filters),
                      kernel_size=getattr(cfg, "kernel_size", 5),
                      activation=getattr(cfg, "activation", "relu"))

"""What a loader does to the published raw input, stated as data (`RawInput`).

A loader of a published dataset reads the files' raw values and turns them into
the features `x` every algorithm trains and evaluates on. `RawInput` records that
transformation so that it can be stated (the loaders' docstrings, data/README.md),
tested against the files, and applied again outside the loader: an exported
SavedModel (`tfbfl.export`) takes the raw input as the files hold it and applies
the same transformation inside its graph.

The transformation, per example, in this order:

1. `x = float32(raw) / divisor` (`divisor` 255 for MNIST's uint8 pixels, 1 for
   LEAF's floats);
2. `x = 1 - x` where `invert` (LEAF FEMNIST: 1.0 is the background there; after
   it, ink is bright and the background 0, MNIST's convention);
3. where the client has a permutation (PMNIST: `client_permutations[client_id]`),
   the flattened features are permuted: `x.reshape(-1)[perm].reshape(shape)`.

numpy (`apply`) and TensorFlow (`apply_tf`) give bit-identical float32 results
(uint8 input: a 256-entry table of numpy's values, since TensorFlow's graph
optimizer would turn `/ 255` into a multiplication by 1/255; float input:
IEEE subtraction both ways).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np


@dataclasses.dataclass(frozen=True)
class RawInput:
  """The raw input a loader reads and how it becomes `x` (module docstring).

  Attributes:
    dtype: numpy dtype name of the raw values as published ("uint8", "float32").
    shape: one raw example's shape (the loader's `input_shape`).
    divisor: `x = float32(raw) / divisor`.
    invert: then `x = 1 - x`.
    description: one line for people (what the files hold, what is done).
    client_permutations: client id -> permutation of the flattened features
      (tuple of ints), applied last; empty when the clients share one input.
  """
  dtype: str
  shape: Tuple[int, ...]
  divisor: float = 1.0
  invert: bool = False
  description: str = ""
  client_permutations: Dict[str, Tuple[int, ...]] = dataclasses.field(default_factory=dict,
                                                                       compare=False,
                                                                       repr=False)

  def permutation(self, client_id: Optional[str]) -> Optional[np.ndarray]:
    """The feature permutation of `client_id` (None: none, or no client)."""
    if client_id is None or client_id not in self.client_permutations:
      return None
    return np.asarray(self.client_permutations[client_id], np.int64)

  def _scale(self, raw) -> np.ndarray:
    x = np.asarray(raw).astype(np.float32)
    if self.divisor != 1:
      x = x / np.float32(self.divisor)
    if self.invert:
      x = np.float32(1.0) - x
    return x

  def apply(self, raw, client_id: Optional[str] = None) -> np.ndarray:
    """numpy: raw [n, *shape] -> x float32 [n, *shape] as the loader makes it."""
    raw = np.asarray(raw)
    if raw.shape[1:] != tuple(self.shape):
      raise ValueError(f"raw input of shape {raw.shape[1:]} per example, expected "
                       f"{tuple(self.shape)}.")
    x = self._scale(raw)
    perm = self.permutation(client_id)
    if perm is not None:
      x = x.reshape(x.shape[0], -1)[:, perm].reshape(x.shape)
    return x.astype(np.float32, copy=False)

  def apply_tf(self, raw, client_id: Optional[str] = None):
    """TensorFlow (core ops only): the same as `apply`, for a SavedModel's graph."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if np.dtype(self.dtype) == np.uint8:
      # A table of the 256 values numpy computes: TensorFlow's graph optimizer turns
      # a division by a constant into a multiplication by its reciprocal, which
      # differs from numpy's x / 255 in the last bit for half of the pixel values.
      table = self._scale(np.arange(256, dtype=np.uint8))
      x = tf.gather(tf.constant(table, tf.float32), tf.cast(raw, tf.int32))
    else:
      x = tf.cast(raw, tf.float32)
      if self.divisor != 1:
        x = x / tf.constant(self.divisor, tf.float32)
      if self.invert:
        x = tf.constant(1.0, tf.float32) - x
    perm = self.permutation(client_id)
    if perm is not None:
      flat = tf.reshape(x, [-1, int(np.prod(self.shape))])
      x = tf.reshape(tf.gather(flat, tf.constant(perm), axis=1), [-1, *self.shape])
    return x

  def to_json(self, client_id: Optional[str] = None) -> Dict[str, Any]:
    """The manifest form (`tfbfl.export`): what the model does to its input."""
    out = dict(dtype=self.dtype,
               shape=[int(d) for d in self.shape],
               divisor=float(self.divisor),
               invert=bool(self.invert),
               description=self.description)
    perm = self.permutation(client_id)
    out["permuted"] = perm is not None
    return out

  def without_permutations(self) -> "RawInput":
    return dataclasses.replace(self, client_permutations={})


def mnist_raw_input(shape: Sequence[int] = (28, 28),
                    client_permutations: Optional[Dict[str, Any]] = None) -> RawInput:
  """MNIST's IDX pixels: uint8 0..255, ink bright; x = pixel / 255."""
  perms = {str(c): tuple(int(i) for i in p) for c, p in (client_permutations or {}).items()}
  what = "MNIST IDX pixels, uint8 [28, 28], 0 = background, 255 = ink; x = pixel / 255"
  if perms:
    what += ", then the client's PMNIST pixel permutation"
  return RawInput("uint8", tuple(shape), 255.0, False, what, perms)


def leaf_femnist_raw_input(invert: bool = True) -> RawInput:
  """LEAF/TFF FEMNIST pixels: float32 in [0, 1], 1.0 = background (ink dark)."""
  what = ("FEMNIST pixels as LEAF/TFF publish them, float32 [28, 28] in [0, 1], "
          "1.0 = background, ink dark")
  what += ("; x = 1 - pixel (inverted to MNIST's convention: ink bright, background 0)"
           if invert else "; kept as published (invert=False)")
  return RawInput("float32", (28, 28), 1.0, bool(invert), what)

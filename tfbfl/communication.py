"""What a round actually transmits, in bytes.

One accounting serves every algorithm (dense uploads/downloads, VIRTUAL's pruned
deltas, FOLA's compressed precisions), so `bytes_up` / `bytes_down` in
`metrics.csv` are comparable across methods:

* dense tensor:          `size * itemsize`;
* sparse (COO) tensor:   `nnz * (value_bytes + index_bytes)` (flat int32 indices);
* CSR matrix:            `nnz * (value_bytes + index_bytes) + (rows + 1) * index_bytes`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

INDEX_BYTES = 4


def _leaf_bytes(leaf) -> int:
  if isinstance(leaf, (tf.TensorSpec, tf.Tensor, tf.Variable)):
    shape, dtype = leaf.shape, leaf.dtype.as_numpy_dtype
  elif hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
    shape, dtype = leaf.shape, leaf.dtype
  else:
    arr = np.asarray(leaf)
    shape, dtype = arr.shape, arr.dtype
  if any(d is None for d in shape):
    raise ValueError(f"dense_bytes needs fully defined shapes, got {shape}.")
  return int(np.prod([int(d) for d in shape], dtype=np.int64)) * np.dtype(dtype).itemsize


def dense_bytes(structure: Any) -> int:
  """Bytes of a nested structure of dense arrays/tensors/TensorSpecs."""
  return int(sum(_leaf_bytes(leaf) for leaf in tf.nest.flatten(structure)))


def sparse_bytes(nnz: int, value_bytes: int = 4, index_bytes: int = INDEX_BYTES) -> int:
  """Bytes of `nnz` non-zero values sent with their flat indices."""
  if nnz < 0:
    raise ValueError(f"nnz must be >= 0, got {nnz}.")
  return int(nnz) * (value_bytes + index_bytes)


def csr_bytes(num_rows: int, nnz: int, value_bytes: int = 4, index_bytes: int = INDEX_BYTES) -> int:
  """Bytes of a CSR matrix: values, column indices and row pointers."""
  if num_rows < 0 or nnz < 0:
    raise ValueError(f"num_rows and nnz must be >= 0, got {num_rows}, {nnz}.")
  return sparse_bytes(nnz, value_bytes, index_bytes) + (int(num_rows) + 1) * index_bytes

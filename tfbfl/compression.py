"""Top-p compression of diagonal precisions (FOLA, Sec. 3.5).

FOLA uploads a diagonal precision `diag(Sigma_n^-1)` as large as the model. The
paper's compression assumes most entries are small and alike ("redundant
parameters have a large variance, all of the same value"): for each layer
(here: each variable tensor, kernels and biases separately), with `n` entries and
a fraction `p` in `(0, 1]`,

```none
k      = ceil(p * n)                          (at least 1 entry is kept)
K      = indices of the k largest entries     (ties: the lower flat index first)
fill   = mean of the n - k other entries
out_i  = x_i  if i in K  else  fill
```

and the result is transmitted in Compressed Sparse Row format: the kept values
with their column indices and row pointers, plus the one `fill` value. A tensor
of shape `(d_1, ..., d_m)` is viewed as the matrix `(d_1 * ... * d_{m-1}, d_m)`
(a vector as one row, a scalar as `1 x 1`). Bytes (`tfbfl.communication`):

```none
csr_bytes(rows, k, value_bytes) + value_bytes        (p < 1)
n * value_bytes                                       (p = 1: dense, no fill)
```

The size depends only on the shape and `p`, so `compressed_bytes` computes it
without the data and equals `encode(x, p).nbytes`.

Two implementations of the same map, tested against each other:

* `top_p_mean` (TF ops, graph-safe): what a client applies inside its TFF
  computation before its precision enters the aggregate;
* `encode` / `decode` (numpy + `scipy.sparse`): the transmitted format.

#### Examples

```python
import numpy as np
from tfbfl import compression

x = np.array([[0.1, 5.0, 0.3], [7.0, 0.2, 0.1]], np.float32)
enc = compression.encode(x, p=1 / 3)      # keeps 7.0 and 5.0
compression.decode(enc)                   # [[.175, 5., .175], [7., .175, .175]]
enc.nbytes == compression.compressed_bytes(x.shape, 1 / 3)   # True
```
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence, Tuple

import numpy as np
import scipy.sparse
import tensorflow as tf

from tfbfl import communication

__all__ = [
    "CompressedTensor",
    "compressed_bytes",
    "decode",
    "encode",
    "num_kept",
    "structure_bytes",
    "top_p_mean",
    "top_p_mean_structure",
]


def check_fraction(p, name: str = "compress_p") -> float:
  """`p` as a float in `(0, 1]`, else a ValueError naming the flag `name`."""
  try:
    value = float(p)
  except (TypeError, ValueError):
    raise ValueError(f"--{name} must be a number in (0, 1], got {p!r}.") from None
  if not (0.0 < value <= 1.0):
    raise ValueError(f"--{name} must be in (0, 1], got {p!r}.")
  return value


def num_kept(size: int, p: float) -> int:
  """`k = ceil(p * size)`, at least 1 (0 for an empty tensor).

  `p * size` is rounded to 9 significant decimals first, so that e.g.
  `0.7 * 10 = 7.000000000000001` keeps 7 entries, not 8.
  """
  p = check_fraction(p)
  size = int(size)
  if size < 0:
    raise ValueError(f"size must be >= 0, got {size}.")
  if size == 0:
    return 0
  return max(1, min(size, int(math.ceil(round(p * size, 9)))))


def _matrix_shape(shape: Sequence[int]) -> Tuple[int, int]:
  shape = tuple(int(d) for d in shape)
  if not shape:
    return 1, 1
  cols = shape[-1]
  rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
  return rows, cols


def compressed_bytes(shape: Sequence[int], p: float, dtype=np.float32) -> int:
  """Bytes of one tensor of `shape` after top-p compression (dense if p == 1)."""
  p = check_fraction(p)
  itemsize = np.dtype(dtype).itemsize
  size = int(np.prod(shape, dtype=np.int64))
  if p == 1.0:
    return size * itemsize
  rows, _ = _matrix_shape(shape)
  return communication.csr_bytes(rows, num_kept(size, p), value_bytes=itemsize) + itemsize


def structure_bytes(structure: Any, p: float) -> int:
  """`compressed_bytes` summed over a nested structure of arrays/tensors/specs."""
  total = 0
  for leaf in tf.nest.flatten(structure):
    dtype = getattr(leaf, "dtype", np.float32)
    dtype = dtype.as_numpy_dtype if isinstance(dtype, tf.DType) else dtype
    total += compressed_bytes(tuple(leaf.shape), p, dtype)
  return int(total)


# ------------------------------------------------------------------ TF version
def top_p_mean(x, p):
  """The top-p map of the module docstring on one tensor, with TF ops.

  Args:
    x: float tensor (any rank, fully defined size).
    p: Python float in `(0, 1]`.

  Returns:
    A tensor like `x`: its `k` largest entries unchanged, the others replaced by
    their mean. `p = 1` returns `x` itself.
  """
  p = check_fraction(p)
  x = tf.convert_to_tensor(x)
  size = x.shape.num_elements()
  if size is None:
    raise ValueError(f"top_p_mean needs a fully defined shape, got {x.shape}.")
  k = num_kept(size, p)
  if p == 1.0 or k >= size:
    return x
  flat = tf.reshape(x, [-1])
  _, top = tf.math.top_k(flat, k=k, sorted=True)  # ties: lower index first
  keep = tf.scatter_nd(top[:, None], tf.ones([k], tf.bool), [size])
  # Mean of the dropped entries themselves: sum(all) - sum(top) cancels in float32
  # on heavy-tailed precisions (it gave negative fills where every entry is > 0).
  dropped = tf.boolean_mask(flat, tf.logical_not(keep))
  fill = tf.reduce_mean(tf.cast(dropped, tf.float64))
  return tf.reshape(tf.where(keep, flat, tf.cast(fill, x.dtype)), tf.shape(x))


def top_p_mean_structure(structure, p):
  """`top_p_mean` applied to every leaf (layer) of a nested structure."""
  return tf.nest.map_structure(lambda t: top_p_mean(t, p), structure)


# -------------------------------------------------------------- numpy version
@dataclasses.dataclass(frozen=True)
class CompressedTensor:
  """One tensor after top-p compression, as transmitted.

  Attributes:
    shape: the original shape.
    csr: `scipy.sparse.csr_matrix` of the kept values on the matrix view of the
      module docstring (explicit entries: a kept value may be 0).
    fill: the value of every other entry (mean of the dropped ones); unused
      when every entry is kept.
  """
  shape: Tuple[int, ...]
  csr: Any
  fill: float

  @property
  def nbytes(self) -> int:
    """Bytes of the encoding: CSR arrays + the fill value (dense when p = 1)."""
    itemsize = self.csr.data.dtype.itemsize
    size = int(np.prod(self.shape, dtype=np.int64))
    if self.csr.nnz == size:  # nothing dropped: sent dense
      return size * itemsize
    return communication.csr_bytes(self.csr.shape[0], self.csr.nnz, value_bytes=itemsize) + itemsize


def encode(x, p: float) -> CompressedTensor:
  """Top-p compression of one array into a `CompressedTensor` (numpy/scipy)."""
  p = check_fraction(p)
  x = np.asarray(x)
  if not np.issubdtype(x.dtype, np.floating):
    raise ValueError(f"encode expects a floating array, got {x.dtype}.")
  size = x.size
  k = num_kept(size, p) if p < 1.0 else size
  flat = x.reshape(-1)
  # Stable sort of -x: equal values keep increasing index order, as tf.math.top_k.
  kept = np.sort(np.argsort(-flat, kind="stable")[:k])
  fill = float(np.mean(np.delete(flat, kept), dtype=np.float64)) if k < size else 0.0
  rows, cols = _matrix_shape(x.shape)
  row_of, col_of = np.divmod(kept, cols)
  indptr = np.zeros(rows + 1, np.int32)
  np.add.at(indptr, row_of + 1, 1)
  indptr = np.cumsum(indptr, dtype=np.int32)
  csr = scipy.sparse.csr_matrix((flat[kept].astype(x.dtype), col_of.astype(np.int32), indptr),
                                shape=(rows, cols))
  return CompressedTensor(tuple(x.shape), csr, fill)


def decode(encoded: CompressedTensor) -> np.ndarray:
  """The dense array of a `CompressedTensor`: kept values, `fill` elsewhere."""
  csr = encoded.csr
  dtype = csr.data.dtype
  out = np.full(csr.shape, encoded.fill, dtype=dtype)
  rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
  out[rows, csr.indices] = csr.data  # explicit entries, zeros included
  return out.reshape(encoded.shape)

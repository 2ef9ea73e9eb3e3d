"""Top-p precision compression (FOLA Sec. 3.5): round trip, TF/numpy agreement, bytes."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfbfl import communication  # noqa: E402
from tfbfl import compression  # noqa: E402


def _expected(x, k):
  """Independent reference: sort by value (stable in index), keep k, mean elsewhere."""
  flat = x.reshape(-1).astype(np.float64)
  order = sorted(range(flat.size), key=lambda i: (-flat[i], i))
  keep = np.zeros(flat.size, bool)
  keep[order[:k]] = True
  out = np.where(keep, flat, flat[~keep].mean() if (~keep).any() else 0.0)
  return out.reshape(x.shape), keep.reshape(x.shape)


@pytest.mark.parametrize("shape,p", [((7, 9), 0.1), ((5, 5, 3, 4), 0.37), ((13,), 0.5),
                                     ((6, 4), 1.0)])
def test_round_trip_keeps_top_entries_exactly_and_mean_elsewhere(shape, p):
  rng = np.random.default_rng(0)
  x = rng.gamma(0.3, size=shape).astype(np.float32)
  enc = compression.encode(x, p)
  out = compression.decode(enc)
  k = compression.num_kept(x.size, p)
  want, keep = _expected(x, k)
  assert out.shape == x.shape and out.dtype == np.float32
  np.testing.assert_array_equal(out[keep], x[keep])  # kept: bit-exact
  np.testing.assert_allclose(out[~keep], want[~keep], rtol=1e-6)  # the mean of the rest
  assert enc.csr.nnz == k
  # Bytes: the arrays actually encoded, plus the one fill value when p < 1.
  csr = enc.csr
  actual = csr.data.nbytes + csr.indices.nbytes + csr.indptr.nbytes + (4 if p < 1 else 0)
  if p == 1:
    actual = x.nbytes
  assert enc.nbytes == actual == compression.compressed_bytes(shape, p)
  assert csr.indices.dtype == np.int32 and csr.indptr.dtype == np.int32
  rows = int(np.prod(shape[:-1]))
  if p < 1:
    assert enc.nbytes == communication.csr_bytes(rows, k) + 4
    assert (enc.nbytes < x.nbytes) == (p < 0.45)  # CSR pays 8 bytes per kept entry


def test_tf_version_matches_numpy_including_ties_and_zero_kept_values():
  x = np.zeros((4, 6), np.float32)
  x[0, 1] = x[2, 3] = x[3, 0] = 2.0  # three-way tie at the top
  x[1, 4] = 5.0
  for p in (0.05, 0.1, 0.2, 0.3):  # k = 2, 3, 5 (kept zeros), 8
    enc = compression.encode(x, p)
    tf_out = compression.top_p_mean(tf.constant(x), p).numpy()
    np.testing.assert_allclose(tf_out, compression.decode(enc), rtol=1e-6, atol=1e-7)
  # k = 2: the 5.0 and the first (lowest flat index) of the tied 2.0s.
  out = compression.decode(compression.encode(x, 2 / 24))
  assert out[1, 4] == 5.0 and out[0, 1] == 2.0
  np.testing.assert_allclose(out[2, 3], 4.0 / 22, rtol=1e-6)
  # Explicitly stored zeros survive the round trip (k = 5 keeps two zeros).
  enc = compression.encode(x, 5 / 24)
  assert enc.csr.nnz == 5 and np.count_nonzero(enc.csr.data == 0) == 1
  np.testing.assert_array_equal(compression.decode(enc), x)


def test_structure_and_tf_structure():
  rng = np.random.default_rng(1)
  layers = [rng.random((8, 5)).astype(np.float32), rng.random(5).astype(np.float32)]
  outs = compression.top_p_mean_structure([tf.constant(a) for a in layers], 0.25)
  for a, o in zip(layers, outs):
    np.testing.assert_allclose(o.numpy(),
                               compression.decode(compression.encode(a, 0.25)),
                               rtol=1e-6)
  assert compression.structure_bytes(layers, 0.25) == sum(
      compression.encode(a, 0.25).nbytes for a in layers)
  assert compression.structure_bytes(layers, 1.0) == communication.dense_bytes(layers)


def test_num_kept_rounding_and_validation():
  assert compression.num_kept(10, 0.7) == 7  # 0.7 * 10 = 7.000000000000001
  assert compression.num_kept(10, 0.71) == 8
  assert compression.num_kept(1000, 1e-6) == 1  # at least one entry
  assert compression.num_kept(0, 0.5) == 0
  for bad in (0.0, -0.1, 1.5, float("nan"), "x"):
    with pytest.raises(ValueError, match="compress_p"):
      compression.num_kept(10, bad)
  with pytest.raises(ValueError, match="floating"):
    compression.encode(np.arange(4), 0.5)


def test_tf_fill_on_heavy_tailed_precisions_is_positive_and_matches_numpy():
  # Precisions spanning 12 orders of magnitude: sum(all) - sum(top) in float32
  # cancels to a negative fill; the mean of the dropped entries cannot.
  rng = np.random.default_rng(3)
  x = np.concatenate([np.full(5000, 1e-6), 10.0**rng.uniform(3, 7, size=50)]).astype(np.float32)
  rng.shuffle(x)
  x = x.reshape(50, 101)
  for p in (0.01, 0.05, 0.3):
    tf_out = compression.top_p_mean(tf.constant(x), p).numpy()
    np_out = compression.decode(compression.encode(x, p))
    assert (tf_out > 0).all(), p
    np.testing.assert_allclose(tf_out, np_out, rtol=1e-6)
    enc = compression.encode(x, p)
    assert enc.fill > 0

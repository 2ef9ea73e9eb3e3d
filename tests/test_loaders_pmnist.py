"""Permuted MNIST on tiny IDX files: homogeneous split + one permutation per client."""

import gzip
import os

import numpy as np
import pytest

from tfbfl import data


def _write_idx(path, array):
  header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("pmnist")
  rng = np.random.default_rng(0)
  for split, n in (("train", 200), ("t10k", 50)):
    _write_idx(os.path.join(directory, f"{split}-images-idx3-ubyte.gz"),
               rng.integers(0, 256, size=(n, 28, 28)))
    _write_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte.gz"), np.arange(n) % 10)
  return str(directory)


def _permutation(x, base):
  """The column permutation p with x == base[:, p] (rows stacked), or None."""
  perm = []
  for j in range(x.shape[1]):
    matches = np.flatnonzero(np.all(base == x[:, [j]], axis=0))
    if matches.size == 0:
      return None
    perm.append(int(matches[0]))
  return tuple(perm)


def test_pmnist_sizes_and_permutations(mnist_dir):
  fd = data.load_federated("pmnist",
                           data_dir=mnist_dir,
                           num_clients=4,
                           seed=5,
                           partition="class_dirichlet")  # partition ignored
  base = data.load_mnist(mnist_dir, partition="homogeneous", num_clients=4, seed=5)
  assert fd.name == "pmnist" and fd.input_shape == (28, 28)
  assert [fd.num_examples(c) for c in fd.client_ids] == [50] * 4
  assert [fd.num_examples(c, "test") for c in fd.client_ids] == [13, 13, 12, 12]
  perms = []
  for c in fd.client_ids:
    np.testing.assert_array_equal(fd.train[c][1], base.train[c][1])
    np.testing.assert_array_equal(fd.test[c][1], base.test[c][1])
    x = np.concatenate([fd.train[c][0], fd.test[c][0]]).reshape(-1, 784)
    xb = np.concatenate([base.train[c][0], base.test[c][0]]).reshape(-1, 784)
    perm = _permutation(x, xb)  # one permutation maps train and test together
    assert perm is not None and perm != tuple(range(784))
    assert perm == tuple(fd.raw_input.client_permutations[c])  # as the loader states
    perms.append(perm)
  assert len(set(perms)) == 4


def test_pmnist_deterministic(mnist_dir):
  a = data.load_pmnist(mnist_dir, num_clients=2, seed=1)
  b = data.load_pmnist(mnist_dir, num_clients=2, seed=1)
  c = data.load_pmnist(mnist_dir, num_clients=2, seed=2)
  for k in a.client_ids:
    np.testing.assert_array_equal(a.train[k][0], b.train[k][0])
  assert any(not np.array_equal(a.train[k][0], c.train[k][0]) for k in a.client_ids)

"""MNIST loader on tiny IDX files written by the test (plain and gzipped)."""

import os
import shutil

import numpy as np
import pytest

from tfbfl import data
from tfbfl.data import mnist

from datafiles import make_mnist_arrays, truncate_file, write_idx, write_mnist

N_TRAIN, N_TEST = 200, 50


def make_arrays(seed=0):
  return make_mnist_arrays(N_TRAIN, N_TEST, seed)


@pytest.fixture(scope="module")
def arrays():
  return make_arrays()


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory, arrays):
  return write_mnist(tmp_path_factory.mktemp("mnist"), arrays)


def test_plain_and_gz_read_identically(tmp_path, arrays, mnist_dir):
  gz_dir = write_mnist(tmp_path / "gz", arrays, gz=True)
  plain = mnist.load_mnist_arrays(mnist_dir)
  zipped = mnist.load_mnist_arrays(gz_dir)
  x, y, xt, yt = plain
  assert x.shape == (N_TRAIN, 28, 28) and x.dtype == np.float32
  assert xt.shape == (N_TEST, 28, 28) and yt.dtype == np.int32
  np.testing.assert_array_equal(x, arrays["train"][0] / np.float32(255))
  np.testing.assert_array_equal(y, arrays["train"][1])
  assert 0.0 <= x.min() and x.max() <= 1.0
  for a, b in zip(plain, zipped):
    np.testing.assert_array_equal(a, b)


def test_homogeneous_uses_official_test_set(mnist_dir, arrays):
  fd = data.load_federated("mnist",
                           data_dir=mnist_dir,
                           partition="homogeneous",
                           num_clients=10,
                           seed=0)
  assert len(fd.client_ids) == 10 and fd.num_classes == 10
  assert fd.input_shape == (28, 28)
  assert all(fd.num_examples(c) == 20 for c in fd.client_ids)
  assert all(fd.num_examples(c, "test") == 5 for c in fd.client_ids)
  xt, yt = fd.pooled("test")
  official = arrays["t10k"][0].astype(np.float32) / np.float32(255)
  assert sorted(map(bytes, xt)) == sorted(map(bytes, official))
  # The stated preprocessing: x = pixel / 255 (`raw_input`, applied again by exports).
  assert fd.raw_input.dtype == "uint8" and fd.raw_input.shape == (28, 28)
  assert not fd.raw_input.client_permutations
  np.testing.assert_array_equal(fd.raw_input.apply(arrays["t10k"][0]), official)
  assert sorted(yt.tolist()) == sorted(arrays["t10k"][1].tolist())


def test_label_skewed_test_follows_train_labels(mnist_dir):
  fd = data.load_federated("mnist",
                           data_dir=mnist_dir,
                           partition="pathological",
                           num_clients=5,
                           classes_per_client=2,
                           seed=1)
  assert fd.pooled("train")[1].size == N_TRAIN
  assert fd.pooled("test")[1].size == N_TEST  # every class is trained on
  for c in fd.client_ids:
    train_labels, test_labels = set(fd.train[c][1]), set(fd.test[c][1])
    assert test_labels <= train_labels
  fd = data.load_federated("mnist",
                           data_dir=mnist_dir,
                           partition="class_dirichlet",
                           alpha=0.3,
                           num_clients=4,
                           min_size=5,
                           seed=2)
  for c in fd.client_ids:
    assert set(fd.test[c][1]) <= set(fd.train[c][1])


def test_pooled_test_source_splits_each_client(mnist_dir):
  fd = mnist.load_mnist(mnist_dir,
                        partition="homogeneous",
                        num_clients=5,
                        test_source="pooled",
                        test_fraction=0.25)
  n = N_TRAIN + N_TEST
  assert fd.pooled("train")[1].size + fd.pooled("test")[1].size == n
  assert all(fd.num_examples(c, "test") == 13 for c in fd.client_ids)  # 12.5 up
  with pytest.raises(ValueError, match="`test_source`"):
    mnist.load_mnist(mnist_dir, test_source="mine")


def test_same_seed_same_data(mnist_dir):
  kw = dict(data_dir=mnist_dir, partition="label_dirichlet", alpha=0.5, num_clients=4)
  a = data.load_federated("mnist", seed=3, **kw)
  b = data.load_federated("mnist", seed=3, **kw)
  c = data.load_federated("mnist", seed=4, **kw)
  for cid in a.client_ids:
    for split in ("train", "test"):
      np.testing.assert_array_equal(getattr(a, split)[cid][0], getattr(b, split)[cid][0])
      np.testing.assert_array_equal(getattr(a, split)[cid][1], getattr(b, split)[cid][1])
  assert any(not np.array_equal(a.train[k][0], c.train[k][0]) for k in a.client_ids)


def test_missing_file_and_dir(tmp_path, arrays):
  directory = write_mnist(tmp_path / "m", arrays)
  os.remove(os.path.join(directory, "t10k-labels-idx1-ubyte"))
  with pytest.raises(data.MissingDataError,
                     match=r"t10k-labels-idx1-ubyte\[\.gz\].*yann\.lecun\.com"):
    data.load_federated("mnist", data_dir=directory)
  with pytest.raises(data.MissingDataError, match=r"got None.*train-images"):
    data.load_federated("mnist")
  with pytest.raises(FileNotFoundError, match="nowhere"):
    data.load_federated("mnist", data_dir=str(tmp_path / "nowhere"))


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_file_is_a_clear_error(tmp_path, arrays, gz):
  directory = write_mnist(tmp_path / "t", arrays, gz=gz)
  name = "train-images-idx3-ubyte" + (".gz" if gz else "")
  path = os.path.join(directory, name)
  truncate_file(path)
  pattern = "not a complete gzip file" if gz else "is truncated"
  with pytest.raises(ValueError, match=pattern) as info:
    mnist.load_mnist_arrays(directory)
  assert name in str(info.value)


def test_header_checks(tmp_path, arrays):
  directory = write_mnist(tmp_path / "h", arrays)
  images = os.path.join(directory, "train-images-idx3-ubyte")
  shutil.copy(os.path.join(directory, "train-labels-idx1-ubyte"), images)
  with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
    mnist.load_mnist_arrays(directory)
  with open(images, "wb") as f:
    f.write(b"PK\x03\x04garbage")
  with pytest.raises(ValueError, match="is not an IDX file"):
    mnist.load_mnist_arrays(directory)
  write_idx(images, np.zeros((N_TRAIN, 28, 28), np.uint8))
  with open(images, "ab") as f:
    f.write(b"\x00")
  with pytest.raises(ValueError, match="longer than its header"):
    mnist.load_mnist_arrays(directory)
  write_idx(images, np.zeros((N_TRAIN - 1, 28, 28), np.uint8))
  with pytest.raises(ValueError, match="expected one label per image"):
    mnist.load_mnist_arrays(directory)


def test_checksums_only_when_asked(tmp_path, arrays, monkeypatch):
  gz_dir = write_mnist(tmp_path / "gz", arrays, gz=True)
  mnist.load_mnist_arrays(gz_dir)  # not verified by default
  with pytest.raises(ValueError, match=r"has MD5 .* expected f68b3c2d"):
    mnist.load_mnist_arrays(gz_dir, verify_checksums=True)
  digests = {n: data._files.md5_of_file(os.path.join(gz_dir, n)) for n in mnist.GZ_MD5}
  monkeypatch.setattr(mnist, "GZ_MD5", digests)
  mnist.load_mnist_arrays(gz_dir, verify_checksums=True)
  plain_dir = write_mnist(tmp_path / "plain", arrays)
  with pytest.raises(ValueError, match="checksums are known only for the gzipped"):
    mnist.load_mnist_arrays(plain_dir, verify_checksums=True)

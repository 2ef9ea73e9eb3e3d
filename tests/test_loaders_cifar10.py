"""CIFAR-10 loader and its restricted unpickler, on tiny pickled batches."""

import collections
import os
import pickle

import numpy as np
import pytest

from datafiles import truncate_file
from tfbfl import data
from tfbfl.data import cifar10
from tfbfl.data import safe_pickle

N_BATCH, N_TEST = 30, 20


def make_batch(n, seed, bytes_keys=False):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
  images[0] = 0
  images[0, :, :, 0] = 255  # a pure red image
  batch = {
      "batch_label": f"batch {seed}",
      "labels": [int(v) for v in np.arange(n) % 10],
      "data": images.transpose(0, 3, 1, 2).reshape(n, 3072),  # R, G, B planes
      "filenames": [f"img_{i}.png" for i in range(n)]
  }
  if bytes_keys:  # as the publisher's Python 2 pickles read with encoding="bytes"
    batch = {k.encode(): v for k, v in batch.items()}
  return batch, images


def write_cifar(directory, protocol=2):
  folder = os.path.join(directory, "cifar-10-batches-py")
  os.makedirs(folder)
  images = {}
  for i, name in enumerate(cifar10.TRAIN_FILES + (cifar10.TEST_FILE,)):
    n = N_TEST if name == cifar10.TEST_FILE else N_BATCH
    batch, images[name] = make_batch(n, seed=i, bytes_keys=i % 2 == 1)
    with open(os.path.join(folder, name), "wb") as f:
      pickle.dump(batch, f, protocol=protocol)
  return str(directory), images


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
  return write_cifar(tmp_path_factory.mktemp("cifar"))


def test_arrays_channels_last(cifar):
  directory, images = cifar
  x, y, xt, yt = cifar10.load_cifar10_arrays(directory)
  assert x.shape == (5 * N_BATCH, 32, 32, 3) and x.dtype == np.float32
  assert xt.shape == (N_TEST, 32, 32, 3) and yt.dtype == np.int32
  assert 0.0 <= x.min() and x.max() <= 1.0
  np.testing.assert_array_equal(x[:N_BATCH], images["data_batch_1"] / np.float32(255))
  np.testing.assert_array_equal(xt, images["test_batch"] / np.float32(255))
  assert np.all(x[0, :, :, 0] == 1.0) and np.all(x[0, :, :, 1:] == 0.0)  # red
  assert y.tolist() == [i % 10 for i in range(N_BATCH)] * 5


@pytest.mark.parametrize("protocol", [0, 4, 5])
def test_every_pickle_protocol_loads(tmp_path, protocol):
  directory, _ = write_cifar(tmp_path, protocol=protocol)
  assert cifar10.load_cifar10_arrays(directory)[0].shape[0] == 5 * N_BATCH


def test_federated_by_partitioners(cifar):
  directory, _ = cifar
  fd = data.load_federated("cifar10",
                           data_dir=directory,
                           partition="homogeneous",
                           num_clients=5,
                           seed=0)
  assert fd.input_shape == (32, 32, 3) and fd.num_classes == 10
  assert [fd.num_examples(c) for c in fd.client_ids] == [30] * 5
  assert [fd.num_examples(c, "test") for c in fd.client_ids] == [4] * 5
  fd = data.load_federated("cifar10",
                           data_dir=directory,
                           partition="class_dirichlet",
                           alpha=0.5,
                           num_clients=3,
                           min_size=5,
                           seed=1)
  assert fd.pooled("train")[1].size == 5 * N_BATCH
  for c in fd.client_ids:
    assert set(fd.test[c][1]) <= set(fd.train[c][1])
  again = data.load_federated("cifar10",
                              data_dir=directory,
                              partition="class_dirichlet",
                              alpha=0.5,
                              num_clients=3,
                              min_size=5,
                              seed=1)
  for c in fd.client_ids:
    np.testing.assert_array_equal(fd.train[c][0], again.train[c][0])
  pooled = cifar10.load_cifar10(directory,
                                partition="homogeneous",
                                num_clients=4,
                                test_source="pooled")
  # 170 pooled examples over 4 clients: 43, 43, 42, 42 -> 11 test examples each
  assert [pooled.num_examples(c, "test") for c in pooled.client_ids] == [11] * 4


def test_missing_and_truncated(tmp_path):
  directory, _ = write_cifar(tmp_path / "a")
  os.remove(os.path.join(directory, "cifar-10-batches-py", "data_batch_3"))
  with pytest.raises(data.MissingDataError,
                     match=r"cifar-10-batches-py[/\\]data_batch_3.*cs\.toronto\.edu"):
    data.load_federated("cifar10", data_dir=directory)
  directory, _ = write_cifar(tmp_path / "b")
  path = os.path.join(directory, "cifar-10-batches-py", "test_batch")
  truncate_file(path)
  with pytest.raises(ValueError, match=r"test_batch.*not a complete pickle"):
    cifar10.load_cifar10_arrays(directory)
  # data_dir may be the unpacked folder itself
  folder = os.path.join(directory, "cifar-10-batches-py")
  with pytest.raises(ValueError, match=r"test_batch.*not a complete pickle"):
    cifar10.load_cifar10_arrays(folder)


def test_checksums_only_when_asked(cifar):
  directory, _ = cifar
  with pytest.raises(ValueError, match=r"data_batch_1.*has MD5 .* expected c99cafc1"):
    cifar10.load_cifar10_arrays(directory, verify_checksums=True)


def test_bad_batch_content(tmp_path):
  directory, _ = write_cifar(tmp_path)
  path = os.path.join(directory, "cifar-10-batches-py", "data_batch_2")
  batch, _ = make_batch(N_BATCH, 0)
  batch["labels"][3] = 10
  with open(path, "wb") as f:
    pickle.dump(batch, f, protocol=2)
  with pytest.raises(ValueError, match=r"data_batch_2.*labels in \[0, 10\]"):
    cifar10.load_cifar10_arrays(directory)
  batch["data"] = batch["data"].astype(np.float32)
  with open(path, "wb") as f:
    pickle.dump(batch, f, protocol=2)
  with pytest.raises(ValueError, match=r"data_batch_2.*uint8 array \[n, 3072\]"):
    cifar10.load_cifar10_arrays(directory)


class _Payload:
  """Unpickling this with the plain pickle module would run a shell command."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_other_globals(tmp_path):
  path = os.path.join(tmp_path, "evil")
  with open(path, "wb") as f:
    pickle.dump(collections.OrderedDict(data=np.zeros(3)), f, protocol=2)
  with pytest.raises(safe_pickle.UnsafePickleError, match=r"collections\.OrderedDict"):
    safe_pickle.load(path)

  marker = os.path.join(tmp_path, "pwned")
  for protocol in (0, 2, 5):
    with open(path, "wb") as f:
      pickle.dump({"data": _Payload(marker)}, f, protocol=protocol)
    with pytest.raises(safe_pickle.UnsafePickleError, match=r"(posix|os|nt)\.system"):
      safe_pickle.load(path)
  assert not os.path.exists(marker)

  with open(path, "wb") as f:
    pickle.dump({"f": eval}, f)
  with pytest.raises(ValueError, match=r"builtins\.eval.*not allowed"):
    safe_pickle.load(path)


def test_cifar_loader_refuses_a_tampered_batch(tmp_path):
  directory, _ = write_cifar(tmp_path)
  marker = os.path.join(tmp_path, "pwned")
  with open(os.path.join(directory, "cifar-10-batches-py", "data_batch_4"), "wb") as f:
    pickle.dump({"data": _Payload(marker), "labels": []}, f, protocol=2)
  with pytest.raises(data.UnsafePickleError, match=r"data_batch_4.*system"):
    data.load_federated("cifar10", data_dir=directory)
  assert not os.path.exists(marker)


def test_plain_containers_and_arrays_load(tmp_path):
  path = os.path.join(tmp_path, "ok")
  obj = {
      "a": [1, 2.5, "s", b"b", None, True, (3, 4)],
      "x": np.arange(6, dtype=np.int64).reshape(2, 3)
  }
  with open(path, "wb") as f:
    pickle.dump(obj, f, protocol=2)
  out = safe_pickle.load(path, encoding="latin1")
  assert out["a"] == obj["a"]
  np.testing.assert_array_equal(out["x"], obj["x"])

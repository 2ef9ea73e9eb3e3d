"""VSN loader on a tiny vehicle.mat (MATLAB v5, cells X and Y) written by the test."""

import os

import h5py
import numpy as np
import pytest
import scipy.io

from datafiles import truncate_file
from tfbfl import data
from tfbfl.data import vsn

SIZES = [12, 9, 16, 7, 10]


def make_cells(seed=0, labels=(-1, 1)):
  rng = np.random.default_rng(seed)
  xs = np.empty((len(SIZES), 1), dtype=object)
  ys = np.empty((len(SIZES), 1), dtype=object)
  for k, n in enumerate(SIZES):
    x = rng.normal(loc=50.0, scale=10.0, size=(n, 100))
    x[:, 0] = 1000 * (k + 1) + np.arange(n)  # identifies sensor and row
    x[:, 1] = 7.0  # a constant column (zero deviation)
    xs[k, 0] = x
    ys[k, 0] = np.where(np.arange(n) % 3 == 0, labels[1], labels[0]).reshape(-1, 1)
  return xs, ys


def write_mat(directory, **kw):
  os.makedirs(directory, exist_ok=True)
  xs, ys = make_cells(**kw)
  scipy.io.savemat(os.path.join(directory, "vehicle.mat"), {"X": xs, "Y": ys})
  return str(directory)


@pytest.fixture(scope="module")
def vsn_dir(tmp_path_factory):
  return write_mat(tmp_path_factory.mktemp("vsn"))


def test_raw_per_sensor_clients(vsn_dir):
  fd = vsn.load_vsn(vsn_dir, standardize=False)
  xs, ys = make_cells()
  assert fd.client_ids == [f"sensor_0{k}" for k in range(1, 6)]
  assert fd.num_classes == 2 and fd.input_shape == (100,) and fd.name == "vsn"
  for k, c in enumerate(fd.client_ids):
    n = SIZES[k]
    n_test = int(np.floor(n * 0.25 + 0.5))
    assert (fd.num_examples(c), fd.num_examples(c, "test")) == (n - n_test, n_test)
    x = np.concatenate([fd.train[c][0], fd.test[c][0]])
    y = np.concatenate([fd.train[c][1], fd.test[c][1]])
    rows = (x[:, 0] - 1000 * (k + 1)).astype(int)
    assert sorted(rows) == list(range(n))
    # columns in the file's order; labels -1 -> 0, +1 -> 1
    np.testing.assert_allclose(x, xs[k, 0][rows].astype(np.float32))
    np.testing.assert_array_equal(y, (ys[k, 0].reshape(-1)[rows] > 0).astype(int))


def test_standardized_with_train_statistics(vsn_dir):
  fd = data.load_federated("vsn", data_dir=vsn_dir, num_clients=5, seed=0)
  raw = vsn.load_vsn(vsn_dir, seed=0, standardize=False)
  for c in fd.client_ids:
    x = fd.train[c][0]
    np.testing.assert_allclose(x.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(x[:, 2:].std(axis=0), 1.0, atol=1e-4)
    assert np.all(x[:, 1] == 0.0)  # constant column: deviation counted as 1
    r, rt = raw.train[c][0], raw.test[c][0]
    expected = (rt - r.mean(axis=0)) / np.where(r.std(axis=0) > 0, r.std(axis=0), 1)
    np.testing.assert_allclose(fd.test[c][0], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(fd.train[c][1], raw.train[c][1])


def test_sensor_sampling_and_seed(vsn_dir):
  a = vsn.load_vsn(vsn_dir, num_clients=3, seed=2)
  b = vsn.load_vsn(vsn_dir, num_clients=3, seed=2)
  assert a.client_ids == b.client_ids and len(a.client_ids) == 3
  for c in a.client_ids:
    np.testing.assert_array_equal(a.train[c][0], b.train[c][0])
  ids = {tuple(vsn.load_vsn(vsn_dir, num_clients=3, seed=s).client_ids) for s in range(6)}
  assert len(ids) > 1


def test_zero_one_labels_accepted(tmp_path):
  fd = vsn.load_vsn(write_mat(tmp_path, labels=(0, 1)))
  y = np.concatenate([fd.pooled("train")[1], fd.pooled("test")[1]])
  assert set(y.tolist()) == {0, 1}


def test_missing_and_corrupted(tmp_path):
  with pytest.raises(data.MissingDataError, match=r"vehicle\.mat.*mduarte"):
    data.load_federated("vsn", data_dir=str(tmp_path))
  directory = write_mat(tmp_path / "t")
  path = os.path.join(directory, "vehicle.mat")
  truncate_file(path)
  with pytest.raises(ValueError, match=r"vehicle\.mat.*truncated or corrupted"):
    vsn.load_vsn(directory)
  os.remove(path)
  with h5py.File(path, "w") as f:
    f.create_dataset("X", data=np.zeros(3))
  with pytest.raises(ValueError, match=r"v7\.3"):
    vsn.load_vsn(directory)


def test_bad_content(tmp_path):
  xs, ys = make_cells()
  path = os.path.join(tmp_path, "vehicle.mat")
  ys[2, 0] = ys[2, 0] * 2
  scipy.io.savemat(path, {"X": xs, "Y": ys})
  with pytest.raises(ValueError, match=r"Y\{3\} has labels \[-2, 2\]"):
    vsn.load_vsn(str(tmp_path))
  xs, ys = make_cells()
  xs[1, 0] = xs[1, 0][:, :99]
  scipy.io.savemat(path, {"X": xs, "Y": ys})
  with pytest.raises(ValueError, match=r"X\{2\} must be a real matrix \[n, 100\]"):
    vsn.load_vsn(str(tmp_path))
  scipy.io.savemat(path, {"X": make_cells()[0]})
  with pytest.raises(ValueError, match="no variable 'Y'"):
    vsn.load_vsn(str(tmp_path))

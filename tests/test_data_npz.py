"""Tests of the .npz loader (files written by the tests)."""

import numpy as np
import pytest

from tfbfl.data import load_federated
from tfbfl.data import load_npz
from tfbfl.data import MissingDataError


def _arrays(seed=0):
  rng = np.random.default_rng(seed)
  out = {}
  for cid, n in (("alice", 12), ("bob", 7), ("carol", 9)):
    out[f"x_{cid}"] = rng.normal(size=(n, 2, 3)).astype(np.float32)
    out[f"y_{cid}"] = rng.integers(0, 5, size=n).astype(np.int64)
  return out


def _assert_rejected(tmp_path, arrays, match):
  """Writes `arrays` to f.npz; `load_npz` must raise a ValueError matching `match`."""
  path = tmp_path / "f.npz"
  np.savez(path, **arrays)
  with pytest.raises(ValueError, match=match):
    load_npz(path)


def test_round_trip_without_test_arrays(tmp_path):
  arrays = _arrays()
  path = tmp_path / "users.npz"
  np.savez(path, **arrays)
  fd = load_npz(path, seed=1)
  assert fd.name == "users"
  assert fd.client_ids == ["alice", "bob", "carol"]
  assert fd.input_shape == (2, 3)
  assert fd.num_classes == int(max(a.max() for k, a in arrays.items() if k[0] == "y")) + 1
  for cid in fd.client_ids:
    n = arrays[f"y_{cid}"].size
    assert fd.num_examples(cid) + fd.num_examples(cid, "test") == n
    assert fd.num_examples(cid, "test") == int(np.floor(n * 0.25 + 0.5))
    x = np.concatenate([fd.train[cid][0], fd.test[cid][0]])
    assert sorted(x.reshape(n, -1).tolist()) == sorted(arrays[f"x_{cid}"].reshape(n, -1).tolist())
  again = load_npz(path, seed=1)
  np.testing.assert_array_equal(fd.test["bob"][0], again.test["bob"][0])


def test_round_trip_with_test_arrays_and_num_classes(tmp_path):
  arrays = _arrays()
  rng = np.random.default_rng(1)
  for cid in ("alice", "bob", "carol"):
    arrays[f"x_test_{cid}"] = rng.normal(size=(3, 2, 3))
    arrays[f"y_test_{cid}"] = np.array([0, 1, 2], dtype=np.int32)
  path = tmp_path / "split.npz"
  np.savez_compressed(path, num_classes=np.array(8), **arrays)
  fd = load_npz(path)
  assert fd.num_classes == 8
  for cid in fd.client_ids:
    np.testing.assert_array_equal(fd.train[cid][0], arrays[f"x_{cid}"])
    np.testing.assert_array_equal(fd.train[cid][1], arrays[f"y_{cid}"])
    np.testing.assert_allclose(fd.test[cid][0], arrays[f"x_test_{cid}"], rtol=1e-6)
    np.testing.assert_array_equal(fd.test[cid][1], arrays[f"y_test_{cid}"])
  assert load_npz(path, num_classes=9).num_classes == 9


def test_load_federated_npz_ignores_partition(tmp_path):
  path = tmp_path / "u.npz"
  np.savez(path, **_arrays())
  fd = load_federated("npz", data_dir=str(path), partition="pathological", num_clients=2, seed=0)
  assert fd.client_ids == ["alice", "bob", "carol"]
  with pytest.raises(ValueError, match=r"`data_dir` must be the path of the \.npz file"):
    load_federated("npz")


def test_missing_file_names_path(tmp_path):
  path = tmp_path / "nope.npz"
  with pytest.raises(MissingDataError, match=r"nope\.npz"):
    load_npz(path)
  with pytest.raises(FileNotFoundError, match=r"data/README\.md"):
    load_federated("npz", data_dir=str(path))


def test_not_an_npz(tmp_path):
  path = tmp_path / "bad.npz"
  path.write_text("hello")
  with pytest.raises(ValueError, match=r"bad\.npz.*not a readable \.npz"):
    load_npz(path)


def test_no_client_arrays(tmp_path):
  path = tmp_path / "empty.npz"
  np.savez(path, num_classes=np.array(3))
  with pytest.raises(ValueError, match=r"empty\.npz.*has no x_<client>/y_<client> arrays"):
    load_npz(path)


def test_x_without_y(tmp_path):
  arrays = _arrays()
  del arrays["y_bob"]
  _assert_rejected(tmp_path, arrays, r"f\.npz.*has x_bob without its labels y_bob")


def test_y_without_x(tmp_path):
  arrays = _arrays()
  del arrays["x_carol"]
  _assert_rejected(tmp_path, arrays, r"has y_carol without its features x_carol")


def test_test_arrays_for_some_clients_only(tmp_path):
  arrays = _arrays()
  arrays["x_test_bob"] = np.ones((1, 2, 3))
  arrays["y_test_bob"] = np.zeros(1, int)
  _assert_rejected(tmp_path, arrays, r"every client or for none.*alice")


def test_x_test_without_y_test(tmp_path):
  arrays = _arrays()
  arrays["x_test_bob"] = np.ones((1, 2, 3))
  _assert_rejected(tmp_path, arrays, r"has x_test_bob without its labels y_test_bob")


def test_unknown_array(tmp_path):
  _assert_rejected(tmp_path, dict(features=np.ones(3), **_arrays()), r"unknown array 'features'")


def test_client_validation_passes_through(tmp_path):
  arrays = _arrays()
  arrays["y_bob"] = arrays["y_bob"][:-1]
  _assert_rejected(tmp_path, arrays, r"`x_by_client` and `y_by_client` of client 'bob'")

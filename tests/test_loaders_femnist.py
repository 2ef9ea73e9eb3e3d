"""FEMNIST loader on tiny LEAF JSON and TFF HDF5 files written by the test."""

import json
import os

import h5py
import numpy as np
import pytest

from datafiles import truncate_file
from tfbfl import data
from tfbfl.data import femnist

# writer -> (train labels, test labels)
WRITERS = {
    "f0000_14": ([0, 1, 2, 11, 3], [1, 40]),
    "f0001_40": ([5, 5, 6, 7, 8, 9], [5, 9]),
    "f0002_11": ([10, 20, 30], [12]),  # letters only
    "f0003_21": ([0, 9, 61], []),  # absent from the test files
    "f0004_07": ([3, 3, 4], [4, 35]),
    "f0005_33": ([1, 2], [2]),
}


def _images(labels, seed):
  rng = np.random.default_rng(seed)
  x = rng.random((len(labels), 28, 28)).astype(np.float32)
  x[:, 0, 0] = np.asarray(labels) / 100.0  # recognisable per example
  return x


def write_leaf(directory):
  for split, index in (("train", 0), ("test", 1)):
    os.makedirs(os.path.join(directory, split))
    items = [(w, v[index]) for w, v in WRITERS.items() if v[index]]
    for part in range(2):  # writers spread over two files per split
      chunk = items[part::2]
      obj = {
          "users": [w for w, _ in chunk],
          "num_samples": [len(y) for _, y in chunk],
          "user_data": {
              w: {
                  "x": _images(y, i).reshape(len(y), 784).tolist(),
                  "y": y
              } for i, (w, y) in enumerate(chunk)
          }
      }
      with open(os.path.join(directory, split, f"all_data_{part}_{split}.json"), "w") as f:
        json.dump(obj, f)
  return str(directory)


def write_h5(path, index, digits_only):
  with h5py.File(path, "w") as f:
    for i, (w, v) in enumerate(WRITERS.items()):
      y = [c for c in v[index] if c < 10] if digits_only else v[index]
      if not y or (index == 1 and w == "f0003_21"):
        continue
      g = f.create_group(f"examples/{w}")
      g.create_dataset("pixels", data=_images(y, i))
      g.create_dataset("label", data=np.asarray(y, np.int32))


def write_tff(directory, digits=True, full=True):
  os.makedirs(directory, exist_ok=True)
  for digits_only, present in ((True, digits), (False, full)):
    if present:
      train, test = femnist.TFF_FILES[digits_only]
      write_h5(os.path.join(directory, train), 0, digits_only)
      write_h5(os.path.join(directory, test), 1, digits_only)
  return str(directory)


@pytest.fixture(scope="module")
def leaf_dir(tmp_path_factory):
  return write_leaf(tmp_path_factory.mktemp("leaf"))


@pytest.fixture(scope="module")
def tff_dir(tmp_path_factory):
  return write_tff(tmp_path_factory.mktemp("tff"))


def _check_digits(fd):
  assert fd.num_classes == 10 and fd.input_shape == (28, 28)
  assert fd.client_ids == ["f0000_14", "f0001_40", "f0003_21", "f0004_07", "f0005_33"]
  sizes = {c: (fd.num_examples(c), fd.num_examples(c, "test")) for c in fd.client_ids}
  assert sizes == {
      "f0000_14": (4, 1),
      "f0001_40": (6, 2),
      "f0003_21": (2, 0),
      "f0004_07": (3, 1),
      "f0005_33": (2, 1)
  }
  for c in fd.client_ids:
    for split in ("train", "test"):
      x, y = getattr(fd, split)[c]
      assert y.size == 0 or y.max() < 10
      np.testing.assert_allclose(x[:, 0, 0], 1.0 - y / 100.0, atol=1e-6)  # inverted


@pytest.mark.parametrize("form", ["leaf", "tff"])
def test_digits_only_writers(leaf_dir, tff_dir, form):
  directory = leaf_dir if form == "leaf" else tff_dir
  fd = femnist.load_femnist(directory, num_clients=None, form=form)
  _check_digits(fd)


def test_tff_full_file_filtered_when_no_digitsonly_file(tmp_path):
  directory = write_tff(tmp_path / "full", digits=False)
  _check_digits(femnist.load_femnist(directory, num_clients=None))


@pytest.mark.parametrize("form", ["leaf", "tff"])
def test_all_62_classes(leaf_dir, tff_dir, form):
  directory = leaf_dir if form == "leaf" else tff_dir
  fd = data.load_federated("femnist62", data_dir=directory, num_clients=6)
  assert fd.num_classes == 62 and len(fd.client_ids) == 6
  assert fd.num_examples("f0002_11") == 3
  assert sorted(fd.test["f0000_14"][1].tolist()) == [1, 40]
  assert fd.pooled("train")[1].size == sum(len(v[0]) for v in WRITERS.values())


def test_auto_prefers_hdf5(tmp_path):
  both = write_tff(tmp_path / "both")
  for split in ("train", "test"):  # LEAF directories with a broken file
    os.makedirs(os.path.join(both, split))
    with open(os.path.join(both, split, "all_data_0.json"), "w") as f:
      f.write('{"users": [')
  _check_digits(femnist.load_femnist(both, num_clients=None))  # HDF5 used
  with pytest.raises(ValueError, match=r"all_data_0\.json.*not a complete"):
    femnist.load_femnist(both, form="leaf")


def test_writer_sampling_deterministic(leaf_dir):
  a = data.load_federated("femnist", data_dir=leaf_dir, num_clients=3, seed=0)
  b = data.load_federated("femnist", data_dir=leaf_dir, num_clients=3, seed=0)
  assert a.client_ids == b.client_ids and len(a.client_ids) == 3
  subsets = {
      tuple(data.load_federated("femnist", data_dir=leaf_dir, num_clients=3, seed=s).client_ids)
      for s in range(6)
  }
  assert len(subsets) > 1
  with pytest.raises(ValueError, match=r"`num_clients`=6 exceeds the 5 clients"):
    data.load_federated("femnist", data_dir=leaf_dir, num_clients=6)


def test_missing_files(tmp_path, tff_dir):
  with pytest.raises(data.MissingDataError,
                     match=r"train[/\\]\*\.json.*fed_emnist_digitsonly.*leaf"):
    data.load_federated("femnist", data_dir=str(tmp_path))
  with pytest.raises(data.MissingDataError, match="fed_emnist_digitsonly_train.h5"):
    femnist.load_femnist(str(tmp_path), form="tff")
  only_train = tmp_path / "only_train"
  os.makedirs(only_train)
  write_h5(os.path.join(only_train, "fed_emnist_train.h5"), 0, False)
  with pytest.raises(data.MissingDataError, match="fed_emnist_test.h5"):
    femnist.load_femnist(str(only_train), digits_only=False)


def test_truncated_files(tmp_path):
  leaf_copy = write_leaf(tmp_path / "leaf")
  path = os.path.join(leaf_copy, "test", "all_data_1_test.json")
  truncate_file(path)
  with pytest.raises(ValueError, match=r"all_data_1_test\.json.*not a complete"):
    femnist.load_femnist(leaf_copy, num_clients=None)

  tff_copy = write_tff(tmp_path / "tff", full=False)
  path = os.path.join(tff_copy, "fed_emnist_digitsonly_train.h5")
  truncate_file(path)
  with pytest.raises(ValueError, match=r"fed_emnist_digitsonly_train\.h5.*truncated"):
    femnist.load_femnist(tff_copy, num_clients=None)


def test_bad_structure(tmp_path):
  directory = write_leaf(tmp_path / "bad")
  path = os.path.join(directory, "train", "all_data_0_train.json")
  with open(path) as f:
    obj = json.load(f)
  user = obj["users"][0]
  obj["user_data"][user]["x"][0] = obj["user_data"][user]["x"][0][:700]
  with open(path, "w") as f:
    json.dump(obj, f)
  with pytest.raises(ValueError, match=r"f0000_14.* 784 "):
    femnist.load_femnist(directory, num_clients=None)
  obj["num_samples"][0] += 1
  with open(path, "w") as f:
    json.dump(obj, f)
  with pytest.raises(ValueError, match="num_samples"):
    femnist.load_femnist(directory, num_clients=None)


@pytest.mark.parametrize("form", ["leaf", "tff"])
def test_pixels_inverted_unless_asked_to_keep_them(leaf_dir, tff_dir, form):
  """x = 1 - the published pixel (LEAF/TFF: 1.0 is the background), as `raw_input`
  states; `invert=False` keeps the pixels as published."""
  directory = leaf_dir if form == "leaf" else tff_dir
  inverted = femnist.load_femnist(directory, num_clients=None, form=form)
  kept = femnist.load_femnist(directory, num_clients=None, form=form, invert=False)
  assert inverted.raw_input.invert and not kept.raw_input.invert
  assert inverted.raw_input.dtype == "float32" and inverted.raw_input.shape == (28, 28)
  assert "1 - pixel" in inverted.raw_input.description
  for c in inverted.client_ids:
    for split in ("train", "test"):
      x_inv, y = getattr(inverted, split)[c]
      x_raw, _ = getattr(kept, split)[c]
      np.testing.assert_allclose(x_raw[:, 0, 0], y / 100.0, atol=1e-6)  # as published
      np.testing.assert_array_equal(x_inv, np.float32(1) - x_raw)
      np.testing.assert_array_equal(x_inv, inverted.raw_input.apply(x_raw))

"""The loaders on the real files in ../shared/data, and a short training run per preset.

Skipped, with the folder named, where ../shared/data/<name> is absent
(`datafiles.real_data_dir`). What is checked (VIRTUAL Table I, data/README.md):

* MNIST: the published MD5s, shapes, labels, class counts; x = pixel / 255 as
  the loader states (`raw_input`); the homogeneous 100 x 600 split with the
  official test set 100 per client;
* PMNIST: 100 x 600, one pixel permutation per client (the same for its train
  and test images, none the identity, all distinct), the images otherwise those
  of the homogeneous MNIST split;
* FEMNIST: writers -> clients, digits only, the distribution's own split, and
  LEAF's pixels inverted (x = 1 - pixel) as the loader states;
* every real-data preset (mnist, pmnist, femnist_mlp, femnist_conv) trains at its
  defaults: a short run through the driver (few clients, rounds and epochs; the
  preset's learning rate, batch size, network) whose training loss falls.
"""

import glob
import gzip
import json
import os

import numpy as np
import pytest

from datafiles import real_data_dir
from tfbfl import data
from reproduction import presets
from tfbfl.data import femnist
from tfbfl.data import mnist
from tfbfl.data import official_split

# data/README.md: train class counts of the canonical MNIST.
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def _raw_idx(directory, name):
  with gzip.open(os.path.join(directory, name + ".gz"), "rb") as f:
    return mnist.parse_idx(f.read(), name)[1]


@pytest.fixture(scope="module")
def mnist_dir():
  return real_data_dir("mnist")


@pytest.fixture(scope="module")
def femnist_dir():
  return real_data_dir("femnist")


@pytest.fixture(scope="module", autouse=True)
def files_read_once():
  """Each real file is read once for the module. Every FEMNIST load (the 104 writers
  of `femnist_all`, the 100 of each FEMNIST preset smoke) parses LEAF's ~80 MB of
  train JSON twice (the writers' counts, then their examples): seven passes of
  several seconds each became one. Every MNIST load (checksums, the fixtures, the
  two MNIST preset smokes) decompresses the same four `.gz` files. The loaders run
  unchanged on the parsed objects and bytes (nothing they do mutates them); the
  tests' own readings of the files (`_raw_idx`, `_leaf_writers`) stay independent."""
  from tfbfl.data import _files  # pylint: disable=g-import-not-at-top
  from tfbfl.data import leaf  # pylint: disable=g-import-not-at-top

  def once(read):
    cache = {}

    def cached(path):
      if path not in cache:
        cache[path] = read(path)
      return cache[path]

    return cache, cached

  json_cache, read_json = once(leaf.read_json)
  bytes_cache, read_bytes = once(_files.read_bytes)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(leaf, "read_json", read_json)
    patch.setattr(_files, "read_bytes", read_bytes)
    yield
  json_cache.clear()
  bytes_cache.clear()


# -------------------------------------------------------------------- MNIST
@pytest.fixture(scope="module")
def mnist_arrays(mnist_dir):
  return mnist.load_mnist_arrays(mnist_dir, verify_checksums=True)  # the published MD5s


@pytest.fixture(scope="module")
def mnist_homogeneous(mnist_dir):
  return data.load_federated("mnist", data_dir=mnist_dir, partition="homogeneous", num_clients=100)


def test_mnist_checksums_shapes_and_preprocessing(mnist_dir, mnist_arrays, mnist_homogeneous):
  x, y, xt, yt = mnist_arrays
  assert x.shape == (60000, 28, 28) and xt.shape == (10000, 28, 28)
  assert x.dtype == xt.dtype == np.float32 and y.dtype == yt.dtype == np.int32
  assert np.bincount(y).tolist() == MNIST_TRAIN_COUNTS
  assert yt.size == 10000 and yt.min() == 0 and yt.max() == 9
  raw_input = mnist_homogeneous.raw_input
  assert (raw_input.dtype, raw_input.shape, raw_input.divisor,
          raw_input.invert) == ("uint8", (28, 28), 255.0, False)
  for name, images in (("train-images-idx3-ubyte", x), ("t10k-images-idx3-ubyte", xt)):
    raw = _raw_idx(mnist_dir, name)
    assert raw.dtype == np.uint8 and raw.min() == 0 and raw.max() == 255
    np.testing.assert_array_equal(images, raw_input.apply(raw))  # x = pixel / 255, nothing else


def test_mnist_homogeneous_100_clients_of_600(mnist_arrays, mnist_homogeneous):
  fd = mnist_homogeneous
  assert len(fd.client_ids) == 100 and fd.num_classes == 10 and fd.input_shape == (28, 28)
  assert {fd.num_examples(c) for c in fd.client_ids} == {600}
  assert {fd.num_examples(c, "test") for c in fd.client_ids} == {100}
  _, y = fd.pooled("train")
  assert np.bincount(y).tolist() == MNIST_TRAIN_COUNTS  # every train image once
  xt, yt = fd.pooled("test")
  _, _, official_x, official_y = mnist_arrays
  assert sorted(yt.tolist()) == sorted(official_y.tolist())
  # The official test set, each image once (compared as the multiset of images).
  assert sorted(map(bytes, xt)) == sorted(map(bytes, official_x))
  # Homogeneous: every client sees every class.
  assert all(len(np.unique(fd.train[c][1])) == 10 for c in fd.client_ids)


def test_pmnist_per_client_permutations(mnist_dir, mnist_homogeneous):
  fd = data.load_federated("pmnist", data_dir=mnist_dir, num_clients=100, seed=0)
  base = mnist_homogeneous  # the same seed (0): the same split
  assert fd.client_ids == base.client_ids and len(fd.client_ids) == 100
  assert {fd.num_examples(c) for c in fd.client_ids} == {600}
  assert {fd.num_examples(c, "test") for c in fd.client_ids} == {100}
  perms = fd.raw_input.client_permutations
  assert sorted(perms) == fd.client_ids
  expected = official_split.client_permutations(fd.client_ids, 784, 0)
  identity = tuple(range(784))
  for c in fd.client_ids:
    perm = np.asarray(perms[c])
    np.testing.assert_array_equal(perm, expected[c])
    assert sorted(perm.tolist()) == list(identity) and tuple(perm.tolist()) != identity
    for split in ("train", "test"):  # one permutation for the client's train and test
      x, y = getattr(fd, split)[c]
      xb, yb = getattr(base, split)[c]
      np.testing.assert_array_equal(y, yb)
      np.testing.assert_array_equal(x.reshape(len(x), -1), xb.reshape(len(xb), -1)[:, perm])
  assert len({tuple(p) for p in perms.values()}) == 100


# ------------------------------------------------------------------- FEMNIST
def _leaf_writers(directory, split):
  users = {}
  for path in sorted(glob.glob(os.path.join(directory, split, "*.json"))):
    with open(path) as f:
      obj = json.load(f)
    for u in obj["users"]:
      users[u] = obj["user_data"][u]
  return users


@pytest.fixture(scope="module")
def femnist_all(femnist_dir):
  return femnist.load_femnist(femnist_dir, num_clients=None)


def test_femnist_writers_are_clients_digits_only(femnist_dir, femnist_all):
  fd = femnist_all
  assert fd.num_classes == 10 and fd.input_shape == (28, 28)
  # data/README.md: 104 writers with a digit; train 10,596 / test 1,180 digits.
  assert len(fd.client_ids) == 104
  assert fd.pooled("train")[1].size == 10596 and fd.pooled("test")[1].size == 1180
  train = _leaf_writers(femnist_dir, "train")
  assert len(train) == 105
  for c in fd.client_ids:
    ys = np.asarray(train[c]["y"])
    assert fd.num_examples(c) == int(np.sum(ys < 10)) > 0  # the writer's digits, all of them
    for split in ("train", "test"):
      y = getattr(fd, split)[c][1]
      assert y.size == 0 or (y.min() >= 0 and y.max() <= 9)
  assert set(train) - set(fd.client_ids) == {
      w for w, d in train.items() if not any(v < 10 for v in d["y"])
  }


def test_femnist_pixels_inverted_as_stated(femnist_dir, femnist_all):
  fd = femnist_all
  raw_input = fd.raw_input
  assert raw_input.invert and raw_input.dtype == "float32" and "1 - pixel" in raw_input.description
  test = _leaf_writers(femnist_dir, "test")
  checked = 0
  for c in fd.client_ids[:10]:
    if c not in test:
      continue
    ys = np.asarray(test[c]["y"])
    raw = np.asarray(test[c]["x"], np.float32)[ys < 10].reshape(-1, 28, 28)
    np.testing.assert_array_equal(fd.test[c][0], 1.0 - raw)  # x = 1 - LEAF's pixel
    np.testing.assert_array_equal(fd.test[c][0], raw_input.apply(raw))
    checked += 1
  assert checked >= 5
  x = fd.pooled("train")[0]
  # MNIST's convention after the inversion: the background 0, the ink bright.
  assert 0.0 <= x.min() and x.max() <= 1.0 and float(np.mean(x == 0.0)) > 0.5
  assert float(x.mean()) < 0.1


# ------------------------------------------------------------- preset smoke runs
# Cheap versions of the presets: their defaults (network, learning rates, batch
# size) with few clients per round, rounds and local epochs; VIRTUAL (the default
# algorithm) on every row. femnist_conv learns at its default init_scale (0.005 for
# the conv net: at 0.05 it stayed at chance, docs/virtual.md "Initial scale").
# Local epochs: ~30-50 local steps per client (MNIST: 600 examples a client, FEMNIST
# here ~100).
# S and MT over every client are evaluated once, after the last round (the FEMNIST
# evaluation is most of such a run's time); the training loss is there every round.
# No --output_dir: the driver's rows (each round's training loss, `round_hook`) and its
# summary (the final S) are read in-process, not from files (checkpoint, curves.png,
# TensorBoard; their writing is test_outputs.py's and test_state_files.py's).
SMOKE = dict(rounds=3, clients_per_round=3, export=False, eval_every=3)
SMOKE_RUNS = {  # preset: (data folder, algorithm, local epochs, evaluation flags)
    "mnist": ("mnist", "virtual", 1, {}),
    "pmnist": ("mnist", "virtual", 2, {}),
    "femnist_mlp": ("femnist", "virtual", 10, {}),
    # The conv row evaluates at the posterior means: its 10-sample predictive over
    # the 100 writers was half of this test's time, and the conv net's sampled
    # evaluation is checked by test_virtual_architectures.py[conv].
    "femnist_conv": ("femnist", "virtual", 5, dict(eval_samples=0)),
}


@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_preset_trains_at_its_defaults(name, tff_runtime):
  from tfbfl import driver  # pylint: disable=g-import-not-at-top

  folder, algorithm, epochs, evaluation = SMOKE_RUNS[name]
  directory = real_data_dir(folder)
  params = dict(presets.preset(name), algorithm=algorithm, data_dir=directory)
  params.update(SMOKE, **evaluation, epochs_per_round=epochs)
  rows = []
  summary = driver.run_training(params, round_hook=lambda r, row: rows.append(dict(row, round=r)))
  assert [r["round"] for r in rows] == list(range(1, SMOKE["rounds"] + 1))
  loss = [float(r["train_loss"]) for r in rows]
  accuracy = float(summary["final_server_accuracy"])  # S after the last round
  assert len(loss) == SMOKE["rounds"] and np.all(np.isfinite(loss))
  assert loss[-1] < 0.9 * loss[0], (name, loss, accuracy)
  if name != "pmnist":  # PMNIST's S: one server model for 100 permutations, ~chance early
    assert accuracy > 0.2, (name, loss, accuracy)  # above chance (0.1)

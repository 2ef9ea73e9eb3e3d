"""FEMNIST: federated EMNIST, one client per writer, in its two published forms.

1. LEAF JSON (Caldas et al., 2018; https://github.com/TalwalkarLab/leaf,
   `data/femnist`, produced by its `preprocess.sh`):

       data_dir/train/*.json   e.g. all_data_0_niid_0_keep_0_train_9.json
       data_dir/test/*.json

   with the LEAF keys (`tfbfl.data.leaf`): user_data[writer]["x"] is a list
   of 784 floats in [0, 1] (a 28 x 28 image, row-major; NIST background is
   1.0, ink near 0), ["y"] an int class: 0-9 digits, 10-35 upper case, 36-61
   lower case letters.

2. TensorFlow Federated HDF5 (`tff.simulation.datasets.emnist`, archives
   `fed_emnist_digitsonly.tar.bz2` and `fed_emnist.tar.bz2` unpacked):

       data_dir/fed_emnist_digitsonly_train.h5   (10 classes), and _test.h5
       data_dir/fed_emnist_train.h5              (62 classes), and _test.h5

   each with groups `examples/<writer>/pixels` (float32 [n, 28, 28] in
   [0, 1]) and `examples/<writer>/label` (int [n]).

`form="auto"` uses the HDF5 files when the pair needed is in `data_dir`
(for `digits_only`: the digitsonly pair, else the full pair filtered), and
the LEAF directories otherwise.

Convention (VIRTUAL Sec. V: "We subsample 100 random writers and use only the
10 digit labels. Train and test split is provided by the distribution"):

* clients are the writers of the train files having at least one train
  example (a digit when `digits_only`); `num_clients` of them are drawn with
  `seed` (`_files.select_clients`; None keeps all);
* with `digits_only` only labels 0-9 are kept (10 classes), else 62;
* the distribution's own train/test split is used; a writer with no test
  example (or absent from the test files) gets an empty test set, writers
  only in the test files are ignored;
* preprocessing (stated as data in the result's `raw_input`, which exports
  apply inside the SavedModel): both forms publish float32 pixels in [0, 1]
  with 1.0 the background and the ink dark (TFF's files are derived from
  LEAF's); the loader inverts them, x = 1 - pixel, to MNIST's convention (ink
  bright, background 0), and does nothing else. x is float32 [n, 28, 28]
  (input_shape (28, 28); the MLP models flatten, the CNN reads it as an
  image). `invert=False` keeps the pixels as published.

Why the inversion (measured on the real LEAF sample in ../shared/data/femnist,
100 writers, digits): with LEAF's convention 91% of the pixels are 1.0 and
the mean squared norm of an input is 747 (22 inverted; MNIST's is 88), so an
SGD step moves every first-layer pre-activation along the common all-ones
direction ~34 times further than the ink does. At the default client lr 0.05
(E = 20, B = 20, 2x100 ReLU MLP) 95% of the first layer's ReLUs end dead on
every example of a client (84% after one pooled epoch), local training stays
at loss 2.2 and FedAvg/VIRTUAL at chance (S 0.10-0.18 after 3 rounds).
Inverted: 2% dead, local train accuracy 0.94, pooled test accuracy 0.87
after one epoch, and FedAvg/VIRTUAL learn at the defaults.
"""

import os

import numpy as np

from tfbfl.data import _files
from tfbfl.data import errors
from tfbfl.data import federated
from tfbfl.data import leaf
from tfbfl.data import preprocessing

IMAGE_SHAPE = (28, 28)
NUM_DIGITS = 10
NUM_CLASSES = 62
FORMS = ("auto", "leaf", "tff")
TFF_FILES = {
    True: ("fed_emnist_digitsonly_train.h5", "fed_emnist_digitsonly_test.h5"),
    False: ("fed_emnist_train.h5", "fed_emnist_test.h5"),
}
LAYOUT = ("LEAF: <data_dir>/train/*.json and <data_dir>/test/*.json; or TFF: "
          "<data_dir>/fed_emnist_digitsonly_{train,test}.h5 (digits) or "
          "<data_dir>/fed_emnist_{train,test}.h5 (62 classes)")
SOURCE = ("FEMNIST is published by LEAF (https://github.com/TalwalkarLab/leaf, "
          "data/femnist: run ./preprocess.sh) and by TensorFlow Federated "
          "(https://storage.googleapis.com/tff-datasets-public/"
          "fed_emnist_digitsonly.tar.bz2 and fed_emnist.tar.bz2).")


def _tff_pair(directory, digits_only):
  """The (train, test) HDF5 paths to use, or None when no train file exists."""
  candidates = [TFF_FILES[True], TFF_FILES[False]] if digits_only else [TFF_FILES[False]]
  for train_name, test_name in candidates:
    train = os.path.join(directory, train_name)
    if os.path.isfile(train):
      test = os.path.join(directory, test_name)
      if not os.path.isfile(test):
        raise errors.missing_file(
            test, f"FEMNIST TFF test file {test_name}",
            f"It is published with {train_name}. Expected layout: {LAYOUT}. "
            f"{SOURCE}")
      return train, test
  return None


def _keep(labels, digits_only):
  return labels < NUM_DIGITS if digits_only else np.ones(labels.shape, bool)


def _check_labels(labels, path, client, num_classes):
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(f"{path!r}: writer {client!r} has labels in [{labels.min()}, "
                     f"{labels.max()}]; expected 0..{num_classes - 1}.")


# ------------------------------------------------------------------ TFF HDF5


def _open_h5(path):
  import h5py  # pylint: disable=g-import-not-at-top
  try:
    f = h5py.File(path, "r")
  except OSError as e:
    raise ValueError(f"{path!r} is not a readable HDF5 file (truncated or corrupted: {e}).") from e
  if "examples" not in f:
    f.close()
    raise ValueError(f"{path!r} has no 'examples' group; expected TFF's layout "
                     "examples/<writer>/{pixels,label}.")
  return f


def _h5_client(path, examples, client, num_classes, read_pixels=True):
  try:
    group = examples[client]
    labels = np.asarray(group["label"][()]).astype(np.int64).reshape(-1)
    pixels = np.asarray(group["pixels"][()], np.float32) if read_pixels else None
  except (KeyError, OSError, ValueError) as e:
    raise ValueError(f"{path!r}: writer {client!r} must have datasets 'pixels' "
                     f"[n, 28, 28] and 'label' [n] ({e}).") from e
  _check_labels(labels, path, client, num_classes)
  if pixels is not None and (pixels.shape != (labels.size,) + IMAGE_SHAPE):
    raise ValueError(f"{path!r}: writer {client!r} has pixels of shape {pixels.shape} for "
                     f"{labels.size} labels; expected [n, 28, 28].")
  return pixels, labels


def _read_tff(train_path, test_path, digits_only, num_clients, seed):
  file_classes = NUM_DIGITS if "digitsonly" in train_path else NUM_CLASSES
  with _open_h5(train_path) as f:
    ex = f["examples"]
    counts = {
        c:
            int(
                _keep(
                    _h5_client(train_path, ex, c, file_classes, read_pixels=False)[1],
                    digits_only).sum()) for c in ex
    }
    chosen = _files.select_clients([c for c, n in counts.items() if n > 0], num_clients, seed,
                                   "femnist")
    train = {c: _h5_client(train_path, ex, c, file_classes) for c in chosen}
  with _open_h5(test_path) as f:
    ex = f["examples"]
    test = {c: _h5_client(test_path, ex, c, file_classes) for c in chosen if c in ex}
  return train, test


# ----------------------------------------------------------------- LEAF JSON


def _leaf_labels(path, user, data):
  labels = _files.as_int_array(data["y"], path, f"labels of writer {user!r}")
  _check_labels(labels, path, user, NUM_CLASSES)
  return labels


def _leaf_example(path, user, data):
  labels = _leaf_labels(path, user, data)
  try:
    pixels = np.asarray(data["x"], dtype=np.float32)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{path!r}: writer {user!r} has images that are not lists of 784 "
                     f"numbers ({e}).") from e
  if pixels.shape != (labels.size, 784):
    raise ValueError(f"{path!r}: writer {user!r} has images of shape {pixels.shape}; "
                     "expected one list of 784 pixels per example.")
  return pixels.reshape((-1,) + IMAGE_SHAPE), labels


def _concat(chunks):
  return (np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks]))


def _read_leaf(directory, digits_only, num_clients, seed):
  train_paths, test_paths = leaf.require_files(directory, "femnist", LAYOUT, SOURCE)
  counts = leaf.scan(train_paths,
                     lambda p, u, d: int(_keep(_leaf_labels(p, u, d), digits_only).sum()))
  chosen = _files.select_clients([c for c, n in counts.items() if n > 0], num_clients, seed,
                                 "femnist")
  train = {c: _concat(v) for c, v in leaf.collect(train_paths, chosen, _leaf_example).items()}
  test = {c: _concat(v) for c, v in leaf.collect(test_paths, chosen, _leaf_example).items()}
  return train, test


# -------------------------------------------------------------------- public


def load_femnist(data_dir,
                 *,
                 num_clients=100,
                 digits_only=True,
                 seed=0,
                 form="auto",
                 invert=True):
  """FEMNIST by writer (see the module docstring for files and convention).

  Args:
    data_dir: directory of the LEAF `train/` and `test/` folders or of the
      TFF `.h5` files.
    num_clients: writers drawn with `seed` (None: all writers).
    digits_only: keep the 10 digit classes (VIRTUAL) or all 62.
    seed: int seed of the writer draw.
    form: "auto", "leaf" or "tff".
    invert: x = 1 - pixel (default: ink bright, background 0, as MNIST; the
      models train at their defaults only so, see the module docstring);
      False keeps the published pixels (1.0 = background).

  Returns:
    A `FederatedData`, input_shape (28, 28), 10 or 62 classes, clients named
    by their writer ids; `raw_input` states the preprocessing.

  Raises:
    MissingDataError: no file of the form asked for (message names the
      paths, the layouts and the publishers).
    ValueError: naming the file, for a truncated/corrupted file, a wrong
      structure, image shape or label; `num_clients` above the writers
      available.
  """
  if form not in FORMS:
    raise ValueError(f"`form` must be one of {FORMS}, got {form!r}.")
  directory = _files.require_data_dir(data_dir, "femnist", LAYOUT, SOURCE)
  pair = _tff_pair(directory, digits_only) if form != "leaf" else None
  if form == "tff" and pair is None:
    shown = os.path.join(directory, TFF_FILES[digits_only][0])
    if digits_only:
      shown += f" (or {TFF_FILES[False][0]})"
    raise errors.missing_file(shown, "FEMNIST TFF train file",
                              f"Expected layout: {LAYOUT}. {SOURCE}")
  if pair is not None:
    train, test = _read_tff(pair[0], pair[1], digits_only, num_clients, seed)
  else:
    train, test = _read_leaf(directory, digits_only, num_clients, seed)

  raw_input = preprocessing.leaf_femnist_raw_input(invert)
  xs, ys, xts, yts = {}, {}, {}, {}
  for c, (x, y) in train.items():
    keep = _keep(y, digits_only)
    xs[c], ys[c] = raw_input.apply(x[keep]), y[keep]
    xt, yt = test.get(c, (np.zeros((0,) + IMAGE_SHAPE, np.float32), np.zeros((0,), np.int64)))
    keep = _keep(yt, digits_only)
    xts[c], yts[c] = raw_input.apply(xt[keep]), yt[keep]
  fd = federated.from_client_arrays(xs,
                                    ys,
                                    xts,
                                    yts,
                                    num_classes=NUM_DIGITS if digits_only else NUM_CLASSES,
                                    name="femnist" if digits_only else "femnist62")
  fd.raw_input = raw_input
  return fd

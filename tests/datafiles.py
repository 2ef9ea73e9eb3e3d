"""Tiny dataset files in the publishers' real formats, written by the tests."""

import gzip
import os

import numpy as np


def write_idx(path, array, gz=False):
  """An IDX file (MNIST's format): magic 0x0803/0x0801, big-endian dims, bytes."""
  array = np.ascontiguousarray(array, dtype=np.uint8)
  header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  opener = gzip.open if gz else open
  with opener(path, "wb") as f:
    f.write(header + array.tobytes())


def make_mnist_arrays(n_train=200, n_test=50, seed=0):
  rng = np.random.default_rng(seed)
  out = {}
  for split, n in (("train", n_train), ("t10k", n_test)):
    out[split] = (rng.integers(0, 256, size=(n, 28, 28),
                               dtype=np.uint8), np.arange(n, dtype=np.uint8) % 10)
  return out


def write_mnist(directory, arrays, gz=False):
  """The four MNIST files under their publisher's names."""
  os.makedirs(directory, exist_ok=True)
  for split, (x, y) in arrays.items():
    suffix = ".gz" if gz else ""
    write_idx(os.path.join(directory, f"{split}-images-idx3-ubyte{suffix}"), x, gz)
    write_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte{suffix}"), y, gz)
  return str(directory)


def truncate_file(path):
  """Cuts the file at `path` to the first half of its bytes (an interrupted copy)."""
  with open(path, "rb") as f:
    content = f.read()
  with open(path, "wb") as f:
    f.write(content[:len(content) // 2])


# ------------------------------------------------------------- real data files
# The real copies of the papers' data sets lie beside the repository, in
# ../shared/data/<name> (its README lists them); CI has them, a fresh clone may
# not. Every test on real data finds them here and skips, naming the folder,
# where they are absent.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL_DATA_ROOT = os.path.normpath(os.path.join(ROOT, os.pardir, "shared", "data"))

# Files each real data set must hold for its tests to run.
REAL_DATA_FILES = {
    "mnist": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
    "femnist": ("train", "test"),
}


def real_data_path(name):
  """`../shared/data/<name>` relative to the repository root (may not exist)."""
  return os.path.join(REAL_DATA_ROOT, name)


def real_data_dir(name):
  """The real data folder `../shared/data/<name>`; skips the calling test, with
  the reason naming the folder (or the missing file), where it is absent."""
  import pytest  # pylint: disable=g-import-not-at-top
  path = real_data_path(name)
  if not os.path.isdir(path):
    pytest.skip(f"real {name} data not here: {path} does not exist (real copies of the "
                "papers' data sets live in ../shared/data beside the repository)")
  for f in REAL_DATA_FILES.get(name, ()):
    if not os.path.exists(os.path.join(path, f)):
      pytest.skip(f"real {name} data incomplete: {os.path.join(path, f)} does not exist")
  return path

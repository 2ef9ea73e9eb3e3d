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

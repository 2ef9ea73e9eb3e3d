"""CIFAR-10 from the publisher's python batches (Krizhevsky, 2009).

Publisher's layout (`cifar-10-python.tar.gz` unpacked in `data_dir`, or
`data_dir` may be the unpacked folder itself):

    data_dir/cifar-10-batches-py/data_batch_1 ... data_batch_5   10000 each
    data_dir/cifar-10-batches-py/test_batch                      10000

Each batch is a pickled dict (Python 2 cPickle, protocol 2; keys are bytes
when read with `encoding="bytes"`, str keys are accepted too):

* `data`: uint8 array [n, 3072]; each row is a 32 x 32 colour image, the
  1024 red values first, then green, then blue, each plane row-major;
* `labels`: list of n ints in 0..9;
* `batch_label`, `filenames`: ignored.

The batches are read with `tfbfl.data.safe_pickle.RestrictedUnpickler`,
which admits only the numpy array globals the format needs and refuses
any other class or callable (`UnsafePickleError`, a ValueError), so a
tampered file cannot run code. A truncated or corrupted batch, a wrong
`data` dtype/shape or a label outside 0..9 raise ValueError naming the file.
Checksums: the publisher gives the MD5 of the tar.gz only
(c58f30108f718f92721af3b95e74349a). `verify_checksums=True` compares each
batch with the per-batch MD5 digests widely published for the canonical
files (`BATCH_MD5`) before unpickling it; off by default.

Convention: images become float32 [n, 32, 32, 3] in [0, 1] (channels last,
pixel / 255). The 50000 train images are federated by the partitioners and
the 10000 test images spread over the same clients by
`tfbfl.data.official_split` (as for MNIST); `test_source="pooled"` instead
pools all 60000 and splits each client by `test_fraction`.
"""

import os

import numpy as np

from tfbfl.data import _files
from tfbfl.data import official_split
from tfbfl.data import safe_pickle

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)
TEST_SOURCES = official_split.TEST_SOURCES
ARCHIVE_MD5 = "c58f30108f718f92721af3b95e74349a"  # cifar-10-python.tar.gz
# MD5 of the canonical batch files (not given by the publisher).
BATCH_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
LAYOUT = (f"<data_dir>/{FOLDER}/{{data_batch_1, ..., data_batch_5, "
          "test_batch}")
SOURCE = ("CIFAR-10 is published by Alex Krizhevsky at "
          "https://www.cs.toronto.edu/~kriz/cifar.html (file "
          "cifar-10-python.tar.gz, 'CIFAR-10 python version').")


def _get(batch, key):
  for k in (key, key.encode()):
    if k in batch:
      return batch[k]
  return None


def read_batch(path):
  """Reads one batch; returns (x float32 [n, 32, 32, 3] in [0, 1], y int32 [n])."""
  batch = safe_pickle.load(path, encoding="bytes")
  if not isinstance(batch, dict):
    raise ValueError(f"{path!r} holds a {type(batch).__name__}; expected a dict with keys "
                     "'data' and 'labels'.")
  data, labels = _get(batch, "data"), _get(batch, "labels")
  if data is None or labels is None:
    raise ValueError(f"{path!r} has keys {sorted(map(str, batch))[:5]}; expected 'data' "
                     "and 'labels'.")
  if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or
      data.shape[1] != int(np.prod(IMAGE_SHAPE))):
    raise ValueError(f"{path!r}: 'data' must be a uint8 array [n, 3072], got "
                     f"{getattr(data, 'dtype', type(data).__name__)} of shape "
                     f"{getattr(data, 'shape', None)}.")
  y = _files.as_int_array(np.asarray(labels).reshape(-1), path, "labels")
  if y.size != data.shape[0]:
    raise ValueError(f"{path!r} has {data.shape[0]} images but {y.size} labels.")
  if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
    raise ValueError(f"{path!r} has labels in [{y.min()}, {y.max()}]; expected 0..9.")
  x = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return x.astype(np.float32) / np.float32(255.0), y.astype(np.int32)


def _folder(directory):
  nested = os.path.join(directory, FOLDER)
  if os.path.isdir(nested):
    return nested
  if os.path.isfile(os.path.join(directory, TRAIN_FILES[0])):
    return directory  # data_dir is the unpacked folder itself
  return nested


def load_cifar10_arrays(data_dir, *, verify_checksums=False):
  """Reads all six batches; returns (x_train, y_train, x_test, y_test)."""
  directory = _files.require_data_dir(data_dir, "cifar10", LAYOUT, SOURCE)
  folder = _folder(directory)
  paths = [
      _files.find_file(folder, name, what=f"CIFAR-10 batch {name}", layout=LAYOUT, source=SOURCE)
      for name in TRAIN_FILES + (TEST_FILE,)
  ]
  if verify_checksums:
    for path in paths:
      _files.check_md5(path, BATCH_MD5[os.path.basename(path)], "the canonical file")
  train = [read_batch(p) for p in paths[:-1]]
  xt, yt = read_batch(paths[-1])
  return (np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train]), xt, yt)


def load_cifar10(data_dir,
                 *,
                 partition="class_dirichlet",
                 num_clients=10,
                 alpha=0.5,
                 min_size=10,
                 classes_per_client=2,
                 test_fraction=0.25,
                 seed=0,
                 test_source="official",
                 verify_checksums=False):
  """CIFAR-10 federated by `partition` (see the module docstring).

  Arguments as `tfbfl.data.mnist.load_mnist`. Returns a `FederatedData` with
  input_shape (32, 32, 3) and 10 classes.
  """
  return official_split.federate_published(
      lambda: load_cifar10_arrays(data_dir, verify_checksums=verify_checksums),
      test_source=test_source,
      name=f"cifar10/{partition}",
      num_classes=NUM_CLASSES,
      partition=partition,
      num_clients=num_clients,
      alpha=alpha,
      min_size=min_size,
      classes_per_client=classes_per_client,
      test_fraction=test_fraction,
      seed=seed)

"""MNIST from the publisher's IDX files (LeCun, Cortes and Burges).

Publisher's layout, all four files directly in `data_dir`, each either
gzipped as published (`.gz`) or uncompressed (the uncompressed one is used
when both exist):

    data_dir/train-images-idx3-ubyte[.gz]   60000 x 28 x 28 uint8
    data_dir/train-labels-idx1-ubyte[.gz]   60000 uint8 in 0..9
    data_dir/t10k-images-idx3-ubyte[.gz]    10000 x 28 x 28 uint8
    data_dir/t10k-labels-idx1-ubyte[.gz]    10000 uint8 in 0..9

IDX format: a big-endian header of two zero bytes, a type byte (0x08 =
unsigned byte), a byte giving the number of dimensions d, then d big-endian
uint32 sizes, then the values in row-major order. Image files therefore start
with the magic number 2051 (0x00000803), label files with 2049
(0x00000801). The reader checks the magic number, that the size of the data
equals the header's dimensions (a truncated or over-long file raises
ValueError naming the file), 28 x 28 images, labels in 0..9, and equal
example counts in an images/labels pair.

Checksums: the publisher gives none. `verify_checksums=True` compares the MD5
of each `.gz` file with the digest widely published for the canonical files
(`GZ_MD5`); an uncompressed file cannot be verified and raises ValueError in
that mode. Off by default.

Preprocessing (stated as data in the result's `raw_input`, a
`tfbfl.data.preprocessing.RawInput`, which exports apply inside the SavedModel):
the uint8 pixels (0 = background, 255 = ink) become float32 [n, 28, 28] in
[0, 1], x = pixel / 255; nothing else (no centering, no standardisation); the
MLP models flatten them. PMNIST (partition "permuted") then permutes each
client's pixels (`raw_input.client_permutations`).

The train set is federated by the partitioners and
the official test set spread over the same clients by
`tfbfl.data.official_split` (homogeneous: 600 train / 100 test per client
with 100 clients, as VIRTUAL's MNIST; label-skewed partitions: each client's
test labels follow its train labels). `test_source="pooled"` instead pools
the 70000 examples and splits every client by `test_fraction`.
"""

import os

import numpy as np

from tfbfl.data import _files
from tfbfl.data import official_split
from tfbfl.data import preprocessing

NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28)
IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# MD5 of the gzipped files as published (no official checksums exist).
GZ_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
LAYOUT = ("<data_dir>/{train-images-idx3-ubyte, train-labels-idx1-ubyte, "
          "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte}, each optionally "
          "with .gz")
SOURCE = ("MNIST is published by Yann LeCun, Corinna Cortes and Christopher "
          "Burges at http://yann.lecun.com/exdb/mnist/ (mirrors: "
          "https://ossci-datasets.s3.amazonaws.com/mnist/).")
TEST_SOURCES = official_split.TEST_SOURCES

# IDX type byte -> big-endian numpy dtype.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(data, path):
  """Parses the IDX bytes `data` read from `path`; returns (magic, array).

  Raises:
    ValueError: naming `path`, for a bad header, an unknown type byte, or a
      data size other than the header's dimensions (truncated file).
  """
  if len(data) < 4:
    raise ValueError(f"{path!r} is truncated: {len(data)} bytes, shorter than the 4-byte "
                     "IDX magic number.")
  if data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
    raise ValueError(f"{path!r} is not an IDX file: magic bytes {data[:4].hex()}, expected "
                     "00 00 <type> <ndim>.")
  magic = int.from_bytes(data[:4], "big")
  ndim = data[3]
  header = 4 + 4 * ndim
  if len(data) < header:
    raise ValueError(f"{path!r} is truncated: {len(data)} bytes, shorter than its "
                     f"{header}-byte IDX header.")
  dims = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
  dtype = np.dtype(_IDX_TYPES[data[2]])
  expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
  if len(data) != expected:
    state = "truncated" if len(data) < expected else "longer than its header"
    raise ValueError(f"{path!r} is {state}: {len(data)} bytes, but its IDX header "
                     f"(dimensions {dims}) implies {expected} bytes.")
  return magic, np.frombuffer(data, dtype, offset=header).reshape(dims)


def _read(directory, key, magic, verify_checksums):
  name = FILES[key]
  path = _files.find_file(directory,
                          name,
                          what=f"MNIST file {name}",
                          layout=LAYOUT,
                          source=SOURCE,
                          allow_gz=True)
  if verify_checksums:
    base = os.path.basename(path)
    if base not in GZ_MD5:
      raise ValueError(f"{path!r}: checksums are known only for the gzipped files as "
                       f"published ({name}.gz); keep the .gz file or set "
                       "verify_checksums=False.")
    _files.check_md5(path, GZ_MD5[base], "the published file")
  found, array = parse_idx(_files.read_bytes(path), path)
  if found != magic:
    raise ValueError(f"{path!r} has IDX magic number {found}, expected {magic} "
                     f"({'images' if magic == IMAGES_MAGIC else 'labels'}, unsigned "
                     "bytes).")
  return path, array


def load_mnist_arrays(data_dir, *, verify_checksums=False):
  """Reads the four IDX files; returns (x_train, y_train, x_test, y_test).

  x: float32 [n, 28, 28] in [0, 1]; y: int32 [n] in 0..9.

  Raises:
    MissingDataError: `data_dir` or a file is missing (message names it, the
      layout and the publisher's URL).
    ValueError: naming the file, for a truncated/corrupted file, a wrong
      magic number, image size or label value, mismatched counts, or (with
      `verify_checksums`) a wrong digest.
  """
  directory = _files.require_data_dir(data_dir, "mnist", LAYOUT, SOURCE)
  out = []
  for split in ("train", "test"):
    ipath, images = _read(directory, f"{split}_images", IMAGES_MAGIC, verify_checksums)
    lpath, labels = _read(directory, f"{split}_labels", LABELS_MAGIC, verify_checksums)
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
      raise ValueError(f"{ipath!r} holds images of shape {images.shape[1:]}, expected "
                       f"{IMAGE_SHAPE}.")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
      raise ValueError(f"{lpath!r} holds {labels.shape} labels but {ipath!r} holds "
                       f"{images.shape[0]} images; expected one label per image.")
    if labels.size and labels.max() >= NUM_CLASSES:
      raise ValueError(f"{lpath!r} has a label {labels.max()}; expected labels in 0..9.")
    out.append(images.astype(np.float32) / np.float32(255.0))
    out.append(labels.astype(np.int32))
  return tuple(out)


def load_mnist(data_dir,
               *,
               partition="homogeneous",
               num_clients=100,
               alpha=0.5,
               min_size=10,
               classes_per_client=2,
               test_fraction=0.25,
               seed=0,
               test_source="official",
               verify_checksums=False,
               name=None):
  """MNIST federated by `partition` (see the module docstring).

  Args:
    data_dir: directory holding the four IDX files.
    partition: a name in `tfbfl.data.PARTITIONS`.
    num_clients, alpha, min_size, classes_per_client: partition arguments.
    test_fraction: per-client held-out fraction, used only with
      `test_source="pooled"`.
    seed: int; the same seed gives identical data.
    test_source: "official" (default): partition the train set and spread the
      official test set over the clients (`official_split`); "pooled": pool
      train and test, partition, split each client by `test_fraction`.
    verify_checksums: check the MD5 of the `.gz` files (see module docstring).
    name: dataset name; default `mnist/<partition>`.

  Returns:
    A `FederatedData` with input_shape (28, 28) and 10 classes.
  """
  fd = official_split.federate_published(
      lambda: load_mnist_arrays(data_dir, verify_checksums=verify_checksums),
      test_source=test_source,
      name=name or f"mnist/{partition}",
      num_classes=NUM_CLASSES,
      partition=partition,
      num_clients=num_clients,
      alpha=alpha,
      min_size=min_size,
      classes_per_client=classes_per_client,
      test_fraction=test_fraction,
      seed=seed)
  perms = {}
  if partition == "permuted":  # both test sources derive them alike (`federate`)
    perms = official_split.client_permutations(fd.client_ids, 784, seed)
  fd.raw_input = preprocessing.mnist_raw_input(IMAGE_SHAPE, perms)
  return fd

"""File helpers shared by the dataset loaders: locating, opening, selecting.

Conventions every loader follows:

* nothing is downloaded: a missing file raises `MissingDataError` (a
  `FileNotFoundError`) naming the path, the expected layout and where the
  publisher distributes it;
* a file that exists but cannot be parsed (truncated, corrupted, wrong
  content) raises `ValueError` naming the file and what is wrong;
* natural federated datasets (writers, subjects, sensors, roles) pick
  `num_clients` of their clients with `select_clients`.
"""

import gzip
import numbers
import os
import zlib

import numpy as np

from tfbfl.data import _seeds
from tfbfl.data import errors


def require_data_dir(data_dir, dataset, layout, source):
  """Returns `data_dir` as a str; None or a missing directory raises.

  Args:
    data_dir: the `--data_dir` value.
    dataset: the dataset name, for the message.
    layout: the expected layout, one line.
    source: where the publisher distributes the files, one line.

  Raises:
    MissingDataError: `data_dir` is None or not a directory.
  """
  if data_dir is None:
    raise errors.MissingDataError(
        f"Dataset {dataset!r} reads its files from `data_dir` (--data_dir), "
        f"got None. Expected layout: {layout}. {source} Nothing is "
        "downloaded at run time; see data/README.md.")
  data_dir = os.fspath(data_dir)
  if not os.path.isdir(data_dir):
    raise errors.missing_file(data_dir, f"{dataset} data directory",
                              f"Expected layout: {layout}. {source} See data/README.md.")
  return data_dir


def find_file(directory, name, *, what, layout, source, allow_gz=False):
  """Returns the path of `directory/name` (or `name.gz` when `allow_gz`).

  The uncompressed file is preferred when both exist.

  Raises:
    MissingDataError: naming the path(s) looked for, the layout and source.
  """
  path = os.path.join(directory, name)
  if os.path.isfile(path):
    return path
  if allow_gz and os.path.isfile(path + ".gz"):
    return path + ".gz"
  shown = f"{path}[.gz]" if allow_gz else path
  raise errors.missing_file(shown, what, f"Expected layout: {layout}. {source} See data/README.md.")


def read_bytes(path):
  """The content of `path`, gunzipped when it ends in `.gz`.

  Raises:
    ValueError: naming the file when the gzip stream is truncated or corrupt.
  """
  if not path.endswith(".gz"):
    with open(path, "rb") as f:
      return f.read()
  try:
    with gzip.open(path, "rb") as f:
      return f.read()
  except (EOFError, OSError, zlib.error) as e:
    raise ValueError(f"{path!r} is not a complete gzip file (truncated or corrupted: {e}); "
                     "download it again.") from e


def read_text(path):
  """The content of the text file `path` (UTF-8), as a str."""
  data = read_bytes(path)
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path!r} is not a UTF-8 text file: {e}") from e


def select_clients(client_ids, num_clients, seed, dataset):
  """Picks `num_clients` of the natural clients `client_ids`, sorted.

  Convention: `num_clients=None` keeps every client; otherwise
  `num_clients` distinct clients are drawn uniformly without replacement from
  the sorted ids with `np.random.default_rng(seed)`, so the same seed gives
  the same clients. Asking for all of them returns all, in sorted order.

  Raises:
    ValueError: `num_clients` is not an int >= 1 or exceeds the clients
      available (the message gives their number).
  """
  ids = sorted(client_ids)
  if not ids:
    raise ValueError(f"{dataset}: no client is left to select from.")
  if num_clients is None:
    return ids
  if (isinstance(num_clients, bool) or not isinstance(num_clients, numbers.Integral) or
      num_clients < 1):
    raise ValueError(f"`num_clients` must be an int >= 1 or None, got {num_clients!r}.")
  if num_clients > len(ids):
    raise ValueError(f"`num_clients`={num_clients} exceeds the {len(ids)} clients of "
                     f"{dataset}; expected num_clients <= {len(ids)} (or None for all).")
  if num_clients == len(ids):
    return ids
  rng = _seeds.as_generator(seed)
  chosen = rng.choice(len(ids), size=int(num_clients), replace=False)
  return sorted(ids[i] for i in chosen)


def md5_of_file(path):
  """Hex MD5 digest of the bytes of `path` as stored (not decompressed)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  digest = hashlib.md5()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def check_md5(path, expected, reference):
  """ValueError naming `path` unless its MD5 is `expected` (`reference`, e.g.
  "the published file", says where that digest comes from)."""
  digest = md5_of_file(path)
  if digest != expected:
    raise ValueError(f"{path!r} has MD5 {digest}, expected {expected} ({reference}); it "
                     "is corrupted or a different file.")


def as_int_array(values, path, what):
  """`values` (str tokens) as int64, or ValueError naming the file."""
  try:
    arr = np.asarray(values, dtype=np.float64)
  except ValueError as e:
    raise ValueError(f"{path!r}: {what} must be numbers: {e}") from e
  if arr.size and (not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr))):
    raise ValueError(f"{path!r}: {what} must be integers.")
  return arr.astype(np.int64)

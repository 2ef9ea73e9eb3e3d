"""User federated data in one `.npz` file (see data/README.md).

Array names, one pair per client `<cid>`:

* `x_<cid>`: features, shape [n, *input_shape], any real dtype (cast to float32).
* `y_<cid>`: labels, shape [n], integers in [0, num_classes).
* optionally `x_test_<cid>` and `y_test_<cid>`: the client's own test split,
  given for every client or for none. Without them each client is split into
  train/test by `test_fraction` (see `tfbfl.data.split`).
* optionally `num_classes`: a scalar int (otherwise max label + 1).

Client ids therefore must not start with `test_`. Clients are natural (one per
pair of arrays); no partitioner is applied.
"""

import os
import zipfile

import numpy as np

from tfbfl.data import errors
from tfbfl.data import federated


def load_npz(path, *, num_classes=None, test_fraction=0.25, seed=0, name=None):
  """Loads a `FederatedData` from an `.npz` file in the format above.

  Args:
    path: path of the `.npz` file.
    num_classes: overrides the file's `num_classes` array; None infers it.
    test_fraction: per-client held-out fraction when the file has no test
      arrays.
    seed: int seed of that split.
    name: dataset name; default the file name without extension.

  Raises:
    MissingDataError: (a FileNotFoundError) the file does not exist.
    ValueError: one line naming the file (and array), when it is empty, a
      `.npy` file, not a zip archive, truncated, holds pickled objects, has
      no `x_`/`y_` arrays, an `x_` without its `y_` (or the reverse), test
      arrays for only some clients, or an unknown array name; plus every check
      of `from_client_arrays`.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise errors.missing_file(path, "npz data file",
                              "Pass the path of an existing .npz file (format: data/README.md).")
  with open(path, "rb") as f:
    head = f.read(6)
  if not head:
    raise ValueError(f"{path!r} is not a readable .npz archive: the file is empty (0 bytes).")
  if head == b"\x93NUMPY":
    raise ValueError(
        f"{path!r} is not a readable .npz archive: it is a single-array .npy file; federated "
        "data is an .npz of x_<client>/y_<client> arrays (np.savez; see data/README.md).")
  if not head.startswith(b"PK"):
    raise ValueError(f"{path!r} is not a readable .npz archive (not a zip file; it starts with "
                     f"{head[:4]!r}).")
  try:
    with np.load(path, allow_pickle=False) as archive:
      arrays = {k: archive[k] for k in archive.files}
  except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, TypeError, AttributeError,
          NotImplementedError, RuntimeError, zipfile.LargeZipFile) as e:
    raise ValueError(f"{path!r} is not a readable .npz archive of plain arrays (truncated or "
                     f"corrupted?): {str(e)[:200]}") from None

  parts = {"x_test_": {}, "y_test_": {}, "x_": {}, "y_": {}}
  file_num_classes = None
  for key, value in arrays.items():
    if key == "num_classes":
      file_num_classes = _scalar_int(path, key, value)
      continue
    prefix = next((p for p in parts if key.startswith(p) and len(key) > len(p)), None)
    if prefix is None:
      raise ValueError(f"{path!r} has an unknown array {key!r}; expected only x_<client>, "
                       "y_<client>, x_test_<client>, y_test_<client> and num_classes.")
    parts[prefix][key[len(prefix):]] = value

  x, y = parts["x_"], parts["y_"]
  if not x and not y:
    raise ValueError(f"{path!r} has no x_<client>/y_<client> arrays (found "
                     f"{sorted(arrays)[:5]}); see data/README.md for the format.")
  _check_paired(path, x, y, "x_", "y_")
  xt, yt = parts["x_test_"], parts["y_test_"]
  _check_paired(path, xt, yt, "x_test_", "y_test_")
  if xt and set(xt) != set(x):
    missing = sorted(set(x) ^ set(xt))
    raise ValueError(f"{path!r}: test arrays (x_test_/y_test_) must be given for every "
                     f"client or for none; mismatched clients: {missing[:5]}.")

  if num_classes is None:
    num_classes = file_num_classes
  if name is None:
    name = os.path.splitext(os.path.basename(path))[0]
  try:
    return federated.from_client_arrays(x,
                                        y,
                                        xt or None,
                                        yt or None,
                                        num_classes=num_classes,
                                        test_fraction=test_fraction,
                                        seed=seed,
                                        name=name)
  except ValueError as e:  # name the file in every data error
    raise ValueError(f"{path!r}: {e}") from None


def _scalar_int(path, key, value):
  """A one-element integer (or integral float) array as a positive int."""
  a = np.asarray(value)
  if a.size != 1 or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
    raise ValueError(f"{path!r}: {key!r} must be one integer, got dtype {a.dtype} and "
                     f"shape {a.shape}.")
  v = a.reshape(()).item()
  if isinstance(v, float) and not (np.isfinite(v) and v.is_integer()):
    raise ValueError(f"{path!r}: {key!r} must be an integer, got {v!r}.")
  if not 1 <= int(v) <= 2**31 - 1:
    raise ValueError(f"{path!r}: {key!r} must be in [1, 2**31 - 1], got {int(v)}.")
  return int(v)


def _check_paired(path, xs, ys, x_prefix, y_prefix):
  for cid in sorted(set(xs) | set(ys)):
    if cid not in ys:
      raise ValueError(f"{path!r} has {x_prefix}{cid} without its labels {y_prefix}{cid}.")
    if cid not in xs:
      raise ValueError(f"{path!r} has {y_prefix}{cid} without its features {x_prefix}{cid}.")

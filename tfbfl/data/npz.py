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
    ValueError: naming the file and array, when it is not an npz archive, has
      no `x_`/`y_` arrays, an `x_` without its `y_` (or the reverse), test
      arrays for only some clients, or an unknown array name; plus every check
      of `from_client_arrays`.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise errors.missing_file(
        path, "npz data file",
        "Pass the path of an existing .npz file (format: data/README.md).")
  try:
    with np.load(path, allow_pickle=False) as archive:
      arrays = {k: archive[k] for k in archive.files}
  except (zipfile.BadZipFile, ValueError, OSError) as e:
    raise ValueError(
        f"{path!r} is not a readable .npz archive of plain arrays: {e}") from e

  parts = {"x_test_": {}, "y_test_": {}, "x_": {}, "y_": {}}
  file_num_classes = None
  for key, value in arrays.items():
    if key == "num_classes":
      file_num_classes = int(np.asarray(value).reshape(()))
      continue
    prefix = next((p for p in parts if key.startswith(p) and len(key) > len(p)),
                  None)
    if prefix is None:
      raise ValueError(
          f"{path!r} has an unknown array {key!r}; expected only x_<client>, "
          "y_<client>, x_test_<client>, y_test_<client> and num_classes.")
    parts[prefix][key[len(prefix):]] = value

  x, y = parts["x_"], parts["y_"]
  if not x and not y:
    raise ValueError(
        f"{path!r} has no x_<client>/y_<client> arrays (found "
        f"{sorted(arrays)[:5]}); see data/README.md for the format.")
  _check_paired(path, x, y, "x_", "y_")
  xt, yt = parts["x_test_"], parts["y_test_"]
  _check_paired(path, xt, yt, "x_test_", "y_test_")
  if xt and set(xt) != set(x):
    missing = sorted(set(x) ^ set(xt))
    raise ValueError(
        f"{path!r}: test arrays (x_test_/y_test_) must be given for every "
        f"client or for none; mismatched clients: {missing[:5]}.")

  if num_classes is None:
    num_classes = file_num_classes
  if name is None:
    name = os.path.splitext(os.path.basename(path))[0]
  return federated.from_client_arrays(
      x, y, xt or None, yt or None, num_classes=num_classes,
      test_fraction=test_fraction, seed=seed, name=name)


def _check_paired(path, xs, ys, x_prefix, y_prefix):
  for cid in sorted(set(xs) | set(ys)):
    if cid not in ys:
      raise ValueError(
          f"{path!r} has {x_prefix}{cid} without its labels {y_prefix}{cid}.")
    if cid not in xs:
      raise ValueError(
          f"{path!r} has {y_prefix}{cid} without its features {x_prefix}{cid}.")

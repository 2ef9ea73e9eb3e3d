"""Reader of LEAF JSON files (Caldas et al., 2018), shared by FEMNIST and Shakespeare.

LEAF writes each split of a dataset as one or more JSON files,
`<data_dir>/train/*.json` and `<data_dir>/test/*.json` (e.g.
`leaf/data/femnist/data/train/all_data_0_niid_0_keep_0_train_9.json`),
each an object with the keys

* `users`: list of client ids (str): writers (FEMNIST), roles (Shakespeare);
* `num_samples`: list of ints, the number of examples of each user;
* `user_data`: object user -> {"x": [...], "y": [...]} with equal lengths;
* optionally `hierarchies` (ignored).

A user's examples may be spread over several files of a split; they are
concatenated in sorted file-name order. Files are read twice (a scan of the
labels to choose clients, then a read of the chosen clients' examples), so
memory holds one file plus the chosen clients.
"""

import glob
import json
import os

from tfbfl.data import _files
from tfbfl.data import errors


def json_files(data_dir, split, *, dataset, layout, source):
  """Sorted paths of `data_dir/<split>/*.json`.

  Raises:
    MissingDataError: the directory is missing or holds no `.json` file.
  """
  directory = os.path.join(data_dir, split)
  paths = sorted(glob.glob(os.path.join(directory, "*.json")))
  if not paths:
    raise errors.missing_file(os.path.join(directory,
                                           "*.json"), f"{dataset} LEAF {split} JSON files",
                              f"Expected layout: {layout}. {source} See data/README.md.")
  return paths


def read_json(path):
  """Loads and checks one LEAF JSON file; returns (users, user_data).

  Raises:
    ValueError: naming the file, when it is not valid JSON (e.g. truncated)
      or lacks the LEAF structure (keys, per-user x/y of equal length,
      `num_samples` matching).
  """
  try:
    with open(path, "r", encoding="utf-8") as f:
      obj = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path!r} is not a complete LEAF JSON file (truncated or corrupted: "
                     f"{e}).") from e
  if not isinstance(obj, dict) or "users" not in obj or "user_data" not in obj:
    keys = sorted(obj)[:5] if isinstance(obj, dict) else type(obj).__name__
    raise ValueError(f"{path!r} is not a LEAF JSON file: expected an object with keys "
                     f"'users', 'num_samples', 'user_data', got {keys}.")
  users, user_data = obj["users"], obj["user_data"]
  if not isinstance(users, list) or not isinstance(user_data, dict):
    raise ValueError(f"{path!r}: 'users' must be a list and 'user_data' an object.")
  counts = obj.get("num_samples")
  if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
    raise ValueError(f"{path!r}: 'num_samples' must list one count per user "
                     f"({len(users)} users).")
  for i, user in enumerate(users):
    data = user_data.get(user)
    if (not isinstance(data, dict) or not isinstance(data.get("x"), list) or
        not isinstance(data.get("y"), list)):
      raise ValueError(f"{path!r}: user {user!r} has no 'user_data' entry with 'x' and "
                       "'y' lists.")
    if len(data["x"]) != len(data["y"]):
      raise ValueError(f"{path!r}: user {user!r} has {len(data['x'])} x but "
                       f"{len(data['y'])} y; expected equal lengths.")
    if counts is not None and counts[i] != len(data["y"]):
      raise ValueError(f"{path!r}: user {user!r} has num_samples {counts[i]} but "
                       f"{len(data['y'])} examples.")
  return [str(u) for u in users], user_data


def scan(paths, count_fn):
  """dict user -> sum over files of `count_fn(path, user, data)`."""
  totals = {}
  for path in paths:
    users, user_data = read_json(path)
    for user in users:
      totals[user] = totals.get(user, 0) + count_fn(path, user, user_data[user])
  return totals


def collect(paths, wanted, convert_fn):
  """dict user -> list of `convert_fn(path, user, data)` for users in `wanted`."""
  wanted = set(wanted)
  out = {}
  for path in paths:
    users, user_data = read_json(path)
    for user in users:
      if user in wanted:
        out.setdefault(user, []).append(convert_fn(path, user, user_data[user]))
  return out


def require_files(data_dir, dataset, layout, source):
  """(train_paths, test_paths) of a LEAF dataset under `data_dir`."""
  directory = _files.require_data_dir(data_dir, dataset, layout, source)
  kw = dict(dataset=dataset, layout=layout, source=source)
  return json_files(directory, "train", **kw), json_files(directory, "test", **kw)

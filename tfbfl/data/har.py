"""Human Activity Recognition: UCI HAR (6 activities) and HAPT (12), per subject.

Publisher's layouts (UCI Machine Learning Repository), unzipped into
`data_dir` (or `data_dir` may be the unzipped folder itself):

UCI HAR Dataset (Anguita et al., 2013), variant "har":

    data_dir/UCI HAR Dataset/train/X_train.txt        7352 rows x 561 floats
    data_dir/UCI HAR Dataset/train/y_train.txt        activity 1..6
    data_dir/UCI HAR Dataset/train/subject_train.txt  subject 1..30
    data_dir/UCI HAR Dataset/test/X_test.txt          2947 rows, and
    data_dir/UCI HAR Dataset/test/y_test.txt, subject_test.txt

Smartphone-Based Recognition of Human Activities and Postural Transitions
(HAPT, Reyes-Ortiz et al., 2016), variant "hapt":

    data_dir/HAPT Data Set/Train/X_train.txt          7767 rows x 561 floats
    data_dir/HAPT Data Set/Train/y_train.txt          activity 1..12
    data_dir/HAPT Data Set/Train/subject_id_train.txt subject 1..30
    data_dir/HAPT Data Set/Test/X_test.txt, y_test.txt, subject_id_test.txt

Every file is whitespace-separated text, one example per line; the three
files of a split must have the same number of lines (a shorter one, e.g.
truncated, raises ValueError naming it, as does a line with a wrong number
of values).

Convention (VIRTUAL Sec. V: "Every individual corresponds to a different
client ... a 75%-25% train-test split is performed"): the publisher's
train/test split is by subject, so it is not used; each subject's rows of
both files are pooled (train rows first, file order) into one client
`subject_<NN>`, and each client is split at random into train and
`test_fraction` test examples (`tfbfl.data.split`). Labels 1..K become
0..K-1. Features (561, already normalised to [-1, 1] by the publisher) are
kept as float32 [n, 561]. `num_clients` subjects are drawn with the seed
(None: all 30).
"""

import os

import numpy as np

from tfbfl.data import _files
from tfbfl.data import _seeds
from tfbfl.data import federated

NUM_FEATURES = 561
VARIANTS = {
    "har":
        dict(root="UCI HAR Dataset",
             num_classes=6,
             splits=(("train", "X_train.txt", "y_train.txt", "subject_train.txt"),
                     ("test", "X_test.txt", "y_test.txt", "subject_test.txt")),
             source=("UCI HAR is published at https://archive.ics.uci.edu/dataset/"
                     "240/human+activity+recognition+using+smartphones (file "
                     "'UCI HAR Dataset.zip').")),
    "hapt":
        dict(root="HAPT Data Set",
             num_classes=12,
             splits=(("Train", "X_train.txt", "y_train.txt", "subject_id_train.txt"),
                     ("Test", "X_test.txt", "y_test.txt", "subject_id_test.txt")),
             source=("HAPT is published at https://archive.ics.uci.edu/dataset/341/"
                     "smartphone+based+recognition+of+human+activities+and+postural"
                     "+transitions (unzip into 'HAPT Data Set').")),
}


def _layout(variant):
  v = VARIANTS[variant]
  return "; ".join(
      f"<data_dir>/{v['root']}/{s}/{{{x}, {y}, {sub}}}" for s, x, y, sub in v["splits"])


def read_table(path, num_columns, what):
  """Whitespace-separated numbers of `path` as float64 [lines, num_columns].

  Raises:
    ValueError: naming the file and line, for a line with another number of
      values (e.g. a truncated last line) or a value that is not a number.
  """
  text = _files.read_text(path)
  lines = text.splitlines()
  tokens = text.split()
  rows = sum(1 for line in lines if line.strip())
  if len(tokens) != rows * num_columns:
    for i, line in enumerate(lines):
      n = len(line.split())
      if n and n != num_columns:
        raise ValueError(f"{path!r}: line {i + 1} has {n} values, expected {num_columns} "
                         f"{what} (truncated or corrupted file).")
  try:
    values = np.array(tokens, dtype=np.float64)
  except ValueError as e:
    raise ValueError(f"{path!r}: {what} must be numbers ({e}).") from e
  if not np.all(np.isfinite(values)):
    raise ValueError(f"{path!r}: {what} must be finite numbers.")
  return values.reshape(rows, num_columns)


def _root(directory, variant):
  nested = os.path.join(directory, VARIANTS[variant]["root"])
  if os.path.isdir(nested):
    return nested
  first = VARIANTS[variant]["splits"][0]
  if os.path.isfile(os.path.join(directory, first[0], first[1])):
    return directory  # data_dir is the unzipped folder itself
  return nested  # missing: the error names the documented path


def load_har_arrays(data_dir, variant="har"):
  """Reads both splits; returns (x [N, 561] float32, y [N] 0-based, subject [N]).

  Rows of the train files come first, then the test files, in file order.
  """
  if variant not in VARIANTS:
    raise ValueError(f"`variant` must be one of {tuple(VARIANTS)}, got {variant!r}.")
  v = VARIANTS[variant]
  layout = _layout(variant)
  directory = _files.require_data_dir(data_dir, variant, layout, v["source"])
  root = _root(directory, variant)
  xs, ys, ss = [], [], []
  for split, x_name, y_name, s_name in v["splits"]:
    paths = [
        _files.find_file(os.path.join(root, split),
                         name,
                         what=f"{variant} file {split}/{name}",
                         layout=layout,
                         source=v["source"]) for name in (x_name, y_name, s_name)
    ]
    x = read_table(paths[0], NUM_FEATURES, "features")
    y = _files.as_int_array(read_table(paths[1], 1, "labels")[:, 0], paths[1], "labels")
    s = _files.as_int_array(read_table(paths[2], 1, "subject ids")[:, 0], paths[2], "subject ids")
    if not x.shape[0] == y.size == s.size:
      raise ValueError(f"{os.path.join(root, split)!r}: {x_name}, {y_name} and {s_name} "
                       f"have {x.shape[0]}, {y.size} and {s.size} lines; expected one line "
                       "per example in each (a file is truncated or from another release).")
    if y.size and (y.min() < 1 or y.max() > v["num_classes"]):
      raise ValueError(f"{paths[1]!r} has labels in [{y.min()}, {y.max()}]; expected "
                       f"1..{v['num_classes']}.")
    if s.size and s.min() < 1:
      raise ValueError(f"{paths[2]!r} has a subject id {s.min()} < 1.")
    xs.append(x)
    ys.append(y - 1)
    ss.append(s)
  return (np.concatenate(xs).astype(np.float32), np.concatenate(ys), np.concatenate(ss))


def load_har(data_dir, *, variant="har", num_clients=None, test_fraction=0.25, seed=0):
  """Per-subject HAR (see the module docstring).

  Args:
    data_dir: directory holding the unzipped publisher's folder.
    variant: "har" (UCI HAR, 6 classes) or "hapt" (12 classes).
    num_clients: subjects drawn with `seed`; None keeps all 30.
    test_fraction: per-subject held-out fraction (VIRTUAL: 0.25).
    seed: int; the same seed gives the same subjects and splits.

  Returns:
    A `FederatedData`, input_shape (561,), clients `subject_01`...
  """
  x, y, subject = load_har_arrays(data_dir, variant)
  select_seed, split_seed = _seeds.derive_seeds(seed, 2)
  ids = {f"subject_{s:02d}": s for s in np.unique(subject)}
  chosen = _files.select_clients(list(ids), num_clients, select_seed, variant)
  xs = {c: x[subject == ids[c]] for c in chosen}
  ys = {c: y[subject == ids[c]] for c in chosen}
  return federated.from_client_arrays(xs,
                                      ys,
                                      num_classes=VARIANTS[variant]["num_classes"],
                                      test_fraction=test_fraction,
                                      seed=split_seed,
                                      name=variant)

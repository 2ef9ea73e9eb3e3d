"""Vehicle Sensor Network (VSN): one client per sensor, AAV vs DW vehicles.

Source data: Duarte & Hu (2004), "Vehicle classification in distributed
sensor networks" (SensIT experiment; http://www.ecs.umass.edu/~mduarte/
Software.html). Each of the 23 sensors featurises its acoustic and seismic
signals into 50 + 50 spectral features.

Accepted file, the per-sensor form prepared by MOCHA (Smith et al., 2017,
"Federated Multi-Task Learning") and used by VIRTUAL and later federated
work:

    data_dir/vehicle.mat

a MATLAB v5 MAT-file (the format `scipy.io.loadmat` reads; MATLAB v7.3 /
HDF5 files are refused with a message saying how to re-save them) with two
cell arrays of equal length, one cell per sensor, in sensor order:

* `X`: cell k is a real matrix [n_k, 100], one row per vehicle event: the
  50 acoustic and 50 seismic features, columns kept in the file's order (no
  reordering, so the column order is deterministic);
* `Y`: cell k is [n_k, 1] (or [1, n_k]) with labels in {-1, +1} (the MOCHA
  encoding of the two classes, AAV vs DW) or in {0, 1}.

Convention (VIRTUAL Sec. V: "We consider every sensor as a client and perform
the binary classification of assault amphibious and dragon wagon vehicles
... a 75%-25% train-test split is performed"): client `sensor_<kk>` (kk = 01
.. 23, cell order) holds cell k's rows; label -1 becomes 0 and +1 stays 1 (so
class 1 is the file's +1 class); each client is split at random into train
and `test_fraction` test examples (`tfbfl.data.split`); `num_clients` sensors
are drawn with the seed (None: all 23). With `standardize=True` (the
default) each client's features are standardised with the mean and standard
deviation of its own train part (a zero deviation counts as 1), applied to
its train and test parts; `standardize=False` keeps the published values.
x is float32 [n, 100].
"""

import numpy as np

from tfbfl.data import _files
from tfbfl.data import _seeds
from tfbfl.data import federated

FILE_NAME = "vehicle.mat"
NUM_FEATURES = 100
NUM_CLASSES = 2
LAYOUT = ("<data_dir>/vehicle.mat (MATLAB v5: cell arrays X{k} [n_k, 100] and "
          "Y{k} [n_k, 1] in {-1, +1}, one cell per sensor)")
SOURCE = ("The features are published by Duarte & Hu at "
          "http://www.ecs.umass.edu/~mduarte/Software.html; the per-sensor "
          "vehicle.mat is the file prepared for MOCHA (Smith et al. 2017, "
          "https://github.com/gingsmith/fmtl), a copy of which is linked "
          "from https://github.com/litian96/fair_flearn/tree/master/data/"
          "vehicle (README.md).")


def _loadmat(path):
  import scipy.io  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    head = f.read(128)
  if head.startswith(b"\x89HDF") or b"MATLAB 7.3" in head:
    raise ValueError(f"{path!r} is a MATLAB v7.3 (HDF5) MAT-file; re-save it in v7 format "
                     "(MATLAB: save('vehicle.mat', 'X', 'Y', '-v7')).")
  try:
    return scipy.io.loadmat(path)
  except NotImplementedError as e:
    raise ValueError(f"{path!r}: unsupported MAT-file version ({e}).") from e
  except Exception as e:  # scipy raises OSError, ValueError, MatReadError...
    raise ValueError(f"{path!r} is not a readable MATLAB v5 MAT-file (truncated or "
                     f"corrupted: {type(e).__name__}: {e}).") from e


def _cells(mat, key, path):
  if key not in mat:
    raise ValueError(f"{path!r} has no variable {key!r} (found "
                     f"{sorted(k for k in mat if not k.startswith('__'))}); expected cell "
                     "arrays X and Y, one cell per sensor.")
  cells = np.asarray(mat[key])
  if cells.dtype != object or cells.ndim != 2 or 1 not in cells.shape:
    raise ValueError(f"{path!r}: variable {key!r} must be a 1-D cell array (one cell per "
                     f"sensor), got {cells.dtype} of shape {cells.shape}.")
  return list(cells.reshape(-1))


def load_vsn_arrays(data_dir):
  """Reads `vehicle.mat`; returns dict `sensor_<kk>` -> (x float32 [n, 100], y)."""
  directory = _files.require_data_dir(data_dir, "vsn", LAYOUT, SOURCE)
  path = _files.find_file(directory,
                          FILE_NAME,
                          what="VSN file vehicle.mat",
                          layout=LAYOUT,
                          source=SOURCE)
  mat = _loadmat(path)
  xs, ys = _cells(mat, "X", path), _cells(mat, "Y", path)
  if len(xs) != len(ys):
    raise ValueError(f"{path!r}: X has {len(xs)} cells but Y has {len(ys)}; expected one "
                     "of each per sensor.")
  width = max(2, len(str(len(xs))))
  out = {}
  for k, (x, y) in enumerate(zip(xs, ys)):
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 2 or x.shape[1] != NUM_FEATURES or not (np.issubdtype(x.dtype, np.number)):
      raise ValueError(f"{path!r}: X{{{k + 1}}} must be a real matrix [n, {NUM_FEATURES}], "
                       f"got {x.dtype} of shape {x.shape}.")
    if y.ndim != 2 or 1 not in y.shape or y.size != x.shape[0]:
      raise ValueError(f"{path!r}: Y{{{k + 1}}} must be a vector of {x.shape[0]} labels, "
                       f"got shape {y.shape}.")
    y = y.reshape(-1)
    values = set(np.unique(y).tolist())
    if not (values <= {-1, 1} or values <= {0, 1}):
      raise ValueError(f"{path!r}: Y{{{k + 1}}} has labels {sorted(values)[:5]}; expected "
                       "{-1, +1} (or {0, 1}).")
    out[f"sensor_{k + 1:0{width}d}"] = (x.astype(np.float32), (y > 0).astype(np.int32))
  return out


def _standardize(train, test):
  xs, xts = {}, {}
  for c, (x, _) in train.items():
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std = np.where(std > 0, std, 1.0).astype(np.float32)
    xs[c] = (x - mean) / std
    xts[c] = (test[c][0] - mean) / std
  return xs, xts


def load_vsn(data_dir, *, num_clients=None, test_fraction=0.25, seed=0, standardize=True):
  """Per-sensor VSN (see the module docstring).

  Args:
    data_dir: directory holding `vehicle.mat`.
    num_clients: sensors drawn with `seed`; None keeps all 23.
    test_fraction: per-sensor held-out fraction (VIRTUAL: 0.25).
    seed: int; the same seed gives the same sensors and splits.
    standardize: standardise each client with its train statistics.

  Returns:
    A `FederatedData`, input_shape (100,), 2 classes.
  """
  by_sensor = load_vsn_arrays(data_dir)
  select_seed, split_seed = _seeds.derive_seeds(seed, 2)
  chosen = _files.select_clients(list(by_sensor), num_clients, select_seed, "vsn")
  fd = federated.from_client_arrays({c: by_sensor[c][0] for c in chosen},
                                    {c: by_sensor[c][1] for c in chosen},
                                    num_classes=NUM_CLASSES,
                                    test_fraction=test_fraction,
                                    seed=split_seed,
                                    name="vsn")
  if not standardize:
    return fd
  xs, xts = _standardize(fd.train, fd.test)
  return federated.from_client_arrays(xs, {c: fd.train[c][1] for c in chosen},
                                      xts, {c: fd.test[c][1] for c in chosen},
                                      num_classes=NUM_CLASSES,
                                      name="vsn")

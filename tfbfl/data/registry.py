"""The dataset registry and `load_federated`, the entry point of every launcher.

`DATASETS` maps a dataset name to a loader. A loader is called with keyword
arguments only, all of `load_federated`'s except `dataset`:
`loader(*, data_dir, partition, num_clients, alpha, min_size,
classes_per_client, test_fraction, seed) -> FederatedData`; loaders of natural
federated datasets ignore the partition arguments. Add a dataset with
`register_dataset(name, loader)` (or by assigning into `DATASETS`).

Registered datasets (files and conventions: each module's docstring and
data/README.md; nothing is downloaded, a missing file raises
`MissingDataError` naming it):

* "digits": scikit-learn's bundled digits, federated by `partition`.
* "npz": the user's own clients in one .npz file (`data_dir` is its path).
* "mnist": MNIST IDX files; train set by `partition`, official test set
  spread over the same clients (`official_split`).
* "pmnist": MNIST, homogeneous split + one pixel permutation per client
  (VIRTUAL's PMNIST); `partition` is ignored.
* "cifar10": CIFAR-10 python batches (restricted unpickler); as "mnist".
* "femnist" / "femnist62": LEAF JSON or TFF HDF5; `num_clients` writers
  drawn with `seed`; 10 digit classes / all 62; the distribution's split.
* "har" / "hapt": UCI HAR (6 activities) / HAPT (12) text files, one client
  per subject (`num_clients` of the 30 drawn with `seed`), split by
  `test_fraction`.
* "vsn": vehicle.mat, one client per sensor (`num_clients` of the 23),
  split by `test_fraction`, standardised per client.
* "shakespeare": LEAF JSON, one client per role with >= 10 sequences
  (`num_clients` drawn with `seed`); x int32 token ids [n, 80].

Natural datasets (femnist, har, vsn, shakespeare) ignore `partition`,
`alpha`, `min_size` and `classes_per_client`; `num_clients` picks that many
of their clients (an error if it exceeds those available).
"""

import dataclasses

from tfbfl.data import cifar10
from tfbfl.data import digits
from tfbfl.data import federate
from tfbfl.data import federated
from tfbfl.data import femnist
from tfbfl.data import har
from tfbfl.data import mnist
from tfbfl.data import npz
from tfbfl.data import pmnist
from tfbfl.data import shakespeare
from tfbfl.data import vsn

PARTITIONS = federate.PARTITIONS


def _load_digits(*, data_dir, partition, num_clients, alpha, min_size, classes_per_client,
                 test_fraction, seed):
  del data_dir  # bundled with scikit-learn
  x, y = digits.load_digits_arrays()
  return federate.federate_pooled(x,
                                  y,
                                  name=f"digits/{partition}",
                                  num_classes=digits.NUM_CLASSES,
                                  partition=partition,
                                  num_clients=num_clients,
                                  alpha=alpha,
                                  min_size=min_size,
                                  classes_per_client=classes_per_client,
                                  test_fraction=test_fraction,
                                  seed=seed)


def _load_npz(*, data_dir, partition, num_clients, alpha, min_size, classes_per_client,
              test_fraction, seed):
  del partition, num_clients, alpha, min_size, classes_per_client  # natural
  if data_dir is None:
    raise ValueError("`data_dir` must be the path of the .npz file for dataset 'npz', got "
                     "None.")
  return npz.load_npz(data_dir, test_fraction=test_fraction, seed=seed)


def _official_test_loader(load):
  """The registry loader of `load` (`mnist.load_mnist`, `cifar10.load_cifar10`):
  partitioned train set, official test set."""

  def loader(*, data_dir, partition, num_clients, alpha, min_size, classes_per_client,
             test_fraction, seed):
    del test_fraction  # the official test set is used
    return load(data_dir,
                partition=partition,
                num_clients=num_clients,
                alpha=alpha,
                min_size=min_size,
                classes_per_client=classes_per_client,
                seed=seed)

  return loader


_load_mnist = _official_test_loader(mnist.load_mnist)


def _load_pmnist(*, data_dir, partition, num_clients, alpha, min_size, classes_per_client,
                 test_fraction, seed):
  del partition, alpha, min_size, classes_per_client, test_fraction
  return pmnist.load_pmnist(data_dir, num_clients=num_clients, seed=seed)


_load_cifar10 = _official_test_loader(cifar10.load_cifar10)


def _femnist_loader(digits_only):

  def loader(*, data_dir, partition, num_clients, alpha, min_size, classes_per_client,
             test_fraction, seed):
    del partition, alpha, min_size, classes_per_client  # natural clients
    del test_fraction  # the distribution's own split
    return femnist.load_femnist(data_dir,
                                num_clients=num_clients,
                                digits_only=digits_only,
                                seed=seed)

  return loader


def _har_loader(variant):

  def loader(*, data_dir, partition, num_clients, alpha, min_size, classes_per_client,
             test_fraction, seed):
    del partition, alpha, min_size, classes_per_client  # natural clients
    return har.load_har(data_dir,
                        variant=variant,
                        num_clients=num_clients,
                        test_fraction=test_fraction,
                        seed=seed)

  return loader


def _load_vsn(*, data_dir, partition, num_clients, alpha, min_size, classes_per_client,
              test_fraction, seed):
  del partition, alpha, min_size, classes_per_client  # natural clients
  return vsn.load_vsn(data_dir, num_clients=num_clients, test_fraction=test_fraction, seed=seed)


def _load_shakespeare(*, data_dir, partition, num_clients, alpha, min_size, classes_per_client,
                      test_fraction, seed):
  del partition, alpha, min_size, classes_per_client  # natural clients
  del test_fraction  # the distribution's own split
  return shakespeare.load_shakespeare(data_dir, num_clients=num_clients, seed=seed)


DATASETS = {
    "digits": _load_digits,
    "npz": _load_npz,
    "mnist": _load_mnist,
    "pmnist": _load_pmnist,
    "cifar10": _load_cifar10,
    "femnist": _femnist_loader(digits_only=True),
    "femnist62": _femnist_loader(digits_only=False),
    "har": _har_loader("har"),
    "hapt": _har_loader("hapt"),
    "vsn": _load_vsn,
    "shakespeare": _load_shakespeare,
}

_NATURAL = ("partition", "alpha", "min_size", "classes_per_client")
# Settings a dataset's loader does not use (the `del`s of the loaders above): the
# driver refuses a non-default value of one of them instead of ignoring it.
IGNORED_SETTINGS = {
    "digits": ("data_dir",),
    "npz": _NATURAL + ("num_clients",),  # the file decides the clients
    "mnist": ("test_fraction",),
    "pmnist": _NATURAL + ("test_fraction",),
    "cifar10": ("test_fraction",),
    "femnist": _NATURAL + ("test_fraction",),
    "femnist62": _NATURAL + ("test_fraction",),
    "har": _NATURAL,
    "hapt": _NATURAL,
    "vsn": _NATURAL,
    "shakespeare": _NATURAL + ("test_fraction",),
}


def register_dataset(name, loader):
  """Registers `loader` under `name` (see the module docstring for its call)."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"`name` must be a non-empty str, got {name!r}.")
  if not callable(loader):
    raise ValueError(f"`loader` must be callable, got {loader!r}.")
  DATASETS[name] = loader


def load_federated(dataset="digits", **settings):
  """Loads a federated dataset.

  Args:
    dataset: a `DataSpec`, or a name in `DATASETS` ("digits" runs with no
      download) with the other `DataSpec` fields as keywords (their defaults are
      `DataSpec`'s):
      data_dir: where the dataset's files are (for "npz": the .npz path).
      partition: a name in `PARTITIONS`; used by datasets without natural
        clients ("digits", "mnist", "cifar10"), ignored by natural ones
        ("npz", "femnist", "har", "vsn", "shakespeare") and by "pmnist".
      num_clients: number of clients of the partition; for natural datasets
        (except "npz"), the number of their clients drawn with `seed`.
      alpha: Dirichlet concentration of "class_dirichlet"/"label_dirichlet".
      min_size: minimum client size of "class_dirichlet".
      classes_per_client: shards per client of "pathological".
      test_fraction: per-client held-out fraction where a dataset has no split
        ("digits", "npz" without test arrays, "har", "hapt", "vsn").
      seed: int; the same seed gives identical data.
    **settings: `DataSpec` fields, only with a dataset name.

  Returns:
    A `FederatedData`.

  Raises:
    MissingDataError: (a FileNotFoundError) a dataset file is missing; the
      message names it, the expected layout and where it is published.
    ValueError: unknown `dataset` or `partition` (listing the valid names),
      any invalid argument (named in the message), or a truncated/corrupted
      file (named in the message).
  """
  from tfbfl.data.spec import DataSpec  # pylint: disable=g-import-not-at-top
  if isinstance(dataset, DataSpec):
    if settings:
      raise ValueError(f"load_federated(DataSpec) takes no other settings, got {sorted(settings)}.")
    spec = dataset
  else:
    unknown = set(settings) - {f.name for f in dataclasses.fields(DataSpec)}
    if unknown:
      raise TypeError(f"load_federated() got unknown settings {sorted(unknown)}.")
    spec = DataSpec(dataset=dataset, **settings)
  if spec.dataset not in DATASETS:
    raise ValueError(f"Unknown `dataset` {spec.dataset!r}; expected one of {tuple(DATASETS)}.")
  kwargs = dataclasses.asdict(spec)
  del kwargs["dataset"]
  validation_fraction = kwargs.pop("validation_fraction")
  calibration_fraction = kwargs.pop("calibration_fraction")
  fd = DATASETS[spec.dataset](**kwargs)
  if validation_fraction > 0:
    fd = federated.validation_split(fd, validation_fraction, spec.seed)
  if calibration_fraction > 0:
    fd = federated.calibration_split(fd, calibration_fraction, spec.seed)
  return fd

"""The dataset registry and `load_federated`, the entry point of every launcher.

`DATASETS` maps a dataset name to a loader. A loader is called with keyword
arguments only, all of `load_federated`'s except `dataset`:
`loader(*, data_dir, partition, num_clients, alpha, min_size,
classes_per_client, test_fraction, seed) -> FederatedData`; loaders of natural
federated datasets ignore the partition arguments. Add a dataset with
`register_dataset(name, loader)` (or by assigning into `DATASETS`).
"""

from tfbfl.data import digits
from tfbfl.data import federate
from tfbfl.data import npz

PARTITIONS = federate.PARTITIONS


def _load_digits(*, data_dir, partition, num_clients, alpha, min_size,
                 classes_per_client, test_fraction, seed):
  del data_dir  # bundled with scikit-learn
  x, y = digits.load_digits_arrays()
  return federate.federate_pooled(
      x, y, name=f"digits/{partition}", num_classes=digits.NUM_CLASSES,
      partition=partition, num_clients=num_clients, alpha=alpha,
      min_size=min_size, classes_per_client=classes_per_client,
      test_fraction=test_fraction, seed=seed)


def _load_npz(*, data_dir, partition, num_clients, alpha, min_size,
              classes_per_client, test_fraction, seed):
  del partition, num_clients, alpha, min_size, classes_per_client  # natural
  if data_dir is None:
    raise ValueError(
        "`data_dir` must be the path of the .npz file for dataset 'npz', got "
        "None.")
  return npz.load_npz(data_dir, test_fraction=test_fraction, seed=seed)


DATASETS = {
    "digits": _load_digits,
    "npz": _load_npz,
}


def register_dataset(name, loader):
  """Registers `loader` under `name` (see the module docstring for its call)."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"`name` must be a non-empty str, got {name!r}.")
  if not callable(loader):
    raise ValueError(f"`loader` must be callable, got {loader!r}.")
  DATASETS[name] = loader


def load_federated(dataset="digits", *, data_dir=None,
                   partition="class_dirichlet", num_clients=10, alpha=0.5,
                   min_size=10, classes_per_client=2, test_fraction=0.25,
                   seed=0):
  """Loads the federated dataset `dataset`.

  Args:
    dataset: a name in `DATASETS` ("digits" runs with no download).
    data_dir: where the dataset's files are (for "npz": the .npz path).
    partition: a name in `PARTITIONS`; used by datasets without natural
      clients ("digits"), ignored by natural ones ("npz").
    num_clients: number of clients of the partition.
    alpha: Dirichlet concentration of "class_dirichlet"/"label_dirichlet".
    min_size: minimum client size of "class_dirichlet".
    classes_per_client: shards per client of "pathological".
    test_fraction: per-client held-out fraction where a dataset has no split.
    seed: int; the same seed gives identical data.

  Returns:
    A `FederatedData`.

  Raises:
    ValueError: unknown `dataset` or `partition` (listing the valid names), or
      any invalid argument (named in the message).
  """
  if dataset not in DATASETS:
    raise ValueError(
        f"Unknown `dataset` {dataset!r}; expected one of {tuple(DATASETS)}.")
  federate.check_partition(partition)
  return DATASETS[dataset](
      data_dir=data_dir, partition=partition, num_clients=num_clients,
      alpha=alpha, min_size=min_size, classes_per_client=classes_per_client,
      test_fraction=test_fraction, seed=seed)

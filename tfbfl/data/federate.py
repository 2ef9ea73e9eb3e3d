"""Federate a pooled labelled dataset: partition, optional permutation, split.

The pipeline used for datasets without natural clients (digits; later MNIST
and CIFAR-10):

1. partition the pooled examples over clients with a named partitioner
   (`tfbfl.data.partition.PARTITIONERS`);
2. for partition "permuted", permute each client's features
   (`partition.permute_features`, the PMNIST convention);
3. split each client's examples into train/test by `test_fraction`
   (`tfbfl.data.split`).

The three stages draw from independent streams derived from `seed`, so the
same seed gives identical data and changing a stage does not shift the others.
"""

from tfbfl.data import _seeds
from tfbfl.data import _validate
from tfbfl.data import federated
from tfbfl.data import partition as partition_lib

PARTITIONS = tuple(partition_lib.PARTITIONERS)


def check_partition(partition):
  """Raises ValueError listing the valid names if `partition` is unknown."""
  if partition not in partition_lib.PARTITIONERS:
    raise ValueError(f"Unknown `partition` {partition!r}; expected one of {PARTITIONS}.")


def partition_indices(partition,
                      labels,
                      num_clients,
                      seed,
                      *,
                      alpha=0.5,
                      min_size=10,
                      classes_per_client=2):
  """Calls the partitioner named `partition` with the arguments it uses."""
  check_partition(partition)
  fn = partition_lib.PARTITIONERS[partition]
  if partition == "class_dirichlet":
    return fn(labels, num_clients, alpha, seed, min_size=min_size)
  if partition == "label_dirichlet":
    return fn(labels, num_clients, alpha, seed)
  if partition == "pathological":
    return fn(labels, num_clients, classes_per_client, seed)
  return fn(labels, num_clients, seed)


def federate_pooled(x,
                    y,
                    *,
                    name,
                    num_classes=None,
                    partition="class_dirichlet",
                    num_clients=10,
                    alpha=0.5,
                    min_size=10,
                    classes_per_client=2,
                    test_fraction=0.25,
                    seed=0):
  """Returns a `FederatedData` built from pooled arrays by the pipeline above.

  Client i (in partition order) gets the id `client_<i>` zero-padded as in
  `from_client_arrays`.
  """
  partition_seed, permute_seed, split_seed = _seeds.derive_seeds(seed, 3)
  parts = partition_indices(partition,
                            y,
                            num_clients,
                            partition_seed,
                            alpha=alpha,
                            min_size=min_size,
                            classes_per_client=classes_per_client)
  ids = [_validate.client_id(i, len(parts)) for i in range(len(parts))]
  x_by_client = {c: x[idx] for c, idx in zip(ids, parts)}
  y_by_client = {c: y[idx] for c, idx in zip(ids, parts)}
  if partition == "permuted":
    x_by_client = partition_lib.permute_features(x_by_client, permute_seed)
  return federated.from_client_arrays(x_by_client,
                                      y_by_client,
                                      num_classes=num_classes,
                                      test_fraction=test_fraction,
                                      seed=split_seed,
                                      name=name)

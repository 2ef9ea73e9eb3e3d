"""Federate a dataset that ships its own train/test split (MNIST, CIFAR-10).

Pipeline (seeds derived from `seed` as in `tfbfl.data.federate`, so the
train partition equals `federate_pooled`'s for the same pool and seed):

1. the publisher's train set is spread over clients by the partitioner named
   `partition` (`tfbfl.data.partition.PARTITIONERS`);
2. the publisher's test set is spread over the same clients by
   `allocate_test` (convention below), so every client's test examples follow
   its own label distribution and the pooled client test sets are exactly the
   publisher's test set (minus the classes no client trains on);
3. for partition "permuted", each client's train and test features get the
   same random permutation (`partition.permute_features`, PMNIST).

Test convention of `allocate_test`:

* "homogeneous" and "permuted": the test set is split like the train set, by
  `partition.homogeneous` (a random permutation cut into near-equal parts),
  so with MNIST and 100 clients every client has 600 train and 100 test
  examples (VIRTUAL Sec. V, MNIST and PMNIST).
* label-skewed partitions ("class_dirichlet", "label_dirichlet",
  "pathological"): for each class k, the shuffled test examples of class k are
  dealt to the clients in proportion to their number of train examples of
  class k (cut points `floor(cumsum(share) * N_k)`), so a client's test label
  distribution matches its train one and a client holds test examples only
  of classes it trains on. Test examples of a class no client trains on are
  left out. A client may end with no test example.
"""

import numpy as np

from tfbfl.data import _seeds
from tfbfl.data import _validate
from tfbfl.data import federate
from tfbfl.data import federated
from tfbfl.data import partition as partition_lib

_HOMOGENEOUS = ("homogeneous", "permuted")
# Where the test examples of a dataset with a published split come from.
TEST_SOURCES = ("official", "pooled")


def allocate_test(train_parts, y_train, y_test, partition, seed):
  """Returns one sorted int64 index array into `y_test` per client.

  Args:
    train_parts: the train index arrays of the clients (into `y_train`).
    y_train: int labels of the train pool.
    y_test: int labels of the test pool.
    partition: the partition name used for `train_parts`.
    seed: int or np.random.Generator.
  """
  federate.check_partition(partition)
  num_clients = len(train_parts)
  rng = _seeds.as_generator(seed)
  y_test = np.asarray(y_test)
  if partition in _HOMOGENEOUS:
    return [
        np.sort(p.astype(np.int64))
        for p in np.array_split(rng.permutation(y_test.size), num_clients)
    ]
  y_train = np.asarray(y_train)
  buckets = [[] for _ in range(num_clients)]
  for k in np.unique(y_test):
    counts = np.array([np.sum(y_train[p] == k) for p in train_parts], dtype=np.float64)
    if counts.sum() == 0:
      continue
    idx = rng.permutation(np.flatnonzero(y_test == k))
    cuts = np.floor(np.cumsum(counts / counts.sum()) * idx.size).astype(np.int64)
    for j, part in enumerate(np.split(idx, cuts[:-1])):
      buckets[j].extend(part.tolist())
  return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


def federate_train_test(x_train,
                        y_train,
                        x_test,
                        y_test,
                        *,
                        name,
                        num_classes,
                        partition="class_dirichlet",
                        num_clients=10,
                        alpha=0.5,
                        min_size=10,
                        classes_per_client=2,
                        seed=0):
  """Returns a `FederatedData` by the pipeline above.

  Client i (in partition order) gets the id `client_<i>` zero-padded as in
  `from_client_arrays`.
  """
  partition_seed, permute_seed, test_seed = _seeds.derive_seeds(seed, 3)
  parts = federate.partition_indices(partition,
                                     y_train,
                                     num_clients,
                                     partition_seed,
                                     alpha=alpha,
                                     min_size=min_size,
                                     classes_per_client=classes_per_client)
  test_parts = allocate_test(parts, y_train, y_test, partition, test_seed)
  ids = [_validate.client_id(i, len(parts)) for i in range(len(parts))]
  xs = {c: x_train[p] for c, p in zip(ids, parts)}
  ys = {c: y_train[p] for c, p in zip(ids, parts)}
  xts = {c: x_test[p] for c, p in zip(ids, test_parts)}
  yts = {c: y_test[p] for c, p in zip(ids, test_parts)}
  if partition == "permuted":
    xs = partition_lib.permute_features(xs, permute_seed)
    xts = partition_lib.permute_features(xts, permute_seed)
  return federated.from_client_arrays(xs, ys, xts, yts, num_classes=num_classes, name=name)


def client_permutations(client_ids, num_features, seed):
  """The PMNIST pixel permutation of each client of `federate_train_test(...,
  partition="permuted", seed=seed)`: dict client_id -> int64 [num_features]
  (`partition.feature_permutations` with the run's derived permutation seed; the
  same permutation for a client's train and test features). `seed`: an int."""
  permute_seed = _seeds.derive_seeds(seed, 3)[1]
  return partition_lib.feature_permutations(list(client_ids), num_features, permute_seed)


def federate_published(load_arrays, *, test_source, name, num_classes, partition, num_clients,
                       alpha, min_size, classes_per_client, test_fraction, seed):
  """Loads and federates a dataset published with a train/test split.

  Checks `test_source` (in `TEST_SOURCES`) and `partition` first, then calls
  `load_arrays()` for `(x_train, y_train, x_test, y_test)`. "official":
  `federate_train_test` (the test set spread over the clients by
  `allocate_test`); "pooled": train and test pooled, then
  `federate.federate_pooled` (each client split by `test_fraction`).
  """
  if test_source not in TEST_SOURCES:
    raise ValueError(f"`test_source` must be one of {TEST_SOURCES}, got {test_source!r}.")
  federate.check_partition(partition)
  x, y, xt, yt = load_arrays()
  if test_source == "pooled":
    return federate.federate_pooled(np.concatenate([x, xt]),
                                    np.concatenate([y, yt]),
                                    name=name,
                                    num_classes=num_classes,
                                    partition=partition,
                                    num_clients=num_clients,
                                    alpha=alpha,
                                    min_size=min_size,
                                    classes_per_client=classes_per_client,
                                    test_fraction=test_fraction,
                                    seed=seed)
  return federate_train_test(x,
                             y,
                             xt,
                             yt,
                             name=name,
                             num_classes=num_classes,
                             partition=partition,
                             num_clients=num_clients,
                             alpha=alpha,
                             min_size=min_size,
                             classes_per_client=classes_per_client,
                             seed=seed)

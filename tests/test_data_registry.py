"""Tests of load_federated, the digits default and the dataset registry."""

import numpy as np
import pytest

from tfbfl import data
from tfbfl.data import digits


def test_digits_arrays():
  x, y = digits.load_digits_arrays()
  assert x.shape == (1797, 64) and x.dtype == np.float32
  assert y.shape == (1797,) and y.dtype == np.int32
  assert x.min() == 0.0 and x.max() == 1.0
  assert np.unique(y).tolist() == list(range(10))
  assert np.unique(x, axis=0).shape[0] > 1700  # real, mostly distinct images


@pytest.mark.parametrize("partition", data.PARTITIONS)
def test_digits_every_partition(partition):
  fd = data.load_federated("digits", partition=partition, num_clients=8, seed=0)
  assert len(fd.client_ids) == 8 and fd.num_classes == 10
  assert fd.input_shape == (64,)
  n = fd.pooled("train")[1].size + fd.pooled("test")[1].size
  expected = (1797 // 8) * 8 if partition == "label_dirichlet" else 1797
  assert n == expected
  for cid in fd.client_ids:
    n_c = fd.num_examples(cid) + fd.num_examples(cid, "test")
    assert fd.num_examples(cid, "test") == int(np.floor(n_c * 0.25 + 0.5))


def test_digits_examples_are_the_real_ones():
  x, _ = digits.load_digits_arrays()
  fd = data.load_federated("digits", partition="homogeneous")
  pooled = np.concatenate([fd.pooled("train")[0], fd.pooled("test")[0]])
  assert sorted(map(bytes, pooled)) == sorted(map(bytes, x))


def _matching_columns(x, base):
  """For each column of x, the set of columns of base equal to it."""
  return [frozenset(np.flatnonzero(np.all(base == x[:, [j]], axis=0))) for j in range(x.shape[1])]


def test_permuted_one_permutation_per_client_for_train_and_test():
  fd = data.load_federated("digits", partition="permuted", num_clients=3, seed=2)
  base = data.load_federated("digits", partition="homogeneous", num_clients=3, seed=2)
  recovered = []
  for cid in fd.client_ids:
    # Same examples and split as homogeneous (independent derived seeds).
    np.testing.assert_array_equal(fd.train[cid][1], base.train[cid][1])
    np.testing.assert_array_equal(fd.test[cid][1], base.test[cid][1])
    # Train and test stacked: each permuted column is a column of the
    # original, so one permutation maps both splits.
    x = np.concatenate([fd.train[cid][0], fd.test[cid][0]])
    xb = np.concatenate([base.train[cid][0], base.test[cid][0]])
    cols = _matching_columns(x, xb)
    assert all(cols), "a column of the test or train split moved differently"
    assert not all(j in c for j, c in enumerate(cols)), "identity permutation"
    recovered.append(tuple(min(c) if len(c) == 1 else -1 for c in cols))
  assert len(set(recovered)) == 3, "clients share a permutation"


def test_same_seed_same_data_other_seed_other_split():
  a = data.load_federated(partition="class_dirichlet", seed=4)
  b = data.load_federated(partition="class_dirichlet", seed=4)
  c = data.load_federated(partition="class_dirichlet", seed=5)
  for cid in a.client_ids:
    for split in ("train", "test"):
      np.testing.assert_array_equal(getattr(a, split)[cid][0], getattr(b, split)[cid][0])
      np.testing.assert_array_equal(getattr(a, split)[cid][1], getattr(b, split)[cid][1])
  assert any(
      a.num_examples(k) != c.num_examples(k) or not np.array_equal(a.train[k][0], c.train[k][0])
      for k in a.client_ids)


def test_unknown_dataset_and_partition_list_names():
  with pytest.raises(ValueError, match=r"Unknown `dataset` 'mnist2'.*'digits', 'npz'"):
    data.load_federated("mnist2")
  with pytest.raises(ValueError, match=r"Unknown `partition` 'iid'.*'homogeneous'.*'permuted'"):
    data.load_federated("digits", partition="iid")


def test_partition_arguments_reach_partitioner():
  with pytest.raises(ValueError, match=r"`alpha` must be a finite number > 0"):
    data.load_federated(partition="label_dirichlet", alpha=0)
  with pytest.raises(ValueError, match=r"`min_size`=200 is unreachable"):
    data.load_federated(partition="class_dirichlet", min_size=200)
  with pytest.raises(ValueError, match=r"`classes_per_client` must be an int in \[1, 10\]"):
    data.load_federated(partition="pathological", classes_per_client=11)
  with pytest.raises(ValueError, match=r"`num_clients`=2000 exceeds"):
    data.load_federated(partition="homogeneous", num_clients=2000)
  with pytest.raises(ValueError, match=r"`test_fraction` must be a number"):
    data.load_federated(test_fraction=1.0)
  fd = data.load_federated(partition="pathological", classes_per_client=1, num_clients=10)
  assert np.mean([np.unique(fd.train[c][1]).size for c in fd.client_ids]) <= 2


def test_register_dataset():

  def loader(**kwargs):
    return data.from_client_arrays([np.ones((4, 1))] * kwargs["num_clients"],
                                   [np.zeros(4, int)] * kwargs["num_clients"],
                                   name="toy")

  data.register_dataset("toy_for_test", loader)
  try:
    assert "toy_for_test" in data.DATASETS
    fd = data.load_federated("toy_for_test", num_clients=3)
    assert fd.name == "toy" and len(fd.client_ids) == 3
  finally:
    del data.DATASETS["toy_for_test"]
  with pytest.raises(ValueError, match=r"`loader` must be callable"):
    data.register_dataset("x", None)

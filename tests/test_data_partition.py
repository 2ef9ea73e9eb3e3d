"""Tests of the partitioners and the per-client feature permutation."""

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from tfbfl.data import digits
from tfbfl.data import partition as P

_LABELS = np.repeat(np.arange(10), 60)  # 600 examples, 10 balanced classes


def _check_disjoint(parts, n, cover=True):
  flat = np.concatenate(parts)
  assert flat.dtype == np.int64
  assert np.unique(flat).size == flat.size, "clients overlap"
  assert flat.min() >= 0 and flat.max() < n
  if cover:
    assert flat.size == n, "not every index is used"
  for p in parts:
    assert np.all(np.diff(p) > 0), "indices not sorted"


def _entropy(labels, num_classes=10):
  p = np.bincount(labels, minlength=num_classes) / labels.size
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


# ------------------------------------------------------------- properties

_SETTINGS = hypothesis.settings(max_examples=15, deadline=None)
_labels = st.lists(st.integers(0, 5), min_size=40, max_size=200).map(np.array)


@_SETTINGS
@hypothesis.given(labels=_labels, k=st.integers(1, 8), seed=st.integers(0, 99))
def test_homogeneous_property(labels, k, seed):
  parts = P.homogeneous(labels, k, seed)
  assert len(parts) == k
  _check_disjoint(parts, labels.size)
  sizes = [p.size for p in parts]
  assert max(sizes) - min(sizes) <= 1


@_SETTINGS
@hypothesis.given(labels=_labels,
                  k=st.integers(1, 4),
                  alpha=st.floats(0.1, 10),
                  seed=st.integers(0, 99))
def test_class_dirichlet_property(labels, k, alpha, seed):
  parts = P.class_dirichlet(labels, k, alpha, seed, min_size=5)
  assert len(parts) == k
  _check_disjoint(parts, labels.size)
  assert min(p.size for p in parts) >= 5


@_SETTINGS
@hypothesis.given(labels=_labels,
                  k=st.integers(1, 8),
                  alpha=st.floats(0.05, 50),
                  seed=st.integers(0, 99))
def test_label_dirichlet_property(labels, k, alpha, seed):
  parts = P.label_dirichlet(labels, k, alpha, seed)
  _check_disjoint(parts, labels.size, cover=False)
  assert all(p.size == labels.size // k for p in parts)


@_SETTINGS
@hypothesis.given(labels=_labels, k=st.integers(1, 8), c=st.integers(1, 3), seed=st.integers(0, 99))
def test_pathological_property(labels, k, c, seed):
  hypothesis.assume(c <= np.unique(labels).size)
  parts = P.pathological(labels, k, c, seed)
  _check_disjoint(parts, labels.size)
  n = labels.size
  for p in parts:
    assert c * (n // (k * c)) <= p.size <= c * (n // (k * c) + 1)


# ---------------------------------------------------------- conventions


def test_class_dirichlet_min_size_and_heterogeneity():
  parts = P.class_dirichlet(_LABELS, 10, 0.1, 0, min_size=20)
  assert min(p.size for p in parts) >= 20
  iid = P.class_dirichlet(_LABELS, 10, 1000.0, 0, min_size=20)
  low = np.mean([_entropy(_LABELS[p]) for p in parts])
  high = np.mean([_entropy(_LABELS[p]) for p in iid])
  assert low < high


def test_class_dirichlet_balance_caps_big_clients():
  _, y = digits.load_digits_arrays()
  capped = P.class_dirichlet(y, 10, 0.5, 1, min_size=0)
  free = P.class_dirichlet(y, 10, 0.5, 1, min_size=0, balance=False)
  assert np.std([p.size for p in capped]) < np.std([p.size for p in free])


def test_label_dirichlet_heterogeneity_decreases_with_alpha():
  _, y = digits.load_digits_arrays()
  ent = {
      a: np.mean([_entropy(y[p]) for p in P.label_dirichlet(y, 10, a, 0)]) for a in (0.1, 1.0, 100.0)
  }
  assert ent[0.1] < ent[1.0] < ent[100.0]
  assert ent[100.0] > 0.9 * np.log(10)


def test_label_dirichlet_samples_per_client():
  parts = P.label_dirichlet(_LABELS, 4, 1.0, 0, samples_per_client=150)
  assert [p.size for p in parts] == [150] * 4
  _check_disjoint(parts, _LABELS.size)


def test_pathological_classes_per_client():
  _, y = digits.load_digits_arrays()
  parts = P.pathological(y, 10, 2, 0)
  counts = [np.unique(y[p]).size for p in parts]
  assert max(counts) <= 4
  assert np.mean(counts) < 3.5
  parts = P.pathological(_LABELS, 5, 2, 0)  # shards align with classes
  assert all(np.unique(_LABELS[p]).size <= 2 for p in parts)


def test_permuted_is_homogeneous():
  for a, b in zip(P.permuted(_LABELS, 7, 3), P.homogeneous(_LABELS, 7, 3)):
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------- determinism


@pytest.mark.parametrize("name", sorted(P.PARTITIONERS))
def test_seeded(name):
  fn = P.PARTITIONERS[name]
  extra = {"class_dirichlet": (0.5,), "label_dirichlet": (0.5,), "pathological": (2,)}.get(name, ())
  a = fn(_LABELS, 6, *extra, 5)
  b = fn(_LABELS, 6, *extra, 5)
  c = fn(_LABELS, 6, *extra, 6)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))
  g = fn(_LABELS, 6, *extra, np.random.default_rng(5))
  assert len(g) == 6


# ------------------------------------------------------------ validation


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("fn", [P.class_dirichlet, P.label_dirichlet])
def test_bad_alpha(fn, alpha):
  with pytest.raises(ValueError, match=r"`alpha` must be a finite number > 0"):
    fn(_LABELS, 3, alpha, 0)


@pytest.mark.parametrize("call", [
    lambda k: P.homogeneous(_LABELS, k, 0),
    lambda k: P.class_dirichlet(_LABELS, k, 1.0, 0, min_size=0),
    lambda k: P.label_dirichlet(_LABELS, k, 1.0, 0),
    lambda k: P.pathological(_LABELS, k, 1, 0),
])
def test_bad_num_clients(call):
  with pytest.raises(ValueError, match=r"`num_clients` must be an int >= 1"):
    call(0)
  with pytest.raises(ValueError, match=r"`num_clients` must be an int >= 1"):
    call(2.0)
  with pytest.raises(ValueError, match=r"`num_clients`=601 exceeds the number of samples \(600\)"):
    call(601)


def test_min_size_unreachable_by_count():
  with pytest.raises(ValueError, match=r"`min_size`=61 is unreachable"):
    P.class_dirichlet(_LABELS, 10, 1.0, 0, min_size=61)


def test_min_size_unreachable_after_attempts():
  with pytest.raises(ValueError, match=r"`min_size`=55 is unreachable.*3 attempts"):
    P.class_dirichlet(_LABELS, 10, 0.01, 0, min_size=55, max_attempts=3)


def test_min_size_negative():
  with pytest.raises(ValueError, match=r"`min_size` must be an int >= 0"):
    P.class_dirichlet(_LABELS, 10, 1.0, 0, min_size=-1)


def test_samples_per_client_too_large():
  with pytest.raises(ValueError, match=r"`samples_per_client`=61 x 10 clients"):
    P.label_dirichlet(_LABELS, 10, 1.0, 0, samples_per_client=61)


@pytest.mark.parametrize("c", [0, 11, -1, 1.5])
def test_classes_per_client_out_of_range(c):
  with pytest.raises(ValueError, match=r"`classes_per_client` must be an int in \[1, 10\]"):
    P.pathological(_LABELS, 5, c, 0)


def test_too_many_shards():
  with pytest.raises(ValueError, match=r"`classes_per_client`=2 x `num_clients`=6"):
    P.pathological(np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1]), 6, 2, 0)


def test_bad_labels_and_seed():
  with pytest.raises(ValueError, match=r"`labels` must be a 1-D integer array"):
    P.homogeneous(np.zeros(5), 2, 0)
  with pytest.raises(ValueError, match=r"`seed` must be a non-negative int"):
    P.homogeneous(_LABELS, 2, -1)


# ------------------------------------------------------- permutations


def test_permute_features_true_permutation_per_client():
  rng = np.random.default_rng(0)
  base = rng.normal(size=(5, 4, 4))
  xs = {f"c{i}": base.copy() for i in range(4)}
  out = P.permute_features(xs, 7)
  perms = P.feature_permutations(list(xs), 16, 7)
  flats = []
  for cid, x in out.items():
    assert x.shape == (5, 4, 4)
    perm = perms[cid]
    assert sorted(perm) == list(range(16))
    np.testing.assert_array_equal(x.reshape(5, -1), base.reshape(5, -1)[:, perm])
    # same multiset of values per example: a true permutation.
    np.testing.assert_array_equal(np.sort(x.reshape(5, -1), 1), np.sort(base.reshape(5, -1), 1))
    flats.append(tuple(perm))
  assert len(set(flats)) == 4, "clients share a permutation"
  assert tuple(range(16)) not in flats  # every client permuted, none identity


def test_permute_features_seeded_and_list_input():
  xs = [np.arange(12.0).reshape(2, 6)] * 3
  a, b = P.permute_features(xs, 1), P.permute_features(xs, 1)
  assert isinstance(a, list) and len(a) == 3
  assert all(np.array_equal(u, v) for u, v in zip(a, b))
  c = P.permute_features(xs, 2)
  assert not all(np.array_equal(u, v) for u, v in zip(a, c))


def test_permute_features_validation():
  with pytest.raises(ValueError, match=r"`x_by_client` clients must share one input shape"):
    P.permute_features({"a": np.ones((1, 2)), "b": np.ones((1, 3))}, 0)
  with pytest.raises(ValueError, match=r"`x_by_client` must hold at least one"):
    P.permute_features({}, 0)

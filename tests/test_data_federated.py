"""Tests of FederatedData and from_client_arrays (no TFF computation is run)."""

import numpy as np
import pytest

from tfbfl.data import FederatedData
from tfbfl.data import from_client_arrays


def _clients(sizes, dim=3, num_classes=4, seed=0):
  rng = np.random.default_rng(seed)
  xs = [rng.normal(size=(n, dim)).astype(np.float64) for n in sizes]
  ys = [rng.integers(0, num_classes, size=n) for n in sizes]
  return xs, ys


# ------------------------------------------------------------- construction


def test_list_ids_are_zero_padded_and_sort_numerically():
  xs, ys = _clients([4] * 12)
  fd = from_client_arrays(xs, ys)
  assert fd.client_ids[:3] == ["client_00", "client_01", "client_02"]
  assert fd.client_ids[-1] == "client_11"
  assert fd.client_ids == sorted(fd.client_ids)
  # client i of the list is client_<i>: its examples come from xs[i].
  x, _ = fd.train["client_10"]
  rows = {tuple(r) for r in xs[10].astype(np.float32)}
  assert all(tuple(r) in rows for r in x)


def test_dict_with_test_arrays_kept_exactly_and_cast():
  xs, ys = _clients([5, 3])
  xt, yt = _clients([2, 0], seed=1)
  fd = from_client_arrays({
      "b": xs[0],
      "a": xs[1]
  }, {
      "b": ys[0],
      "a": ys[1]
  }, {
      "b": xt[0],
      "a": xt[1]
  }, {
      "b": yt[0],
      "a": yt[1]
  },
                          num_classes=4,
                          name="mine")
  assert fd.client_ids == ["a", "b"]
  assert fd.name == "mine" and fd.num_classes == 4 and fd.input_shape == (3,)
  np.testing.assert_array_equal(fd.train["b"][0], xs[0].astype(np.float32))
  np.testing.assert_array_equal(fd.test["b"][1], yt[0])
  assert fd.train["a"][0].dtype == np.float32
  assert fd.train["a"][1].dtype == np.int32
  assert fd.num_examples("a", "test") == 0


def test_split_sizes_cover_rows_and_are_seeded():
  xs, ys = _clients([8, 20, 3])
  fd = from_client_arrays(xs, ys, seed=3)
  for cid, n in zip(fd.client_ids, [8, 20, 3]):
    n_test = int(np.floor(n * 0.25 + 0.5))
    assert fd.num_examples(cid, "test") == n_test
    assert fd.num_examples(cid) == n - n_test
  # train + test is exactly the client's rows.
  x_all = np.concatenate([fd.train["client_01"][0], fd.test["client_01"][0]])
  assert sorted(map(tuple, x_all)) == sorted(map(tuple, xs[1].astype(np.float32)))
  again = from_client_arrays(xs, ys, seed=3)
  other = from_client_arrays(xs, ys, seed=4)
  np.testing.assert_array_equal(fd.test["client_01"][0], again.test["client_01"][0])
  assert not np.array_equal(fd.test["client_01"][0], other.test["client_01"][0])


def test_num_classes_inferred_from_all_splits():
  fd = from_client_arrays([np.ones((2, 1))], [np.array([0, 1])], [np.ones((1, 1))], [np.array([6])])
  assert fd.num_classes == 7


def test_integral_float_labels_accepted():
  fd = from_client_arrays([np.ones((4, 2))], [np.array([0.0, 1.0, 2.0, 1.0])])
  assert fd.pooled()[1].dtype == np.int32


# --------------------------------------------------------------- validation


def _raises(match, *args, **kwargs):
  with pytest.raises(ValueError, match=match):
    from_client_arrays(*args, **kwargs)


def test_empty_client():
  _raises(r"`x_by_client` of client 'client_01' is empty", [np.ones(
      (2, 2)), np.ones((0, 2))], [np.zeros(2, int), np.zeros(0, int)])


def test_no_clients():
  _raises(r"`x_by_client` must hold at least one client", [], [])


def test_mismatched_lengths():
  _raises(r"`x_by_client` and `y_by_client` of client 'a'.*3 and 2", {"a": np.ones((3, 2))},
          {"a": np.zeros(2, int)})


def test_mismatched_client_ids():
  _raises(r"`x_by_client` and `y_by_client` must have the same client ids", {"a": np.ones((3, 2))},
          {"b": np.zeros(3, int)})


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features(bad):
  x = np.ones((3, 2))
  x[1, 1] = bad
  _raises(r"`x_by_client` of client 'a' contains NaN or inf", {"a": x}, {"a": np.zeros(3, int)})


def test_features_overflowing_float32():
  _raises(r"`x_by_client` of client 'a' contains NaN or inf", {"a": np.full((2, 1), 1e300)},
          {"a": np.zeros(2, int)})


def test_non_numeric_features():
  _raises(r"`x_by_client` of client 'a' must be a real numeric array",
          {"a": np.array([["u"], ["v"]])}, {"a": np.zeros(2, int)})


def test_features_need_a_feature_axis():
  _raises(r"`x_by_client` of client 'a' must have shape \[n, \*input_shape\]", {"a": np.ones(3)},
          {"a": np.zeros(3, int)})


def test_labels_out_of_range():
  _raises(r"`y_by_client` of client 'a'.*expected labels in \[0, num_classes\) = \[0, 3\)",
          {"a": np.ones((2, 1))}, {"a": np.array([0, 3])},
          num_classes=3)


def test_negative_labels():
  _raises(r"`y_by_client` of client 'a'.*\[0, num_classes\)", {"a": np.ones((2, 1))},
          {"a": np.array([-1, 0])})


def test_test_labels_out_of_range():
  _raises(r"`y_test_by_client` of client 'a'.*\[0, 2\)", {"a": np.ones((2, 1))},
          {"a": np.array([0, 1])}, {"a": np.ones((1, 1))}, {"a": np.array([2])},
          num_classes=2)


def test_non_integer_labels():
  _raises(r"`y_by_client` of client 'a' must hold integer class labels", {"a": np.ones((2, 1))},
          {"a": np.array([0.0, 0.5])})


def test_string_labels():
  _raises(r"`y_by_client` of client 'a' must hold integer class labels", {"a": np.ones((2, 1))},
          {"a": np.array(["cat", "dog"])})


def test_labels_must_be_1d():
  _raises(r"`y_by_client` of client 'a' must have shape \[n\]", {"a": np.ones((2, 1))},
          {"a": np.zeros((2, 1), int)})


def test_bad_num_classes():
  _raises(r"`num_classes` must be a positive int", {"a": np.ones((2, 1))}, {"a": np.zeros(2, int)},
          num_classes=0)


def test_inconsistent_input_shapes():
  _raises(r"`x_by_client` of client 'b' has input shape \(3,\).*'a' has \(2,\)", {
      "a": np.ones((2, 2)),
      "b": np.ones((2, 3))
  }, {
      "a": np.zeros(2, int),
      "b": np.zeros(2, int)
  })


def test_test_input_shape_must_match_train():
  _raises(r"`x_test_by_client` of client 'a' has input shape \(5,\)", {"a": np.ones((2, 2))},
          {"a": np.zeros(2, int)}, {"a": np.ones((1, 5))}, {"a": np.zeros(1, int)})


@pytest.mark.parametrize("fraction", [0, 0.0, 1, 1.5, -0.2, "0.25", True])
def test_test_fraction_out_of_range(fraction):
  _raises(r"`test_fraction` must be a number in the open interval \(0, 1\)", [np.ones((4, 1))],
          [np.zeros(4, int)],
          test_fraction=fraction)


def test_client_left_without_training_examples():
  _raises(r"Client 'client_01' has 1 example.*0 training.*`test_fraction`",
          [np.ones((4, 1)), np.ones((1, 1))], [np.zeros(4, int), np.zeros(1, int)],
          test_fraction=0.6)


def test_test_arrays_come_together():
  _raises(r"`x_test_by_client` and `y_test_by_client` must be given together", [np.ones((4, 1))],
          [np.zeros(4, int)], [np.ones((1, 1))])


def test_test_arrays_need_same_clients():
  _raises(r"`x_by_client` and `x_test_by_client` must have the same client ids",
          {"a": np.ones((2, 1))}, {"a": np.zeros(2, int)}, {"b": np.ones(
              (1, 1))}, {"b": np.zeros(1, int)})


def test_dict_keys_must_be_str():
  _raises(r"`x_by_client` keys must be str client ids", {0: np.ones((2, 1))}, {0: np.zeros(2, int)})


def test_seed_must_be_int_or_generator():
  _raises(r"`seed` must be a non-negative int", [np.ones((4, 1))], [np.zeros(4, int)], seed="zero")


# ------------------------------------------------------------------- views


@pytest.fixture(name="fd")
def fd_fixture():
  xs, ys = _clients([6, 9, 4], dim=2, num_classes=3)
  return from_client_arrays({
      "c": xs[0],
      "a": xs[1],
      "b": xs[2]
  }, {
      "c": ys[0],
      "a": ys[1],
      "b": ys[2]
  },
                            seed=0)


def test_pooled_concatenates_in_client_order(fd):
  x, y = fd.pooled()
  assert x.shape == (sum(fd.num_examples(c) for c in fd.client_ids), 2)
  np.testing.assert_array_equal(y[:fd.num_examples("a")], fd.train["a"][1])
  np.testing.assert_array_equal(y[-fd.num_examples("c"):], fd.train["c"][1])
  xt, _ = fd.pooled("test")
  assert xt.shape[0] == sum(fd.num_examples(c, "test") for c in fd.client_ids)


def test_unknown_client_and_split(fd):
  with pytest.raises(ValueError, match=r"`client_id` 'zz' is not a client"):
    fd.num_examples("zz")
  with pytest.raises(ValueError, match=r"`split` must be one of \('train', 'test'\)"):
    fd.pooled("valid")


def test_subset(fd):
  sub = fd.subset(["c", "a"])
  assert sub.client_ids == ["a", "c"]
  np.testing.assert_array_equal(sub.test["c"][0], fd.test["c"][0])
  with pytest.raises(ValueError, match=r"`client_ids` must be a non-empty list"):
    fd.subset(["a", "nope"])
  with pytest.raises(ValueError, match=r"`client_ids`"):
    fd.subset([])


def test_create_tf_dataset(fd):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  ds = fd.create_tf_dataset("b", "test")
  assert ds.element_spec == (tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int32))
  xs = np.stack([x.numpy() for x, _ in ds])
  np.testing.assert_array_equal(xs, fd.test["b"][0])


def test_to_client_data_spec_and_counts(fd):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cd = fd.to_client_data("train")
  assert cd.client_ids == fd.client_ids
  assert cd.element_type_structure == (tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.int32))
  for cid in fd.client_ids:
    n = int(cd.create_tf_dataset_for_client(cid).reduce(0, lambda a, _: a + 1))
    assert n == fd.num_examples(cid)

  # The serializable function also works traced with a tf.string client id,
  # as TFF traces it (here inside a plain tf.function, no TFF computation).
  @tf.function
  def count_and_sum(cid):
    ds = cd.serializable_dataset_fn(cid)
    return ds.reduce((0, 0.0), lambda a, e: (a[0] + 1, a[1] + tf.reduce_sum(e[0])))

  for cid in fd.client_ids:
    n, s = count_and_sum(tf.constant(cid))
    assert int(n) == fd.num_examples(cid)
    np.testing.assert_allclose(float(s), fd.train[cid][0].sum(), rtol=1e-5)
  with pytest.raises(tf.errors.InvalidArgumentError, match="unknown client_id"):
    count_and_sum(tf.constant("nope"))


def test_federated_data_rejects_mismatched_splits():
  with pytest.raises(ValueError, match=r"`train` and `test` must have the same"):
    FederatedData("x", 2, (1,), {"a": (np.ones((1, 1)), [0])}, {})

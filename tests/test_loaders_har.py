"""HAR / HAPT loaders on tiny text files in the UCI layout, written by the test."""

import os

import numpy as np
import pytest

from tfbfl import data
from tfbfl.data import har

# split -> list of (subject, number of rows); subject 3 is in both splits.
ROWS = {"train": [(1, 9), (3, 6), (5, 8)], "test": [(2, 7), (3, 4)]}


def _rows(split, num_classes, seed):
  rng = np.random.default_rng(seed)
  subjects = np.concatenate([[s] * n for s, n in ROWS[split]])
  x = rng.uniform(-1, 1, size=(subjects.size, 561))
  # identifies the row: subject, split (test + 500), line
  x[:, 0] = subjects * 1000 + (500 if split == "test" else 0) + np.arange(subjects.size)
  y = np.arange(subjects.size) % num_classes + 1
  return x, y, subjects


def write_uci(directory, variant="har"):
  v = har.VARIANTS[variant]
  root = os.path.join(directory, v["root"])
  for (split, x_name, y_name, s_name), key in zip(v["splits"], ("train", "test")):
    os.makedirs(os.path.join(root, split))
    x, y, s = _rows(key, v["num_classes"], seed=len(key))
    with open(os.path.join(root, split, x_name), "w") as f:
      for row in x:  # the publisher's style: fixed width, leading spaces
        f.write("".join(f"{value:16.7e}" for value in row) + "\n")
    np.savetxt(os.path.join(root, split, y_name), y, fmt="%d")
    np.savetxt(os.path.join(root, split, s_name), s, fmt="%d")
  return str(directory)


@pytest.fixture(scope="module")
def har_dir(tmp_path_factory):
  return write_uci(tmp_path_factory.mktemp("har"))


def test_arrays_pool_train_then_test(har_dir):
  x, y, s = har.load_har_arrays(har_dir)
  assert x.shape == (34, 561) and x.dtype == np.float32
  assert y.min() == 0 and y.max() == 5
  assert s.tolist() == [1] * 9 + [3] * 6 + [5] * 8 + [2] * 7 + [3] * 4


def test_per_subject_clients_and_split(har_dir):
  fd = data.load_federated("har", data_dir=har_dir, num_clients=4, seed=0)
  assert fd.client_ids == ["subject_01", "subject_02", "subject_03", "subject_05"]
  assert fd.num_classes == 6 and fd.input_shape == (561,) and fd.name == "har"
  sizes = {"subject_01": 9, "subject_02": 7, "subject_03": 10, "subject_05": 8}
  for c, n in sizes.items():
    n_test = int(np.floor(n * 0.25 + 0.5))
    assert (fd.num_examples(c), fd.num_examples(c, "test")) == (n - n_test, n_test)
    x = np.concatenate([fd.train[c][0], fd.test[c][0]])
    assert set((x[:, 0] // 1000).astype(int)) == {int(c[-2:])}
  # subject 3's rows come from both publisher splits
  x3 = np.concatenate([fd.train["subject_03"][0], fd.test["subject_03"][0]])
  assert sorted((x3[:, 0] % 1000).astype(int)) == [9, 10, 11, 12, 13, 14, 507, 508, 509, 510]
  assert all(y.max() <= 5 for _, y in fd.train.values())


def test_subject_sampling_and_seed(har_dir):
  a = har.load_har(har_dir, num_clients=2, seed=1)
  b = har.load_har(har_dir, num_clients=2, seed=1)
  assert a.client_ids == b.client_ids and len(a.client_ids) == 2
  for c in a.client_ids:
    np.testing.assert_array_equal(a.test[c][0], b.test[c][0])
  splits = {tuple(har.load_har(har_dir, seed=s).test["subject_01"][0][:, 0]) for s in range(4)}
  assert len(splits) > 1
  with pytest.raises(ValueError, match=r"`num_clients`=5 exceeds the 4 clients"):
    har.load_har(har_dir, num_clients=5)


def test_data_dir_may_be_the_unzipped_folder(har_dir):
  fd = har.load_har(os.path.join(har_dir, "UCI HAR Dataset"))
  assert len(fd.client_ids) == 4


def test_hapt_variant(tmp_path):
  directory = write_uci(tmp_path, "hapt")
  fd = data.load_federated("hapt", data_dir=directory, num_clients=4)
  assert fd.num_classes == 12 and fd.name == "hapt"
  y = np.concatenate([fd.pooled("train")[1], fd.pooled("test")[1]])
  assert y.min() == 0 and y.max() == 11
  with pytest.raises(data.MissingDataError, match="UCI HAR Dataset"):
    data.load_federated("har", data_dir=directory)


def test_missing_file(tmp_path):
  directory = write_uci(tmp_path)
  os.remove(os.path.join(directory, "UCI HAR Dataset", "test", "subject_test.txt"))
  with pytest.raises(data.MissingDataError,
                     match=r"test[/\\]subject_test\.txt.*archive\.ics\.uci\.edu"):
    data.load_federated("har", data_dir=directory)
  with pytest.raises(data.MissingDataError, match="got None"):
    data.load_federated("har")


def _truncate(path, keep):
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text[:keep(text)])


def test_truncated_files(tmp_path):
  directory = write_uci(tmp_path / "a")
  x_path = os.path.join(directory, "UCI HAR Dataset", "train", "X_train.txt")
  _truncate(x_path, lambda t: len(t) - 100)  # cut inside the last line
  with pytest.raises(ValueError, match=r"X_train\.txt.*line 23 has 555 values"):
    har.load_har(directory)

  directory = write_uci(tmp_path / "b")
  y_path = os.path.join(directory, "UCI HAR Dataset", "test", "y_test.txt")
  _truncate(y_path, lambda t: t.index("\n", 5) + 1)  # whole lines lost
  with pytest.raises(ValueError, match=r"y_test\.txt.* 11, 3 and 11 lines"):
    har.load_har(directory)


def test_bad_values(tmp_path):
  directory = write_uci(tmp_path)
  y_path = os.path.join(directory, "UCI HAR Dataset", "train", "y_train.txt")
  np.savetxt(y_path, np.full(23, 7), fmt="%d")
  with pytest.raises(ValueError, match=r"y_train\.txt.*expected 1\.\.6"):
    har.load_har(directory)
  with open(y_path, "w") as f:
    f.write("1\n" * 22 + "walking\n")
  with pytest.raises(ValueError, match=r"y_train\.txt.*must be numbers"):
    har.load_har(directory)

"""Shakespeare loader on tiny LEAF JSON files written by the test."""

import json
import os

import numpy as np
import pytest

from tfbfl import data
from tfbfl.data import shakespeare

TEXT = ("To be, or not to be, that is the question:\nWhether 'tis nobler in "
        "the mind to suffer the slings & arrows of outrageous fortune, or to "
        "take arms against a sea of troubles {and} by opposing end them? ") * 3
# role -> (train sequences, test sequences); KING has less than one batch.
ROLES = {
    "HAMLET_HAMLET": (12, 3),
    "HAMLET_OPHELIA": (10, 0),
    "LEAR_KING": (9, 4),
    "LEAR_FOOL": (25, 6),
    "MACBETH_WITCH": (14, 2)
}


def sequences(n, offset):
  xs = [TEXT[i:i + 80] for i in range(offset, offset + n)]
  ys = [TEXT[i + 80] for i in range(offset, offset + n)]
  return xs, ys


def write_leaf(directory):
  for split, index in (("train", 0), ("test", 1)):
    os.makedirs(os.path.join(directory, split))
    obj = {"users": [], "num_samples": [], "hierarchies": [], "user_data": {}}
    for k, (role, counts) in enumerate(ROLES.items()):
      if counts[index] == 0:
        continue
      xs, ys = sequences(counts[index], offset=7 * k + 50 * index)
      obj["users"].append(role)
      obj["hierarchies"].append(role.split("_")[0])
      obj["num_samples"].append(len(ys))
      obj["user_data"][role] = {"x": xs, "y": ys}
    with open(os.path.join(directory, split, f"all_data_niid_0_{split}.json"), "w") as f:
      json.dump(obj, f)
  return str(directory)


@pytest.fixture(scope="module")
def leaf_dir(tmp_path_factory):
  return write_leaf(tmp_path_factory.mktemp("shakespeare"))


def test_vocabulary():
  assert shakespeare.VOCAB == ("\n\r !\"#$%&'()*,-./0123456789:;?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]_"
                               "abcdefghijklmnopqrstuvwxyz")
  assert len(shakespeare.VOCAB) == 86 == len(set(shakespeare.VOCAB))
  assert shakespeare.PAD_ID == 0 and shakespeare.OOV_ID == 87
  assert shakespeare.VOCAB_SIZE == shakespeare.NUM_CLASSES == 88
  ids = shakespeare.encode(["ab\n{", "Z~é "])
  assert ids.dtype == np.int32 and ids.shape == (2, 4)
  assert ids[0, :3].tolist() == [shakespeare.VOCAB.index(c) + 1 for c in "ab\n"]
  assert ids[0, 3] == ids[1, 1] == ids[1, 2] == shakespeare.OOV_ID
  assert shakespeare.decode(ids[0]) == "ab\n?"


def test_roles_with_a_full_batch(leaf_dir):
  fd = data.load_federated("shakespeare", data_dir=leaf_dir, num_clients=4)
  assert fd.client_ids == ["HAMLET_HAMLET", "HAMLET_OPHELIA", "LEAR_FOOL",
                           "MACBETH_WITCH"]  # LEAR_KING has 9 < 10
  assert fd.num_classes == 88 and fd.input_shape == (80,)
  assert fd.x_dtype == np.int32
  for c in fd.client_ids:
    assert (fd.num_examples(c), fd.num_examples(c, "test")) == ROLES[c]
    x, y = fd.train[c]
    assert x.dtype == np.int32 and x.shape == (ROLES[c][0], 80)
    assert y.dtype == np.int32 and 1 <= y.min() and y.max() <= 87
  assert fd.test["HAMLET_OPHELIA"][0].shape == (0, 80)


def test_tokens_are_the_text(leaf_dir):
  fd = shakespeare.load_shakespeare(leaf_dir, num_clients=None)
  k = list(ROLES).index("LEAR_FOOL")
  xs, ys = sequences(*ROLES["LEAR_FOOL"][:1], offset=7 * k)
  x, y = fd.train["LEAR_FOOL"]
  oov = str.maketrans("{}", "??")
  assert [shakespeare.decode(row) for row in x] == [s.translate(oov) for s in xs]
  np.testing.assert_array_equal(y, shakespeare.encode(ys).reshape(-1))
  # next character: y of sequence i is the last character of sequence i + 1
  np.testing.assert_array_equal(y[:-1], x[1:, -1])


def test_role_sampling_and_seed(leaf_dir):
  a = shakespeare.load_shakespeare(leaf_dir, num_clients=2, seed=3)
  b = shakespeare.load_shakespeare(leaf_dir, num_clients=2, seed=3)
  assert a.client_ids == b.client_ids and len(a.client_ids) == 2
  ids = {
      tuple(shakespeare.load_shakespeare(leaf_dir, num_clients=2, seed=s).client_ids)
      for s in range(6)
  }
  assert len(ids) > 1
  fd = shakespeare.load_shakespeare(leaf_dir, num_clients=None, min_sequences=1)
  assert len(fd.client_ids) == 5
  with pytest.raises(ValueError, match=r"`num_clients`=5 exceeds the 4 clients"):
    shakespeare.load_shakespeare(leaf_dir, num_clients=5)


def test_missing_and_truncated(tmp_path):
  with pytest.raises(data.MissingDataError, match=r"train[/\\]\*\.json.*leaf"):
    data.load_federated("shakespeare", data_dir=str(tmp_path))
  directory = write_leaf(tmp_path / "t")
  path = os.path.join(directory, "train", "all_data_niid_0_train.json")
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text[:-40])
  with pytest.raises(ValueError, match=r"all_data_niid_0_train\.json.*not a complete"):
    shakespeare.load_shakespeare(directory)


def test_bad_sequences(tmp_path):
  directory = write_leaf(tmp_path)
  path = os.path.join(directory, "test", "all_data_niid_0_test.json")
  with open(path) as f:
    obj = json.load(f)
  obj["user_data"]["LEAR_FOOL"]["x"][2] = "too short"
  with open(path, "w") as f:
    json.dump(obj, f)
  with pytest.raises(ValueError, match=r"test\.json.*LEAR_FOOL.*length 9"):
    shakespeare.load_shakespeare(directory, num_clients=None)
  obj["user_data"]["LEAR_FOOL"]["x"][2] = "x" * 80
  obj["user_data"]["LEAR_FOOL"]["y"][0] = "ab"
  with open(path, "w") as f:
    json.dump(obj, f)
  with pytest.raises(ValueError, match=r"LEAR_FOOL.*y 'ab'"):
    shakespeare.load_shakespeare(directory, num_clients=None)


def test_int_inputs_in_from_client_arrays():
  fd = data.from_client_arrays([np.arange(6).reshape(3, 2)], [np.zeros(3, int)], x_dtype="int32")
  assert fd.train["client_00"][0].dtype == np.int32
  assert fd.subset(["client_00"]).x_dtype == np.int32
  fd = data.from_client_arrays([np.ones((4, 2))], [np.zeros(4, int)])
  assert fd.x_dtype == np.float32 and fd.train["client_00"][0].dtype == np.float32
  with pytest.raises(ValueError, match="must hold integer inputs"):
    data.from_client_arrays([np.full((3, 2), 0.5)], [np.zeros(3, int)], x_dtype="int32")
  with pytest.raises(ValueError, match="int32 range"):
    data.from_client_arrays([np.full((3, 2), 2**40)], [np.zeros(3, int)], x_dtype="int32")
  with pytest.raises(ValueError, match="`x_dtype` must be one of"):
    data.from_client_arrays([np.ones((3, 2))], [np.zeros(3, int)], x_dtype="int8")

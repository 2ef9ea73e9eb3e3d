"""Shakespeare next-character prediction from LEAF JSON, one client per role.

Publisher's layout (LEAF, Caldas et al., 2018; https://github.com/
TalwalkarLab/leaf, `data/shakespeare`, produced by its `preprocess.sh`):

    data_dir/train/*.json   e.g. all_data_niid_0_keep_0_train_9.json
    data_dir/test/*.json

with the LEAF keys (`tfbfl.data.leaf`): `users` are roles ("THE_TRAGEDY_OF_
KING_LEAR_KING" ...), user_data[role]["x"] a list of 80-character strings and
["y"] the list of the characters that follow them (1-character strings).

Vocabulary (`VOCAB`, 86 characters; the same character set as TensorFlow
Federated's Shakespeare tutorial, here in ASCII order): newline, carriage
return, then the printable ASCII characters (space to '~') except the 11
characters `+ < = > \\ ^ \` { | } ~`:

    "\\n\\r !\\"#$%&'()*,-./0123456789:;?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]_abcdefghijklmnopqrstuvwxyz"

Token ids: 0 = padding (`PAD_ID`), 1..86 = `VOCAB[i - 1]`, 87 = any other
character (`OOV_ID`); `VOCAB_SIZE` = 88 ids, which is also `num_classes`
(targets are never padding).

Convention (VIRTUAL Sec. V: "The characters are arranged in sequences of 80
and further aggregated in batches of 10 sequences. Every role of a play is
considered as a individual client, and we excluded roles that do not contain
a single full batch"):

* x is int32 [n, 80] token ids (`FederatedData.x_dtype` int32), y int32 [n]
  the id of the next character; every x string must have exactly 80
  characters and every y exactly one (else ValueError naming the file);
* clients are the roles of the train files with at least `min_sequences`
  (10) train sequences; `num_clients` of them are drawn with the seed (None:
  all);
* the distribution's own train/test split is used; a role with no test
  sequence gets an empty test set.
"""

import numpy as np

from tfbfl.data import _files
from tfbfl.data import federated
from tfbfl.data import leaf

SEQ_LEN = 80
BATCH_SIZE = 10
VOCAB = "\n\r" + "".join(chr(c) for c in range(32, 127) if chr(c) not in "+<=>\\^`{|}~")
PAD_ID = 0
OOV_ID = len(VOCAB) + 1
VOCAB_SIZE = len(VOCAB) + 2
NUM_CLASSES = VOCAB_SIZE
LAYOUT = "<data_dir>/train/*.json and <data_dir>/test/*.json (LEAF JSON)"
SOURCE = ("Shakespeare is published by LEAF (https://github.com/TalwalkarLab/"
          "leaf, data/shakespeare: run ./preprocess.sh; the text comes from "
          "Project Gutenberg, https://www.gutenberg.org/ebooks/100).")

_TABLE = np.full(128, OOV_ID, dtype=np.int32)
for _i, _ch in enumerate(VOCAB):
  _TABLE[ord(_ch)] = _i + 1


def encode(strings):
  """Token ids of equal-length `strings`: int32 [len(strings), length]."""
  if not strings:
    return np.zeros((0, SEQ_LEN), np.int32)
  codes = np.frombuffer("".join(strings).encode("utf-32-le"), dtype="<u4")
  ids = np.where(codes < 128, _TABLE[np.minimum(codes, 127)], OOV_ID)
  return ids.astype(np.int32).reshape(len(strings), -1)


def decode(ids):
  """The string of token ids `ids` (padding dropped, OOV shown as '?')."""
  return "".join(VOCAB[i - 1] if 1 <= i <= len(VOCAB) else "?"
                 for i in np.asarray(ids).reshape(-1)
                 if i != PAD_ID)


def _count(path, user, data):
  del path, user
  return len(data["y"])


def _convert(path, user, data):
  xs, ys = data["x"], data["y"]
  bad_x = next((s for s in xs if not isinstance(s, str) or len(s) != SEQ_LEN), None)
  if bad_x is not None:
    raise ValueError(f"{path!r}: role {user!r} has an x of length "
                     f"{len(bad_x) if isinstance(bad_x, str) else type(bad_x).__name__}; "
                     f"expected strings of exactly {SEQ_LEN} characters.")
  bad_y = next((s for s in ys if not isinstance(s, str) or len(s) != 1), None)
  if bad_y is not None:
    raise ValueError(f"{path!r}: role {user!r} has a y {bad_y!r}; expected 1-character "
                     "strings.")
  return encode(xs), encode(ys).reshape(-1)


def load_shakespeare(data_dir, *, num_clients=100, seed=0, min_sequences=BATCH_SIZE):
  """Per-role Shakespeare (see the module docstring).

  Args:
    data_dir: directory of the LEAF `train/` and `test/` folders.
    num_clients: roles drawn with `seed` (None: all eligible roles).
    seed: int seed of the role draw.
    min_sequences: minimum train sequences of a role (one batch of 10).

  Returns:
    A `FederatedData` with x int32 [n, 80], input_shape (80,), 88 classes,
    clients named by their roles.
  """
  train_paths, test_paths = leaf.require_files(data_dir, "shakespeare", LAYOUT, SOURCE)
  counts = leaf.scan(train_paths, _count)
  eligible = [u for u, n in counts.items() if n >= min_sequences]
  if not eligible:
    raise ValueError(f"No role of {data_dir!r} has >= {min_sequences} train sequences "
                     "(`min_sequences`).")
  chosen = _files.select_clients(eligible, num_clients, seed, "shakespeare")
  train = leaf.collect(train_paths, chosen, _convert)
  test = leaf.collect(test_paths, chosen, _convert)
  empty = [(np.zeros((0, SEQ_LEN), np.int32), np.zeros((0,), np.int32))]
  xs, ys, xts, yts = {}, {}, {}, {}
  for c in chosen:
    xs[c] = np.concatenate([p[0] for p in train[c]])
    ys[c] = np.concatenate([p[1] for p in train[c]])
    xts[c] = np.concatenate([p[0] for p in test.get(c, empty)])
    yts[c] = np.concatenate([p[1] for p in test.get(c, empty)])
  return federated.from_client_arrays(xs,
                                      ys,
                                      xts,
                                      yts,
                                      num_classes=NUM_CLASSES,
                                      name="shakespeare",
                                      x_dtype="int32")

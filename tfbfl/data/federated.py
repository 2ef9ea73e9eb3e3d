"""`FederatedData`: per-client train/test arrays, and the user entry point.

`from_client_arrays` is the one public way to bring your own federated data:
give each client's features and labels (and optionally its own test split) and
get a checked `FederatedData` that every tfbfl algorithm and launcher accepts.

TensorFlow and TFF are imported lazily, only by the methods that build
datasets, so numpy-only users (PFNM matching, statistics) stay light.
"""

import numpy as np

from tfbfl.data import _validate
from tfbfl.data import split as split_lib

SPLITS = ("train", "test")
X_DTYPES = ("float32", "int32")


class FederatedData:
  """Per-client train/test numpy arrays.

  For every client id, `train[cid]` and `test[cid]` are `(x, y)` with x of
  dtype `x_dtype` (float32 by default; int32 for token ids such as
  Shakespeare's) and shape [n, *input_shape], and y int32 of shape [n] in
  [0, num_classes). A
  client's test part may be empty (n = 0); its train part never is when built
  by `from_client_arrays`.

  Attributes:
    name: dataset name shown in tables and logs.
    num_classes: number of classes.
    input_shape: shape of one example, a tuple of ints.
    x_dtype: numpy dtype of every x array: float32 (default) or int32.
    client_ids: sorted list of client ids (str); every per-client view
      (`pooled`, `to_client_data`, statistics) uses this order.
    train: dict client_id -> (x, y).
    test: dict client_id -> (x, y).
    calibration: None, or dict client_id -> (x, y): a part of each client's
      training data that it never trains on, for post-hoc calibration
      (`calibration_split`; FedAvg's `--temperature_scaling` fits its temperatures
      there). Evaluation then receives `test + calibration` per client.
    raw_input: a `tfbfl.data.preprocessing.RawInput` stating how a loader of a
      published dataset made x from the files' raw values (MNIST: uint8 / 255;
      FEMNIST: 1 - LEAF's pixel; PMNIST: also the client's permutation), or
      None (x is the raw input: bundled digits, the user's own arrays). Exports
      apply it inside the SavedModel (`tfbfl.export`).

  #### Examples

  ```python
  fd = tfbfl.data.from_client_arrays([x0, x1], [y0, y1])
  fd.client_ids                       # ['client_00', 'client_01']
  ds = fd.create_tf_dataset('client_00').batch(20)
  ```
  """

  raw_input = None  # set by the loaders of published datasets (see Attributes)
  calibration = None  # client_id -> (x, y) held out for calibration (`calibration_split`)

  def __init__(self, name, num_classes, input_shape, train, test, x_dtype="float32"):
    if set(train) != set(test):
      raise ValueError("`train` and `test` must have the same client ids, got "
                       f"{sorted(set(train) ^ set(test))} in only one of them.")
    x_dtype = np.dtype(x_dtype)
    if x_dtype.name not in X_DTYPES:
      raise ValueError(f"`x_dtype` must be one of {X_DTYPES}, got {x_dtype.name!r}.")
    self.x_dtype = x_dtype
    self.name = str(name)
    self.num_classes = int(num_classes)
    self.input_shape = tuple(int(d) for d in input_shape)
    self.client_ids = sorted(train)
    self.train = {c: _as_pair(*train[c], x_dtype) for c in self.client_ids}
    self.test = {c: _as_pair(*test[c], x_dtype) for c in self.client_ids}

  def __repr__(self):
    return (f"FederatedData(name={self.name!r}, clients={len(self.client_ids)}, "
            f"num_classes={self.num_classes}, input_shape={self.input_shape}, "
            f"train={self.pooled('train')[1].size}, "
            f"test={self.pooled('test')[1].size})")

  def _split(self, split):
    if split not in SPLITS:
      raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    return self.train if split == "train" else self.test

  def _client(self, client_id, split):
    arrays = self._split(split)
    if client_id not in arrays:
      raise ValueError(f"`client_id` {client_id!r} is not a client of {self.name!r}; "
                       f"expected one of {self.client_ids[:5]}{'...' if len(arrays) > 5 else ''}.")
    return arrays[client_id]

  def num_examples(self, client_id, split="train"):
    """Number of examples of `client_id` in `split` ('train' or 'test')."""
    return int(self._client(client_id, split)[1].shape[0])

  def pooled(self, split="train"):
    """(x, y) of all clients concatenated in `client_ids` order."""
    arrays = self._split(split)
    xs = [arrays[c][0] for c in self.client_ids]
    ys = [arrays[c][1] for c in self.client_ids]
    return np.concatenate(xs, axis=0), np.concatenate(ys, axis=0)

  def create_tf_dataset(self, client_id, split="train"):
    """An unbatched `tf.data.Dataset` of (x, y) for one client, in array order."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    x, y = self._client(client_id, split)
    return tf.data.Dataset.from_tensor_slices((x, y))

  def to_client_data(self, split="train"):
    """A `tff.simulation.datasets.ClientData` over the clients of `split`.

    Built with `ClientData.from_clients_and_tf_fn`. Called eagerly with a
    Python str the dataset function slices that client's numpy arrays; traced
    with a tf.string tensor (e.g. by `dataset_computation`) it looks the client
    up in constants holding the pooled arrays of `split` and their offsets.
    Element spec: (TensorSpec([*input_shape], x_dtype), TensorSpec([], int32)).
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    arrays = self._split(split)
    ids = list(self.client_ids)
    x_all, y_all = self.pooled(split)
    sizes = [arrays[c][1].shape[0] for c in ids]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def dataset_fn(client_id):
      if isinstance(client_id, (str, bytes)):
        cid = client_id.decode() if isinstance(client_id, bytes) else client_id
        return tf.data.Dataset.from_tensor_slices(self._client(cid, split))
      match = tf.equal(tf.constant(ids), client_id)
      found = tf.debugging.assert_equal(tf.reduce_any(match), True, message="unknown client_id")
      with tf.control_dependencies([found]):
        k = tf.argmax(tf.cast(match, tf.int32), output_type=tf.int64)
      off = tf.constant(offsets)
      start, stop = off[k], off[k + 1]
      return tf.data.Dataset.from_tensor_slices(
          (tf.constant(x_all)[start:stop], tf.constant(y_all)[start:stop]))

    return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(ids, dataset_fn)

  def subset(self, client_ids):
    """A `FederatedData` restricted to `client_ids` (same name and classes)."""
    client_ids = list(client_ids)
    unknown = [c for c in client_ids if c not in self.train]
    if unknown or not client_ids:
      raise ValueError("`client_ids` must be a non-empty list of ids of this dataset; "
                       f"unknown: {unknown[:5]}.")
    return FederatedData(self.name,
                         self.num_classes,
                         self.input_shape, {c: self.train[c] for c in client_ids},
                         {c: self.test[c] for c in client_ids},
                         x_dtype=self.x_dtype)


def _as_pair(x, y, x_dtype=np.float32):
  return np.asarray(x, dtype=x_dtype), np.asarray(y, dtype=np.int32)


def from_client_arrays(x_by_client,
                       y_by_client,
                       x_test_by_client=None,
                       y_test_by_client=None,
                       *,
                       num_classes=None,
                       test_fraction=0.25,
                       seed=0,
                       name="custom",
                       x_dtype="float32"):
  """Builds a checked `FederatedData` from per-client arrays.

  This is the public entry point for users bringing their own data.

  Args:
    x_by_client: dict client_id (str) -> features [n, *input_shape], or a list
      of such arrays; client `i` of a list gets the id `client_<i>`
      zero-padded to two or more digits (`client_00`, `client_01`, ...) so the
      ids sort in numeric order. Cast to `x_dtype`.
    y_by_client: labels [n] keyed like `x_by_client`: integers (or integral
      floats) in [0, num_classes). Cast to int32.
    x_test_by_client: optional test features keyed like `x_by_client`; give it
      together with `y_test_by_client`. A client's test arrays may be empty.
    y_test_by_client: optional test labels.
    num_classes: number of classes; None infers max label + 1 over all splits.
    test_fraction: when no test arrays are given, each client's examples are
      split at random (not stratified) into train and
      `floor(n * test_fraction + 0.5)` test examples; must be in (0, 1).
      Ignored when test arrays are given.
    seed: int or np.random.Generator for that split.
    name: dataset name.
    x_dtype: "float32" (default: real features, must be finite after the
      cast) or "int32" (integer inputs such as token ids: integer arrays, or
      integral floats, within the int32 range).

  Returns:
    A `FederatedData`.

  Raises:
    ValueError: naming the argument, the client id and the expected value, for
      an empty client, x/y length mismatch, non-finite features, non-integer or
      out-of-range labels, input shapes that differ across clients, test arrays
      with other client ids, `test_fraction` outside (0, 1), or a client left
      with no training example after the split.
  """
  x_dtype = np.dtype(x_dtype)
  if x_dtype.name not in X_DTYPES:
    raise ValueError(f"`x_dtype` must be one of {X_DTYPES}, got {x_dtype.name!r}.")
  xs = _validate.as_client_dict(x_by_client, "x_by_client")
  ys = _validate.as_client_dict(y_by_client, "y_by_client")
  _check_same_ids(xs, ys, "x_by_client", "y_by_client")
  if (x_test_by_client is None) != (y_test_by_client is None):
    raise ValueError("`x_test_by_client` and `y_test_by_client` must be given together; "
                     "got only one of them.")
  has_test = x_test_by_client is not None
  if not has_test:
    split_lib.check_test_fraction(test_fraction)

  x_by_arg = {"x_by_client": {}}
  y_by_arg = {"y_by_client": {}}
  for cid in sorted(xs):
    x = _validate.check_features(xs[cid], "x_by_client", cid, dtype=x_dtype)
    y = _validate.check_labels(ys[cid], "y_by_client", cid)
    _validate.check_pair(x, y, "x_by_client", "y_by_client", cid)
    x_by_arg["x_by_client"][cid], y_by_arg["y_by_client"][cid] = x, y

  if has_test:
    xts = _validate.as_client_dict(x_test_by_client, "x_test_by_client")
    yts = _validate.as_client_dict(y_test_by_client, "y_test_by_client")
    _check_same_ids(xs, xts, "x_by_client", "x_test_by_client")
    _check_same_ids(xs, yts, "x_by_client", "y_test_by_client")
    x_by_arg["x_test_by_client"], y_by_arg["y_test_by_client"] = {}, {}
    for cid in sorted(xs):
      x = _validate.check_features(xts[cid],
                                   "x_test_by_client",
                                   cid,
                                   allow_empty=True,
                                   dtype=x_dtype)
      y = _validate.check_labels(yts[cid], "y_test_by_client", cid, allow_empty=True)
      _validate.check_pair(x, y, "x_test_by_client", "y_test_by_client", cid)
      x_by_arg["x_test_by_client"][cid] = x
      y_by_arg["y_test_by_client"][cid] = y

  input_shape = _validate.check_input_shapes(x_by_arg)
  num_classes = _validate.check_num_classes(num_classes, y_by_arg)

  if has_test:
    train = {c: (x_by_arg["x_by_client"][c], y_by_arg["y_by_client"][c]) for c in xs}
    test = {c: (x_by_arg["x_test_by_client"][c], y_by_arg["y_test_by_client"][c]) for c in xs}
  else:
    train, test = split_lib.split_clients(x_by_arg["x_by_client"], y_by_arg["y_by_client"],
                                          test_fraction, seed)
  return FederatedData(name, num_classes, input_shape, train, test, x_dtype=x_dtype)


def _check_same_ids(a, b, a_arg, b_arg):
  if set(a) != set(b):
    only = sorted(set(a) ^ set(b))
    raise ValueError(f"`{a_arg}` and `{b_arg}` must have the same client ids; these appear "
                     f"in only one of them: {only[:5]}.")


def _hold_out(fd: FederatedData, fraction: float, seed: int, flag: str):
  """Each client's training data split by `split_lib.split_clients` (a `fraction`,
  rounded half up, drawn with `seed`): `(kept, held out)`, dicts client_id -> (x, y);
  a bad fraction or a client left without training data is named with `flag`."""
  xs = {c: fd.train[c][0] for c in fd.client_ids}
  ys = {c: fd.train[c][1] for c in fd.client_ids}
  try:
    return split_lib.split_clients(xs, ys, fraction, seed)
  except ValueError as e:
    raise ValueError(f"{flag}: {e}") from None


def calibration_split(fd: FederatedData, fraction: float, seed: int = 0) -> FederatedData:
  """`fd` with a `fraction` of each client's training data moved to `fd.calibration`.

  The same draw as `validation_split` (`split_clients`, rounded half up), from the
  seed `seed + 1` so that it differs from the validation split's.

  Raises:
    ValueError: `fraction` outside (0, 1), or a client left without a training
      example (named).
  """
  train, calibration = _hold_out(fd, fraction, seed + 1, "--calibration_fraction")
  out = FederatedData(f"{fd.name}[calibration {fraction:g}]", fd.num_classes, fd.input_shape,
                      train, fd.test, x_dtype=fd.x_dtype)
  out.raw_input = fd.raw_input
  out.calibration = {c: _as_pair(*calibration[c], fd.x_dtype) for c in out.client_ids}
  return out


def validation_split(fd: FederatedData, fraction: float, seed: int = 0) -> FederatedData:
  """`fd` with each client's test part replaced by a held-out part of its training data.

  For hyperparameter tuning that never reads the test data: each client's training
  examples are split by `tfbfl.data.split.split_clients` (a `fraction` of them,
  rounded half up, drawn with `seed`) into what it trains on and its test part.

  Raises:
    ValueError: `fraction` outside (0, 1), or a client left without a training
      example (named).
  """
  train, test = _hold_out(fd, fraction, seed, "--validation_fraction")
  out = FederatedData(f"{fd.name}[validation {fraction:g}]", fd.num_classes, fd.input_shape,
                      train, test, x_dtype=fd.x_dtype)
  out.raw_input = fd.raw_input  # the same clients and features
  return out

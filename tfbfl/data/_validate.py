"""Checks and normalisation of user-supplied per-client arrays.

Every error is a ValueError that names the argument, the client id and the
expected value, so a user bringing their own data sees what to fix.
"""

import numbers

import numpy as np


def client_id(index, num_clients):
  """The id of client `index` of `num_clients` for data given as a list.

  Ids are `client_<index>` zero-padded to at least two digits (and to the
  width of `num_clients - 1`), so the lexicographic order of the ids is the
  numeric order of the clients: `client_00, client_01, ..., client_10`.
  """
  width = max(2, len(str(max(num_clients - 1, 0))))
  return f"client_{index:0{width}d}"


def as_client_dict(arrays, arg):
  """Returns `arrays` as a dict client_id -> array.

  Args:
    arrays: A dict with str keys, or a list/tuple (client `i` gets the id
      `client_id(i, len(arrays))`).
    arg: The argument name used in error messages.
  """
  if isinstance(arrays, dict):
    for key in arrays:
      if not isinstance(key, str):
        raise ValueError(f"`{arg}` keys must be str client ids, got {key!r} of type "
                         f"{type(key).__name__}.")
    if not arrays:
      raise ValueError(f"`{arg}` must hold at least one client, got none.")
    return dict(arrays)
  if isinstance(arrays, (list, tuple)):
    if not arrays:
      raise ValueError(f"`{arg}` must hold at least one client, got none.")
    return {client_id(i, len(arrays)): a for i, a in enumerate(arrays)}
  raise ValueError(f"`{arg}` must be a dict client_id -> array or a list of arrays, got "
                   f"{type(arrays).__name__}.")


def check_features(x, arg, cid, allow_empty=False, dtype=np.float32):
  """Returns `x` as an array of shape [n, *input_shape] and `dtype`, checked.

  `dtype` is float32 (the default: features must be finite after the cast)
  or int32 (integer inputs such as token ids: integer or integral-float
  arrays whose values fit in int32).
  """
  x = np.asarray(x)
  if x.dtype == bool or not (np.issubdtype(x.dtype, np.integer) or
                             np.issubdtype(x.dtype, np.floating)):
    raise ValueError(f"`{arg}` of client {cid!r} must be a real numeric array, got dtype "
                     f"{x.dtype}.")
  if x.ndim < 2:
    raise ValueError(f"`{arg}` of client {cid!r} must have shape [n, *input_shape] with at "
                     f"least one feature axis, got shape {x.shape}.")
  if x.shape[0] == 0 and not allow_empty:
    raise ValueError(f"`{arg}` of client {cid!r} is empty; every client needs at least one "
                     "example.")
  if np.dtype(dtype) == np.int32:
    return _as_int32_features(x, arg, cid)
  with np.errstate(over="ignore"):  # overflow becomes inf, reported below
    x = x.astype(np.float32)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"`{arg}` of client {cid!r} contains NaN or inf features (after the "
                     "cast to float32); expected finite values.")
  return x


def _as_int32_features(x, arg, cid):
  if np.issubdtype(x.dtype, np.floating):
    if not np.all(np.isfinite(x)) or np.any(x != np.round(x)):
      raise ValueError(f"`{arg}` of client {cid!r} must hold integer inputs (x_dtype "
                       "int32), got non-integer or non-finite values.")
  info = np.iinfo(np.int32)
  if x.size and (x.min() < info.min or x.max() > info.max):
    raise ValueError(f"`{arg}` of client {cid!r} has values in [{x.min()}, {x.max()}]; "
                     f"expected values in the int32 range [{info.min}, {info.max}].")
  return x.astype(np.int32)


def check_labels(y, arg, cid, allow_empty=False):
  """Returns `y` as an int64 array of shape [n]; float labels must be integral."""
  y = np.asarray(y)
  if y.ndim != 1:
    raise ValueError(f"`{arg}` of client {cid!r} must have shape [n], got shape {y.shape}.")
  if y.shape[0] == 0 and not allow_empty:
    raise ValueError(f"`{arg}` of client {cid!r} is empty; every client needs at least one "
                     "example.")
  if np.issubdtype(y.dtype, np.integer):
    if y.dtype == np.uint64 and y.size and y.max() > np.iinfo(np.int64).max:
      raise ValueError(f"`{arg}` of client {cid!r} has labels up to {y.max()}; expected small "
                       "non-negative class indices.")
    return y.astype(np.int64)
  if np.issubdtype(y.dtype, np.floating):
    if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
      raise ValueError(f"`{arg}` of client {cid!r} must hold integer class labels, got "
                       "non-integer values.")
    if y.size and np.max(np.abs(y)) > 2.0**62:  # would not survive the int64 cast
      raise ValueError(
          f"`{arg}` of client {cid!r} has labels up to {np.max(np.abs(y)):g}; expected "
          "small non-negative class indices.")
    return y.astype(np.int64)
  raise ValueError(f"`{arg}` of client {cid!r} must hold integer class labels, got dtype "
                   f"{y.dtype}.")


def check_pair(x, y, x_arg, y_arg, cid):
  """Checks that `x` and `y` of one client have the same number of examples."""
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"`{x_arg}` and `{y_arg}` of client {cid!r} must have the same number "
                     f"of examples, got {x.shape[0]} and {y.shape[0]}.")


def check_num_classes(num_classes, labels_by_arg):
  """Returns the number of classes, given or inferred, checking every label.

  Args:
    num_classes: None (inferred as max label + 1) or a positive int.
    labels_by_arg: dict arg_name -> dict client_id -> int64 labels.
  """
  if num_classes is not None:
    if (not isinstance(num_classes, numbers.Integral) or isinstance(num_classes, bool) or
        num_classes < 1):
      raise ValueError(f"`num_classes` must be a positive int or None, got {num_classes!r}.")
    num_classes = int(num_classes)
  else:
    top = -1
    for by_client in labels_by_arg.values():
      for y in by_client.values():
        if y.size:
          top = max(top, int(y.max()))
    num_classes = max(top + 1, 1)
  for arg, by_client in labels_by_arg.items():
    for cid, y in by_client.items():
      if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"`{arg}` of client {cid!r} has labels in [{y.min()}, {y.max()}]; "
                         f"expected labels in [0, num_classes) = [0, {num_classes}).")
  return num_classes


def check_input_shapes(x_by_arg):
  """Returns the common input shape; all clients must share it.

  Args:
    x_by_arg: dict arg_name -> dict client_id -> float32 features.
  """
  reference = None
  for arg, by_client in x_by_arg.items():
    for cid, x in by_client.items():
      shape = tuple(int(d) for d in x.shape[1:])
      if reference is None:
        reference = (shape, arg, cid)
      elif shape != reference[0]:
        raise ValueError(f"`{arg}` of client {cid!r} has input shape {shape}, but "
                         f"`{reference[1]}` of client {reference[2]!r} has "
                         f"{reference[0]}; every client must share one input shape.")
  return reference[0]

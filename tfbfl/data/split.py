"""Per-client train/test split, for datasets that ship without one.

Convention (VIRTUAL, Sec. V: "a 75%-25% train-test split is performed" for VSN
and HAR): each client's examples are split independently, uniformly at random,
without stratification. A client with `n` examples gets
`floor(n * test_fraction + 0.5)` test examples (round half up) and the rest for
training; both parts keep the original order of the examples.
"""

import numbers

import numpy as np

from tfbfl.data import _seeds


def check_test_fraction(test_fraction):
  """Raises ValueError unless `test_fraction` is a real number in (0, 1)."""
  if (isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real) or
      not 0.0 < float(test_fraction) < 1.0):
    raise ValueError(f"`test_fraction` must be a number in the open interval (0, 1), got "
                     f"{test_fraction!r}.")
  return float(test_fraction)


def num_test_examples(n, test_fraction):
  """Number of test examples taken from a client with `n` examples."""
  return int(np.floor(n * test_fraction + 0.5))


def split_indices(n, test_fraction, rng):
  """Returns (train_idx, test_idx), sorted, for one client with `n` examples."""
  order = rng.permutation(n)
  n_test = num_test_examples(n, test_fraction)
  return np.sort(order[n_test:]), np.sort(order[:n_test])


def split_clients(x_by_client, y_by_client, test_fraction, seed):
  """Splits every client's arrays into train and test parts.

  Args:
    x_by_client: dict client_id -> features [n, ...].
    y_by_client: dict client_id -> labels [n].
    test_fraction: fraction in (0, 1) of each client's examples held out.
    seed: int or np.random.Generator. With an int, client `k` (in sorted id
      order) uses the k-th child of `np.random.SeedSequence(seed)`.

  Returns:
    (train, test): two dicts client_id -> (x, y).

  Raises:
    ValueError: if `test_fraction` is outside (0, 1), or a client is left with
      no training example (the message names `test_fraction` and the client).
  """
  test_fraction = check_test_fraction(test_fraction)
  ids = sorted(x_by_client)
  seeds = _seeds.derive_seeds(seed, len(ids))
  train, test = {}, {}
  for cid, client_seed in zip(ids, seeds):
    x, y = x_by_client[cid], y_by_client[cid]
    tr, te = split_indices(len(y), test_fraction, np.random.default_rng(client_seed))
    if tr.size == 0:
      raise ValueError(f"Client {cid!r} has {len(y)} example(s) and would keep 0 training "
                       f"examples with `test_fraction`={test_fraction}; lower "
                       "`test_fraction` or give the client more examples.")
    train[cid] = (x[tr], y[tr])
    test[cid] = (x[te], y[te])
  return train, test

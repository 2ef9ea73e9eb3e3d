"""Partitioners: split a pooled labelled dataset over clients.

Each partitioner takes the pooled labels (int array [N]), the number of
clients and a seed (non-negative int or `np.random.Generator`), and returns a
list of `num_clients` int64 index arrays into the pool: pairwise disjoint,
each sorted ascending. `homogeneous`, `class_dirichlet` and `pathological`
cover every index; `label_dirichlet` uses `samples_per_client * num_clients`
of them. The docstring of each names the convention it implements.

`permute_features` is the feature-side half of the Permuted-MNIST convention:
it is applied per client after a `homogeneous` split (partition "permuted").
"""

import numbers

import numpy as np

from tfbfl.data import _seeds

# ---------------------------------------------------------------- checks


def _check_labels(labels):
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"`labels` must be a 1-D integer array, got dtype {labels.dtype} and "
                     f"shape {labels.shape}.")
  if labels.size and labels.min() < 0:
    raise ValueError(f"`labels` must be non-negative, got {labels.min()}.")
  return labels


def _check_num_clients(num_clients, num_samples):
  if (isinstance(num_clients, bool) or not isinstance(num_clients, numbers.Integral) or
      num_clients < 1):
    raise ValueError(f"`num_clients` must be an int >= 1, got {num_clients!r}.")
  if num_clients > num_samples:
    raise ValueError(f"`num_clients`={num_clients} exceeds the number of samples "
                     f"({num_samples}); expected num_clients <= {num_samples}.")
  return int(num_clients)


def _check_alpha(alpha):
  if (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not np.isfinite(alpha) or
      alpha <= 0):
    raise ValueError(f"`alpha` must be a finite number > 0, got {alpha!r}.")
  return float(alpha)


def _check_int(value, name, low):
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low):
    raise ValueError(f"`{name}` must be an int >= {low}, got {value!r}.")
  return int(value)


def _dirichlet(rng, concentration):
  """A Dirichlet draw; guards the all-zero underflow of tiny concentrations."""
  p = rng.dirichlet(concentration)
  if not np.all(np.isfinite(p)) or p.sum() <= 0:
    p = np.zeros_like(concentration)
    p[rng.choice(len(concentration), p=concentration / concentration.sum())] = 1
  return p / p.sum()


def _finish(buckets):
  return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


# ----------------------------------------------------------- partitioners


def homogeneous(labels, num_clients, seed):
  """IID split: a uniform random permutation cut into `num_clients` parts.

  Convention: the "homogeneous"/IID split of McMahan et al. (2017) and of the
  MNIST rows of VIRTUAL's Table I. Every index is used; client sizes are
  `N // num_clients` or one more (the first `N % num_clients` clients get the
  extra example), so with N divisible by num_clients all sizes are equal.
  """
  labels = _check_labels(labels)
  num_clients = _check_num_clients(num_clients, labels.size)
  rng = _seeds.as_generator(seed)
  return _finish(np.array_split(rng.permutation(labels.size), num_clients))


def class_dirichlet(labels, num_clients, alpha, seed, min_size=10, max_attempts=1000, balance=True):
  """Per-class Dirichlet over clients (PFNM / FedMA convention).

  Convention of Yurochkin et al. (2019, PFNM) and Wang et al. (2020, FedMA):
  for each class k (in increasing label order) draw p_k ~ Dir(alpha * 1_J)
  over the J clients and give client j the fraction p_kj of class k's
  shuffled examples (cut points `floor(cumsum(p_k) * N_k)`). With
  `balance=True`, as in that convention, a client already holding at least
  N / J examples gets no share of the classes still to be dealt (p_kj set to
  0 and p_k renormalised). The whole draw is repeated until every client
  holds at least `min_size` examples. Every index is used.

  Args:
    labels: int array [N].
    num_clients: J >= 1.
    alpha: concentration > 0; small alpha = strongly non-IID.
    seed: int or np.random.Generator.
    min_size: minimum examples per client (>= 0).
    max_attempts: number of draws tried before giving up.
    balance: apply the N / J cap described above.

  Raises:
    ValueError: bad `alpha`, `num_clients` or `min_size`; `min_size` is
      unreachable (min_size * J > N, or no draw in `max_attempts` met it).
  """
  labels = _check_labels(labels)
  n = labels.size
  num_clients = _check_num_clients(num_clients, n)
  alpha = _check_alpha(alpha)
  min_size = _check_int(min_size, "min_size", 0)
  max_attempts = _check_int(max_attempts, "max_attempts", 1)
  if min_size * num_clients > n:
    raise ValueError(f"`min_size`={min_size} is unreachable: {num_clients} clients x "
                     f"{min_size} > {n} samples; expected min_size <= {n // num_clients}.")
  rng = _seeds.as_generator(seed)
  by_class = [np.flatnonzero(labels == k) for k in np.unique(labels)]
  for _ in range(max_attempts):
    buckets = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for idx in by_class:
      idx = rng.permutation(idx)
      p = _dirichlet(rng, np.full(num_clients, alpha))
      if balance:
        capped = p * (sizes < n / num_clients)
        if capped.sum() > 0:
          p = capped / capped.sum()
      cuts = (np.cumsum(p) * idx.size).astype(np.int64)[:-1]
      for j, part in enumerate(np.split(idx, cuts)):
        buckets[j].extend(part.tolist())
        sizes[j] += part.size
    if sizes.min() >= min_size:
      return _finish(buckets)
  raise ValueError(f"`min_size`={min_size} is unreachable: no per-class Dirichlet draw with "
                   f"alpha={alpha} gave every one of {num_clients} clients >= {min_size} "
                   f"examples in {max_attempts} attempts; lower min_size or raise alpha.")


def label_dirichlet(labels, num_clients, alpha, seed, samples_per_client=None):
  """Per-client label Dirichlet (Hsu et al. 2019 convention, used by FOLA).

  Client j draws its label distribution q_j ~ Dir(alpha * p), with p the
  global class prior (class frequencies of `labels`; classes absent from
  `labels` are ignored), then `samples_per_client` examples are drawn without
  replacement: class counts ~ Multinomial(samples_per_client, q_j). Clients
  are served in order 0..J-1; when a class runs out, its probability mass is
  renormalised over the classes that still have examples, so late clients can
  be slightly less skewed than q_j. alpha -> inf gives IID clients,
  alpha -> 0 one class per client.

  Args:
    labels: int array [N].
    num_clients: J >= 1.
    alpha: concentration > 0.
    seed: int or np.random.Generator.
    samples_per_client: examples per client (equal sizes); default N // J.

  Raises:
    ValueError: bad `alpha` or `num_clients`, or
      `samples_per_client * num_clients > N`.
  """
  labels = _check_labels(labels)
  n = labels.size
  num_clients = _check_num_clients(num_clients, n)
  alpha = _check_alpha(alpha)
  if samples_per_client is None:
    samples_per_client = n // num_clients
  samples_per_client = _check_int(samples_per_client, "samples_per_client", 1)
  if samples_per_client * num_clients > n:
    raise ValueError(f"`samples_per_client`={samples_per_client} x {num_clients} clients "
                     f"exceeds the {n} samples; expected samples_per_client <= "
                     f"{n // num_clients}.")
  rng = _seeds.as_generator(seed)
  classes, counts = np.unique(labels, return_counts=True)
  prior = counts / n
  pools = [rng.permutation(np.flatnonzero(labels == k)) for k in classes]
  used = np.zeros(classes.size, dtype=np.int64)
  buckets = []
  for _ in range(num_clients):
    q = _dirichlet(rng, alpha * prior)
    take = np.zeros(classes.size, dtype=np.int64)
    need = samples_per_client
    while need > 0:
      avail = counts - used - take
      w = q * (avail > 0)
      w = w / w.sum() if w.sum() > 0 else (avail > 0) / np.sum(avail > 0)
      draw = np.minimum(rng.multinomial(need, w), avail)
      take += draw
      need -= int(draw.sum())
    buckets.append(
        np.concatenate([pools[k][used[k]:used[k] + take[k]] for k in range(classes.size)]))
    used += take
  return _finish(buckets)


def pathological(labels, num_clients, classes_per_client, seed):
  """Label shards, k per client (McMahan et al. 2017 pathological non-IID).

  Convention of McMahan et al. (2017, FedAvg, "sort by digit label, divide
  into 200 shards of size 300, assign each of 100 clients 2 shards"): the
  examples (shuffled within each class) are sorted by label and cut into
  `num_clients * classes_per_client` contiguous shards of near-equal size;
  each client gets `classes_per_client` shards at random. A client therefore
  sees about `classes_per_client` classes: fewer when two of its shards share
  a class, more when a shard straddles a class boundary (at most
  2 * classes_per_client). Every index is used.

  Raises:
    ValueError: bad `num_clients`; `classes_per_client` not in
      [1, number of classes present], or more shards than samples.
  """
  labels = _check_labels(labels)
  n = labels.size
  num_clients = _check_num_clients(num_clients, n)
  num_classes = np.unique(labels).size
  if (isinstance(classes_per_client, bool) or
      not isinstance(classes_per_client, numbers.Integral) or
      not 1 <= classes_per_client <= num_classes):
    raise ValueError(f"`classes_per_client` must be an int in [1, {num_classes}] (the "
                     f"number of classes present), got {classes_per_client!r}.")
  num_shards = num_clients * int(classes_per_client)
  if num_shards > n:
    raise ValueError(f"`classes_per_client`={classes_per_client} x `num_clients`="
                     f"{num_clients} shards exceed the {n} samples.")
  rng = _seeds.as_generator(seed)
  order = rng.permutation(n)
  order = order[np.argsort(labels[order], kind="stable")]
  shards = np.array_split(order, num_shards)
  assignment = rng.permutation(num_shards).reshape(num_clients, -1)
  return _finish([np.concatenate([shards[s] for s in row]) for row in assignment])


def permuted(labels, num_clients, seed):
  """Index half of the Permuted-MNIST convention: a `homogeneous` split.

  The features of each client are then permuted with `permute_features`
  (VIRTUAL Sec. V, PMNIST: "randomly split into 100 sections ... a random
  permutation of pixels is applied to every single client dataset").
  """
  return homogeneous(labels, num_clients, seed)


# --------------------------------------------------- feature permutations


def feature_permutations(client_ids, num_features, seed):
  """One uniformly random permutation of `num_features` features per client.

  Every client, the first included, gets a random permutation (no client is
  forced to the identity, following VIRTUAL's PMNIST: "a random permutation
  of pixels is applied to every single client dataset"). Clients are served
  in sorted id order, so with an int `seed` the result depends only on
  (seed, sorted ids, num_features).

  Returns:
    dict client_id -> int64 permutation array [num_features].
  """
  num_features = _check_int(num_features, "num_features", 1)
  rng = _seeds.as_generator(seed)
  return {c: rng.permutation(num_features) for c in sorted(client_ids)}


def apply_permutation(x, permutation):
  """Permutes the flattened feature axes of `x` [n, *shape]; keeps the shape."""
  x = np.asarray(x)
  flat = x.reshape(x.shape[0], -1)
  return flat[:, permutation].reshape(x.shape)


def permute_features(x_by_client, seed):
  """Applies one random feature permutation per client (PMNIST convention).

  Args:
    x_by_client: dict client_id -> features [n, *input_shape] (all clients
      sharing input_shape), or a list (client i keyed by its position).
    seed: int or np.random.Generator, see `feature_permutations`. Pass the
      same int to permute a client's train and test features identically.

  Returns:
    The permuted features, as a dict or list matching `x_by_client`. The
    flattened feature axes are permuted; shapes are unchanged.
  """
  is_list = isinstance(x_by_client, (list, tuple))
  xs = dict(enumerate(x_by_client)) if is_list else dict(x_by_client)
  if not xs:
    raise ValueError("`x_by_client` must hold at least one client, got none.")
  shapes = {tuple(np.shape(x)[1:]) for x in xs.values()}
  if len(shapes) != 1:
    raise ValueError(f"`x_by_client` clients must share one input shape, got {sorted(shapes)}.")
  num_features = int(np.prod(shapes.pop(), dtype=np.int64))
  if is_list:
    rng = _seeds.as_generator(seed)
    perms = {i: rng.permutation(num_features) for i in range(len(xs))}
  else:
    perms = feature_permutations(list(xs), num_features, seed)
  out = {c: apply_permutation(xs[c], perms[c]) for c in xs}
  return [out[i] for i in range(len(xs))] if is_list else out


PARTITIONERS = {
    "homogeneous": homogeneous,
    "class_dirichlet": class_dirichlet,
    "label_dirichlet": label_dirichlet,
    "pathological": pathological,
    "permuted": permuted,
}

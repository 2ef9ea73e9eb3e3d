"""Mean-field Gaussian factors in natural parameters.

A mean-field (fully factorised) Gaussian over the variables of a model is stored
as a `NaturalGaussian`: two nested structures (`tf.nest` lists, tuples, dicts;
one leaf per model variable) of identical structure and shapes,

```none
eta1 = mu * lambda,     eta2 = lambda,     lambda = 1 / sigma**2  (precision)
```

so that each entry's log-density is `eta1 * x - eta2 * x**2 / 2 + const`.
In these coordinates the factor algebra used by VIRTUAL (cavities, deltas,
damping), FOLA (precision-weighted product) and PFNM (posterior means of matched
neurons) is linear:

```none
product     q1 * q2 * ... * qK      eta_i = sum_k eta_i^(k)
ratio       q1 / q2                 eta_i = eta_i^(1) - eta_i^(2)
power       q ** a                  eta_i = a * eta_i
damping     q_new**g * q_old**(1-g) eta_i = g * eta_i^new + (1 - g) * eta_i^old
weighted    prod_n q_n ** a_n       lambda = sum_n a_n lambda_n,
                                    mu = lambda**-1 * sum_n a_n lambda_n mu_n
```

An all-zero pair `(0, 0)` is the improper flat factor (`flat`), the identity of
`product`.

The Kullback-Leibler divergence between univariate normals,

```none
KL(p || q) = log(s_q / s_p) + (s_p**2 + (m_p - m_q)**2) / (2 s_q**2) - 1/2,
```

reads in natural parameters (`m = eta1 / eta2`, `s**2 = 1 / eta2`)

```none
KL(p || q) = 1/2 * [ r - 1 - log(r) + eta2_q * (m_p - m_q)**2 ],
             r = eta2_q / eta2_p,
```

and `kl_divergence` sums it over every entry of the structure.

#### Non-positive precision policy

A product or damping of proper factors is proper, but a ratio need not be:
`eta2 = eta2_num - eta2_den` may be zero or negative. `ratio` never returns
such entries silently and never produces NaN; it follows `on_nonpositive`:

* `"raise"` (default of `ratio`): if any entry has `eta2 <= 0` the call fails
  with the message `'ratio left N entries with non-positive precision'`.
  Eagerly this is a `ValueError`; inside a graph (`tf.function`, TFF) it is a
  `tf.errors.InvalidArgumentError` when the graph runs.
* `"floor"` (default of `ratio_with_count`): every entry with
  `eta2 <= min_precision` is replaced by a very broad factor with precision
  `min_precision` and the numerator's mean,
  `(eta1, eta2) = (min_precision * eta1_num / eta2_num, min_precision)`
  (mean 0 when the numerator itself is flat). `ratio_with_count` also returns
  the number of entries replaced, so callers can log or react to it.
* `"allow"`: the ratio is returned as is. For EP *site factors* and deltas
  (VIRTUAL's `s_i` and `Delta_i`), which are unnormalised and may legitimately
  have non-positive precision entries; only their products with a proper
  factor are densities. `ratio_with_count` still counts the entries with
  `eta2 <= min_precision`.

`check_valid` applies the same kind of check (positive, finite) to any factor.

Every function accepts numpy arrays, Python numbers or tensors as leaves and
returns tensors (a Python list is a structure to `tf.nest`, not a leaf).
Tensors keep their floating dtype, numpy arrays keep theirs, everything else
becomes `tf.float32`; non-tensor leaves adopt the dtype of a tensor leaf they
are combined with, and two different floating dtypes of the same kind (two
tensors, or two numpy arrays) are a `ValueError` rather than a silent cast.
All functions use TF ops only and work in
graph mode (`tf.function`, TFF computations).

#### Examples

```python
import tensorflow as tf
from tfbfl import gaussian

prior = gaussian.from_loc_scale({'w': tf.zeros(3)}, {'w': tf.ones(3)})
like = gaussian.from_loc_scale({'w': tf.constant([1., 2., 3.])},
                               {'w': tf.fill([3], .5)})
post = gaussian.product(prior, like)           # precisions add: 1 + 4 = 5
gaussian.mean(post)['w']                       # ==> [0.8, 1.6, 2.4]
cavity = gaussian.ratio(post, like)            # ==> prior again
gaussian.kl_divergence(post, prior)            # scalar
damped = gaussian.damp(post, prior, 0.5)       # convex combination
draw = gaussian.sample(post, seed=tf.constant([1, 2]))
cavity, n = gaussian.ratio_with_count(prior, post)  # n == 3 entries floored
```
"""

import collections
import math

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

__all__ = [
    "NaturalGaussian",
    "check_valid",
    "damp",
    "flat",
    "floor_precision",
    "from_loc_scale",
    "isotropic_power",
    "kl_divergence",
    "kl_divergence_elementwise",
    "mean",
    "mean_log_precision",
    "power",
    "precision",
    "precision_weighted_mean",
    "product",
    "ratio",
    "ratio_with_count",
    "sample",
    "to_loc_scale",
    "to_normal",
    "variance",
]

_POLICIES = ("raise", "floor", "allow")


class NaturalGaussian(collections.namedtuple("NaturalGaussian", ["eta1", "eta2"])):
  """A mean-field Gaussian in natural parameters.

  `eta1 = mu * lambda` and `eta2 = lambda = 1 / sigma**2`, each a nested
  structure (one leaf per model variable) of identical structure and shapes.
  Being a namedtuple, it is itself a `tf.nest` / TFF structure, so it can be
  passed through `tf.function`, `tf.nest.map_structure` and TFF computations.

  No validation happens on construction (`tf.nest` rebuilds instances with
  arbitrary leaves); the functions of this module validate their arguments.
  """

  __slots__ = ()


# ---------------------------------------------------------------------------
# Conversion and validation helpers.


def _leaf_dtype(x):
  """Floating dtype carried by a leaf, or None if it carries none."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    return None
  try:
    dtype = tf.as_dtype(dtype)
  except TypeError:
    return None
  return dtype if dtype.is_floating else None


def _convert_leaves(leaves, name):
  """Converts leaves that are combined elementwise to tensors of one dtype."""
  # A tensor's dtype wins over a numpy array's, which wins over float32, so
  # mixing e.g. a Python number with a float64 tensor just works.
  tensor_dtypes = {x.dtype for x in leaves if tf.is_tensor(x) and x.dtype.is_floating}
  if len(tensor_dtypes) > 1:
    raise ValueError(f"`{name}`: expected leaves of one floating dtype to combine, got "
                     f"{sorted(d.name for d in tensor_dtypes)}.")
  if tensor_dtypes:
    dtype = tensor_dtypes.pop()
  else:
    other = {_leaf_dtype(x) for x in leaves} - {None}
    if len(other) > 1:
      raise ValueError(f"`{name}`: expected leaves of one floating dtype to combine, got "
                       f"{sorted(d.name for d in other)}.")
    dtype = other.pop() if other else tf.float32
  out = []
  for x in leaves:
    if tf.is_tensor(x) and x.dtype != dtype:
      x = tf.cast(x, dtype)  # only non-floating tensors reach here
    out.append(tf.convert_to_tensor(x, dtype=dtype))
  first = out[0].shape
  for t in out[1:]:
    if not first.is_compatible_with(t.shape):
      raise ValueError(f"`{name}`: expected leaves of identical shape, got {first} and "
                       f"{t.shape}.")
  return out


def _as_gaussian(g, name):
  """Checks that `g` looks like a `NaturalGaussian`; returns one."""
  if isinstance(g, NaturalGaussian):
    eta1, eta2 = g.eta1, g.eta2
  elif hasattr(g, "eta1") and hasattr(g, "eta2"):
    # E.g. a TFF `Struct` whose Python container type was lost.
    eta1, eta2 = g.eta1, g.eta2
  else:
    raise ValueError(f"`{name}` must be a `NaturalGaussian` (with fields `eta1`, `eta2`), "
                     f"got {type(g).__name__}.")
  try:
    tf.nest.assert_same_structure(eta1, eta2, check_types=False)
  except (ValueError, TypeError) as e:
    raise ValueError(f"`{name}.eta1` and `{name}.eta2` must have the same structure: "
                     f"{e}") from None
  return NaturalGaussian(eta1, eta2)


def _canonical(named_gaussians):
  """Converts `[(g, name), ...]` to `NaturalGaussian`s of tensors.

  Leaves at the same position in all the factors are converted together, so
  they share one dtype and their shapes are checked against each other.
  """
  gs = [_as_gaussian(g, n) for g, n in named_gaussians]
  names = [n for _, n in named_gaussians]
  ref = gs[0].eta1
  for g, n in zip(gs[1:], names[1:]):
    try:
      tf.nest.assert_same_structure(ref, g.eta1, check_types=False)
    except (ValueError, TypeError) as e:
      raise ValueError(f"`{n}` must have the same structure as `{names[0]}`: {e}") from None
  n = len(tf.nest.flatten(ref))
  e1s = [tf.nest.flatten(g.eta1) for g in gs]
  e2s = [tf.nest.flatten(g.eta2) for g in gs]
  label = "`, `".join(names)
  # converted[i] = [eta1_i of every factor..., eta2_i of every factor...].
  converted = [_convert_leaves([e[i] for e in e1s] + [e[i] for e in e2s], label) for i in range(n)]
  k = len(gs)
  return [
      NaturalGaussian(tf.nest.pack_sequence_as(ref, [c[j]
                                                     for c in converted]),
                      tf.nest.pack_sequence_as(ref, [c[k + j]
                                                     for c in converted]))
      for j in range(k)
  ]


def _scalar(value, dtype):
  """`value` as a tensor of `dtype`, without a float32 detour for numbers."""
  if tf.is_tensor(value):
    return tf.cast(value, dtype)
  return tf.convert_to_tensor(np.asarray(value, dtype.as_numpy_dtype))


def _map(fn, *structures):
  return tf.nest.map_structure(fn, *structures)


def _count(predicate_fn, structure):
  """int32 number of entries of `structure` where `predicate_fn` is True."""
  counts = [
      tf.math.count_nonzero(predicate_fn(x), dtype=tf.int32) for x in tf.nest.flatten(structure)
  ]
  return tf.add_n(counts) if counts else tf.constant(0, tf.int32)


def _guard(condition, template, args, structure):
  """Fails unless `condition`; returns `structure` made dependent on the check.

  `template` uses `{}` placeholders filled with the scalar tensors `args`.
  Eagerly the failure is a `ValueError`; in a graph an `Assert` op, attached by
  control dependencies so that TF1-style graphs (TFF) cannot prune it.
  """
  if tf.executing_eagerly():
    if not bool(condition):
      raise ValueError(template.format(*[a.numpy() for a in args]))
    return structure
  message = tf.strings.format(template, args)
  check = tf.debugging.Assert(condition, [message])
  with tf.control_dependencies([check]):
    return _map(tf.identity, structure)


def _check_python_number(value, name, low=None, high=None, low_open=False):
  """Validates `value` if it is a Python/numpy number; tensors pass through."""
  if tf.is_tensor(value):
    return
  try:
    array = np.asarray(value, dtype=np.float64)
  except (TypeError, ValueError):
    raise ValueError(f"`{name}` must be a real number, got {value!r}.") from None
  if array.ndim != 0:
    raise ValueError(f"`{name}` must be a scalar, got shape {array.shape}.")
  v = float(array)
  if not math.isfinite(v):
    raise ValueError(f"`{name}` must be finite, got {v}.")
  if low is not None and (v < low or (low_open and v == low)):
    bound = f"> {low}" if low_open else f">= {low}"
    raise ValueError(f"`{name}` must be {bound}, got {v}.")
  if high is not None and v > high:
    raise ValueError(f"`{name}` must be <= {high}, got {v}.")


# ---------------------------------------------------------------------------
# Parameterisations.


def from_loc_scale(loc, scale):
  """Builds a `NaturalGaussian` from means and standard deviations.

  `eta1 = loc / scale**2`, `eta2 = 1 / scale**2`, entrywise.

  Args:
    loc: Nested structure of means (tensors, numpy arrays or numbers).
    scale: Structure like `loc` of standard deviations, expected positive.

  Returns:
    A `NaturalGaussian` with the structure of `loc`.

  Raises:
    ValueError: if `loc` and `scale` differ in structure, shape or dtype.
  """
  # Reuse the joint conversion by treating (loc, scale) as a pseudo-factor.
  pair = _canonical([(NaturalGaussian(loc, scale), "(loc, scale)")])[0]
  prec = _map(lambda s: tf.math.reciprocal(tf.math.square(s)), pair.eta2)
  eta1 = _map(tf.math.multiply, pair.eta1, prec)
  return NaturalGaussian(eta1, prec)


def to_loc_scale(g):
  """Returns `(loc, scale)` structures: `eta1 / eta2` and `eta2**-1/2`.

  Only meaningful where `eta2 > 0` (see `check_valid`).

  Args:
    g: A `NaturalGaussian`.

  Returns:
    A tuple `(loc, scale)` of structures like `g.eta1`.
  """
  g = _canonical([(g, "g")])[0]
  loc = _map(tf.math.divide, g.eta1, g.eta2)
  scale = _map(tf.math.rsqrt, g.eta2)
  return loc, scale


def mean(g):
  """Structure of means `mu = eta1 / eta2` (meaningful where `eta2 > 0`)."""
  g = _canonical([(g, "g")])[0]
  return _map(tf.math.divide, g.eta1, g.eta2)


def variance(g):
  """Structure of variances `sigma**2 = 1 / eta2` (meaningful where `eta2 > 0`)."""
  g = _canonical([(g, "g")])[0]
  return _map(tf.math.reciprocal, g.eta2)


def precision(g):
  """Structure of precisions `lambda = eta2`."""
  return _canonical([(g, "g")])[0].eta2


def to_normal(g):
  """Structure of `tfp.distributions.Normal(eta1 / eta2, eta2**-1/2)`."""
  loc, scale = to_loc_scale(g)
  return _map(lambda m, s: tfp.distributions.Normal(loc=m, scale=s), loc, scale)


def flat(like, dtype=None):
  """The improper flat factor `(eta1, eta2) = (0, 0)`, identity of `product`.

  Args:
    like: A nested structure of tensors, arrays or `tf.TensorSpec`s, or a
      `NaturalGaussian` (its `eta1` structure is used). Gives structure and
      shapes.
    dtype: Floating dtype of the result. Default: each leaf's floating dtype,
      `tf.float32` for leaves that have none.

  Returns:
    A `NaturalGaussian` of zeros with the structure and shapes of `like`.

  Raises:
    ValueError: if `dtype` is not a floating dtype.
  """
  if dtype is not None:
    dtype = tf.as_dtype(dtype)
    if not dtype.is_floating:
      raise ValueError(f"`dtype` must be a floating dtype, got {dtype.name}.")
  if isinstance(like, NaturalGaussian) or (hasattr(like, "eta1") and hasattr(like, "eta2")):
    like = like.eta1

  def zeros(x):
    leaf_dtype = dtype or _leaf_dtype(x) or tf.float32
    if isinstance(x, tf.TensorSpec):
      return tf.zeros(x.shape, leaf_dtype)
    if tf.is_tensor(x):
      if x.shape.is_fully_defined():
        return tf.zeros(x.shape, leaf_dtype)
      return tf.zeros(tf.shape(x), leaf_dtype)  # dynamic shape in a graph
    return tf.zeros(np.shape(x), leaf_dtype)

  zero = _map(zeros, like)
  return NaturalGaussian(zero, zero)


# ---------------------------------------------------------------------------
# Factor algebra.


def isotropic_power(like, scale, power):
  """`N(0, scale^2)^power` in natural parameters, shaped like `like`.

  `(eta1, eta2) = (0, power / scale^2)` per entry: the prior `p(theta)` raised to
  `power` (VIRTUAL's `p^(1/K)`), with the structure, shapes and dtypes of `like`
  (a `NaturalGaussian`; its `eta2` leaves give them, dynamic shapes allowed).
  """
  prec = power / scale**2
  return NaturalGaussian(
      tf.nest.map_structure(tf.zeros_like, like.eta1),
      tf.nest.map_structure(lambda e: tf.fill(tf.shape(e), tf.constant(prec, e.dtype)), like.eta2))


def mean_log_precision(g):
  """Mean of `log eta2` over every entry of every leaf of `g` (a scalar tensor)."""
  leaves = [tf.reshape(t, [-1]) for t in tf.nest.flatten(g.eta2)]
  return tf.reduce_mean(tf.math.log(tf.concat(leaves, 0)))


def floor_precision(g, fallback, min_precision):
  """Entries of `g` with precision below `min_precision` take that precision and
  the mean of `fallback` (`eta1 = min_precision * mean(fallback)`); the others are
  kept. Returns `(floored NaturalGaussian, number of floored entries)` (int32)."""
  fallback_mean = mean(fallback)

  def fix(e1, e2, m):
    bad = e2 < min_precision
    return (tf.where(bad, min_precision * m,
                     e1), tf.where(bad,
                                   tf.ones_like(e2) * min_precision,
                                   e2), tf.reduce_sum(tf.cast(bad, tf.int32)))

  fixed = tf.nest.map_structure(fix, g.eta1, g.eta2, fallback_mean)
  leaves = tf.nest.flatten(fixed)
  eta1 = tf.nest.pack_sequence_as(g.eta1, leaves[0::3])
  eta2 = tf.nest.pack_sequence_as(g.eta2, leaves[1::3])
  return NaturalGaussian(eta1, eta2), tf.add_n(leaves[2::3])


def product(*gs):
  """Product of Gaussian factors: `eta = sum_k eta^(k)`.

  For proper factors this is the (unnormalised) density product: precisions
  add and the mean is the precision-weighted mean of the means.

  Args:
    *gs: One or more `NaturalGaussian`s of identical structure.

  Returns:
    A `NaturalGaussian`.

  Raises:
    ValueError: if no factor is given, or the factors differ in structure,
      shape or dtype.
  """
  if not gs:
    raise ValueError("`product` expected at least one `NaturalGaussian`, "
                     "got none.")
  gs = _canonical([(g, f"gs[{i}]") for i, g in enumerate(gs)])
  if len(gs) == 1:
    return gs[0]
  eta1 = _map(lambda *xs: tf.math.add_n(list(xs)), *[g.eta1 for g in gs])
  eta2 = _map(lambda *xs: tf.math.add_n(list(xs)), *[g.eta2 for g in gs])
  return NaturalGaussian(eta1, eta2)


def ratio_with_count(numerator, denominator, *, on_nonpositive="floor", min_precision=1e-8):
  """Ratio `numerator / denominator` and the number of floored entries.

  `eta = eta^num - eta^den`; entries whose precision is not positive are
  handled by `on_nonpositive` (see the module docstring):

  * `"raise"`: fail if any `eta2 <= 0` ('ratio left N entries with
    non-positive precision'); the count returned is then 0.
  * `"floor"`: every entry with `eta2 <= min_precision` (or NaN) becomes
    `(min_precision * mu^num, min_precision)`, `mu^num = eta1^num / eta2^num`
    (0 where `eta2^num == 0`); the count is the number of such entries.

  Args:
    numerator: A `NaturalGaussian`.
    denominator: A `NaturalGaussian` of the same structure.
    on_nonpositive: `"floor"` (default) or `"raise"`.
    min_precision: Positive floor for the precision, Python number or scalar
      tensor.

  Returns:
    A tuple `(ratio, num_floored)`: a `NaturalGaussian` and an int32 scalar.

  Raises:
    ValueError: on an unknown `on_nonpositive`, a non-positive or non-finite
      `min_precision`, mismatched factors, or (eagerly, under `"raise"`)
      non-positive precisions. In a graph the latter is an
      `InvalidArgumentError` at run time.
  """
  if on_nonpositive not in _POLICIES:
    raise ValueError(f"`on_nonpositive` must be one of {_POLICIES}, got "
                     f"{on_nonpositive!r}.")
  _check_python_number(min_precision, "min_precision", low=0., low_open=True)
  num, den = _canonical([(numerator, "numerator"), (denominator, "denominator")])
  eta1 = _map(tf.math.subtract, num.eta1, den.eta1)
  eta2 = _map(tf.math.subtract, num.eta2, den.eta2)

  if on_nonpositive == "allow":
    count = _count(lambda x: tf.math.logical_not(x > _scalar(min_precision, x.dtype)), eta2)
    return NaturalGaussian(eta1, eta2), count

  if on_nonpositive == "raise":
    # `not (x > 0)` also catches NaN.
    bad = _count(lambda x: tf.math.logical_not(x > 0), eta2)
    out = _guard(tf.equal(bad, 0), "ratio left {} entries with non-positive precision", [bad],
                 NaturalGaussian(eta1, eta2))
    return out, tf.constant(0, tf.int32)

  def floor(e1, e2, n1, n2):
    floor_value = _scalar(min_precision, e2.dtype)
    keep = e2 > floor_value
    # divide_no_nan: a flat numerator gets mean 0 instead of NaN.
    num_mean = tf.math.divide_no_nan(n1, n2)
    return (tf.where(keep, e1, floor_value * num_mean), tf.where(keep, e2, floor_value))

  floored = [
      floor(*leaves) for leaves in zip(tf.nest.flatten(eta1), tf.nest.flatten(eta2),
                                       tf.nest.flatten(num.eta1), tf.nest.flatten(num.eta2))
  ]
  count = _count(lambda x: tf.math.logical_not(x > _scalar(min_precision, x.dtype)), eta2)
  out = NaturalGaussian(tf.nest.pack_sequence_as(eta1, [f[0] for f in floored]),
                        tf.nest.pack_sequence_as(eta2, [f[1] for f in floored]))
  return out, count


def ratio(numerator, denominator, *, on_nonpositive="raise", min_precision=1e-8):
  """Ratio `numerator / denominator`: `eta = eta^num - eta^den`.

  Same as `ratio_with_count` without the count, and raising by default:
  see there and the module docstring for the non-positive precision policy.

  Args:
    numerator: A `NaturalGaussian`.
    denominator: A `NaturalGaussian` of the same structure.
    on_nonpositive: `"raise"` (default), `"floor"` or `"allow"`.
    min_precision: Positive precision floor used by `"floor"`.

  Returns:
    A `NaturalGaussian`.

  Raises:
    ValueError: see `ratio_with_count`.
  """
  out, _ = ratio_with_count(numerator,
                            denominator,
                            on_nonpositive=on_nonpositive,
                            min_precision=min_precision)
  return out


def power(g, a):
  """Power `g**a`: `eta = a * eta^g`.

  `a = 1` is the identity, `a = 0` the flat factor, `a = -1` the inverse.

  Args:
    g: A `NaturalGaussian`.
    a: Finite scalar exponent, Python number or scalar tensor.

  Returns:
    A `NaturalGaussian`.

  Raises:
    ValueError: if `a` is a non-scalar or non-finite Python number.
  """
  _check_python_number(a, "a")
  g = _canonical([(g, "g")])[0]
  scale = lambda x: _scalar(a, x.dtype) * x
  return NaturalGaussian(_map(scale, g.eta1), _map(scale, g.eta2))


def damp(new, old, gamma):
  """Damped update `new**gamma * old**(1 - gamma)`.

  `eta = gamma * eta^new + (1 - gamma) * eta^old`, a convex combination, so
  `gamma = 1` returns `new`, `gamma = 0` returns `old`, and proper inputs give
  a proper result.

  Args:
    new: A `NaturalGaussian`.
    old: A `NaturalGaussian` of the same structure.
    gamma: Damping factor in `[0, 1]`, Python number or scalar tensor
      (validated when it is a Python number).

  Returns:
    A `NaturalGaussian`.

  Raises:
    ValueError: if a Python `gamma` is outside `[0, 1]`, or the factors are
      mismatched.
  """
  _check_python_number(gamma, "gamma", low=0., high=1.)
  new, old = _canonical([(new, "new"), (old, "old")])

  def mix(n, o):
    g = _scalar(gamma, n.dtype)
    # Not `o + g * (n - o)`: this form returns each endpoint exactly.
    return g * n + (1. - g) * o

  return NaturalGaussian(_map(mix, new.eta1, old.eta1), _map(mix, new.eta2, old.eta2))


def precision_weighted_mean(gs, weights):
  """Weighted product `prod_n g_n**a_n` of several factors.

  ```none
  lambda = sum_n a_n lambda_n,   mu = lambda**-1 sum_n a_n lambda_n mu_n
  ```

  i.e. `eta = sum_n a_n eta^(n)`: the precision-weighted mean of the clients'
  means (FOLA's server step, PFNM's matched-neuron posterior). Multiplying
  every `lambda_n` by the same `c > 0` leaves `mu` unchanged. All-zero
  weights give the flat factor.

  Args:
    gs: Non-empty list or tuple of `NaturalGaussian`s of one structure.
    weights: Non-negative weights `a_n`, one per factor: a Python list, numpy
      array or 1-D tensor of length `len(gs)`.

  Returns:
    A `NaturalGaussian`.

  Raises:
    ValueError: if `gs` is empty or not a sequence of factors, `weights` is
      not 1-D of length `len(gs)`, or has negative or non-finite entries
      (for a tensor: eagerly; in a graph an `InvalidArgumentError` at run
      time).
  """
  if isinstance(gs, NaturalGaussian) or not isinstance(gs, (list, tuple)):
    raise ValueError("`gs` must be a list or tuple of `NaturalGaussian`s, "
                     f"got {type(gs).__name__}.")
  if not gs:
    raise ValueError("`gs` must contain at least one `NaturalGaussian`.")
  gs = _canonical([(g, f"gs[{i}]") for i, g in enumerate(gs)])
  n = len(gs)
  flat_leaves = tf.nest.flatten(gs[0].eta1)
  dtype = flat_leaves[0].dtype if flat_leaves else tf.float32

  if tf.is_tensor(weights):
    if weights.shape.rank is not None and weights.shape.rank != 1:
      raise ValueError(f"`weights` must be 1-D, got shape {weights.shape}.")
    if weights.shape.rank == 1 and weights.shape[0] not in (None, n):
      raise ValueError(f"`weights` must have length len(gs) = {n}, got "
                       f"{weights.shape[0]}.")
    w = tf.cast(weights, dtype)
    w = _guard(
        tf.math.logical_and(tf.equal(tf.size(w), n),
                            tf.reduce_all(tf.math.logical_and(w >= 0, tf.math.is_finite(w)))),
        "`weights` must be " + str(n) + " non-negative finite numbers, got {}", [w], w)
    ws = tf.unstack(tf.reshape(w, [n]), num=n)
  else:
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim != 1:
      raise ValueError(f"`weights` must be 1-D, got shape {array.shape}.")
    if array.shape[0] != n:
      raise ValueError(f"`weights` must have length len(gs) = {n}, got "
                       f"{array.shape[0]}.")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
      raise ValueError("`weights` must be non-negative and finite, got "
                       f"{array.tolist()}.")
    ws = [tf.constant(v, dtype) for v in array]

  def combine(*xs):
    return tf.math.add_n([wi * x for wi, x in zip(ws, xs)])

  return NaturalGaussian(_map(combine, *[g.eta1 for g in gs]), _map(combine, *[g.eta2 for g in gs]))


# ---------------------------------------------------------------------------
# Divergence, sampling, validation.


def kl_divergence_elementwise(p, q):
  """Entrywise `KL(p || q)` between the normals of two factors.

  ```none
  KL = 1/2 * [ r - 1 - log(r) + eta2_q * (m_p - m_q)**2 ],
  r = eta2_q / eta2_p,  m = eta1 / eta2
  ```

  `r - 1 - log r` is evaluated as `x - log1p(x)`, `x = (eta2_q - eta2_p) /
  eta2_p`, to limit cancellation near `r = 1`; the result is clipped at 0
  against rounding, so it is exactly 0 for equal factors and never negative.
  Both factors need positive precision.

  Args:
    p: A `NaturalGaussian`.
    q: A `NaturalGaussian` of the same structure.

  Returns:
    A structure like `p.eta1` of KL values.
  """
  p, q = _canonical([(p, "p"), (q, "q")])

  def kl(e1p, e2p, e1q, e2q):
    x = (e2q - e2p) / e2p
    shift = e2q * tf.math.squared_difference(e1p / e2p, e1q / e2q)
    return tf.math.maximum(0.5 * (x - tf.math.log1p(x) + shift), 0.)

  return _map(kl, p.eta1, p.eta2, q.eta1, q.eta2)


def kl_divergence(p, q):
  """`sum_entries KL(p || q)`, a scalar; see `kl_divergence_elementwise`."""
  terms = tf.nest.flatten(kl_divergence_elementwise(p, q))
  if not terms:
    return tf.constant(0., tf.float32)
  return tf.math.add_n([tf.reduce_sum(t) for t in terms])


def sample(g, seed):
  """One reparameterised draw `mu + eps / sqrt(eta2)`, `eps ~ N(0, 1)`.

  Stateless (TFF forbids graph-level seeds): the same `seed` gives the same
  draw. Each leaf uses its own seed from
  `tf.random.experimental.stateless_split(seed, num_leaves)`, so leaves with
  equal parameters get independent noise.

  Args:
    g: A `NaturalGaussian` with positive precisions.
    seed: Integer tensor (or list) of shape `[2]`.

  Returns:
    A structure like `g.eta1` of samples.

  Raises:
    ValueError: if `seed` does not have shape `[2]` or an integer dtype.
  """
  g = _canonical([(g, "g")])[0]
  seed = tf.convert_to_tensor(seed)
  if not seed.dtype.is_integer:
    raise ValueError(f"`seed` must be an integer tensor, got {seed.dtype.name}.")
  if not seed.shape.is_compatible_with([2]):
    raise ValueError(f"`seed` must have shape [2], got {seed.shape}.")
  eta1 = tf.nest.flatten(g.eta1)
  eta2 = tf.nest.flatten(g.eta2)
  if not eta1:
    return g.eta1
  seeds = tf.random.experimental.stateless_split(seed, num=len(eta1))
  draws = []
  for i, (e1, e2) in enumerate(zip(eta1, eta2)):
    eps = tf.random.stateless_normal(tf.shape(e1), seed=seeds[i], dtype=e1.dtype)
    draws.append(e1 / e2 + eps * tf.math.rsqrt(e2))
  return tf.nest.pack_sequence_as(g.eta1, draws)


def check_valid(g, name):
  """Checks that every precision is positive and every parameter finite.

  Args:
    g: A `NaturalGaussian`.
    name: Python string naming `g` in the error message.

  Returns:
    `g` converted to tensors; in a graph, made dependent on the check.

  Raises:
    ValueError: eagerly, if some `eta2 <= 0` or some parameter is not finite.
      In a graph the check is an `Assert` and fails with
      `tf.errors.InvalidArgumentError` at run time.
  """
  if not isinstance(name, str):
    raise ValueError(f"`name` must be a string, got {type(name).__name__}.")
  g = _canonical([(g, name)])[0]
  nonpositive = _count(lambda x: tf.math.logical_not(x > 0), g.eta2)
  nonfinite = _count(lambda x: tf.math.logical_not(tf.math.is_finite(x)), [g.eta1, g.eta2])
  # `{}` in a user-given name would be read as a placeholder.
  label = name.replace("{", "(").replace("}", ")")
  return _guard(tf.math.logical_and(tf.equal(nonpositive, 0), tf.equal(nonfinite, 0)),
                label + ": {} entries with non-positive precision and {} non-finite "
                "parameters", [nonpositive, nonfinite], g)

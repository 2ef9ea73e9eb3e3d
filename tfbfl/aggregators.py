"""`tff.aggregators` factories over Gaussian factors in natural parameters.

A mean-field Gaussian factor travels as `NaturalGaussian(eta1, eta2)` with
`eta1 = mu * prec` and `eta2 = prec`. In these coordinates the algebra the server
needs is linear:

* product of factors  `prod_i t_i`            = `sum_i eta(t_i)`            (VIRTUAL:
  the aggregate update `Delta = prod_{i in C_t} Delta_i`);
* tempered product    `prod_n t_n^(a_n)`, with `a_n = w_n / sum_m w_m`
                                              = `sum_n a_n eta(t_n)`        (FOLA: the
  precision-weighted mean `Lambda_S = sum a_n Lambda_n`,
  `mu_S = Lambda_S^-1 sum a_n Lambda_n mu_n`).

So both are plain federated sums / weighted means of the natural parameters, and
`GaussianProductFactory` is *composed* of TFF's own factories, exactly like
`tff.aggregators.MeanFactory` is composed of its `value_sum_factory`: pass a secure
or differentially private sum as `value_sum_factory` and Gaussian factors are
aggregated with it, unchanged. Only the aggregate ever reaches the server.

`PrecisionWeightedMeanFactory` adapts model values to this algebra, so that it
serves as the `model_aggregator` of a `tff.learning` process (e.g.
`tff.learning.algorithms.build_weighted_fed_avg`): each client's value `v_n`
(weights or delta) with a per-coordinate precision `lambda_n` becomes the factor
`(lambda_n v_n, lambda_n)`, the weighted `GaussianProductFactory` averages them,
and the server returns `sum a_n lambda_n v_n / sum a_n lambda_n` (FOLA's
precision-weighted mean; with plain weights, precisions 1: FedAvg's mean).

Secure sum (`sum_factory("secure_sum", bound=B)`, the `--aggregator` flag):
`tff.aggregators.SecureSumFactory(B)`, i.e. clip every coordinate to [-B, B],
quantise it to a 32-bit integer, `tff.federated_secure_sum_bitwidth`, dequantise
(error bound in `sum_factory`). TFF's C++ worker (`worker_binary`, the only
executor of `tfbfl.runtime`) implements no secure intrinsic: a computation that
contains one must be compiled with `worker_compiler` (local / per-worker contexts)
or `mergeable_compiler` (the multi-worker context), which lower the secure
intrinsics to plain `federated_aggregate`s exactly as TFF's test backend
(`tff.backends.test`) does. That runs the secure sum's *arithmetic* (clipping,
quantisation, integer sum, range checks), not a cryptographic protocol: the
simulating worker sees every client's quantised value. See `secure_sum_context`.
"""

from __future__ import annotations

import collections
import math
import os
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

_FIELDS = ("eta1", "eta2")


def _check_natural_type(value_type) -> None:
  """Raises TypeError unless `value_type` is a struct `<eta1=T, eta2=T>` of floats."""
  if not isinstance(value_type, tff.StructType):
    raise TypeError("GaussianProductFactory expects a struct <eta1=..., eta2=...> of natural "
                    f"parameters (a tfbfl.gaussian.NaturalGaussian), got {value_type}.")
  names = tuple(name for name, _ in tff.structure.iter_elements(value_type))
  if names != _FIELDS:
    raise TypeError(
        f"GaussianProductFactory expects fields {_FIELDS}, got {names} in {value_type}.")
  eta1, eta2 = value_type.eta1, value_type.eta2
  if not eta1.is_equivalent_to(eta2):
    raise TypeError(
        f"eta1 and eta2 must have the same structure and shapes, got {eta1} and {eta2}.")
  for leaf in _leaves(value_type):
    if not np.issubdtype(leaf.dtype, np.floating):
      raise TypeError(f"natural parameters must be floating point, got {leaf}.")


def _leaves(type_spec):
  if isinstance(type_spec, tff.TensorType):
    yield type_spec
  elif isinstance(type_spec, tff.StructType):
    for _, element in tff.structure.iter_elements(type_spec):
      yield from _leaves(element)
  else:
    raise TypeError(f"natural parameters must be tensors, got {type_spec}.")


class GaussianProductFactory(tff.aggregators.UnweightedAggregationFactory,
                             tff.aggregators.WeightedAggregationFactory):
  """Aggregates Gaussian factors (natural parameters) placed at CLIENTS.

  Unweighted (`weighted=False`, VIRTUAL): the server receives the product of the
  client factors,

      eta(prod_i t_i) = sum_i eta(t_i),

  computed by `value_sum_factory` (default `tff.aggregators.SumFactory()`).

  Weighted (`weighted=True`, FOLA's Gaussian product): with client weights `w_n`
  (e.g. example counts) the server receives the tempered product
  `prod_n t_n^(a_n)`, `a_n = w_n / sum_m w_m`:

      Lambda_S = sum_n a_n Lambda_n,   Lambda_S mu_S = sum_n a_n Lambda_n mu_n,

  computed by `tff.aggregators.MeanFactory(value_sum_factory=...)`. The mean
  `mu_S` is invariant to multiplying every client's precision by a common
  constant; the caller converts with `tfbfl.gaussian.mean`, which is where a zero
  aggregate precision must be handled (see `tfbfl.algorithms.fola`).

  #### Examples

  ```python
  factory = GaussianProductFactory()                # VIRTUAL: product of deltas
  process = factory.create(delta_type)              # a tff.templates.AggregationProcess
  fola = GaussianProductFactory(weighted=True)      # FOLA: precision-weighted mean
  process = fola.create(posterior_type, tff.TensorType(np.float32))
  ```

  Args:
    weighted: whether `create` takes a weight type (tempered product) or not.
    value_sum_factory: inner `UnweightedAggregationFactory` that sums the natural
      parameters (secure/DP sums plug in here).
  """

  def __init__(self,
               weighted: bool = False,
               value_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None):
    if value_sum_factory is not None and not isinstance(
        value_sum_factory, tff.aggregators.UnweightedAggregationFactory):
      raise TypeError("value_sum_factory must be a tff.aggregators.UnweightedAggregationFactory, "
                      f"got {type(value_sum_factory).__name__}.")
    self._weighted = weighted
    self._value_sum_factory = value_sum_factory or tff.aggregators.SumFactory()

  @property
  def weighted(self) -> bool:
    return self._weighted

  @property
  def value_sum_factory(self) -> tff.aggregators.UnweightedAggregationFactory:
    """The inner factory that sums the natural parameters."""
    return self._value_sum_factory

  def create(self, value_type, weight_type=None) -> tff.templates.AggregationProcess:
    _check_natural_type(value_type)
    if self._weighted:
      if weight_type is None:
        raise TypeError("a weighted GaussianProductFactory needs a weight_type.")
      mean = tff.aggregators.MeanFactory(value_sum_factory=self._value_sum_factory)
      return mean.create(value_type, weight_type)
    if weight_type is not None:
      raise TypeError("an unweighted GaussianProductFactory takes no weight_type.")
    return self._value_sum_factory.create(value_type)


# ------------------------------------------------------------------ secure sum
SUM_FACTORIES = ("sum", "secure_sum")
"""Values of the `--aggregator` flag accepted by `sum_factory`."""

DEFAULT_SECURE_SUM_BOUND = 2.0**16
"""Default `--secure_sum_bound` B: every coordinate of a client's upload (a
VIRTUAL delta's eta1 = mu * prec and eta2 = prec change) is clipped to [-B, B].
A power of two, so that it and 2B are exact in float32. With B = 2**16 the
quantisation step is 2B / (2**32 - 1) = 3.05e-5, i.e. at most 1.53e-5 of error
per client and coordinate, below float32's resolution (2**-23 relative) of any
|value| >= 256."""

SECURE_SUM_BITS = 32
"""Quantisation bits per coordinate of `tff.aggregators.SecureSumFactory`'s
float path (`tff.aggregators.primitives.secure_quantized_sum`); fixed by TFF."""

_SECURE_LEVELS = 2**SECURE_SUM_BITS - 1  # TFF's `_SECAGG_MAX`.
_SECURE_INTRINSICS = frozenset({
    "federated_secure_sum", "federated_secure_sum_bitwidth", "federated_secure_modular_sum",
    "federated_secure_select"
})
# Their common prefix: a serialized computation without it calls none of them.
_SECURE_PREFIX = os.path.commonprefix(sorted(_SECURE_INTRINSICS)).encode()


def _check_secure_sum_bound(bound) -> float:
  if isinstance(bound, bool) or not isinstance(bound, (int, float, np.integer, np.floating)):
    raise TypeError(f"--secure_sum_bound must be a number, got {bound!r}.")
  bound = float(bound)
  if not math.isfinite(bound) or bound <= 0:
    raise ValueError(f"--secure_sum_bound must be a finite number > 0, got {bound!r}.")
  if float(np.float32(bound)) != bound:
    raise ValueError(
        f"--secure_sum_bound={bound!r} is not exactly representable in float32, the dtype "
        "TFF clips and dequantises with; use e.g. a power of two "
        f"({2.0 ** round(math.log2(bound)):g}).")
  if 2 * bound > float(np.finfo(np.float32).max):
    raise ValueError(
        f"--secure_sum_bound must be below 2**127 (2B must fit a float32), got {bound!r}.")
  return bound


def secure_sum_step(bound: float) -> float:
  """The quantisation step Delta = 2B / (2**32 - 1) of `sum_factory("secure_sum", bound=B)`."""
  return 2.0 * _check_secure_sum_bound(bound) / _SECURE_LEVELS


def secure_sum_error_bound(bound: float, num_clients: int) -> float:
  """Largest quantisation error per coordinate of a secure sum over `num_clients`
  clients whose values all lie in [-B, B]: `num_clients * Delta / 2` (see
  `sum_factory`). The float32 rounding of the result, `|sum| * 2**-24`, comes on
  top, as it does for the plain float32 sum."""
  if isinstance(num_clients, bool) or not isinstance(num_clients,
                                                     (int, np.integer)) or num_clients < 0:
    raise ValueError(f"num_clients must be an integer >= 0, got {num_clients!r}.")
  return int(num_clients) * secure_sum_step(bound) / 2.0


def sum_factory(
    name: str = "sum",
    *,
    bound: float = DEFAULT_SECURE_SUM_BOUND) -> tff.aggregators.UnweightedAggregationFactory:
  """The inner sum of `GaussianProductFactory` named by the `--aggregator` flag.

  * `"sum"`: `tff.aggregators.SumFactory()`, the exact float32 `federated_sum`.
  * `"secure_sum"`: `tff.aggregators.SecureSumFactory(B)` with `B = bound`
    (`--secure_sum_bound`), TFF's float path (`primitives.secure_quantized_sum`):
    each client clips every coordinate to the range [-B, B], maps it to an
    integer in [0, 2**32 - 1] with step

        Delta = 2B / (2**32 - 1),   q_i = round(clip(x_i, -B, B) / Delta) + round(B / Delta)

    (deterministic round-half-to-even, in float64); the q_i are summed with
    `tff.federated_secure_sum_bitwidth(q, 32)` and the server returns

        S = (sum_i q_i - n round(B / Delta)) * Delta = sum_i round(clip(x_i, -B, B) / Delta) * Delta

    in float32 (n, the number of summands, is securely summed too). So for
    clients whose coordinates all lie in [-B, B]

        |S - sum_i x_i| <= n Delta / 2  (+ float32 rounding of S, |S| 2**-24),

    `secure_sum_error_bound(B, n)`; e.g. B = 2**16, n = 10: 1.5e-4. A coordinate
    outside [-B, B] is clipped silently (biasing the product of factors); the
    process's measurements count the clients affected
    (`secure_upper_clipped_count`, `secure_lower_clipped_count`). The bound is
    public (it is broadcast to the clients) and the same for eta1 and eta2.
    Weighted use (`GaussianProductFactory(weighted=True)`, FOLA): `MeanFactory`
    sums `w_n * eta_n` through this factory, so B must cover the weighted
    values, and n Delta / 2 is divided by `sum_n w_n` in the mean.

  Executing a secure sum needs a context whose compiler lowers the secure
  intrinsics (`worker_compiler`, `mergeable_compiler`, `secure_sum_context`);
  the stock compiler leaves them for TFF's C++ worker, which rejects them with
  INVALID_ARGUMENT "Cannot embed a federated value. while evaluating local ...".

  Args:
    name: one of `SUM_FACTORIES`.
    bound: B > 0, float32-representable (used by "secure_sum" only).

  Returns:
    A `tff.aggregators.UnweightedAggregationFactory`, to pass as
    `GaussianProductFactory(value_sum_factory=...)`.

  Raises:
    ValueError / TypeError: unknown `name` or invalid `bound`, naming the flag.
  """
  if name not in SUM_FACTORIES:
    raise ValueError(f"--aggregator must be one of {SUM_FACTORIES}, got {name!r}.")
  bound = _check_secure_sum_bound(bound)
  if name == "sum":
    return tff.aggregators.SumFactory()
  return tff.aggregators.SecureSumFactory(float(bound))


def contains_secure_intrinsics(comp) -> bool:
  """Whether the computation (or building block) `comp` calls a secure intrinsic
  (`federated_secure_sum[_bitwidth]`, `federated_secure_modular_sum`,
  `federated_secure_select`)."""
  if isinstance(comp, tff.framework.ConcreteComputation):
    # Every secure intrinsic's URI starts with this prefix, so a serialized proto
    # without it has none; this skips deserializing the whole tree, which every
    # computation the worker compiles would otherwise pay.
    if _SECURE_PREFIX not in tff.framework.ConcreteComputation.get_proto(comp).SerializeToString():
      return False
    comp = comp.to_building_block()
  stack = [comp]
  while stack:
    node = stack.pop()
    if isinstance(node, tff.framework.Intrinsic) and node.uri in _SECURE_INTRINSICS:
      return True
    stack.extend(node.children())
  return False


def lower_secure_intrinsics(comp):
  """`comp` with its secure intrinsics replaced by plain TFF bodies
  (`tff.backends.test.replace_secure_intrinsics_with_bodies`: a
  `federated_aggregate` that checks each client's integer is within the
  bitwidth, then sums in int64); `comp` itself when it has none. NOT a secure
  protocol: the aggregating executor sees every client's (quantised) value."""
  if not contains_secure_intrinsics(comp):
    return comp
  lowered = tff.backends.test.replace_secure_intrinsics_with_bodies(comp)
  # Keep the Python containers of the original type (namedtuples, attrs), which
  # the proto round trip drops: the mergeable context converts results with it.
  return tff.framework.ConcreteComputation.with_type(lowered, comp.type_signature)


def worker_compiler(comp):
  """`compiler_fn` for a `tff.framework.SyncExecutionContext` over TFF's C++
  worker: `tff.backends.native.desugar_and_transform_to_native` after
  `lower_secure_intrinsics` (identical to it for computations without secure
  intrinsics). What `tff.backends.test`'s contexts compile with."""
  return tff.backends.native.desugar_and_transform_to_native(lower_secure_intrinsics(comp))


def mergeable_compiler(comp):
  """`compiler_fn` for `tff.framework.MergeableCompExecutionContext` (the
  multi-worker context): TFF's `compile_to_mergeable_comp_form` after
  `lower_secure_intrinsics`."""
  return tff.backends.native.compile_to_mergeable_comp_form(lower_secure_intrinsics(comp))


def secure_sum_context(context=None) -> tff.framework.SyncExecutionContext:
  """A context running on the same executors as `context` (default: TFF's
  current default context, e.g. the one `tfbfl.runtime.set_local_runtime()`
  installed), compiling with `worker_compiler`, so that secure sums execute:

      rt = runtime.set_local_runtime()
      with tff.framework.get_context_stack().install(secure_sum_context(rt.context)):
        process.next(state, values)

  Only for a `tff.framework.SyncExecutionContext` (the local runtime's); the
  multi-worker context needs `mergeable_compiler` where it is built.
  """
  context = tff.framework.get_context_stack().current if context is None else context
  if not isinstance(context, tff.framework.SyncExecutionContext):
    raise TypeError("secure_sum_context needs a tff.framework.SyncExecutionContext (e.g. "
                    "tfbfl.runtime.set_local_runtime().context), got "
                    f"{type(context).__name__}; a multi-worker (mergeable) context must be built "
                    "with compiler_fn=tfbfl.aggregators.mergeable_compiler instead.")
  return tff.framework.SyncExecutionContext(executor_fn=context.executor_factory,
                                            compiler_fn=worker_compiler,
                                            transform_args=tff.tensorflow.transform_args,
                                            transform_result=tff.tensorflow.transform_result)


# ------------------------------------------- precision-weighted mean (tff.learning)
PrecisionWeighted = collections.namedtuple("PrecisionWeighted", ["value", "precision"])
PrecisionWeighted.__doc__ = """A client value sent with its per-coordinate precision.

`value` (model weights or a model delta) and `precision` (a diagonal Fisher /
Laplace estimate, >= 0) are structures of float tensors of identical structure
and shapes. The value type of `PrecisionWeightedMeanFactory`'s precision mode."""

_PRECISION_FIELDS = PrecisionWeighted._fields


def _flat_leaves(value):
  """The tensor leaves of a (nested) Python / TFF structure, in TFF's order."""
  try:
    struct = tff.structure.from_container(value, recursive=True)
  except TypeError:  # a single tensor
    return [value]
  return tff.structure.flatten(struct)


def _pack_leaves(type_spec, leaves):
  """`leaves` (in TFF's order) packed as `type_spec`, with its Python containers."""
  it = iter(leaves)
  return tff.types.structure_from_tensor_type_tree(lambda _: next(it), type_spec)


def _is_precision_type(value_type) -> bool:
  return isinstance(value_type, tff.StructType) and tuple(
      name for name, _ in tff.structure.iter_elements(value_type)) == _PRECISION_FIELDS


class PrecisionWeightedMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """Precision-weighted (FOLA-style) mean: a `model_aggregator` for `tff.learning`.

  The adapter from model values to natural parameters and back, around a
  weighted `GaussianProductFactory` (and so TFF's `MeanFactory`, with a
  pluggable `value_sum_factory`: a secure or DP sum aggregates the natural
  parameters unchanged).

  #### Maths

  Client n sends a value `v_n` (a structure of float tensors: model weights, or
  the delta `w^(t) - w_n` that `tff.learning` clients send), a weight `w_n >= 0`
  (`tff.learning`: its number of examples) and, in the precision mode, a
  per-coordinate precision `lambda_n >= 0` of the same structure (a diagonal
  Fisher / Laplace estimate: read `v_n` as `N(v_n, diag(lambda_n)^-1)`). With
  `a_n = w_n / sum_m w_m` the server receives, coordinate by coordinate,

      Lambda = sum_n a_n lambda_n,
      v      = sum_n a_n lambda_n v_n / Lambda          (v = 0 where Lambda = 0),

  the mean and precision of the tempered product
  `prod_n N(v_n, lambda_n^-1)^(a_n)` (FOLA's server step, eq. 9 of Liu & Zheng;
  for deltas, "0 where Lambda = 0" means the server does not move a coordinate no
  client has information about). Computed as: each client maps its value to the
  natural parameters `(eta1, eta2) = (lambda_n v_n, lambda_n)`;
  `GaussianProductFactory(weighted=True)` returns `(sum a_n eta1_n, sum a_n
  eta2_n)`; the server divides, `v = eta1 / eta2` (`tf.math.divide_no_nan`).

  Special cases (both tested against `tff.aggregators.MeanFactory`):

  * Equal precisions, `lambda_n = c > 0` for every client (c may vary per
    coordinate): `v = sum_n a_n v_n`, FedAvg's weighted mean.
  * Plain values (`value_type` is the weights structure itself, which is what
    `tff.learning.algorithms.build_weighted_fed_avg` passes): TFF's stock client
    work sends no curvature, so every precision is 1 and the result is *exactly*
    `MeanFactory`'s (the same numbers: `Lambda = sum w_n / sum w_n = 1`). This
    is the honest limit of the stock FedAvg client: precision weighting needs a
    client that sends `lambda_n` alongside its value, i.e. the precision mode.

  Precision mode: `value_type` is `PrecisionWeighted(value=T, precision=T)`; the
  result is `PrecisionWeighted(v, Lambda)` (the same type as the client value,
  as TFF's composers expect). Precisions must be >= 0 (not checked: a negative
  one makes `v` an extrapolation). As with `MeanFactory`, a round whose weights
  sum to 0 gives NaN (0/0); a NaN/inf client value propagates (TFF's finalizer
  then rejects the update).

  Measurements: `{product: the inner MeanFactory's measurements,
  zero_precision: number of coordinates with Lambda == 0}`.

  #### Examples

  ```python
  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.05),
      model_aggregator=tfbfl.aggregators.PrecisionWeightedMeanFactory())
  # With precisions sent alongside (a custom client work / process):
  agg = PrecisionWeightedMeanFactory().create(
      tff.to_type(PrecisionWeighted(weights_type, weights_type)), tff.TensorType(np.float32))
  ```

  Args:
    value_sum_factory: inner `UnweightedAggregationFactory` summing the
      weighted natural parameters (default `tff.aggregators.SumFactory()`).
  """

  def __init__(self,
               value_sum_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None):
    self._product = GaussianProductFactory(weighted=True, value_sum_factory=value_sum_factory)

  @property
  def value_sum_factory(self) -> tff.aggregators.UnweightedAggregationFactory:
    return self._product.value_sum_factory

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    value_type = tff.to_type(value_type)
    weight_type = tff.to_type(weight_type)
    with_precision = _is_precision_type(value_type)
    if with_precision:
      values_type, precision_type = value_type.value, value_type.precision
      if not values_type.is_equivalent_to(precision_type):
        raise TypeError("PrecisionWeighted value and precision must have the same structure and "
                        f"shapes, got {values_type} and {precision_type}.")
    else:
      values_type = value_type
    for leaf in _leaves(values_type):
      if not np.issubdtype(leaf.dtype, np.floating):
        raise TypeError("PrecisionWeightedMeanFactory averages floating-point values, got "
                        f"{leaf} in {value_type}.")
    natural_type = tff.to_type(_natural_structure(values_type))
    inner = self._product.create(natural_type, weight_type)

    @tff.tensorflow.computation(value_type)
    def to_natural(value):
      leaves = _flat_leaves(value)
      if with_precision:
        half = len(leaves) // 2
        values, precisions = leaves[:half], leaves[half:]
        eta1 = [v * p for v, p in zip(values, precisions)]
        eta2 = list(precisions)
      else:
        eta1 = list(leaves)
        eta2 = [tf.ones_like(v) for v in leaves]
      return _pack_leaves(natural_type, eta1 + eta2)

    @tff.tensorflow.computation(natural_type)
    def from_natural(aggregate):
      leaves = _flat_leaves(aggregate)
      half = len(leaves) // 2
      eta1, eta2 = leaves[:half], leaves[half:]
      mean = [tf.math.divide_no_nan(e1, e2) for e1, e2 in zip(eta1, eta2)]
      zero = tf.add_n([tf.reduce_sum(tf.cast(tf.equal(e2, 0.0), tf.int32)) for e2 in eta2])
      result = _pack_leaves(value_type, mean + eta2 if with_precision else mean)
      return result, zero

    @tff.federated_computation(inner.initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      out = inner.next(state, tff.federated_map(to_natural, value), weight)
      result = tff.federated_map(from_natural, out.result)
      measurements = tff.federated_zip(
          collections.OrderedDict(product=out.measurements, zero_precision=result[1]))
      return tff.templates.MeasuredProcessOutput(state=out.state,
                                                 result=result[0],
                                                 measurements=measurements)

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def _natural_structure(values_type):
  """`NaturalGaussian(eta1=values_type, eta2=values_type)` as a Python structure of
  TFF types (`tfbfl.gaussian` imports TensorFlow Probability; its namedtuple is
  what `GaussianProductFactory` checks by field names)."""
  from tfbfl import gaussian  # pylint: disable=g-import-not-at-top
  return gaussian.NaturalGaussian(values_type, values_type)

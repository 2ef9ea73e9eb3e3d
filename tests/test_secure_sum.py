"""Secure sum inside the Gaussian product (`tfbfl.aggregators.sum_factory`).

`sum_factory("secure_sum", bound=B)` is `tff.aggregators.SecureSumFactory(B)`:
clip to [-B, B], quantise to 32-bit integers with step Delta = 2B / (2**32 - 1),
`federated_secure_sum_bitwidth`, dequantise; error <= n Delta / 2 per coordinate.

TFF's C++ worker implements no secure intrinsic, so the secure computations run
in `aggregators.secure_sum_context(...)`: the same worker (the session's
`tff_runtime`) with a compiler that lowers the secure intrinsics to plain
`federated_aggregate`s (TFF's test-backend lowering). These tests check that the
*arithmetic* of secure aggregation (clip, quantise, integer sum) gives the same
Gaussian product as the plain sum within the documented bound, and that it is
that arithmetic which ran (bit-exact against a numpy model of it; an error above
float32 rounding). No cryptographic protocol runs here.
"""

import numpy as np
import pytest
import tensorflow_federated as tff

from tfbfl import aggregators
from tfbfl import gaussian
from tfbfl.aggregators import GaussianProductFactory

_U32 = 2.0**-24  # float32 unit roundoff
_LEVELS = 2**32 - 1


# ------------------------------------------------------------------ helpers
def _natural_type(shapes):
  leaves = [tff.TensorType(np.float32, s) for s in shapes]
  return tff.to_type(gaussian.NaturalGaussian(list(leaves), list(leaves)))


def _client_factors(num_clients, shapes, seed):
  """Mean-field Gaussian factors in natural parameters (eta1 = mu prec, eta2 = prec)."""
  rng = np.random.default_rng(seed)
  factors = []
  for _ in range(num_clients):
    mus = [rng.normal(0.0, 2.0, s).astype(np.float32) for s in shapes]
    precs = [(1.0 / rng.uniform(0.3, 1.5, s)**2).astype(np.float32) for s in shapes]
    factors.append(gaussian.NaturalGaussian([m * p for m, p in zip(mus, precs)], precs))
  return factors


def _flat(parts):
  return np.concatenate([np.reshape(np.asarray(t, np.float64), [-1]) for t in parts])


def _flat_natural(g):
  return np.concatenate([_flat(g.eta1), _flat(g.eta2)])


def _tff_quantised_sum(columns, bound):
  """numpy model of TFF's float secure sum (`primitives.secure_quantized_sum`
  with bounds [-B, B]): float64 scale, round-half-to-even, int64 sum, float32 out."""
  x = np.asarray(columns, np.float64)  # [clients, coords]
  scale = np.float64(_LEVELS) / np.float64(2 * bound)
  offset = np.round(np.float64(-bound) * scale)
  q = np.clip(np.round(np.clip(x, -bound, bound) * scale) - offset, 0, _LEVELS).astype(np.int64)
  total = q.sum(0) + offset.astype(np.int64) * len(x)
  return (total.astype(np.float64) * (np.float64(2 * bound) / _LEVELS)).astype(np.float32)


def _stock_context(runtime_context):
  """The local runtime's executors with TFF's stock native compiler (no lowering
  of secure intrinsics), whatever `tfbfl.runtime` compiles with."""
  return tff.framework.SyncExecutionContext(
      executor_fn=runtime_context.executor_factory,
      compiler_fn=tff.backends.native.desugar_and_transform_to_native,
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result)


def _in_context(context, fn, *args):
  with tff.framework.get_context_stack().install(context):
    return fn(*args)


# ------------------------------------------------------------ the flag API
def test_sum_factory_flag_values_and_errors():
  assert aggregators.SUM_FACTORIES == ("sum", "secure_sum")
  assert isinstance(aggregators.sum_factory("sum"), tff.aggregators.SumFactory)
  assert isinstance(aggregators.sum_factory(), tff.aggregators.SumFactory)
  secure = aggregators.sum_factory("secure_sum", bound=8.0)
  assert isinstance(secure, tff.aggregators.SecureSumFactory)
  assert isinstance(aggregators.sum_factory("secure_sum"), tff.aggregators.SecureSumFactory)
  # Composes with the Gaussian product (unweighted: VIRTUAL; weighted: FOLA).
  GaussianProductFactory(value_sum_factory=secure).create(_natural_type([(2,)]))
  GaussianProductFactory(weighted=True,
                         value_sum_factory=secure).create(_natural_type([(2,)]),
                                                          tff.TensorType(np.float32))

  with pytest.raises(ValueError, match="--aggregator must be one of .*'secure'"):
    aggregators.sum_factory("secure")
  for bad in (0.0, -1.0, float("nan"), float("inf")):
    with pytest.raises(ValueError, match="--secure_sum_bound must be a finite number > 0"):
      aggregators.sum_factory("secure_sum", bound=bad)
  with pytest.raises(ValueError, match="--secure_sum_bound=0.1 is not exactly representable"):
    aggregators.sum_factory("secure_sum", bound=0.1)
  with pytest.raises(ValueError, match="--secure_sum_bound must be below"):
    aggregators.sum_factory("secure_sum", bound=2.0**127)
  with pytest.raises(TypeError, match="--secure_sum_bound must be a number"):
    aggregators.sum_factory("secure_sum", bound="8")


def test_secure_sum_error_bound_formula():
  # Delta = 2B / (2**32 - 1); n clients: n Delta / 2 = n B / (2**32 - 1).
  assert aggregators.SECURE_SUM_BITS == 32
  assert aggregators.secure_sum_step(1.0) == 2.0 / _LEVELS
  assert aggregators.secure_sum_step(2.0**20) == 2.0**21 / _LEVELS
  assert aggregators.secure_sum_error_bound(2.0**16, 10) == pytest.approx(10 * 2.0**16 / _LEVELS,
                                                                          rel=1e-15)
  assert aggregators.secure_sum_error_bound(4.0, 0) == 0.0
  bound = aggregators.DEFAULT_SECURE_SUM_BOUND
  assert float(np.float32(bound)) == bound
  assert aggregators.secure_sum_error_bound(bound, 1) < 2.0**-23 * 256  # < float32 ulp at 256
  with pytest.raises(ValueError, match="num_clients"):
    aggregators.secure_sum_error_bound(1.0, -1)
  # The numpy model of TFF's quantiser meets it on random values in [-B, B].
  rng = np.random.default_rng(0)
  for bound, n in ((1.0, 3), (2.0**16, 7)):
    x = rng.uniform(-bound, bound, (n, 1000))
    exact = x.sum(0)
    err = np.abs(_tff_quantised_sum(x, bound).astype(np.float64) - exact)
    assert np.all(err <= aggregators.secure_sum_error_bound(bound, n) + _U32 * np.abs(exact) +
                  1e-12)


def test_lower_secure_intrinsics_only_touches_secure_computations():
  value_type = _natural_type([(3,)])
  plain = GaussianProductFactory().create(value_type).next
  secure = GaussianProductFactory(
      value_sum_factory=aggregators.sum_factory("secure_sum", bound=4.0)).create(value_type).next
  assert not aggregators.contains_secure_intrinsics(plain)
  assert aggregators.contains_secure_intrinsics(secure)
  # the tree walk agrees with the serialized-proto shortcut computations take
  assert not aggregators.contains_secure_intrinsics(plain.to_building_block())
  assert aggregators.contains_secure_intrinsics(secure.to_building_block())
  assert aggregators.lower_secure_intrinsics(plain) is plain
  lowered = aggregators.lower_secure_intrinsics(secure)
  assert not aggregators.contains_secure_intrinsics(lowered)
  assert lowered.type_signature == secure.type_signature  # Python containers kept


# --------------------------------------------------------- on the worker
def test_stock_compiler_rejects_secure_sum_on_the_worker(tff_runtime):
  """Why a particular compiler is needed: TFF's stock native compiler leaves
  `federated_secure_sum_bitwidth` in the computation; the C++ worker's
  FederatingExecutor does not know it (federated_intrinsics.cc), treats it as an
  unplaced function and fails embedding its CLIENTS-placed argument."""
  value_type = _natural_type([(3,)])
  values = _client_factors(3, [(3,)], seed=1)
  plain = GaussianProductFactory().create(value_type)
  secure = GaussianProductFactory(
      value_sum_factory=aggregators.sum_factory("secure_sum", bound=64.0)).create(value_type)
  stock = _stock_context(tff_runtime.context)
  _in_context(stock, plain.next, plain.initialize(), values)
  with pytest.raises(Exception, match="Cannot embed a federated value"):
    _in_context(stock, secure.next, secure.initialize(), values)
  out = _in_context(aggregators.secure_sum_context(tff_runtime.context), secure.next,
                    secure.initialize(), values)
  np.testing.assert_allclose(_flat_natural(out.result),
                             sum(_flat_natural(v) for v in values),
                             rtol=1e-5)


def test_gaussian_product_secure_sum_equals_plain_within_bound(tff_runtime):
  """K clients' Gaussian factors -> server posterior (their product, the sum of
  natural parameters) through the secure sum equals the plain sum within
  K Delta / 2 per natural parameter, bit-exactly TFF's quantiser, with an error
  larger than float32 rounding (so the quantised path did run)."""
  shapes, num_clients, bound = [(4, 5), (10,)], 4, 2.0**20
  value_type = _natural_type(shapes)
  factors = _client_factors(num_clients, shapes, seed=0)
  columns = np.stack([_flat_natural(f) for f in factors])
  assert np.max(np.abs(columns)) < bound  # no clipping: the bound formula applies

  plain = GaussianProductFactory().create(value_type)
  secure = GaussianProductFactory(
      value_sum_factory=aggregators.sum_factory("secure_sum", bound=bound)).create(value_type)
  want = plain.next(plain.initialize(), factors).result
  out = _in_context(aggregators.secure_sum_context(tff_runtime.context), secure.next,
                    secure.initialize(), factors)
  got = out.result
  assert isinstance(got, gaussian.NaturalGaussian)
  assert dict(out.measurements) == dict(secure_upper_clipped_count=0,
                                        secure_lower_clipped_count=0,
                                        secure_upper_threshold=np.float32(bound),
                                        secure_lower_threshold=np.float32(-bound))

  exact = columns.sum(0)
  got_flat, want_flat = _flat_natural(got), _flat_natural(want)
  # 1. Exactly the documented quantise-sum-dequantise.
  np.testing.assert_array_equal(got_flat.astype(np.float32), _tff_quantised_sum(columns, bound))
  # 2. Within the bound: n Delta / 2 plus float32 rounding of the result.
  err = np.abs(got_flat - exact)
  tol = aggregators.secure_sum_error_bound(bound, num_clients) + _U32 * (np.abs(exact) + 1e-3)
  assert np.all(err <= tol), np.max(err - tol)
  # 3. ... and the plain float32 sum within that plus its own rounding.
  plain_rounding = (num_clients - 1) * _U32 * np.abs(columns).sum(0) * 1.01
  assert np.all(np.abs(got_flat - want_flat) <= tol + plain_rounding)
  # 4. The quantisation is visible: above anything float32 rounding explains.
  assert np.max(err) > 4 * np.max(_U32 * np.abs(exact) + plain_rounding)
  # The server posterior (mean, precision) from either aggregate.
  for g in (got, want):
    assert np.all(_flat(gaussian.precision(g)) > 0)
  # mean = eta1 / eta2: |d mean| <= (|d eta1| + |mean| |d eta2|) / eta2.
  mean = _flat(gaussian.mean(want))
  np.testing.assert_allclose(_flat(gaussian.mean(got)),
                             mean,
                             atol=1.1 * (tol + plain_rounding).max() * (1 + np.max(np.abs(mean))) /
                             np.min(_flat(want.eta2)))


def test_secure_sum_clips_to_the_bound(tff_runtime):
  """Coordinates beyond [-B, B] are clipped (silently changing the product) and
  counted in the measurements; the error bound covers unclipped inputs only."""
  bound = 4.0
  value_type = _natural_type([(3,)])
  f = lambda a, b: gaussian.NaturalGaussian([np.array(a, np.float32)], [np.array(b, np.float32)])
  values = [f([1.0, 10.0, -1.0], [1.0, 1.0, 1.0]), f([1.0, 1.0, -9.0], [2.0, 2.0, 2.0])]
  secure = GaussianProductFactory(
      value_sum_factory=aggregators.sum_factory("secure_sum", bound=bound)).create(value_type)
  out = _in_context(aggregators.secure_sum_context(tff_runtime.context), secure.next,
                    secure.initialize(), values)
  tol = aggregators.secure_sum_error_bound(bound, 2) + 1e-6
  np.testing.assert_allclose(_flat(out.result.eta1), [2.0, 5.0, -5.0], atol=tol)
  np.testing.assert_allclose(_flat(out.result.eta2), [3.0, 3.0, 3.0], atol=tol)
  assert out.measurements["secure_upper_clipped_count"] == 1
  assert out.measurements["secure_lower_clipped_count"] == 1


def test_secure_sum_context_needs_a_sync_context():
  with pytest.raises(TypeError, match="mergeable_compiler"):
    aggregators.secure_sum_context(object())


# ----------------------------------------------------------- VIRTUAL round
def test_virtual_round_secure_sum_matches_plain(tff_runtime):
  """One VIRTUAL round on digits (3 clients, 1 epoch, no hidden layer): the server posterior
  through `GaussianProductFactory(value_sum_factory=sum_factory("secure_sum"))`
  equals the plain sum's within alpha * 3 Delta / 2 (+ float32 rounding); client
  training is untouched (same client states and metrics)."""
  from tfbfl.algorithms import virtual  # pylint: disable=g-import-not-at-top
  from tfbfl.data import load_federated  # pylint: disable=g-import-not-at-top

  data = load_federated("digits", num_clients=3, seed=0)
  cfg = virtual.VirtualConfig(input_dim=64,
                              num_classes=10,
                              num_clients=3,
                              hidden_units=(),  # the aggregation is the point, not the depth
                              epochs=1,
                              server_lr=0.5)
  bound = 2.0**20  # wide, so the quantisation error shows above float32 rounding
  plain = virtual.VirtualAlgorithm(cfg)
  secure = virtual.VirtualAlgorithm(
      cfg,
      aggregator=GaussianProductFactory(
          value_sum_factory=aggregators.sum_factory("secure_sum", bound=bound)))
  args = ([plain.initial_client_state(i) for i in range(3)],
          [np.array([0, i], np.int64) for i in range(3)], [data.train[c] for c in data.client_ids])
  s0 = plain.initial_server_state()
  s_plain, c_plain, m_plain = plain.next(s0, *args)
  s_secure, c_secure, m_secure = _in_context(aggregators.secure_sum_context(tff_runtime.context),
                                             secure.next, secure.initial_server_state(), *args)

  for a, b in zip(c_plain, c_secure):
    np.testing.assert_array_equal(_flat_natural(a.shared_factor), _flat_natural(b.shared_factor))
  np.testing.assert_array_equal(m_plain["train"]["train_loss"], m_secure["train"]["train_loss"])
  assert m_secure["server_floored"] == m_plain["server_floored"] == 0

  # Each client's delta, from its factor's move: s_i <- s_i * Delta_i^alpha.
  alpha = cfg.step
  deltas = np.stack([(_flat_natural(a.shared_factor) - _flat_natural(b.shared_factor)) / alpha
                     for a, b in zip(c_plain, args[0])])
  assert np.max(np.abs(deltas)) < bound
  got, want = _flat_natural(s_secure.posterior), _flat_natural(s_plain.posterior)
  rounding = 2 * _U32 * (np.abs(want) + np.abs(got) + alpha * 3 * np.abs(deltas).sum(0)) + 1e-6
  tol = alpha * aggregators.secure_sum_error_bound(bound, 3) + rounding
  diff = np.abs(got - want)
  assert np.all(diff <= tol), np.max(diff - tol)
  assert np.max(diff - rounding) > 0  # the quantised sum ran, not the float one

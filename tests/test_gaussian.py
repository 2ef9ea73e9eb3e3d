"""Property tests of `tfbfl.gaussian` against numpy closed forms."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tfbfl import gaussian

# Eager TF ops are slow-ish: few, small examples keep the file fast.
FAST = settings(max_examples=50, deadline=None)

# One fixed nested structure (dict holding a list) with 2 + 4 + 3 = 9 entries.
TEMPLATE = {"kernel": np.zeros((2, 2)), "bias": [np.zeros(3), np.zeros(2)]}
LEAVES = tf.nest.flatten(TEMPLATE)


def reals(low, high):
  # TF flushes subnormals to zero: keep values (and their products with
  # precisions) far from the subnormal range.
  return st.floats(low, high, allow_nan=False, allow_infinity=False,
                   allow_subnormal=False).filter(lambda x: x == 0. or abs(x) > 1e-30)


MEANS = reals(-10., 10.)
PRECS = reals(1e-2, 1e2)


def _like_template(flat):
  """A flat array of 9 values as the leaves of TEMPLATE."""
  parts = np.split(flat, np.cumsum([x.size for x in LEAVES])[:-1])
  return tf.nest.pack_sequence_as(TEMPLATE, [p.reshape(x.shape) for p, x in zip(parts, LEAVES)])


@st.composite
def loc_prec(draw):
  """(loc, prec) numpy float64 structures shaped like TEMPLATE."""
  # One array per parameter, split into the leaves: fewer hypothesis draws per example.
  n = sum(x.size for x in LEAVES)
  locs = draw(hnp.arrays(np.float64, n, elements=MEANS))
  precs = draw(hnp.arrays(np.float64, n, elements=PRECS))
  return _like_template(locs), _like_template(precs)


def natural(loc, prec):
  """numpy natural parameters of (loc, prec)."""
  return gaussian.NaturalGaussian(tf.nest.map_structure(lambda m, p: m * p, loc, prec), prec)


GAUSSIANS = loc_prec().map(lambda lp: natural(*lp))


def np_flat(structure):
  return np.concatenate([np.reshape(np.asarray(x), [-1]) for x in tf.nest.flatten(structure)])


def assert_structure_close(actual, expected, rtol=1e-10, atol=0.):
  tf.nest.assert_same_structure(actual, expected, check_types=False)
  np.testing.assert_allclose(np_flat(actual), np_flat(expected), rtol=rtol, atol=atol)


def assert_gaussian_close(actual, expected, rtol=1e-10, atol=0.):
  assert isinstance(actual, gaussian.NaturalGaussian)
  assert_structure_close(actual.eta1, expected.eta1, rtol, atol)
  assert_structure_close(actual.eta2, expected.eta2, rtol, atol)


# --- parameterisations ------------------------------------------------------


@FAST
@given(loc_prec())
def test_loc_scale_round_trip(lp):
  loc, prec = lp
  scale = tf.nest.map_structure(lambda p: 1. / np.sqrt(p), prec)
  g = gaussian.from_loc_scale(loc, scale)
  assert_gaussian_close(g, natural(loc, prec), rtol=1e-12)
  loc2, scale2 = gaussian.to_loc_scale(g)
  assert_structure_close(loc2, loc, rtol=1e-10, atol=1e-12)
  assert_structure_close(scale2, scale, rtol=1e-12)


@FAST
@given(loc_prec())
def test_mean_variance_precision_and_to_normal(lp):
  loc, prec = lp
  g = natural(loc, prec)
  assert_structure_close(gaussian.mean(g), loc, rtol=1e-10, atol=1e-12)
  assert_structure_close(gaussian.variance(g), tf.nest.map_structure(lambda p: 1. / p, prec))
  assert_structure_close(gaussian.precision(g), prec, rtol=0.)
  normals = gaussian.to_normal(g)
  tf.nest.assert_same_structure(normals, TEMPLATE, check_types=False)
  for d, m, p in zip(tf.nest.flatten(normals), tf.nest.flatten(loc), tf.nest.flatten(prec)):
    assert isinstance(d, tfp.distributions.Normal)
    np.testing.assert_allclose(d.loc, m, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(d.scale, 1. / np.sqrt(p), rtol=1e-12)


def test_flat():
  f = gaussian.flat(TEMPLATE)
  tf.nest.assert_same_structure(f.eta1, TEMPLATE, check_types=False)
  for a, b, x in zip(tf.nest.flatten(f.eta1), tf.nest.flatten(f.eta2), LEAVES):
    assert a.shape == x.shape and a.dtype == tf.float64
    assert np.all(a.numpy() == 0.) and np.all(b.numpy() == 0.)
  g = gaussian.NaturalGaussian([tf.ones([4, 2])], [tf.ones([4, 2])])
  assert gaussian.flat(g).eta2[0].shape == (4, 2)
  assert gaussian.flat(g).eta2[0].dtype == tf.float32
  spec = gaussian.flat({"w": tf.TensorSpec([3], tf.float32)}, tf.float64)
  assert spec.eta1["w"].shape == (3,) and spec.eta1["w"].dtype == tf.float64
  with pytest.raises(ValueError, match="dtype"):
    gaussian.flat(TEMPLATE, dtype=tf.int32)


# --- product ----------------------------------------------------------------


@FAST
@given(GAUSSIANS, GAUSSIANS, GAUSSIANS)
def test_product_commutative_and_associative(a, b, c):
  assert_gaussian_close(gaussian.product(a, b), gaussian.product(b, a), rtol=0.)
  abc = gaussian.product(a, b, c)
  assert_gaussian_close(gaussian.product(gaussian.product(a, b), c), abc, rtol=1e-12, atol=1e-12)
  assert_gaussian_close(gaussian.product(a, gaussian.product(b, c)), abc, rtol=1e-12, atol=1e-12)
  assert_gaussian_close(gaussian.product(a, gaussian.flat(a)), a, rtol=0.)


@FAST
@given(loc_prec(), loc_prec())
def test_product_matches_density_product(lpa, lpb):
  (ma, pa), (mb, pb) = [tuple(map(np_flat, lp)) for lp in (lpa, lpb)]
  g = gaussian.product(natural(*lpa), natural(*lpb))
  prec = pa + pb
  mu = (pa * ma + pb * mb) / prec
  np.testing.assert_allclose(np_flat(gaussian.precision(g)), prec, rtol=1e-12)
  np.testing.assert_allclose(np_flat(gaussian.mean(g)), mu, rtol=1e-9, atol=1e-9)

  # Independent of the formula above: log N_a + log N_b - log N_ab is
  # constant in x (the normaliser), which pins the product density down.
  def logpdf(x, m, p):
    return 0.5 * np.log(p / (2 * np.pi)) - 0.5 * p * (x - m)**2

  xs = np.array([-3., 0., 2.5])[:, None]
  diff = logpdf(xs, ma, pa) + logpdf(xs, mb, pb) - logpdf(xs, np_flat(gaussian.mean(g)),
                                                          np_flat(gaussian.precision(g)))
  np.testing.assert_allclose(diff - diff[0], 0., atol=1e-6 * (1 + np.abs(diff).max()))


def test_product_validation():
  g = gaussian.NaturalGaussian([tf.ones(3)], [tf.ones(3)])
  with pytest.raises(ValueError, match="at least one"):
    gaussian.product()
  with pytest.raises(ValueError, match="same structure"):
    gaussian.product(g, gaussian.NaturalGaussian([tf.ones(3)] * 2, [tf.ones(3)] * 2))
  with pytest.raises(ValueError, match="shape"):
    gaussian.product(g, gaussian.NaturalGaussian([tf.ones(2)], [tf.ones(2)]))
  with pytest.raises(ValueError, match="dtype"):
    gaussian.product(g, gaussian.NaturalGaussian([tf.ones(3, tf.float64)],
                                                 [tf.ones(3, tf.float64)]))
  with pytest.raises(ValueError, match="NaturalGaussian"):
    gaussian.product((tf.ones(3), tf.ones(3)))


# --- ratio ------------------------------------------------------------------


@FAST
@given(GAUSSIANS, GAUSSIANS)
def test_ratio_undoes_product(a, b):
  back = gaussian.ratio(gaussian.product(a, b), b)
  assert_gaussian_close(back, a, rtol=1e-9, atol=1e-9)
  back, count = gaussian.ratio_with_count(gaussian.product(a, b), b)
  assert_gaussian_close(back, a, rtol=1e-9, atol=1e-9)
  assert int(count) == 0


@FAST
@given(GAUSSIANS)
def test_ratio_raise_policy_raises(a):
  # Dividing by a sharper factor leaves every entry with negative precision.
  sharper = gaussian.power(a, 2.)
  with pytest.raises(ValueError, match="ratio left 9 entries with non-positive precision"):
    gaussian.ratio(a, sharper)
  # Exactly zero precision (a / a) is also rejected.
  with pytest.raises(ValueError, match="non-positive precision"):
    gaussian.ratio(a, a)


@FAST
@given(GAUSSIANS, GAUSSIANS, st.sampled_from([1e-8, 1e-1, 1.]))
def test_ratio_floor_policy(num, den, min_precision):
  out, count = gaussian.ratio_with_count(num, den, min_precision=min_precision)
  e1n, e2n, e1d, e2d = map(np_flat, (num.eta1, num.eta2, den.eta1, den.eta2))
  diff2 = e2n - e2d
  floored = diff2 <= min_precision
  assert count.dtype == tf.int32 and int(count) == int(floored.sum())
  eta1, eta2 = np_flat(out.eta1), np_flat(out.eta2)
  assert np.all(np.isfinite(eta1)) and np.all(np.isfinite(eta2))
  assert np.all(eta2 >= min_precision)
  np.testing.assert_allclose(eta2[floored], min_precision, rtol=1e-12)
  np.testing.assert_allclose(eta1[floored] / eta2[floored], (e1n / e2n)[floored],
                             rtol=1e-9,
                             atol=1e-9)
  np.testing.assert_allclose(eta2[~floored], diff2[~floored], rtol=1e-12)
  np.testing.assert_allclose(eta1[~floored], (e1n - e1d)[~floored], rtol=1e-12)
  plain = gaussian.ratio(num, den, on_nonpositive="floor", min_precision=min_precision)
  assert_gaussian_close(plain, out, rtol=0.)


def test_ratio_floor_never_nan_on_flat_numerator():
  num = gaussian.flat([tf.ones(4)])
  den = gaussian.NaturalGaussian([tf.constant([1., -2., 0., 3.])], [tf.constant([1., 0., 2., 0.])])
  out, count = gaussian.ratio_with_count(num, den, min_precision=1e-3)
  assert int(count) == 4
  np.testing.assert_array_equal(out.eta1[0], np.zeros(4, np.float32))
  np.testing.assert_allclose(out.eta2[0], np.full(4, 1e-3), rtol=1e-6)


def test_ratio_validation():
  g = gaussian.NaturalGaussian([tf.ones(3)], [tf.ones(3)])
  with pytest.raises(ValueError, match="on_nonpositive"):
    gaussian.ratio(g, g, on_nonpositive="skip")
  for bad in (0., -1., float("nan"), float("inf")):
    with pytest.raises(ValueError, match="min_precision"):
      gaussian.ratio_with_count(g, g, min_precision=bad)


# --- power and damping ------------------------------------------------------


@FAST
@given(GAUSSIANS, reals(-3., 3.))
def test_power(g, a):
  assert_gaussian_close(gaussian.power(g, 1.), g, rtol=0.)
  assert_gaussian_close(gaussian.power(g, 0.), gaussian.flat(g), rtol=0.)
  assert_gaussian_close(gaussian.power(g, 2.), gaussian.product(g, g), rtol=1e-15)
  expected = tf.nest.map_structure(lambda x: a * x, g)
  assert_gaussian_close(gaussian.power(g, tf.constant(a, tf.float64)), expected, rtol=1e-15)


@FAST
@given(GAUSSIANS, GAUSSIANS, reals(0., 1.))
def test_damp(new, old, gamma):
  assert_gaussian_close(gaussian.damp(new, old, 0.), old, rtol=0.)
  assert_gaussian_close(gaussian.damp(new, old, 1.), new, rtol=0.)
  half = tf.nest.map_structure(lambda n, o: 0.5 * (n + o), new, old)
  assert_gaussian_close(gaussian.damp(new, old, 0.5), half, rtol=1e-15)
  mixed = gaussian.damp(new, old, gamma)
  expected = tf.nest.map_structure(lambda n, o: gamma * n + (1 - gamma) * o, new, old)
  assert_gaussian_close(mixed, expected, rtol=1e-12, atol=1e-12)
  # A convex combination of proper factors stays proper.
  assert np.all(np_flat(mixed.eta2) > 0)


def test_damp_validates_gamma():
  g = gaussian.NaturalGaussian([tf.ones(3)], [tf.ones(3)])
  for bad in (-0.1, 1.5, float("nan")):
    with pytest.raises(ValueError, match="gamma"):
      gaussian.damp(g, g, bad)
  with pytest.raises(ValueError, match="gamma"):
    gaussian.damp(g, g, [0.5, 0.5])


# --- KL ---------------------------------------------------------------------


@FAST
@given(GAUSSIANS, GAUSSIANS)
def test_kl_matches_tfp(p, q):
  kl = gaussian.kl_divergence(p, q)
  assert kl.shape == () and kl.dtype == tf.float64
  expected = sum(
      float(tf.reduce_sum(tfp.distributions.kl_divergence(a, b))) for a, b in zip(
          tf.nest.flatten(gaussian.to_normal(p)), tf.nest.flatten(gaussian.to_normal(q))))
  np.testing.assert_allclose(float(kl), expected, rtol=1e-9, atol=1e-9)
  elementwise = gaussian.kl_divergence_elementwise(p, q)
  tf.nest.assert_same_structure(elementwise, TEMPLATE, check_types=False)
  assert np.all(np_flat(elementwise) >= 0.)
  np.testing.assert_allclose(np_flat(elementwise).sum(), float(kl), rtol=1e-12)


@FAST
@given(loc_prec(), st.floats(1e-2, 5.), st.floats(0.05, 0.95), st.booleans())
def test_kl_zero_only_for_equal(lp, shift, factor, sharpen):
  loc, prec = lp
  p = natural(loc, prec)
  assert float(gaussian.kl_divergence(p, p)) == 0.
  assert np.all(np_flat(gaussian.kl_divergence_elementwise(p, p)) == 0.)
  moved = natural(tf.nest.map_structure(lambda m: m + shift, loc), prec)
  rescaled = natural(
      loc, tf.nest.map_structure(lambda x: x * (1. / factor if sharpen else factor), prec))
  for q in (moved, rescaled):
    assert np.all(np_flat(gaussian.kl_divergence_elementwise(p, q)) > 0.)
    assert np.all(np_flat(gaussian.kl_divergence_elementwise(q, p)) > 0.)
    assert float(gaussian.kl_divergence(p, q)) > 0.


# --- precision-weighted mean ------------------------------------------------


@FAST
@given(st.lists(loc_prec(), min_size=1, max_size=4), st.data())
def test_precision_weighted_mean_closed_form(lps, data):
  weights = data.draw(st.lists(st.floats(0.1, 5.), min_size=len(lps), max_size=len(lps)))
  out = gaussian.precision_weighted_mean([natural(*lp) for lp in lps], weights)
  mus = np.stack([np_flat(lp[0]) for lp in lps])
  precs = np.stack([np_flat(lp[1]) for lp in lps])
  w = np.asarray(weights)[:, None]
  lam = (w * precs).sum(0)
  mu = (w * precs * mus).sum(0) / lam
  np.testing.assert_allclose(np_flat(gaussian.precision(out)), lam, rtol=1e-12)
  np.testing.assert_allclose(np_flat(gaussian.mean(out)), mu, rtol=1e-9, atol=1e-9)
  as_tensor = gaussian.precision_weighted_mean([natural(*lp) for lp in lps],
                                               tf.constant(weights, tf.float64))
  assert_gaussian_close(as_tensor, out, rtol=1e-12)


@FAST
@given(st.lists(loc_prec(), min_size=2, max_size=4), st.floats(1e-2, 1e2), st.data())
def test_precision_weighted_mean_invariant_to_common_precision_scale(lps, c, data):
  weights = data.draw(st.lists(st.floats(0.1, 5.), min_size=len(lps), max_size=len(lps)))
  base = gaussian.precision_weighted_mean([natural(*lp) for lp in lps], weights)
  scaled = gaussian.precision_weighted_mean(
      [natural(m, tf.nest.map_structure(lambda x: c * x, p)) for m, p in lps], weights)
  assert_structure_close(gaussian.mean(scaled), gaussian.mean(base), rtol=1e-9, atol=1e-9)
  assert_structure_close(gaussian.precision(scaled),
                         tf.nest.map_structure(lambda x: c * x, gaussian.precision(base)),
                         rtol=1e-12)


def test_precision_weighted_mean_validation():
  g = gaussian.NaturalGaussian([tf.ones(3)], [tf.ones(3)])
  with pytest.raises(ValueError, match="non-negative"):
    gaussian.precision_weighted_mean([g, g], [1., -1.])
  with pytest.raises(ValueError, match="non-negative"):
    gaussian.precision_weighted_mean([g, g], [1., float("nan")])
  with pytest.raises(ValueError, match="length"):
    gaussian.precision_weighted_mean([g, g], [1., 1., 1.])
  with pytest.raises(ValueError, match="1-D"):
    gaussian.precision_weighted_mean([g, g], [[1., 1.]])
  with pytest.raises(ValueError, match="at least one"):
    gaussian.precision_weighted_mean([], [])
  with pytest.raises(ValueError, match="list or tuple"):
    gaussian.precision_weighted_mean(g, [1., 1.])
  with pytest.raises(ValueError, match="non-negative"):
    gaussian.precision_weighted_mean([g, g], tf.constant([1., -1.]))
  with pytest.raises(ValueError, match="length"):
    gaussian.precision_weighted_mean([g, g], tf.constant([1.]))


# --- sampling ---------------------------------------------------------------


def test_sample_deterministic_and_seed_dependent():
  g = gaussian.from_loc_scale({
      "a": tf.zeros(5),
      "b": tf.zeros(5)
  }, {
      "a": tf.ones(5),
      "b": tf.ones(5)
  })
  s1 = gaussian.sample(g, tf.constant([1, 2]))
  s2 = gaussian.sample(g, tf.constant([1, 2]))
  s3 = gaussian.sample(g, tf.constant([1, 3]))
  assert_structure_close(s1, s2, rtol=0.)
  assert not np.allclose(np_flat(s1), np_flat(s3))
  # Equal parameters in two leaves still get independent noise.
  assert not np.allclose(s1["a"], s1["b"])
  with pytest.raises(ValueError, match="seed"):
    gaussian.sample(g, tf.constant([1, 2, 3]))
  with pytest.raises(ValueError, match="seed"):
    gaussian.sample(g, tf.constant([1., 2.]))


@settings(max_examples=10, deadline=None)
@given(hnp.arrays(np.float64, (3,), elements=MEANS), hnp.arrays(np.float64, (3,), elements=PRECS),
       st.integers(0, 2**31 - 1))
def test_sample_moments(loc, prec, seed):
  n = 20000
  g = natural([np.tile(loc, (n, 1))], [np.tile(prec, (n, 1))])
  draws = gaussian.sample(g, tf.constant([seed, 7], tf.int64))[0].numpy()
  std = 1. / np.sqrt(prec)
  # 6 standard errors: a spurious failure is practically impossible.
  assert np.all(np.abs(draws.mean(0) - loc) <= 6 * std / np.sqrt(n))
  assert np.all(np.abs(draws.std(0) / std - 1.) <= 6 / np.sqrt(2 * n))


# --- validation, graphs, structures, dtypes --------------------------------


def test_check_valid():
  good = gaussian.NaturalGaussian({"w": tf.constant([1., 2.])}, {"w": tf.constant([1., 3.])})
  assert_gaussian_close(gaussian.check_valid(good, "good"), good, rtol=0.)
  with pytest.raises(ValueError, match="server: 1 entries with non-positive"):
    gaussian.check_valid(good._replace(eta2={"w": tf.constant([0., 1.])}), "server")
  with pytest.raises(ValueError, match="client: 0 .* 1 non-finite"):
    gaussian.check_valid(good._replace(eta1={"w": tf.constant([np.nan, 1.])}), "client")


def test_inside_tf_function_matches_eager():
  a = gaussian.from_loc_scale([tf.constant([0., 1.]), tf.constant(2.)],
                              [tf.constant([1., 2.]), tf.constant(.5)])
  b = gaussian.from_loc_scale([tf.constant([3., -1.]), tf.constant(0.)],
                              [tf.constant([.5, .5]), tf.constant(1.)])
  seed = tf.constant([4, 2])

  def pipeline(a, b, seed):
    ab = gaussian.check_valid(gaussian.product(a, b), "ab")
    cav = gaussian.ratio(ab, b)
    floored, count = gaussian.ratio_with_count(a, ab)
    pooled = gaussian.precision_weighted_mean([a, b], tf.constant([1., 2.]))
    return (cav, floored, count, gaussian.damp(ab, a, 0.3), pooled, gaussian.kl_divergence(ab, a),
            gaussian.sample(ab, seed))

  eager = pipeline(a, b, seed)
  graph = tf.function(pipeline)(a, b, seed)
  for x, y in zip(tf.nest.flatten(eager), tf.nest.flatten(graph)):
    np.testing.assert_allclose(x, y, rtol=1e-6)
  assert int(graph[2]) == 3
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="ratio left 3 entries with non-positive"):
    tf.function(lambda a, b: gaussian.ratio(a, b))(a, gaussian.product(a, b))
  with pytest.raises(tf.errors.InvalidArgumentError, match="bad: 3 entries"):
    tf.function(lambda a: gaussian.check_valid(a, "bad"))(gaussian.power(a, -1.))


def test_nested_structures_preserved():
  structure = {
      "dense": [tf.ones([2, 3]), tf.ones([3])],
      "out": (tf.ones([3, 1]), {
          "bias": tf.ones([1])
      })
  }
  g = gaussian.from_loc_scale(structure, structure)
  outputs = [
      g,
      gaussian.product(g, g),
      gaussian.ratio(gaussian.product(g, g), g),
      gaussian.power(g, .5),
      gaussian.damp(g, g, .5),
      gaussian.flat(g),
      gaussian.precision_weighted_mean([g, g], [1., 1.]),
      gaussian.check_valid(g, "g"),
  ]
  for out in outputs:
    assert isinstance(out, gaussian.NaturalGaussian)
    tf.nest.assert_same_structure(out.eta1, structure)
    tf.nest.assert_same_structure(out.eta2, structure)
  for out in [
      gaussian.mean(g),
      gaussian.variance(g),
      gaussian.sample(g, [1, 2]),
      gaussian.kl_divergence_elementwise(g, g), *gaussian.to_loc_scale(g)
  ]:
    tf.nest.assert_same_structure(out, structure)
  for x, y in zip(tf.nest.flatten(gaussian.sample(g, [1, 2])), tf.nest.flatten(structure)):
    assert x.shape == y.shape
  # NaturalGaussian is itself a tf.nest structure.
  assert len(tf.nest.flatten(g)) == 2 * len(tf.nest.flatten(structure))


def test_dtypes():
  g64 = gaussian.from_loc_scale([np.zeros(2)], [np.ones(2)])
  assert g64.eta1[0].dtype == tf.float64
  for out in [
      gaussian.product(g64, g64),
      gaussian.power(g64, 2.),
      gaussian.damp(g64, g64, .5),
      gaussian.flat(g64),
      gaussian.ratio_with_count(gaussian.product(g64, g64), g64)[0],
      gaussian.precision_weighted_mean([g64], [1.])
  ]:
    assert out.eta1[0].dtype == tf.float64 and out.eta2[0].dtype == tf.float64
  assert gaussian.kl_divergence(g64, g64).dtype == tf.float64
  assert gaussian.sample(g64, [1, 2])[0].dtype == tf.float64
  g32 = gaussian.from_loc_scale([np.zeros(2, np.float32)], [np.ones(2, np.float32)])
  assert g32.eta1[0].dtype == tf.float32
  assert gaussian.from_loc_scale([0.], [1.]).eta2[0].dtype == tf.float32
  # Two numpy dtypes are not silently cast into each other.
  with pytest.raises(ValueError, match="dtype"):
    gaussian.from_loc_scale([np.zeros(2, np.float32)], [np.ones(2)])
  # numpy float64 leaves combined with float32 tensors adopt float32.
  mixed = gaussian.product(g32, gaussian.NaturalGaussian([np.ones(2)], [np.ones(2)]))
  assert mixed.eta1[0].dtype == tf.float32
  mixed = gaussian.from_loc_scale([np.zeros(2)], [tf.ones(2)])
  assert mixed.eta1[0].dtype == tf.float32 == mixed.eta2[0].dtype


def test_isotropic_power_floor_precision_and_mean_log_precision():
  like = gaussian.NaturalGaussian(
      [np.ones((2, 3), np.float32), np.ones(3, np.float32)],
      [np.ones((2, 3), np.float32), np.ones(3, np.float32)])
  p = gaussian.isotropic_power(like, scale=0.5, power=0.25)
  for e1, e2 in zip(p.eta1, p.eta2):
    np.testing.assert_array_equal(e1, 0.0)
    np.testing.assert_allclose(e2, 0.25 / 0.5**2)  # N(0, 0.25)^(1/4): precision 1
  g = gaussian.NaturalGaussian([np.array([2.0, 3.0, -1.0], np.float32)],
                               [np.array([4.0, 1e-3, -2.0], np.float32)])
  fallback = gaussian.from_loc_scale([np.array([7.0, 8.0, 9.0], np.float32)],
                                     [np.ones(3, np.float32)])
  floored, count = gaussian.floor_precision(g, fallback, 0.5)
  assert int(count) == 2
  np.testing.assert_allclose(floored.eta2[0], [4.0, 0.5, 0.5])
  np.testing.assert_allclose(floored.eta1[0], [2.0, 0.5 * 8.0, 0.5 * 9.0])
  np.testing.assert_allclose(float(gaussian.mean_log_precision(floored)),
                             np.mean(np.log([4.0, 0.5, 0.5])),
                             rtol=1e-6)

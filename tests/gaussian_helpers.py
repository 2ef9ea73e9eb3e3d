"""Random Gaussians for the tests of the Bayesian layers and networks."""

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfbfl import gaussian

tfd = tfp.distributions


def random_loc_scale(shapes, rng, loc_scale=1.0, scale_range=(0.05, 0.8)):
  """float32 `(locs, scales)` of `shapes`: `N(0, 1) * loc_scale`, `U(scale_range)`."""
  locs = [rng.normal(size=s).astype(np.float32) * loc_scale for s in shapes]
  scales = [rng.uniform(*scale_range, size=s).astype(np.float32) for s in shapes]
  return locs, scales


def random_posterior(layer, rng, loc_scale=1.0, scale_range=(0.05, 0.8)):
  """Assigns a random posterior to a built mean-field layer; returns its
  `(locs, scales)`, lists over `layer.parameter_names`."""
  shapes = [getattr(layer, f"{n}_loc").shape for n in layer.parameter_names]
  locs, scales = random_loc_scale(shapes, rng, loc_scale, scale_range)
  layer.set_posterior(gaussian.from_loc_scale(locs, scales))
  return locs, scales


def random_shared(net, seed, scale):
  """A random `NaturalGaussian` shaped as `net.shared_posterior()`: locs
  `N(0, 1) * scale`, scales `U(0.05, scale)`."""
  shapes = [v.shape for v in net.shared_trainable_variables[::2]]
  locs, scales = random_loc_scale(shapes, np.random.default_rng(seed), scale, (0.05, scale))
  return gaussian.from_loc_scale(locs, scales)


def tfp_kl(locs, scales, prior_locs, prior_scales):
  """`sum KL(N(locs, scales) || N(prior_locs, prior_scales))` by TFP, a float."""
  return sum(
      float(tf.reduce_sum(tfd.kl_divergence(tfd.Normal(m, s), tfd.Normal(pm, ps))))
      for m, s, pm, ps in zip(locs, scales, prior_locs, prior_scales))

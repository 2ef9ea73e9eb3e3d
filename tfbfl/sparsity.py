"""Signal-to-noise ratio of Gaussian factors and SNR-based sparsification.

VIRTUAL Section IV-F sparsifies each client update by zeroing every entry of
`Delta_i` whose signal-to-noise ratio is below a percentile. `Delta_i` itself is an
un-normalised ratio of Gaussians (its "precision" can be negative), so its SNR is
defined from the Gaussian it produced, the client's updated posterior
`q_i = N(mu, sigma^2)` over the shared weights:

    SNR_d = |mu_d| / sigma_d = |eta1_d| / sqrt(eta2_d).

Zeroing an entry of `Delta_i` in *both* natural parameters leaves that weight's
server posterior and client factor exactly as they were, so pruning can never create
a non-positive precision: every entry either receives the full update or none.

Pruning is rank-exact: with percentile `p`, `round(p/100 * size)` entries with the
smallest SNR are zeroed (ties broken by position), per tensor (`per_layer=True`, a
"layer" being one weight tensor) or over all tensors jointly.
"""

from __future__ import annotations

import tensorflow as tf

from tfbfl import gaussian


def snr(g: gaussian.NaturalGaussian):
  """Per-entry `|mu| / sigma` of a (proper) Gaussian, as a structure."""
  return tf.nest.map_structure(lambda e1, e2: tf.abs(e1) / tf.sqrt(e2), g.eta1, g.eta2)


def _keep_mask_flat(values, percentile):
  size = tf.size(values)
  k = tf.cast(tf.round(tf.cast(size, tf.float32) * percentile / 100.0), tf.int32)
  ranks = tf.argsort(tf.argsort(values, stable=True), stable=True)
  return tf.cast(ranks >= k, values.dtype)


def keep_mask(snr_structure, percentile: float, per_layer: bool = True):
  """1 where an entry is kept, 0 for the `percentile`% lowest-SNR entries."""
  if not 0.0 <= percentile < 100.0:
    raise ValueError(f"prune_percentile must be in [0, 100), got {percentile}.")
  leaves = tf.nest.flatten(snr_structure)
  if per_layer:
    masks = [
        tf.reshape(_keep_mask_flat(tf.reshape(v, [-1]), percentile), tf.shape(v)) for v in leaves
    ]
  else:
    flat = tf.concat([tf.reshape(v, [-1]) for v in leaves], 0)
    mask = _keep_mask_flat(flat, percentile)
    sizes = [tf.size(v) for v in leaves]
    masks = [tf.reshape(m, tf.shape(v)) for m, v in zip(tf.split(mask, sizes), leaves)]
  return tf.nest.pack_sequence_as(snr_structure, masks)


def apply_mask(g: gaussian.NaturalGaussian, mask) -> gaussian.NaturalGaussian:
  """Zeroes both natural parameters where `mask` is 0."""
  return gaussian.NaturalGaussian(tf.nest.map_structure(tf.multiply, g.eta1, mask),
                                  tf.nest.map_structure(tf.multiply, g.eta2, mask))


def count_nonzero(g: gaussian.NaturalGaussian):
  """Entries with a non-zero natural parameter (what a sparse upload carries)."""
  return tf.add_n([
      tf.reduce_sum(tf.cast(tf.logical_or(tf.not_equal(a, 0), tf.not_equal(b, 0)), tf.int32))
      for a, b in zip(tf.nest.flatten(g.eta1), tf.nest.flatten(g.eta2))
  ])

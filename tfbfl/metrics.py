"""Predictive-quality metrics shared by every algorithm's evaluation.

Calibration follows Guo et al. (2017), "On Calibration of Modern Neural Networks":
with `B` equal-width confidence bins over `[0, 1]` (bin `b` holds the examples whose
top-class probability `conf` lies in `(b/B, (b+1)/B]`, bin 0 also holds 0),

    ECE = sum_b (n_b / n) * |acc_b - conf_b|,

`acc_b` and `conf_b` the mean accuracy and mean confidence in bin `b`. Clients
return per-bin *sums* (`calibration_sums`: count, summed confidence, summed
correctness), which add over clients, so the federated ECE equals the ECE of the
pooled test set exactly (`expected_calibration_error`). The negative
log-likelihood (NLL) is the mean of `-log p(y | x)` under the evaluated
predictive, which `tfbfl.round_loop` reports as `server_loss` / `mt_loss`.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

NUM_BINS = 15
# Added to a probability before its log (`probability_sums`): a Monte Carlo average can
# hold an exact 0.
PROBABILITY_FLOOR = 1e-12


def calibration_sums(probs, labels, num_bins: int = NUM_BINS):
  """Per-bin `[count, sum of confidences, sum of correct]`, shape `[3, num_bins]`.

  Args:
    probs: `[n, num_classes]` predictive probabilities (rows sum to 1).
    labels: `[n]` integer labels.
    num_bins: equal-width confidence bins over [0, 1].

  Returns:
    A float32 tensor `[3, num_bins]` (TF ops; usable inside TFF computations).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  probs = tf.convert_to_tensor(probs, tf.float32)
  conf = tf.reduce_max(probs, axis=-1)
  correct = tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), tf.cast(labels, tf.int32)),
                    tf.float32)
  # Bin b holds (b/B, (b+1)/B]; ceil(conf * B) - 1, clipped, puts 0 into bin 0.
  bins = tf.clip_by_value(tf.cast(tf.math.ceil(conf * num_bins), tf.int32) - 1, 0, num_bins - 1)
  ones = tf.ones_like(conf)
  per_bin = lambda v: tf.math.unsorted_segment_sum(v, bins, num_bins)
  return tf.stack([per_bin(ones), per_bin(conf), per_bin(correct)])


def logit_sums(logits, labels, prefix: str):
  """`{prefix}_loss` (summed softmax cross-entropy), `{prefix}_correct` (argmax right) and
  `{prefix}_calibration` (`calibration_sums` of the softmax) of one deterministic model's
  `logits` `[n, num_classes]`. TF ops, an OrderedDict."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  labels = tf.cast(labels, tf.int32)
  return collections.OrderedDict([
      (f"{prefix}_loss", tf.reduce_sum(
          tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))),
      (f"{prefix}_correct", tf.reduce_sum(
          tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32))),
      (f"{prefix}_calibration", calibration_sums(tf.nn.softmax(logits), labels))])


def log_probabilities(probs):
  """`log(probs + PROBABILITY_FLOOR)`: the log predictive every probability-valued
  evaluation, temperature fit and exported decision reads. TF ops."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return tf.math.log(tf.convert_to_tensor(probs, tf.float32) + PROBABILITY_FLOOR)


def probability_sums(probs, labels, prefix: str):
  """`{prefix}_loss` (summed `-log(p_y + PROBABILITY_FLOOR)`), `{prefix}_correct` (argmax right) and
  `{prefix}_calibration` (`calibration_sums`) of predictive probabilities `probs`
  `[n, num_classes]`, e.g. a Monte Carlo average of softmaxes. TF ops, an OrderedDict."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  probs = tf.convert_to_tensor(probs, tf.float32)
  labels = tf.cast(labels, tf.int32)
  log_p = log_probabilities(probs)
  return collections.OrderedDict([
      (f"{prefix}_loss", -tf.reduce_sum(tf.gather(log_p, labels, axis=1, batch_dims=1))),
      (f"{prefix}_correct", tf.reduce_sum(
          tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), labels), tf.float32))),
      (f"{prefix}_calibration", calibration_sums(probs, labels))])


def expected_calibration_error(sums: Sequence[Sequence[float]]) -> float:
  """ECE from `calibration_sums` (or their sum over clients), a float in [0, 1]."""
  sums = np.asarray(sums, np.float64)
  if sums.ndim != 2 or sums.shape[0] != 3:
    raise ValueError(f"calibration sums must have shape [3, bins], got {sums.shape}.")
  count, conf, correct = sums
  n = count.sum()
  if n <= 0:
    raise ValueError("ECE needs at least one example.")
  return float(np.sum(np.abs(correct - conf)) / n)


def numpy_calibration_sums(probs: np.ndarray,
                           labels: np.ndarray,
                           num_bins: int = NUM_BINS) -> np.ndarray:
  """`calibration_sums` in numpy (the reference the TF version is tested against)."""
  probs = np.asarray(probs, np.float32)
  conf32 = probs.max(axis=-1)
  correct = (probs.argmax(axis=-1) == np.asarray(labels)).astype(np.float64)
  # Binned in float32 like the TF version, so edge cases land in the same bin.
  bins = np.clip(np.ceil(conf32 * np.float32(num_bins)).astype(int) - 1, 0, num_bins - 1)
  conf = conf32.astype(np.float64)
  out = np.zeros((3, num_bins))
  np.add.at(out[0], bins, 1.0)
  np.add.at(out[1], bins, conf)
  np.add.at(out[2], bins, correct)
  return out

"""Robust rounds: which client updates a round drops, and the safe means it needs.

Every algorithm that aggregates client updates (VIRTUAL, FedAvg, FedProx, FOLA,
offline Laplace, FedCurv) checks each client's update *inside the client
computation*, before anything is aggregated, with one rule that needs no
statistics across clients:

    drop client i  <=>  update_i has a non-finite entry, or
                        ||move_i|| > max_update_ratio * max(||reference||, 1)

(Euclidean norms over all leaves, computed in float64 so that large finite
values do not overflow). `move_i` is always a move of the model's *weights*
(of a posterior's mean) and `reference` the server's weights (mean) it starts
from, so `max_update_ratio` has one meaning for every algorithm:

* FedAvg / FedProx: the model move `w_i - w^(t)` vs the server weights `w^(t)`;
* FOLA, offline Laplace, FedCurv: the move of the uploaded mean `mu_n - mu_S`
  vs the server weights `mu_S` (every uploaded array, precisions and factor
  deltas included, must be finite; the server precision is no scale for the
  uploaded one: it is 0 in round 1 under the default flat prior);
* VIRTUAL (`check_posterior`): the move of the mean of the client's trained
  posterior `q_i` (`= s^(t) * Delta_i` when nothing is floored) vs the mean of
  the server posterior `s^(t)` it started from; `Delta_i` (both natural parameters), the
  client's new state and `q_i`'s precisions must be finite (and positive).
  Precisions get no ratio: a posterior's precision legitimately grows by large
  factors (`--precision_step=0.05` on digits: mean log precision 5.99 -> 10.49 in
  round 1, single entries far more), so the natural parameters
  `(mu * prec, prec)` grow with it and are no scale for the delta. The rule
  measured them until issue 21: ratio 1e4 in round 1, every client dropped in
  every round, nothing learned.

`max_update_ratio` (`--max_update_ratio`, default `DEFAULT_MAX_UPDATE_RATIO` =
100; `inf` keeps only the finiteness checks) is far above anything a normal run
produces. Largest ratio over the first 3 rounds of the default digits runs
(`launchers.train --algorithm=A --rounds=3`, round metric `update_ratio_max`):
FedAvg 0.225, FedProx 0.217, FOLA 0.225, offline Laplace 0.225, FedCurv 0.225
(round 1, all from the same start); VIRTUAL 0.260 (round 1; 0.076 in round 6),
with `--precision_step=0.05` 0.253 (0.029 in round 6; the old natural-parameter
ratio of that run was 10026 in round 1 and 0.41 in round 6); the ratios shrink
over rounds. A deliberately diverging VIRTUAL client (`tests/test_robust_rounds.py`:
features x 1e3 or x 1e20, client lr 5 to 1e3) turns non-finite (ratio inf) and is
dropped.

A dropped client contributes nothing: its update is zeroed, its weight in
every weighted mean is 0, its training metrics are left out, and it keeps its
previous client state. The round metric `clients_dropped` counts such clients.
If every client of a round is dropped the server model does not move; after
`tfbfl.round_loop.ALL_DROPPED_STOP_ROUNDS` (3) such rounds in a row the run stops
(`tfbfl.round_loop.AllClientsDroppedError`: one line and exit 3,
`tfbfl.round_loop.RUN_STOPPED_STATUS`, through `launchers.train`) instead of finishing untrained.
Local and Global aggregate nothing; they apply only the finiteness check, to
the model they would store (which then stays the previous one).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

DEFAULT_MAX_UPDATE_RATIO = 100.0


def all_finite(tensors):
  """Scalar bool: every entry of every floating leaf of `tensors` is finite."""
  leaves = [t for t in map(tf.convert_to_tensor, tf.nest.flatten(tensors)) if t.dtype.is_floating]
  if not leaves:
    return tf.constant(True)
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in leaves])


def global_norm64(tensors):
  """Euclidean norm over all leaves, in float64 (no overflow for float32 values)."""
  leaves = [tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tf.nest.flatten(tensors)]
  return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(t)) for t in leaves]))


def check_update(update, reference, max_ratio: float, check_norm: bool = True):
  """The drop rule of the module docstring.

  Args:
    update: structure of float tensors, the client's update.
    reference: structure of float tensors, the server value it is measured against.
    max_ratio: `max_update_ratio` (> 0; `inf` disables the norm rule).
    check_norm: False applies the finiteness check only (Local, Global).

  Returns:
    `(ok, ratio)`: scalar bool, True when the update is kept, and the float32
    ratio `||update|| / max(||reference||, 1)` (`inf` for a non-finite update).
  """
  finite = all_finite(update)
  ratio = global_norm64(update) / tf.maximum(global_norm64(reference), 1.0)
  ratio = tf.where(finite, ratio, tf.constant(np.inf, tf.float64))
  ok = finite
  if check_norm and not math.isinf(max_ratio):
    ok = tf.logical_and(ok, ratio <= max_ratio)
  return ok, tf.cast(ratio, tf.float32)


def check_posterior(new, old, max_ratio: float):
  """VIRTUAL's drop rule (module docstring): the mean move of posterior `new` vs
  posterior `old`.

  Args:
    new: the client's trained posterior, `old`: the server posterior it started
      from; each with `eta1` (`mu * prec`) and `eta2` (`prec`) structures of
      float tensors (`tfbfl.gaussian.NaturalGaussian`).
    max_ratio: `max_update_ratio` (> 0; `inf` disables the norm rule).

  Returns:
    `(ok, ratio)` as `check_update`, with `ratio = ||mu_new - mu_old|| /
    max(||mu_old||, 1)` (float64 means); `new` with a non-finite entry or a
    non-positive precision is dropped with ratio `inf`.
  """
  f64 = lambda ts: [tf.cast(t, tf.float64) for t in tf.nest.flatten(ts)]
  prec_new = f64(new.eta2)
  mean_new = [e / p for e, p in zip(f64(new.eta1), prec_new)]
  mean_old = [e / p for e, p in zip(f64(old.eta1), f64(old.eta2))]
  proper = tf.logical_and(all_finite(prec_new),
                          tf.reduce_all([tf.reduce_all(p > 0) for p in prec_new]))
  ok, ratio = check_update([m - o for m, o in zip(mean_new, mean_old)], mean_old, max_ratio)
  ok = tf.logical_and(ok, proper)
  return ok, tf.where(proper, ratio, tf.constant(np.inf, tf.float32))


def keep_if(ok, new, old):
  """`new` where `ok` else `old`, leaf by leaf (structured like `new`; `old` may
  use other containers with the same leaf order)."""
  new_leaves, old_leaves = tf.nest.flatten(new), tf.nest.flatten(old)
  if len(new_leaves) != len(old_leaves):
    raise ValueError(f"keep_if: {len(new_leaves)} new leaves but {len(old_leaves)} old ones.")
  return tf.nest.pack_sequence_as(
      new, [tf.where(ok, n, tf.cast(o, n.dtype)) for n, o in zip(new_leaves, old_leaves)])


def zeros_unless(ok, values):
  """`values` where `ok`, zeros otherwise (a dropped client's upload)."""
  return tf.nest.map_structure(lambda t: tf.where(ok, t, tf.zeros_like(t)), values)


def federated_weighted_mean(values, weight):
  """In a federated computation: `sum_i w_i v_i / sum_i w_i` at SERVER.

  Unlike `tff.federated_mean`, a client with weight 0 contributes nothing even
  when its values are NaN, and a zero total weight gives zeros, not NaN.
  `values` (float leaves) and `weight` (float32 scalar) are placed at CLIENTS.
  """
  value_type = values.type_signature.member
  weight_type = weight.type_signature.member

  @tff.tensorflow.computation(value_type, weight_type)
  def scale(v, w):
    return tf.nest.map_structure(
        lambda t: tf.where(w > 0, t * tf.cast(w, t.dtype), tf.zeros_like(t)), v)

  @tff.tensorflow.computation(value_type, weight_type)
  def divide(total, w):
    return tf.nest.map_structure(lambda t: tf.math.divide_no_nan(t, tf.cast(w, t.dtype)), total)

  total = tff.federated_sum(tff.federated_map(scale, (values, weight)))
  return tff.federated_map(divide, (total, tff.federated_sum(weight)))


def drop_metrics(clients_dropped, update_ratio):
  """Round metrics (federated, at SERVER) from the clients' `dropped` (1.0 for a
  dropped client) and `update_ratio`: {clients_dropped, update_ratio_max}."""
  return dict(clients_dropped=tff.federated_sum(clients_dropped),
              update_ratio_max=tff.federated_max(update_ratio))

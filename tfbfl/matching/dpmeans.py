"""DP-means clustering of hidden neurons: the PFNM paper's clustering baseline.

DP-means (Kulis & Jordan, 2012) minimises

    sum_i ||x_i - mu_{z_i}||^2 + lambda * (number of clusters)

by hard-assignment sweeps: each point joins its nearest centre unless the squared
distance exceeds ``lambda``, in which case it opens a new cluster centred on itself;
then centres are recomputed as cluster means and empty clusters are dropped.  The
objective never increases, so the sweeps stop when the partition repeats.

For federated neural matching the points are the single-hidden-layer atoms
``[W1[:, l], b1[l], W2[l, :]]`` of all clients pooled together (no one-to-one
constraint inside a client, unlike PFNM); each cluster mean is a global neuron.

#### References

Kulis and Jordan. Revisiting k-means: New Algorithms via Bayesian Nonparametrics.
ICML 2012.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from tfbfl.matching.single_layer import (_check_single_layer_weights, class_frequency_weights,
                                 single_layer_atoms, split_single_layer_atoms)

__all__ = ["dp_means", "dpmeans_single_layer"]


def _canonical(labels: np.ndarray) -> np.ndarray:
  """Relabel clusters by order of first appearance (partition identity)."""
  _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
  rank = np.argsort(np.argsort(first))
  return rank[inv]


def dp_means(points: np.ndarray,
             lam: float,
             max_iter: int = 100,
             seed: Optional[int] = 0) -> Tuple[np.ndarray, np.ndarray]:
  """DP-means clustering (Kulis & Jordan 2012, Algorithm 1).

    Starts from one cluster at the global mean.  Each sweep visits the points in a
    seeded random order; point ``x_i`` goes to the nearest of the sweep-start
    centres and of the centres opened earlier in the sweep,
    ``z_i = argmin_c ||x_i - mu_c||^2``, unless that squared distance exceeds
    ``lam``, in which case it opens a new cluster at ``x_i``.  Centres are then the
    cluster means.

    Args:
      points: ``(N, A)`` finite points, ``N >= 1``.
      lam: penalty ``lambda > 0`` per cluster (squared-distance units).
      max_iter: maximal number of sweeps (>= 1).
      seed: seed of the visiting order.

    Returns:
      ``(centers (k, A), labels (N,))`` with ``labels`` in ``0..k-1``.
    """
  X = np.asarray(points, dtype=np.float64)
  if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
    raise ValueError(f"points must be a non-empty (N, A) matrix, got shape {X.shape}")
  if not np.all(np.isfinite(X)):
    raise ValueError("points contains non-finite values")
  if not np.isfinite(lam) or lam <= 0:
    raise ValueError(f"lam must be a finite positive number, got {lam!r}")
  if int(max_iter) != max_iter or max_iter < 1:
    raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
  rng = np.random.default_rng(seed)
  N = X.shape[0]
  sq = np.einsum("na,na->n", X, X)
  centers = X.mean(axis=0, keepdims=True)
  labels = np.zeros(N, dtype=np.int64)
  prev = None
  for _ in range(int(max_iter)):
    # Squared distances to the sweep-start centres, all at once.
    d = sq[:, None] - 2.0 * X @ centers.T + np.einsum("ka,ka->k", centers, centers)[None, :]
    best, arg = d.min(axis=1), d.argmin(axis=1)
    k0 = centers.shape[0]
    new_idx = []  # points that opened clusters this sweep
    for i in rng.permutation(N):
      di, ci = best[i], arg[i]
      if new_idx:
        dn = ((X[new_idx] - X[i])**2).sum(axis=1)
        m = int(dn.argmin())
        if dn[m] < di:
          di, ci = dn[m], k0 + m
      if di > lam:
        new_idx.append(i)
        ci = k0 + len(new_idx) - 1
      labels[i] = ci
    # Cluster means; empty clusters disappear.
    used, labels = np.unique(labels, return_inverse=True)
    counts = np.bincount(labels)
    centers = np.zeros((used.shape[0], X.shape[1]))
    np.add.at(centers, labels, X)
    centers /= counts[:, None]
    canon = _canonical(labels)
    if prev is not None and np.array_equal(canon, prev):
      break
    prev = canon
  return centers, labels


def dpmeans_single_layer(weights,
                         class_counts=None,
                         lam: float = 1.0,
                         max_iter: int = 100,
                         seed: Optional[int] = 0,
                         *,
                         return_labels: bool = False):
  """Global one-hidden-layer network by DP-means clustering of all clients' neurons.

    Atoms ``[W1[:, l], b1[l], W2[l, :]]`` of every client are clustered with
    ``dp_means``; the cluster means form the global hidden layer.  The softmax bias
    is the class-frequency weighted average
    ``b_k = sum_j omega_jk b_jk / sum_j omega_jk`` (uniform without counts).

    Args:
      weights: list over clients of ``(W1 (D, L_j), b1 (L_j,), W2 (L_j, K), b2 (K,))``.
      class_counts: ``None`` or list of ``(K,)`` per-client class counts.
      lam: DP-means penalty ``lambda > 0`` (squared distance in atom space).
      max_iter, seed: as in ``dp_means``.
      return_labels: also return the per-client cluster labels.

    Returns:
      ``(W1_g, b1_g, W2_g, b2_g)`` (and a list of ``(L_j,)`` labels if requested).
    """
  D, K, ws = _check_single_layer_weights(weights)
  J = len(ws)
  atoms = [single_layer_atoms(W1, b1, W2) for W1, b1, W2, _ in ws]
  centers, labels = dp_means(np.vstack(atoms), lam, max_iter, seed)
  W1_g, b1_g, W2_g = split_single_layer_atoms(centers, D)
  omega = class_frequency_weights(class_counts, J, K)
  b2_g = (omega * np.asarray([w[3] for w in ws])).sum(axis=0) / omega.sum(axis=0)
  out = (W1_g, b1_g, W2_g, b2_g)
  if return_labels:
    splits = np.cumsum([a.shape[0] for a in atoms])[:-1]
    return out, np.split(labels, splits)
  return out

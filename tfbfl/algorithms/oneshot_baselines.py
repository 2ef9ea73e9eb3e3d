"""Baselines of the PFNM paper (section 4 and supplement 4.1).

Networks are lists of ``(W, b)`` pairs (``tfbfl.algorithms.pfnm.Network``) and
all evaluation is numpy; every function is deterministic given its seed.

Baselines that satisfy PFNM's constraints (one communication, a global model of
modest size, no data pooled at the server):

* ``local_accuracies``: each client's own network on the pooled test data
  (the paper's "average local model" baseline is their mean).
* ``average_networks``: one-shot Federated Averaging, the example-weighted mean
  of the trained weights (McMahan et al. 2017); meaningful only with a shared
  initialisation (``LocalTrainingConfig.shared_init``); with independent
  initialisations it illustrates the permutation problem PFNM solves.
* ``dpmeans_network``: DP-means clustering of the hidden neurons
  (``tfbfl.matching.dpmeans_single_layer``; one hidden layer only).

Baselines with extra resources (each violates one constraint; ``CONSTRAINT``
says which):

* ``ensemble_proba`` / ``ensemble_accuracy``: uniform ensemble
  ``argmax_k 1/J sum_j p_jk`` and weighted ensemble
  ``argmax_k 1/n_k sum_j n_jk p_jk`` (supplement 4.1); the "global model" is all
  ``J`` networks stacked (``ensemble_size``).
* ``distill``: knowledge distillation (Hinton et al. 2015) of the uniform
  ensemble into one network (500 units per layer) trained on the *pooled*
  training inputs (violates the no-pooling constraint).
* ``downpour_sgd``: downpour SGD (Dean et al. 2012) simulated synchronously with
  one communication per epoch: each round the server broadcasts its weights,
  every client trains ``epochs_per_round`` epochs from them (Adam, Table 1),
  and the server moves to ``w + server_lr * (mean_j w_j - w)`` with the
  example-weighted mean of the client weights (``server_lr = 1``: the mean).
  Asynchronous downpour applies the clients' updates one after the other,
  which the synchronous sum ``server_lr = J`` approximates; the mean is the
  stable choice.  Every round is the TFF computation
  ``LocalTrainer.dsgd_round_fn``.
"""

from __future__ import annotations

import atexit
import dataclasses
from typing import Callable, List, Optional, Sequence

import numpy as np

from tfbfl import _lazy
from tfbfl.algorithms import pfnm
from tfbfl.matching import dpmeans_single_layer

tf = _lazy.load("tensorflow")  # loads when a baseline trains (`tfbfl._lazy`)

__all__ = [
    "CONSTRAINT",
    "local_accuracies",
    "average_networks",
    "ensemble_proba",
    "ensemble_accuracy",
    "ensemble_size",
    "distill",
    "downpour_sgd",
    "dpmeans_network",
    "derive_seed",
]

# Which of PFNM's constraints a baseline violates ("" = none).
CONSTRAINT = {
    "local": "",
    "fedavg": "",
    "dpmeans": "",
    "uniform_ensemble": "global model = all J networks stacked",
    "weighted_ensemble": "global model = all J networks stacked",
    "distillation": "pools the training inputs at the server (violates the federated constraint)",
    "downpour_sgd": "one communication per round (comm_rounds rounds)",
}

_DISTILL_FNS = {}  # student config -> tf.function (one trace per config)
# Emptied before the interpreter tears modules down: TensorFlow, loaded after this
# module, goes first, and a traced function freed after it raises in its __del__.
atexit.register(_DISTILL_FNS.clear)


def derive_seed(*ints: int) -> int:
  """A non-negative 31-bit seed that is a pure function of ``ints``."""
  return int(np.random.SeedSequence([int(i) for i in ints]).generate_state(1)[0] >> 1)


def _check_nets(nets: Sequence[pfnm.Network]) -> List[pfnm.Network]:
  if not nets:
    raise ValueError("nets must be a non-empty list of networks")
  return list(nets)


def local_accuracies(nets: Sequence[pfnm.Network], x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """``(J,)`` test accuracy of every client's own network."""
  return np.array([pfnm.accuracy(n, x, y) for n in _check_nets(nets)])


def average_networks(nets: Sequence[pfnm.Network],
                     weights: Optional[Sequence[float]] = None) -> pfnm.Network:
  """One-shot FedAvg: ``sum_j a_j w_j`` with ``a_j = weights_j / sum weights``
  (uniform when ``weights`` is None; FedAvg uses the example counts).

  Raises:
    ValueError: if the networks' shapes differ or the weights are not positive.
  """
  nets = _check_nets(nets)
  shapes = [[(np.shape(W), np.shape(b)) for W, b in n] for n in nets]
  if any(s != shapes[0] for s in shapes):
    raise ValueError("average_networks needs networks of identical shapes, got "
                     f"{sorted(set(map(str, shapes)))[:2]}")
  a = np.ones(len(nets)) if weights is None else np.asarray(weights, np.float64)
  if a.shape != (len(nets),) or np.any(a < 0) or a.sum() <= 0:
    raise ValueError(f"weights must be {len(nets)} non-negative numbers with a positive sum")
  a = a / a.sum()
  return [(sum(ai * np.asarray(n[l][0], np.float64)
               for ai, n in zip(a, nets)),
           sum(ai * np.asarray(n[l][1], np.float64)
               for ai, n in zip(a, nets)))
          for l in range(len(nets[0]))]


def ensemble_proba(nets: Sequence[pfnm.Network],
                   x: np.ndarray,
                   class_counts: Optional[Sequence[np.ndarray]] = None) -> np.ndarray:
  """Ensemble class scores ``(n, K)``.

  Uniform (``class_counts`` None): ``1/J sum_j p_jk(x)``.  Weighted:
  ``1/n_k sum_j n_jk p_jk(x)`` with ``n_k = sum_j n_jk`` (supplement 4.1; a
  class seen by no client gets the uniform weights).  The weighted scores need
  not sum to one over classes; only their argmax is used.
  """
  nets = _check_nets(nets)
  probs = np.stack([pfnm.predict_proba(n, x) for n in nets])  # (J, n, K)
  if class_counts is None:
    return probs.mean(axis=0)
  n_jk = np.asarray(class_counts, np.float64)
  if n_jk.shape != (len(nets), probs.shape[2]):
    raise ValueError(f"class_counts must be {len(nets)} arrays of shape ({probs.shape[2]},), "
                     f"got {n_jk.shape}")
  n_k = n_jk.sum(axis=0)
  w = np.where(n_k > 0, n_jk / np.where(n_k > 0, n_k, 1.0), 1.0 / len(nets))
  return np.einsum("jk,jnk->nk", w, probs)


def ensemble_accuracy(nets: Sequence[pfnm.Network],
                      x: np.ndarray,
                      y: np.ndarray,
                      class_counts: Optional[Sequence[np.ndarray]] = None) -> float:
  """Accuracy of the uniform (or, with ``class_counts``, weighted) ensemble."""
  return float(np.mean(ensemble_proba(nets, x, class_counts).argmax(axis=1) == np.asarray(y)))


def ensemble_size(nets: Sequence[pfnm.Network]) -> dict:
  """Size of the stacked ensemble (sum over networks, as ``pfnm.model_size``)."""
  sizes = [pfnm.model_size(n) for n in _check_nets(nets)]
  depth = len(sizes[0]["layers"])
  layers = [int(sum(s["layers"][c] for s in sizes)) for c in range(depth)]
  return {
      "neurons": int(sum(layers)),
      "layers": layers,
      "params": int(sum(s["params"] for s in sizes))
  }


def distill(nets: Sequence[pfnm.Network],
            x_pool: np.ndarray,
            cfg: pfnm.LocalTrainingConfig,
            seed: int,
            hidden_units: Sequence[int] = (500,),
            epochs: Optional[int] = None) -> pfnm.Network:
  """Knowledge distillation of the uniform ensemble into a new network.

  The student (``hidden_units``, initialised as the clients' networks) is
  trained with ``cfg``'s Adam settings to minimise the cross-entropy between
  its softmax and the ensemble's probabilities on the pooled training inputs
  ``x_pool`` -- pooling data at the server, which PFNM's setting forbids.
  Plain TF on the server (no TFF: nothing is federated here).
  """
  x = np.asarray(x_pool, np.float32).reshape(len(x_pool), -1)
  targets = ensemble_proba(nets, x).astype(np.float32)
  student = dataclasses.replace(cfg,
                                hidden_units=tuple(hidden_units),
                                epochs=cfg.epochs if epochs is None else int(epochs))
  init = pfnm.initial_weights(student, [seed, 7])
  flat = [a for W, b in init for a in (W, b)]
  if student not in _DISTILL_FNS:
    _DISTILL_FNS[student] = tf.function(
        lambda flat0, x_, t_, seed_: pfnm.train_tensors(student, flat0, seed_, x_, t_),
        reduce_retracing=True, autograph=False)
  out = _DISTILL_FNS[student](flat, tf.constant(x), tf.constant(targets),
                              tf.constant([seed, 11], tf.int64))
  out = [t.numpy() for t in out]
  return [(out[i], out[i + 1]) for i in range(0, len(out), 2)]


def downpour_sgd(trainer: pfnm.LocalTrainer,
                 client_data,
                 comm_rounds: int,
                 seed: int,
                 server_lr: float = 1.0,
                 init_weights: Optional[pfnm.Network] = None,
                 callback: Optional[Callable[[int, pfnm.Network], None]] = None) -> pfnm.Network:
  """Downpour SGD with ``comm_rounds`` communications (see module doc).

  Args:
    trainer: ``LocalTrainer`` whose ``config.epochs`` is the number of local
      epochs per round (1 for "one communication per epoch").
    client_data: list of ``(x, y)`` per client.
    comm_rounds: number of rounds (>= 1).
    seed: seed of the initialisation (shared by all, as the server's) and of
      the per-round shuffles.
    server_lr: server step on the mean client weights (> 0).
    init_weights: optional initial server network.
    callback: called as ``callback(round, weights)`` after every round.
  """
  if isinstance(comm_rounds, bool) or int(comm_rounds) != comm_rounds or comm_rounds < 1:
    raise ValueError(f"comm_rounds must be an int >= 1, got {comm_rounds!r}")
  if not np.isfinite(server_lr) or server_lr <= 0:
    raise ValueError(f"server_lr must be a finite number > 0, got {server_lr!r}")
  glob = (pfnm.initial_weights(trainer.config,
                               pfnm.init_seeds(seed, 1, True)[0]) if init_weights is None else
          [(np.asarray(W, np.float32), np.asarray(b, np.float32)) for W, b in init_weights])
  for r in range(int(comm_rounds)):
    mean = trainer.dsgd_round(glob, client_data, seed=derive_seed(seed, r))
    glob = [(W + server_lr * (Wm - W), b + server_lr * (bm - b))
            for (W, b), (Wm, bm) in zip(glob, mean)]
    if callback is not None:
      callback(r + 1, glob)
  return glob


def dpmeans_network(nets: Sequence[pfnm.Network],
                    class_counts=None,
                    lam: float = 1.0,
                    max_iter: int = 30,
                    seed: int = 0) -> pfnm.Network:
  """Global one-hidden-layer network from DP-means clustering of all neurons.

  Raises:
    ValueError: for networks with more than one hidden layer.
  """
  nets = _check_nets(nets)
  if any(len(n) != 2 for n in nets):
    raise ValueError("dpmeans_network supports one hidden layer only")
  W1, b1, W2, b2 = dpmeans_single_layer([(n[0][0], n[0][1], n[1][0], n[1][1]) for n in nets],
                                        class_counts,
                                        lam=lam,
                                        max_iter=max_iter,
                                        seed=seed)
  return [(W1, b1), (W2, b2)]

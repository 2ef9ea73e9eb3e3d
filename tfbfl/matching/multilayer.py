"""Multilayer PFNM: top-down matching of every hidden layer (paper section 3.2,
Propositions 3-4, supplement section 2, Algorithm 1).

Client ``j`` has ``C >= 1`` hidden layers: ``h_c = act(h_{c-1} W_c + b_c)`` with
``h_0 = x`` and logits ``h_C W_{C+1} + b_{C+1}``; ``W_c`` is ``(L^{c-1}_j, L^c_j)``.

The generative model goes from the outputs down (Definition 1): the atoms of
hidden layer ``c`` are the neurons' *outgoing* weights towards layer ``c + 1``,
whose global neurons are already known.  Inference is therefore greedy and
top-down (supplement Algorithm 1):

1. ``c = C``: atom of neuron ``l`` is ``[b_C[l], W_{C+1}[l, :]]`` (``K`` outputs
   are shared by all clients, so no patching is needed).
2. ``c = C-1, ..., 1``: the outgoing matrix ``W_{c+1}`` of client ``j``
   (``L^c_j x L^{c+1}_j``) is first *patched* into the global indices of layer
   ``c + 1``: ``V[:, a^{c+1}_j] = W_{c+1}`` and zeros for the global neurons client
   ``j`` lacks (paper: ``v_jli := 0`` if ``b^{c+1}_ji = 0``).  The atom is
   ``[b_c[l], V[l, :]]``; for ``c = 1`` the incoming weights ``W_1[:, l]`` are
   prepended (Remark 1).
3. Each layer is matched with the single-layer engine (eq. 9 / Proposition 3) and
   its global atoms are the posterior means of Proposition 4 (eq. 12), which give
   ``b_c`` and the global ``W_{c+1}`` (and ``W_1`` at ``c = 1``).

Every hidden layer is matched (the public reference code only matched the first
hidden layer correctly).  The softmax bias is handled as in the single-layer case.

#### Examples

```python
import numpy as np
from tfbfl.matching import pfnm_multilayer

rng = np.random.default_rng(0)
net = [(rng.normal(size=(5, 4)), rng.normal(size=4)),
       (rng.normal(size=(4, 3)), rng.normal(size=3)),
       (rng.normal(size=(3, 2)), rng.normal(size=2))]
glob = pfnm_multilayer([net, net])
assert [W.shape for W, _ in glob] == [(5, 4), (4, 3), (3, 2)]
```
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from tfbfl.matching.single_layer import (MatchingHyperparams, MatchResult, class_frequency_weights,
                                 match_layer, softmax_bias_posterior)

__all__ = ["pfnm_multilayer", "multilayer_atoms", "patch_outgoing"]


def patch_outgoing(W_out: np.ndarray, assignment_up: np.ndarray, L_up: int) -> np.ndarray:
  """Scatter a client's outgoing weights into the global upper layer.

    ``V[:, assignment_up[m]] = W_out[:, m]`` and 0 for the ``L_up - L^{c+1}_j``
    global neurons the client does not have (paper section 3.2).

    Args:
      W_out: ``(L^c_j, L^{c+1}_j)`` outgoing weights of client ``j``.
      assignment_up: ``(L^{c+1}_j,)`` global indices of the client's upper neurons.
      L_up: number ``L^{c+1}`` of global neurons of the upper layer.
    """
  V = np.zeros((W_out.shape[0], L_up))
  V[:, assignment_up] = W_out
  return V


def multilayer_atoms(bias: np.ndarray,
                     outgoing: np.ndarray,
                     incoming: Optional[np.ndarray] = None) -> np.ndarray:
  """Atoms of a hidden layer: ``[incoming (D, first layer only), bias, outgoing]``,
    shape ``(L^c_j, [D +] 1 + L^{c+1})``."""
  parts = [] if incoming is None else [np.asarray(incoming, np.float64).T]
  parts += [np.asarray(bias, np.float64)[:, None], np.asarray(outgoing, np.float64)]
  return np.hstack(parts)


def _check_multilayer_weights(weights) -> Tuple[int, List[List[Tuple[np.ndarray, np.ndarray]]]]:
  if isinstance(weights, np.ndarray) or not isinstance(weights, Sequence) or len(weights) < 1:
    raise ValueError("weights must be a non-empty list (J >= 1) of per-client layer lists")
  ws = []
  for j, layers in enumerate(weights):
    if len(layers) < 2:
      raise ValueError(f"weights[{j}] must list (W_l, b_l) for l = 1..C+1 with C >= 1, "
                       f"got {len(layers)} layers")
    client = []
    for l, wb in enumerate(layers):
      if len(wb) != 2:
        raise ValueError(f"weights[{j}][{l}] must be a (W, b) pair")
      W, b = np.asarray(wb[0], np.float64), np.asarray(wb[1], np.float64)
      if W.ndim != 2 or W.shape[1] < 1 or b.shape != (W.shape[1],):
        raise ValueError(f"weights[{j}][{l}]: W must be (n_in, n_out) and b (n_out,), "
                         f"got {W.shape} and {b.shape}")
      if not (np.all(np.isfinite(W)) and np.all(np.isfinite(b))):
        raise ValueError(f"weights[{j}][{l}] contains non-finite values")
      if l > 0 and W.shape[0] != client[-1][0].shape[1]:
        raise ValueError(f"weights[{j}][{l}]: W has {W.shape[0]} inputs but layer {l - 1} "
                         f"has {client[-1][0].shape[1]} outputs")
      client.append((W, b))
    ws.append(client)
  n_layers = len(ws[0])
  D, K = ws[0][0][0].shape[0], ws[0][-1][0].shape[1]
  for j, client in enumerate(ws):
    if len(client) != n_layers:
      raise ValueError(f"weights: client {j} has {len(client)} layers, client 0 has {n_layers}")
    if client[0][0].shape[0] != D:
      raise ValueError(f"weights: client {j} has input dimension {client[0][0].shape[0]}, "
                       f"client 0 has {D}")
    if client[-1][0].shape[1] != K:
      raise ValueError(f"weights: client {j} has {client[-1][0].shape[1]} outputs, "
                       f"client 0 has {K}")
  return n_layers - 1, ws


def _layer_hparams(hp, C: int) -> List[MatchingHyperparams]:
  if hp is None:
    return [MatchingHyperparams()] * C
  if isinstance(hp, MatchingHyperparams):
    return [hp] * C
  hps = list(hp)
  if len(hps) != C or not all(isinstance(h, MatchingHyperparams) for h in hps):
    raise ValueError(f"hp must be a MatchingHyperparams or a list of {C} of them "
                     f"(one per hidden layer, bottom first)")
  return hps


def pfnm_multilayer(weights,
                    class_counts=None,
                    hp: Union[None, MatchingHyperparams, Sequence[MatchingHyperparams]] = None,
                    *,
                    return_matching: bool = False):
  """One-shot multilayer PFNM (supplement Algorithm 1), every hidden layer matched.

    Args:
      weights: list over clients of ``[(W_1, b_1), ..., (W_{C+1}, b_{C+1})]``,
        ``W_l`` of shape ``(L^{l-1}_j, L^l_j)``; ``L^0 = D`` and ``L^{C+1} = K``
        must agree across clients.
      class_counts: ``None`` or list over clients of ``(K,)`` class counts (softmax
        bias weights and, with ``softmax_precision == "class_frequency"``, the
        precisions of the top hidden layer's outgoing weights).
      hp: one ``MatchingHyperparams`` for all layers or a list of ``C`` (layer 1
        first).  The softmax bias uses the top layer's.
      return_matching: also return the per-layer ``MatchResult`` list (layer 1
        first).

    Returns:
      Global ``[(W_1, b_1), ..., (W_{C+1}, b_{C+1})]`` with ``W_1`` of shape
      ``(D, L^1)``, ``W_{C+1}`` of shape ``(L^C, K)``.
    """
  C, ws = _check_multilayer_weights(weights)
  hps = _layer_hparams(hp, C)
  J = len(ws)
  D, K = ws[0][0][0].shape[0], ws[0][-1][0].shape[1]
  omega = class_frequency_weights(class_counts, J, K)

  results: List[Optional[MatchResult]] = [None] * C
  glob_W: List[Optional[np.ndarray]] = [None] * (C + 1)
  glob_b: List[Optional[np.ndarray]] = [None] * (C + 1)
  assign_up, L_up = None, K
  for c in range(C, 0, -1):  # hidden layer c (1-based), top down
    h = hps[c - 1]
    atoms, obs_var = [], []
    for j in range(J):
      W_c, b_c = ws[j][c - 1]
      W_out = ws[j][c][0]
      if c == C:
        outgoing = W_out
        with np.errstate(divide="ignore"):
          out_var = (h.sigma_sq / omega[j] if h.softmax_precision == "class_frequency" else np.full(
              K, h.sigma_sq))
      else:
        outgoing = patch_outgoing(W_out, assign_up[j], L_up)
        out_var = np.full(L_up, h.sigma_sq if h.missing_outgoing == "zero" else np.inf)
        out_var[assign_up[j]] = h.sigma_sq
      incoming = W_c if c == 1 else None
      atoms.append(multilayer_atoms(b_c, outgoing, incoming))
      n_in = D if c == 1 else 0
      obs_var.append(np.concatenate([np.full(n_in + 1, h.sigma_sq), out_var]))
    n_in = D if c == 1 else 0
    mu0 = np.zeros(n_in + 1 + L_up)
    mu0[n_in] = h.bias_prior_mean
    res = match_layer(atoms, h, prior_mean=mu0, obs_var=obs_var)
    results[c - 1] = res
    theta = res.global_atoms
    glob_b[c - 1] = theta[:, n_in].copy()
    glob_W[c] = theta[:, n_in + 1:].copy()
    if c == 1:
      glob_W[0] = theta[:, :D].T.copy()
    assign_up, L_up = res.assignments, res.num_global

  Gb, Pb = softmax_bias_posterior([ws[j][-1][1] for j in range(J)], omega, hps[-1])
  glob_b[C] = Gb / Pb
  out = [(glob_W[l], glob_b[l]) for l in range(C + 1)]
  return (out, results) if return_matching else out

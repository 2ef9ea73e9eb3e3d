"""Streaming PFNM (paper section 3.3, supplement section 3, eqs. 10-11).

``J`` groups (clients) reveal new one-hidden-layer networks at steps
``s = 1, ..., S``.  The posterior after step ``s`` is the prior of step ``s + 1``:
for every global neuron ``i`` (supplement eq. 10, per coordinate)

    1 / sigma_{0,i}^{2,s+1} = 1 / sigma_{0,i}^{2,s} + sum_{j,l} B^{j,s}_il / sigma_j^2
    mu_{0,i}^{s+1} = (mu_{0,i}^s / sigma_{0,i}^{2,s} + sum_{j,l} B^{j,s}_il v^s_jl / sigma_j^2)
                     * sigma_{0,i}^{2,s+1},

i.e. the natural sums ``(G, P)`` of ``match_layer`` simply keep accumulating.
Neurons never used before keep the base measure ``N(mu0, sigma0^2)``.  The
assignment cost at step ``s`` is eq. (11): existing neurons use their own prior,
new neurons get ``2 log(gamma0 / (s J))``; the popularity term follows
``hp.streaming_popularity`` (``"pooled"``: ``log(m_i / (sJ - m_i))`` over all
batches seen so far, which makes step 1 identical to one-shot matching;
``"group"``: the supplement's per-group heuristic ``log((1+m_ji)/(s-m_ji))``).

#### Examples

```python
import numpy as np
from tfbfl.matching import StreamingPFNM

rng = np.random.default_rng(0)
net = (rng.normal(size=(4, 3)), rng.normal(size=3),
       rng.normal(size=(3, 2)), rng.normal(size=2))
stream = StreamingPFNM()
for step in range(2):
    W1, b1, W2, b2 = stream.update([net, net])
assert W1.shape == (4, 3)
```
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import numpy as np

from tfbfl.matching.single_layer import (MatchingHyperparams, MatchResult, _check_single_layer_weights,
                                 base_prior_mean, class_frequency_weights, match_layer,
                                 single_layer_atoms, single_layer_obs_var, softmax_bias_posterior,
                                 split_single_layer_atoms)

__all__ = ["StreamingPFNM", "StreamingState"]


@dataclasses.dataclass
class StreamingState:
  """Posterior after ``steps`` streaming steps.

    Attributes:
      G, P: ``(L, A)`` natural sums of the global neurons (eq. 10): prior of the
        next step has mean ``G / P`` and variance ``1 / P``.
      group_counts: ``(J, L)`` int, ``m_ji``: steps in which group ``j`` used
        neuron ``i``.
      softmax_G, softmax_P: ``(K,)`` natural sums of the softmax bias.
      steps: number of completed steps.
      D, K: input and output dimensions.
    """

  G: np.ndarray
  P: np.ndarray
  group_counts: np.ndarray
  softmax_G: np.ndarray
  softmax_P: np.ndarray
  steps: int
  D: int
  K: int

  @property
  def num_global(self) -> int:
    return int(self.G.shape[0])


class StreamingPFNM:
  """Streaming single-hidden-layer PFNM; see the module docstring.

    Args:
      hp: ``MatchingHyperparams`` (default paper values).
    """

  def __init__(self, hp: Optional[MatchingHyperparams] = None):
    self.hp = MatchingHyperparams() if hp is None else hp
    self.state: Optional[StreamingState] = None
    self.last_result: Optional[MatchResult] = None

  def update(self, weights_list, class_counts=None) -> Tuple[np.ndarray, ...]:
    """Match step ``s``'s networks against the posterior of step ``s - 1``.

        Args:
          weights_list: list over the ``J`` groups of ``(W1, b1, W2, b2)``; ``J``,
            ``D`` and ``K`` must stay the same over steps.
          class_counts: ``None`` or list over groups of this step's ``(K,)`` counts.

        Returns:
          Global ``(W1 (D, L), b1 (L,), W2 (L, K), b2 (K,))`` after this step.
        """
    hp = self.hp
    D, K, ws = _check_single_layer_weights(weights_list)
    J = len(ws)
    st = self.state
    if st is not None and (st.group_counts.shape[0], st.D, st.K) != (J, D, K):
      raise ValueError(f"weights_list: expected the same J={st.group_counts.shape[0]} groups with "
                       f"D={st.D}, K={st.K} as earlier steps, got J={J}, D={D}, K={K}")
    omega = class_frequency_weights(class_counts, J, K)
    atoms = [single_layer_atoms(W1, b1, W2) for W1, b1, W2, _ in ws]
    obs_var = [single_layer_obs_var(D, K, omega[j], hp) for j in range(J)]
    mu0 = base_prior_mean(D, K, hp)
    if st is None:
      res = match_layer(atoms, hp, prior_mean=mu0, obs_var=obs_var)
      counts = np.zeros((J, 0), dtype=np.int64)
      Gb, Pb = softmax_bias_posterior([w[3] for w in ws], omega, hp)
    else:
      res = match_layer(atoms,
                        hp,
                        prior_mean=st.G / st.P,
                        prior_var=1.0 / st.P,
                        prior_popularity=st.group_counts,
                        obs_var=obs_var,
                        base_mean=mu0,
                        prior_steps=st.steps)
      counts = st.group_counts
      # Softmax bias: previous posterior is the prior, add this step's evidence.
      Gs, Ps = softmax_bias_posterior([w[3] for w in ws], omega, hp)
      Gb = st.softmax_G + Gs - hp.bias_prior_mean / hp.sigma0_sq
      Pb = st.softmax_P + Ps - 1.0 / hp.sigma0_sq
    L = res.num_global
    counts = np.hstack([counts, np.zeros((J, L - counts.shape[1]), dtype=np.int64)])
    for j, a in enumerate(res.assignments):
      counts[j, a] += 1
    self.state = StreamingState(G=res.G,
                                P=res.P,
                                group_counts=counts,
                                softmax_G=Gb,
                                softmax_P=Pb,
                                steps=(0 if st is None else st.steps) + 1,
                                D=D,
                                K=K)
    self.last_result = res
    return self.global_weights()

  def global_weights(self) -> Tuple[np.ndarray, ...]:
    """Posterior-mean network ``(W1, b1, W2, b2)`` of the current state."""
    st = self._require_state()
    W1, b1, W2 = split_single_layer_atoms(st.G / st.P, st.D)
    return W1, b1, W2, st.softmax_G / st.softmax_P

  def local_init(self,
                 j: int,
                 n_neurons: int,
                 n_fresh: int = 1,
                 noise_std: float = 0.01,
                 seed: Optional[int] = None) -> Tuple[np.ndarray, ...]:
    """Initial weights of group ``j``'s next local network (supplement 4.2).

        ``n_neurons - n_fresh`` global neurons are drawn without replacement with
        probability proportional to the group's popularity ``m_ji`` (a small
        share of the pooled counts is added so that the draw is always possible),
        ``n_fresh`` neurons start at the base mean (``mu0 = 0``, bias
        ``hp.bias_prior_mean``), and Gaussian noise of std ``noise_std`` is added.

        Returns:
          ``(W1 (D, n), b1 (n,), W2 (n, K), b2 (K,))``.
        """
    st = self._require_state()
    J = st.group_counts.shape[0]
    if not 0 <= j < J:
      raise ValueError(f"j must be in [0, {J}), got {j}")
    if n_neurons < 1 or not 0 <= n_fresh <= n_neurons:
      raise ValueError(f"need n_neurons >= 1 and 0 <= n_fresh <= n_neurons, "
                       f"got n_neurons={n_neurons}, n_fresh={n_fresh}")
    if noise_std < 0:
      raise ValueError(f"noise_std must be >= 0, got {noise_std}")
    rng = np.random.default_rng(seed)
    weight = st.group_counts[j] + 1e-3 * st.group_counts.sum(axis=0) + 1e-12
    n_old = min(n_neurons - n_fresh, st.num_global)
    idx = rng.choice(st.num_global, size=n_old, replace=False, p=weight / weight.sum())
    mu0 = base_prior_mean(st.D, st.K, self.hp)
    atoms = np.vstack(
        [st.G[idx] / st.P[idx],
         np.broadcast_to(mu0, (n_neurons - n_old, mu0.shape[0]))])
    atoms = atoms + noise_std * rng.standard_normal(atoms.shape)
    W1, b1, W2 = split_single_layer_atoms(atoms, st.D)
    return W1, b1, W2, st.softmax_G / st.softmax_P

  def _require_state(self) -> StreamingState:
    if self.state is None:
      raise ValueError("StreamingPFNM has no state yet: call update() first")
    return self.state

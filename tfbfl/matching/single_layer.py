"""Probabilistic Federated Neural Matching (PFNM), single hidden layer.

Pure numpy/scipy implementation of Yurochkin et al., "Bayesian Nonparametric
Federated Learning of Neural Networks" (``shared/papers/pfnm.txt``): section 3.1,
Propositions 1-2, eq. (9), and the truncation rule of supplement section 4.2.

Model (paper eqs. 1-3).  Every hidden neuron ``l`` of client (batch) ``j`` is an
*atom* ``v_jl = [incoming weights (D), bias (1), outgoing weights (K)]`` in
``R^A`` (``A = D + 1 + K``).  Global atoms ``theta_i ~ N(mu0, diag(sigma0^2))`` are
drawn from a Beta process; each client picks a subset through a Bernoulli process
and observes ``v_jl ~ N(theta_i, diag(sigma_j^2))`` for the atom it picked.

Inference (MAP, paper section 3.1).  Global neuron ``i`` is stored as the
*natural-parameter sums*, per coordinate,

    G_i = mu0 / sigma0^2 + sum_{j,l} B^j_il v_jl / sigma_j^2
    P_i = 1 / sigma0^2   + sum_{j,l} B^j_il     / sigma_j^2

so that its MAP estimate (Proposition 1, eq. 5) is the posterior mean ``G_i / P_i``.
Given all other clients, client ``j``'s assignment ``B^j`` minimises the linear
assignment cost of eq. (9) (Proposition 2), solved with the Hungarian algorithm
(``scipy.optimize.linear_sum_assignment``).  The first pass visits clients by
decreasing number of neurons; then sweeps in random order (seeded) remove each
client's contribution and re-match it, until no assignment changes.

Everything here works on plain numpy arrays so that TFF clients and launchers can
hand in lists of per-client weight matrices.

#### Examples

```python
import numpy as np
from tfbfl.matching import MatchingHyperparams, pfnm_single_layer

rng = np.random.default_rng(0)
W1, b1 = rng.normal(size=(4, 3)), rng.normal(size=3)
W2, b2 = rng.normal(size=(3, 2)), rng.normal(size=2)
perm = rng.permutation(3)
clients = [(W1, b1, W2, b2), (W1[:, perm], b1[perm], W2[perm], b2)]
W1_g, b1_g, W2_g, b2_g = pfnm_single_layer(clients, None, MatchingHyperparams())
assert W1_g.shape == (4, 3)  # the three shared neurons are recovered
```

#### References

Yurochkin, Agarwal, Ghosh, Greenewald, Hoang, Khazaeni. Bayesian Nonparametric
Federated Learning of Neural Networks. ICML 2019 (``pfnm.txt``).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = [
    "MatchingHyperparams",
    "MatchResult",
    "match_layer",
    "pfnm_single_layer",
    "assignment_cost",
    "coordinate_blocks",
    "existing_neuron_gain",
    "new_neuron_gain",
    "popularity_log_odds",
    "group_popularity_log_odds",
    "new_neuron_log_prior",
    "num_new_columns",
    "single_layer_atoms",
    "split_single_layer_atoms",
    "class_frequency_weights",
    "softmax_bias_posterior",
]

TRUNCATION_RULES = ("paper", "reference")
SOFTMAX_PRECISIONS = ("uniform", "class_frequency")
MISSING_OUTGOING = ("zero", "ignore")
STREAMING_POPULARITY = ("pooled", "group")


@dataclasses.dataclass
class MatchingHyperparams:
  """Hyperparameters of PFNM matching.

    Defaults follow the paper (section 4 and supplement 4.3): ``sigma0^2 = 10``,
    ``sigma^2 = 1``, ``gamma0 = 1``, global layer truncated at 700 neurons with the
    supplement's rule, eq. (9) with its factor 2 on the new-neuron terms and factor
    1 on the popularity term, no popularity cap, and a plain ``sigma^2`` for every
    coordinate (softmax weights included).  ``MatchingHyperparams.reference_code()``
    returns the choices of the public reference code instead.

    Attributes:
      sigma0_sq: prior variance ``sigma0^2`` of every global-atom coordinate (> 0).
      sigma_sq: client noise variance ``sigma_j^2 = sigma^2`` (> 0).
      gamma0: Beta-process mass ``gamma0`` (> 0); larger values grow the global
        layer (new-neuron term ``log(gamma0 / J)`` of eq. 9).
      bias_prior_mean: prior mean of hidden and softmax biases.  The paper's
        supplement uses ``mu0 = 0``; the reference code uses 0.1.
      max_sweeps: random-order sweeps after the first pass (>= 0).
      max_global_neurons: truncation level ``T`` of the global layer (>= 1;
        paper: 700); see ``num_new_columns``.
      popularity_cap: if set, popularity counts ``m`` enter ``log(m / (J - m))``
        as ``min(m, cap)`` (the reference code caps at 10).  ``None``: no cap.
      log_factor: factor on the new-neuron terms ``log(gamma0/J) - log(i-L_-j)``
        (eq. 9: 2.0).
      popularity_log_factor: factor on ``log(m / (J - m))`` (eq. 9: 1.0).  With
        both factors 2.0 the cost is exactly twice the MAP objective (eqs. 6, 8).
      truncation: ``"paper"`` (supplement 4.2) or ``"reference"``; see
        ``num_new_columns``.
      softmax_precision: ``"uniform"`` (paper: every coordinate has precision
        ``1/sigma^2``) or ``"class_frequency"``: outgoing (softmax) weight ``k`` of
        client ``j`` has precision ``omega_jk / sigma^2`` with
        ``omega_jk = J n_jk / sum_j' n_j'k`` (so a client that never saw class ``k``
        carries no information about it, and balanced data gives back
        ``"uniform"``).  The reference code uses ``n_jk / sum_j' n_j'k``, i.e.
        ``J`` times less total precision on those coordinates.
      missing_outgoing: multilayer only.  Outgoing weights of client ``j`` towards
        global neurons of the layer above that client ``j`` does not have are
        observed zeros with precision ``1/sigma^2`` (``"zero"``, paper section
        3.2) or carry no information (``"ignore"``).
      streaming_popularity: streaming only (prior neurons from earlier steps).
        ``"pooled"``: popularity ``log(m/(N - m))`` over all ``N = s J``
        batches seen so far (exchangeable IBP; at ``s = 1`` this is eq. 9, so a
        single streaming step equals one-shot matching).  ``"group"``: the
        supplement's eq. (11) heuristic ``log((1 + m_ji)/(s - m_ji))`` with
        ``m_ji`` the past steps in which group ``j`` used neuron ``i`` (at
        ``s = 1`` there is no past and eq. 9 is used, as in ``"pooled"``).
      seed: seed of the random sweep order.
    """

  sigma0_sq: float = 10.0
  sigma_sq: float = 1.0
  gamma0: float = 1.0
  bias_prior_mean: float = 0.0
  max_sweeps: int = 10
  max_global_neurons: int = 700
  popularity_cap: Optional[int] = None
  log_factor: float = 2.0
  popularity_log_factor: float = 1.0
  truncation: str = "paper"
  softmax_precision: str = "uniform"
  missing_outgoing: str = "zero"
  streaming_popularity: str = "pooled"
  seed: int = 0

  def __post_init__(self):
    for name in ("sigma0_sq", "sigma_sq", "gamma0"):
      value = getattr(self, name)
      if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    if not np.isfinite(self.bias_prior_mean):
      raise ValueError(f"bias_prior_mean must be finite, got {self.bias_prior_mean!r}")
    if int(self.max_sweeps) != self.max_sweeps or self.max_sweeps < 0:
      raise ValueError(f"max_sweeps must be an integer >= 0, got {self.max_sweeps!r}")
    if int(self.max_global_neurons) != self.max_global_neurons or self.max_global_neurons < 1:
      raise ValueError(
          f"max_global_neurons must be an integer >= 1, got {self.max_global_neurons!r}")
    if self.popularity_cap is not None and (int(self.popularity_cap) != self.popularity_cap or
                                            self.popularity_cap < 1):
      raise ValueError(
          f"popularity_cap must be None or an integer >= 1, got {self.popularity_cap!r}")
    for name in ("log_factor", "popularity_log_factor"):
      value = getattr(self, name)
      if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    for name, allowed in (("truncation", TRUNCATION_RULES), ("softmax_precision",
                                                             SOFTMAX_PRECISIONS),
                          ("missing_outgoing", MISSING_OUTGOING), ("streaming_popularity",
                                                                   STREAMING_POPULARITY)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

  @classmethod
  def reference_code(cls, **overrides) -> "MatchingHyperparams":
    """The public reference code's choices (``sigma0^2 = sigma^2 = gamma0 = 1``,
        bias prior mean 0.1, popularity cap 10, reference truncation, class-frequency
        softmax precisions), with ``overrides`` applied."""
    values = dict(sigma0_sq=1.0,
                  sigma_sq=1.0,
                  gamma0=1.0,
                  bias_prior_mean=0.1,
                  popularity_cap=10,
                  truncation="reference",
                  softmax_precision="class_frequency")
    values.update(overrides)
    return cls(**values)


@dataclasses.dataclass
class MatchResult:
  """Outcome of ``match_layer``.

    Attributes:
      global_atoms: ``(L, A)`` posterior means ``G / P`` (Proposition 1, eq. 5).
      assignments: per client, ``(L_j,)`` int array; neuron ``l`` of client ``j``
        is matched to global neuron ``assignments[j][l]`` (``B^j_il = 1``).
      popularity: ``(L,)`` int, ``m_i``: number of clients using neuron ``i`` in
        this call plus the pooled ``prior_popularity`` (streaming).
      G: ``(L, A)`` natural-mean sums ``mu0/sigma0^2 + sum B v / sigma_j^2``.
      P: ``(L, A)`` precision sums ``1/sigma0^2 + sum B / sigma_j^2``; the
        posterior variance of ``theta_i`` is ``1 / P`` (eq. 10 of the supplement).
      n_sweeps: random-order sweeps run after the first pass.
      converged: ``True`` if the last sweep changed no assignment.

    Global neurons are unordered (the model is permutation invariant); in
    practice carried-over (streaming) neurons come first, then neurons in the
    order they were opened, a neuron freed during a sweep lending its index to
    the next one opened.
    """

  global_atoms: np.ndarray
  assignments: List[np.ndarray]
  popularity: np.ndarray
  G: np.ndarray
  P: np.ndarray
  n_sweeps: int
  converged: bool

  @property
  def num_global(self) -> int:
    """Number ``L`` of global neurons."""
    return int(self.global_atoms.shape[0])


# --------------------------------------------------------------------------------------
# Cost terms of eq. (9), vectorised.
# --------------------------------------------------------------------------------------


def existing_neuron_gain(G: np.ndarray,
                         P: np.ndarray,
                         g: np.ndarray,
                         p: np.ndarray,
                         blocks: Optional[Sequence[slice]] = None) -> np.ndarray:
  """Posterior gain of matching client atoms to existing global neurons.

    First case of eq. (9) without the popularity term: for client atom ``l`` with
    natural observation ``g_l = v_jl / sigma_j^2`` and precision ``p = 1/sigma_j^2``
    (per coordinate, same for all atoms of the client) and global neuron ``i``
    (with client ``j`` removed) holding ``(G_i, P_i)``,

        gain[l, i] = sum_a (G_ia + g_la)^2 / (P_ia + p_a) - sum_a G_ia^2 / P_ia.

    Computed without loops over neurons: with ``R = 1 / (P + p)``,
    ``sum_a (G + g)^2 R = (G^2 R) 1 + 2 g (G R)^T + g^2 R^T`` (two matrix products).

    ``blocks`` (optional): contiguous coordinate slices on which every ``P_i`` and
    ``p`` are constant (``pi_ib``, ``q_b``), e.g. the whole atom when all
    coordinates share ``sigma^2``.  Then, with ``r_ib = 1/(pi_ib + q_b)``,

        gain[l, i] = sum_b r_ib (|G_ib|^2 + 2 g_lb . G_ib + |g_lb|^2) - |G_ib|^2 / pi_ib,

    one matrix product per block and no ``(L, A)`` temporaries.

    Args:
      G, P: ``(L, A)`` natural sums of the global neurons (``P > 0``).
      g: ``(L_j, A)`` natural observations ``v_jl * p``.
      p: ``(A,)`` client precisions (``>= 0``).
      blocks: ``None`` or slices covering ``0..A-1`` (see above).

    Returns:
      ``(L_j, L)`` gains.
    """
  if G.shape[0] == 0:
    return np.zeros((g.shape[0], 0))
  if blocks is None:
    R = 1.0 / (P + p)
    GR = G * R
    col = np.einsum("ia,ia->i", G, GR) - np.einsum("ia,ia->i", G, G / P)
    return 2.0 * (g @ GR.T) + (g * g) @ R.T + col[None, :]
  gain = np.zeros((g.shape[0], G.shape[0]))
  for sl in blocks:
    pi, q = P[:, sl.start], p[sl.start]
    Gb, gb = G[:, sl], g[:, sl]
    GG = np.einsum("ia,ia->i", Gb, Gb)
    gg = np.einsum("la,la->l", gb, gb)
    r = 1.0 / (pi + q)
    inner = gb @ Gb.T
    inner *= 2.0
    inner += gg[:, None]
    inner += GG[None, :]
    inner *= r[None, :]
    inner -= (GG / pi)[None, :]
    gain += inner
  return gain


def coordinate_blocks(precisions: np.ndarray, max_blocks: int = 32):
  """Group atom coordinates whose precision columns are identical.

    ``precisions`` stacks, as rows, every precision vector that will ever be
    added into the global sums (base prior ``P0``, each client's ``p_j``, carried
    over ``P`` rows).  Coordinates with identical columns keep identical ``P``
    columns throughout matching, which ``existing_neuron_gain`` exploits.

    Returns:
      ``(perm, blocks)``: a coordinate permutation making each group contiguous and
      the list of slices in permuted coordinates, or ``(None, None)`` when there
      are more than ``max_blocks`` groups (use the general formula).
    """
  _, inv = np.unique(precisions, axis=1, return_inverse=True)
  inv = np.asarray(inv).reshape(-1)
  n_blocks = int(inv.max()) + 1
  if n_blocks > max_blocks:
    return None, None
  perm = np.argsort(inv, kind="stable")
  bounds = np.concatenate([[0], np.cumsum(np.bincount(inv, minlength=n_blocks))])
  return perm, [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def new_neuron_gain(G0: np.ndarray, P0: np.ndarray, g: np.ndarray, p: np.ndarray) -> np.ndarray:
  """Prior gain of opening a new global neuron for each client atom.

    Second case of eq. (9) without the log terms:
    ``sum_a (G0_a + g_la)^2 / (P0_a + p_a) - sum_a G0_a^2 / P0_a`` with the base
    measure ``G0 = mu0 / sigma0^2``, ``P0 = 1 / sigma0^2``.

    Returns:
      ``(L_j,)`` gains.
    """
  return ((G0 + g)**2 / (P0 + p)).sum(axis=1) - float((G0**2 / P0).sum())


def popularity_log_odds(counts: np.ndarray,
                        n_batches: int,
                        cap: Optional[int] = None) -> np.ndarray:
  """``log(m_i / (N - m_i))``: the Indian-buffet predictive odds (eq. 8) that the
    ``N``-th batch uses global neuron ``i`` already used by ``m_i`` other batches.

    ``cap``: counts enter as ``min(m_i, cap)`` (reference-code variant).
    Requires ``0 < m_i < N`` (after capping).
    """
  m = np.asarray(counts, dtype=np.float64)
  if cap is not None:
    m = np.minimum(m, cap)
  return np.log(m) - np.log(n_batches - m)


def group_popularity_log_odds(group_counts: np.ndarray, step: int) -> np.ndarray:
  """Streaming heuristic of supplement eq. (11): ``log((1 + m_ji) / (s - m_ji))``
    where ``m_ji`` counts the earlier steps ``1..s-1`` in which group ``j`` used
    neuron ``i`` (Laplace-smoothed odds; 0 at ``s = 1``)."""
  m = np.asarray(group_counts, dtype=np.float64)
  return np.log1p(m) - np.log(step - m)


def new_neuron_log_prior(n_new: int,
                         gamma0: float,
                         n_batches: int,
                         log_factor: float = 2.0) -> np.ndarray:
  """New-neuron prior terms of eq. (9) for candidate ``i = L_-j + k``,
    ``k = 1..n_new``: ``log_factor * (log(gamma0 / N) - log k)``.

    ``N = J`` for one-shot matching and ``s J`` at streaming step ``s`` (eq. 11).
    """
  k = np.arange(1, n_new + 1, dtype=np.float64)
  return log_factor * (np.log(gamma0 / n_batches) - np.log(k))


def num_new_columns(L_minus_j: int, L_j: int, max_global: int, rule: str = "paper") -> int:
  """Number of new-neuron candidates (columns) in the cost matrix of eq. (9).

    * ``"paper"`` (supplement 4.2): the largest candidate index ``i`` is truncated to
      ``min(L_-j + L_j, max(L_j, T) + 1)``, so there are
      ``min(L_j, max(L_j, T) + 1 - L_-j)`` candidates and the layer never holds more
      than ``max(T, L_j) + 1`` neurons.
    * ``"reference"`` (public code): ``min(L_j, max(T - L_-j, 1))`` candidates, so
      the layer can always grow by one neuron per client update.

    In both rules at least ``L_j - L_-j`` candidates are kept so that every client
    neuron can be assigned (the Hungarian problem stays feasible).
    """
  if rule == "paper":
    n = min(L_j, max(L_j, max_global) + 1 - L_minus_j)
  elif rule == "reference":
    n = min(L_j, max(max_global - L_minus_j, 1))
  else:
    raise ValueError(f"rule must be one of {TRUNCATION_RULES}, got {rule!r}")
  return int(max(n, L_j - L_minus_j, 0))


def assignment_cost(G: np.ndarray,
                    P: np.ndarray,
                    log_odds: np.ndarray,
                    g: np.ndarray,
                    p: np.ndarray,
                    G0: np.ndarray,
                    P0: np.ndarray,
                    new_log_prior: np.ndarray,
                    blocks: Optional[Sequence[slice]] = None,
                    rows: Optional[np.ndarray] = None) -> np.ndarray:
  """Cost matrix ``C^j`` of eq. (9) (Proposition 2), to be *minimised*.

    ``C[l, i] = -(existing_neuron_gain[l, i] + log_odds[i])`` for the ``L_-j``
    existing neurons and ``C[l, L_-j + k - 1] = -(new_neuron_gain[l] +
    new_log_prior[k - 1])`` for the new-neuron candidates.

    Args:
      G, P: ``(L_-j, A)`` global natural sums with client ``j`` removed.
      log_odds: ``(L_-j,)`` popularity terms (already scaled by their factor).
      g, p: client natural observations ``(L_j, A)`` and precisions ``(A,)``.
      G0, P0: ``(A,)`` base-measure natural parameters.
      new_log_prior: ``(n_new,)`` new-neuron log terms (``new_neuron_log_prior``).
      blocks: optional constant-precision coordinate slices (``existing_neuron_gain``).
      rows: optional indices of the rows of ``G``/``P`` that are the ``L_-j``
        existing neurons (``log_odds`` is then given for these rows only).

    Returns:
      ``(L_j, L_-j + n_new)`` costs.
    """
  existing = existing_neuron_gain(G, P, g, p, blocks)
  if rows is not None:
    existing = existing[:, rows]
  existing += log_odds[None, :]
  new = new_neuron_gain(G0, P0, g, p)[:, None] + new_log_prior[None, :]
  return -np.hstack([existing, new])


# --------------------------------------------------------------------------------------
# Input validation helpers.
# --------------------------------------------------------------------------------------


def _as_matrix_list(atoms_per_client, name="atoms_per_client") -> List[np.ndarray]:
  if isinstance(atoms_per_client, np.ndarray) or not isinstance(atoms_per_client, Sequence):
    raise ValueError(f"{name} must be a list of (L_j, A) arrays, one per client")
  if len(atoms_per_client) < 1:
    raise ValueError(f"{name} must hold at least one client (J >= 1), got J = 0")
  out = []
  for j, a in enumerate(atoms_per_client):
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
      raise ValueError(f"{name}[{j}] must be a non-empty (L_j, A) matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
      raise ValueError(f"{name}[{j}] contains non-finite values")
    out.append(a)
  A = out[0].shape[1]
  for j, a in enumerate(out):
    if a.shape[1] != A:
      raise ValueError(f"{name}: client {j} has atom dimension {a.shape[1]}, client 0 has {A}")
  return out


def _precision_vector(var, size: int, name: str, allow_inf: bool) -> np.ndarray:
  """``1 / var`` broadcast to ``(size,)``; ``var`` must be > 0 (``inf`` allowed
    for observation variances: no information)."""
  v = np.asarray(var, dtype=np.float64)
  try:
    v = np.broadcast_to(v, (size,))
  except ValueError:
    raise ValueError(f"{name} must be a scalar or have shape ({size},), got {v.shape}") from None
  if np.any(np.isnan(v)) or np.any(v <= 0) or (not allow_inf and np.any(np.isinf(v))):
    raise ValueError(f"{name} must hold positive{'' if allow_inf else ' finite'} variances")
  return 1.0 / v


# --------------------------------------------------------------------------------------
# The matching engine.
# --------------------------------------------------------------------------------------


class _GlobalLayer:
  """Mutable global layer during matching.

    Global neurons live in *slots* of preallocated buffers (capacity doubles when
    needed) so that removing and re-adding a client never copies the ``(L, A)``
    natural sums: a neuron left without support frees its slot, and new neurons
    reuse free slots before new ones are opened.  Carried-over (streaming) neurons
    occupy slots ``0..L0-1`` and never die.  ``finalize`` compacts the live slots
    in slot order.
    """

  def __init__(self, G, P, prior_pop, group_prior, J):
    L0, A = G.shape
    cap = max(16, 2 * L0)
    self.G, self.P = np.zeros((cap, A)), np.ones((cap, A))
    self.G[:L0], self.P[:L0] = G, P
    self.counts = np.zeros(cap, dtype=np.int64)  # clients of this call
    self.has_prior = np.zeros(cap, dtype=bool)  # carried-over neurons
    self.has_prior[:L0] = True
    self.prior_pop = np.zeros(cap)  # pooled past counts
    self.prior_pop[:L0] = prior_pop
    self.group_prior = np.zeros((J, cap))  # per-group past counts
    self.group_prior[:, :L0] = group_prior
    self.n_slots = L0
    self.assignments: List[Optional[np.ndarray]] = [None] * J

  def live_slots(self) -> np.ndarray:
    """Slots of the live global neurons, increasing."""
    n = self.n_slots
    return np.flatnonzero((self.counts[:n] > 0) | self.has_prior[:n])

  def remove(self, j: int, g: np.ndarray, p: np.ndarray, G0: np.ndarray, P0: np.ndarray) -> None:
    """Subtract client ``j``'s natural observations (inverse of ``add``); slots
        left without support are reset to the base measure ``(G0, P0)``."""
    a = self.assignments[j]
    self.assignments[j] = None
    self.G[a] -= g
    self.P[a] -= p
    self.counts[a] -= 1
    dead = a[(self.counts[a] == 0) & ~self.has_prior[a]]
    self.G[dead] = G0
    self.P[dead] = P0

  def _grow(self, n_needed: int) -> None:
    cap = self.G.shape[0]
    if n_needed <= cap:
      return
    new_cap = max(n_needed, 2 * cap)
    pad = new_cap - cap
    self.G = np.vstack([self.G, np.zeros((pad, self.G.shape[1]))])
    self.P = np.vstack([self.P, np.ones((pad, self.P.shape[1]))])
    self.counts = np.concatenate([self.counts, np.zeros(pad, np.int64)])
    self.has_prior = np.concatenate([self.has_prior, np.zeros(pad, bool)])
    self.prior_pop = np.concatenate([self.prior_pop, np.zeros(pad)])
    self.group_prior = np.hstack([self.group_prior, np.zeros((self.group_prior.shape[0], pad))])

  def add(self, j: int, existing_slots: np.ndarray, is_new: np.ndarray, g: np.ndarray,
          p: np.ndarray, G0: np.ndarray, P0: np.ndarray) -> np.ndarray:
    """Add client ``j``: atoms with ``~is_new`` join ``existing_slots``; the
        others open new neurons (free slots first).  Returns the slot assignment."""
    assign = np.empty(g.shape[0], dtype=np.int64)
    old = ~is_new
    slots = existing_slots[old]
    assign[old] = slots
    self.G[slots] += g[old]
    self.P[slots] += p
    self.counts[slots] += 1
    n_new = int(is_new.sum())
    if n_new:
      n = self.n_slots
      free = np.flatnonzero((self.counts[:n] == 0) & ~self.has_prior[:n])[:n_new]
      extra = n_new - free.shape[0]
      self._grow(n + extra)
      new_slots = np.concatenate([free, np.arange(n, n + extra)])
      self.n_slots = n + extra
      assign[is_new] = new_slots
      self.G[new_slots] = G0 + g[is_new]
      self.P[new_slots] = P0 + p
      self.counts[new_slots] = 1
    self.assignments[j] = assign
    return assign

  def finalize(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, List[np.ndarray]]:
    """Compact live slots: ``(G, P, popularity, assignments)``."""
    live = self.live_slots()
    index = np.full(self.n_slots, -1, dtype=np.int64)
    index[live] = np.arange(live.shape[0])
    popularity = (self.prior_pop[live] + self.counts[live]).astype(np.int64)
    return (self.G[live].copy(), self.P[live].copy(), popularity,
            [index[a] for a in self.assignments])


def _match_one(layer: _GlobalLayer,
               j: int,
               g: np.ndarray,
               p: np.ndarray,
               G0,
               P0,
               hp: MatchingHyperparams,
               J: int,
               step: int,
               blocks: Optional[Sequence[slice]] = None) -> Tuple[np.ndarray, np.ndarray]:
  """Solve eq. (9) for client ``j`` against ``layer`` (client ``j`` removed).

    Returns ``(slots, is_new)``: the live slot each atom joins (ignored where
    ``is_new``) and whether it opens a new global neuron."""
  live = layer.live_slots()
  L, L_j = live.shape[0], g.shape[0]
  n_batches = step * J
  if hp.streaming_popularity == "group" and step > 1:
    odds = group_popularity_log_odds(layer.group_prior[j, live], step)
  else:
    odds = popularity_log_odds(layer.prior_pop[live] + layer.counts[live], n_batches,
                               hp.popularity_cap)
  n_new = num_new_columns(L, L_j, hp.max_global_neurons, hp.truncation)
  # Gains against every slot (views, no copy; freed slots hold the base
  # measure) and keep the live columns.
  n = layer.n_slots
  C = assignment_cost(layer.G[:n],
                      layer.P[:n],
                      hp.popularity_log_factor * odds,
                      g,
                      p,
                      G0,
                      P0,
                      new_neuron_log_prior(n_new, hp.gamma0, n_batches, hp.log_factor),
                      blocks,
                      rows=None if L == n else live)
  rows, cols = linear_sum_assignment(C)
  col = np.empty(L_j, dtype=np.int64)
  col[rows] = cols
  # New-neuron candidates differ only by a column term, so which candidate an
  # atom takes is immaterial: new neurons are opened in client order.
  is_new = col >= L
  slots = np.zeros(L_j, dtype=np.int64)
  slots[~is_new] = live[col[~is_new]]
  return slots, is_new


def _resolve_priors(hp: MatchingHyperparams, J: int, A: int, prior_mean, prior_var,
                    prior_popularity, base_mean, base_var, prior_steps: int):
  """Validate the prior arguments of ``match_layer``.

    Returns ``(G0, P0, G, P, prior_pop, group_prior)``: base-measure natural
    parameters ``G0 = mu0 / sigma0^2``, ``P0 = 1 / sigma0^2`` (``(A,)``), the
    carried-over neurons' natural parameters ``G = mu / sigma^2``,
    ``P = 1 / sigma^2`` (``(L0, A)``, supplement eq. 10), their pooled counts
    ``(L0,)`` and per-group counts ``(J, L0)``.
    """
  pm = None if prior_mean is None else np.asarray(prior_mean, dtype=np.float64)
  if pm is not None and not np.all(np.isfinite(pm)):
    raise ValueError("prior_mean must be finite")
  if pm is None or pm.ndim == 1:
    if base_mean is not None or base_var is not None:
      raise ValueError("base_mean/base_var are only used with a (L0, A) prior_mean; "
                       "pass the base measure as prior_mean/prior_var")
    base_mean, base_var = pm, prior_var
    pm = None
  elif pm.ndim != 2 or pm.shape[1] != A:
    raise ValueError(f"prior_mean must have shape ({A},) or (L0, {A}), got {pm.shape}")
  mu0 = np.zeros(A) if base_mean is None else np.asarray(base_mean, dtype=np.float64)
  if mu0.shape != (A,) or not np.all(np.isfinite(mu0)):
    raise ValueError(f"{'prior_mean' if pm is None else 'base_mean'} must be a finite "
                     f"({A},) vector (or (L0, {A}) prior_mean), got shape {mu0.shape}")
  P0 = _precision_vector(hp.sigma0_sq if base_var is None else base_var,
                         A,
                         "prior_var" if pm is None else "base_var",
                         allow_inf=False)
  G0 = mu0 * P0

  if pm is None:
    if prior_popularity is not None:
      raise ValueError("prior_popularity needs a (L0, A) prior_mean")
    L0 = 0
    G, P = np.zeros((0, A)), np.zeros((0, A))
    prior_pop, group_prior = np.zeros(0), np.zeros((J, 0))
  else:
    if prior_steps < 1:
      raise ValueError("prior_steps must be >= 1 with a (L0, A) prior_mean "
                       "(carried-over neurons come from earlier steps)")
    L0 = pm.shape[0]
    pv = np.asarray(hp.sigma0_sq if prior_var is None else prior_var, dtype=np.float64)
    try:
      pv = np.broadcast_to(pv, (L0, A))
    except ValueError:
      raise ValueError(f"prior_var must broadcast to {(L0, A)}, got {pv.shape}") from None
    if np.any(np.isnan(pv)) or np.any(pv <= 0) or np.any(np.isinf(pv)):
      raise ValueError("prior_var must hold positive finite variances")
    P = 1.0 / pv
    G = pm * P
    if prior_popularity is None:
      raise ValueError("prior_popularity is required with a (L0, A) prior_mean")
    pop = np.asarray(prior_popularity, dtype=np.float64)
    if pop.shape == (J, L0):
      group_prior = pop
      prior_pop = pop.sum(axis=0)
    elif pop.shape == (L0,) and hp.streaming_popularity == "pooled":
      group_prior = np.zeros((J, L0))
      prior_pop = pop
    else:
      raise ValueError(f"prior_popularity must have shape ({J}, {L0})" +
                       (f" or ({L0},)" if hp.streaming_popularity == "pooled" else "") +
                       f", got {pop.shape}")
    if np.any(pop < 0) or np.any(pop != np.round(pop)):
      raise ValueError("prior_popularity must hold non-negative integer counts")
    if np.any(group_prior > prior_steps):
      raise ValueError("prior_popularity: a group count exceeds prior_steps")
    if np.any(prior_pop > prior_steps * J):
      raise ValueError("prior_popularity: a pooled count exceeds prior_steps * J")
    if hp.streaming_popularity == "pooled" and np.any(prior_pop < 1):
      raise ValueError("prior_popularity: every carried-over neuron needs a count >= 1 "
                       "with streaming_popularity='pooled'")

  return G0, P0, G, P, prior_pop, group_prior


def match_layer(atoms_per_client: Sequence[np.ndarray],
                hp: Optional[MatchingHyperparams] = None,
                prior_mean: Optional[np.ndarray] = None,
                prior_var=None,
                prior_popularity: Optional[np.ndarray] = None,
                *,
                obs_var: Optional[Sequence] = None,
                base_mean: Optional[np.ndarray] = None,
                base_var=None,
                prior_steps: int = 0) -> MatchResult:
  """Match the neurons (atoms) of ``J`` clients into a global layer.

    Alternates the Hungarian solution of eq. (9) over clients: a first pass in
    order of decreasing ``L_j`` (ties: client order), then up to ``hp.max_sweeps``
    sweeps in random order (``hp.seed``) that remove a client's contribution and
    re-match it, stopping after a sweep in which no assignment changed.  Global
    atoms are the posterior means of Proposition 1 (eq. 5).

    Args:
      atoms_per_client: list of ``(L_j, A)`` arrays, one per client (``J >= 1``).
      hp: hyperparameters (default ``MatchingHyperparams()``).
      prior_mean: ``None`` (base mean ``0``), ``(A,)`` base-measure mean ``mu0``,
        or ``(L0, A)`` per-neuron prior means of ``L0`` global neurons carried over
        from earlier streaming steps (supplement eq. 10); then ``prior_popularity``
        is required and new neurons use ``base_mean`` / ``base_var``.
      prior_var: prior variances matching ``prior_mean``: scalar, ``(A,)`` or
        ``(L0, A)``; default ``hp.sigma0_sq``.
      prior_popularity: streaming only: ``(J, L0)`` counts ``m_ji`` of earlier
        steps in which group ``j`` used neuron ``i`` (or ``(L0,)`` pooled counts
        with ``hp.streaming_popularity == "pooled"``).
      obs_var: optional list of ``J`` per-coordinate client variances
        ``sigma_j^2`` (scalar or ``(A,)``, ``> 0``; ``inf`` = no information);
        default ``hp.sigma_sq``.
      base_mean, base_var: base measure of new neurons when ``prior_mean`` is
        ``(L0, A)`` (defaults ``0`` and ``hp.sigma0_sq``).
      prior_steps: number ``s - 1`` of earlier streaming steps.

    Returns:
      ``MatchResult``.  Global neurons carried in through ``prior_mean`` keep
      indices ``0..L0-1``.

    Raises:
      ValueError: naming the offending argument (empty client list, atom
        dimension mismatch, non-positive variances, bad prior shapes).
    """
  hp = MatchingHyperparams() if hp is None else hp
  atoms = _as_matrix_list(atoms_per_client)
  J, A = len(atoms), atoms[0].shape[1]

  # Observation precisions p_j (A,) and natural observations g_j = v_j * p_j.
  if obs_var is None:
    obs_var = [hp.sigma_sq] * J
  if not hasattr(obs_var, "__len__") or len(obs_var) != J:
    raise ValueError(f"obs_var must be a list with one entry per client ({J})")
  p_list = [_precision_vector(v, A, f"obs_var[{j}]", allow_inf=True) for j, v in enumerate(obs_var)]
  g_list = [a * p for a, p in zip(atoms, p_list)]

  if int(prior_steps) != prior_steps or prior_steps < 0:
    raise ValueError(f"prior_steps must be an integer >= 0, got {prior_steps!r}")
  step = int(prior_steps) + 1

  G0, P0, G, P, prior_pop, group_prior = _resolve_priors(hp, J, A, prior_mean, prior_var,
                                                         prior_popularity, base_mean, base_var,
                                                         prior_steps)

  # Coordinates sharing every precision form blocks (one block when all use
  # sigma^2); permute them to be contiguous for the fast cost path.
  perm, blocks = coordinate_blocks(np.vstack([P0[None, :], *[q[None, :] for q in p_list], P]))
  if perm is not None and not np.array_equal(perm, np.arange(A)):
    g_list = [g[:, perm] for g in g_list]
    p_list = [q[perm] for q in p_list]
    G0, P0, G, P = G0[perm], P0[perm], G[:, perm], P[:, perm]
    unperm = np.argsort(perm)
  else:
    unperm = None

  layer = _GlobalLayer(G, P, prior_pop, group_prior, J)

  # First pass: clients by decreasing size.
  order = sorted(range(J), key=lambda j: -atoms[j].shape[0])
  for j in order:
    slots, is_new = _match_one(layer, j, g_list[j], p_list[j], G0, P0, hp, J, step, blocks)
    layer.add(j, slots, is_new, g_list[j], p_list[j], G0, P0)

  # Sweeps: remove client j, re-match it.
  rng = np.random.default_rng(hp.seed)
  n_sweeps, converged = 0, False
  for _ in range(hp.max_sweeps):
    n_sweeps += 1
    changed = False
    for j in rng.permutation(J):
      old = layer.assignments[j]
      layer.remove(j, g_list[j], p_list[j], G0, P0)
      survived = (layer.counts[old] > 0) | layer.has_prior[old]
      slots, is_new = _match_one(layer, j, g_list[j], p_list[j], G0, P0, hp, J, step, blocks)
      # Unchanged: same surviving neuron, or again alone on a fresh neuron.
      same = np.where(survived, ~is_new & (slots == old), is_new)
      changed |= not bool(same.all())
      layer.add(j, slots, is_new, g_list[j], p_list[j], G0, P0)
    if not changed:
      converged = True
      break

  G, P, popularity, assignments = layer.finalize()
  if unperm is not None:
    G, P = G[:, unperm], P[:, unperm]
  return MatchResult(global_atoms=G / P,
                     assignments=assignments,
                     popularity=popularity,
                     G=G,
                     P=P,
                     n_sweeps=n_sweeps,
                     converged=converged)


# --------------------------------------------------------------------------------------
# Single hidden layer networks.
# --------------------------------------------------------------------------------------


def single_layer_atoms(W1: np.ndarray, b1: np.ndarray, W2: np.ndarray) -> np.ndarray:
  """Atoms ``v_jl = [W1[:, l], b1[l], W2[l, :]]`` (paper section 3.1), shape
    ``(L_j, D + 1 + K)``."""
  return np.hstack([
      np.asarray(W1, np.float64).T,
      np.asarray(b1, np.float64)[:, None],
      np.asarray(W2, np.float64)
  ])


def split_single_layer_atoms(atoms: np.ndarray,
                             D: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Inverse of ``single_layer_atoms``: ``(W1 (D, L), b1 (L,), W2 (L, K))``."""
  return atoms[:, :D].T.copy(), atoms[:, D].copy(), atoms[:, D + 1:].copy()


def _check_single_layer_weights(weights) -> Tuple[int, int, List[Tuple[np.ndarray, ...]]]:
  if isinstance(weights, np.ndarray) or not isinstance(weights, Sequence) or len(weights) < 1:
    raise ValueError("weights must be a non-empty list (J >= 1) of (W1, b1, W2, b2) tuples")
  out = []
  for j, w in enumerate(weights):
    if len(w) != 4:
      raise ValueError(f"weights[{j}] must be a (W1, b1, W2, b2) tuple, got {len(w)} items")
    W1, b1, W2, b2 = (np.asarray(x, dtype=np.float64) for x in w)
    if W1.ndim != 2 or W1.shape[1] < 1:
      raise ValueError(f"weights[{j}]: W1 must be (D, L_j) with L_j >= 1, got {W1.shape}")
    L_j = W1.shape[1]
    if b1.shape != (L_j,):
      raise ValueError(f"weights[{j}]: b1 must have shape ({L_j},), got {b1.shape}")
    if W2.ndim != 2 or W2.shape[0] != L_j:
      raise ValueError(f"weights[{j}]: W2 must have shape ({L_j}, K), got {W2.shape}")
    if b2.shape != (W2.shape[1],):
      raise ValueError(f"weights[{j}]: b2 must have shape ({W2.shape[1]},), got {b2.shape}")
    out.append((W1, b1, W2, b2))
  D, K = out[0][0].shape[0], out[0][2].shape[1]
  for j, (W1, _, W2, _) in enumerate(out):
    if W1.shape[0] != D:
      raise ValueError(f"weights: client {j} has input dimension {W1.shape[0]}, client 0 has {D}")
    if W2.shape[1] != K:
      raise ValueError(f"weights: client {j} has {W2.shape[1]} outputs, client 0 has {K}")
  return D, K, out


def class_frequency_weights(class_counts, J: int, K: int) -> np.ndarray:
  """``omega_jk = J n_jk / sum_j' n_j'k`` (``(J, K)``; 1 where class ``k`` has no
    data anywhere, and all ones if ``class_counts`` is ``None``).

    Each class's weights sum to ``J``, so balanced counts give all ones."""
  if class_counts is None:
    return np.ones((J, K))
  if len(class_counts) != J:
    raise ValueError(f"class_counts must hold one (K,) array per client ({J}), "
                     f"got {len(class_counts)}")
  n = np.asarray([np.asarray(c, dtype=np.float64) for c in class_counts])
  if n.shape != (J, K):
    raise ValueError(f"class_counts must be {J} arrays of shape ({K},), got {n.shape}")
  if np.any(n < 0) or not np.all(np.isfinite(n)):
    raise ValueError("class_counts must be finite and non-negative")
  total = n.sum(axis=0)
  with np.errstate(invalid="ignore", divide="ignore"):
    omega = np.where(total > 0, J * n / total, 1.0)
  return omega


def softmax_bias_posterior(b2_list: Sequence[np.ndarray], omega: np.ndarray,
                           hp: MatchingHyperparams) -> Tuple[np.ndarray, np.ndarray]:
  """Softmax biases (not matched; they are shared by all clients) as a Gaussian
    posterior, Proposition 1 style:

        G_k = mu_b / sigma0^2 + sum_j omega_jk b_jk / sigma^2,
        P_k = 1 / sigma0^2    + sum_j omega_jk / sigma^2,   b_k = G_k / P_k,

    with ``mu_b = hp.bias_prior_mean`` and ``omega`` from
    ``class_frequency_weights`` (class-frequency weighted average; uniform when
    no counts are given).  Returns the natural sums ``(G, P)``, each ``(K,)``.
    """
  b = np.asarray(b2_list, dtype=np.float64)
  G = hp.bias_prior_mean / hp.sigma0_sq + (omega * b).sum(axis=0) / hp.sigma_sq
  P = 1.0 / hp.sigma0_sq + omega.sum(axis=0) / hp.sigma_sq
  return G, P


def single_layer_obs_var(D: int, K: int, omega_j: np.ndarray,
                         hp: MatchingHyperparams) -> np.ndarray:
  """Per-coordinate variances ``sigma_j^2`` of client ``j``'s atoms
    ``[W1 (D), b1 (1), W2 (K)]``: ``sigma^2`` everywhere, except with
    ``hp.softmax_precision == "class_frequency"`` the outgoing coordinate ``k`` gets
    ``sigma^2 / omega_jk`` (``inf`` when ``omega_jk = 0``)."""
  var = np.full(D + 1 + K, hp.sigma_sq)
  if hp.softmax_precision == "class_frequency":
    with np.errstate(divide="ignore"):
      var[D + 1:] = hp.sigma_sq / omega_j
  return var


def base_prior_mean(D: int, K: int, hp: MatchingHyperparams) -> np.ndarray:
  """Base-measure mean ``mu0``: 0 for weights, ``hp.bias_prior_mean`` for the bias."""
  mu0 = np.zeros(D + 1 + K)
  mu0[D] = hp.bias_prior_mean
  return mu0


def pfnm_single_layer(weights,
                      class_counts=None,
                      hp: Optional[MatchingHyperparams] = None,
                      *,
                      return_matching: bool = False):
  """One-shot PFNM of ``J`` one-hidden-layer MLPs (paper Algorithm 1, section 3.1).

    Client ``j`` computes ``softmax(act(x W1 + b1) W2 + b2)``.  Hidden neurons are
    matched with ``match_layer`` on atoms ``[W1[:, l], b1[l], W2[l, :]]`` (base
    mean 0 except ``hp.bias_prior_mean`` on the bias); the global hidden layer is
    the posterior mean of Proposition 1.  The softmax bias is the posterior of
    ``softmax_bias_posterior`` (class-frequency weighted if ``class_counts``).

    Args:
      weights: list over clients of ``(W1 (D, L_j), b1 (L_j,), W2 (L_j, K), b2 (K,))``.
      class_counts: ``None`` or list over clients of ``(K,)`` per-class example
        counts (used for the softmax bias and, with
        ``hp.softmax_precision == "class_frequency"``, the softmax weights).
      hp: ``MatchingHyperparams`` (default paper values).
      return_matching: also return the ``MatchResult``.

    Returns:
      ``(W1_g (D, L), b1_g (L,), W2_g (L, K), b2_g (K,))`` and, if requested, the
      ``MatchResult``.
    """
  hp = MatchingHyperparams() if hp is None else hp
  D, K, ws = _check_single_layer_weights(weights)
  J = len(ws)
  omega = class_frequency_weights(class_counts, J, K)
  atoms = [single_layer_atoms(W1, b1, W2) for W1, b1, W2, _ in ws]
  obs_var = [single_layer_obs_var(D, K, omega[j], hp) for j in range(J)]
  result = match_layer(atoms, hp, prior_mean=base_prior_mean(D, K, hp), obs_var=obs_var)
  W1_g, b1_g, W2_g = split_single_layer_atoms(result.global_atoms, D)
  Gb, Pb = softmax_bias_posterior([w[3] for w in ws], omega, hp)
  out = (W1_g, b1_g, W2_g, Gb / Pb)
  return (out, result) if return_matching else out

"""Tests of single-layer PFNM matching and the DP-means baseline (tfbfl.matching)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tfbfl.matching.single_layer as pfnm_module
from matching_helpers import permuted_copies, random_net
from tfbfl.matching import (MatchingHyperparams, assignment_cost, coordinate_blocks, dp_means,
                            dpmeans_single_layer, existing_neuron_gain, match_layer,
                            new_neuron_gain, new_neuron_log_prior, num_new_columns,
                            pfnm_single_layer, popularity_log_odds)


def shrink(w, mu, J, hp):
  """Prop. 1 with J identical observations w: (mu/s0^2 + J w/s^2) / (1/s0^2 + J/s^2)."""
  return (mu / hp.sigma0_sq + J * w / hp.sigma_sq) / (1 / hp.sigma0_sq + J / hp.sigma_sq)


def forward(net, x):
  W1, b1, W2, b2 = net
  return np.maximum(x @ W1 + b1, 0.0) @ W2 + b2


# ---------------------------------------------------------------------------------------
# Permuted copies of one network.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("J", [1, 3, 6])
@pytest.mark.parametrize("hp", [
    MatchingHyperparams(bias_prior_mean=0.1),
    MatchingHyperparams.reference_code(sigma0_sq=2.0, sigma_sq=0.5)
])
def test_permuted_copies_recover_shrunken_network(J, hp):
  rng = np.random.default_rng(J)
  net = random_net(rng, D=7, L=6, K=3)
  clients, perms = permuted_copies(rng, net, J)
  (W1g, b1g, W2g, b2g), res = pfnm_single_layer(clients, None, hp, return_matching=True)

  L = net[0].shape[1]
  assert W1g.shape == (7, L) and res.num_global == L
  np.testing.assert_array_equal(res.popularity, np.full(L, J))
  # The largest (first, tie -> client 0) client numbers the global neurons, so the
  # global index of original neuron o is sigma[o] = argsort(perm_0)[o], and
  # client j's neuron l (original perm_j[l]) must go to sigma[perm_j[l]].
  sigma = np.argsort(perms[0])
  for j in range(J):
    np.testing.assert_array_equal(res.assignments[j], sigma[perms[j]])
  # Global network == Prop. 1 shrinkage of the original, neurons reordered by sigma.
  W1, b1, W2, b2 = net
  np.testing.assert_allclose(W1g[:, sigma], shrink(W1, 0.0, J, hp), atol=1e-10)
  np.testing.assert_allclose(b1g[sigma], shrink(b1, hp.bias_prior_mean, J, hp), atol=1e-10)
  np.testing.assert_allclose(W2g[sigma], shrink(W2, 0.0, J, hp), atol=1e-10)
  np.testing.assert_allclose(b2g, shrink(b2, hp.bias_prior_mean, J, hp), atol=1e-10)
  shrunk = (shrink(W1, 0.0, J, hp), shrink(b1, hp.bias_prior_mean, J,
                                           hp), shrink(W2, 0.0, J,
                                                       hp), shrink(b2, hp.bias_prior_mean, J, hp))
  x = rng.normal(size=(20, 7))
  np.testing.assert_allclose(forward((W1g, b1g, W2g, b2g), x), forward(shrunk, x), atol=1e-9)
  assert res.converged and res.n_sweeps == 1


def test_noisy_copies_still_match_and_average():
  rng = np.random.default_rng(1)
  net = random_net(rng, D=10, L=8, K=4)
  clients, perms = permuted_copies(rng, net, 4)
  clients = [tuple(w + 0.05 * rng.normal(size=w.shape) for w in c) for c in clients]
  (W1g, _, _, _), res = pfnm_single_layer(clients, None, return_matching=True)
  assert res.num_global == 8
  sigma = np.argsort(perms[0])
  for j in range(4):
    np.testing.assert_array_equal(res.assignments[j], sigma[perms[j]])


# ---------------------------------------------------------------------------------------
# Disjoint networks, nonparametric growth and truncation.
# ---------------------------------------------------------------------------------------


def two_disjoint_nets(rng, L1=8, L2=6):
  a = random_net(rng, D=8, L=L1, K=3, shift=0.0)
  b = random_net(rng, D=8, L=L2, K=3, shift=6.0)
  return [a, b]


def test_disjoint_networks_give_union():
  rng = np.random.default_rng(2)
  clients = two_disjoint_nets(rng)
  (W1g, _, _, _), res = pfnm_single_layer(clients, None, return_matching=True)
  assert res.num_global == 8 + 6
  assert set(res.assignments[0]).isdisjoint(res.assignments[1])
  np.testing.assert_array_equal(res.popularity, np.ones(14))
  # Every global neuron is the Prop. 1 shrinkage of exactly one client neuron.
  hp = MatchingHyperparams()
  for j, (W1, _, _, _) in enumerate(clients):
    np.testing.assert_allclose(W1g[:, res.assignments[j]], shrink(W1, 0.0, 1, hp))


def test_tiny_gamma0_keeps_local_size():
  """Paper section 4: gamma0 -> 0 makes the global model the size of the local one."""
  rng = np.random.default_rng(3)
  clients = [random_net(rng, D=8, L=8, K=3), random_net(rng, D=8, L=6, K=3)]
  _, res = pfnm_single_layer(clients, None, return_matching=True)
  assert res.num_global > 8
  _, res = pfnm_single_layer(clients, None, MatchingHyperparams(gamma0=1e-20), return_matching=True)
  assert res.num_global == 8


@pytest.mark.parametrize("max_sweeps", [0, 5])
def test_paper_truncation_caps_layer(max_sweeps):
  rng = np.random.default_rng(4)
  clients = two_disjoint_nets(rng)
  hp = MatchingHyperparams(max_global_neurons=10, max_sweeps=max_sweeps)
  _, res = pfnm_single_layer(clients, None, hp, return_matching=True)
  # Supplement 4.2: candidates truncated at max(L_j, T) + 1 -> layer size T + 1.
  assert res.num_global == 11 < 14
  for a in res.assignments:
    assert len(set(a)) == len(a) and a.max() < res.num_global


def test_reference_truncation_rule():
  rng = np.random.default_rng(4)
  clients = two_disjoint_nets(rng)
  hp = MatchingHyperparams(max_global_neurons=10, max_sweeps=0, truncation="reference")
  _, res = pfnm_single_layer(clients, None, hp, return_matching=True)
  # First client opens 8 neurons; the second may add min(6, max(10 - 8, 1)) = 2.
  assert res.num_global == 10


def test_num_new_columns_rules():
  assert num_new_columns(0, 50, 700, "paper") == 50
  assert num_new_columns(680, 50, 700, "paper") == 21
  assert num_new_columns(700, 50, 700, "paper") == 1
  assert num_new_columns(701, 50, 700, "paper") == 0
  assert num_new_columns(0, 20, 15, "paper") == 20  # L_j > T: max(L_j, T) + 1
  assert num_new_columns(680, 50, 700, "reference") == 20
  assert num_new_columns(900, 50, 700, "reference") == 1
  assert num_new_columns(3, 20, 15, "reference") == 17  # feasibility floor L_j - L_-j
  with pytest.raises(ValueError, match="rule"):
    num_new_columns(0, 1, 1, "nope")


# ---------------------------------------------------------------------------------------
# Cost of eq. (9).
# ---------------------------------------------------------------------------------------


def test_vectorised_cost_equals_scalar_eq9():
  """Build the state from explicit observations and compare with eq. (9) written
    term by term with scalar sigma^2 (main-text Proposition 2)."""
  rng = np.random.default_rng(5)
  A, J, s0, s = 4, 3, 2.5, 0.7
  mu0 = rng.normal(size=A)
  others = [[rng.normal(size=A)], [rng.normal(size=A), rng.normal(size=A)]]  # neurons 0, 1
  v = rng.normal(size=(2, A))  # client j
  G = np.array([mu0 / s0 + sum(o) / s for o in others])
  P = np.array([np.full(A, 1 / s0 + len(o) / s) for o in others])
  m = np.array([len(o) for o in others])
  gamma0, n_new = 0.8, 2
  C = assignment_cost(G, P, popularity_log_odds(m, J), v / s, np.full(A, 1 / s), mu0 / s0,
                      np.full(A, 1 / s0), new_neuron_log_prior(n_new, gamma0, J, 2.0))
  assert C.shape == (2, 2 + n_new)
  for l in range(2):
    for i, o in enumerate(others):
      post = (np.sum(
          (mu0 / s0 + v[l] / s + sum(o) / s)**2) / (1 / s0 + 1 / s + len(o) / s) - np.sum(
              (mu0 / s0 + sum(o) / s)**2) / (1 / s0 + len(o) / s))
      expected = -(post + np.log(len(o) / (J - len(o))))
      assert C[l, i] == pytest.approx(expected, rel=1e-12)
    for k in range(1, n_new + 1):
      prior = (np.sum((mu0 / s0 + v[l] / s)**2) / (1 / s0 + 1 / s) - np.sum(
          (mu0 / s0)**2) / (1 / s0))
      expected = -(prior - 2 * np.log(k) + 2 * np.log(gamma0 / J))
      assert C[l, 2 + k - 1] == pytest.approx(expected, rel=1e-12)


def test_per_coordinate_gain_matches_loop():
  rng = np.random.default_rng(6)
  G, P = rng.normal(size=(3, 5)), rng.uniform(0.5, 2.0, size=(3, 5))
  g, p = rng.normal(size=(4, 5)), np.array([0.0, 1.0, 2.0, 0.5, 3.0])
  gain = existing_neuron_gain(G, P, g, p)
  for l in range(4):
    for i in range(3):
      ref = sum((G[i, a] + g[l, a])**2 / (P[i, a] + p[a]) - G[i, a]**2 / P[i, a] for a in range(5))
      assert gain[l, i] == pytest.approx(ref, rel=1e-12)
  G0, P0 = rng.normal(size=5), rng.uniform(0.5, 2.0, size=5)
  new = new_neuron_gain(G0, P0, g, p)
  for l in range(4):
    ref = sum((G0[a] + g[l, a])**2 / (P0[a] + p[a]) - G0[a]**2 / P0[a] for a in range(5))
    assert new[l] == pytest.approx(ref, rel=1e-12)


def test_blocked_gain_equals_general_formula():
  rng = np.random.default_rng(13)
  A = 9
  group = np.array([0, 1, 0, 2, 2, 0, 1, 3, 0])  # coordinates sharing precisions
  prec = rng.uniform(0.2, 3.0, size=(5, 4))[:, group]  # rows: P0, clients, ... per group
  perm, blocks = coordinate_blocks(prec)
  assert len(blocks) == 4
  P = rng.uniform(0.5, 4.0, size=(6, 4))[:, group][:, perm]
  p = prec[1][perm]
  G, g = rng.normal(size=(6, A)), rng.normal(size=(3, A))
  np.testing.assert_allclose(pfnm_module.existing_neuron_gain(G, P, g, p, blocks),
                             existing_neuron_gain(G, P, g, p),
                             rtol=1e-12,
                             atol=1e-12)
  assert coordinate_blocks(rng.normal(size=(3, 40)))[0] is None  # > 32 groups: general


def test_fast_path_gives_same_matching_as_general_path(monkeypatch):
  rng = np.random.default_rng(14)
  net = random_net(rng, D=10, L=7, K=4)
  clients = [
      tuple(w + 0.3 * rng.normal(size=w.shape) for w in c) for c in permuted_copies(rng, net, 4)[0]
  ]
  clients.append(random_net(rng, D=10, L=5, K=4))
  counts = [rng.integers(0, 10, size=4) for _ in clients]
  hp = MatchingHyperparams(softmax_precision="class_frequency", seed=1)
  fast, r_fast = pfnm_single_layer(clients, counts, hp, return_matching=True)
  monkeypatch.setattr(pfnm_module, "coordinate_blocks", lambda *a, **k: (None, None))
  slow, r_slow = pfnm_single_layer(clients, counts, hp, return_matching=True)
  for a, b in zip(r_fast.assignments, r_slow.assignments):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(fast, slow):
    np.testing.assert_allclose(a, b, atol=1e-12)


def test_popularity_cap_and_log_factors():
  assert popularity_log_odds([12], 20, cap=10)[0] == pytest.approx(np.log(10 / 10))
  assert popularity_log_odds([12], 20)[0] == pytest.approx(np.log(12 / 8))
  np.testing.assert_allclose(new_neuron_log_prior(3, 2.0, 4, 1.0), np.log(0.5) - np.log([1, 2, 3]))


# ---------------------------------------------------------------------------------------
# Class frequencies and softmax bias.
# ---------------------------------------------------------------------------------------


def test_class_frequency_precision_ignores_unseen_class():
  rng = np.random.default_rng(7)
  net = random_net(rng, D=6, L=4, K=3)
  clients, perms = permuted_copies(rng, net, 2)
  W1, b1, W2, b2 = clients[1]
  W2 = W2.copy()
  W2[:, 2] = 50.0 * rng.normal(size=4)  # client 1 never saw class 2
  b2 = b2 + np.array([0.0, 0.0, 9.0])
  clients[1] = (W1, b1, W2, b2)
  counts = [np.array([10, 10, 10]), np.array([10, 10, 0])]
  hp = MatchingHyperparams(softmax_precision="class_frequency")
  (W1g, _, W2g, b2g), res = pfnm_single_layer(clients, counts, hp, return_matching=True)
  assert res.num_global == 4
  sigma = np.argsort(perms[0])
  # Class 2: only client 0 informs it, with omega = J * 10 / 10 = 2.
  expected = (2 * net[2][:, 2] / hp.sigma_sq) / (1 / hp.sigma0_sq + 2 / hp.sigma_sq)
  np.testing.assert_allclose(W2g[sigma, 2], expected, atol=1e-10)
  np.testing.assert_allclose(b2g[2], (2 * net[3][2]) / (1 / hp.sigma0_sq + 2), atol=1e-10)
  # Uniform precision (paper default) lets the garbage column pull the average.
  W2u = pfnm_single_layer(clients, counts)[2]
  assert np.abs(W2u[:, 2]).max() > 5


def test_softmax_bias_weighted_by_class_counts():
  rng = np.random.default_rng(8)
  nets = [random_net(rng, D=3, L=2, K=2) for _ in range(2)]
  hp = MatchingHyperparams(sigma0_sq=1e12)  # flat prior: a weighted average
  counts = [np.array([3, 1]), np.array([1, 3])]
  b2g = pfnm_single_layer(nets, counts, hp)[3]
  expected = (np.array([3, 1]) * nets[0][3] + np.array([1, 3]) * nets[1][3]) / 4
  np.testing.assert_allclose(b2g, expected, rtol=1e-9)
  b2u = pfnm_single_layer(nets, None, hp)[3]
  np.testing.assert_allclose(b2u, (nets[0][3] + nets[1][3]) / 2, rtol=1e-9)


# ---------------------------------------------------------------------------------------
# Bookkeeping invariants (property-based).
# ---------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5),
       A=st.integers(1, 4),
       seed=st.integers(0, 10_000),
       cap=st.integers(1, 12),
       rule=st.sampled_from(["paper", "reference"]))
def test_state_equals_prop1_recomputed_from_assignments(sizes, A, seed, cap, rule):
  rng = np.random.default_rng(seed)
  atoms = [rng.normal(size=(n, A)) * rng.uniform(0.1, 3.0) for n in sizes]
  hp = MatchingHyperparams(max_global_neurons=cap, truncation=rule, seed=seed, max_sweeps=3)
  res = match_layer(atoms, hp)
  L = res.num_global
  G = np.zeros((L, A))
  n = np.zeros(L)
  for a, v in zip(res.assignments, atoms):
    assert len(set(a.tolist())) == len(a)  # one-to-one within a client
    G[a] += v / hp.sigma_sq
    n[a] += 1
  assert np.all(n >= 1)  # no empty global neuron
  np.testing.assert_array_equal(res.popularity, n)
  np.testing.assert_allclose(res.P,
                             np.broadcast_to(1 / hp.sigma0_sq + n[:, None] / hp.sigma_sq, (L, A)))
  np.testing.assert_allclose(res.global_atoms, G / res.P, atol=1e-9)
  if rule == "paper":
    assert L <= max(cap, max(sizes)) + 1


def test_seeded_sweeps_are_deterministic():
  rng = np.random.default_rng(9)
  atoms = [rng.normal(size=(5, 3)) for _ in range(6)]
  r1 = match_layer(atoms, MatchingHyperparams(seed=3))
  r2 = match_layer(atoms, MatchingHyperparams(seed=3))
  for a, b in zip(r1.assignments, r2.assignments):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(r1.global_atoms, r2.global_atoms)


# ---------------------------------------------------------------------------------------
# Validation.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, name", [
    (dict(sigma0_sq=0.0), "sigma0_sq"),
    (dict(sigma_sq=-1.0), "sigma_sq"),
    (dict(gamma0=0.0), "gamma0"),
    (dict(max_sweeps=-1), "max_sweeps"),
    (dict(max_global_neurons=0), "max_global_neurons"),
    (dict(popularity_cap=0), "popularity_cap"),
    (dict(truncation="x"), "truncation"),
    (dict(softmax_precision="x"), "softmax_precision"),
    (dict(log_factor=-1.0), "log_factor"),
    (dict(streaming_popularity="x"), "streaming_popularity"),
])
def test_hyperparam_validation(kwargs, name):
  with pytest.raises(ValueError, match=name):
    MatchingHyperparams(**kwargs)


def test_match_layer_validation():
  a = np.ones((2, 3))
  with pytest.raises(ValueError, match="J >= 1"):
    match_layer([])
  with pytest.raises(ValueError, match="atoms_per_client"):
    match_layer([a, np.ones((2, 4))])
  with pytest.raises(ValueError, match="atoms_per_client"):
    match_layer([np.ones((0, 3))])
  with pytest.raises(ValueError, match=r"obs_var\[1\]"):
    match_layer([a, a], obs_var=[1.0, np.array([1.0, 0.0, 1.0])])
  with pytest.raises(ValueError, match="prior_var"):
    match_layer([a], prior_var=-1.0)
  with pytest.raises(ValueError, match="prior_mean"):
    match_layer([a], prior_mean=np.zeros(4))


def test_single_layer_weight_validation():
  rng = np.random.default_rng(10)
  a, b = random_net(rng, D=4), random_net(rng, D=5)
  with pytest.raises(ValueError, match="input dimension"):
    pfnm_single_layer([a, b])
  c = random_net(rng, D=4, K=2)
  with pytest.raises(ValueError, match="outputs"):
    pfnm_single_layer([a, c])
  with pytest.raises(ValueError, match="b1"):
    pfnm_single_layer([(a[0], a[1][:2], a[2], a[3])])
  with pytest.raises(ValueError, match="J >= 1"):
    pfnm_single_layer([])
  with pytest.raises(ValueError, match="class_counts"):
    pfnm_single_layer([a, a], [np.ones(3)])


# ---------------------------------------------------------------------------------------
# DP-means baseline.
# ---------------------------------------------------------------------------------------


def test_dpmeans_recovers_permuted_copies():
  rng = np.random.default_rng(11)
  net = random_net(rng, D=8, L=5, K=3)
  clients, perms = permuted_copies(rng, net, 3)
  clients = [tuple(w + 0.01 * rng.normal(size=w.shape) for w in c) for c in clients]
  (W1g, b1g, W2g, b2g), labels = dpmeans_single_layer(clients, lam=1.0, return_labels=True)
  assert W1g.shape == (8, 5)
  for j in range(1, 3):  # same original neuron -> same cluster
    np.testing.assert_array_equal(labels[j][np.argsort(perms[j])], labels[0][np.argsort(perms[0])])
  order = labels[0][np.argsort(perms[0])]
  np.testing.assert_allclose(W1g[:, order], net[0], atol=0.05)
  np.testing.assert_allclose(b2g, net[3], atol=0.05)


def test_dpmeans_lambda_extremes_and_validation():
  rng = np.random.default_rng(12)
  X = rng.normal(size=(30, 4))
  centers, labels = dp_means(X, lam=1e9)
  assert centers.shape == (1, 4)
  np.testing.assert_allclose(centers[0], X.mean(0))
  centers, labels = dp_means(X, lam=1e-9)
  assert centers.shape == (30, 4)
  np.testing.assert_allclose(centers[labels], X)
  with pytest.raises(ValueError, match="lam"):
    dp_means(X, lam=0.0)
  with pytest.raises(ValueError, match="points"):
    dp_means(np.ones(3), lam=1.0)

"""Tests of streaming PFNM (supplement eqs. 10-11)."""

import numpy as np
import pytest

from matching_helpers import permuted_copies, random_net
from tfbfl.matching import MatchingHyperparams, StreamingPFNM, match_layer, pfnm_single_layer


@pytest.mark.parametrize("mode", ["pooled", "group"])
def test_one_step_equals_one_shot(mode):
  rng = np.random.default_rng(0)
  # Heterogeneous networks of different sizes, partly shared neurons.
  base = random_net(rng, D=8, L=10, K=4)
  nets = []
  for L_j in (7, 10, 5):
    idx = rng.choice(10, size=L_j, replace=False)
    nets.append((base[0][:, idx] + 0.3 * rng.normal(size=(8, L_j)), base[1][idx],
                 base[2][idx] + 0.3 * rng.normal(size=(L_j, 4)), rng.normal(size=4)))
  counts = [rng.integers(1, 30, size=4) for _ in nets]
  hp = MatchingHyperparams(streaming_popularity=mode,
                           softmax_precision="class_frequency",
                           bias_prior_mean=0.1,
                           seed=5)
  one_shot, res = pfnm_single_layer(nets, counts, hp, return_matching=True)
  stream = StreamingPFNM(hp)
  streamed = stream.update(nets, counts)
  for a, b in zip(streamed, one_shot):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
  for a, b in zip(stream.last_result.assignments, res.assignments):
    np.testing.assert_array_equal(a, b)
  assert stream.state.steps == 1
  np.testing.assert_array_equal(stream.state.group_counts.sum(0), res.popularity)


@pytest.mark.parametrize("mode", ["pooled", "group"])
def test_two_steps_of_copies_keep_size_and_accumulate_posterior(mode):
  rng = np.random.default_rng(1)
  net = random_net(rng, D=7, L=6, K=3)
  J = 3
  hp = MatchingHyperparams(streaming_popularity=mode, bias_prior_mean=0.1)
  stream = StreamingPFNM(hp)
  clients1, perms1 = permuted_copies(rng, net, J)
  stream.update(clients1)
  sigma = np.argsort(perms1[0])
  clients2, perms2 = permuted_copies(rng, net, J)
  W1g, b1g, W2g, b2g = stream.update(clients2)
  assert W1g.shape == (7, 6) and stream.state.num_global == 6
  for j in range(J):  # step-2 neurons land on the neurons of step 1 (eq. 10 prior)
    np.testing.assert_array_equal(stream.last_result.assignments[j], sigma[perms2[j]])
  np.testing.assert_array_equal(stream.state.group_counts, np.full((J, 6), 2))
  # Eq. (10) twice == Prop. 1 with 2J identical observations.
  n = 2 * J
  shrink = lambda w, mu: (mu / hp.sigma0_sq + n * w / hp.sigma_sq) / (1 / hp.sigma0_sq + n / hp.
                                                                      sigma_sq)
  np.testing.assert_allclose(W1g[:, sigma], shrink(net[0], 0.0), atol=1e-10)
  np.testing.assert_allclose(b1g[sigma], shrink(net[1], 0.1), atol=1e-10)
  np.testing.assert_allclose(W2g[sigma], shrink(net[2], 0.0), atol=1e-10)
  np.testing.assert_allclose(b2g, shrink(net[3], 0.1), atol=1e-10)
  np.testing.assert_allclose(stream.state.P[0], 1 / hp.sigma0_sq + n / hp.sigma_sq)


def test_new_neurons_in_later_step_are_appended():
  rng = np.random.default_rng(2)
  a, b = random_net(rng, L=4), random_net(rng, L=3, shift=6.0)
  stream = StreamingPFNM()
  stream.update([a, a])
  G_before = stream.state.G.copy()
  stream.update([b, b])
  assert stream.state.num_global == 7
  # Carried-over neurons keep their indices and (unused at step 2) their posterior.
  np.testing.assert_allclose(stream.state.G[:4], G_before, atol=1e-12)
  np.testing.assert_array_equal(stream.state.group_counts, np.array([[1, 1, 1, 1, 1, 1, 1]] * 2))
  for res_a in stream.last_result.assignments:
    assert set(res_a.tolist()) == {4, 5, 6}


def test_local_init_and_validation():
  rng = np.random.default_rng(3)
  net = random_net(rng, D=5, L=4, K=2)
  stream = StreamingPFNM()
  with pytest.raises(ValueError, match="update"):
    stream.global_weights()
  stream.update([net, net])
  W1, b1, W2, b2 = stream.local_init(0, n_neurons=6, n_fresh=1, noise_std=0.0, seed=0)
  assert W1.shape == (5, 6) and b1.shape == (6,) and W2.shape == (6, 2) and b2.shape == (2,)
  assert np.all(W1[:, 4:] == 0.0)  # 4 global + 2 fresh at the base mean
  with pytest.raises(ValueError, match="same J"):
    stream.update([net, net, net])
  with pytest.raises(ValueError, match="n_fresh"):
    stream.local_init(0, n_neurons=2, n_fresh=3)
  atoms = [rng.normal(size=(3, 4))]
  with pytest.raises(ValueError, match="prior_popularity"):
    match_layer(atoms, prior_mean=np.zeros((2, 4)), prior_steps=1)
  with pytest.raises(ValueError, match="prior_steps"):
    match_layer(atoms, prior_mean=np.zeros((2, 4)), prior_popularity=np.ones((1, 2)))
  with pytest.raises(ValueError, match="prior_popularity"):
    match_layer(atoms,
                prior_mean=np.zeros((2, 4)),
                prior_popularity=np.ones((1, 2)) * 3,
                prior_steps=1)
  with pytest.raises(ValueError, match="prior_var"):
    match_layer(atoms,
                prior_mean=np.zeros((2, 4)),
                prior_var=np.zeros((2, 4)),
                prior_popularity=np.ones((1, 2)),
                prior_steps=1)

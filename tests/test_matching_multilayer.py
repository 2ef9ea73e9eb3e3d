"""Tests of multilayer PFNM (supplement Algorithm 1): every hidden layer matched."""

import numpy as np
import pytest

from tfbfl.matching import MatchingHyperparams, pfnm_multilayer, pfnm_single_layer


def random_deep_net(rng, sizes, shift=0.0):
  """[(W_l, b_l)] for layer sizes [D, L1, ..., LC, K]."""
  return [(rng.normal(size=(a, b)) + shift, rng.normal(size=b) + shift)
          for a, b in zip(sizes[:-1], sizes[1:])]


def permute_hidden(net, perms):
  """Reorder hidden units of layer c by perms[c-1]; the function is unchanged."""
  out = []
  for l, (W, b) in enumerate(net):
    if l > 0:
      W = W[perms[l - 1]]
    if l < len(net) - 1:
      W, b = W[:, perms[l]], b[perms[l]]
    out.append((W, b))
  return out


def forward(net, x):
  h = x
  for l, (W, b) in enumerate(net):
    h = h @ W + b
    if l < len(net) - 1:
      h = np.maximum(h, 0.0)
  return h


def shrink_net(net, J, hp):
  """Prop. 4 with J identical observations per coordinate; biases shrink to mu_b."""
  f = lambda w, mu: (mu / hp.sigma0_sq + J * w / hp.sigma_sq) / (1 / hp.sigma0_sq + J / hp.sigma_sq)
  return [(f(W, 0.0), f(b, hp.bias_prior_mean)) for W, b in net]


@pytest.mark.parametrize("sizes", [[7, 6, 5, 3], [6, 5, 4, 4, 3]])
def test_permuted_copies_every_layer(sizes):
  rng = np.random.default_rng(len(sizes))
  net = random_deep_net(rng, sizes)
  J = 4
  perms = [[rng.permutation(n) for n in sizes[1:-1]] for _ in range(J)]
  clients = [permute_hidden(net, p) for p in perms]
  hp = MatchingHyperparams(bias_prior_mean=0.1)
  glob, results = pfnm_multilayer(clients, None, hp, return_matching=True)

  assert [W.shape for W, _ in glob] == [(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
  for c, res in enumerate(results):  # every hidden layer really matched
    sigma = np.argsort(perms[0][c])
    for j in range(J):
      np.testing.assert_array_equal(res.assignments[j], sigma[perms[j][c]])
    np.testing.assert_array_equal(res.popularity, np.full(sizes[c + 1], J))
  x = rng.normal(size=(25, sizes[0]))
  np.testing.assert_allclose(forward(glob, x), forward(shrink_net(net, J, hp), x), atol=1e-9)
  # Weight-level check: undo the global permutation of each layer.
  sig = [np.argsort(perms[0][c]) for c in range(len(sizes) - 2)]
  expected = shrink_net(net, J, hp)
  for l, (W, b) in enumerate(glob):
    if l > 0:
      W = W[sig[l - 1]]
    if l < len(glob) - 1:
      W, b = W[:, sig[l]], b[sig[l]]
    np.testing.assert_allclose(W, expected[l][0], atol=1e-10)
    np.testing.assert_allclose(b, expected[l][1], atol=1e-10)


def test_one_hidden_layer_equals_single_layer():
  rng = np.random.default_rng(1)
  nets = [random_deep_net(rng, [5, n, 3]) for n in (4, 6, 3)]
  counts = [rng.integers(0, 20, size=3) for _ in nets]
  hp = MatchingHyperparams(softmax_precision="class_frequency", seed=2)
  deep = pfnm_multilayer(nets, counts, hp)
  single = pfnm_single_layer([(W1, b1, W2, b2) for (W1, b1), (W2, b2) in nets], counts, hp)
  for got, want in zip([deep[0][0], deep[0][1], deep[1][0], deep[1][1]], single):
    np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("missing", ["zero", "ignore"])
def test_disjoint_deep_networks_give_union_per_layer(missing):
  rng = np.random.default_rng(3)
  a = random_deep_net(rng, [6, 5, 4, 3])
  b = random_deep_net(rng, [6, 3, 2, 3], shift=6.0)
  hp = MatchingHyperparams(missing_outgoing=missing)
  glob, results = pfnm_multilayer([a, b], None, hp, return_matching=True)
  assert [r.num_global for r in results] == [5 + 3, 4 + 2]
  assert [W.shape for W, _ in glob] == [(6, 8), (8, 6), (6, 3)]
  # Patched outgoing weights: a's layer-1 neurons only connect to a's layer-2 neurons.
  a2 = results[1].assignments[0]
  b2 = results[1].assignments[1]
  W2g = glob[1][0]
  rows_a = results[0].assignments[0]
  if missing == "ignore":
    # Missing coordinates carry no information: they stay at the prior mean 0.
    np.testing.assert_allclose(W2g[np.ix_(rows_a, b2)], 0.0, atol=1e-12)
  assert np.abs(W2g[np.ix_(rows_a, a2)]).max() > 0.1


def test_layer_hparams_and_validation():
  rng = np.random.default_rng(4)
  net = random_deep_net(rng, [4, 3, 3, 2])
  hps = [MatchingHyperparams(), MatchingHyperparams(gamma0=2.0)]
  assert len(pfnm_multilayer([net, net], hp=hps)) == 3
  with pytest.raises(ValueError, match="hp"):
    pfnm_multilayer([net, net], hp=hps[:1])
  with pytest.raises(ValueError, match="layers"):
    pfnm_multilayer([net, net[1:]])
  with pytest.raises(ValueError, match="C >= 1"):
    pfnm_multilayer([net[:1]])
  with pytest.raises(ValueError, match="inputs"):
    pfnm_multilayer([[net[0], (np.ones((5, 2)), np.ones(2))]])
  other = random_deep_net(rng, [5, 3, 3, 2])
  with pytest.raises(ValueError, match="input dimension"):
    pfnm_multilayer([net, other])
  with pytest.raises(ValueError, match="J >= 1"):
    pfnm_multilayer([])

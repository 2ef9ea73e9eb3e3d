"""Random one-hidden-layer networks for the tests of PFNM matching."""


def random_net(rng, D=6, L=5, K=3, shift=0.0):
  """`(W1 [D, L], b1 [L], W2 [L, K], b2 [K])` of standard normals (+ `shift`,
    except `b2`)."""
  return (rng.normal(size=(D, L)) + shift, rng.normal(size=L) + shift,
          rng.normal(size=(L, K)) + shift, rng.normal(size=K))


def permuted_copies(rng, net, J):
  """`J` copies of `net` with randomly permuted hidden neurons, and the permutations."""
  W1, b1, W2, b2 = net
  perms = [rng.permutation(W1.shape[1]) for _ in range(J)]
  return [(W1[:, p], b1[p], W2[p], b2) for p in perms], perms

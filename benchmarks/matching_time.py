"""Wall time of one-shot PFNM matching (tfbfl.matching.pfnm_single_layer).

Random one-hidden-layer networks with D = 784 inputs and K = 10 outputs, J clients
of L hidden neurons each.  ``--kind random`` draws every network independently
(worst case: nothing matches, the global layer grows to the 700-neuron truncation
and every later client update works against ~700 global neurons);
``--kind shared`` draws client neurons as noisy copies of a pool of 2L global
neurons (closer to trained networks, which share features).

For each (J, L) the table shows the total matching time, the number of sweeps run,
the final global size, and the time per client update (one eq. 9 cost matrix +
Hungarian solve + state update), i.e. total / (J * (1 + sweeps)).  Time per sweep
grows linearly in J at fixed global size; the per-update time grows with the
global size L_-j (cost matrix L_j x (L_-j + L_j), A = D + 1 + K).

Run:  python -m benchmarks.matching_time [--quick] [--kind shared]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tfbfl.matching import MatchingHyperparams, pfnm_single_layer

TARGET_S = 3.0


def make_clients(rng, J, L, D=784, K=10, kind="random"):
  """J networks (W1 (D, L), b1, W2 (L, K), b2) with weight scale ~0.1."""
  clients = []
  if kind == "shared":
    pool_in = 0.1 * rng.standard_normal((D + 1, 2 * L))
    pool_out = rng.standard_normal((2 * L, K))
  for _ in range(J):
    if kind == "shared":
      idx = rng.choice(2 * L, size=L, replace=False)
      W1 = pool_in[:D, idx] + 0.02 * rng.standard_normal((D, L))
      b1 = pool_in[D, idx] + 0.02 * rng.standard_normal(L)
      W2 = pool_out[idx] + 0.2 * rng.standard_normal((L, K))
    else:
      W1 = 0.1 * rng.standard_normal((D, L))
      b1 = 0.1 * rng.standard_normal(L)
      W2 = rng.standard_normal((L, K))
    clients.append((W1, b1, W2, 0.1 * rng.standard_normal(K)))
  return clients


def time_one(J, L, kind, hp, repeats=1, seed=0):
  rng = np.random.default_rng(seed)
  clients = make_clients(rng, J, L, kind=kind)
  best = np.inf
  for _ in range(repeats):
    t0 = time.perf_counter()
    _, res = pfnm_single_layer(clients, None, hp, return_matching=True)
    best = min(best, time.perf_counter() - t0)
  return best, res


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="small grid, one repeat")
  parser.add_argument("--kind", choices=["random", "shared"], default="random")
  parser.add_argument("--max_sweeps", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=None)
  args = parser.parse_args(argv)

  if args.quick:
    Js, Ls, repeats = [2, 10, 30], [50, 100], 1
  else:
    Js, Ls, repeats = [2, 5, 10, 20, 30], [50, 100, 200], 2
  repeats = args.repeats or repeats
  hp = MatchingHyperparams(max_sweeps=args.max_sweeps)

  print(f"PFNM single-layer matching, D=784, K=10, kind={args.kind}, "
        f"max_sweeps={args.max_sweeps}, truncation={hp.max_global_neurons} ({hp.truncation})")
  print(f"{'J':>4} {'L':>5} {'total s':>9} {'sweeps':>6} {'global L':>8} "
        f"{'ms/update':>10} {'ms/sweep':>9} {'ms/sweep/J':>10}")
  target = None
  for L in Ls:
    for J in Js:
      t, res = time_one(J, L, args.kind, hp, repeats)
      updates = J * (1 + res.n_sweeps)
      per_update = 1e3 * t / updates
      per_sweep = 1e3 * t / (1 + res.n_sweeps)
      print(f"{J:>4} {L:>5} {t:>9.3f} {res.n_sweeps:>6} {res.num_global:>8} "
            f"{per_update:>10.2f} {per_sweep:>9.1f} {per_sweep / J:>10.2f}")
      if (J, L) == (30, 100):
        target = t
  if target is None:
    target, _ = time_one(30, 100, args.kind, hp, repeats)
  verdict = "meets" if target < TARGET_S else "MISSES"
  print(f"J=30, L=100, D=784: {target:.2f} s -> {verdict} the < {TARGET_S:.0f} s target")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())

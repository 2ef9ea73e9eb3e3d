"""A never-trained VIRTUAL client's initial state: per-client plan against the cached one.

Every client that has not trained yet gets `initial_client_state(index)` when it is
first selected or evaluated, so a first evaluation over K clients makes K of them
(docs/performance.md, Scale). Two ways, side by side in one process, on the digits
MLP (64-100-100-10) and the FEMNIST conv net:

* per-client plan: build the private network's plan of Keras layers at the
  client's seed, draw each mean eagerly
  (`initial_private_weights_from_plan(make_plan(..., seed))`) and raise the initial
  posterior to 1/K for the client's factor (how every state was made before);
* cached: `model.initial_client_state` with the factor computed once, whose private
  weights come from the plan's cached template, one traced draw a client
  (`initial_private_weights_of`).

Both give the same private arrays (checked on every client timed). Prints ms a
client and the ratio, and the 1-minute load average before and after.

    .venv/bin/python -m benchmarks.initial_states --clients=200
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _cases():
  """(name, config, plan builder, its arguments but the seed), as
  `initial_private_weights` / `initial_private_weights_conv` pass them."""
  from tfbfl.algorithms.virtual.config import VirtualConfig  # pylint: disable=g-import-not-at-top
  from tfbfl.networks import conv, mlp  # pylint: disable=g-import-not-at-top
  digits = VirtualConfig(input_dim=64, num_classes=10, num_clients=10_000)
  femnist = VirtualConfig(architecture="conv", input_dim=784, image_shape=(28, 28, 1),
                          num_classes=62, num_clients=100)
  # pylint: disable=protected-access
  return [
      ("digits_mlp", digits, mlp._mlp_plan,
       (64, 10, (100, 100), "relu", 1.0, digits.init_scale, None, digits.gate_init)),
      ("femnist_conv", femnist, conv._conv_plan,
       ((28, 28, 1), 62, (32, 64), 5, 2, "same", (100, 100), "relu", 1.0, femnist.init_scale,
        None, femnist.gate_init)),
  ]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--clients", type=int, default=200)
  args = parser.parse_args()
  if args.clients < 1:
    parser.error(f"--clients must be positive, got {args.clients}.")
  load_before = os.getloadavg()[0]
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tfbfl.algorithms.virtual import model  # pylint: disable=g-import-not-at-top
  from tfbfl.networks import base  # pylint: disable=g-import-not-at-top

  for name, cfg, make_plan, plan_args in _cases():
    posterior = model.initial_posterior(cfg)
    factor = model.initial_factor(cfg, posterior)
    def per_client_plan(i):
      model.initial_factor(cfg, posterior)
      return base.initial_private_weights_from_plan(make_plan(*plan_args, model.client_network_seed(cfg, i)))

    def cached(i):
      return model.initial_client_state(cfg, i, posterior, factor).private

    paths = {"per-client plan": per_client_plan, "cached": cached}
    for path in paths.values():  # traces and fills the cache outside the clock
      path(0)
    times = dict.fromkeys(paths, 0.0)
    for i in range(args.clients):
      values = {}
      for label in sorted(paths, reverse=bool(i % 2)):  # alternate, so drifts hit both
        start = time.perf_counter()
        values[label] = paths[label](i)
        times[label] += time.perf_counter() - start
      for a, b in zip(values["cached"], values["per-client plan"], strict=True):
        np.testing.assert_array_equal(a, b)
    per = {k: v / args.clients * 1e3 for k, v in times.items()}
    print(f"{name}: per-client plan {per['per-client plan']:.1f} ms a client, cached "
          f"{per['cached']:.1f} ms ({per['cached'] / per['per-client plan']:.2f}x); "
          f"{args.clients} clients, equal arrays")
  print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
  main()

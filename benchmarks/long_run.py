"""A 40-round VIRTUAL run on 30 clients of 300-400 examples: wall time end to end.

Issue 13's acceptance run: 30 clients, each drawing 300-400 examples of the 1,797
scikit-learn digits (64 features) with replacement from its own Dirichlet(0.5)
class mixture (`benchmarks.scale.make_data`), a quarter held out for test; VIRTUAL
at the launcher's defaults (MLP 64-100-100-10, E = 20, batch 20, 10 clients a
round, alpha = 1/C), S and MT evaluated after every round. Prints a progress line
per round and, at the end, the wall time from the first line of `main` (TFF start,
tracing and every evaluation included), the best S / MT accuracy, and the load.
The accuracies are no measure of generalisation: the clients resample the same
1,797 digits with replacement, so test examples repeat training ones.

    .venv/bin/python -m benchmarks.long_run            # 40 rounds
    .venv/bin/python -m benchmarks.long_run --rounds=3
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=40)
  parser.add_argument("--clients", type=int, default=30)
  parser.add_argument("--clients_per_round", type=int, default=10)
  parser.add_argument("--epochs", type=int, default=20)
  parser.add_argument("--algorithm", default="virtual")
  args = parser.parse_args()
  start = time.time()
  load = os.getloadavg()[0]
  from benchmarks import scale  # pylint: disable=g-import-not-at-top
  from tfbfl import round_loop, runtime, driver  # pylint: disable=g-import-not-at-top

  runtime.set_local_runtime()
  try:
    data = scale.make_data(args.clients, sizes=(300, 400))
    p = driver.resolve_params(
        dict(algorithm=args.algorithm,
             num_clients=args.clients,
             clients_per_round=args.clients_per_round,
             epochs_per_round=args.epochs,
             rounds=args.rounds))
    algorithm = driver.build_algorithm(data, p)
    config = round_loop.RunConfig(rounds=args.rounds,
                                  clients_per_round=args.clients_per_round,
                                  seed=0,
                                  verbose=True)
    summary = round_loop.ExperimentRunner(algorithm, data, config).run()
  finally:
    runtime.shutdown()
  wall = time.time() - start
  n = sum(len(data.train[i][1]) for i in data.client_ids)
  print(f"\n{args.algorithm}: {args.rounds} rounds, {args.clients} clients "
        f"({n} training examples), {args.clients_per_round} a round, E={args.epochs}: "
        f"{wall:.0f} s wall ({wall / 60:.1f} min); best S {summary['best_server_accuracy']:.4f}, "
        f"best MT {summary['best_mt_accuracy']:.4f}; {os.cpu_count()} cores, load at start "
        f"{load:.2f}")


if __name__ == "__main__":
  main()

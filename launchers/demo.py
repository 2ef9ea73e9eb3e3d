r"""The main job: VIRTUAL beside FedAvg on the bundled digits data.

    python -m launchers.demo                 # what `make demo` runs
    python -m launchers.demo --rounds=5      # quicker

Trains both algorithms with the library defaults (10 clients, per-class
Dirichlet(0.5) partition, C = 10, E = 20, B = 20, MLP 2x100) and prints the S
(server model on every client's test data) and MT (each client's own model on its
own test data) accuracies side by side. Full outputs land in --output_dir.
"""

import os

from absl import flags

from tfbfl import flags as tfbfl_flags
from tfbfl import driver

_ROUNDS = flags.DEFINE_integer("rounds", 15, "Communication rounds per algorithm.")
_OUT = flags.DEFINE_string("output_dir", "runs/demo", "Where each algorithm's outputs go.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of data split, sampling and initialisation.")
_ALGS = flags.DEFINE_list("algorithms", ["virtual", "fedavg"], "Algorithms to compare.")


def main(argv):
  del argv
  results = []
  for name in _ALGS.value:
    print(f"== {name} ==", flush=True)
    try:
      summary = driver.run_training(
          dict(algorithm=name,
               rounds=_ROUNDS.value,
               seed=_SEED.value,
               output_dir=os.path.join(_OUT.value, name),
               overwrite=True))  # a demo re-runs afresh
    except ValueError as e:
      if "not available" not in str(e):
        raise
      print(f"{name}: not available in this version ({e})")
      continue
    results.append(summary)
  print()
  print(f"digits, 10 clients, per-class Dirichlet(0.5), {_ROUNDS.value} rounds, seed {_SEED.value}")
  print(
      f"{'algorithm':<10} {'best S':>8} {'best MT':>8} {'final S':>8} {'final MT':>8} {'time s':>7}"
  )
  for s in results:
    print(
        f"{s['algorithm']:<10} {s['best_server_accuracy']:>8.4f} {s['best_mt_accuracy']:>8.4f} "
        f"{s['final_server_accuracy']:>8.4f} {s['final_mt_accuracy']:>8.4f} {s['wall_time_s']:>7.1f}"
    )
  print(f"(outputs: {_OUT.value}/<algorithm>/metrics.csv, summary.json, curves.png, export/)")


if __name__ == "__main__":
  tfbfl_flags.run(main, "demo")

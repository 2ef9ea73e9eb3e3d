r"""Trains one federated algorithm and writes metrics, summary, curves, checkpoints.

    python -m launchers.train --algorithm=virtual --rounds=20 --output_dir=runs/virtual
    python -m launchers.train --algorithm=fedavg --partition=homogeneous
    python -m launchers.train --algorithm=fedpa
    python -m launchers.train --dataset=npz --data_dir=my_clients.npz

With no dataset flags it runs on scikit-learn's bundled handwritten digits (10
clients, per-class Dirichlet(0.5) partition). Every flag is declared once, next to
the code it configures (`tfbfl.flags`); `--helpfull` lists them. See docs/running.md
for the flags, outputs and checkpoints of every algorithm.

A run with --output_dir writes its flags to <output_dir>/flags.txt; after Ctrl-C
(exit 130, one line) it continues with

    python -m launchers.train --flagfile=<output_dir>/flags.txt --resume
"""

from tfbfl import round_loop
from tfbfl import flags as tfbfl_flags
from tfbfl import driver

tfbfl_flags.define()


def params_from_flags() -> dict:
  return tfbfl_flags.params()


def main(argv):
  if len(argv) > 1:
    tfbfl_flags.fail("train", f"unexpected arguments: {argv[1:]}")
  params = params_from_flags()
  if params.get("verbose", True):
    print(
        f"[{params.get('algorithm', driver.DEFAULT_ALGORITHM)}] loading data "
        f"(--dataset={params.get('dataset', driver.DEFAULTS['dataset'])}) ...",
        flush=True)
  try:
    summary = driver.run_training(params)
  except (ValueError, FileNotFoundError) as e:
    tfbfl_flags.fail("train", str(e))
  except round_loop.RunStoppedError as e:  # robust rounds: one line, no traceback
    tfbfl_flags.fail("train", str(e), round_loop.RUN_STOPPED_STATUS)
  print(
      f"{summary['algorithm']}: best S accuracy {summary['best_server_accuracy']:.4f}, "
      f"best MT accuracy {summary['best_mt_accuracy']:.4f}, "
      f"final S {summary['final_server_accuracy']:.4f}, final MT {summary['final_mt_accuracy']:.4f} "
      f"({summary['rounds']} rounds, {summary['wall_time_s']:.1f} s)")


if __name__ == "__main__":
  tfbfl_flags.run(main, "train")

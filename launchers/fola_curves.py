r"""FOLA Fig. 3: learning curves (global accuracy per round) per alpha and method.

    python -m launchers.fola_curves --output_dir=runs/fola_curves
    python -m launchers.fola_curves --output_dir=runs/fc --alphas=0.01,1 --rounds=50
    python -m launchers.fola_curves --dataset=cifar10 --data_dir=/data/cifar10 \
        --num_clients=20 --batch_size=32 --rounds=100 --output_dir=runs/fola_cifar

Each (method, alpha) is one `tfbfl.driver.run_training` run in
`<output_dir>/<method>/alpha_<alpha>/` (metrics.csv, summary.json with
`best_global_accuracy`, curves.png), partition `label_dirichlet`, all clients in
every round; `--checkpoint_every` checkpoints each run and `--resume` continues
each from its checkpoint where a stopped invocation left one. Then
`curves_by_alpha.png` (one panel per alpha) and `curves_summary.csv` go to
`--output_dir`. Digits (64-500-300-10 MLP) by default; `--dataset=cifar10` uses
the McMahan et al. CNN (needs the CIFAR-10 python batches in --data_dir; FedAvg
then runs as product_identity, FedAvg on the same CNN).
"""

import os

from absl import app
from absl import flags

from tfbfl.algorithms import fola
from reproduction import _runs
from reproduction import fola_figures
from tfbfl import flags as tfbfl_flags
from tfbfl import driver

F = flags.FLAGS
fola_figures.define_launcher_flags()
flags.adopt_module_key_flags(fola_figures)
flags.DEFINE_string("output_dir", "runs/fola_curves", "Root of the run directories.")
flags.DEFINE_integer("rounds", driver.DEFAULTS["rounds"],
                     _runs.flag_help("rounds", paper="100 on CIFAR-10"))
flags.DEFINE_integer("eval_every", driver.DEFAULTS["eval_every"], _runs.flag_help("eval_every"))
flags.DEFINE_integer("checkpoint_every", driver.DEFAULTS["checkpoint_every"],
                     _runs.flag_help("checkpoint_every"))
flags.DEFINE_bool("resume", False,
                  "Continue each run from the checkpoint in its directory under --output_dir "
                  "where an earlier invocation left one (the same flags and data); the other "
                  "runs start afresh.")
flags.DEFINE_enum("architecture", None, list(fola.MODELS), "mlp or cnn (default: cnn for cifar10).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  model = F.architecture or ("cnn" if F.dataset == "cifar10" else "mlp")
  base = dict(rounds=F.rounds,
              eval_every=F.eval_every,
              checkpoint_every=F.checkpoint_every,
              architecture=model,
              **fola_figures.launcher_params(F))
  try:
    rows = fola_figures.learning_curves(base, F.methods, [float(a) for a in F.alphas], F.output_dir,
                                        resume=F.resume)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e)) from e
  if not rows:
    raise app.UsageError(f"none of --methods={F.methods} could run.")
  fola_figures.write_rows_csv(os.path.join(F.output_dir, "curves_summary.csv"), rows)
  fola_figures.plot_learning_curves(os.path.join(F.output_dir, "curves_by_alpha.png"), rows)
  for r in rows:
    print(f"{r['method']:>16s} alpha={r['alpha']:<6g} best GA {r['best_global_accuracy']:.4f} "
          f"final GA {r['final_global_accuracy']:.4f}")


if __name__ == "__main__":
  tfbfl_flags.run(main, "fola_curves")

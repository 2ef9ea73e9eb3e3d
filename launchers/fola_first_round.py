r"""FOLA Fig. 2: global accuracy after the first round over alpha, N, B, E and lr.

    python -m launchers.fola_first_round --output_dir=runs/fola_first_round
    python -m launchers.fola_first_round --output_dir=runs/fr --sweep=alpha --repeats=5
    python -m launchers.fola_first_round --output_dir=runs/fr --sweep=num_clients \
        --num_clients_list=5,10,20 --methods=fola,fedcurv

Every swept axis varies over its list with the other settings at their base
flags (`--alpha`, `--num_clients`, `--batch_size`, `--epochs_per_round`,
`--client_lr`); each point runs every method `--repeats` times (seeds `--seed`,
`--seed`+1, ...), partition `label_dirichlet` (q_n ~ Dir(alpha p)), all clients
in the round, one round. Writes `first_round.csv` (one row per run),
`first_round_summary.csv` (mean, std, count), `first_round.png` (GA vs each
axis, one line per method) and `first_round.md` under `--output_dir`. Methods:
fola, laplace_offline, fedcurv, fedavg (skipped with a message if not
available) and product_identity (the Gaussian product with unit precisions and
no penalty, i.e. FedAvg on any model). Digits (64-500-300-10 MLP) by default.
"""

import os

from absl import app
from absl import flags

from tfbfl.algorithms import fola
from tfbfl import round_loop
from reproduction import _runs
from reproduction import fola_figures
from tfbfl import flags as tfbfl_flags

F = flags.FLAGS
fola_figures.define_launcher_flags()
flags.adopt_module_key_flags(fola_figures)
flags.DEFINE_string("output_dir", "runs/fola_first_round", "Where the CSVs and the figure go.")
flags.DEFINE_list("sweep", list(fola_figures.SWEEP_AXES),
                  f"Axes to sweep, among {fola_figures.SWEEP_AXES}.")
flags.DEFINE_list("num_clients_list", ["5", "10", "20", "50", "100"], "Client counts N.")
flags.DEFINE_list("batch_sizes", ["8", "32", "64", "128", "254"], "Batch sizes B.")
flags.DEFINE_list("epochs_list", ["1", "5", "10", "15", "20"], "Local epochs E.")
flags.DEFINE_list("client_lrs", ["1", "0.1", "0.01", "0.001", "0.0001"], "Client learning rates.")
flags.DEFINE_float("alpha", 0.1,
                   _runs.flag_help("alpha", note="the base value when another "
                                   "axis is swept"))
flags.DEFINE_integer("repeats", 3, "Runs per point (the paper uses 30).")
flags.DEFINE_enum("architecture", "mlp", list(fola.MODELS), "mlp or cnn (McMahan et al.).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  lists = dict(alpha=[float(v) for v in F.alphas],
               num_clients=[int(v) for v in F.num_clients_list],
               batch_size=[int(v) for v in F.batch_sizes],
               epochs_per_round=[int(v) for v in F.epochs_list],
               client_lr=[float(v) for v in F.client_lrs])
  base = dict(alpha=F.alpha, architecture=F.architecture, **fola_figures.launcher_params(F))
  try:
    sweeps = {axis: lists[axis] for axis in F.sweep} if set(F.sweep) <= set(lists) else None
    if sweeps is None:
      raise ValueError(f"--sweep must list axes among {fola_figures.SWEEP_AXES}, got {F.sweep}.")
    rows = fola_figures.first_round_accuracy(base, F.methods, sweeps, repeats=F.repeats)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e)) from e
  os.makedirs(F.output_dir, exist_ok=True)
  fola_figures.write_rows_csv(os.path.join(F.output_dir, "first_round.csv"), rows)
  fola_figures.write_rows_csv(os.path.join(F.output_dir, "first_round_summary.csv"),
                              fola_figures.summarise(rows))
  fola_figures.plot_first_round(os.path.join(F.output_dir, "first_round.png"),
                                rows,
                                title=f"{F.dataset}: global accuracy after round 1")
  table = fola_figures.format_first_round_table(rows)
  round_loop.atomic_write_text(os.path.join(F.output_dir, "first_round.md"), table)
  print(table)


if __name__ == "__main__":
  tfbfl_flags.run(main, "fola_first_round")

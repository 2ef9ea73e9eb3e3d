r"""VIRTUAL Table II and Figs. 2-3: the hyperparameter grid per dataset and algorithm.

    python -m launchers.virtual_table2 --output_dir=runs/table2 --quick
    python -m launchers.virtual_table2 --output_dir=runs/table2 --seeds=0,1,2,3,4
    python -m launchers.virtual_table2 --output_dir=runs/t2 --algorithms=virtual \
        --virtual_server_lrs=0.2,0.4 --fixed=tie_damping=true

Runs every cell (dataset x algorithm x hyperparameters x seed) that has no result
yet under `--output_dir`, then writes `table2.md`, `table2.csv`, `fig3.png` and
`fig2.png` there (see `tfbfl/grid.py`). Re-running resumes an interrupted grid.
"""

from absl import app
from absl import flags

from tfbfl import grid

F = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Root of the cell directories and the report.")
flags.DEFINE_list("datasets", list(grid.DEFAULT_DATASETS),
                  "Dataset specs name[:partition][:key=value...], e.g. digits:class_dirichlet.")
flags.DEFINE_list("algorithms", list(grid.ALGORITHMS), f"Among {grid.ALGORITHMS}.")
flags.DEFINE_list("seeds", ["0"], "Seeds (repeats; each draws its own partition and split).")
flags.DEFINE_bool("quick", False, "Reduced grid and 8 rounds (flags below still override).")
flags.DEFINE_list("client_lrs", None, "Client learning rates (default: 5 log-spaced).")
flags.DEFINE_list("kl_weights", None, "VIRTUAL beta values (default: 5 log-spaced, 1e-6..1e-2).")
flags.DEFINE_list("mus", None, "FedProx proximal strengths > 0 (default: 5 log-spaced).")
flags.DEFINE_list("server_lrs", None, "FedAvg/FedProx server learning rates (default 0.2..1.0).")
flags.DEFINE_list("virtual_server_lrs", None, "VIRTUAL server learning rates (default 0.2..1.0).")
flags.DEFINE_integer("rounds", None, "Rounds per cell (default: tfbfl.training's; 8 with --quick).")
flags.DEFINE_integer("epochs_per_round", None, "Local epochs E.")
flags.DEFINE_integer("clients_per_round", None, "Clients per round C.")
flags.DEFINE_integer("num_clients", None, "Number of clients K.")
flags.DEFINE_integer("batch_size", None, "Client minibatch size B.")
flags.DEFINE_multi_string("fixed", [], "Any other training flag for every cell, name=value.")
flags.DEFINE_bool("report_only", False, "Only write the report from the cells already run.")
flags.mark_flag_as_required("output_dir")


def _floats(values):
  return None if values is None else [float(v) for v in values]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    spec = grid.make_grid(
        F.quick, client_lrs=_floats(F.client_lrs), kl_weights=_floats(F.kl_weights),
        mus=_floats(F.mus), server_lrs=_floats(F.server_lrs),
        virtual_server_lrs=_floats(F.virtual_server_lrs), seeds=[int(s) for s in F.seeds])
    params = dict(rounds=F.rounds, epochs_per_round=F.epochs_per_round,
                  clients_per_round=F.clients_per_round, num_clients=F.num_clients,
                  batch_size=F.batch_size)
    params.update(grid.parse_assignments(F.fixed))
    fixed = grid.make_fixed(F.quick, **params)
    cells = grid.enumerate_cells(F.datasets, F.algorithms, spec)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  if F.report_only:
    results = [grid.load_result(c, F.output_dir) for c in cells]
  else:
    results = grid.run_grid(cells, F.output_dir, fixed)
  rows = grid.write_report(F.output_dir, results)
  print(grid.format_table2_md(rows))


if __name__ == "__main__":
  app.run(main)

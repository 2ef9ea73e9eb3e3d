r"""VIRTUAL Table II and Figs. 2-3: the hyperparameter grid per dataset and algorithm.

    python -m launchers.virtual_table2 --output_dir=runs/table2 --quick
    python -m launchers.virtual_table2 --output_dir=runs/table2 --seeds=0,1,2,3,4
    python -m launchers.virtual_table2 --output_dir=runs/t2 --algorithms=virtual,virtual_eq3 \
        --virtual_server_lrs=0.2,0.4 --fixed=fedavg_init=true

Runs every cell (dataset x algorithm x hyperparameters x seed) that has no result
yet under `--output_dir`, then writes `table2.md` (with the paper's claims judged
"held" / "not held" below the table), `table2.csv`, `fig3.png` and `fig2.png`
there (see `reproduction/table2.py`). Re-running resumes an interrupted grid.

VIRTUAL runs twice: `virtual` ("VIRTUAL (w_S=1)": the server network's own loss
added to the client loss) and `virtual_eq3` ("VIRTUAL eq. 3 (w_S=0)": the paper's
objective), tuned over the same values.

`--quick`: digits homogeneous, class_dirichlet and permuted; seeds 0, 1, 2;
virtual, virtual_eq3 and fedavg; one configuration each (client lr 0.05, beta 1e-4,
VIRTUAL step 0.1, i.e. VIRTUAL's default 1/C at the default C = 10, whatever
--clients_per_round; FedAvg server lr 1.0); 10 rounds: 27 cells, about 15 minutes
on a quiet 2-core machine. Any flag given explicitly still overrides.
"""

from absl import app
from absl import flags

from reproduction import _runs
from reproduction import table2
from tfbfl import flags as tfbfl_flags

F = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Root of the cell directories and the report.")
flags.DEFINE_list(
    "datasets", None, "Dataset specs name[:partition][:key=value...], e.g. digits:class_dirichlet "
    f"(default: {','.join(table2.DEFAULT_DATASETS)}).")
flags.DEFINE_list(
    "algorithms", None, f"Among {table2.ALGORITHMS} (default: all; with --quick: "
    f"{','.join(table2.QUICK_ALGORITHMS)}).")
flags.DEFINE_list(
    "seeds", None, "Seeds (repeats; each draws its own partition and split; "
    "default 0; with --quick 0,1,2).")
flags.DEFINE_bool(
    "quick", False, "Seeded reduced protocol: one configuration per algorithm, "
    "3 seeds, 10 rounds (flags given explicitly still override).")
flags.DEFINE_list("client_lrs", None, "Client learning rates (default: 5 log-spaced).")
flags.DEFINE_list("kl_weights", None, "VIRTUAL beta values (default: 1e-6,1e-5,1e-4,1e-3).")
flags.DEFINE_list("mus", None, "FedProx proximal strengths > 0 (default: 5 log-spaced).")
flags.DEFINE_list("server_lrs", None, "FedAvg/FedProx server learning rates (default 0.2..1.0).")
flags.DEFINE_list(
    "virtual_server_lrs", None,
    "VIRTUAL damped-EP steps in (0, 1], server and client factors alike "
    "(default 0.2,0.4,0.6,0.8,1.0).")
# Training flags shared by every cell; unset: the dataset preset's, else tfbfl.driver's.
_UNSET = "default: the dataset preset's, else tfbfl.driver's"
flags.DEFINE_integer("rounds", None, _runs.flag_help("rounds", note=_UNSET + "; 10 with --quick"))
flags.DEFINE_integer("epochs_per_round", None, _runs.flag_help("epochs_per_round", note=_UNSET))
flags.DEFINE_integer("clients_per_round", None, _runs.flag_help("clients_per_round", note=_UNSET))
flags.DEFINE_integer("num_clients", None, _runs.flag_help("num_clients", note=_UNSET))
flags.DEFINE_integer("batch_size", None, _runs.flag_help("batch_size", note=_UNSET))
flags.DEFINE_multi_string("fixed", [], "Any other training flag for every cell, name=value.")
flags.DEFINE_bool("report_only", False, "Only write the report from the cells already run.")
flags.mark_flag_as_required("output_dir")


def _floats(values):
  return None if values is None else [float(v) for v in values]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    cells, fixed = table2.plan(F.quick,
                               datasets=F.datasets,
                               algorithms=F.algorithms,
                               fixed_items=F.fixed,
                               params=dict(rounds=F.rounds,
                                           epochs_per_round=F.epochs_per_round,
                                           clients_per_round=F.clients_per_round,
                                           num_clients=F.num_clients,
                                           batch_size=F.batch_size),
                               client_lrs=_floats(F.client_lrs),
                               kl_weights=_floats(F.kl_weights),
                               mus=_floats(F.mus),
                               server_lrs=_floats(F.server_lrs),
                               virtual_server_lrs=_floats(F.virtual_server_lrs),
                               seeds=None if F.seeds is None else [int(s) for s in F.seeds])
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  if F.report_only:
    results = [table2.load_result(c, F.output_dir) for c in cells]
  else:
    results = table2.run_grid(cells, F.output_dir, fixed)
  rows = table2.write_report(F.output_dir, results)
  print(table2.format_table2_md(rows))  # the table and the paper's claims (held / not held)


if __name__ == "__main__":
  tfbfl_flags.run(main, "virtual_table2")

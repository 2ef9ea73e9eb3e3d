r"""The papers' experiments, a few cells at a time, each recorded under results/.

    python -m launchers.reproduce --list                       # every cell, status, estimate
    python -m launchers.reproduce --cells='pfnm/*' --max_hours=2
    python -m launchers.reproduce --cells=virtual/tune/mnist/fedavg
    python -m launchers.reproduce --report                     # tables + figures from the records

Runs the selected cells that have no record yet (or one made with other flags),
one at a time, each as its own launcher process; a finished cell writes
`<results_dir>/<cell name>.json` atomically, so an interrupted invocation loses at
most the cell in flight and the next one carries on. A record whose cell now wants
other flags (a tuning stage chose another setting) is first moved to the cell that
runs exactly its flags, where there is one (`refile`), rather than overwritten. A
training run that the robust rounds stop (a setting that diverges) is recorded as
such, with the rounds it ran, and loses its tuning grid; any other launcher failure
stops the invocation and writes no record. The real data are read from `--data_root`
(`mnist/`, `femnist/`; cells whose folder is missing are skipped with a line naming
it). After running, and with `--report` alone, the report is
rebuilt from the records: `<results_dir>/REPORT.md`, `<results_dir>/figures/*.png`
and the block between the reproduction markers of `--readme`. See
`reproduction/reproduce.py` for the cells, `records.py` for the records and
`runner.py` for the runs.
"""

import os

from absl import app
from absl import flags

from tfbfl import flags as tfbfl_flags
from reproduction import records as records_lib
from reproduction import reproduce
from reproduction import reproduction_report
from reproduction import runner

F = flags.FLAGS
flags.DEFINE_list("cells", ["*"], "Cell names as `--list` prints them, or shell patterns, "
                  "comma-separated (a name also selects the cells below it, e.g. "
                  "virtual/table2/mnist).")
flags.DEFINE_enum("catalogue", "papers", sorted(reproduce.CATALOGUES),
                  "Which cells: the papers' campaign, or three quick digits cells (smoke).")
flags.DEFINE_string("results_dir", "results", "Where the records (and the report) live.")
flags.DEFINE_string("work_dir", "runs/reproduce", "Scratch directory of the cells' runs.")
flags.DEFINE_string("data_root", os.path.join("..", "shared", "data"),
                    "Folder holding mnist/ and femnist/ (see data/README.md).")
flags.DEFINE_bool("list", False, "Print every selected cell with its status and stop.")
flags.DEFINE_bool("report", False, "Only rebuild the report from the records.")
flags.DEFINE_string("readme", "docs/reproduction.md", "The docs page holding the reproduction "
                    "block (between the reproduction markers) that the report rewrites "
                    "(empty: none).")
flags.DEFINE_integer("max_cells", None, "Stop after this many cells.", lower_bound=1)
flags.DEFINE_float("max_hours", None, "Start no cell that would end past this many hours; a "
                   "cell that checkpoints starts while time is left and, at the limit, stops "
                   "after its round in flight with a checkpoint (the next invocation resumes "
                   "it).", lower_bound=0.0)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if F.report and F.list:
    raise ValueError("--report and --list: give one of them.")
  selected = lambda records: reproduce.select(reproduce.catalogue(records, F.catalogue), F.cells)
  records = records_lib.read_records(F.results_dir)
  cells = selected(records)
  readme = F.readme or None
  if readme is not None and not os.path.isfile(readme):
    raise FileNotFoundError(f"--readme={readme}: no such file (empty --readme writes none).")
  if F.list:
    print("\n".join(runner.listing(cells, records, work_dir=F.work_dir)))
    return
  if not F.report:
    try:
      runner.run(cells, results_dir=F.results_dir, work_dir=F.work_dir,
                    data_root=F.data_root, max_cells=F.max_cells, max_hours=F.max_hours,
                    refresh=selected,
                    all_cells=lambda records: reproduce.catalogue(records, F.catalogue))
    except runner.CellFailed as e:
      raise ValueError(str(e)) from None
  reproduction_report.write_report(F.results_dir, readme=readme)
  print(f"reproduce: report written to {os.path.join(F.results_dir, 'REPORT.md')}" +
        (f" and {readme}" if readme else ""))


if __name__ == "__main__":
  tfbfl_flags.run(main, "reproduce")

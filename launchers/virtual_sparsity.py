r"""VIRTUAL Table III: max accuracy at several levels of update sparsity (Sec. IV-F).

    python -m launchers.virtual_sparsity --output_dir=runs/table3 --rounds=10
    python -m launchers.virtual_sparsity --output_dir=runs/table3 --percentiles=0,50,75,90,95
    python -m launchers.virtual_sparsity --output_dir=runs/table3 --report_only

Trains VIRTUAL and "VIRTUAL + FedAvg init" (clients restart from the server
posterior every round) with every client update Delta_i pruned to the entries whose
SNR is above each --percentiles value, and one FedProx run as the dense
reference, each into its own directory under --output_dir (VIRTUAL runs:
`<variant>_p<percentile>`; `fedprox`). Then writes `table3.md` and `table3.csv`
there: per percentile the measured pruned fraction, the mean upload of one client
per round (non-zero entries and bytes) and the max MT and S accuracy of both
variants; FedProx's line below. Runs already finished with the same flags are
reused, so re-running resumes an interrupted table. Defaults: the bundled digits
data and `tfbfl.driver`'s settings.
"""

from absl import app
from absl import flags

from reproduction import virtual_tables as vx
from tfbfl import flags as tfbfl_flags
from tfbfl import runtime

F = flags.FLAGS
vx.define_launcher_flags()
flags.DEFINE_list("percentiles", [f"{p:g}" for p in vx.DEFAULT_PERCENTILES],
                  "SNR percentiles below which Delta_i entries are zeroed (paper: 0,50,75,90).")
flags.DEFINE_bool("fedprox", True, "Also run the FedProx reference line.")
flags.DEFINE_bool("report_only", False, "Only write the table from the runs already finished.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    percentiles = vx.parse_percentiles(F.percentiles)
    _, md = vx.run_sparsity_table(vx.params_from_flags(F),
                                  percentiles,
                                  F.output_dir,
                                  variants=F.variants,
                                  fedprox=F.fedprox,
                                  report_only=F.report_only,
                                  round_progress=F.round_progress)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e)) from e
  finally:
    runtime.shutdown()
  print()
  print(md)
  print(f"(wrote {F.output_dir}/table3.md and table3.csv)")


if __name__ == "__main__":
  tfbfl_flags.run(main, "virtual_sparsity")

r"""VIRTUAL Fig. 4: CDF of the SNR of the clients' posteriors per dense layer.

    python -m launchers.virtual_snr_cdf --output_dir=runs/table3 --rounds=10

Trains VIRTUAL and "VIRTUAL + FedAvg init" (or reuses finished runs of the same
flags under --output_dir, e.g. the unpruned runs of `launchers.virtual_sparsity`),
loads every client's final posterior over the shared weights q_i(theta) from the
run's checkpoint and plots, for each dense layer (kernel of a shared layer), the
empirical CDF of log SNR = log |mu|/sigma pooled over all clients, one curve per
variant. Writes `fig4_snr_cdf.png`, `fig4_snr_cdf.csv` (the curves) and
`fig4_summary.csv` (quantiles of log10 SNR per layer and variant).
"""

from absl import app
from absl import flags

from reproduction import virtual_tables as vx
from tfbfl import flags as tfbfl_flags
from tfbfl import runtime

F = flags.FLAGS
vx.define_launcher_flags()
flags.DEFINE_float(
    "prune_percentile", 0.0, "Pruning percentile of the runs whose posteriors "
    "are plotted (Fig. 4: 0, no pruning).")
flags.DEFINE_integer("num_points", 400, "Grid points of each CDF in the CSV and the plot.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    (percentile,) = vx.parse_percentiles([F.prune_percentile])
    if F.num_points < 2:
      raise ValueError(f"--num_points must be >= 2, got {F.num_points}.")
    result = vx.run_snr_cdf(vx.params_from_flags(F),
                            F.output_dir,
                            percentile=percentile,
                            variants=F.variants,
                            num_points=F.num_points,
                            round_progress=F.round_progress)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e)) from e
  finally:
    runtime.shutdown()
  print()
  print(f"{'layer':>5} {'variant':<22} {'weights':>8} {'q10':>7} {'q25':>7} {'median':>7} "
        f"{'q75':>7} {'q90':>7}   (log10 SNR)")
  for q in result["quantiles"]:
    print(f"{q['layer']:>5} {vx.LABELS[q['variant']]:<22} {q['num_weights']:>8} "
          f"{q['q10_log10_snr']:>7.2f} {q['q25_log10_snr']:>7.2f} {q['q50_log10_snr']:>7.2f} "
          f"{q['q75_log10_snr']:>7.2f} {q['q90_log10_snr']:>7.2f}")
  print(f"(wrote {F.output_dir}/fig4_snr_cdf.png, fig4_snr_cdf.csv, fig4_summary.csv)")


if __name__ == "__main__":
  tfbfl_flags.run(main, "virtual_snr_cdf")

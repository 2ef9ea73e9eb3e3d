r"""PFNM vs the number of batches J (paper Figs. 2 and 3).

    python -m launchers.pfnm_batches --output_dir=/tmp/pfnm_batches --trials=2
    python -m launchers.pfnm_batches --J=10 --partition=homogeneous --output_dir=...

Writes results.csv, results.md (accuracy mean/std and global model size per
method and J), trials.csv, settings.json, fig2_constrained.png and
fig3_extra_resources.png into --output_dir.
"""

from absl import app
from absl import flags

from tfbfl import pfnm_experiments as px
from tfbfl import runtime

FLAGS = flags.FLAGS
px.define_data_flags()
px.define_training_flags()
px.define_matching_flags()
px.define_baseline_flags(px.ONESHOT_METHODS)
flags.DEFINE_list("J", ["2", "5", "10", "15", "20", "25", "30"], "Numbers of batches (clients).")
flags.DEFINE_integer("trials", 10, "Trials (data partitions) per J (paper: 10).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    settings = px.settings_from_flags(FLAGS, px.ONESHOT_METHODS)
    J_values = px.parse_int_list("J", FLAGS.J, minimum=1)
    if FLAGS.trials < 1:
      raise ValueError(f"--trials must be >= 1, got {FLAGS.trials}")
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  runtime.set_local_runtime()
  try:
    px.run_batches(settings, J_values, FLAGS.trials, FLAGS.output_dir)
  except (ValueError, FileNotFoundError) as e:  # bad data files or settings
    raise app.UsageError(str(e)) from e
  finally:
    runtime.shutdown()
  print(f"wrote {FLAGS.output_dir}/results.md")


if __name__ == "__main__":
  app.run(main)

r"""PFNM vs the number of batches J (paper Figs. 2 and 3).

    python -m launchers.pfnm_batches --output_dir=/tmp/pfnm_batches --trials=2
    python -m launchers.pfnm_batches --J=10 --partition=homogeneous --output_dir=...

Writes results.csv, results.md (accuracy mean/std and global model size per
method and J), trials.csv, settings.json, fig2_constrained.png and
fig3_extra_resources.png into --output_dir.
"""

from absl import flags

from tfbfl.experiments import pfnm as px
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
px.define_launcher_flags(px.ONESHOT_METHODS)
flags.DEFINE_list("J", ["2", "5", "10", "15", "20", "25", "30"], "Numbers of batches (clients).")
flags.DEFINE_integer("trials", 10, "Trials (data partitions) per J (paper: 10).")


def main(argv):

  def prepare():
    settings = px.settings_from_flags(FLAGS, px.ONESHOT_METHODS)
    J_values = px.parse_int_list("J", FLAGS.J, minimum=1)
    px.check_at_least_one(trials=FLAGS.trials)
    return lambda: px.run_batches(settings, J_values, FLAGS.trials, FLAGS.output_dir)

  px.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_batches")

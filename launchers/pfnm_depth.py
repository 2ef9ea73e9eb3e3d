r"""PFNM vs the number of hidden layers C at J = 10 (paper Fig. 4).

    python -m launchers.pfnm_depth --output_dir=/tmp/pfnm_depth --trials=2

Writes results.csv, results.md, trials.csv, settings.json and fig4_depth.png
into --output_dir.
"""

from absl import flags

from tfbfl.experiments import pfnm as px
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
px.define_launcher_flags(px.DEPTH_METHODS, hidden_units=False)
flags.DEFINE_list("C", ["1", "2", "3", "4", "5", "6"], "Numbers of hidden layers.")
flags.DEFINE_integer("J", 10, "Number of batches (paper: 10).")
flags.DEFINE_integer("width", 100, "Neurons per hidden layer of every client network.")
flags.DEFINE_integer("trials", 10, "Trials (data partitions) per C (paper: 10).")


def main(argv):

  def prepare():
    settings = px.settings_from_flags(FLAGS, px.DEPTH_METHODS)
    C_values = px.parse_int_list("C", FLAGS.C, minimum=1)
    px.check_at_least_one(J=FLAGS.J, width=FLAGS.width, trials=FLAGS.trials)
    return lambda: px.run_depth(settings, C_values, FLAGS.J, FLAGS.width, FLAGS.trials, FLAGS.
                                output_dir)

  px.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_depth")

r"""Streaming PFNM: J = 3 groups reveal their data in S = 15 steps (supplement 4.2).

    python -m launchers.pfnm_streaming --output_dir=/tmp/pfnm_streaming --trials=2

Writes results.csv, results.md (accuracy per step and method), trials.csv,
settings.json and fig_streaming.png into --output_dir.
"""

from absl import flags

from tfbfl.experiments import pfnm as px
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
px.define_launcher_flags(px.STREAMING_METHODS)
flags.DEFINE_integer("J", 3, "Number of groups (paper: 3).")
flags.DEFINE_integer("steps", 15, "Streaming steps S (paper: 15).")
flags.DEFINE_integer("trials", 10, "Trials (data partitions).")
flags.DEFINE_integer(
    "fresh_neurons", 1, "Neurons of a group's next network initialised at the "
    "prior mean (paper: gamma0 = 1); the rest are drawn from the global network.")
flags.DEFINE_float("init_noise", 0.01, "Std of the noise added to those initial weights.")


def main(argv):

  def prepare():
    settings = px.settings_from_flags(FLAGS, px.STREAMING_METHODS)
    px.check_at_least_one(J=FLAGS.J, steps=FLAGS.steps, trials=FLAGS.trials)
    if FLAGS.init_noise < 0:
      raise ValueError(f"--init_noise must be >= 0, got {FLAGS.init_noise}")
    return lambda: px.run_streaming(settings,
                                    FLAGS.J,
                                    FLAGS.steps,
                                    FLAGS.trials,
                                    FLAGS.output_dir,
                                    fresh_neurons=FLAGS.fresh_neurons,
                                    init_noise=FLAGS.init_noise)

  px.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_streaming")

r"""Streaming PFNM: J = 3 groups reveal their data in S = 15 steps (supplement 4.2).

    python -m launchers.pfnm_streaming --output_dir=/tmp/pfnm_streaming --trials=2

Writes results.csv, results.md (accuracy per step and method), trials.csv,
settings.json and fig_streaming.png into --output_dir.
"""

from absl import flags

from tfbfl.experiments import pfnm_figures as px
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
px.define_launcher_flags(px.STREAMING_METHODS)
# --J, --steps, --trials, --fresh_neurons, --init_noise
px.define_options(px.StreamingOptions, module_name=__name__)


def main(argv):

  def prepare():
    settings = px.settings_from_flags(FLAGS, px.STREAMING_METHODS)
    own = px.options_from_flags(px.StreamingOptions, FLAGS)
    return lambda: px.run_streaming(settings,
                                    own.J,
                                    own.steps,
                                    own.trials,
                                    FLAGS.output_dir,
                                    fresh_neurons=own.fresh_neurons,
                                    init_noise=own.init_noise)

  px.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_streaming")

r"""Streaming PFNM: J = 3 groups reveal their data in S = 15 steps (supplement 4.2).

    python -m launchers.pfnm_streaming --output_dir=/tmp/pfnm_streaming --trials=2

Writes results.csv, results.md (accuracy per step and method), trials.csv,
settings.json and fig_streaming.png into --output_dir. --model=MODULE:FUNCTION
gives the groups' network as a Keras ReLU MLP of one hidden layer (its width
replaces --hidden_units; `tfbfl.algorithms.pfnm`).
"""

from absl import flags

from reproduction import pfnm_figures as px
from reproduction import pfnm_options as po
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
po.define_launcher_flags(po.STREAMING_METHODS)
# --J, --steps, --trials, --fresh_neurons, --init_noise
po.define_options(po.StreamingOptions, module_name=__name__)


def main(argv):

  def prepare():
    settings = po.settings_from_flags(FLAGS, po.STREAMING_METHODS)
    if settings.model is not None and len(settings.hidden_units) != 1:
      raise ValueError(f"--model={settings.model}: streaming PFNM matches one hidden layer; the "
                       f"model has {len(settings.hidden_units)} "
                       f"({','.join(map(str, settings.hidden_units))}).")
    own = po.options_from_flags(po.StreamingOptions, FLAGS)
    return lambda: px.run_streaming(settings,
                                    own.J,
                                    own.steps,
                                    own.trials,
                                    FLAGS.output_dir,
                                    fresh_neurons=own.fresh_neurons,
                                    init_noise=own.init_noise)

  po.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_streaming")

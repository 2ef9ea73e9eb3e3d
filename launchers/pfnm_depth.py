r"""PFNM vs the number of hidden layers C at J = 10 (paper Fig. 4).

    python -m launchers.pfnm_depth --output_dir=/tmp/pfnm_depth --trials=2

Writes results.csv, results.md, trials.csv, settings.json and fig4_depth.png
into --output_dir. The networks are the grid's (--C, --width): --model (the
other PFNM launchers' user network) is refused here.
"""

from absl import flags

from reproduction import pfnm_figures as px
from reproduction import pfnm_options as po
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
po.define_launcher_flags(po.DEPTH_METHODS, hidden_units=False)
po.define_options(po.DepthOptions, module_name=__name__)  # --C, --J, --width, --trials


def main(argv):

  def prepare():
    if FLAGS.model is not None:
      raise ValueError(f"--model={FLAGS.model}: pfnm_depth sweeps the clients' depth (--C) at "
                       "--width neurons per layer, which a model fixes; train your model with "
                       "launchers.pfnm_batches --model instead.")
    settings = po.settings_from_flags(FLAGS, po.DEPTH_METHODS)
    own = po.options_from_flags(po.DepthOptions, FLAGS)
    return lambda: px.run_depth(settings, list(own.C), own.J, own.width, own.trials,
                                FLAGS.output_dir)

  po.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_depth")

r"""PFNM vs the number of batches J (paper Figs. 2 and 3).

    python -m launchers.pfnm_batches --output_dir=/tmp/pfnm_batches --trials=2
    python -m launchers.pfnm_batches --J=10 --partition=homogeneous --output_dir=...

Writes results.csv, results.md (accuracy mean/std and global model size per
method and J), trials.csv, settings.json, fig2_constrained.png and
fig3_extra_resources.png into --output_dir.

The clients' network: --hidden_units, or --model=MODULE:FUNCTION naming a
function that returns a Keras ReLU MLP (Dense layers, linear logits), whose
widths and depth are used (`tfbfl.algorithms.pfnm`; anything else is refused in
one line):

    python -m launchers.pfnm_batches --model=mymodels:mlp --output_dir=...
"""

from absl import flags

from reproduction import pfnm_figures as px
from reproduction import pfnm_options as po
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
po.define_launcher_flags(po.ONESHOT_METHODS)
po.define_options(po.BatchesOptions, module_name=__name__)  # --J, --trials


def main(argv):

  def prepare():
    settings = po.settings_from_flags(FLAGS, po.ONESHOT_METHODS)
    own = po.options_from_flags(po.BatchesOptions, FLAGS)
    return lambda: px.run_batches(settings, list(own.J), own.trials, FLAGS.output_dir)

  po.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_batches")

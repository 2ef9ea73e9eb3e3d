r"""PFNM parameter sensitivity over sigma0^2, gamma0 and sigma^2 (supplement 4.3).

    python -m launchers.pfnm_sensitivity --output_dir=/tmp/pfnm_sens --trials=2
    python -m launchers.pfnm_sensitivity --J=5,10,25 --sigma0_sq_grid=10 --gamma0_grid=1 \
        --sigma_sq_grid=0.03,0.1,0.3,1 --output_dir=...   # Fig. 5

Writes results.csv, results.md, trials.csv, settings.json, fig4_sensitivity.png
and fig5_sigma.png into --output_dir.

--model=MODULE:FUNCTION gives the clients' network as a Keras ReLU MLP (its
widths replace --hidden_units; `tfbfl.algorithms.pfnm`).
"""

from absl import flags

from reproduction import pfnm_figures as px
from reproduction import pfnm_options as po
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
po.define_launcher_flags()
# --J, --trials, --sigma0_sq_grid, --gamma0_grid, --sigma_sq_grid
po.define_options(po.SensitivityOptions, module_name=__name__)


def main(argv):

  def prepare():
    settings = po.settings_from_flags(FLAGS, ("pfnm",))
    own = po.options_from_flags(po.SensitivityOptions, FLAGS)
    grids = [list(own.sigma0_sq_grid), list(own.gamma0_grid), list(own.sigma_sq_grid)]
    return lambda: px.run_sensitivity(settings, list(own.J), own.trials, *grids, FLAGS.output_dir)

  po.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_sensitivity")

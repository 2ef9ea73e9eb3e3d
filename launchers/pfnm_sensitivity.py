r"""PFNM parameter sensitivity over sigma0^2, gamma0 and sigma^2 (supplement 4.3).

    python -m launchers.pfnm_sensitivity --output_dir=/tmp/pfnm_sens --trials=2
    python -m launchers.pfnm_sensitivity --J=5,10,25 --sigma0_sq_grid=10 --gamma0_grid=1 \
        --sigma_sq_grid=0.03,0.1,0.3,1 --output_dir=...   # Fig. 5

Writes results.csv, results.md, trials.csv, settings.json, fig4_sensitivity.png
and fig5_sigma.png into --output_dir.
"""

from absl import flags

from tfbfl.experiments import pfnm as px
from tfbfl import flags as tfbfl_flags

FLAGS = flags.FLAGS
px.define_launcher_flags()
flags.DEFINE_list("J", ["25"], "Numbers of batches (paper: 25).")
flags.DEFINE_integer("trials", 10, "Trials (data partitions) per J.")
flags.DEFINE_list("sigma0_sq_grid", ["1", "10", "100"], "Values of sigma0^2.")
flags.DEFINE_list("gamma0_grid", ["0.1", "1", "10"], "Values of gamma0.")
flags.DEFINE_list("sigma_sq_grid", ["0.03", "0.1", "0.3", "1"], "Values of sigma^2.")


def main(argv):

  def prepare():
    settings = px.settings_from_flags(FLAGS, ("pfnm",))
    J_values = px.parse_int_list("J", FLAGS.J)
    grids = [
        px.parse_float_list(name, FLAGS[name].value)
        for name in ("sigma0_sq_grid", "gamma0_grid", "sigma_sq_grid")
    ]
    px.check_at_least_one(trials=FLAGS.trials)
    return lambda: px.run_sensitivity(settings, J_values, FLAGS.trials, *grids, FLAGS.output_dir)

  px.launcher_main(argv, prepare)


if __name__ == "__main__":
  tfbfl_flags.run(main, "pfnm_sensitivity")

r"""VIRTUAL Fig. 2: the KL multiplier beta sweep (S and MT cross-entropy per round).

    python -m launchers.virtual_fig2 --output_dir=runs/fig2                  # digits
    python -m launchers.virtual_fig2 --output_dir=runs/fig2 --datasets=femnist_mlp \
        --fixed=data_dir=/data/femnist

VIRTUAL only, beta over 1e-6..1 (7 log-spaced values), one client learning rate
(0.05) and one VIRTUAL step (0.1: VIRTUAL's default 1/C at the default C = 10, as
`--quick` of `launchers.virtual_table2`); writes `fig2.png` (one line per beta)
with the Table II report. Same grid machinery as `launchers.virtual_table2`.
"""

from absl import flags

from launchers import virtual_table2
from reproduction import table2
from tfbfl import flags as tfbfl_flags

flags.FLAGS.set_default("datasets", ["digits_dirichlet"])
flags.FLAGS.set_default("algorithms", ["virtual"])
flags.FLAGS.set_default("kl_weights", ["1e-6", "1e-5", "1e-4", "1e-3", "1e-2", "1e-1", "1"])
flags.FLAGS.set_default("client_lrs", ["0.05"])
flags.FLAGS.set_default("virtual_server_lrs",
                        [str(v) for v in table2.QUICK_GRID.virtual_server_lrs])

if __name__ == "__main__":
  tfbfl_flags.run(virtual_table2.main, "virtual_fig2")

r"""VIRTUAL Table IV / Fig. 6: FEMNIST (MLP and conv) with E = 100 epochs per round.

    python -m launchers.virtual_table4 --output_dir=runs/table4 \
        --fixed=data_dir=/data/femnist

Same grid, outputs and resume behaviour as `launchers.virtual_table2`; only the
defaults differ (datasets femnist_mlp,femnist_conv; E = 100; VIRTUAL, FedAvg,
FedProx). Needs the FEMNIST files (data/README.md).
"""

from absl import flags

from launchers import virtual_table2
from tfbfl import flags as tfbfl_flags

flags.FLAGS.set_default("datasets", ["femnist_mlp", "femnist_conv"])
flags.FLAGS.set_default("epochs_per_round", 100)
flags.FLAGS.set_default("algorithms", ["virtual", "fedavg", "fedprox"])

if __name__ == "__main__":
  tfbfl_flags.run(virtual_table2.main, "virtual_table4")

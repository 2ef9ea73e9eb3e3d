r"""VIRTUAL (first version) Table 2: Local, Global, FedAvg and VIRTUAL, MT accuracy
mean ± std over 5 random 25% train/test splits.

    python -m launchers.virtual_v1_table2 --output_dir=runs/v1      # digits stand-ins
    python -m launchers.virtual_v1_table2 --output_dir=runs/v1 \
        --datasets=mnist,pmnist,femnist_mlp,vsn,har --fixed=data_dir=/data/...

Each seed draws its own partition and split. Same grid machinery and report as
`launchers.virtual_table2` (the MT columns are the paper's numbers).
"""

from absl import flags

from launchers import virtual_table2
from tfbfl import flags as tfbfl_flags

flags.FLAGS.set_default("datasets", ["digits_iid", "digits_dirichlet", "digits_permuted"])
flags.FLAGS.set_default("algorithms", ["local", "global", "fedavg", "virtual"])
flags.FLAGS.set_default("seeds", ["0", "1", "2", "3", "4"])

if __name__ == "__main__":
  tfbfl_flags.run(virtual_table2.main, "virtual_v1_table2")

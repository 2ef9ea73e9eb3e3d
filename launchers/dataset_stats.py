"""Prints VIRTUAL Table I statistics of a federated dataset.

  python -m launchers.dataset_stats --dataset=digits --partition=label_dirichlet \
      --num_clients=20 --alpha=0.1
"""

from absl import app
from absl import flags

from tfbfl import data
from tfbfl import flags as tfbfl_flags

_DATASET = flags.DEFINE_string("dataset", "digits", f"Dataset name, one of {tuple(data.DATASETS)}.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Dataset files (for 'npz': the .npz path).")
_PARTITION = flags.DEFINE_enum("partition", "class_dirichlet", list(data.PARTITIONS),
                               "Partition of datasets without natural clients.")
_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 10, "Number of clients.")
_ALPHA = flags.DEFINE_float("alpha", 0.5, "Dirichlet concentration.")
_MIN_SIZE = flags.DEFINE_integer("min_size", 10, "Minimum client size of class_dirichlet.")
_CLASSES_PER_CLIENT = flags.DEFINE_integer("classes_per_client", 2,
                                           "Shards per client of pathological.")
_TEST_FRACTION = flags.DEFINE_float("test_fraction", 0.25,
                                    "Per-client test fraction where there is no split.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of partition and split.")
_SPLIT = flags.DEFINE_enum("split", "train", ["train", "test", "all"],
                           "Split the per-client statistics are computed on.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  fd = data.load_federated(_DATASET.value,
                           data_dir=_DATA_DIR.value,
                           partition=_PARTITION.value,
                           num_clients=_NUM_CLIENTS.value,
                           alpha=_ALPHA.value,
                           min_size=_MIN_SIZE.value,
                           classes_per_client=_CLASSES_PER_CLIENT.value,
                           test_fraction=_TEST_FRACTION.value,
                           seed=_SEED.value)
  print(data.format_table1(fd, split=_SPLIT.value))


if __name__ == "__main__":
  tfbfl_flags.run(main, "dataset_stats")

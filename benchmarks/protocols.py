"""The benchmarks' data protocols: digits and the paper's MNIST (no flags here)."""

import os

from reproduction import presets

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MNIST_DIR = os.path.normpath(os.path.join(_REPO, "..", "shared", "data", "mnist"))
MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def mnist_missing(data_dir):
  """Why MNIST cannot be read from `data_dir`, or None."""
  missing = [f for f in MNIST_FILES if not os.path.exists(os.path.join(data_dir, f))]
  if missing:
    return f"MNIST skipped: {data_dir} lacks {', '.join(missing)}"
  return None


def dataset_params(name, data_dir=DEFAULT_MNIST_DIR, epochs=20):
  """`tfbfl.driver` parameters of the benchmark protocol `name`:

  digits  the bundled stand-in, 10 clients, all 10 a round, E = `epochs`, B = 20;
  mnist   the paper's (VIRTUAL Sec. IV, preset "mnist"): 100 homogeneous clients of
          600 examples, 10 a round, E = `epochs`, B = 20, MLP 784-100-100-10.
  """
  if name == "digits":
    return dict(num_clients=10, clients_per_round=10, epochs_per_round=epochs)
  if name == "mnist":
    return dict(presets.preset("mnist"), data_dir=data_dir, epochs_per_round=epochs)
  raise ValueError(f"--dataset: digits or mnist, got {name!r}.")

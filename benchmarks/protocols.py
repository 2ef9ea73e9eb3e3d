"""The benchmarks' data protocols (digits, the paper's MNIST) and the user-written
Keras models that spell out the presets' networks (no flags here)."""

import os

import tensorflow as tf

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


def abba(sides, repeats):
  """`sides` run `repeats` times each in the order A B B A A B ...: a load that drifts
  steadily over the runs weighs on both sides alike (plain alternation, A B A B, hands
  the drift to the side that runs second)."""
  order = []
  for r in range(repeats):
    order += list(sides) if r % 2 == 0 else list(reversed(sides))
  return order


def user_mlp(input_shape, hidden_units, num_classes):
  """A builder of the preset MLP as a user writes it: `Flatten` (for an image) and
  `Dense` layers, Glorot-normal kernels."""
  def build():
    layers = [tf.keras.Input(tuple(input_shape))]
    if len(input_shape) != 1:
      layers.append(tf.keras.layers.Flatten())
    layers += [tf.keras.layers.Dense(w, activation="relu", kernel_initializer="glorot_normal")
               for w in hidden_units]
    layers.append(tf.keras.layers.Dense(num_classes, kernel_initializer="glorot_normal"))
    return tf.keras.Sequential(layers)
  return build


def user_femnist_conv(input_shape=(28, 28)):
  """VIRTUAL's FEMNIST conv net (Sec. IV-B) as a user writes it."""
  layers = [tf.keras.Input(tuple(input_shape)), tf.keras.layers.Reshape((28, 28, 1))]
  for f in (32, 64):
    layers += [tf.keras.layers.Conv2D(f, 5, padding="same", activation="relu",
                                      kernel_initializer="glorot_normal"),
               tf.keras.layers.MaxPool2D(2)]
  layers += [tf.keras.layers.Flatten(),
             tf.keras.layers.Dense(100, activation="relu", kernel_initializer="glorot_normal"),
             tf.keras.layers.Dense(100, activation="relu", kernel_initializer="glorot_normal"),
             tf.keras.layers.Dense(10, kernel_initializer="glorot_normal")]
  return tf.keras.Sequential(layers)

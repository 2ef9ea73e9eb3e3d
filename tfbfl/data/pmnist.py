"""Permuted MNIST (PMNIST) as in VIRTUAL Sec. V, from the MNIST IDX files.

Files and layout: those of `tfbfl.data.mnist` (the four IDX files in
`data_dir`, with or without `.gz`).

Convention (VIRTUAL: "The MNIST dataset is randomly split into 100 sections
as above, and a random permutation of pixels is applied to every single
client dataset"): the 60000 train images are split homogeneously over
`num_clients` clients (100 in the paper: 600 each), the 10000 official test
images likewise (100 each), and each client draws one uniformly random
permutation of the 784 pixels, applied to both its train and its test images
(`tfbfl.data.partition.permute_features`; no client keeps the identity). The
permutations, the split and the test allocation are all seeded by `seed`.
This is `mnist.load_mnist(partition="permuted")`.
"""

from tfbfl.data import mnist

NUM_CLASSES = mnist.NUM_CLASSES


def load_pmnist(data_dir, *, num_clients=100, seed=0, verify_checksums=False):
  """Returns the PMNIST `FederatedData` (input_shape (28, 28), 10 classes)."""
  return mnist.load_mnist(data_dir,
                          partition="permuted",
                          num_clients=num_clients,
                          seed=seed,
                          verify_checksums=verify_checksums,
                          name="pmnist")

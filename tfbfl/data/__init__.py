"""Federated datasets, partitioners and loaders.

* `FederatedData` / `from_client_arrays`: the data type, and the entry point
  for users bringing their own per-client arrays.
* `load_federated(dataset, ...)`: the registry entry point every launcher uses;
  `DATASETS` (name -> loader) and `PARTITIONS` list what it accepts.
* `partition`: homogeneous, class_dirichlet (PFNM/FedMA), label_dirichlet
  (Hsu et al./FOLA), pathological (McMahan shards), permuted (PMNIST).
* `load_digits_arrays` (bundled, no download), `load_npz` (user files).
* Loaders of the papers' datasets from their published files (no download):
  `load_mnist`, `load_pmnist`, `load_cifar10`, `load_femnist`, `load_har`,
  `load_vsn`, `load_shakespeare` (see data/README.md).
* `dataset_statistics` / `format_table1`: VIRTUAL Table I statistics.
* `RawInput` (`FederatedData.raw_input`): the preprocessing a loader applied to
  the published raw input (MNIST: pixel / 255; FEMNIST: 1 - LEAF's pixel;
  PMNIST: also each client's permutation), applied again by exports.
"""

from tfbfl.data.cifar10 import load_cifar10
from tfbfl.data.digits import load_digits_arrays
from tfbfl.data.errors import MissingDataError
from tfbfl.data.federate import federate_pooled
from tfbfl.data.federated import FederatedData
from tfbfl.data.federated import from_client_arrays
from tfbfl.data.femnist import load_femnist
from tfbfl.data.har import load_har
from tfbfl.data.mnist import load_mnist
from tfbfl.data.npz import load_npz
from tfbfl.data.partition import class_dirichlet
from tfbfl.data.partition import feature_permutations
from tfbfl.data.partition import homogeneous
from tfbfl.data.partition import label_dirichlet
from tfbfl.data.partition import PARTITIONERS
from tfbfl.data.partition import pathological
from tfbfl.data.partition import permute_features
from tfbfl.data.partition import permuted
from tfbfl.data.pmnist import load_pmnist
from tfbfl.data.preprocessing import RawInput
from tfbfl.data.registry import DATASETS
from tfbfl.data.registry import IGNORED_SETTINGS
from tfbfl.data.registry import load_federated
from tfbfl.data.registry import PARTITIONS
from tfbfl.data.registry import register_dataset
from tfbfl.data.safe_pickle import UnsafePickleError
from tfbfl.data.shakespeare import load_shakespeare
from tfbfl.data.spec import DataSpec
from tfbfl.data.stats import dataset_statistics
from tfbfl.data.stats import format_table1
from tfbfl.data.vsn import load_vsn

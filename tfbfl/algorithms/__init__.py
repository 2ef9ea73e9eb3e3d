"""Federated algorithms, one module each, registered by importing them.

`registry.names()` lists what `launchers.train --algorithm` accepts; every module
below declares its settings (`tfbfl.options` fields of its config dataclass) and
registers an `AlgorithmSpec` without importing TensorFlow (it loads when an
algorithm is built). Adding an algorithm: one module, one line here
(docs/adding-an-algorithm.md).
"""

from tfbfl.algorithms import fedavg  # fedavg, fedprox
from tfbfl.algorithms import fedpa  # fedpa
from tfbfl.algorithms import fola  # fola, laplace_offline, fedcurv
from tfbfl.algorithms import local  # local, global
from tfbfl.algorithms import virtual  # virtual

"""tfbfl: TensorFlow-native Bayesian federated learning.

Modules, one idea each:

* `tfbfl.gaussian`    natural-parameter Gaussian algebra (product, ratio, damping, KL).
* `tfbfl.layers`      Bayesian Keras layers (local reparameterization, lateral connections).
* `tfbfl.networks`    server/client network builders, one module per family.
* `tfbfl.aggregators` `tff.aggregators` factories over natural parameters.
* `tfbfl.runtime`     owns the TFF execution context and its worker process.
* `tfbfl.algorithms`  one module per method (VIRTUAL, FedAvg/FedProx, FOLA, ...).
* `tfbfl.matching`    PFNM neuron matching (numpy/scipy).
* `tfbfl.data`        federated datasets, partitioners and loaders.
* `tfbfl.experiment`  the round driver shared by every launcher.
"""

__version__ = "0.1.0"

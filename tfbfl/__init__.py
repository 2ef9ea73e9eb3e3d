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
* `tfbfl.round_loop`  the round loop shared by every launcher; `tfbfl.run_outputs`
                      what a run writes; `tfbfl.checkpoint` the run state's format.
* `tfbfl.predictor`   a model as a plain-TF SavedModel; `tfbfl.export` a run's
                      models; `tfbfl.restore` a run rebuilt from its checkpoint.
* `tfbfl.tff_learning`    the algorithms as `tff.learning` processes.
* `tfbfl.options`, `tfbfl.flags`, `tfbfl.driver`  settings, flags, the driver.
"""

__version__ = "0.1.0"

# TFF's stock context starts a worker_binary that outlives this process: wherever
# tfbfl is imported, TFF computations run only in a context tfbfl installed (or
# raise, naming `tfbfl.runtime.set_local_runtime`). Imports no TensorFlow.
from tfbfl.runtime import guard as _guard  # noqa: E402  pylint: disable=g-import-not-at-top

_guard.install()

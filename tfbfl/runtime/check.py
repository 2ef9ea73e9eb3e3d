"""`check_install`: versions, and one `tff.federated_mean` through an owned worker.

Run as `python -m tfbfl.runtime` (`make check`).
"""

from __future__ import annotations

import sys

import tfbfl
from tfbfl import _lazy
from tfbfl.runtime.local import LocalRuntime

np = _lazy.load("numpy")
tf = _lazy.load("tensorflow")
tfp = _lazy.load("tensorflow_probability")
tff = _lazy.load("tensorflow_federated")


def check_install(stream=sys.stdout) -> float:
  """Prints versions and runs a 3-client `tff.federated_mean`; returns the mean."""
  print(f"python {sys.version.split()[0]}", file=stream)
  for name, module in [("tfbfl", tfbfl), ("tensorflow", tf), ("tensorflow-probability", tfp),
                       ("tensorflow-federated", tff), ("numpy", np)]:
    print(f"{name} {module.__version__}", file=stream)
  print(f"GPUs visible to TensorFlow: {len(tf.config.list_physical_devices('GPU'))}", file=stream)

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def federated_mean(values):
    return tff.federated_mean(values)

  with LocalRuntime(max_concurrent_computation_calls=2) as rt:
    result = float(federated_mean([1.0, 2.0, 6.0]))
    print(
        f"tff.federated_mean([1, 2, 6]) over 3 clients = {result} "
        f"(worker pid {rt.worker.process.pid}, log {rt.worker.log_path})",
        file=stream)
  if abs(result - 3.0) > 1e-6:
    raise RuntimeError(f"federated_mean returned {result}, expected 3.0")
  return result

"""`python -m tfbfl.runtime`: checks the installation (`check.check_install`).

Prints the versions, the GPUs the launcher process's TensorFlow sees, where rounds
run (TFF's worker_binary, scanned for CUDA by `check.scan_for_cuda`) and the result
of a 3-client `tff.federated_mean` computed by an owned worker.
"""

from tfbfl.runtime.check import check_install

if __name__ == "__main__":
  check_install()

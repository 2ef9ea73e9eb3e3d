"""`check_install`: versions, where rounds run, and one `tff.federated_mean` through an
owned worker.

Run as `python -m tfbfl.runtime` (`make check-install`).

Where rounds run is read from the worker binary itself (`scan_for_cuda`): every TFF
computation, i.e. every round's client training and aggregation, runs inside TFF's
`worker_binary`, not in the launcher's TensorFlow. The GPU count that `check_install`
prints is the launcher process's own TensorFlow's, which says nothing about the rounds.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import re
import shutil
import subprocess
import sys
from typing import Optional, Tuple

import tfbfl
from tfbfl import _lazy
from tfbfl.runtime.local import LocalRuntime
from tfbfl.runtime.worker_process import worker_binary_path

np = _lazy.load("numpy")
tf = _lazy.load("tensorflow")
tfp = _lazy.load("tensorflow_probability")
tff = _lazy.load("tensorflow_federated")

# Byte strings that a CUDA-enabled TensorFlow build carries: the CUDA runtime's name
# (`libcudart.so` where it is linked, TF's `cudart_stub.cc` where TF loads it with
# `dlopen`) and TF's GPU device factory (`tensorflow::GPUDeviceFactory`). TensorFlow
# 2.14's own libtensorflow_framework.so.2 holds both; TFF 0.87's worker_binary neither.
# Each is one pass over the file (~0.2 s of CPU for the 300 MB worker_binary).
CUDA_MARKERS = (b"cudart", b"GPUDeviceFactory")
# Names of CUDA / NVIDIA libraries among a binary's dynamic dependencies (`ldd`).
_CUDA_LIBRARY = re.compile(
    r"^lib(cudart|cuda|cublas|cublasLt|cudnn|cufft|curand|cusolver|cusparse|nvrtc|nvidia)\b")
_LDD_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class CudaScan:
  """What `scan_for_cuda` found in one executable.

  Attributes:
    path: the file scanned.
    dependencies: the names of its dynamic dependencies as `ldd` resolved them
      (transitive), or None where `ldd` is missing or could not read the file (the
      byte scan alone then decides).
    cuda_libraries: the CUDA libraries among `dependencies`.
    cuda_markers: the `CUDA_MARKERS` found in the file's bytes.
  """
  path: str
  dependencies: Optional[Tuple[str, ...]]
  cuda_libraries: Tuple[str, ...]
  cuda_markers: Tuple[str, ...]

  @property
  def has_cuda(self) -> bool:
    """Returns whether the file links or references a CUDA runtime."""
    return bool(self.cuda_libraries or self.cuda_markers)

  def evidence(self) -> str:
    """Returns how the verdict was reached, e.g. for `rounds_line`."""
    if self.dependencies is None:
      deps = "ldd unavailable"
    elif self.cuda_libraries:
      deps = "ldd lists " + ", ".join(self.cuda_libraries)
    else:
      deps = f"ldd lists no CUDA library among its {len(self.dependencies)} dependencies"
    if self.cuda_markers:
      found = "its bytes hold " + ", ".join(repr(m) for m in self.cuda_markers)
    else:
      found = "no " + " or ".join(repr(m.decode()) for m in CUDA_MARKERS) + " in its bytes"
    return f"{deps}; {found}"


def _ldd_dependencies(path: str) -> Optional[Tuple[str, ...]]:
  """Returns the library names `ldd path` lists, or None if `ldd` is missing or fails."""
  ldd = shutil.which("ldd")
  if ldd is None:
    return None
  try:
    out = subprocess.run([ldd, path],
                         capture_output=True,
                         text=True,
                         timeout=_LDD_TIMEOUT_S,
                         check=False)
  except (OSError, subprocess.SubprocessError):
    return None
  if out.returncode != 0:  # e.g. "not a dynamic executable"
    return None
  names = []
  for line in out.stdout.splitlines():
    fields = line.split()
    if fields and fields[0] != "statically":
      names.append(fields[0].rsplit("/", 1)[-1])
  return tuple(names)


def _markers_in_file(path: str) -> Tuple[str, ...]:
  """Returns the `CUDA_MARKERS` present in the bytes of `path`, decoded, in their order."""
  with open(path, "rb") as f:
    try:
      data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # an empty file cannot be mapped
      return ()
    with data:
      return tuple(m.decode() for m in CUDA_MARKERS if data.find(m) != -1)


def scan_for_cuda(path: str) -> CudaScan:
  """Checks whether the executable `path` can use CUDA.

  Two checks, both read from the file: the names of its dynamic dependencies
  (`ldd`, skipped where `ldd` is missing or fails) and the bytes of the file itself
  (`CUDA_MARKERS`; TensorFlow loads CUDA with `dlopen`, so a CUDA-enabled TF build
  lists no CUDA library in its ELF dependencies but holds these strings). A library
  that the file loads only through another library's `dlopen` is not followed.
  About 0.5 s of CPU for TFF's 300 MB `worker_binary`.

  Args:
    path: an executable or shared library.

  Returns:
    A `CudaScan`; `has_cuda` is False when neither check finds CUDA.
  """
  dependencies = _ldd_dependencies(path)
  libraries = tuple(d for d in dependencies or () if _CUDA_LIBRARY.match(d))
  return CudaScan(path=path,
                  dependencies=dependencies,
                  cuda_libraries=libraries,
                  cuda_markers=_markers_in_file(path))


def rounds_line(scan: CudaScan) -> str:
  """Returns the line saying where rounds run, from `scan` of the TFF worker binary."""
  if scan.has_cuda:
    return (f"rounds: TFF worker_binary at {scan.path}, references CUDA ({scan.evidence()}): "
            "rounds may run on a GPU")
  return (f"rounds: TFF worker_binary at {scan.path}, CPU only (links no CUDA runtime: "
          f"{scan.evidence()})")


def check_install(stream=sys.stdout) -> float:
  """Prints versions and where rounds run, then runs a 3-client `tff.federated_mean`.

  Args:
    stream: where the lines go.

  Returns:
    The mean computed by the worker (3.0).

  Raises:
    RuntimeError: the worker returned another value.
  """
  print(f"python {sys.version.split()[0]}", file=stream)
  for name, module in [("tfbfl", tfbfl), ("tensorflow", tf), ("tensorflow-probability", tfp),
                       ("tensorflow-federated", tff), ("numpy", np)]:
    print(f"{name} {module.__version__}", file=stream)
  print(
      "GPUs visible to the launcher process's TensorFlow (not where rounds run): "
      f"{len(tf.config.list_physical_devices('GPU'))}",
      file=stream)
  print(rounds_line(scan_for_cuda(worker_binary_path())), file=stream)

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def federated_mean(values):
    return tff.federated_mean(values)

  with LocalRuntime(max_concurrent_computation_calls=2) as rt:
    result = float(federated_mean([1.0, 2.0, 6.0]))
    print(
        f"tff.federated_mean([1, 2, 6]) over 3 clients = {result} "
        f"(worker pid {rt.worker.process.pid}, {rt.worker.isolation} isolation)",
        file=stream)
    log_path = rt.worker.log_path
  # Kept when the worker wrote something (as with TF_CPP_MIN_LOG_LEVEL=0).
  print(f"the worker's log: {log_path}" if os.path.isfile(log_path) else
        "the worker's log was empty (removed)", file=stream)
  if abs(result - 3.0) > 1e-6:
    raise RuntimeError(f"federated_mean returned {result}, expected 3.0")
  return result

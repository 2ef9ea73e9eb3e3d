"""Owns the TFF execution context and every process it starts.

TFF's stock local C++ context (`tff.backends.native.set_sync_local_cpp_execution_context`)
starts a `worker_binary` process that inherits the parent's stdout/stderr, is not
reliably ended at interpreter exit and is waited for with no timeout. An orphaned
worker keeps the pipe open, so `python run.py | tee log` (and a CI job) hangs after
Python has finished. This module builds the same context from TFF's public framework
pieces instead:

    worker_binary --port=P   (stdout/stderr -> log file, SIGKILL when the parent dies)
        ^ gRPC
    tff.framework.RemoteExecutorGrpcStub -> tff.framework.RemoteExecutor
        -> tff.framework.ResourceManagingExecutorFactory
        -> tff.framework.SyncExecutionContext (installed as the default context)

Guarantees:

* the worker's output goes to `<log_dir>/tff_worker_<pid>.log`, never to our stdout;
* the worker is started with `PR_SET_PDEATHSIG = SIGKILL` (Linux), so it dies with
  its parent even on `kill -9`; it is also terminated by `LocalRuntime.close()`, by
  an `atexit` hook and by a `weakref.finalize` of the runtime;
* start-up waits at most `startup_timeout_s`; if the worker exits or never becomes
  ready, a `RuntimeError` names the binary, the port and quotes the log tail;
* every call re-checks that the worker is alive before building an executor, so a
  crashed worker raises a clear error instead of hanging.

Typical use (launchers and tests do exactly this):

    from tfbfl import runtime
    runtime.set_local_runtime(max_concurrent_computation_calls=2)
    ...  # invoke tff computations
    runtime.shutdown()   # optional: atexit does it too
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Optional

import grpc
import portpicker

_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ("grpc.max_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE_BYTES),
]
_PR_SET_PDEATHSIG = 1


def worker_binary_path() -> str:
  """Path of the `worker_binary` shipped inside the installed TFF wheel."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  path = os.path.join(os.path.dirname(tff.__file__), "data", "worker_binary")
  if not os.path.isfile(path):
    raise RuntimeError(
        f"TFF worker binary not found at {path}; reinstall "
        "tensorflow-federated==0.87.0 (see BUILD.md)."
    )
  return path


def _die_with_parent() -> None:
  """`preexec_fn`: ask the kernel to SIGKILL the child when its parent dies."""
  try:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:  # Not Linux: the atexit/finalize hooks still apply.
    pass


def _terminate(process: Optional[subprocess.Popen], timeout_s: float = 5.0) -> None:
  """SIGTERM, then SIGKILL after `timeout_s`; always reaps the process."""
  if process is None or process.poll() is not None:
    return
  try:
    process.terminate()
    process.wait(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()
  except ProcessLookupError:
    pass


def _log_tail(path: str, num_bytes: int = 2000) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - num_bytes))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return "<no log>"


class WorkerProcess:
  """One `worker_binary` executor service on localhost, owned by this process.

  Args:
    max_concurrent_computation_calls: passed to the worker; the maximum number of
      concurrent calls to one computation (client computations run in parallel up
      to this number). Non-positive means no limit.
    log_dir: directory for the worker's log file (default: the system temp dir).
    startup_timeout_s: how long to wait for the worker to accept gRPC calls.
    port: port to serve on (default: a free port picked by portpicker).
  """

  def __init__(
      self,
      *,
      max_concurrent_computation_calls: int = -1,
      log_dir: Optional[str] = None,
      startup_timeout_s: float = 60.0,
      port: Optional[int] = None,
  ):
    if startup_timeout_s <= 0:
      raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s}.")
    self.binary = worker_binary_path()
    self.port = port or portpicker.pick_unused_port()
    log_dir = log_dir or tempfile.gettempdir()
    os.makedirs(log_dir, exist_ok=True)
    self.log_path = os.path.join(log_dir, f"tff_worker_{os.getpid()}_{self.port}.log")
    self._log_file = open(self.log_path, "ab")  # pylint: disable=consider-using-with
    args = [
        self.binary,
        f"--port={self.port}",
        f"--max_concurrent_computation_calls={max_concurrent_computation_calls}",
    ]
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        args,
        stdin=subprocess.DEVNULL,
        stdout=self._log_file,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
        close_fds=True,
    )
    self._finalizer = weakref.finalize(self, _terminate, self.process)
    self.channel = grpc.insecure_channel(f"localhost:{self.port}", _GRPC_OPTIONS)
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    self.stub = tff.framework.RemoteExecutorGrpcStub(self.channel)
    self._wait_ready(startup_timeout_s)

  def _wait_ready(self, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
      self.check_alive()
      try:
        grpc.channel_ready_future(self.channel).result(timeout=0.5)
        return
      except grpc.FutureTimeoutError:
        pass
      if time.monotonic() > deadline:
        self.close()
        raise RuntimeError(
            f"TFF worker {self.binary} on port {self.port} did not become ready "
            f"within {timeout_s:.0f} s. Log {self.log_path}:\n{_log_tail(self.log_path)}"
        )

  def alive(self) -> bool:
    return self.process.poll() is None

  def check_alive(self) -> None:
    """Raises RuntimeError (with the worker's log tail) if the worker has exited."""
    code = self.process.poll()
    if code is not None:
      raise RuntimeError(
          f"TFF worker {self.binary} on port {self.port} exited with code {code}. "
          f"Log {self.log_path}:\n{_log_tail(self.log_path)}"
      )

  def close(self) -> None:
    try:
      self.channel.close()
    except Exception:  # pylint: disable=broad-except
      pass
    self._finalizer()  # Terminates and reaps; idempotent.
    if not self._log_file.closed:
      self._log_file.close()


class LocalRuntime:
  """The local TFF C++ runtime with an owned worker, installed as default context.

  Args:
    max_concurrent_computation_calls: how many client computations the worker
      runs at once. Default: the number of CPU cores (more oversubscribes the cores:
      on 2 cores, 10 concurrent XLA-compiled VIRTUAL clients ran 2.6x slower than
      2). `-1`: unlimited.
    default_num_clients: cardinality used when a computation's arguments do not
      determine the number of clients.
    log_dir: where the worker writes its log (default: system temp dir).
    startup_timeout_s: start-up deadline for the worker.
  """

  def __init__(
      self,
      *,
      max_concurrent_computation_calls: Optional[int] = None,
      default_num_clients: int = 0,
      log_dir: Optional[str] = None,
      startup_timeout_s: float = 60.0,
  ):
    if default_num_clients < 0:
      raise ValueError(f"default_num_clients must be >= 0, got {default_num_clients}.")
    if max_concurrent_computation_calls is None:
      max_concurrent_computation_calls = os.cpu_count() or 1
    self._options = dict(
        max_concurrent_computation_calls=max_concurrent_computation_calls,
        log_dir=log_dir,
        startup_timeout_s=startup_timeout_s,
    )
    self.default_num_clients = default_num_clients
    self.worker: Optional[WorkerProcess] = None
    self.context = None
    self.requested = None  # kwargs given to set_local_runtime, if started there
    self._previous_context = None
    self._lock = threading.Lock()

  def start(self) -> "LocalRuntime":
    """Starts the worker (in the calling thread) and installs the context."""
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    if self.worker is not None:
      return self
    # Started here, in the caller's (main) thread: PR_SET_PDEATHSIG fires when the
    # *thread* that forked exits, so the worker must not be forked lazily from
    # TFF's event-loop thread.
    self.worker = WorkerProcess(**self._options)

    def stack_fn(cardinalities):
      with self._lock:
        if self.worker is None:
          raise RuntimeError("tfbfl runtime was shut down; call start() again.")
        self.worker.check_alive()
        stub = self.worker.stub
      if cardinalities.get(tff.CLIENTS) is None:
        cardinalities[tff.CLIENTS] = self.default_num_clients
      executor = tff.framework.RemoteExecutor(stub)
      executor.set_cardinalities(cardinalities)
      return executor

    factory = tff.framework.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn)
    self.context = tff.framework.SyncExecutionContext(
        executor_fn=factory,
        compiler_fn=tff.backends.native.desugar_and_transform_to_native,
        transform_args=tff.tensorflow.transform_args,
        transform_result=tff.tensorflow.transform_result,
    )
    self._previous_context = tff.framework.get_context_stack().current
    tff.framework.set_default_context(self.context)
    return self

  def close(self) -> None:
    """Terminates the worker and, if this runtime's context is still TFF's
    default, reinstates the one it replaced. Safe to call more than once."""
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    with self._lock:
      worker, self.worker = self.worker, None
    if worker is not None:
      worker.close()
      stack = tff.framework.get_context_stack()
      if self.context is not None and stack.current is self.context and self._previous_context:
        tff.framework.set_default_context(self._previous_context)

  def __enter__(self) -> "LocalRuntime":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()


_RUNTIME: Optional[LocalRuntime] = None


def set_local_runtime(**kwargs) -> LocalRuntime:
  """Starts (once) the process-wide local runtime and makes it TFF's default.

  Calling again with the same options returns the running runtime; with other
  options the old worker is stopped and a new one started.
  """
  global _RUNTIME
  if _RUNTIME is not None and _RUNTIME.worker is not None:
    if _RUNTIME.requested == kwargs:
      # Another runtime may have replaced the default context meanwhile.
      import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

      tff.framework.set_default_context(_RUNTIME.context)
      return _RUNTIME
    _RUNTIME.close()
  _RUNTIME = LocalRuntime(**kwargs).start()
  _RUNTIME.requested = dict(kwargs)
  return _RUNTIME


def shutdown() -> None:
  """Stops the process-wide runtime's worker (registered with atexit)."""
  global _RUNTIME
  if _RUNTIME is not None:
    _RUNTIME.close()
    _RUNTIME = None


atexit.register(shutdown)


def check_install(stream=sys.stdout) -> float:
  """Prints versions and runs a 3-client `tff.federated_mean`; returns the mean."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  import tensorflow_probability as tfp  # pylint: disable=g-import-not-at-top

  import tfbfl  # pylint: disable=g-import-not-at-top

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
    print(f"tff.federated_mean([1, 2, 6]) over 3 clients = {result} "
          f"(worker pid {rt.worker.process.pid}, log {rt.worker.log_path})", file=stream)
  if abs(result - 3.0) > 1e-6:
    raise RuntimeError(f"federated_mean returned {result}, expected 3.0")
  return result


if __name__ == "__main__":
  check_install()

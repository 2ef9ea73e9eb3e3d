"""`WorkerProcess`: one `worker_binary` executor service owned by this process.

The binary's output goes to a log file, never to our stdout; it dies with us
(`lifetime`), is kept off the network (`isolation`), and start-up waits at most
`startup_timeout_s`, after which a `RuntimeError` quotes the log's tail.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from typing import Optional

import grpc
import portpicker

from tfbfl import _lazy
from tfbfl.runtime import channels
from tfbfl.runtime import isolation as isolation_lib
from tfbfl.runtime import lifetime

# Imported on first use (`WorkerProcess.stub`), so that `tfbfl-worker` never imports TFF.
tff = _lazy.load("tensorflow_federated")


def worker_binary_path() -> str:
  """Path of the `worker_binary` shipped inside the installed TFF wheel.

  Found without importing TFF (and TensorFlow), so `tfbfl-worker` starts fast
  and stays small.
  """
  spec = importlib.util.find_spec("tensorflow_federated")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("tensorflow-federated is not installed; see BUILD.md.")
  path = os.path.join(list(spec.submodule_search_locations)[0], "data", "worker_binary")
  if not os.path.isfile(path):
    raise RuntimeError(f"TFF worker binary not found at {path}; reinstall "
                       "tensorflow-federated==0.87.0 (see BUILD.md).")
  return path


def short_tmp() -> str:
  """A temp dir whose paths fit a Unix socket address (108 bytes)."""
  tmp = tempfile.gettempdir()
  return tmp if len(tmp) < 60 else "/tmp"


def _end(process: subprocess.Popen, log_file, *, sock_dir: Optional[str],
         discard_empty_log: bool) -> None:
  """Ends the worker (`lifetime.terminate`) and closes its log. An empty log in the
  temp dir (`discard_empty_log`) says nothing once we end a live worker, so it is
  removed (else one file a run piles up there). A worker that exited on its own keeps
  its log, which `check_alive`'s error names."""
  ended_by_us = process.poll() is None
  try:
    lifetime.terminate(process, sock_dir=sock_dir)
  finally:
    log_file.close()
    if discard_empty_log and ended_by_us:
      try:
        if os.path.getsize(log_file.name) == 0:
          os.remove(log_file.name)
      except OSError:
        pass


class WorkerExited(RuntimeError):
  """The owned `worker_binary` exited while its runtime was in use (it crashed, or
  something killed it); `code` is its exit status: for a signal, 128 + its number
  through the netns bridge (`isolation`), minus its number otherwise."""

  def __init__(self, code: int, message: str):
    super().__init__(message)
    self.code = code


class WorkerProcess:
  """One `worker_binary` executor service owned by this process, reachable only
  from this machine.

  Isolation (`resolve_isolation`): "netns" (default where possible) runs the
  binary in a private network namespace, reachable only through a Unix socket in
  a 0700 directory (no TCP port on the machine at all); "loopback" makes it bind
  127.0.0.1 only; "none" (explicit opt-out) leaves it on every interface.

  Args:
    max_concurrent_computation_calls: passed to the worker; the maximum number of
      concurrent calls to one computation (client computations run in parallel up
      to this number). Non-positive means no limit.
    log_dir: directory for the worker's log file (default: the system temp dir).
    startup_timeout_s: how long to wait for the worker to accept gRPC calls.
    port: the binary's port ("loopback", "none"; default: a free port).
    log_path: the log file (default: `<log_dir>/tff_worker_<pid>_<n>.log`). Only the
      default (neither `log_dir` nor `log_path` given) is removed when the worker is
      ended (`close()`, garbage collection, exit), and only if it is empty and the
      worker was running until then.
    isolation: "auto", "netns", "loopback" or "none" (default: `$TFBFL_WORKER_ISOLATION`
      or "auto").

  Attributes:
    address: the gRPC target of the service ("unix:/..." or "127.0.0.1:PORT").
  """

  def __init__(
      self,
      *,
      max_concurrent_computation_calls: int = -1,
      log_dir: Optional[str] = None,
      startup_timeout_s: float = 60.0,
      port: Optional[int] = None,
      log_path: Optional[str] = None,
      isolation: Optional[str] = None,
  ):
    if startup_timeout_s <= 0:
      raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s}.")
    self.binary = worker_binary_path()
    lifetime.libc()  # Loaded here, not in the child (see `lifetime.libc`).
    self.isolation = isolation_lib.resolve_isolation(isolation)
    self._sock_dir = None
    env = dict(os.environ)
    if self.isolation == "netns":
      self.port = isolation_lib.INNER_PORT
      self._sock_dir = tempfile.mkdtemp(prefix="tfbfl-w-", dir=short_tmp())
      sock_path = os.path.join(self._sock_dir, "worker.sock")
      self.address = f"unix:{sock_path}"
      args = isolation_lib.bridge_command(self.binary, self.port, sock_path,
                                          max_concurrent_computation_calls)
      preexec = isolation_lib.enter_private_network
      name = f"{os.getpid()}_{os.path.basename(self._sock_dir)}"
    else:
      self.port = port or portpicker.pick_unused_port()
      host = "127.0.0.1" if self.isolation == "loopback" else "localhost"
      self.address = f"{host}:{self.port}"
      args = [
          self.binary, f"--port={self.port}",
          f"--max_concurrent_computation_calls={max_concurrent_computation_calls}"
      ]
      if self.isolation == "loopback":
        env["LD_PRELOAD"] = " ".join(
            filter(None, [isolation_lib.loopback_shim(),
                          env.get("LD_PRELOAD")]))
      preexec = lifetime.die_with_parent
      name = f"{os.getpid()}_{self.port}"
    self.log_path = log_path or os.path.join(log_dir or tempfile.gettempdir(),
                                             f"tff_worker_{name}.log")
    os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
    self._log_file = open(self.log_path, "ab")  # pylint: disable=consider-using-with
    try:
      self.process = subprocess.Popen(  # pylint: disable=consider-using-with
          args,
          stdin=subprocess.DEVNULL,
          stdout=self._log_file,
          stderr=subprocess.STDOUT,
          preexec_fn=preexec,
          close_fds=True,
          env=env)
    except BaseException:
      self._log_file.close()
      self._remove_sock_dir()
      raise
    # Also run by weakref's atexit hook, which comes before `process_wide.shutdown`.
    self._finalizer = weakref.finalize(self,
                                       _end,
                                       self.process,
                                       self._log_file,
                                       sock_dir=self._sock_dir,
                                       discard_empty_log=log_path is None and log_dir is None)
    self.channel = grpc.insecure_channel(self.address, channels.LOCAL_WORKER_OPTIONS)
    self._stub = None
    self._wait_ready(startup_timeout_s)

  def _remove_sock_dir(self) -> None:
    if self._sock_dir:
      shutil.rmtree(self._sock_dir, ignore_errors=True)

  @property
  def stub(self):
    """`tff.framework.RemoteExecutorGrpcStub` on this worker (built on first use,
    so that `tfbfl-worker` never imports TFF)."""
    if self._stub is None:
      self._stub = tff.framework.RemoteExecutorGrpcStub(self.channel)
    return self._stub

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
        log = lifetime.log_tail(self.log_path)
        self.close()
        raise RuntimeError(
            f"TFF worker {self.binary} at {self.address} did not become ready "
            f"within {timeout_s:.0f} s. " +
            (f"Log {self.log_path}:\n{log}" if log else "It wrote nothing."))

  def alive(self) -> bool:
    return self.process.poll() is None

  def check_alive(self) -> None:
    """Raises `WorkerExited` (with the worker's log tail) if the worker has exited."""
    code = self.process.poll()
    if code is not None:
      raise WorkerExited(code, f"TFF worker {self.binary} at {self.address} exited with code "
                         f"{code}. Log {self.log_path}:\n{lifetime.log_tail(self.log_path)}")

  def close(self) -> None:
    try:
      self.channel.close()
    except Exception:  # pylint: disable=broad-except
      pass
    self._finalizer()  # Terminates and reaps, closes the log; idempotent.

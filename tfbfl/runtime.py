"""Owns the TFF execution context and every process it starts.

TFF's stock local C++ context (`tff.backends.native.set_sync_local_cpp_execution_context`)
starts a `worker_binary` process that inherits the parent's stdout/stderr, is not
reliably ended at interpreter exit and is waited for with no timeout. An orphaned
worker keeps the pipe open, so `python run.py | tee log` (and a CI job) hangs after
Python has finished. This module builds the same context from TFF's public framework
pieces instead:

    worker_binary --port=P   (stdout/stderr -> log file, SIGKILL when the parent dies;
        ^                     in a private network namespace, see below)
        | gRPC over a Unix socket in a 0700 directory (relayed inside the namespace)
    tff.framework.RemoteExecutorGrpcStub -> tff.framework.RemoteExecutor
        -> tff.framework.ResourceManagingExecutorFactory
        -> tff.framework.SyncExecutionContext (installed as the default context)

Guarantees:

* nothing listens on the network: `worker_binary` always serves on every
  interface, so it runs in new user + network namespaces whose only interface is
  loopback, reached through a Unix socket only this user can open ("netns"); where
  the kernel refuses namespaces, an LD_PRELOAD shim makes it bind 127.0.0.1 only
  ("loopback"); with neither, start-up fails naming both fixes, unless
  `TFBFL_WORKER_ISOLATION=none` asks for the stock open binary (`resolve_isolation`);
* the worker's output goes to `<log_dir>/tff_worker_<pid>_<n>.log`, never to our stdout;
* the worker is started with `PR_SET_PDEATHSIG = SIGKILL` (Linux), so it dies with
  its parent even on `kill -9`; it is also terminated by `LocalRuntime.close()`, by
  an `atexit` hook and by a `weakref.finalize` of the runtime; it runs in a process
  group of its own, so a terminal's Ctrl-C interrupts the parent, which then ends it;
* start-up waits at most `startup_timeout_s`; if the worker exits or never becomes
  ready, a `RuntimeError` names the binary, its address and quotes the log tail;
* every call re-checks that the worker is alive before building an executor, so a
  crashed worker raises a clear error instead of hanging.

Typical use (launchers and tests do exactly this):

    from tfbfl import runtime
    runtime.set_local_runtime(max_concurrent_computation_calls=2)
    ...  # invoke tff computations
    runtime.shutdown()   # optional: atexit does it too

Remote mode (several machines; see BUILD.md, "Running on several machines"): each
worker machine runs `tfbfl-worker --port=P` (`tfbfl.worker`; 127.0.0.1 unless
`--host`, TLS with `--tls_cert --tls_key [--tls_client_ca]`), and the controller

    runtime.set_runtime("remote", workers=["host1:8000", "host2:8000"])
    # TLS: ..., tls_ca="ca.pem", tls_cert="controller.pem", tls_key="controller.key")
    # or: with runtime.RemoteRuntime(["host1:8000", "host2:8000"]): ...

installs TFF's mergeable context over one sync context per worker
(`DeadlineGrpcStub` -> `RemoteExecutor` -> `ResourceManagingExecutorFactory` ->
`SyncExecutionContext`, invoked in a thread per worker); a round's clients are
split across the workers. Every RPC has a deadline and a failed worker raises
`WorkerError` naming it; a hung one within one `call_timeout_s`. `set_runtime("local")` is `set_local_runtime()`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import ctypes
import dataclasses
import fcntl
import inspect
import importlib.util
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Optional, Sequence

import grpc
import portpicker

from tfbfl import options

_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [
    ("grpc.max_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE_BYTES),
]
_PR_SET_PDEATHSIG = 1


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


_LIBC = []


def _libc():
  """libc, loaded in the parent: a `preexec_fn` runs between fork and exec of a
  multi-threaded process and must not dlopen (or import) anything itself."""
  if not _LIBC:
    try:
      _LIBC.append(ctypes.CDLL("libc.so.6", use_errno=True))
    except OSError:  # Not Linux.
      _LIBC.append(None)
  return _LIBC[0]


def _die_with_parent() -> None:
  """`preexec_fn`: ask the kernel to SIGKILL the child when its parent dies, and
  leave the parent's process group, so a Ctrl-C at the terminal reaches only the
  parent: the worker keeps serving while the interrupted run reports and saves,
  then the parent's own hooks end it (a worker killed by the same Ctrl-C made
  TFF's executor thread log gRPC retries before the interruption was handled)."""
  os.setpgid(0, 0)
  libc = _LIBC[0] if _LIBC else None
  if libc is not None:  # Elsewhere the atexit/finalize hooks still apply.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _terminate(process: Optional[subprocess.Popen],
               timeout_s: float = 5.0,
               sock_dir: Optional[str] = None) -> None:
  """SIGTERM, then SIGKILL after `timeout_s`; always reaps the process and
  removes its socket directory."""
  try:
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
  finally:
    if sock_dir:
      import shutil  # pylint: disable=g-import-not-at-top

      shutil.rmtree(sock_dir, ignore_errors=True)


def _log_tail(path: str, num_bytes: int = 2000) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - num_bytes))
      return f.read().decode("utf-8", "replace")
  except OSError:
    return "<no log>"


# ------------------------------------------------- isolating worker_binary
# `worker_binary` takes only `--port` and always serves on "[::]:PORT", i.e. on
# every interface, unauthenticated. TFF 0.87's wheel has no in-process C++
# executor bindings, so the binary cannot be avoided. Instead it runs in a private
# network namespace (Linux user + network namespaces; no root needed) whose only
# interface is its own loopback: nothing outside can reach the port. A small
# bridge process inside the namespace, started by us, relays a Unix socket in a
# 0700 directory of ours to that port, so only our user can talk to the worker.
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
ISOLATION_ENV = "TFBFL_WORKER_ISOLATION"
_ISOLATIONS = ("auto", "netns", "loopback", "none")
_INNER_PORT = 10000  # Free in a fresh namespace.

# Runs inside the namespace: starts the binary, waits for its port, relays the
# Unix socket to it, and ends (taking the binary with it) on SIGTERM, when the
# binary exits (same exit code) or when its parent dies (PR_SET_PDEATHSIG).
_BRIDGE_SOURCE = r"""
import ctypes, os, signal, socket, subprocess, sys, threading, time
binary, port, sock_path, max_calls = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def pdeath():
  ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)
child = subprocess.Popen([binary, "--port=%d" % port,
                          "--max_concurrent_computation_calls=" + max_calls],
                         stdin=subprocess.DEVNULL, preexec_fn=pdeath)
stopping = []
def stop(signum, frame):
  stopping.append(signum)
  child.terminate()
  try:
    child.wait(5)
  except subprocess.TimeoutExpired:
    child.kill()
  os._exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
def watch():
  code = child.wait()
  os._exit(0 if stopping else code if code >= 0 else 128 - code)
threading.Thread(target=watch, daemon=True).start()
while True:
  try:
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    break
  except OSError:
    time.sleep(0.1)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sock_path + ".tmp")
os.rename(sock_path + ".tmp", sock_path)
listener.listen(64)
def pump(src, dst):
  try:
    while True:
      data = src.recv(1 << 20)
      if not data:
        break
      dst.sendall(data)
  except OSError:
    pass
  for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
    try:
      s.shutdown(how)
    except OSError:
      pass
def relay(conn):
  try:
    up = socket.create_connection(("127.0.0.1", port))
  except OSError:
    conn.close()
    return
  for s in (conn, up):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 21)
  up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  t = threading.Thread(target=pump, args=(up, conn), daemon=True)
  t.start()
  pump(conn, up)
  t.join()
  conn.close()
  up.close()
while True:
  conn, _ = listener.accept()
  threading.Thread(target=relay, args=(conn,), daemon=True).start()
"""

# LD_PRELOAD shim for the "loopback" isolation: rewrites a wildcard bind() to
# 127.0.0.1 (IPv6 sockets: ::ffff:127.0.0.1, the IPv4 loopback only).
_SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static int (*real)(int, const struct sockaddr *, socklen_t);
  if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
  if (addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return real(fd, (const struct sockaddr *)&a, sizeof a);
  }
  if (addr && addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      int off = 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      static const unsigned char v4lo[16] = {0,0,0,0,0,0,0,0,0,0,0xff,0xff,127,0,0,1};
      memcpy(&a.sin6_addr, v4lo, 16);
    }
    return real(fd, (const struct sockaddr *)&a, sizeof a);
  }
  return real(fd, addr, len);
}
"""


def _enter_private_network() -> None:
  """`preexec_fn`: dies with its parent, then moves into new user + network
  namespaces (loopback up, nothing else). Raises OSError where the kernel refuses."""
  _die_with_parent()
  libc = _LIBC[0] if _LIBC else None
  if libc is None:
    raise OSError("no libc.so.6: network namespaces need Linux")
  uid, gid = os.getuid(), os.getgid()
  if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
    with open("/proc/self/uid_map", "w") as f:
      f.write(f"0 {uid} 1")
    with open("/proc/self/setgroups", "w") as f:
      f.write("deny")
    with open("/proc/self/gid_map", "w") as f:
      f.write(f"0 {gid} 1")
  elif libc.unshare(_CLONE_NEWNET) != 0:  # Root without user namespaces.
    errno = ctypes.get_errno()
    raise OSError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}")
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0)))[1]
    fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


_NETNS_OK = None


def _netns_available() -> bool:
  """Whether this kernel lets us start a process in a private network namespace
  (probed once, with a trivial child)."""
  global _NETNS_OK
  if _NETNS_OK is None:
    _libc()
    try:
      subprocess.run([sys.executable, "-S", "-c", ""],
                     preexec_fn=_enter_private_network,
                     check=True,
                     stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL,
                     timeout=30)
      _NETNS_OK = True
    except (subprocess.SubprocessError, OSError):
      _NETNS_OK = False
  return _NETNS_OK


def _loopback_shim() -> Optional[str]:
  """The LD_PRELOAD shim, compiled once into the user's cache; None without a C
  compiler."""
  import hashlib  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top

  digest = hashlib.sha256(_SHIM_SOURCE.encode()).hexdigest()[:16]
  cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfbfl")
  path = os.path.join(cache, f"loopback_bind_{digest}.so")
  if os.path.isfile(path):
    return path
  compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
  if compiler is None:
    return None
  os.makedirs(cache, mode=0o700, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=cache) as tmp:
    src = os.path.join(tmp, "shim.c")
    with open(src, "w") as f:
      f.write(_SHIM_SOURCE)
    out = os.path.join(tmp, "shim.so")
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", out, src, "-ldl"],
                          capture_output=True,
                          text=True,
                          timeout=120)
    if done.returncode != 0:
      return None
    os.replace(out, path)
  return path


def resolve_isolation(isolation: Optional[str] = None) -> str:
  """The isolation a new `WorkerProcess` gets: `isolation`, else the
  `TFBFL_WORKER_ISOLATION` environment variable, else "auto", which picks
  "netns" where the kernel allows it, else "loopback" where a C compiler exists.

  Raises:
    RuntimeError: "auto" found neither, or the requested one is unavailable.
  """
  choice = (isolation or os.environ.get(ISOLATION_ENV) or "auto").strip().lower()
  if choice not in _ISOLATIONS:
    raise ValueError(f"{ISOLATION_ENV} must be one of {', '.join(_ISOLATIONS)}, got {choice!r}.")
  if choice in ("auto", "netns") and _netns_available():
    return "netns"
  if choice in ("auto", "loopback") and _loopback_shim() is not None:
    return "loopback"
  if choice == "none":
    return "none"
  raise RuntimeError(
      f"cannot keep TFF's worker_binary off the network ({ISOLATION_ENV}={choice}): it always "
      "serves on all interfaces; tfbfl confines it to a private network namespace (needs "
      "unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
      "kernel.apparmor_restrict_unprivileged_userns=0) or to loopback with an LD_PRELOAD shim "
      f"(needs a C compiler, `cc`). Enable one, or set {ISOLATION_ENV}=none to accept an "
      "unauthenticated TFF service on every interface.")


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
    log_path: the log file (default: `<log_dir>/tff_worker_<pid>_<n>.log`).
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
    _libc()  # Loaded here, not in the child (see `_libc`).
    self.isolation = resolve_isolation(isolation)
    self._sock_dir = None
    env = dict(os.environ)
    if self.isolation == "netns":
      self.port = _INNER_PORT
      self._sock_dir = tempfile.mkdtemp(prefix="tfbfl-w-", dir=_short_tmp())
      sock_path = os.path.join(self._sock_dir, "worker.sock")
      self.address = f"unix:{sock_path}"
      args = [
          sys.executable, "-S", "-c", _BRIDGE_SOURCE, self.binary,
          str(self.port), sock_path,
          str(max_concurrent_computation_calls)
      ]
      preexec = _enter_private_network
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
        env["LD_PRELOAD"] = " ".join(filter(None, [_loopback_shim(), env.get("LD_PRELOAD")]))
      preexec = _die_with_parent
      name = f"{os.getpid()}_{self.port}"
    log_dir = log_dir or tempfile.gettempdir()
    self.log_path = log_path or os.path.join(log_dir, f"tff_worker_{name}.log")
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
    self._finalizer = weakref.finalize(self, _terminate, self.process, sock_dir=self._sock_dir)
    self.channel = grpc.insecure_channel(self.address, _GRPC_OPTIONS)
    self._stub = None
    self._wait_ready(startup_timeout_s)

  def _remove_sock_dir(self) -> None:
    if self._sock_dir:
      import shutil  # pylint: disable=g-import-not-at-top

      shutil.rmtree(self._sock_dir, ignore_errors=True)

  @property
  def stub(self):
    """`tff.framework.RemoteExecutorGrpcStub` on this worker (built on first use,
    so that `tfbfl-worker` never imports TFF)."""
    if self._stub is None:
      import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

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
        self.close()
        raise RuntimeError(
            f"TFF worker {self.binary} at {self.address} did not become ready "
            f"within {timeout_s:.0f} s. Log {self.log_path}:\n{_log_tail(self.log_path)}")

  def alive(self) -> bool:
    return self.process.poll() is None

  def check_alive(self) -> None:
    """Raises RuntimeError (with the worker's log tail) if the worker has exited."""
    code = self.process.poll()
    if code is not None:
      raise RuntimeError(f"TFF worker {self.binary} at {self.address} exited with code {code}. "
                         f"Log {self.log_path}:\n{_log_tail(self.log_path)}")

  def close(self) -> None:
    try:
      self.channel.close()
    except Exception:  # pylint: disable=broad-except
      pass
    self._finalizer()  # Terminates and reaps; idempotent.
    if not self._log_file.closed:
      self._log_file.close()


def _short_tmp() -> str:
  """A temp dir whose paths fit a Unix socket address (108 bytes)."""
  tmp = tempfile.gettempdir()
  return tmp if len(tmp) < 60 else "/tmp"


class LocalRuntime:
  """The local TFF C++ runtime with an owned worker, installed as default context.

  Args:
    max_concurrent_computation_calls: how many client computations the worker
      runs at once. Default: the number of CPU cores (more oversubscribes the cores:
      on 2 cores, 10 concurrent VIRTUAL clients ran 2.6x slower than 2, measured
      before issue 13, when the step was believed to be XLA-compiled; it is not). `-1`: unlimited.
    default_num_clients: cardinality used when a computation's arguments do not
      determine the number of clients.
    log_dir: where the worker writes its log (default: system temp dir).
    startup_timeout_s: start-up deadline for the worker.

  The worker is reachable from this machine only, and with the default "netns"
  isolation only by this user (see `WorkerProcess`); it opens no network port.
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

  @property
  def running(self) -> bool:
    return self.worker is not None

  def start(self) -> "LocalRuntime":
    """Starts the worker (in the calling thread) and installs the context."""
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tfbfl import aggregators  # pylint: disable=g-import-not-at-top

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
        compiler_fn=aggregators.worker_compiler,  # secure sums lowered (see there)
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


# ---------------------------------------------------------------- remote mode
class WorkerError(RuntimeError, grpc.RpcError):
  """A remote TFF worker failed a call: it died, is unreachable, or did not
  answer within the call deadline.

  Raised instead of the stock stub's `RetryableGRPCError`, which TFF's execution
  context retries forever. It is also a `grpc.RpcError`, so TFF's own clean-up
  paths (which swallow RPC errors while disposing of an executor) stay quiet.

  Attributes:
    worker: the "host:port" that failed.
    method: the executor-service RPC that failed (e.g. "Compute").
    status_code: the `grpc.StatusCode`, or None.
  """

  def __init__(self,
               worker: str,
               method: str,
               status_code,
               details: str,
               timeout_s: Optional[float] = None):
    self.worker, self.method, self.status_code = worker, method, status_code
    if status_code == grpc.StatusCode.DEADLINE_EXCEEDED:
      why = (f"did not answer within call_timeout_s={timeout_s:g} s "
             "(hung, overloaded, unreachable, or a subround longer than the deadline)")
    elif status_code == grpc.StatusCode.UNAVAILABLE:
      why = "is unavailable (its process died, or the address is wrong or unreachable)"
    else:
      why = f"failed with {getattr(status_code, 'name', 'an unknown error')}"
    super().__init__(f"TFF worker {worker} {why} during {method}: {details}")


def parse_worker_address(address: str) -> str:
  """Checks a "host:port", "[v6]:port" or "unix:/abs/path" worker address;
  returns it stripped."""
  address = str(address).strip()
  if address.startswith("unix:/"):
    return address
  host, sep, port = address.rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"worker address must be host:port, got {address!r}.")
  return address


def _read_pem(path: Optional[str], flag: str) -> Optional[bytes]:
  if not path:
    return None
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ValueError(f"--{flag}: cannot read {path}: {e.strerror or e}.") from None
  if b"-----BEGIN " not in data:
    raise ValueError(f"--{flag}: {path} is not a PEM file.")
  return data


def channel_credentials(tls_ca: Optional[str] = None,
                        tls_cert: Optional[str] = None,
                        tls_key: Optional[str] = None) -> Optional[grpc.ChannelCredentials]:
  """Controller-side TLS credentials from PEM files, or None (plaintext) if no
  file is given.

  Args:
    tls_ca: CA certificate(s) that signed the workers' certificates (verifies them).
    tls_cert, tls_key: this controller's client certificate and private key,
      presented to workers started with `--tls_client_ca`; both or neither.

  Raises:
    ValueError: naming the flag of an unreadable or inconsistent file.
  """
  if bool(tls_cert) != bool(tls_key):
    raise ValueError("--tls_cert and --tls_key must be given together.")
  if not (tls_ca or tls_cert):
    return None
  if not tls_ca:
    raise ValueError("--tls_cert/--tls_key need --tls_ca (the CA that signed the workers' "
                     "certificates).")
  return grpc.ssl_channel_credentials(root_certificates=_read_pem(tls_ca, "tls_ca"),
                                      private_key=_read_pem(tls_key, "tls_key"),
                                      certificate_chain=_read_pem(tls_cert, "tls_cert"))


class DeadlineGrpcStub:
  """The executor-service stub of one remote worker, with a deadline per call.

  Implements `tff.framework.RemoteExecutorStub` (registered as such), like TFF's
  `RemoteExecutorGrpcStub`, with two differences: every RPC carries
  `timeout=call_timeout_s`, and a failed RPC raises `WorkerError` naming the
  worker (the stock stub turns UNAVAILABLE into an error TFF retries forever, so a
  dead worker would hang the controller). Disposing of remote values is best
  effort and never raises (it runs from finalizers).

  `call_timeout_s` bounds each RPC, including `Compute`, which waits for the
  worker to finish its share of a round: set it above the longest subround.
  After an RPC fails with DEADLINE_EXCEEDED or UNAVAILABLE, every further RPC
  fails at once with the same `WorkerError` (and `Dispose` is skipped) until
  TFF asks for a new executor (`GetExecutor`, which the next computation does
  after a failed one): TFF issues the RPCs of one computation one after another
  from its event loop, and would otherwise wait `call_timeout_s` again for each
  argument and clean-up RPC still queued. So a hung worker is reported within
  one `call_timeout_s` of the RPC that found it.

  `credentials`: `grpc.ChannelCredentials` for TLS (see `channel_credentials`);
  None: plaintext. `server_name` overrides the name checked against the worker's
  certificate (default: the host of `address`).
  """

  _RPCS = dict(get_executor="GetExecutor",
               create_value="CreateValue",
               create_struct="CreateStruct",
               create_call="CreateCall",
               create_selection="CreateSelection",
               compute="Compute",
               dispose_executor="DisposeExecutor")

  _UNREACHABLE = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)

  def __init__(self,
               address: str,
               *,
               call_timeout_s: float = 600.0,
               channel=None,
               credentials: Optional[grpc.ChannelCredentials] = None,
               server_name: Optional[str] = None):
    from tensorflow_federated.proto.v0 import executor_pb2_grpc  # pylint: disable=g-import-not-at-top

    if call_timeout_s <= 0:
      raise ValueError(f"call_timeout_s must be > 0, got {call_timeout_s}.")
    self.address = parse_worker_address(address)
    self.call_timeout_s = float(call_timeout_s)
    self.tls = credentials is not None
    if channel is None:
      options = list(_GRPC_OPTIONS)
      if credentials is not None:
        if server_name:
          options.append(("grpc.ssl_target_name_override", server_name))
        channel = grpc.secure_channel(self.address, credentials, options)
      else:
        channel = grpc.insecure_channel(self.address, options)
    self.channel = channel
    self._stub = executor_pb2_grpc.ExecutorGroupStub(self.channel)
    self._failed = None  # (code, details) of the RPC that found the worker hung or gone.

  def _call(self, rpc: str, request):
    if rpc == "GetExecutor":
      self._failed = None  # A new computation: give the worker a new chance.
    failed = self._failed
    if failed is not None:
      raise WorkerError(
          self.address, rpc, failed[0],
          f"{failed[1]} (not sent: an earlier call of this computation to "
          "this worker failed)", self.call_timeout_s)
    try:
      response = getattr(self._stub, rpc)(request, timeout=self.call_timeout_s)
    except grpc.RpcError as e:
      code = e.code() if isinstance(e, grpc.Call) else None
      details = e.details() if isinstance(e, grpc.Call) else str(e)
      if code in self._UNREACHABLE:
        self._failed = (code, details)
      raise WorkerError(self.address, rpc, code, details, self.call_timeout_s) from None
    except ValueError as e:  # grpc: "Cannot invoke RPC on closed channel!"
      raise WorkerError(self.address, rpc, grpc.StatusCode.CANCELLED,
                        f"{e} (the runtime was closed)") from None
    return response

  def __getattr__(self, name):
    rpc = DeadlineGrpcStub._RPCS.get(name)
    if rpc is None:
      raise AttributeError(name)
    return lambda request: self._call(rpc, request)

  def dispose(self, request):
    if self._failed is not None:
      return None  # Hung or gone: do not wait for it again while unwinding.
    try:
      return self._stub.Dispose(request, timeout=min(self.call_timeout_s, 10.0))
    except grpc.RpcError:
      return None  # The worker is gone: nothing left to dispose of.

  def wait_ready(self, timeout_s: float) -> bool:
    """True once the worker accepts connections, False after `timeout_s`."""
    try:
      grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
      return True
    except grpc.FutureTimeoutError:
      return False

  @property
  def is_ready(self) -> bool:
    return self.wait_ready(0.01)

  def close(self) -> None:
    self.channel.close()


class _FailureLatch:
  """When the last subround failure was raised (shared by a runtime's workers)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._last = float("-inf")

  def raise_or_absorb(self, started: float) -> bool:
    """True: raise this failure. False: absorb it, because it belongs to a call
    that already failed (the subround started before that failure was raised):
    TFF's mergeable context stops at the first failed subround and abandons the
    others, whose errors nobody would retrieve."""
    with self._lock:
      if started < self._last:
        return False
      self._last = time.monotonic()
      return True


class _ThreadedAsyncContext:
  """Async face of one worker's `SyncExecutionContext`.

  `invoke` runs the sync context's blocking `invoke` in a thread of a pool with
  one thread per worker, so the mergeable context's subrounds really run on all
  workers at once (awaiting TFF's own async context instead would serialise
  them: its gRPC calls block the event loop). A dedicated pool rather than
  `asyncio.to_thread`, whose default pool has only min(32, cores + 4) threads.
  Registered as a `tff.framework.AsyncContext`.
  """

  def __init__(self, sync_context, pool: concurrent.futures.ThreadPoolExecutor, address: str,
               latch: _FailureLatch):
    self.sync_context, self._pool, self.address, self._latch = sync_context, pool, address, latch

  async def invoke(self, comp, arg):
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    try:
      return await loop.run_in_executor(self._pool, self.sync_context.invoke, comp, arg)
    except Exception:  # pylint: disable=broad-except
      if self._latch.raise_or_absorb(started):
        raise
      return None  # An abandoned subround of a call that already failed.


class RemoteRuntime:
  """TFF's multi-machine runtime over workers that are already serving.

  One worker per entry of `workers` ("host:port"; start each with `tfbfl-worker
  --port=PORT`). The controller (this process) installs
  `tff.backends.native.create_mergeable_comp_execution_context` as TFF's default
  context; for each call it splits the CLIENTS-placed arguments into one slice per
  subround, runs the slices on the workers in parallel, merges the single
  aggregation and returns CLIENTS-placed results concatenated in *completion
  order* (results per client must carry their client index; see
  `tfbfl.experiment`). Per worker:

      DeadlineGrpcStub -> tff.framework.RemoteExecutor
        -> tff.framework.ResourceManagingExecutorFactory
        -> tff.framework.SyncExecutionContext -> invoke in a thread

  Limits of TFF's mergeable form: a computation may have only one aggregation
  stage (broadcast -> client work -> aggregate -> server work is fine); its
  client count is read from the LAST argument (client-placed data must come
  last); CLIENTS-placed outputs of a computation that also aggregates are
  recomputed after the merge (the client work runs twice per round).

  Client states, data and the server state stay in the controller and are sent
  with each call; workers keep nothing between calls.

  Args:
    workers: worker addresses, "host:port".
    call_timeout_s: deadline of every RPC to a worker (must exceed the longest
      subround; see `DeadlineGrpcStub`). A dead worker fails at once; a hung or
      unreachable one after this deadline. Either raises `WorkerError`.
    connect_timeout_s: how long `start()` waits for every worker to accept
      connections; unreachable ones are named in a `WorkerError`.
    default_num_clients: cardinality when a call's arguments do not determine it.
    num_subrounds: slices per call (default: one per worker); more than the
      number of workers queues the extra slices on whichever worker is free.
    tls_ca: PEM file of the CA that signed the workers' certificates; turns on
      TLS (workers must run with `--tls_cert --tls_key`). Default: plaintext.
    tls_cert, tls_key: PEM client certificate and key of this controller, for
      workers that require client certificates (`--tls_client_ca`).
    tls_server_name: name to check the workers' certificates against instead
      of each address's host (e.g. when reaching them through an SSH tunnel).
  """

  def __init__(
      self,
      workers: Sequence[str],
      *,
      call_timeout_s: float = 600.0,
      connect_timeout_s: float = 30.0,
      default_num_clients: int = 0,
      num_subrounds: Optional[int] = None,
      tls_ca: Optional[str] = None,
      tls_cert: Optional[str] = None,
      tls_key: Optional[str] = None,
      tls_server_name: Optional[str] = None,
  ):
    if isinstance(workers, str):
      workers = [w for w in workers.split(",") if w.strip()]
    self.workers = tuple(parse_worker_address(w) for w in workers)
    if not self.workers:
      raise ValueError("RemoteRuntime needs at least one worker address (host:port).")
    if len(set(self.workers)) != len(self.workers):
      raise ValueError(f"worker addresses must be distinct, got {list(self.workers)}.")
    if call_timeout_s <= 0 or connect_timeout_s <= 0:
      raise ValueError("call_timeout_s and connect_timeout_s must be > 0, got "
                       f"{call_timeout_s} and {connect_timeout_s}.")
    if default_num_clients < 0:
      raise ValueError(f"default_num_clients must be >= 0, got {default_num_clients}.")
    if num_subrounds is not None and num_subrounds < 1:
      raise ValueError(f"num_subrounds must be >= 1, got {num_subrounds}.")
    self.call_timeout_s = float(call_timeout_s)
    self.connect_timeout_s = float(connect_timeout_s)
    self.default_num_clients = default_num_clients
    self.num_subrounds = num_subrounds
    self._credentials = channel_credentials(tls_ca, tls_cert, tls_key)  # Checks the files now.
    self.tls_server_name = tls_server_name or None
    self.stubs = []
    self.context = None
    self.requested = None
    self._pool = None
    self._previous_context = None

  @property
  def running(self) -> bool:
    return self.context is not None

  def start(self) -> "RemoteRuntime":
    """Connects to every worker (or raises `WorkerError` naming the unreachable
    ones) and installs the mergeable context as TFF's default."""
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tfbfl import aggregators  # pylint: disable=g-import-not-at-top

    if self.context is not None:
      return self
    tff.framework.RemoteExecutorStub.register(DeadlineGrpcStub)
    tff.framework.AsyncContext.register(_ThreadedAsyncContext)
    stubs = [
        DeadlineGrpcStub(w,
                         call_timeout_s=self.call_timeout_s,
                         credentials=self._credentials,
                         server_name=self.tls_server_name) for w in self.workers
    ]
    futures = [grpc.channel_ready_future(s.channel) for s in stubs]
    deadline = time.monotonic() + self.connect_timeout_s
    unreachable = []
    for stub, future in zip(stubs, futures):
      try:
        future.result(timeout=max(deadline - time.monotonic(), 0.01))
      except grpc.FutureTimeoutError:
        unreachable.append(stub.address)
    if unreachable:
      for stub in stubs:
        stub.close()
      raise WorkerError(
          ", ".join(unreachable), "connect", grpc.StatusCode.UNAVAILABLE,
          f"not reachable within connect_timeout_s={self.connect_timeout_s:g} s; start "
          "`tfbfl-worker --port=PORT` there (same TFF and tfbfl versions) and check the "
          "address, --host, firewall / SSH tunnel" +
          (", and that the worker runs with TLS (--tls_cert/--tls_key) signed by "
           "--tls_ca, and accepts this controller's --tls_cert" if self._credentials else
           "; a worker started with --tls_cert needs --tls_ca here") + ".")
    self.stubs = stubs
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(stubs),
                                                       thread_name_prefix="tfbfl-remote")
    latch = _FailureLatch()
    async_contexts = [
        _ThreadedAsyncContext(self._worker_context(stub), self._pool, stub.address, latch)
        for stub in stubs
    ]
    self.context = tff.framework.MergeableCompExecutionContext(
        async_contexts=async_contexts,
        compiler_fn=aggregators.mergeable_compiler,
        num_subrounds=self.num_subrounds)
    self._previous_context = tff.framework.get_context_stack().current
    tff.framework.set_default_context(self.context)
    return self

  def _worker_context(self, stub):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tfbfl import aggregators  # pylint: disable=g-import-not-at-top

    def stack_fn(cardinalities):
      if cardinalities.get(tff.CLIENTS) is None:
        cardinalities[tff.CLIENTS] = self.default_num_clients
      executor = tff.framework.RemoteExecutor(stub)
      executor.set_cardinalities(cardinalities)
      return executor

    factory = tff.framework.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn)
    return tff.framework.SyncExecutionContext(
        executor_fn=factory,
        compiler_fn=aggregators.worker_compiler,  # secure sums lowered (see there)
        transform_args=tff.tensorflow.transform_args,
        transform_result=tff.tensorflow.transform_result)

  def close(self) -> None:
    """Closes the connections (the workers keep serving) and, if this runtime's
    context is still TFF's default, reinstates the one it replaced. Idempotent."""
    if self.context is None:
      return
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    context, self.context = self.context, None
    for stub in self.stubs:
      stub.close()
    self.stubs = []
    if self._pool is not None:
      self._pool.shutdown(wait=False, cancel_futures=True)
      self._pool = None
    stack = tff.framework.get_context_stack()
    if stack.current is context and self._previous_context is not None:
      tff.framework.set_default_context(self._previous_context)

  def __enter__(self) -> "RemoteRuntime":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()


# ------------------------------------------------------ process-wide runtime
_RUNTIME = None  # LocalRuntime or RemoteRuntime


def _effective_options(cls, kwargs):
  """`kwargs` with `cls`'s defaults filled in (None concurrency = CPU count), so
  that `set_local_runtime()` and `set_local_runtime(<the defaults>)` compare equal."""
  bound = inspect.signature(cls.__init__).bind(None, **kwargs)
  bound.apply_defaults()
  options = {k: v for k, v in bound.arguments.items() if k != "self"}
  if options.get("max_concurrent_computation_calls", 0) is None:
    options["max_concurrent_computation_calls"] = os.cpu_count() or 1
  return options


def _install(cls, kwargs):
  """Starts `cls(**kwargs)` as the process-wide runtime, or reuses the running
  one if it was started with the same class and (effective) options."""
  global _RUNTIME
  kwargs = _effective_options(cls, kwargs)
  if _RUNTIME is not None and _RUNTIME.running:
    if type(_RUNTIME) is cls and _RUNTIME.requested == kwargs:  # pylint: disable=unidiomatic-typecheck
      # Another runtime may have replaced the default context meanwhile.
      import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

      tff.framework.set_default_context(_RUNTIME.context)
      return _RUNTIME
    _RUNTIME.close()
  _RUNTIME = cls(**kwargs).start()
  _RUNTIME.requested = dict(kwargs)
  return _RUNTIME


def set_local_runtime(**kwargs) -> LocalRuntime:
  """Starts (once) the process-wide local runtime and makes it TFF's default.

  Calling again with the same options returns the running runtime; with other
  options (or while a remote runtime is installed) the old one is stopped and a
  new one started.
  """
  return _install(LocalRuntime, dict(kwargs))


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
  """Where the TFF computations run (`set_runtime`'s flags)."""
  executor: str = options.choice(
      "local", ("local", "remote"),
      "local: TFF worker on this machine; remote: the tfbfl-worker services in --workers.")
  workers: Optional[Sequence[str]] = options.str_list(
      None, "--executor=remote: worker addresses host:port,host:port (127.0.0.1 + SSH "
      "tunnels, or TLS; see BUILD.md).")
  call_timeout_s: float = options.real(
      600.0, "--executor=remote: deadline of each call to a worker (above the longest "
      "subround).",
      low_open=True,
      high=1e7)
  tls_ca: Optional[str] = options.text(
      None, "--executor=remote: PEM CA certificate that signed the workers' certificates; "
      "turns on TLS (workers run with --tls_cert/--tls_key). See BUILD.md.")
  tls_cert: Optional[str] = options.text(
      None, "--executor=remote: PEM client certificate of this controller, for workers "
      "started with --tls_client_ca (with --tls_key).")
  tls_key: Optional[str] = options.text(None, "--executor=remote: PEM private key of --tls_cert.")

  def check(self) -> None:
    """The flags' combinations; TLS files are read (a bad one is named)."""
    tls = any((self.tls_ca, self.tls_cert, self.tls_key))
    if self.executor == "remote" and not self.workers:
      raise ValueError("--executor=remote needs --workers=host:port[,host:port...].")
    if self.executor == "local" and self.workers:
      raise ValueError("--workers is only used with --executor=remote.")
    if self.executor != "remote" and tls:
      raise ValueError("--tls_ca/--tls_cert/--tls_key are only used with --executor=remote.")
    if tls:
      channel_credentials(self.tls_ca, self.tls_cert, self.tls_key)  # names the bad flag


def set_runtime(executor: str = "local", workers: Optional[Sequence[str]] = None, **kwargs):
  """Installs the process-wide runtime chosen by `--executor`.

  Args:
    executor: "local" (an owned worker on this machine, `LocalRuntime`) or
      "remote" (`RemoteRuntime` over `workers`).
    workers: "host:port" addresses (a list, or one comma-separated string);
      required for "remote", refused for "local".
    **kwargs: options of the chosen runtime class.
  """
  if executor == "local":
    if workers:
      raise ValueError("--workers is only used with --executor=remote.")
    return set_local_runtime(**kwargs)
  if executor == "remote":
    if isinstance(workers, str):
      workers = [w for w in workers.split(",") if w.strip()]
    if not workers:
      raise ValueError("--executor=remote needs --workers=host:port[,host:port...].")
    return _install(RemoteRuntime, dict(workers=tuple(workers), **kwargs))
  raise ValueError(f"--executor must be 'local' or 'remote', got {executor!r}.")


def mergeable_context_active() -> bool:
  """True when TFF's current default context is a mergeable (multi-worker) one,
  e.g. a `RemoteRuntime`'s. Under it, CLIENTS-placed results come back in
  subround completion order, and in a computation that also aggregates, the
  client work producing CLIENTS-placed results runs twice (before and after the
  merge); drivers use this to pick a two-phase round (see `tfbfl.experiment`)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  return isinstance(tff.framework.get_context_stack().current,
                    tff.framework.MergeableCompExecutionContext)


def current_runtime():
  """The process-wide runtime (`LocalRuntime`, `RemoteRuntime`) or None."""
  return _RUNTIME


def shutdown() -> None:
  """Stops the process-wide runtime (registered with atexit): a local runtime's
  worker is terminated, a remote runtime's connections closed."""
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
    print(
        f"tff.federated_mean([1, 2, 6]) over 3 clients = {result} "
        f"(worker pid {rt.worker.process.pid}, log {rt.worker.log_path})",
        file=stream)
  if abs(result - 3.0) > 1e-6:
    raise RuntimeError(f"federated_mean returned {result}, expected 3.0")
  return result


if __name__ == "__main__":
  check_install()

r"""`tfbfl-worker`: serves TFF computations to a remote controller.

    tfbfl-worker --port=8000                       # 127.0.0.1:8000 only (default)
    tfbfl-worker --port=8000 --host=0.0.0.0 \
        --tls_cert=worker.pem --tls_key=worker.key --tls_client_ca=ca.pem
    python -m tfbfl.worker --port=8000

TFF's executor service (`worker_binary` from the installed tensorflow-federated
wheel) always listens on every interface, in plaintext, and cannot do TLS. So this
process starts it through `tfbfl.runtime.WorkerProcess`, which confines it to this
machine (a private network namespace behind a Unix socket, or loopback only; see
`tfbfl.runtime.resolve_isolation`), and serves it on `--host:--port` through a
small gRPC relay of its own: each executor-service call is forwarded unchanged
(bytes, not re-serialised) with the caller's deadline, and cancelled when the
caller goes away. The relay speaks TLS when given `--tls_cert --tls_key`, and then
accepts only callers presenting a certificate signed by `--tls_client_ca` if that
is given.

Guarantees:

* binds `--host` (default 127.0.0.1) and prints the address it listens on;
* the binary's output goes to `<log_dir>/tfbfl_worker_<port>.log`; it dies with
  this process (even on `kill -9`); start-up waits until it accepts calls (or exits
  1 quoting the log);
* SIGTERM or SIGINT stops everything and exits 0; if the binary dies on its own,
  this process exits 1 with the log tail on stderr (a process manager such as
  systemd then restarts it).

A controller uses the workers with `tfbfl.runtime.RemoteRuntime` (or
`--executor=remote --workers=host:port,...` on the launchers, with `--tls_ca`,
`--tls_cert`, `--tls_key` for TLS). Controller and workers must run the same
tensorflow-federated wheel (0.87.0) and tfbfl version.

SECURITY: a worker runs whatever TensorFlow graph a caller sends it, with this
user's rights. Opening it beyond loopback (`--host`) without TLS client
certificates lets anybody who can reach the port do so. Prefer TLS with
`--tls_client_ca`, or keep the default loopback bind and reach the worker through
an SSH tunnel (`ssh -N -L 8000:localhost:8000 worker-host` on the controller, then
`--workers=localhost:8000`). See BUILD.md, "Running on several machines".

This module imports neither TensorFlow nor TFF, so the wrapper itself stays small.
"""

from __future__ import annotations

from concurrent import futures
import ipaddress
import os
import signal
import sys
import tempfile
import threading
from typing import Optional

from absl import app
from absl import flags
import grpc
import portpicker

from tfbfl import runtime

_PORT = flags.DEFINE_integer("port",
                             None,
                             "Port this worker listens on (on --host).",
                             lower_bound=1,
                             upper_bound=65535)
_HOST = flags.DEFINE_string(
    "host", "127.0.0.1", "Address to listen on. Default 127.0.0.1: this machine only (reach "
    "it through an SSH tunnel). 0.0.0.0 (all IPv4 interfaces), [::] (all) or one interface's "
    "address opens it to the network: use TLS with --tls_client_ca then.")
_TLS_CERT = flags.DEFINE_string(
    "tls_cert", None, "PEM certificate (chain) of this worker; "
    "with --tls_key turns on TLS.")
_TLS_KEY = flags.DEFINE_string("tls_key", None, "PEM private key of --tls_cert.")
_TLS_CLIENT_CA = flags.DEFINE_string(
    "tls_client_ca", None, "PEM CA certificate(s): only callers presenting a client "
    "certificate signed by it are accepted (needs --tls_cert/--tls_key).")
# --log_dir is absl.logging's own flag ("directory to write logfiles into"): the
# worker log goes there (default: the system temp directory).
_MAX_CALLS = flags.DEFINE_integer(
    "max_concurrent_computation_calls", None,
    "How many client computations run at once on this worker (default: the number "
    "of CPU cores; -1: no limit). More than the cores oversubscribes them.")
_STARTUP_TIMEOUT = flags.DEFINE_float("startup_timeout_s", 60.0,
                                      "How long to wait for the binary to accept calls.")

_SERVICE_PREFIX = "/tensorflow_federated.v0.ExecutorGroup/"
_RELAY_THREADS = 64  # Concurrent calls in flight; each waits on the binary.


def server_credentials(tls_cert: Optional[str] = None,
                       tls_key: Optional[str] = None,
                       tls_client_ca: Optional[str] = None):
  """gRPC server credentials from PEM files, or None (plaintext) if none is given.

  Raises:
    ValueError: naming the flag of a missing, unreadable or inconsistent file.
  """
  if bool(tls_cert) != bool(tls_key):
    raise ValueError("--tls_cert and --tls_key must be given together.")
  if tls_client_ca and not tls_cert:
    raise ValueError("--tls_client_ca needs --tls_cert and --tls_key (client certificates "
                     "are checked only over TLS).")
  if not tls_cert:
    return None
  read = runtime._read_pem  # pylint: disable=protected-access
  client_ca = read(tls_client_ca, "tls_client_ca")
  return grpc.ssl_server_credentials([(read(tls_key, "tls_key"), read(tls_cert, "tls_cert"))],
                                     root_certificates=client_ca,
                                     require_client_auth=client_ca is not None)


class _Relay(grpc.GenericRpcHandler):
  """Forwards every executor-service call, as bytes, to the local binary."""

  def __init__(self, channel: grpc.Channel):
    self._channel = channel

  def service(self, handler_call_details):
    method = handler_call_details.method
    if not method.startswith(_SERVICE_PREFIX):
      return None  # UNIMPLEMENTED
    upstream = self._channel.unary_unary(method)  # No (de)serializers: bytes.

    def relay(request: bytes, context: grpc.ServicerContext) -> bytes:
      remaining = context.time_remaining()
      timeout = remaining if remaining is not None and remaining < 1e7 else None
      call = upstream.future(request, timeout=timeout)
      context.add_callback(call.cancel)  # Caller gone or its deadline passed.
      try:
        return call.result()
      except grpc.RpcError as e:
        context.abort(e.code(), e.details() or "")
      except grpc.FutureCancelledError:
        context.abort(grpc.StatusCode.CANCELLED, "cancelled")

    return grpc.unary_unary_rpc_method_handler(relay)


def _is_loopback(host: str) -> bool:
  name = host.strip("[]")
  if name == "localhost":
    return True
  try:
    return ipaddress.ip_address(name).is_loopback
  except ValueError:
    return False


def _bind_address(host: str, port: int) -> str:
  host = host.strip()
  if ":" in host and not host.startswith("["):
    host = f"[{host}]"  # A bare IPv6 address.
  return f"{host}:{port}"


def serve(port: int,
          *,
          host: str = "127.0.0.1",
          log_dir=None,
          max_concurrent_computation_calls=None,
          startup_timeout_s: float = 60.0,
          tls_cert: Optional[str] = None,
          tls_key: Optional[str] = None,
          tls_client_ca: Optional[str] = None,
          stop_event: threading.Event = None,
          stream=sys.stdout) -> int:
  """Runs one worker on `host:port` until `stop_event` is set (or the binary
  dies); returns the exit code: 0 after a requested stop, 1 if the binary exited
  on its own.

  Raises:
    ValueError: bad TLS files or flags (named).
    RuntimeError: the port is taken, `host` cannot be bound, or the binary did
      not start.
  """
  credentials = server_credentials(tls_cert, tls_key, tls_client_ca)  # Before starting anything.
  if max_concurrent_computation_calls is None:
    max_concurrent_computation_calls = os.cpu_count() or 1
  log_dir = log_dir or tempfile.gettempdir()
  stop_event = stop_event or threading.Event()
  # gRPC binds with SO_REUSEPORT: a second worker on a taken port would start
  # "fine" and the kernel would split connections between the two. Refuse.
  if not portpicker.is_port_free(port):
    raise RuntimeError(f"port {port} is already in use on this machine.")
  worker = runtime.WorkerProcess(log_dir=log_dir,
                                 log_path=os.path.join(log_dir, f"tfbfl_worker_{port}.log"),
                                 max_concurrent_computation_calls=max_concurrent_computation_calls,
                                 startup_timeout_s=startup_timeout_s)
  server = None
  try:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=_RELAY_THREADS,
                                                    thread_name_prefix="tfbfl-relay"),
                         handlers=[_Relay(worker.channel)],
                         options=runtime._GRPC_OPTIONS + [("grpc.so_reuseport", 0)])  # pylint: disable=protected-access
    address = _bind_address(host, port)
    try:
      bound = (server.add_secure_port(address, credentials)
               if credentials else server.add_insecure_port(address))
    except RuntimeError as e:  # grpc raises instead of returning 0 in some versions
      bound, why = 0, str(e)
    else:
      why = "bind failed"
    if not bound:
      raise RuntimeError(f"cannot listen on --host={host} --port={port}: {why}.")
    server.start()
    if credentials is None:
      security = "plaintext, no authentication"
    elif tls_client_ca:
      security = "TLS, client certificates required"
    else:
      security = "TLS, no client authentication"
    scope = "this machine only" if _is_loopback(host) else "OPEN to the network"
    print(
        f"tfbfl-worker: TFF executor service listening on {address} ({scope}; {security}), "
        f"pid {worker.process.pid}, max_concurrent_computation_calls="
        f"{max_concurrent_computation_calls}, binary {worker.isolation}-isolated at "
        f"{worker.address}, log {worker.log_path}",
        file=stream,
        flush=True)
    if not _is_loopback(host) and not tls_client_ca:
      print(
          f"tfbfl-worker: WARNING: --host={host} without --tls_client_ca: anybody who can "
          "reach this port can run code as this user. See BUILD.md.",
          file=sys.stderr,
          flush=True)
    while not stop_event.wait(0.5):
      if not worker.alive():
        print(
            f"tfbfl-worker: worker_binary on port {port} exited with code "
            f"{worker.process.returncode}. Log {worker.log_path}:\n"
            f"{runtime._log_tail(worker.log_path)}",  # pylint: disable=protected-access
            file=sys.stderr,
            flush=True)
        return 1
    print(f"tfbfl-worker: stopping (port {port})", file=stream, flush=True)
    return 0
  finally:
    if server is not None:
      server.stop(grace=None)
    worker.close()


def _main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _PORT.value is None:
    raise app.UsageError("--port is required.")
  stop = threading.Event()

  def request_stop(signum, frame):  # pylint: disable=unused-argument
    stop.set()

  signal.signal(signal.SIGTERM, request_stop)
  signal.signal(signal.SIGINT, request_stop)
  try:
    code = serve(_PORT.value,
                 host=_HOST.value,
                 log_dir=flags.FLAGS.log_dir or None,
                 max_concurrent_computation_calls=_MAX_CALLS.value,
                 startup_timeout_s=_STARTUP_TIMEOUT.value,
                 tls_cert=_TLS_CERT.value,
                 tls_key=_TLS_KEY.value,
                 tls_client_ca=_TLS_CLIENT_CA.value,
                 stop_event=stop)
  except (RuntimeError, ValueError) as e:  # start-up failed: port taken, bad TLS file, ...
    print(f"tfbfl-worker: {e}", file=sys.stderr, flush=True)
    code = 1
  sys.exit(code)


def main() -> None:
  """Console-script entry point (`tfbfl-worker`)."""
  app.run(_main)


if __name__ == "__main__":
  main()

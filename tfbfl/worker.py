r"""`tfbfl-worker`: serves TFF computations to a remote controller.

    tfbfl-worker --port=8000 --log_dir=/var/log/tfbfl
    python -m tfbfl.worker --port=8000

Starts TFF's own executor service (`worker_binary` from the installed
tensorflow-federated wheel) on `--port` through `tfbfl.runtime.WorkerProcess`: its
output goes to `<log_dir>/tfbfl_worker_<port>.log`, it dies with this process
(even on `kill -9`), and this process waits until it accepts gRPC calls (or exits
with an error quoting the log). SIGTERM or SIGINT terminates the binary and exits 0;
if the binary dies on its own, this process exits 1 with the log tail on stderr (a
process manager such as systemd then restarts it).

A controller uses the workers with `tfbfl.runtime.RemoteRuntime` (or
`--executor=remote --workers=host:port,...` on the launchers). Controller and
workers must run the same tensorflow-federated wheel (0.87.0) and tfbfl version.

SECURITY: the TFF binary listens on ALL interfaces of the machine with
unauthenticated, unencrypted gRPC, and runs whatever TensorFlow graph it is sent.
Run workers only on a trusted private network, behind a firewall that admits only
the controller, or bind nothing public and reach them through SSH tunnels
(`ssh -N -L 8000:localhost:8000 worker-host` on the controller, then
`--workers=localhost:8000`). See BUILD.md, "Running on several machines".

This module imports neither TensorFlow nor TFF, so the wrapper itself stays small.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading

from absl import app
from absl import flags
import portpicker

from tfbfl import runtime

_PORT = flags.DEFINE_integer("port", None, "Port the TFF executor service listens on "
                             "(on all interfaces; see the security note).", lower_bound=1,
                             upper_bound=65535)
# --log_dir is absl.logging's own flag ("directory to write logfiles into"): the
# worker log goes there (default: the system temp directory).
_MAX_CALLS = flags.DEFINE_integer(
    "max_concurrent_computation_calls", None,
    "How many client computations run at once on this worker (default: the number "
    "of CPU cores; -1: no limit). More than the cores oversubscribes them.")
_STARTUP_TIMEOUT = flags.DEFINE_float("startup_timeout_s", 60.0,
                                      "How long to wait for the binary to accept calls.")


def serve(port: int, *, log_dir=None, max_concurrent_computation_calls=None,
          startup_timeout_s: float = 60.0, stop_event: threading.Event = None,
          stream=sys.stdout) -> int:
  """Runs one worker until `stop_event` is set (or the binary dies); returns the
  exit code: 0 after a requested stop, 1 if the binary exited on its own."""
  if max_concurrent_computation_calls is None:
    max_concurrent_computation_calls = os.cpu_count() or 1
  log_dir = log_dir or tempfile.gettempdir()
  stop_event = stop_event or threading.Event()
  # gRPC binds with SO_REUSEPORT: a second worker on a taken port would start
  # "fine" and the kernel would split connections between the two. Refuse.
  if not portpicker.is_port_free(port):
    raise RuntimeError(f"port {port} is already in use on this machine.")
  worker = runtime.WorkerProcess(
      port=port, log_dir=log_dir,
      log_path=os.path.join(log_dir, f"tfbfl_worker_{port}.log"),
      max_concurrent_computation_calls=max_concurrent_computation_calls,
      startup_timeout_s=startup_timeout_s)
  try:
    print(f"tfbfl-worker: TFF executor service on port {port} (all interfaces), "
          f"pid {worker.process.pid}, max_concurrent_computation_calls="
          f"{max_concurrent_computation_calls}, log {worker.log_path}",
          file=stream, flush=True)
    while not stop_event.wait(0.5):
      if not worker.alive():
        print(f"tfbfl-worker: worker_binary on port {port} exited with code "
              f"{worker.process.returncode}. Log {worker.log_path}:\n"
              f"{runtime._log_tail(worker.log_path)}",  # pylint: disable=protected-access
              file=sys.stderr, flush=True)
        return 1
    print(f"tfbfl-worker: stopping (port {port})", file=stream, flush=True)
    return 0
  finally:
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
    code = serve(_PORT.value, log_dir=flags.FLAGS.log_dir or None,
                 max_concurrent_computation_calls=_MAX_CALLS.value,
                 startup_timeout_s=_STARTUP_TIMEOUT.value, stop_event=stop)
  except RuntimeError as e:  # start-up failed: port taken, binary missing, ...
    print(f"tfbfl-worker: {e}", file=sys.stderr, flush=True)
    code = 1
  sys.exit(code)


def main() -> None:
  """Console-script entry point (`tfbfl-worker`)."""
  app.run(_main)


if __name__ == "__main__":
  main()

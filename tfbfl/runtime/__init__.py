"""Owns the TFF execution context and every process it starts.

TFF's stock local C++ context (`tff.backends.native.set_sync_local_cpp_execution_context`,
installed by `import tensorflow_federated`) starts a `worker_binary` process that
inherits the parent's stdout/stderr, is not reliably ended at interpreter exit
and is waited for with no timeout. An orphaned worker keeps the pipe open, so
`python run.py | tee log` (and a CI job) hangs after Python has finished. This
package builds the same context from TFF's public framework pieces instead, and
makes sure the stock one never runs (`guard`):

    from tfbfl import runtime
    runtime.set_local_runtime(max_concurrent_computation_calls=2)
    ...  # invoke tff computations
    runtime.shutdown()   # optional: atexit does it too

Before a runtime is installed, any TFF computation raises `NoRuntimeError`
saying to call `set_local_runtime()`.

Guarantees of the local runtime:

* nothing listens on the network: `worker_binary` always serves on every
  interface, so it runs in new user + network namespaces whose only interface is
  loopback, reached through a Unix socket only this user can open ("netns"); where
  the kernel refuses namespaces, an LD_PRELOAD shim makes it bind 127.0.0.1 only
  ("loopback"); with neither, start-up fails naming both fixes, unless
  `TFBFL_WORKER_ISOLATION=none` asks for the stock open binary (`resolve_isolation`);
* the worker's output goes to `<log_dir>/tff_worker_<pid>_<n>.log`, never to our stdout
  (without a `log_dir`, the temp dir's log is removed at the end if it stayed empty);
* the worker is started with `PR_SET_PDEATHSIG = SIGKILL` (Linux), so it dies with
  its parent even on `kill -9`; it is also terminated by `LocalRuntime.close()`, by
  an `atexit` hook and by a `weakref.finalize` of the runtime; it runs in a process
  group of its own, so a terminal's Ctrl-C interrupts the parent, which then ends it;
* start-up waits at most `startup_timeout_s`; if the worker exits or never becomes
  ready, a `RuntimeError` names the binary, its address and quotes the log tail;
* every call re-checks that the worker is alive before building an executor, so a
  crashed worker raises a clear error instead of hanging.

Remote mode (several machines; see BUILD.md, "Running on several machines"): each
worker machine runs `tfbfl-worker --port=P` (`tfbfl.worker`), and the controller

    runtime.set_runtime("remote", workers=["host1:8000", "host2:8000"])
    # TLS: ..., tls_ca="ca.pem", tls_cert="controller.pem", tls_key="controller.key")
    # or: with runtime.RemoteRuntime(["host1:8000", "host2:8000"]): ...

`set_runtime("local")` is `set_local_runtime()`.

Modules, one idea each (all names are re-exported here):

* `process_wide`   the process-wide runtime: `set_local_runtime`, `set_runtime`, `shutdown`.
* `local`          `LocalRuntime`: TFF's sync context over an owned worker.
* `remote`         `RemoteRuntime`, `DeadlineGrpcStub`, `WorkerError`: TFF's mergeable
                   context over `tfbfl-worker` services.
* `worker_process` `WorkerProcess`: one owned `worker_binary` (log, start-up, liveness).
* `isolation`      keeping it off the network ("netns" / "loopback" / "none").
* `lifetime`       PR_SET_PDEATHSIG, process group, termination of a child.
* `channels`       gRPC options, worker addresses, TLS credentials.
* `settings`       `RuntimeOptions`, the runtime's flags.
* `guard`          replaces TFF's stock context by one that refuses to run.
* `check`          `check_install` (`python -m tfbfl.runtime`).
* `netns_bridge.py` (a script run inside the namespace) and `preload_shim.c` (the
  "loopback" LD_PRELOAD shim, compiled at run time) are the package's data.
"""

from tfbfl.runtime import channels
from tfbfl.runtime import isolation
from tfbfl.runtime import lifetime
from tfbfl.runtime.channels import channel_credentials
from tfbfl.runtime.channels import parse_worker_address
from tfbfl.runtime.check import check_install
from tfbfl.runtime.guard import NoRuntimeError
from tfbfl.runtime.isolation import ISOLATION_ENV
from tfbfl.runtime.isolation import resolve_isolation
from tfbfl.runtime.local import LocalRuntime
from tfbfl.runtime.process_wide import current_runtime
from tfbfl.runtime.process_wide import mergeable_context_active
from tfbfl.runtime.process_wide import set_local_runtime
from tfbfl.runtime.process_wide import set_runtime
from tfbfl.runtime.process_wide import shutdown
from tfbfl.runtime.remote import DeadlineGrpcStub
from tfbfl.runtime.remote import RemoteRuntime
from tfbfl.runtime.remote import WorkerError
from tfbfl.runtime.settings import RuntimeOptions
from tfbfl.runtime.worker_process import WorkerExited
from tfbfl.runtime.worker_process import WorkerProcess
from tfbfl.runtime.worker_process import worker_binary_path

# The names `tfbfl.worker` and the tests use from the single-module runtime. To
# replace one in a test, patch the module that defines it (e.g. `isolation`).
_GRPC_OPTIONS = channels.GRPC_OPTIONS
_read_pem = channels.read_pem
_log_tail = lifetime.log_tail
_loopback_shim = isolation.loopback_shim
_netns_available = isolation.netns_available

__all__ = [
    "DeadlineGrpcStub", "ISOLATION_ENV", "LocalRuntime", "NoRuntimeError", "RemoteRuntime",
    "RuntimeOptions", "WorkerError", "WorkerExited", "WorkerProcess", "channel_credentials",
    "check_install",
    "current_runtime", "mergeable_context_active", "parse_worker_address",
    "resolve_isolation", "set_local_runtime", "set_runtime", "shutdown", "worker_binary_path"
]

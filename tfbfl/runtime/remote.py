"""`RemoteRuntime`: TFF's mergeable context over `tfbfl-worker` services on other machines.

Each worker machine runs `tfbfl-worker --port=P` (`tfbfl.worker`; 127.0.0.1 unless
`--host`, TLS with `--tls_cert --tls_key [--tls_client_ca]`); the controller
installs TFF's mergeable context over one sync context per worker
(`DeadlineGrpcStub` -> `RemoteExecutor` -> `ResourceManagingExecutorFactory` ->
`SyncExecutionContext`, invoked in a thread per worker); a round's clients are
split across the workers. Every RPC has a deadline and a failed worker raises
`WorkerError` naming it; a hung one within one `call_timeout_s`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Optional, Sequence

import grpc

from tfbfl import _lazy
from tfbfl.runtime import channels
from tfbfl.runtime import worker_context

# TensorFlow and TFF load when a runtime or stub is built, not when this is imported.
tff = _lazy.load("tensorflow_federated")
executor_pb2_grpc = _lazy.load("tensorflow_federated.proto.v0.executor_pb2_grpc")
aggregators = _lazy.load("tfbfl.aggregators")


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

  `credentials`: `grpc.ChannelCredentials` for TLS (see `channels.channel_credentials`);
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
    if call_timeout_s <= 0:
      raise ValueError(f"call_timeout_s must be > 0, got {call_timeout_s}.")
    self.address = channels.parse_worker_address(address)
    self.call_timeout_s = float(call_timeout_s)
    self.tls = credentials is not None
    if channel is None:
      # Its own connections: from gRPC's shared pool, a channel to an address another
      # live channel holds is READY at once, even to a worker that has since hung.
      options = list(channels.GRPC_OPTIONS) + [("grpc.use_local_subchannel_pool", 1)]
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
  `tfbfl.round_loop`). Per worker:

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
    self.workers = tuple(channels.parse_worker_address(w) for w in workers)
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
    # Checks the files now.
    self._credentials = channels.channel_credentials(tls_ca, tls_cert, tls_key)
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
    return worker_context.sync_worker_context(lambda: stub, lambda: self.default_num_clients)

  def close(self) -> None:
    """Closes the connections (the workers keep serving) and, if this runtime's
    context is still TFF's default, reinstates the one it replaced. Idempotent."""
    if self.context is None:
      return
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

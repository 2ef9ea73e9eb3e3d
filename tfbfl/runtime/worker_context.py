"""The execution context over one TFF worker: what `LocalRuntime` installs, and
each worker's context inside `RemoteRuntime`'s mergeable context.

`SyncExecutionContext` <- `ResourceManagingExecutorFactory` <- `RemoteExecutor`
on the worker's gRPC stub, compiled by `tfbfl.aggregators.worker_compiler` (secure
sums lowered), with TFF's TensorFlow argument/result transforms.
"""

from __future__ import annotations

from typing import Any, Callable

from tfbfl import _lazy

tff = _lazy.load("tensorflow_federated")
aggregators = _lazy.load("tfbfl.aggregators")


def sync_worker_context(stub: Callable[[], Any], default_num_clients: Callable[[], int]):
  """A `tff.framework.SyncExecutionContext` whose executors run on `stub()` (called
  for every executor stack: it may check the worker first); a computation that does
  not fix the number of clients gets `default_num_clients()`."""

  def stack_fn(cardinalities):
    worker = stub()
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = default_num_clients()
    executor = tff.framework.RemoteExecutor(worker)
    executor.set_cardinalities(cardinalities)
    return executor

  factory = tff.framework.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn)
  return tff.framework.SyncExecutionContext(
      executor_fn=factory,
      compiler_fn=aggregators.worker_compiler,  # secure sums lowered (see there)
      transform_args=tff.tensorflow.transform_args,
      transform_result=tff.tensorflow.transform_result)

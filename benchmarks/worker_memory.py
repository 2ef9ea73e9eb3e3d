r"""The local TFF worker's memory over many rounds: glibc's default arenas vs. two.

    python -m benchmarks.worker_memory             # 80 calls, 20 clients x 3000 x 784 float32
    python -m benchmarks.worker_memory --quick     # 20 calls

One federated computation, the shape of a round in which every client sends its
data (FOLA's learning curves on MNIST: 20 clients, ~188 MB of float32 pixels a
round), is called `--calls` times per leg; after each call the worker's resident
memory (its process tree, RSS) is read. Legs, one after the other in this process,
each with a worker of its own (`tfbfl.runtime.LocalRuntime`):
  * default:  the worker's allocator as glibc sets it (up to 8 arenas a core);
  * arenas=2: the worker started with `MALLOC_ARENA_MAX=2` in its environment.
The table gives RSS after 5 calls, the peak and the last, and the median seconds a
call with its ratio to the default leg. The worker's RSS rising over rounds with
no growth in what the round holds is the allocator's high-water mark (freed
blocks kept in per-thread arenas), not data kept alive; the second leg shows how
much of it fewer arenas give back.
"""

import os
import time

from absl import app
from absl import flags
import numpy as np
import psutil
import tensorflow as tf
import tensorflow_federated as tff

from tfbfl import runtime

_CALLS = flags.DEFINE_integer("calls", 80, "Calls per leg.", lower_bound=6)
_CLIENTS = flags.DEFINE_integer("clients", 20, "Clients per call.", lower_bound=1)
_EXAMPLES = flags.DEFINE_integer("examples", 3000, "Examples (rows of 784 float32) a client.",
                                 lower_bound=1)
_QUICK = flags.DEFINE_bool("quick", False, "20 calls per leg.")

ARENAS_VAR = "MALLOC_ARENA_MAX"
LEGS = (("default", None), ("arenas=2", "2"))


def _tree_rss_mb(pid: int) -> float:
  """Resident memory of process `pid` and its descendants, MiB."""
  proc = psutil.Process(pid)
  procs = [proc] + proc.children(recursive=True)
  return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20


def _round_computation(examples: int) -> tff.Computation:
  client_type = tff.TensorType(np.float32, [examples, 784])
  client_sum = tff.tensorflow.computation(lambda x: tf.reduce_sum(x), client_type)

  @tff.federated_computation(tff.FederatedType(client_type, tff.CLIENTS))
  def round_fn(data):
    return tff.federated_sum(tff.federated_map(client_sum, data))

  return round_fn


def run_leg(arenas, calls: int, data) -> dict:
  """`calls` calls on a fresh worker started with `MALLOC_ARENA_MAX=arenas` (None: unset)."""
  saved = os.environ.pop(ARENAS_VAR, None)
  if arenas is not None:
    os.environ[ARENAS_VAR] = arenas
  try:
    with runtime.LocalRuntime() as rt:
      round_fn = _round_computation(data[0].shape[0])
      rss, seconds = [], []
      for _ in range(calls):
        start = time.perf_counter()
        round_fn(data)
        seconds.append(time.perf_counter() - start)
        rss.append(_tree_rss_mb(rt.worker.process.pid))
  finally:
    os.environ.pop(ARENAS_VAR, None)
    if saved is not None:
      os.environ[ARENAS_VAR] = saved
  return dict(rss=rss, s_per_call=float(np.median(seconds)))


def main(argv):
  del argv
  calls = 20 if _QUICK.value else _CALLS.value
  rng = np.random.default_rng(0)
  data = [rng.random((_EXAMPLES.value, 784), dtype=np.float32) for _ in range(_CLIENTS.value)]
  mb = sum(x.nbytes for x in data) / 2**20
  load = os.getloadavg()[0]
  print(f"worker memory: {calls} calls a leg, {_CLIENTS.value} clients x {_EXAMPLES.value} x 784 "
        f"float32 ({mb:.0f} MiB a call); load {load:.1f} on {os.cpu_count()} cores at start",
        flush=True)
  results = {}
  for name, arenas in LEGS:
    results[name] = run_leg(arenas, calls, data)
    print(f"  {name}: done", flush=True)
  base = results[LEGS[0][0]]["s_per_call"]
  print(f"{'leg':<10} {'RSS@5 MiB':>10} {'peak MiB':>9} {'last MiB':>9} {'s/call':>7} "
        f"{'vs default':>10}")
  for name, _ in LEGS:
    r = results[name]
    print(f"{name:<10} {r['rss'][4]:10.0f} {max(r['rss']):9.0f} {r['rss'][-1]:9.0f} "
          f"{r['s_per_call']:7.2f} {base / r['s_per_call']:10.2f}")
  print(f"load {os.getloadavg()[0]:.1f} at the end; 'vs default' = default s/call / leg s/call "
        "(> 1: faster). Times on a loaded machine are not comparable across runs.")


if __name__ == "__main__":
  app.run(main)

r"""Rounds per minute of one fixed VIRTUAL round: local executor vs. 1, 2, 4 workers.

    python -m benchmarks.remote_scaling              # digits, 20 clients/round, 2 epochs
    python -m benchmarks.remote_scaling --quick      # 1 timed round, workers 1 and 2

Legs, all in this process, on the same `VirtualAlgorithm` and the same round
(server state, client states, seeds, data fixed); all workers stay up and the legs
take turns round by round (other load on the machine then hits all legs alike), and
each leg reports its median:
  * local:     `tfbfl.runtime.LocalRuntime` (one owned worker, the default);
  * remote-N:  N loopback `worker_binary` services (`runtime.WorkerProcess`)
               driven by `runtime.RemoteRuntime` (TFF's mergeable context), each
               worker allowed `max(1, cores // N)` concurrent client computations so
               the total concurrency equals the local leg's.
A remote leg runs `VirtualAlgorithm.next` (one TFF call; the mergeable form trains
every client twice, before and after the merge) and, when the algorithm has it,
`next_two_phase` (client phase + server phase; each client trains once).

On one machine no speed-up is possible (all workers share the same cores): the
ratios measure what remote execution costs — serialising client states and data
over gRPC, splitting and merging, and the recomputation of `next`. Everything
listens on and connects to localhost only.
"""

import os
import time

# gRPC logs "skipping fork() handlers" at INFO for every worker started once its
# threads run; keep the table readable.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from absl import logging
import numpy as np

from tfbfl import communication
from tfbfl import round_loop
from tfbfl import runtime
from tfbfl import driver
from tfbfl.algorithms import registry
from tfbfl.algorithms import virtual

_CLIENTS = flags.DEFINE_integer("clients", 20, "Clients per round (= all clients).")
_EPOCHS = flags.DEFINE_integer("epochs", 2, "Local epochs per round.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 5, "Timed rounds per leg (after one warm-up round); "
    "the legs take turns round by round.")
_WORKERS = flags.DEFINE_list("workers", ["1", "2", "4"], "Worker counts of the remote legs.")
_QUICK = flags.DEFINE_bool("quick", False, "1 timed round; workers 1 and 2.")


def main(argv):
  del argv
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.WARNING)  # TFF's compiler logs each grappler fallback at INFO
  rounds = 1 if _QUICK.value else _ROUNDS.value
  worker_counts = [1, 2] if _QUICK.value else [int(w) for w in _WORKERS.value]
  k = _CLIENTS.value
  cores = os.cpu_count() or 1
  params = driver.resolve_params(
      dict(num_clients=k, clients_per_round=k, epochs_per_round=_EPOCHS.value))
  fd = driver.load_data(params)
  cfg = registry.get("virtual").make_config(params, fd)
  data = [fd.train[c] for c in fd.client_ids]
  seeds = [round_loop.client_seed(0, 1, i) for i in range(k)]

  stack = tff.framework.get_context_stack()
  runtimes, workers = [], []
  try:
    groups = []
    for n in worker_counts:
      groups.append([
          runtime.WorkerProcess(max_concurrent_computation_calls=max(1, cores // n))
          for _ in range(n)
      ])
      workers += groups[-1]
    local = runtime.LocalRuntime(max_concurrent_computation_calls=cores).start()
    runtimes.append(local)
    alg = virtual.VirtualAlgorithm(cfg)
    server = alg.initial_server_state()
    states = [alg.initial_client_state(i) for i in range(k)]
    state_bytes = communication.dense_bytes(states[0])
    round_fns = {"next": alg.next}
    if hasattr(alg, "next_two_phase"):
      round_fns["next_two_phase"] = alg.next_two_phase
    legs = [("local", local.context, "next")]
    for n, group in zip(worker_counts, groups):
      remote = runtime.RemoteRuntime([w.address for w in group]).start()
      runtimes.append(remote)
      legs += [(f"remote-{n}", remote.context, fn) for fn in round_fns]

    def one_round(leg):
      _, context, fn = leg
      with stack.install(context):
        t = time.perf_counter()
        round_fns[fn](server, states, seeds, data)
        return time.perf_counter() - t

    # All workers stay up; the legs take turns round by round, so that load from
    # anything else on the machine spreads over all of them alike.
    for leg in legs:
      one_round(leg)  # warm-up: tracing, compilation, executor caches
    times = {leg: [] for leg in legs}
    for _ in range(rounds):
      for leg in legs:
        times[leg].append(one_round(leg))
  finally:
    for rt in reversed(runtimes):
      rt.close()
    for w in workers:
      w.close()

  t_local = float(np.median(times[legs[0]]))
  print(f"VIRTUAL round: digits, {k} clients per round, {_EPOCHS.value} epochs, MLP "
        f"{cfg.input_dim}-{'-'.join(map(str, cfg.hidden_units))}-{cfg.num_classes}, "
        f"{cores} cores, median of {rounds} interleaved rounds; one client state "
        f"{state_bytes / 1e6:.2f} MB ({k * state_bytes / 1e6:.1f} MB of states sent and "
        "returned per round)")
  print(f"{'leg':<10} {'round function':<16} {'s/round':>8} {'rounds/min':>11} {'vs local':>9}")
  for leg in legs:
    t = float(np.median(times[leg]))
    print(f"{leg[0]:<10} {leg[2]:<16} {t:8.2f} {60.0 / t:11.1f} {t_local / t:9.2f}")
  print("'vs local' = (rounds/min) / (local rounds/min); < 1 is overhead. On one machine "
        "the workers share its cores, so no speed-up is expected.")


if __name__ == "__main__":
  app.run(main)

r"""Per-round wall time of VIRTUAL through TFF vs. the same work without TFF vs. FedAvg.

    python -m benchmarks.round_time            # digits, 10 clients x 20 epochs, MLP 2x100
    python -m benchmarks.round_time --quick

Measured side by side in one process:
  (a) VIRTUAL rounds through TFF (`VirtualAlgorithm.next`, owned local runtime);
  (b) the identical client code (`virtual.client_update`, one traced tf.function)
      run client after client in plain TensorFlow, no TFF, no aggregation;
  (c) FedAvg rounds through TFF on the deterministic network of the same shape.
Prints a/b (TFF overhead; target <= 1.2) and a/c (Bayesian cost; target <= 2.5),
and the memory one stored VIRTUAL client state takes.
(b) runs first: Keras layers built eagerly after a TFF computation has traced Keras
models fail (`_assert_built_as_v1`), so the plain leg must come before TFF.
"""

import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from tfbfl import communication
from tfbfl import runtime
from tfbfl import training
from tfbfl.algorithms import virtual

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds per leg (after one warm-up round).")
_EPOCHS = flags.DEFINE_integer("epochs", 20, "Local epochs per round.")
_CLIENTS = flags.DEFINE_integer("clients", 10, "Clients per round (= all clients).")
_CONCURRENCY = flags.DEFINE_integer(
    "max_concurrent_computation_calls", None,
    "Client computations the TFF worker runs at once (default: CPU count).")
_QUICK = flags.DEFINE_bool("quick", False, "2 timed rounds of 5 epochs.")


def _timed(fn, rounds):
  fn(0)  # warm-up: tracing, worker start, executor cache
  times = []
  for r in range(1, rounds + 1):
    t = time.perf_counter()
    fn(r)
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def main(argv):
  del argv
  rounds, epochs = (2, 5) if _QUICK.value else (_ROUNDS.value, _EPOCHS.value)
  k = _CLIENTS.value
  params = training.resolve_params(dict(num_clients=k, clients_per_round=k, epochs_per_round=epochs))
  fd = training.load_data(params)
  data = [fd.train[c] for c in fd.client_ids]
  seeds = lambda r: [np.array([0, 1000 * r + i], np.int64) for i in range(k)]
  cfg = virtual.config_from_params(fd, params)

  # (b) plain TensorFlow, same client code, traced once.
  init_post = virtual.initial_posterior(cfg)
  states = [virtual.initial_client_state(cfg, i, init_post) for i in range(k)]
  exact = lambda t: tf.TensorSpec(np.shape(t), tf.as_dtype(np.asarray(t).dtype))
  signature = [tf.nest.map_structure(exact, init_post), tf.nest.map_structure(exact, states[0]),
               tf.TensorSpec([2], tf.int64), tf.TensorSpec([None, cfg.input_dim], tf.float32),
               tf.TensorSpec([None], tf.int32)]
  # One trace (fixed signature), like the TFF computation: variables are created once.
  net = virtual.build_networks(cfg)
  plain = tf.function(
      lambda post, state, seed, x, y: virtual.client_update(cfg, post, state, seed, x, y, net=net),
      input_signature=signature)

  def plain_round(r):
    for state, seed, (x, y) in zip(states, seeds(r), data):
      out = plain(init_post, state, tf.constant(seed), tf.constant(x), tf.constant(y))
    np.asarray(out.num_examples)
  t_plain = _timed(plain_round, rounds)

  runtime.set_local_runtime(max_concurrent_computation_calls=_CONCURRENCY.value)
  # (a) VIRTUAL through TFF.
  alg = virtual.VirtualAlgorithm(cfg)
  server = alg.initial_server_state()
  client_states = [alg.initial_client_state(i) for i in range(k)]
  t_virtual = _timed(lambda r: alg.next(server, client_states, seeds(r), data), rounds)

  # (c) FedAvg through TFF, same architecture.
  t_fedavg = None
  try:
    fedavg = training.build_algorithm(fd, dict(params, algorithm="fedavg", server_lr=1.0))
    fs = fedavg.initial_server_state()
    fcs = [fedavg.initial_client_state(i) for i in range(k)]
    t_fedavg = _timed(lambda r: fedavg.next(fs, fcs, seeds(r), data), rounds)
  except ValueError as e:
    print(f"(c) FedAvg not available: {e}")

  state_bytes = communication.dense_bytes(client_states[0])
  print(f"digits, {k} clients/round x {epochs} epochs, batch {cfg.batch_size}, MLP {cfg.input_dim}-"
        f"{'-'.join(map(str, cfg.hidden_units))}-{cfg.num_classes}; median of {rounds} rounds")
  print(f"(a) VIRTUAL via TFF        {t_virtual:8.3f} s/round")
  print(f"(b) same clients, plain TF {t_plain:8.3f} s/round")
  if t_fedavg is not None:
    print(f"(c) FedAvg via TFF         {t_fedavg:8.3f} s/round")
  print(f"a/b = {t_virtual / t_plain:.2f}   (TFF overhead; target <= 1.2)")
  if t_fedavg is not None:
    print(f"a/c = {t_virtual / t_fedavg:.2f}   (Bayesian cost; target <= 2.5)")
  print(f"one stored VIRTUAL client state: {state_bytes / 1e6:.2f} MB "
        f"(factor + posterior copy over shared weights + private network); "
        f"K clients need K times that")
  runtime.shutdown()


if __name__ == "__main__":
  app.run(main)

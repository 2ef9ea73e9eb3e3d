r"""Per-round wall time of VIRTUAL and FedAvg against their FLOP floors, side by side.

    python -m benchmarks.round_time            # digits, 10 clients x 20 epochs, MLP 2x100
    python -m benchmarks.round_time --quick

Measured in one process, in this order:
  (m) the machine's large-matmul rate (1024 x 1024 float32 matmuls, GFLOP/s), and
      the rate of the step's own matmul shape ([B x 100] @ [100 x 100]), one
      client and all clients batched (per-op cost included);
  (b) VIRTUAL's client computation (`virtual.client_update`, one traced
      `tf.function`: the lean step) run client after client in plain TensorFlow;
  (k) VIRTUAL rounds through TFF with the Keras layers step by step
      (`lean_step=False`, the step before issue 13; `--nokeras_leg` skips it);
  (a) VIRTUAL rounds through TFF (`VirtualAlgorithm.next`, owned local runtime),
      once per `--clients_per_group` (1: one TFF client computation per client;
      more: that many clients stacked and trained batched, `client_batch`);
  (c) FedAvg rounds through TFF on the paper's network (the server network).
(a), (k) and (b) run the same objective on the same seeds, minibatches and noise
(no XLA anywhere: TFF's worker does not honour `jit_compile`), so they produce the
same numbers up to float summation order: the benchmark prints the largest
difference between each TFF leg's server posterior and the one (b)'s client
deltas give.

FLOPs are counted from the networks and the data: per example and SGD step a
Bayesian dense layer (local reparameterization) costs two matmuls forward (mean and
variance, `2 * 2 * n_in * n_out`) and a deterministic one `2 * n_in * n_out`; the
backward pass costs twice the forward; every step computes a full (masked)
minibatch. A round's floor is its FLOPs at the measured large-matmul rate. Printed:
each round as a multiple of its own floor, and VIRTUAL / FedAvg (best (a) leg).
Targets (issue 13): VIRTUAL <= 4x its floor, FedAvg <= 4x its own, VIRTUAL/FedAvg <= 10x.
(b) runs before TFF: Keras layers built eagerly after a TFF computation has traced
Keras models fail (`_assert_built_as_v1`).
"""

import dataclasses
import os
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from tfbfl import communication
from tfbfl import gaussian
from tfbfl import runtime
from tfbfl import training
from tfbfl.algorithms import registry
from tfbfl.algorithms import virtual
from tfbfl.layers import BayesianDense

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds per leg (after one warm-up round).")
_EPOCHS = flags.DEFINE_integer("epochs", 20, "Local epochs per round.")
_CLIENTS = flags.DEFINE_integer("clients", 10, "Clients per round (= all clients).")
_CONCURRENCY = flags.DEFINE_integer(
    "max_concurrent_computation_calls", None,
    "Client computations the TFF worker runs at once (default: CPU count).")
_QUICK = flags.DEFINE_bool("quick", False, "2 timed rounds of 5 epochs.")
_KERAS = flags.DEFINE_bool(
    "keras_leg", True, "Also time VIRTUAL with lean_step=False (the "
    "Keras layers step by step: the step before the lean one).")
_GROUPS = flags.DEFINE_list(
    "clients_per_group", ["1", "5", "10"],
    "VIRTUAL via TFF is timed once per value: this many of the round's clients are "
    "stacked into one TFF client computation and train batched (1: one by one).")


def _timed(fn, rounds):
  fn(0)  # warm-up: tracing, worker start, executor cache
  times = []
  for r in range(1, rounds + 1):
    t = time.perf_counter()
    fn(r)
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _gflops(run, flops):
  """GFLOP/s of `run()` doing `flops`: median of 3 timings after a warm-up call."""
  run()
  times = []
  for _ in range(3):
    t = time.perf_counter()
    run()
    times.append(time.perf_counter() - t)
  return flops / float(np.median(times)) / 1e9


def matmul_gflops(n=1024, repeats=20):
  """Large float32 matmul rate of this machine, GFLOP/s (median of 3 timings)."""
  a = tf.random.stateless_normal([n, n], seed=[1, 2])
  b = tf.random.stateless_normal([n, n], seed=[3, 4])

  @tf.function
  def chain(x):
    for _ in range(repeats):
      x = tf.matmul(x, b) * (1.0 / n)
    return x

  return _gflops(lambda: chain(a).numpy(), 2.0 * n**3 * repeats)


def small_matmul_gflops(batch, n_in, n_out, clients=1, repeats=200):
  """The rate of the step's own matmul shape, `[clients, batch, n_in] @ [clients,
  n_in, n_out]` chained in one graph (per-op cost included), GFLOP/s."""
  x = tf.random.stateless_normal([clients, batch, n_in], seed=[5, 6])
  w = tf.random.stateless_normal([clients, n_in, n_out], seed=[7, 8]) / n_in

  @tf.function
  def chain(x):
    acc = tf.zeros([clients, batch, n_out])
    for _ in tf.range(repeats):
      acc += tf.matmul(x, w) if clients > 1 else tf.matmul(x[0], w[0])[None]
    return acc

  return _gflops(lambda: chain(x).numpy(), 2.0 * clients * batch * n_in * n_out * repeats)


def _dense_macs(layers):
  """sum of n_in * n_out over the kernels of `layers` (BayesianDense or Keras Dense)."""
  return sum(
      int(np.prod(l.kernel_loc.shape if isinstance(l, BayesianDense) else l.kernel.shape))
      for l in layers)


def bayesian_layers(net):
  """Every BayesianDense of a VirtualNetworks: server, client and lateral adapters."""
  layers = list(net.server_layers) + list(net.client_layers)
  for lateral in net.laterals:
    layers += [lateral.adapter_in, lateral.adapter_out]
  return [l for l in layers if isinstance(l, BayesianDense)]


def round_flops(examples_computed, macs, bayesian):
  """Forward + backward FLOPs of a round: 3 x forward, forward = (2 if Bayesian
  else 1) matmuls of 2 * macs per example."""
  return 3.0 * (2.0 if bayesian else 1.0) * 2.0 * macs * examples_computed


def main(argv):
  del argv
  rounds, epochs = (2, 5) if _QUICK.value else (_ROUNDS.value, _EPOCHS.value)
  k = _CLIENTS.value
  params = training.resolve_params(dict(num_clients=k, clients_per_round=k,
                                        epochs_per_round=epochs))
  fd = training.load_data(params)
  data = [fd.train[c] for c in fd.client_ids]
  seeds = lambda r: [np.array([0, 1000 * r + i], np.int64) for i in range(k)]
  cfg = registry.get("virtual").make_config(params, fd)
  batch = cfg.batch_size
  examples = sum(epochs * -(-len(y) // batch) * batch for _, y in data)  # padded minibatches
  load = os.getloadavg()[0]

  rate = matmul_gflops()
  width = cfg.hidden_units[0]
  small = {c: small_matmul_gflops(cfg.batch_size, width, width, c) for c in (1, k)}

  # (b) plain TensorFlow, same client code, traced once.
  init_post = virtual.initial_posterior(cfg)
  states = [virtual.initial_client_state(cfg, i, init_post) for i in range(k)]
  exact = lambda t: tf.TensorSpec(np.shape(t), tf.as_dtype(np.asarray(t).dtype))
  signature = [
      tf.nest.map_structure(exact, init_post),
      tf.nest.map_structure(exact, states[0]),
      tf.TensorSpec([2], tf.int64),
      tf.TensorSpec([None, cfg.input_dim], tf.float32),
      tf.TensorSpec([None], tf.int32)
  ]
  net = virtual.build_networks(cfg)
  net.forward(tf.zeros([1, cfg.input_dim]))  # build the layers for the FLOP count
  virtual_macs = _dense_macs(bayesian_layers(net))
  server_macs = _dense_macs(net.server_layers)
  plain = tf.function(
      lambda post, state, seed, x, y: virtual.client_update(cfg, post, state, seed, x, y, net=net),
      input_signature=signature)
  deltas = {}

  def plain_round(r):
    outs = [
        plain(init_post, state, tf.constant(seed), tf.constant(x), tf.constant(y))
        for state, seed, (x, y) in zip(states, seeds(r), data)
    ]
    deltas[r] = [o.delta for o in outs]

  t_plain = _timed(plain_round, rounds)

  runtime.set_local_runtime(max_concurrent_computation_calls=_CONCURRENCY.value)
  # (a) VIRTUAL through TFF, clients in `g` batched groups.
  t_groups, diffs = {}, {}
  legs = [("keras", dict(lean_step=False))] if _KERAS.value else []
  legs += [(int(g), dict(clients_per_group=int(g))) for g in _GROUPS.value]
  for groups, change in legs:
    alg = virtual.VirtualAlgorithm(dataclasses.replace(cfg, **change))
    server = alg.initial_server_state()
    client_states = [alg.initial_client_state(i) for i in range(k)]
    servers = {}

    def tff_round(r, alg=alg, server=server, client_states=client_states, servers=servers):
      servers[r] = alg.next(server, client_states, seeds(r), data)[0]

    t_groups[groups] = _timed(tff_round, rounds)
    # Same computation, same seeds: s * (prod_i Delta_i)^alpha from (b) vs (a)'s server.
    total = gaussian.product(*[gaussian.NaturalGaussian(*d) for d in deltas[1]])
    want = gaussian.product(server.posterior, gaussian.power(total, cfg.step))
    got = servers[1].posterior
    diff = max(
        float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
        for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)))
    scale = max(float(np.max(np.abs(np.asarray(w)))) for w in tf.nest.flatten(want))
    diffs[groups] = diff / scale
  t_keras = t_groups.pop("keras", None)
  diff_keras = diffs.pop("keras", None)
  best = min(t_groups, key=t_groups.get)
  t_virtual = t_groups[best]

  # (c) FedAvg through TFF on the server network.
  fedavg = training.build_algorithm(fd, dict(params, algorithm="fedavg", server_lr=1.0))
  fs = fedavg.initial_server_state()
  fcs = [fedavg.initial_client_state(i) for i in range(k)]
  t_fedavg = _timed(lambda r: fedavg.next(fs, fcs, seeds(r), data), rounds)

  flops_v = round_flops(examples, virtual_macs, bayesian=True)
  flops_f = round_flops(examples, server_macs, bayesian=False)
  floor_v, floor_f = flops_v / (rate * 1e9), flops_f / (rate * 1e9)
  state_bytes = communication.dense_bytes(states[0])
  print(f"digits, {k} clients/round x {epochs} epochs, batch {batch}, MLP {cfg.input_dim}-"
        f"{'-'.join(map(str, cfg.hidden_units))}-{cfg.num_classes}; median of {rounds} rounds; "
        f"load average at start {load:.2f}")
  print(f"(m) large-matmul rate           {rate:8.1f} GFLOP/s")
  print(f"    FLOPs a round: VIRTUAL {flops_v / 1e9:.2f} G ({virtual_macs} weights in Bayesian "
        f"kernels), FedAvg {flops_f / 1e9:.2f} G ({server_macs}); {examples} examples computed")
  print(f"    the step's matmul shape [{batch}x{width}]@[{width}x{width}]: "
        f"{small[1]:.1f} GFLOP/s one client, {small[k]:.1f} GFLOP/s {k} clients batched "
        f"(VIRTUAL's floor at that rate: {flops_v / (small[k] * 1e9):.3f} s)")
  for groups, t in t_groups.items():
    print(f"(a) VIRTUAL via TFF, {groups:2d} per group {t:7.3f} s/round  = {t / floor_v:5.1f}x "
          f"its floor {floor_v:.3f} s (target <= 4); vs (b): posterior differs "
          f"{diffs[groups]:.1g} relative")
  if t_keras is not None:
    print(f"(k) VIRTUAL via TFF, Keras step {t_keras:7.3f} s/round  = {t_keras / floor_v:5.1f}x "
          f"its floor (lean_step=False: the layers step by step, the previous default); "
          f"vs (b): posterior differs {diff_keras:.1g} relative; k/a = {t_keras / t_virtual:.2f}")
  print(f"(b) clients one by one, plain TF {t_plain:8.3f} s/round  = {t_plain / floor_v:5.1f}x "
        f"its floor")
  print(f"(c) FedAvg via TFF              {t_fedavg:8.3f} s/round  = {t_fedavg / floor_f:5.1f}x "
        f"its floor {floor_f:.3f} s (target <= 4)")
  print(f"a/b = {t_virtual / t_plain:.2f} (best (a), {best} per group, over (b))")
  print(f"a/c = {t_virtual / t_fedavg:.2f} (VIRTUAL / FedAvg; target <= 10; FLOP ratio "
        f"{flops_v / flops_f:.1f})")
  print(f"one stored VIRTUAL client state: {state_bytes / 1e6:.2f} MB "
        f"(factor + posterior copy over shared weights + private network); "
        f"K clients need K times that")
  runtime.shutdown()


if __name__ == "__main__":
  app.run(main)

r"""Per-round wall time of VIRTUAL and FedAvg, side by side, on digits and MNIST.

    python -m benchmarks.round_time                      # digits, then MNIST (if present)
    python -m benchmarks.round_time --dataset=mnist      # the paper's MNIST protocol only
    python -m benchmarks.round_time --quick              # 2 timed rounds of 5 epochs

Datasets (training-only rounds: nothing is evaluated inside a timed round):
  digits  the bundled stand-in: 10 clients, all of them every round, E = 20, B = 20,
          MLP 64-100-100-10;
  mnist   the paper's protocol (VIRTUAL Sec. IV, `reproduction.presets`'s "mnist"): 100
          clients x 600 examples (homogeneous), C = 10 a round, E = 20, B = 20, MLP
          784-100-100-10; read from `--data_dir` (default `../shared/data/mnist` beside
          the repository; the dataset is skipped, with the reason, where the files are
          absent).

Measured in one process per dataset, in this order:
  (m) the machine's large-matmul rate (1024 x 1024 float32 matmuls, GFLOP/s), and
      the rate of the step's own matmul shape ([B x 100] @ [100 x 100]), one
      client and all clients batched (per-op cost included);
  (b) VIRTUAL's client computation (`virtual.client_update`, one traced
      `tf.function`: the lean step) run client after client in plain TensorFlow;
  (k) VIRTUAL rounds through TFF with the Keras layers step by step
      (`lean_step=False`; `--keras_leg`, digits only);
  (r) VIRTUAL rounds through TFF with the reference step (`virtual_step.sgd_step`,
      the lean step before issue 22; `--reference_leg`);
  (a) VIRTUAL rounds through TFF (`VirtualAlgorithm.next`, owned local runtime),
      once per `--clients_per_group` (1: one TFF client computation per client;
      more: that many clients stacked and trained batched, `client_batch`);
  (u) VIRTUAL rounds through TFF of the same network written by a user as a Keras
      model (`--model`'s path, `benchmarks.protocols.user_mlp`), alternated with
      (a)'s preset (ABBA order, `--own_model_repeats` times each): the ratio of the
      medians (target <= 1.05, issue 64; `benchmarks.own_model` has the
      FEMNIST conv net's pair);
  (c) FedAvg rounds through TFF on the paper's network (the server network);
  (e) VIRTUAL's evaluation, timed apart from the rounds: S (`evaluate_server`, every
      client's test data) and MT (`evaluate_clients`, every client's state, and the
      states of one round's clients: what the MT cache recomputes), at the posterior
      means and with the default Monte Carlo predictive (`--eval_samples`).
(a), (k) and (b) run the same objective on the same seeds, minibatches and noise (no
XLA: TFF's worker does not honour `jit_compile`), so they produce the same numbers up
to float summation order: the benchmark prints the largest difference between each
TFF leg's server posterior and the one (b)'s client deltas give.

FLOPs are counted from the networks and the data: per example and SGD step a
Bayesian dense layer (local reparameterization) costs two matmuls forward (mean and
variance, `2 * 2 * n_in * n_out`) and a deterministic one `2 * n_in * n_out`; the
backward pass costs twice the forward; every step computes a full (masked)
minibatch. VIRTUAL counts its server, client and lateral networks. Printed: each
round as a multiple of its floor (FLOPs at the large-matmul rate) and VIRTUAL /
FedAvg beside the FLOP ratio. Targets (issue 22): MNIST VIRTUAL / FedAvg <= 6 (FLOP
ratio ~4.9), digits <= 9 (FLOP ratio 8.6).

With `--profile` (default) the per-op profile of one VIRTUAL client update
(`benchmarks.profile_virtual`) follows each dataset's timings.
(b) runs before TFF: Keras layers built eagerly after a TFF computation has traced
Keras models fail (`_assert_built_as_v1`).
"""

import contextlib
import dataclasses
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from benchmarks import profile_virtual
from benchmarks.protocols import DEFAULT_MNIST_DIR, abba, dataset_params, mnist_missing, user_mlp

from tfbfl import communication
from tfbfl import gaussian
from tfbfl import runtime
from tfbfl import driver
from tfbfl.algorithms import registry
from tfbfl.algorithms import virtual
from tfbfl.algorithms.virtual import step as virtual_step
from tfbfl.layers import BayesianDense

_DATASETS = flags.DEFINE_list("dataset", ["digits", "mnist"],
                              "digits and/or mnist (the paper's protocol), in this order.")
_DATA_DIR = flags.DEFINE_string("data_dir", DEFAULT_MNIST_DIR, "MNIST idx files (.gz).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds per leg (after one warm-up round).")
_EPOCHS = flags.DEFINE_integer("epochs", 20, "Local epochs per round.")
_CONCURRENCY = flags.DEFINE_integer(
    "max_concurrent_computation_calls", None,
    "Client computations the TFF worker runs at once (default: CPU count).")
_QUICK = flags.DEFINE_bool("quick", False, "2 timed rounds of 5 epochs.")
_KERAS = flags.DEFINE_bool(
    "keras_leg", False, "Also time VIRTUAL with lean_step=False (the Keras layers step "
    "by step), digits only.")
_REFERENCE = flags.DEFINE_bool(
    "reference_leg", True, "Also time VIRTUAL via TFF with the reference step "
    "(`virtual_step.sgd_step`, the lean step before issue 22's fused one).")
_PLAIN = flags.DEFINE_bool("plain_leg", True, "Time (b): client_update in plain TensorFlow.")
_OWN_MODEL = flags.DEFINE_integer(
    "own_model_repeats", 2,
    "(u): timings of each side (the preset, the user's Keras model), ABBA order; 0 skips.")
_EVAL = flags.DEFINE_bool("eval", True, "Time VIRTUAL's S and MT evaluation (e).")
_PROFILE = flags.DEFINE_bool("profile", True,
                             "Print the per-op profile of one VIRTUAL client update.")
_GROUPS = flags.DEFINE_list(
    "clients_per_group", ["1"],
    "VIRTUAL via TFF is timed once per value: this many of the round's clients are "
    "stacked into one TFF client computation and train batched (1: one by one).")

TARGETS = dict(digits=9.0, mnist=6.0)


@contextlib.contextmanager
def reference_step(on):
  """While `on`, VIRTUAL's clients train with the reference `sgd_step` (traced so)."""
  if not on:
    yield
    return
  orig = virtual_step.train_clients
  virtual_step.train_clients = lambda *a, **k: orig(*a, fused=False, **k)
  try:
    yield
  finally:
    virtual_step.train_clients = orig


def _timed(fn, rounds):
  fn(0)  # warm-up: tracing, worker start, executor cache
  times = []
  for r in range(1, rounds + 1):
    t = time.perf_counter()
    fn(r)
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _round_fn(alg, num, selected, seeds, data, servers=None):
  """A function of `r` running round `r` of `alg` from its initial states (the
  server state after it kept in `servers[r]`)."""
  server = alg.initial_server_state()
  client_states = [alg.initial_client_state(i) for i in range(num)]

  def tff_round(r):
    out = alg.next(server, [client_states[i] for i in selected(r)], seeds(r), data(r))[0]
    if servers is not None:
      servers[r] = out
  return tff_round


def own_model_leg(params, fd, cfg, rounds, round_fn):
  """(u): seconds a round of VIRTUAL on the preset network and on the same network
  given as a user's Keras model, alternated; None with --own_model_repeats=0."""
  if not _OWN_MODEL.value:
    return None
  template = driver.model_template(
      dict(params, model="benchmarks.protocols:user_mlp"), fd,
      model=user_mlp(fd.input_shape, cfg.hidden_units, cfg.num_classes))
  algs = {"preset": virtual.VirtualAlgorithm(cfg),
          "model": virtual.VirtualAlgorithm(
              registry.get("virtual").make_config(params, fd, model=template))}
  times = {k: [] for k in algs}
  for side in abba(tuple(algs), _OWN_MODEL.value):
    times[side].append(_timed(round_fn(algs[side]), rounds))
  return {k: float(np.median(v)) for k, v in times.items()}, times


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


def flop_ratio(cfg):
  """VIRTUAL / FedAvg FLOPs per example computed (server + client + lateral networks,
  local reparameterization, against the server network alone)."""
  net = virtual.build_networks(cfg)
  net.forward(tf.zeros([1, cfg.input_dim]))
  macs_v, macs_f = _dense_macs(bayesian_layers(net)), _dense_macs(net.server_layers)
  return round_flops(1, macs_v, True) / round_flops(1, macs_f, False), macs_v, macs_f


def run_dataset(name, rounds, epochs):
  """Times one dataset's legs; returns a dict of the results (also printed)."""
  params = driver.resolve_params(dataset_params(name, _DATA_DIR.value, epochs))
  fd = driver.load_data(params)
  k, num = params["clients_per_round"], params["num_clients"]
  selected = lambda r: [(r * k + i) % num for i in range(k)]
  all_data = [fd.train[c] for c in fd.client_ids]
  data = lambda r: [all_data[i] for i in selected(r)]
  seeds = lambda r: [np.array([0, 1000 * r + i], np.int64) for i in selected(r)]
  cfg = registry.get("virtual").make_config(params, fd)
  batch = cfg.batch_size
  examples = lambda r: sum(epochs * -(-len(y) // batch) * batch for _, y in data(r))
  load = os.getloadavg()
  print(f"== {name}: {k} of {num} clients a round x {epochs} epochs, batch {batch}, MLP "
        f"{cfg.input_dim}-{'-'.join(map(str, cfg.hidden_units))}-{cfg.num_classes}; median "
        f"of {rounds} training-only rounds after a warm-up; load average at start "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        flush=True)

  rate = matmul_gflops()
  width = cfg.hidden_units[0]
  small = {c: small_matmul_gflops(cfg.batch_size, width, width, c) for c in (1, k)}

  # (b) plain TensorFlow, same client code, traced once.
  init_post = virtual.initial_posterior(cfg)
  states = {i: virtual.initial_client_state(cfg, i, init_post) for i in range(num)}
  exact = lambda t: tf.TensorSpec(np.shape(t), tf.as_dtype(np.asarray(t).dtype))
  x_shape = [None] + list(np.shape(all_data[0][0])[1:])
  signature = [
      tf.nest.map_structure(exact, init_post),
      tf.nest.map_structure(exact, states[0]),
      tf.TensorSpec([2], tf.int64),
      tf.TensorSpec(x_shape, tf.float32),
      tf.TensorSpec([None], tf.int32)
  ]
  ratio, virtual_macs, server_macs = flop_ratio(cfg)
  net = virtual.build_networks(cfg)
  plain = tf.function(
      lambda post, state, seed, x, y: virtual.client_update(cfg, post, state, seed, x, y, net=net),
      input_signature=signature)
  deltas = {}

  def plain_round(r):
    outs = [
        plain(init_post, states[i], tf.constant(seed), tf.constant(x), tf.constant(y))
        for i, seed, (x, y) in zip(selected(r), seeds(r), data(r))
    ]
    deltas[r] = [o.delta for o in outs]

  t_plain = _timed(plain_round, rounds) if _PLAIN.value else None

  if _PROFILE.value:  # plain TensorFlow, before TFF (see the module docstring)
    x0, y0 = all_data[0]
    profile_virtual.print_profile(cfg, np.reshape(x0, [len(y0), -1]), y0, epochs=min(epochs, 2))

  runtime.set_local_runtime(max_concurrent_computation_calls=_CONCURRENCY.value)
  # (a) VIRTUAL through TFF, clients in `g` batched groups.
  t_groups, diffs = {}, {}
  legs = [("keras", dict(lean_step=False))] if _KERAS.value and name == "digits" else []
  legs += [("reference", dict())] if _REFERENCE.value else []
  legs += [(int(g), dict(clients_per_group=int(g))) for g in _GROUPS.value]
  alg = None
  for groups, change in legs:
    with reference_step(groups == "reference"):
      alg = virtual.VirtualAlgorithm(dataclasses.replace(cfg, **change))
      server = alg.initial_server_state()
      servers = {}
      t_groups[groups] = _timed(_round_fn(alg, num, selected, seeds, data, servers), rounds)
    if t_plain is not None:
      # Same computation, same seeds: s * (prod_i Delta_i)^alpha from (b) vs (a)'s server.
      total = gaussian.product(*[gaussian.NaturalGaussian(*d) for d in deltas[1]])
      want = gaussian.product(server.posterior, gaussian.power(total, cfg.step))
      got = servers[1].posterior
      diff = max(
          float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
          for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)))
      scale = max(float(np.max(np.abs(np.asarray(w)))) for w in tf.nest.flatten(want))
      diffs[groups] = diff / scale
  t_own = own_model_leg(params, fd, cfg, rounds, lambda a: _round_fn(a, num, selected, seeds, data))
  t_keras = t_groups.pop("keras", None)
  diff_keras = diffs.pop("keras", None)
  t_reference = t_groups.pop("reference", None)
  diff_reference = diffs.pop("reference", None)
  best = min(t_groups, key=t_groups.get)
  t_virtual = t_groups[best]

  # (e) evaluation apart from the rounds: S on every client's test data, MT from
  # every client's state and from the k a round trains (what the driver's MT cache
  # recomputes); one warm-up call each (tracing), then one timed call.
  # Both predictives: the posterior means (`eval_samples=0`) and the default Monte Carlo.
  t_eval = {}
  if _EVAL.value:
    ids = list(range(num))
    test = [fd.test[fd.client_ids[i]] for i in ids]
    eval_seeds = [np.array([1, i], np.int64) for i in ids]
    for samples in sorted({0, cfg.eval_samples}):
      alg = virtual.VirtualAlgorithm(dataclasses.replace(cfg, eval_samples=samples))
      server = alg.initial_server_state()
      all_states = [alg.initial_client_state(i) for i in ids]
      for key, fn in (("S", lambda: alg.evaluate_server(server, ids, eval_seeds, test)),
                      ("MT", lambda: alg.evaluate_clients(all_states, ids, eval_seeds, test)),
                      ("MT_round", lambda: alg.evaluate_clients(all_states[:k], ids[:k],
                                                                eval_seeds[:k], test[:k]))):
        fn()
        t = time.perf_counter()
        fn()
        t_eval[key, samples] = time.perf_counter() - t

  # (c) FedAvg through TFF on the server network.
  fedavg = driver.build_algorithm(fd, dict(params, algorithm="fedavg", server_lr=1.0))
  fs = fedavg.initial_server_state()
  fcs = {i: fedavg.initial_client_state(i) for i in range(num)}
  t_fedavg = _timed(lambda r: fedavg.next(fs, [fcs[i] for i in selected(r)], seeds(r), data(r)),
                    rounds)

  flops_v = round_flops(examples(1), virtual_macs, bayesian=True)
  flops_f = round_flops(examples(1), server_macs, bayesian=False)
  floor_v, floor_f = flops_v / (rate * 1e9), flops_f / (rate * 1e9)
  state_bytes = communication.dense_bytes(states[0])
  load_end = os.getloadavg()[0]
  print(f"(m) large-matmul rate           {rate:8.1f} GFLOP/s")
  print(f"    FLOPs a round: VIRTUAL {flops_v / 1e9:.2f} G ({virtual_macs} weights in Bayesian "
        f"kernels), FedAvg {flops_f / 1e9:.2f} G ({server_macs}); {examples(1)} examples "
        f"computed")
  print(f"    the step's matmul shape [{batch}x{width}]@[{width}x{width}]: "
        f"{small[1]:.1f} GFLOP/s one client, {small[k]:.1f} GFLOP/s {k} clients batched")
  for groups, t in t_groups.items():
    vs = f"; vs (b): posterior differs {diffs[groups]:.1g} relative" if groups in diffs else ""
    print(f"(a) VIRTUAL via TFF, {groups:2d} per group {t:7.3f} s/round  = {t / floor_v:5.1f}x "
          f"its floor {floor_v:.3f} s{vs}")
  if t_keras is not None:
    print(f"(k) VIRTUAL via TFF, Keras step {t_keras:7.3f} s/round  = {t_keras / floor_v:5.1f}x "
          f"its floor (lean_step=False); vs (b): posterior differs {diff_keras:.1g} relative; "
          f"k/a = {t_keras / t_virtual:.2f}")
  if t_reference is not None:
    vs = f"; vs (b): posterior differs {diff_reference:.1g} relative" if diff_reference else ""
    print(f"(r) VIRTUAL via TFF, reference step {t_reference:7.3f} s/round (sgd_step, the lean "
          f"step before issue 22){vs}; r/a = {t_reference / t_virtual:.2f}; VIRTUAL / FedAvg "
          f"with it {t_reference / t_fedavg:.2f}")
  if t_own is not None:
    (own, runs) = t_own
    print(f"(u) VIRTUAL via TFF, the network as a user's Keras model {own['model']:7.3f} s/round "
          f"{[round(t, 3) for t in runs['model']]} against the preset's {own['preset']:.3f} "
          f"{[round(t, 3) for t in runs['preset']]} (ABBA order): ratio "
          f"{own['model'] / own['preset']:.3f} (target <= 1.05)")
  if t_plain is not None:
    print(f"(b) clients one by one, plain TF {t_plain:8.3f} s/round  = {t_plain / floor_v:5.1f}x "
          f"its floor; a/b = {t_virtual / t_plain:.2f}")
  print(f"(c) FedAvg via TFF              {t_fedavg:8.3f} s/round  = {t_fedavg / floor_f:5.1f}x "
        f"its floor {floor_f:.3f} s")
  for samples in sorted({n for _, n in t_eval}):
    what = "posterior means" if samples == 0 else f"Monte Carlo, {samples} passes"
    ratio_to_means = "".join(
        f", {key} {t_eval[key, samples] / t_eval[key, 0]:.2f}x the means'"
        for key in ("S", "MT") if samples and (key, 0) in t_eval)
    print(f"(e) VIRTUAL evaluation of all {num} clients ({what}), apart from the rounds: S "
          f"{t_eval['S', samples]:.3f} s, MT {t_eval['MT', samples]:.3f} s{ratio_to_means}; "
          f"MT of the {k} a round trains {t_eval['MT_round', samples]:.3f} s, so an evaluation "
          f"with MT cached {t_eval['S', samples] + t_eval['MT_round', samples]:.3f} s")
  print(f"{name}: VIRTUAL / FedAvg = {t_virtual / t_fedavg:.2f} (best (a), {best} per group; "
        f"target <= {TARGETS[name]:g}; FLOP ratio {ratio:.2f}); load average {load[0]:.2f} at "
        f"start, {load_end:.2f} at end")
  print(f"one stored VIRTUAL client state: {state_bytes / 1e6:.2f} MB", flush=True)
  runtime.shutdown()
  return dict(virtual=t_virtual, fedavg=t_fedavg, ratio=t_virtual / t_fedavg, flop_ratio=ratio)


def main(argv):
  del argv
  rounds, epochs = (2, 5) if _QUICK.value else (_ROUNDS.value, _EPOCHS.value)
  names = list(_DATASETS.value)
  if len(names) > 1:
    # One process per dataset: Keras layers built eagerly after a TFF computation
    # has traced Keras models fail, and (b) and the profile build them.
    for name in names:
      args = [a for a in sys.argv[1:] if not a.startswith("--dataset")]
      subprocess.run([sys.executable, "-m", "benchmarks.round_time", f"--dataset={name}"] + args,
                     check=True)
    return
  name = names[0]
  if name == "mnist":
    why = mnist_missing(_DATA_DIR.value)
    if why:
      print(why, flush=True)
      return
  r = run_dataset(name, rounds, epochs)
  print(f"summary {name}: VIRTUAL {r['virtual']:.3f} s, FedAvg {r['fedavg']:.3f} s a round, "
        f"ratio {r['ratio']:.2f} (FLOP ratio {r['flop_ratio']:.2f}, target <= {TARGETS[name]:g})",
        flush=True)


if __name__ == "__main__":
  app.run(main)

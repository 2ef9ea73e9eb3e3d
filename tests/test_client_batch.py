"""Clients as one batched computation (`tfbfl.algorithms.client_batch`).

* The schedule gives every stacked client the minibatches it sees alone
  (`epoch_permutations` of its own seed and size; inactive once its steps end).
* `virtual.client_update_batch` of clients of uneven sizes equals the Keras path
  (`lean_step=False`) client by client, float rounding aside.
* `VirtualAlgorithm.next` in batched groups (a padded last group) gives the
  server posterior, client states and metrics of the per-client round.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tfbfl import gaussian
from tfbfl.algorithms import client_batch
from tfbfl.algorithms import virtual


def _flat(parts):
  return np.concatenate([np.reshape(np.asarray(t, np.float64), [-1]) for t in parts])


def test_schedule_gives_each_client_its_own_minibatches():
  sizes, epochs, batch = [7, 13, 0, 4], 3, 5
  seeds = tf.constant([[1, i] for i in range(len(sizes))], tf.int64)
  schedule = client_batch.MinibatchSchedule(seeds, sizes, max(sizes), epochs, batch)
  steps = [epochs * -(-n // batch) for n in sizes]
  assert int(schedule.max_steps) == max(steps)
  for c, n in enumerate(sizes):
    order = client_batch.epoch_permutations(seeds[c], epochs, n).numpy() if n else None
    for t in range(int(schedule.max_steps)):
      idx, mask, active = (a.numpy()[c] for a in schedule(tf.constant(t)))
      assert bool(active) == (t < steps[c])
      if t >= steps[c]:
        assert not mask.any()
        continue
      e, i = divmod(t, -(-n // batch))
      want = order[e, i * batch:(i + 1) * batch]
      assert mask.sum() == len(want)
      np.testing.assert_array_equal(idx[:len(want)], want)


def test_pack_stack_unstack_round_trip():
  rng = np.random.default_rng(0)
  data = [(rng.normal(size=(n, 3)).astype(np.float32), np.arange(n, dtype=np.int32)) for n in (2, 5)
         ]
  x, y, n = client_batch.pack_data(data)
  assert x.shape == (2, 5, 3) and list(n) == [2, 5]
  np.testing.assert_array_equal(x[0, :2], data[0][0])
  assert not x[0, 2:].any()
  nests = [dict(a=np.full(3, i), b=[np.float32(i)]) for i in range(4)]
  back = client_batch.unstack(client_batch.stack(nests), 4)
  for got, want in zip(back, nests):
    np.testing.assert_array_equal(got["a"], want["a"])
    assert float(got["b"][0]) == float(want["b"][0])


def _config(**kw):
  base = dict(input_dim=8,
              num_classes=3,
              num_clients=5,
              hidden_units=(6, 5),
              epochs=2,
              batch_size=4,
              kl_weight=0.5,
              init_scale=0.05)
  base.update(kw)
  return virtual.VirtualConfig(**base)


def _clients(sizes, seed=0):
  rng = np.random.default_rng(seed)
  return [(rng.normal(size=(n, 8)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32))
          for n in sizes]


def test_batched_clients_equal_keras_path_client_by_client():
  cfg = _config()
  sizes = [7, 13, 4]
  data = _clients(sizes)
  post = virtual.initial_posterior(cfg)
  states = [virtual.initial_client_state(cfg, i, post) for i in range(3)]
  # A client seen before: its cavity is not flat.
  states[1] = states[1]._replace(
      shared_factor=gaussian.NaturalGaussian([0.7 * e for e in states[1].shared_factor.eta1],
                                             [0.7 * e for e in states[1].shared_factor.eta2]))
  seeds = [np.array([2, i], np.int64) for i in range(3)]
  x, y, n = client_batch.pack_data(data)
  out = virtual.client_update_batch(cfg, post, client_batch.stack(states), np.stack(seeds), x, y, n)
  keras = dataclasses.replace(cfg, lean_step=False)
  # One trace of the Keras path serves the three clients (as the TFF client
  # computation runs it: any client's size).
  net = virtual.build_networks(keras)
  spec = lambda t: tf.TensorSpec.from_tensor(tf.convert_to_tensor(t))
  keras_update = tf.function(
      lambda state, seed, x, y: virtual.client_update(keras, post, state, seed, x, y, net=net),
      input_signature=[
          tf.nest.map_structure(spec, states[0]),
          tf.TensorSpec([2], tf.int64),
          tf.TensorSpec([None, 8], tf.float32),
          tf.TensorSpec([None], tf.int32)
      ],
      autograph=False)
  for c in range(3):
    want = keras_update(states[c], tf.constant(seeds[c]), *data[c])
    got_post = gaussian.NaturalGaussian([t[c] for t in out.client_state.shared_posterior.eta1],
                                        [t[c] for t in out.client_state.shared_posterior.eta2])
    loc_g, scale_g = gaussian.to_loc_scale(got_post)
    loc_w, scale_w = gaussian.to_loc_scale(want.client_state.shared_posterior)
    np.testing.assert_allclose(_flat(loc_g), _flat(loc_w), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(_flat(scale_g), _flat(scale_w), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(_flat([w[c] for w in out.client_state.private]),
                               _flat(want.client_state.private),
                               atol=2e-5,
                               rtol=1e-4)
    np.testing.assert_allclose(float(out.metrics["train_loss"][c]),
                               float(want.metrics["train_loss"]),
                               rtol=1e-5)
    assert float(out.num_examples[c]) == sizes[c]


def test_grouped_round_equals_per_client_round(tff_runtime):
  del tff_runtime
  data = _clients([7, 13, 4], seed=1)
  seeds = [np.array([3, i], np.int64) for i in range(3)]
  results = {}
  for per_group in (1, 2):  # 2: groups [0, 1] and [2, padding]
    # Rounds only: nothing here evaluates, so the evaluation the algorithm builds is
    # left at the posterior means (no Monte Carlo passes to trace).
    alg = virtual.VirtualAlgorithm(_config(clients_per_group=per_group, eval_samples=0))
    server = alg.initial_server_state()
    states = [alg.initial_client_state(i) for i in range(3)]
    results[per_group] = alg.next(server, states, seeds, data)
  # The grouped round never builds the per-client computations (built on first use).
  assert "_per_client" not in vars(alg)
  reference = alg.next_per_client(server, states, seeds, data)
  assert "_per_client" in vars(alg)
  moved = _flat(reference[0].posterior.eta1) - _flat(server.posterior.eta1)
  assert np.max(np.abs(moved)) > 1e-2
  for per_group, (new_server, new_states, metrics) in results.items():
    scale = np.max(np.abs(_flat(reference[0].posterior.eta1)))
    np.testing.assert_allclose(_flat(new_server.posterior.eta1),
                               _flat(reference[0].posterior.eta1),
                               atol=1e-5 * scale)
    np.testing.assert_allclose(_flat(new_server.posterior.eta2),
                               _flat(reference[0].posterior.eta2),
                               rtol=1e-5)
    assert [int(s.client_index) for s in new_states] == [0, 1, 2]
    for got, want in zip(new_states, reference[1]):
      np.testing.assert_allclose(_flat(got.private), _flat(want.private), atol=1e-5)
    for key in ("num_examples", "delta_nonzeros", "clients_dropped"):
      assert float(metrics[key]) == float(reference[2][key]), key
    np.testing.assert_allclose(float(metrics["train"]["train_loss"]),
                               float(reference[2]["train"]["train_loss"]),
                               rtol=1e-5)

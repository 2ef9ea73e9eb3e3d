"""FedPA: the delta recursion against a direct solve and its limits, FedAvg burn-in, digits."""

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfbfl.data  # noqa: E402
from tfbfl import round_loop  # noqa: E402
from tfbfl.algorithms import client_batch  # noqa: E402
from tfbfl.algorithms import fedavg  # noqa: E402
from tfbfl.algorithms import fedpa  # noqa: E402
from tfbfl.algorithms import registry  # noqa: E402

pytestmark = pytest.mark.usefixtures("tff_runtime")

_posterior_delta = tf.function(fedpa.posterior_delta, reduce_retracing=True)


def _delta(x0, samples, rho):
  return _posterior_delta(tf.constant(x0), tf.constant(samples), rho).numpy()


def _relative_error(a, b):
  return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("l,d,rho", [(2, 3, 0.5), (5, 3, 0.01), (8, 30, 1.0), (19, 50, 0.01),
                                     (12, 6, 100.0), (40, 10, 0.3)])
def test_recursion_matches_direct_solve(l, d, rho):
  rng = np.random.default_rng(l * 1000 + d)
  # Anisotropic samples around a mean away from x0 (float32, as the client's).
  scales = np.exp(rng.uniform(-2.0, 1.0, size=d))
  samples = (rng.normal(size=d) + rng.normal(size=(l, d)) * scales).astype(np.float32)
  x0 = rng.normal(size=d).astype(np.float32)
  expected = fedpa.direct_delta(x0, samples, rho)
  got = _delta(x0, samples, rho)
  assert got.dtype == np.float32 and got.shape == (d,)
  assert _relative_error(got, expected) < 1e-5
  # The covariance correction matters at these settings (not a trivial comparison).
  assert _relative_error(x0 - samples.mean(0), expected) > 1e-3


def test_identity_covariance_gives_averaged_iterate_delta():
  rng = np.random.default_rng(0)
  x0 = rng.normal(size=7).astype(np.float32)
  one = rng.normal(size=(1, 7)).astype(np.float32)
  for rho in (0.0, 0.01, 10.0):  # one sample: rho_l = 1 whatever rho
    np.testing.assert_array_equal(_delta(x0, one, rho), x0 - one[0])
  for l in (2, 7, 19):  # rho = 0: rho_l = 1 for any l
    samples = rng.normal(size=(l, 7)).astype(np.float32)
    expected = (x0.astype(np.float64) - samples.astype(np.float64).mean(0)).astype(np.float32)
    np.testing.assert_allclose(_delta(x0, samples, 0.0), expected, rtol=1e-6, atol=1e-7)
    assert _relative_error(_delta(x0, samples, 1.0), expected) > 1e-2


def test_exact_gaussian_samples_give_precision_times_offset():
  rng = np.random.default_rng(1)
  q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
  sigma = q @ np.diag([0.25, 1.0, 4.0]) @ q.T
  mu, x0 = np.array([1.0, -2.0, 0.5]), np.array([3.0, 1.0, -2.0])
  exact = np.linalg.solve(sigma, x0 - mu)
  samples = rng.multivariate_normal(mu, sigma, size=4000)
  # rho large: rho_l ~ 2.5e-6, Sigma_hat ~ the sample covariance.
  got = _delta(x0, samples, 100.0)
  assert _relative_error(got, exact) < 0.1  # sampling error ~ 0.03 here
  assert _relative_error(x0 - samples.mean(0), exact) > 0.5  # Sigma = I is far off


_HIDDEN, _E, _B, _LR, _SERVER_LR = (12,), 3, 16, 0.1, 0.7


def _config(cls, data, **kw):
  return cls(input_dim=int(np.prod(data.input_shape)),
             input_shape=tuple(data.input_shape),
             num_classes=data.num_classes,
             seed=3,
             hidden_units=_HIDDEN,
             epochs=_E,
             batch_size=_B,
             client_lr=_LR,
             server_lr=_SERVER_LR,
             **kw)


@pytest.fixture(scope="module")
def small():
  data = tfbfl.data.load_federated("digits", partition="class_dirichlet", num_clients=3, seed=3)
  fedavg_algo = fedavg.FedAvgAlgorithm(_config(fedavg.ModelConfig, data))
  fedpa_algo = fedpa.FedPAAlgorithm(
      _config(fedpa.FedPAConfig, data, fedpa_burn_in=1, fedpa_shrinkage=0.5,
              fedpa_server_burn_in=2))
  return data, fedavg_algo, fedpa_algo


def _rounds(algo, data, rounds):
  """`(state, clients, metrics)` after each of rounds 1..`rounds` (every client, every
  round)."""
  train = [data.train[c] for c in data.client_ids]
  state, clients = algo.initial_server_state(), [algo.initial_client_state(i) for i in range(3)]
  out = []
  for r in range(1, rounds + 1):
    seeds = [round_loop.client_seed(3, r, i) for i in range(3)]
    state, clients, metrics = algo.next(state, clients, seeds, train)
    out.append((state, clients, metrics))
  return out


@pytest.fixture(scope="module")
def small_rounds(small):
  """Rounds 1-3 of the module's FedAvg and FedPA (`_rounds`), run once: the burn-in
  test compares them, the posterior test checks FedPA's round 3 (its first past the
  server burn-in)."""
  data, fedavg_algo, fedpa_algo = small
  return dict(fedavg=_rounds(fedavg_algo, data, 3), fedpa=_rounds(fedpa_algo, data, 3))


def test_server_burn_in_rounds_are_fedavg_rounds(small_rounds):
  (ref, ref_clients, ref_metrics), (ref3, _, _) = small_rounds["fedavg"][1:]
  (got, got_clients, got_metrics), (got3, _, metrics3) = small_rounds["fedpa"][1:]
  # After round 2 (the server burn-in):
  for a, b in zip(ref.model_weights.trainable, got.model_weights.trainable):
    np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
  for ca, cb in zip(ref_clients, got_clients):
    for a, b in zip(ca.trainable, cb.trainable):
      np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
  assert got_metrics.keys() == ref_metrics.keys()
  # Round 3 is past the burn-in: the uploads, hence the server models, differ.
  assert max(
      float(np.max(np.abs(a - b)))
      for a, b in zip(ref3.model_weights.trainable, got3.model_weights.trainable)) > 1e-3
  assert metrics3["clients_dropped"] == 0 and metrics3["update_non_finite"] == 0


def _reference_epoch_means(weights, x, y, seed, momentum=0.0):
  """Independent eager SGD on the ReLU MLP `weights` = [k0, b0, k1, b1] (no Keras),
  with `momentum` beta (m <- beta m + g, w <- w - lr m, m = 0 at the start): the mean
  of the iterates after each step of every epoch, and the last iterate."""
  variables = [tf.Variable(np.asarray(w)) for w in weights]
  velocity = [np.zeros_like(np.asarray(w)) for w in weights]
  order = client_batch.epoch_permutations(tf.constant(seed), _E, len(y)).numpy()
  means = []
  for e in range(_E):
    total, steps = [np.zeros_like(np.asarray(w)) for w in weights], 0
    for start in range(0, len(y), _B):
      idx = order[e, start:start + _B]
      with tf.GradientTape() as tape:
        h = tf.constant(x[idx])
        for j in range(0, len(variables), 2):
          h = h @ variables[j] + variables[j + 1]
          if j + 2 < len(variables):
            h = tf.nn.relu(h)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[idx], logits=h))
      velocity = [momentum * m + g for m, g in zip(velocity, tape.gradient(loss, variables))]
      for v, m in zip(variables, velocity):
        v.assign_sub(_LR * m)
      total = [t + v.numpy() for t, v in zip(total, variables)]
      steps += 1
    means.append([t / steps for t in total])
  return means, [v.numpy() for v in variables]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_posterior_round_matches_reference(small, small_rounds, momentum):
  """A FedPA posterior round = eager SGD from the round's server model (with client
  momentum: its iterates), per-epoch iterate means, `direct_delta` on the samples after
  the client burn-in, FedAvg's server step. Without momentum: round 3 of the module's
  FedPA (its first past the server burn-in; plain server SGD keeps no state); with
  client and server momentum 0.9: round 1 of a FedPA without server burn-in, from the
  initial model (server momentum's first step is plain SGD's)."""
  data, _, fedpa_algo = small
  train = [data.train[c] for c in data.client_ids]
  if momentum == 0.0:
    r, algo = 3, fedpa_algo
    assert (algo.config.client_momentum, algo.config.server_momentum) == (0.0, 0.0)
    assert algo.config.fedpa_server_burn_in == 2 and algo.config.fedpa_shrinkage == 0.5
    state = small_rounds["fedpa"][1][0]  # after round 2
    new_state, clients, _ = small_rounds["fedpa"][2]
    seeds = [round_loop.client_seed(3, r, i) for i in range(3)]
  else:
    r, algo = 1, fedpa.FedPAAlgorithm(
        _config(fedpa.FedPAConfig,
                data,
                fedpa_burn_in=1,
                fedpa_shrinkage=0.5,
                fedpa_server_burn_in=0,
                client_momentum=momentum,
                server_momentum=momentum))
    state = algo.initial_server_state()
    seeds = [round_loop.client_seed(3, r, i) for i in range(3)]
    new_state, clients, _ = algo.next(state, [algo.initial_client_state(i) for i in range(3)],
                                      seeds, train)
  w0 = [np.asarray(w) for w in state.model_weights.trainable]
  flat0 = np.concatenate([w.ravel() for w in w0])
  deltas, n = [], []
  for seed, (x, y), client in zip(seeds, train, clients):
    means, last = _reference_epoch_means(w0, x, y, seed, momentum)
    for a, b in zip(last, client.trainable):  # MT: the last iterate, as FedAvg's
      np.testing.assert_allclose(b, a, atol=1e-5)
    samples = np.stack([np.concatenate([m.ravel() for m in epoch]) for epoch in means[1:]])
    deltas.append(fedpa.direct_delta(flat0, samples, 0.5))
    n.append(len(y))
  delta = np.average(deltas, axis=0, weights=n)
  got = np.concatenate([np.asarray(w).ravel() for w in new_state.model_weights.trainable])
  np.testing.assert_allclose(got, flat0 - _SERVER_LR * delta, atol=1e-5)
  # FedAvg's step from the same clients would land elsewhere.
  fedavg_delta = np.average(
      [flat0 - np.concatenate([np.asarray(w).ravel() for w in c.trainable]) for c in clients],
      axis=0,
      weights=n)
  assert np.max(np.abs(got - (flat0 - _SERVER_LR * fedavg_delta))) > 1e-3


def test_digits_end_to_end_beats_chance():
  data = tfbfl.data.load_federated("digits", partition="class_dirichlet", num_clients=10, seed=0)
  spec = registry.get("fedpa")
  config = spec.make_config(dict(seed=0), data)
  rounds = config.fedpa_server_burn_in + 3  # some posterior-averaging rounds
  run = round_loop.RunConfig(rounds=rounds, clients_per_round=10, verbose=False)
  algo = spec.build(data, config, run)
  assert isinstance(algo, fedpa.FedPAAlgorithm) and algo.name == "fedpa"
  runner = round_loop.ExperimentRunner(algo, data, run)
  runner.run()
  last = runner.rows[-1]
  assert last["server_accuracy"] > 0.6 and last["mt_accuracy"] > 0.6, runner.rows  # chance: 0.1
  assert all(row["clients_dropped"] == 0 for row in runner.rows)


def test_bad_flags_name_the_flag():
  with pytest.raises(ValueError, match="--fedpa_shrinkage"):
    fedpa.FedPAConfig(input_dim=4, num_classes=2, fedpa_shrinkage=-0.1)
  with pytest.raises(ValueError, match="--fedpa_burn_in"):
    fedpa.FedPAConfig(input_dim=4, num_classes=2, epochs=3, fedpa_burn_in=3)
  with pytest.raises(ValueError, match="--fedpa_server_burn_in"):
    fedpa.FedPAConfig(input_dim=4, num_classes=2, fedpa_server_burn_in=-1)
  with pytest.raises(ValueError, match="--architecture"):
    fedpa.FedPAConfig(input_dim=4, num_classes=2, architecture="lstm")
  with pytest.raises(ValueError, match="--server_beta_2"):
    fedpa.FedPAConfig(input_dim=4, num_classes=2, server_beta_2=0.99)
  with pytest.raises(ValueError, match="--server_momentum"):
    fedpa.FedPAConfig(input_dim=4, num_classes=2, server_optimizer="adam", server_momentum=0.9)


def test_module_imports_without_tensorflow():
  code = ("import sys, tfbfl.algorithms.fedpa; from tfbfl.algorithms import registry; "
          "assert 'fedpa' in registry.names(); "
          "assert not {'tensorflow', 'tensorflow_federated', 'absl', 'tfbfl.driver', "
          "'tfbfl.round_loop', 'tfbfl.data'} & set(sys.modules), sorted(sys.modules)")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

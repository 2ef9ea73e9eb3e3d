"""FedAvg / FedProx: equality with tff.learning (also with client momentum and server
momentum or Adam), FedProx(mu=0) == FedAvg, MT semantics."""

import collections
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from tfbfl import round_loop  # noqa: E402
from tfbfl import networks  # noqa: E402
from tfbfl import driver  # noqa: E402
from tfbfl.algorithms import client_batch  # noqa: E402
from tfbfl.algorithms import fedavg  # noqa: E402

_HIDDEN = (12,)
_E, _B = 2, 16


def _params(**kw):
  p = dict(num_clients=3,
           clients_per_round=3,
           hidden_units=_HIDDEN,
           epochs_per_round=_E,
           batch_size=_B,
           client_lr=0.1,
           server_lr=0.7,
           seed=3,
           rounds=2,
           verbose=False)
  p.update(kw)
  return driver.resolve_params(p)


@pytest.fixture(scope="module")
def fd():
  return driver.load_data(_params())


@pytest.fixture(scope="module")
def fedavg_algo(tff_runtime, fd):
  del tff_runtime
  return driver.build_algorithm(fd, _params(algorithm="fedavg"))


_PROX = dict(algorithm="fedprox", mu=0.5, client_momentum=0.0)


@pytest.fixture(scope="module")
def fedprox_algo(tff_runtime, fd):
  """FedProx at mu 0.5 without client momentum, built once: the reference round's
  case and the strong proximal term of the mu = 0 test (an algorithm holds no run's
  state)."""
  del tff_runtime
  return driver.build_algorithm(fd, _params(**_PROX))


def _tff_dataset(seed, x, y):
  """The minibatches our client loop visits, as a tf.data.Dataset for tff.learning."""
  order = client_batch.epoch_permutations(tf.constant(seed), _E, len(y)).numpy()
  parts = [tf.data.Dataset.from_tensor_slices((x[o], y[o])).batch(_B) for o in order]
  ds = parts[0]
  for part in parts[1:]:
    ds = ds.concatenate(part)
  return ds.map(lambda a, b: collections.OrderedDict(x=a, y=b))


def _tff_fed_avg(client_lr, server_lr, seed, client_momentum=None, server_optimizer_fn=None):

  def model_fn():
    keras_model = networks.build_deterministic_mlp(64, 10, _HIDDEN, seed=seed)
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=collections.OrderedDict(x=tf.TensorSpec([None, 64], tf.float32),
                                           y=tf.TensorSpec([None], tf.int32)))

  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(client_lr, client_momentum),
      server_optimizer_fn=server_optimizer_fn or tff.learning.optimizers.build_sgdm(server_lr))


def reference_sgd(weights, x, y, seed, epochs, batch_size, lr, mu=0.0, momentum=0.0):
  """Independent eager SGD on the ReLU MLP `weights` = [k0, b0, k1, b1, ...] (no Keras),
  on CE + mu/2 ||w - weights||^2, visiting `client_batch.epoch_permutations(seed)` batches;
  with `momentum` beta: m <- beta m + g, w <- w - lr m (m = 0 at the start)."""
  variables = [tf.Variable(np.asarray(w)) for w in weights]
  anchor = [tf.constant(np.asarray(w)) for w in weights]
  velocity = [tf.zeros_like(a) for a in anchor]
  order = client_batch.epoch_permutations(tf.constant(seed), epochs, len(y)).numpy()
  for e in range(epochs):
    for start in range(0, len(y), batch_size):
      idx = order[e, start:start + batch_size]
      with tf.GradientTape() as tape:
        h = tf.constant(x[idx])
        for l in range(0, len(variables), 2):
          h = h @ variables[l] + variables[l + 1]
          if l + 2 < len(variables):
            h = tf.nn.relu(h)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[idx], logits=h))
      grads = [
          g + mu * (v - a) for v, g, a in zip(variables, tape.gradient(loss, variables), anchor)
      ]
      velocity = [momentum * m + g for m, g in zip(velocity, grads)]
      for v, m in zip(variables, velocity):
        v.assign_sub(lr * m)
  return [v.numpy() for v in variables]


def test_fedavg_matches_tff_build_weighted_fed_avg(fedavg_algo, fd):
  p = _params(algorithm="fedavg")
  ours = fedavg_algo
  theirs = _tff_fed_avg(p["client_lr"], p["server_lr"], p["seed"])
  tff_state = theirs.initialize()
  state = ours.initial_server_state()
  for a, b in zip(theirs.get_model_weights(tff_state).trainable, state.model_weights.trainable):
    np.testing.assert_array_equal(a, b)  # same seeded initial model
  data = [fd.train[c] for c in fd.client_ids]
  clients = [ours.initial_client_state(i) for i in range(3)]
  for r in (1, 2):
    seeds = [round_loop.client_seed(p["seed"], r, i) for i in range(3)]
    tff_state = theirs.next(tff_state, [_tff_dataset(s, *d) for s, d in zip(seeds, data)]).state
    state, clients, metrics = ours.next(state, clients, seeds, data)
  expected = theirs.get_model_weights(tff_state).trainable
  moved = max(
      float(np.max(np.abs(a - b)))
      for a, b in zip(expected,
                      ours.initial_server_state().model_weights.trainable))
  assert moved > 1e-2  # the comparison is not between two untrained models
  for a, b in zip(expected, state.model_weights.trainable):
    np.testing.assert_allclose(b, a, atol=1e-5)
  assert metrics["update_non_finite"] == 0
  assert metrics["num_examples"] == sum(len(y) for _, y in data)


@pytest.mark.parametrize("flags", [
    dict(client_momentum=0.9),
    dict(server_momentum=0.9, server_lr=0.5),
    dict(client_momentum=0.5, server_optimizer="adam", server_lr=0.01, server_epsilon=1e-3),
])
def test_optimizers_match_tff_build_weighted_fed_avg(tff_runtime, fd, fedavg_algo, flags):
  """Client momentum (its buffer reset every round, as tff.learning's client work
  does) and the server optimizers over three rounds equal tff.learning's FedAvg with
  the same TFF optimizers (`build_sgdm` / `build_adam`) on the same minibatches."""
  del tff_runtime
  p = _params(algorithm="fedavg", **flags)
  ours = driver.build_algorithm(fd, p)
  if p["server_optimizer"] == "adam":
    server_fn = tff.learning.optimizers.build_adam(p["server_lr"], epsilon=p["server_epsilon"])
  else:
    server_fn = tff.learning.optimizers.build_sgdm(p["server_lr"], p["server_momentum"] or None)
  theirs = _tff_fed_avg(p["client_lr"], p["server_lr"], p["seed"], p["client_momentum"] or None,
                        server_fn)
  tff_state, state = theirs.initialize(), ours.initial_server_state()
  data = [fd.train[c] for c in fd.client_ids]
  clients = [ours.initial_client_state(i) for i in range(3)]
  for r in (1, 2, 3):
    seeds = [round_loop.client_seed(p["seed"], r, i) for i in range(3)]
    tff_state = theirs.next(tff_state, [_tff_dataset(s, *d) for s, d in zip(seeds, data)]).state
    state, clients, metrics = ours.next(state, clients, seeds, data)
  for a, b in zip(theirs.get_model_weights(tff_state).trainable, state.model_weights.trainable):
    np.testing.assert_allclose(b, a, atol=2e-5)
  # The optimizer's state (momentum accumulator, Adam's moments and step) is ours too.
  for a, b in zip(tf.nest.flatten(tff_state.finalizer), tf.nest.flatten(state.finalizer_state)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5)
  assert metrics["update_non_finite"] == 0
  # Another trajectory than plain FedAvg's (plain SGD on both sides) at the same server_lr:
  # w <- w - server_lr Delta(w), each round's mean client delta Delta(w) read off a round
  # of the module's FedAvg (server_lr 0.7: its new model is w - 0.7 Delta(w)).
  plain_lr = _params(algorithm="fedavg")["server_lr"]
  plain_state = fedavg_algo.initial_server_state()
  for r in (1, 2, 3):
    seeds = [round_loop.client_seed(p["seed"], r, i) for i in range(3)]
    stepped, _, _ = fedavg_algo.next(plain_state,
                                     [fedavg_algo.initial_client_state(i) for i in range(3)],
                                     seeds, data)
    plain_state = plain_state._replace(model_weights=plain_state.model_weights._replace(
        trainable=[
            w - p["server_lr"] / plain_lr * (w - np.asarray(n))
            for w, n in zip(plain_state.model_weights.trainable, stepped.model_weights.trainable)
        ]),
                                       round_num=stepped.round_num)
  assert max(
      float(np.max(np.abs(a - b)))
      for a, b in zip(plain_state.model_weights.trainable, state.model_weights.trainable)) > 1e-3


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fedprox_round_matches_reference_sgd(tff_runtime, fd, fedprox_algo, momentum):
  """tff.learning's build_weighted_fed_prox (0.87) adds mu (w^(t) - w) to the gradient,
  the opposite sign of FedProx's term, so the reference here is hand-written."""
  mu = 0.5
  p = _params(algorithm="fedprox", mu=mu, client_momentum=momentum)
  algo = fedprox_algo if p == _params(**_PROX) else driver.build_algorithm(fd, p)
  state = algo.initial_server_state()
  w0 = list(state.model_weights.trainable)
  data = [fd.train[c] for c in fd.client_ids]
  seeds = [round_loop.client_seed(p["seed"], 1, i) for i in range(3)]
  new_state, clients, _ = algo.next(state, [algo.initial_client_state(i) for i in range(3)], seeds,
                                    data)
  local = [
      reference_sgd(w0, x, y, s, _E, _B, p["client_lr"], mu, momentum)
      for s, (x, y) in zip(seeds, data)
  ]
  for ref, client in zip(local, clients):  # client states = post-training weights
    for a, b in zip(ref, client.trainable):
      np.testing.assert_allclose(b, a, atol=1e-5)
  n = np.array([len(y) for _, y in data], np.float64)
  for j, w in enumerate(w0):
    delta = sum(n_i * (w - wl[j]) for n_i, wl in zip(n, local)) / n.sum()
    np.testing.assert_allclose(new_state.model_weights.trainable[j],
                               w - p["server_lr"] * delta,
                               atol=1e-5)


def test_fedprox_mu0_equals_fedavg(fedavg_algo, fedprox_algo, fd):
  data = [fd.train[c] for c in fd.client_ids]

  def run(algo):
    state, clients = algo.initial_server_state(), [algo.initial_client_state(i) for i in range(3)]
    history = []
    for r in (1, 2):
      seeds = [round_loop.client_seed(3, r, i) for i in range(3)]
      state, clients, metrics = algo.next(state, clients, seeds, data)
      history.append(round_loop._flatten_metrics(metrics))  # pylint: disable=protected-access
    return algo.name, state, history

  name_a, fedavg_state, fedavg_metrics = run(fedavg_algo)
  name_p, prox_state, prox_metrics = run(
      driver.build_algorithm(fd, _params(algorithm="fedprox", mu=0.0)))
  assert (name_a, name_p) == ("fedavg", "fedprox")
  assert fedavg_metrics == prox_metrics
  for a, b in zip(fedavg_state.model_weights.trainable, prox_state.model_weights.trainable):
    np.testing.assert_array_equal(a, b)
  assert fedprox_algo.config.mu == 0.5  # the module's FedProx: a proximal term that acts
  _, strong_state, _ = run(fedprox_algo)
  assert not np.allclose(strong_state.model_weights.trainable[0],
                         fedavg_state.model_weights.trainable[0])


def _once_selected(num_clients, per_round, rounds):
  """A seed and a client picked in round 1 and never again."""
  for seed in range(200):
    picks = [
        round_loop.sample_clients(seed, r, num_clients, per_round) for r in range(1, rounds + 1)
    ]
    for c in picks[0]:
      if all(c not in later for later in picks[1:]):
        return seed, c, picks
  raise AssertionError("no seed found")


def test_mt_is_each_clients_last_deployed_model(fedavg_algo, fd):
  """The module's FedAvg on its three clients, two a round, the sampling seed chosen so
  that one client trains in round 1 only."""
  rounds = 4
  seed, client, picks = _once_selected(len(fd.client_ids), 2, rounds)
  runner = round_loop.ExperimentRunner(
      fedavg_algo, fd,
      round_loop.RunConfig(rounds=rounds, clients_per_round=2, seed=seed, verbose=False))
  runner.run()
  cid = fd.client_ids[client]
  mt = [row[cid] for row in runner.client_rows]
  assert all(a == mt[0] for a in mt), (picks, mt)
  # The server model moves every round, so S-based scores would not stay constant.
  assert len({row["server_loss"] for row in runner.rows}) == rounds
  never = [i for i in range(len(fd.client_ids)) if all(i not in pk for pk in picks)]
  for i in never:  # never selected: the initial model, whose accuracy is fixed
    assert len({row[fd.client_ids[i]] for row in runner.client_rows}) == 1


def test_evaluate_uses_client_weights_and_initial_model(fedavg_algo, fd):
  algo = fedavg_algo
  state = algo.initial_server_state()
  test = [fd.test[c] for c in fd.client_ids]
  seeds = [round_loop.client_seed(3, 1, i) for i in range(3)]
  fresh = [algo.initial_client_state(i) for i in range(3)]
  ev0 = algo.evaluate(state, fresh, seeds, test)
  for c in ev0:  # never selected: MT model = initial server model
    assert c["mt_loss"] == pytest.approx(c["server_loss"], rel=1e-6)
  _, trained, _ = algo.next(state, fresh, seeds, [fd.train[c] for c in fd.client_ids])
  ev1 = algo.evaluate(state, trained, seeds, test)
  for before, after in zip(ev0, ev1):
    assert after["server_loss"] == pytest.approx(before["server_loss"], rel=1e-6)
    assert after["mt_loss"] < before["mt_loss"]
    assert after["num_examples"] == before["num_examples"]


def test_bad_flags_name_the_flag():
  with pytest.raises(ValueError, match="--client_lr"):
    fedavg.ModelConfig(input_dim=4, num_classes=2, client_lr=0.0)
  with pytest.raises(ValueError, match="--mu"):
    fedavg.ModelConfig(input_dim=4, num_classes=2, mu=-1.0)
  with pytest.raises(ValueError, match="--epochs_per_round"):
    fedavg.ModelConfig(input_dim=4, num_classes=2, epochs=0)
  with pytest.raises(ValueError, match="--client_momentum"):
    fedavg.FedAvgConfig(input_dim=4, num_classes=2, client_momentum=1.0)
  with pytest.raises(ValueError, match="--server_momentum"):
    fedavg.FedProxConfig(input_dim=4, num_classes=2, server_optimizer="adam", server_momentum=0.9)


def test_fedavg_ignores_mu(fedavg_algo):
  assert _params(algorithm="fedavg")["mu"] > 0  # the flag default is FedProx's
  assert fedavg_algo.config.mu == 0.0 and fedavg_algo.name == "fedavg"


def test_round_bytes_is_dense_model_both_ways(fedavg_algo):
  algo = fedavg_algo
  size = 4 * (64 * 12 + 12 + 12 * 10 + 10)
  assert algo.round_bytes(3, {}) == (3 * size, 3 * size)


def test_conv_architecture_trains_and_other_architectures_are_refused(tff_runtime, fd):
  p = _params(algorithm="fedavg",
              architecture="conv",
              image_shape=(8, 8),
              filters=(3,),
              epochs_per_round=1)
  algo = driver.build_algorithm(fd, p)
  state = algo.initial_server_state()
  assert [w.shape for w in state.model_weights.trainable][:2] == [(5, 5, 1, 3), (3,)]
  data, test = [fd.train[c] for c in fd.client_ids], [fd.test[c] for c in fd.client_ids]
  seeds = [round_loop.client_seed(3, 1, i) for i in range(3)]
  before = round_loop.aggregate_evaluation(
      algo.evaluate(state, [state.model_weights] * 3, seeds, test))
  state, clients, _ = algo.next(state, [state.model_weights] * 3, seeds, data)
  after = round_loop.aggregate_evaluation(algo.evaluate(state, clients, seeds, test))
  assert after["server_loss"] < before["server_loss"] and after["mt_loss"] < before["mt_loss"]
  with pytest.raises(ValueError, match="--architecture"):
    driver.build_algorithm(fd, _params(algorithm="fedprox", architecture="lstm"))

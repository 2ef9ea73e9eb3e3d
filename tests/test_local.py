"""Local and Global baselines: centralized-training equivalence, S ensemble, MT."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tfbfl import data as data_lib  # noqa: E402
from tfbfl import round_loop  # noqa: E402
from tfbfl import driver  # noqa: E402
from tfbfl.algorithms import fedavg  # noqa: E402
from tfbfl.algorithms import local  # noqa: E402
from test_fedavg import reference_sgd  # noqa: E402  pylint: disable=g-bad-import-order

_E, _B, _LR, _SEED = 2, 16, 0.1, 5


def _config(**kw):
  c = dict(input_dim=64,
           num_classes=10,
           hidden_units=(10,),
           epochs=_E,
           batch_size=_B,
           client_lr=_LR,
           seed=_SEED)
  c.update(kw)
  return fedavg.ModelConfig(**c)


@pytest.fixture(scope="module")
def one_client():
  x, y = data_lib.load_digits_arrays()
  return data_lib.from_client_arrays([x[:150]], [y[:150]], [x[150:200]], [y[150:200]])


@pytest.fixture(scope="module")
def local_algo(tff_runtime):
  del tff_runtime
  return local.LocalAlgorithm(_config())


def test_local_one_client_equals_centralized_training(local_algo, one_client):
  cid = one_client.client_ids[0]
  x, y = one_client.train[cid]
  state, clients = local_algo.initial_server_state(), [local_algo.initial_client_state(0)]
  expected = list(clients[0].trainable)
  for r in (1, 2):
    seed = round_loop.client_seed(_SEED, r, 0)
    state, clients, metrics = local_algo.next(state, clients, [seed], [(x, y)])
    expected = reference_sgd(expected, x, y, seed, _E, _B, _LR)
  assert int(state) == 2
  assert metrics["num_examples"] == len(y)
  for a, b in zip(expected, clients[0].trainable):
    np.testing.assert_allclose(b, a, atol=1e-5)


def test_global_one_client_equals_local(tff_runtime, local_algo, one_client):
  cid = one_client.client_ids[0]
  glob = local.GlobalAlgorithm(_config(), one_client.pooled("train"))
  g_state, l_state = glob.initial_server_state(), local_algo.initial_server_state()
  l_clients = [local_algo.initial_client_state(0)]
  g_clients = [glob.initial_client_state(0)]
  for r in (1, 2):
    seeds = [round_loop.client_seed(_SEED, r, 0)]
    g_state, g_clients, g_metrics = glob.next(g_state, g_clients, seeds, [one_client.train[cid]])
    l_state, l_clients, l_metrics = local_algo.next(l_state, l_clients, seeds,
                                                    [one_client.train[cid]])
  for a, b in zip(g_state.model_weights.trainable, l_clients[0].trainable):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert float(g_metrics["train"]["train_loss"]) == pytest.approx(float(
      l_metrics["train"]["train_loss"]),
                                                                  rel=1e-5)
  ev = glob.evaluate(g_state, g_clients, seeds, [one_client.test[cid]])[0]
  assert ev["server_loss"] == ev["mt_loss"] and ev["server_correct"] == ev["mt_correct"]
  assert glob.round_bytes(1, {}) == (0, 0)


def _numpy_probs(weights, x):
  h = x
  for l in range(0, len(weights), 2):
    h = h @ weights[l] + weights[l + 1]
    if l + 2 < len(weights):
      h = np.maximum(h, 0.0)
  h = h - h.max(axis=1, keepdims=True)
  return np.exp(h) / np.exp(h).sum(axis=1, keepdims=True)


def test_local_s_is_uniform_ensemble_and_mt_own_model(tff_runtime):
  x, y = data_lib.load_digits_arrays()
  fd = data_lib.from_client_arrays([x[:80], x[80:200]], [y[:80], y[80:200]],
                                   [x[200:230], x[230:250]], [y[200:230], y[230:250]])
  algo = local.LocalAlgorithm(_config())
  state = algo.initial_server_state()
  clients = [algo.initial_client_state(i) for i in range(2)]
  # Only client 1 trains: client 0 keeps the initial model (a non-selected client).
  seeds = [round_loop.client_seed(_SEED, 1, 1)]
  state, trained, _ = algo.next(state, [clients[1]], seeds, [fd.train[fd.client_ids[1]]])
  clients[1] = trained[0]
  test = [fd.test[c] for c in fd.client_ids]
  ev = algo.evaluate(state, clients, [round_loop.client_seed(_SEED, -1, i) for i in range(2)], test)
  weights = [[np.asarray(w) for w in c.trainable] for c in clients]
  for i, (xt, yt) in enumerate(test):
    own = _numpy_probs(weights[i], xt)
    ens = (_numpy_probs(weights[0], xt) + _numpy_probs(weights[1], xt)) / 2
    rows = np.arange(len(yt))
    assert ev[i]["num_examples"] == len(yt)
    assert ev[i]["mt_loss"] == pytest.approx(-np.log(own[rows, yt]).sum(), rel=1e-4)
    assert ev[i]["mt_correct"] == (own.argmax(1) == yt).sum()
    assert ev[i]["server_loss"] == pytest.approx(-np.log(ens[rows, yt]).sum(), rel=1e-4)
    assert ev[i]["server_correct"] == (ens.argmax(1) == yt).sum()
  assert ev[1]["mt_loss"] != pytest.approx(ev[1]["server_loss"], rel=1e-3)


def test_registered_and_validated(tff_runtime):
  p = driver.resolve_params(
      dict(algorithm="local",
           num_clients=3,
           clients_per_round=3,
           hidden_units=(4,),
           epochs_per_round=1))
  fd = driver.load_data(p)
  assert driver.build_algorithm(fd, p).name == "local"
  with pytest.raises(ValueError, match="--mu"):
    local.LocalAlgorithm(_config(mu=0.1))
  with pytest.raises(ValueError, match="--batch_size"):
    _config(batch_size=0)

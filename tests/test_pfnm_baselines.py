"""The PFNM paper's baselines (tfbfl.algorithms.oneshot_baselines)."""

import dataclasses

import numpy as np
import pytest

from tfbfl import data
from tfbfl.algorithms import oneshot_baselines as baselines
from tfbfl.algorithms import pfnm


def _constant_net(logits):
  """A 1-hidden-layer net whose output is `logits` for every input."""
  logits = np.asarray(logits, np.float64)
  return [(np.zeros((3, 2)), np.zeros(2)), (np.zeros((2, len(logits))), logits)]


# ------------------------------------------------------------ pure numpy
def test_average_networks_is_the_weighted_mean():
  rng = np.random.default_rng(0)
  a = [(rng.normal(size=(3, 2)), rng.normal(size=2)), (rng.normal(size=(2, 4)), rng.normal(size=4))]
  b = [(rng.normal(size=(3, 2)), rng.normal(size=2)), (rng.normal(size=(2, 4)), rng.normal(size=4))]
  avg = baselines.average_networks([a, b], [1, 3])
  for (Wa, ba), (Wb, bb), (W, bias) in zip(a, b, avg):
    np.testing.assert_allclose(W, 0.25 * Wa + 0.75 * Wb)
    np.testing.assert_allclose(bias, 0.25 * ba + 0.75 * bb)
  with pytest.raises(ValueError, match="identical shapes"):
    other = [(np.zeros((3, 5)), np.zeros(5)), (np.zeros((5, 4)), np.zeros(4))]
    baselines.average_networks([a, other])
  with pytest.raises(ValueError, match="weights"):
    baselines.average_networks([a, b], [1, -1])


def test_uniform_and_weighted_ensembles_follow_the_definitions():
  # Client 0 saw only class 0, client 1 only classes 1 and 2.
  n0 = _constant_net(np.log([0.5, 0.3, 0.2]))
  n1 = _constant_net(np.log([0.1, 0.2, 0.7]))
  x = np.zeros((4, 3))
  u = baselines.ensemble_proba([n0, n1], x)
  np.testing.assert_allclose(u[0], [0.3, 0.25, 0.45])
  counts = [np.array([10, 0, 0]), np.array([0, 5, 5])]
  w = baselines.ensemble_proba([n0, n1], x, counts)
  np.testing.assert_allclose(w[0], [0.5, 0.2, 0.7])  # 1/n_k sum_j n_jk p_jk
  # A class seen by nobody falls back to uniform weights.
  w2 = baselines.ensemble_proba([n0, n1], x, [np.array([1, 0, 0]), np.array([1, 1, 0])])
  np.testing.assert_allclose(w2[0], [0.3, 0.2, 0.45])
  assert baselines.ensemble_accuracy([n0, n1], x, np.full(4, 2)) == 1.0
  assert baselines.ensemble_accuracy([n0, n1], x, np.full(4, 2), counts) == 1.0
  assert baselines.ensemble_size([n0, n1]) == {"neurons": 4, "layers": [4], "params": 2 * 17}
  with pytest.raises(ValueError, match="class_counts"):
    baselines.ensemble_proba([n0, n1], x, [np.ones(2), np.ones(2)])


def test_dpmeans_network_merges_identical_clients_and_rejects_depth():
  rng = np.random.default_rng(1)
  net = [(rng.normal(size=(5, 6)) * 3, rng.normal(size=6)),
         (rng.normal(size=(6, 3)), rng.normal(size=3))]
  glob = baselines.dpmeans_network([net, net, net], lam=1.0)
  assert pfnm.model_size(glob)["neurons"] == 6
  x = rng.normal(size=(20, 5))
  # Same function (hidden neurons may be permuted).
  np.testing.assert_allclose(pfnm.forward(glob, x), pfnm.forward(net, x), atol=1e-10)
  deep = net[:1] + [(rng.normal(size=(6, 4)), np.zeros(4)), (rng.normal(size=(4, 3)), np.zeros(3))]
  with pytest.raises(ValueError, match="one hidden layer"):
    baselines.dpmeans_network([deep, deep])


def test_derive_seed_is_a_deterministic_nonnegative_int():
  assert baselines.derive_seed(1, 2, 3) == baselines.derive_seed(1, 2, 3)
  assert baselines.derive_seed(1, 2, 3) != baselines.derive_seed(1, 2, 4)
  assert 0 <= baselines.derive_seed(0) < 2**31


# -------------------------------------------------- on trained digits nets
@pytest.fixture(scope="module")
def homogeneous(tff_runtime):
  del tff_runtime
  fd = data.load_federated("digits", partition="homogeneous", num_clients=4, seed=0)
  cfg = pfnm.LocalTrainingConfig(input_dim=64, num_classes=10, hidden_units=(50,), epochs=5)
  client_data = [fd.train[c] for c in fd.client_ids]
  indep = pfnm.LocalTrainer(cfg).train(client_data, seed=0)
  shared = pfnm.LocalTrainer(dataclasses.replace(cfg, shared_init=True)).train(client_data, seed=0)
  return fd, cfg, client_data, indep, shared


def test_baselines_give_sensible_numbers_on_homogeneous_digits(homogeneous):
  fd, cfg, _, indep, shared = homogeneous
  x, y = fd.pooled("test")
  nets = [r.weights for r in indep]
  counts = [r.class_counts for r in indep]
  local = baselines.local_accuracies(nets, x, y)
  assert local.shape == (4,) and local.min() > 0.75
  u_ens = baselines.ensemble_accuracy(nets, x, y)
  w_ens = baselines.ensemble_accuracy(nets, x, y, counts)
  assert u_ens >= local.mean()
  assert abs(w_ens - u_ens) < 0.03  # balanced classes: weights ~ uniform
  n = [r.num_examples for r in indep]
  fedavg_shared = pfnm.accuracy(baselines.average_networks([r.weights for r in shared], n), x, y)
  fedavg_indep = pfnm.accuracy(baselines.average_networks(nets, n), x, y)
  # Shared initialisation keeps hidden units aligned after a few epochs.
  assert fedavg_shared > local.mean() - 0.05
  assert fedavg_shared > fedavg_indep + 0.1
  x_pool, _ = fd.pooled("train")
  kd = baselines.distill(nets, x_pool, cfg, seed=0, hidden_units=(100,), epochs=5)
  assert pfnm.model_size(kd)["layers"] == [100]
  teacher = baselines.ensemble_proba(nets, x).argmax(1)
  assert np.mean(pfnm.forward(kd, x).argmax(1) == teacher) > 0.85
  assert pfnm.accuracy(kd, x, y) > 0.8


def test_downpour_sgd(homogeneous):
  fd, cfg, client_data, indep, _ = homogeneous
  x, y = fd.pooled("test")
  one_epoch = pfnm.LocalTrainer(dataclasses.replace(cfg, epochs=1))
  seen = []
  glob = baselines.downpour_sgd(one_epoch,
                                client_data,
                                comm_rounds=5,
                                seed=0,
                                callback=lambda r, w: seen.append((r, pfnm.accuracy(w, x, y))))
  assert [r for r, _ in seen] == [1, 2, 3, 4, 5]
  assert seen[0][1] < seen[-1][1]
  # 5 epochs over all data with averaging: as good as a 5-epoch local model.
  local = baselines.local_accuracies([r.weights for r in indep], x, y)
  assert pfnm.accuracy(glob, x, y) > local.mean() - 0.03
  again = baselines.downpour_sgd(one_epoch, client_data, comm_rounds=1, seed=0)
  np.testing.assert_allclose(again[0][0],
                             baselines.downpour_sgd(one_epoch, client_data, comm_rounds=1,
                                                    seed=0)[0][0],
                             atol=1e-6)
  with pytest.raises(ValueError, match="comm_rounds"):
    baselines.downpour_sgd(one_epoch, client_data, comm_rounds=0, seed=0)
  with pytest.raises(ValueError, match="server_lr"):
    baselines.downpour_sgd(one_epoch, client_data, comm_rounds=1, seed=0, server_lr=0.0)

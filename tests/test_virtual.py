"""VIRTUAL: exactness on a conjugate model, privacy of the aggregate, learning,
resume, and flag errors."""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_probability as tfp

from tfbfl import gaussian
from tfbfl import networks
from tfbfl import driver
from tfbfl.algorithms import virtual
import built_runs


# ------------------------------------------------------------ conjugate model
def _orthogonal_regression_clients(num_clients, dim, noise, seed):
  """Per-client designs with z^T z diagonal (z = [x, 1]): rows +-e_k in pairs.

  Then the exact posterior of Bayesian linear regression is a product of
  independent Gaussians, mean-field families contain it, and EP is exact.
  """
  rng = np.random.default_rng(seed)
  w_true, b_true = rng.normal(size=dim), 0.7
  clients = []
  for _ in range(num_clients):
    rows = []
    for k in range(dim):
      for _ in range(rng.integers(1, 4)):  # a +e_k and a -e_k each time
        e = np.zeros(dim)
        e[k] = 1.0
        rows += [e, -e]
    x = np.asarray(rows, np.float32)
    y = (x @ w_true + b_true + noise * rng.normal(size=len(x))).astype(np.float32)
    clients.append((x, y))
  return clients


def _closed_form_posterior(clients, prior_scale, noise):
  z = np.concatenate([np.concatenate([x, np.ones((len(x), 1))], 1) for x, _ in clients])
  y = np.concatenate([y for _, y in clients])
  lam = np.eye(z.shape[1]) / prior_scale**2 + z.T @ z / noise**2
  mean = np.linalg.solve(lam, z.T @ y / noise**2)
  assert np.allclose(lam, np.diag(np.diag(lam))), "test design must be orthogonal"
  return mean, np.diag(lam)


def _flat_posterior(state):
  mean = gaussian.mean(state.posterior)
  prec = gaussian.precision(state.posterior)
  flat = lambda parts: np.concatenate([np.reshape(np.asarray(t), [-1]) for t in parts])
  return flat(mean), flat(prec)


def _linear_config(num_clients, **kw):
  base = dict(input_dim=3,
              num_classes=1,
              num_clients=num_clients,
              hidden_units=(),
              private=False,
              likelihood="gaussian",
              noise_scale=0.5,
              prior_scale=2.0,
              init_scale=0.3,
              kl_weight=1.0,
              server_lr=1.0,
              local_solver="conjugate",
              server_loss_weight=0.0)
  base.update(kw)
  return virtual.VirtualConfig(**base)


def _seeds(r, idx):
  return [np.array([0, 1000 * r + i], np.int64) for i in idx]


@pytest.fixture(scope="module")
def exact_linear_algorithm(tff_runtime):
  """`VirtualAlgorithm(_linear_config(4))` (the exact local solver, alpha = 1), built
  once for the two exact-EP tests: its TFF computations are traced at construction,
  and an algorithm holds no run's state (each round gets the states passed in)."""
  del tff_runtime
  return virtual.VirtualAlgorithm(_linear_config(4))


def test_exact_global_posterior_all_clients(exact_linear_algorithm):
  clients = _orthogonal_regression_clients(4, 3, 0.5, seed=1)
  want_mean, want_prec = _closed_form_posterior(clients, 2.0, 0.5)
  alg = exact_linear_algorithm
  server = alg.initial_server_state()
  states = [alg.initial_client_state(i) for i in range(4)]
  for r in range(3):
    server, states, _ = alg.next(server, states, _seeds(r, range(4)), clients)
    mean, prec = _flat_posterior(server)
    # EP with exact local updates reaches the global posterior after one round
    # and stays there (a fixed point).
    np.testing.assert_allclose(mean, want_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(prec, want_prec, rtol=1e-4)


def test_exact_fixed_point_with_partial_participation(exact_linear_algorithm):
  clients = _orthogonal_regression_clients(4, 3, 0.5, seed=2)
  want_mean, want_prec = _closed_form_posterior(clients, 2.0, 0.5)
  alg = exact_linear_algorithm
  server = alg.initial_server_state()
  states = {i: alg.initial_client_state(i) for i in range(4)}
  rng = np.random.default_rng(0)
  visited = set()
  for r in range(8):
    idx = sorted(rng.choice(4, size=2, replace=False))
    visited.update(idx)
    server, new, _ = alg.next(server, [states[i] for i in idx], _seeds(r, idx),
                              [clients[i] for i in idx])
    states.update(zip(idx, new))
  assert visited == {0, 1, 2, 3}
  mean, prec = _flat_posterior(server)
  np.testing.assert_allclose(mean, want_mean, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(prec, want_prec, rtol=1e-4)


def test_sgd_client_approaches_conjugate_posterior(tff_runtime):
  """The real training path (local reparameterization + SGD on eq. 3) lands
  near the exact answer; the tolerance covers Monte Carlo gradient noise."""
  clients = _orthogonal_regression_clients(2, 3, 0.5, seed=3)
  want_mean, _ = _closed_form_posterior(clients, 2.0, 0.5)
  alg = virtual.VirtualAlgorithm(
      _linear_config(2, local_solver="sgd", epochs=300, batch_size=64, client_lr=0.02))
  server = alg.initial_server_state()
  states = [alg.initial_client_state(i) for i in range(2)]
  for r in range(2):
    server, states, _ = alg.next(server, states, _seeds(r, range(2)), clients)
  mean, _ = _flat_posterior(server)
  np.testing.assert_allclose(mean, want_mean, atol=0.15)


def test_shared_kl_equals_tfp_against_cavity_prior():
  net = networks.VirtualNetworks(4, 3, hidden_units=(5,), init_scale=0.1, seed=0)
  post = net.shared_posterior()
  rng = np.random.default_rng(0)
  cavity = gaussian.from_loc_scale(
      [rng.normal(size=t.shape).astype(np.float32) for t in post.eta1],
      [rng.uniform(0.5, 2, size=t.shape).astype(np.float32) for t in post.eta1])
  prior = gaussian.product(
      gaussian.power(
          gaussian.from_loc_scale([np.zeros(t.shape, np.float32) for t in post.eta1],
                                  [np.ones(t.shape, np.float32) for t in post.eta1]), 1.0 / 7),
      cavity)
  net.set_shared_prior(prior)
  want = sum(
      float(tf.reduce_sum(tfp.distributions.kl_divergence(q, p)))
      for q, p in zip(gaussian.to_normal(post), gaussian.to_normal(prior)))
  assert float(net.kl_shared()) == pytest.approx(want, rel=1e-4)


# ------------------------------------------------------------------ privacy
_AGGREGATING = {
    "federated_sum", "federated_mean", "federated_weighted_mean", "federated_aggregate",
    "federated_secure_sum_bitwidth"
}


def _intrinsic_calls(bb, found):
  if isinstance(bb, tff.framework.Call) and isinstance(bb.function, tff.framework.Intrinsic):
    found.append((bb.function.uri, bb.argument.type_signature))
  for child in bb.children():
    _intrinsic_calls(child, found)
  return found


def _shapes(type_spec):
  if isinstance(type_spec, tff.TensorType):
    return {tuple(type_spec.shape)}
  if isinstance(type_spec, tff.FederatedType):
    return _shapes(type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return set().union(*[_shapes(t) for _, t in tff.structure.iter_elements(type_spec)])
  return set()


def _has_federated(type_spec):
  if isinstance(type_spec, tff.FederatedType):
    return True
  if isinstance(type_spec, tff.StructType):
    return any(_has_federated(t) for _, t in tff.structure.iter_elements(type_spec))
  return False


def test_server_only_receives_aggregates(tff_runtime):
  # No hidden layer: each client still holds private weights (its own network's layer and
  # the lateral connections, 13 tensors) beside its factor and posterior copy.
  alg = virtual.VirtualAlgorithm(
      virtual.VirtualConfig(input_dim=6, num_classes=3, num_clients=4, hidden_units=(), epochs=1))
  assert len(alg.initial_client_state(0).private) > 0
  # The per-client round and the client-batched one (groups of 2 stacked clients).
  for round_fn in (alg.next_per_client, alg._group_round(2)):  # pylint: disable=protected-access
    calls = _intrinsic_calls(round_fn.to_building_block(), [])
    uris = {uri for uri, _ in calls}
    assert "federated_sum" in uris
    assert not uris & {"federated_collect", "federated_select", "federated_secure_select"}
    delta_type = alg.server_update.type_signature.parameter[1]
    summed = 0
    for uri, arg_type in calls:
      if uri not in _AGGREGATING:
        continue
      value_type = arg_type[0] if uri == "federated_weighted_mean" else arg_type
      member = value_type.member
      # Only the deltas (shaped like the shared posterior) and scalar metrics are
      # aggregated: never a client's factor, posterior copy or private weights.
      assert member.is_equivalent_to(delta_type) or _shapes(member) <= {()}, (uri, member)
      summed += member.is_equivalent_to(delta_type)
    assert summed == 1
  # The server-side update is a plain (unplaced) function of (s, aggregate, round).
  assert not _has_federated(alg.server_update.type_signature.parameter)


# ------------------------------------------------------------- end to end
def _tiny_params(tmp_path, **kw):
  p = dict(algorithm="virtual",
           num_clients=6,
           clients_per_round=6,
           rounds=4,
           epochs_per_round=5,
           hidden_units=(32,),
           seed=3,
           output_dir=str(tmp_path),
           verbose=False,
           export=False,  # SavedModels: tests/test_export.py
           client_lr=0.1)
  p.update(kw)
  return p


def _majority_baseline(fd):
  correct = total = 0
  for c in fd.client_ids:
    _, ytr = fd.train[c]
    _, yte = fd.test[c]
    correct += np.sum(yte == np.bincount(ytr).argmax())
    total += len(yte)
  return correct / total


def test_digits_learns_above_per_client_majority(tff_runtime, tmp_path):
  p = _tiny_params(tmp_path)
  summary = driver.run_training(p)
  fd = driver.load_data(driver.resolve_params(p))
  majority = _majority_baseline(fd)
  # Per-client majority-class guessing is what a non-learning personalised
  # model gets on Dirichlet(0.5) clients; MT must clearly beat it, and S must
  # beat chance (0.1) by a wide margin after 4 short rounds.
  assert summary["best_mt_accuracy"] > max(0.6, majority + 0.15), (summary, majority)
  assert summary["best_server_accuracy"] > 0.4, summary
  for name in ("metrics.csv", "summary.json", "curves.png", "client_metrics.csv"):
    assert os.path.exists(tmp_path / name)
  with open(tmp_path / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 4
  for col in ("round", "server_accuracy", "server_loss", "mt_accuracy", "mt_loss", "train_loss",
              "wall_time_s", "bytes_up", "bytes_down", "server_ece", "mt_ece", "cavity_floored",
              "server_floored"):
    assert col in rows[0]
  # At the shipped defaults (damped EP, one step for server and factors) the server
  # posterior is the product of the stored factors on every row.
  assert all(float(r["factor_gap"]) <= 1e-5 for r in rows), [r["factor_gap"] for r in rows]
  log_prec = [float(r["mean_shared_log_precision"]) for r in rows]
  assert np.all(np.isfinite(log_prec)) and len(set(log_prec)) == len(log_prec)
  for key in ("final_server_nll", "final_mt_nll", "final_server_ece", "final_mt_ece"):
    assert np.isfinite(summary[key]), key
  assert 0.0 <= summary["final_mt_ece"] <= 1.0


def test_resume_refuses_other_flags_then_gives_identical_metrics(tff_runtime, tmp_path):
  """The three runs of one configuration (uninterrupted, stopped after round 2,
  resumed) are `run_training`'s on one build of it (`built_runs.run_built`: the same
  round loop, outputs, checkpoint and recorded flags); the refused attempt is
  `run_training`'s own check."""
  common = dict(num_clients=4,
                clients_per_round=2,
                epochs_per_round=1,
                hidden_units=(),  # what a checkpoint keeps does not depend on the depth
                checkpoint_every=1)
  data, algorithm = built_runs.build(_tiny_params(tmp_path / "full", rounds=3, **common))
  full = built_runs.run_built(algorithm, data, _tiny_params(tmp_path / "full", rounds=3, **common))
  built_runs.run_built(algorithm, data, _tiny_params(tmp_path / "part", rounds=2, **common))
  # (--private_kl_weight follows --kl_weight; nothing else differs)
  with pytest.raises(ValueError, match=r"other flags: \['kl_weight', 'private_kl_weight'\]"):
    driver.run_training(
        _tiny_params(tmp_path / "part", rounds=3, resume=True, kl_weight=0.5, **common))
  # the refused attempt left the run as it was: it resumes with its own flags
  resumed = built_runs.run_built(algorithm, data,
                             _tiny_params(tmp_path / "part", rounds=3, resume=True, **common))
  assert resumed["rounds"] == 3

  def rows(d):
    with open(tmp_path / d / "metrics.csv") as f:
      return [{k: v for k, v in r.items() if "wall_time" not in k} for r in csv.DictReader(f)]

  assert len(rows("full")) == 3
  assert rows("full") == rows("part")
  assert full["final_mt_accuracy"] == resumed["final_mt_accuracy"]


@pytest.mark.parametrize("bad, match", [
    (dict(clients_per_round=11, num_clients=10), "clients_per_round"),
    (dict(kl_weight=-1.0), "kl_weight"),
    (dict(dataset="nope"), "dataset"),
    (dict(client_lr=0.0), "client_lr"),
    (dict(server_lr=-0.5), "server_lr"),
    (dict(algorithm="nope"), "algorithm"),
])
def test_bad_flags_are_clear_errors(bad, match):
  with pytest.raises(ValueError, match=match):
    driver.resolve_params({"algorithm": "virtual", **bad})


def test_config_validation():
  with pytest.raises(ValueError, match="server_lr"):
    virtual.VirtualConfig(input_dim=2, num_classes=2, num_clients=2, server_lr=1.5)
  with pytest.raises(ValueError, match="conjugate"):
    virtual.VirtualConfig(input_dim=2, num_classes=2, num_clients=2, local_solver="conjugate")
  with pytest.raises(ValueError, match="precision_step"):
    virtual.VirtualConfig(input_dim=2, num_classes=2, num_clients=2, precision_step=1.5)
  cfg = virtual.VirtualConfig(input_dim=2, num_classes=2, num_clients=2, server_lr=0.3)
  assert cfg.step == 0.3
  assert not virtual.VirtualConfig(
      input_dim=2, num_classes=2, num_clients=2, precision_step=0.1,
      kl_weight=0.0).natural_precision_step

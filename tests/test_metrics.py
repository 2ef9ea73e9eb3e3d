"""Calibration metrics: TF bins against numpy, closed-form ECE, pooling over clients."""

import numpy as np
import pytest
import tensorflow as tf

from tfbfl import round_loop
from tfbfl import metrics


def _random_probs(rng, n, k, temperature):
  logits = rng.normal(size=(n, k)) * temperature
  p = np.exp(logits - logits.max(1, keepdims=True))
  return (p / p.sum(1, keepdims=True)).astype(np.float32)


def test_tf_bins_equal_numpy_bins_including_edges():
  rng = np.random.default_rng(0)
  probs = _random_probs(rng, 500, 10, 3.0)
  # Confidences exactly on bin edges (b/15) and at 1.0 go to the lower bin.
  edge = np.full((3, 2), 0.0, np.float32)
  edge[0] = [1.0, 0.0]
  edge[1] = [2 / 3, 1 / 3]
  edge[2] = [0.5, 0.5]
  probs = np.concatenate([probs, np.pad(edge, ((0, 0), (0, 8)))])
  labels = rng.integers(0, 10, size=len(probs))
  got = metrics.calibration_sums(tf.constant(probs), tf.constant(labels, tf.int32)).numpy()
  want = metrics.numpy_calibration_sums(probs, labels)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert got[0].sum() == len(probs)


def test_ece_closed_forms():
  # Always 100% confident and always right: perfectly calibrated.
  probs = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0]]
  assert metrics.expected_calibration_error(metrics.numpy_calibration_sums(probs,
                                                                           [0, 1, 2, 3, 0])) == 0.0
  # Always 100% confident and always wrong: ECE 1.
  assert metrics.expected_calibration_error(metrics.numpy_calibration_sums(
      probs, [1, 2, 3, 0, 1])) == pytest.approx(1.0)
  # Confidence 0.7 on every example, 50% right: ECE = |0.5 - 0.7| = 0.2.
  probs = np.tile(np.array([[0.7, 0.3]], np.float32), (10, 1))
  labels = [0] * 5 + [1] * 5
  assert metrics.expected_calibration_error(metrics.numpy_calibration_sums(
      probs, labels)) == pytest.approx(0.2)
  with pytest.raises(ValueError, match="shape"):
    metrics.expected_calibration_error(np.zeros(15))


def test_federated_ece_is_the_pooled_ece():
  rng = np.random.default_rng(1)
  clients = []
  for n in (7, 40, 120):
    p = _random_probs(rng, n, 5, 2.0)
    y = rng.integers(0, 5, size=n)
    clients.append((p, y))
  per_client = []
  for p, y in clients:
    bins = metrics.numpy_calibration_sums(p, y)
    per_client.append(
        dict(server_loss=1.0,
             server_correct=1.0,
             mt_loss=1.0,
             mt_correct=1.0,
             num_examples=float(len(y)),
             server_calibration=bins,
             mt_calibration=bins))
  pooled = metrics.expected_calibration_error(
      metrics.numpy_calibration_sums(np.concatenate([p for p, _ in clients]),
                                     np.concatenate([y for _, y in clients])))
  ev = round_loop.aggregate_evaluation(per_client)
  assert ev["server_ece"] == pytest.approx(pooled, rel=1e-12)
  assert ev["mt_ece"] == pytest.approx(pooled, rel=1e-12)
  # The mean of per-client ECEs is a different (wrong) number here.
  mean_of_clients = np.mean([
      metrics.expected_calibration_error(metrics.numpy_calibration_sums(p, y)) for p, y in clients
  ])
  assert abs(mean_of_clients - pooled) > 1e-3


def test_evaluation_keeps_the_reliability_bins_and_each_clients_calibration():
  """`calibration`: the pooled bins (a reliability diagram) and, per client, its MT NLL
  and ECE on its own test data, from which the pooled values follow again."""
  rng = np.random.default_rng(2)
  per_client, data = [], []
  for n in (5, 60, 0, 200):
    p = _random_probs(rng, n, 4, 2.5)
    y = rng.integers(0, 4, size=n)
    nll = float(-np.log(p[np.arange(n), y]).sum()) if n else 0.0
    bins = metrics.numpy_calibration_sums(p, y)
    per_client.append(dict(server_loss=nll, server_correct=0.0, mt_loss=nll, mt_correct=0.0,
                           num_examples=float(n), server_calibration=bins, mt_calibration=bins))
    data.append((p, y, nll))
  cal = round_loop.aggregate_evaluation(per_client)["calibration"]
  assert cal["client_num_examples"] == [5, 60, 0, 200]
  assert cal["client_mt_nll"][2] is None and cal["client_mt_ece"][2] is None
  for k in (0, 1, 3):
    p, y, nll = data[k]
    assert cal["client_mt_nll"][k] == pytest.approx(nll / len(y))
    assert cal["client_mt_ece"][k] == pytest.approx(
        metrics.expected_calibration_error(metrics.numpy_calibration_sums(p, y)))
  pooled = metrics.numpy_calibration_sums(np.concatenate([d[0] for d in data]),
                                          np.concatenate([d[1] for d in data]))
  np.testing.assert_allclose(cal["mt_bins"], pooled)
  np.testing.assert_allclose(cal["server_bins"], pooled)
  assert np.asarray(cal["mt_bins"])[0].sum() == 265


def test_strict_json_has_no_nan_or_infinity():
  import json
  out = json.dumps(round_loop.strict_json(
      dict(a=float("nan"), b=[float("inf"), -np.inf], c=np.float32(1.5), d=(1, 2))),
                   allow_nan=False)
  assert json.loads(out) == dict(a="nan", b=["inf", "-inf"], c=1.5, d=[1, 2])

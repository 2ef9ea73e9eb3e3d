"""Post-hoc temperature scaling fitted over the clients (`tfbfl.temperature`).

* The federated fit recovers the temperature of scaled calibrated logits split over
  clients, and the test sums it reports are those of `softmax(z / T)` computed
  directly (NLL and reliability bins).
* Why one temperature and not one per client: a small calibration set the model gets
  all right pulls its own fit to the grid's lowest temperature; pooled with the
  others' it does not.
* Bad settings are refused by the driver with the flags named.
"""

import numpy as np
import pytest

from tfbfl import driver
from tfbfl import evaluation
from tfbfl import metrics
from tfbfl import temperature

GRID = temperature.TEMPERATURES


def _calibrated(rng, n, classes=10):
  """Logits z and labels drawn from softmax(z): z is calibrated (T* = 1)."""
  z = rng.normal(size=(n, classes)) * 2
  p = np.exp(z)
  p /= p.sum(1, keepdims=True)
  return z.astype(np.float32), np.array([rng.choice(classes, p=q) for q in p])


def _client(fit_logits, fit_labels, test_logits, test_labels, key="mt"):
  loss, bins = temperature.tempered_sums(test_logits, test_labels)
  return {f"{key}_fit_nll": temperature.calibration_nll(fit_logits, fit_labels).numpy(),
          f"{key}_tempered_loss": loss.numpy(), f"{key}_tempered_calibration": bins.numpy(),
          f"{key}_loss": 0.0, f"{key}_calibration": None}


def _nll(z, y):
  z = z - z.max(1, keepdims=True)
  return float(-np.sum(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(1))))


def test_the_grid_holds_one_and_spans_its_range():
  assert GRID[0] == pytest.approx(0.05) and GRID[-1] == pytest.approx(20.0, rel=1e-5)
  assert np.min(np.abs(GRID - 1.0)) < 1e-5  # "no scaling" is a candidate
  assert np.all(np.diff(np.log(GRID)) == pytest.approx(np.log(400) / 60, rel=1e-4))


@pytest.mark.parametrize("c", [0.5, 1.0, 3.0])
def test_federated_fit_recovers_the_temperature_and_reports_direct_sums(c):
  rng = np.random.default_rng(0)
  z_fit, y_fit = _calibrated(rng, 2000)
  z_test, y_test = _calibrated(rng, 600)
  # five clients, uneven shares of the calibration and test examples
  cuts_fit, cuts_test = [0, 100, 300, 900, 1200, 2000], [0, 50, 100, 300, 400, 600]
  clients = [
      _client(c * z_fit[a:b], y_fit[a:b], c * z_test[s:t], y_test[s:t])
      for a, b, s, t in zip(cuts_fit, cuts_fit[1:], cuts_test, cuts_test[1:])
  ]
  t = temperature.select(clients, "mt")
  assert abs(np.log(t / c)) < 0.1, (c, t)  # within one grid step (~10 %)
  # what each client now reports is softmax(c z / t) on its test part, computed directly
  for client, s, e in zip(clients, cuts_test, cuts_test[1:]):
    z = c * z_test[s:e] / t
    assert client["mt_loss"] == pytest.approx(_nll(z, y_test[s:e]), rel=1e-4)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(client["mt_calibration"],
                               metrics.numpy_calibration_sums(p, y_test[s:e]),
                               rtol=1e-4, atol=1e-3)
    assert not any(k.endswith(("_fit_nll", "_tempered_loss", "_tempered_calibration"))
                   for k in client)


def test_one_small_all_correct_client_would_fit_the_grids_end_alone_but_not_pooled():
  rng = np.random.default_rng(1)
  confident = rng.normal(size=(26, 10)).astype(np.float32) * 5
  alone = [_client(confident, confident.argmax(1), confident, confident.argmax(1))]
  assert temperature.select(alone, "mt") == GRID[0]
  z, y = _calibrated(rng, 1000)
  pooled = [_client(confident, confident.argmax(1), confident, confident.argmax(1)),
            _client(z, y, z, y)]
  assert abs(np.log(temperature.select(pooled, "mt"))) < 0.15


def test_aggregate_evaluation_reads_the_sums_at_the_fitted_temperatures():
  rng = np.random.default_rng(2)
  per_client = []
  for _ in range(3):
    z, y = _calibrated(rng, 300)
    s = _client(2.0 * z[:150], y[:150], 2.0 * z[150:], y[150:], key="server")
    m = _client(0.5 * z[:150], y[:150], 0.5 * z[150:], y[150:], key="mt")
    per_client.append(dict(**s, **m, num_examples=150.0, server_correct=1.0, mt_correct=1.0))
  out = evaluation.aggregate_evaluation(per_client)
  assert abs(np.log(out["server_temperature"] / 2.0)) < 0.25  # 450 examples: a looser fit
  assert abs(np.log(out["mt_temperature"] / 0.5)) < 0.25
  assert np.isfinite(out["server_ece"]) and np.isfinite(out["mt_ece"])
  assert "mt_fit_nll" in per_client[0]  # the caller's sums are left as they were


def test_select_without_any_calibration_example_names_the_flag():
  empty = np.zeros((0, 10), np.float32)
  z, y = _calibrated(np.random.default_rng(3), 20)
  with pytest.raises(ValueError, match="--calibration_fraction"):
    temperature.select([_client(empty, np.zeros(0, int), z, y)], "mt")


@pytest.mark.parametrize("flags, match", [
    (dict(algorithm="fedavg", temperature_scaling=True), "set both or neither"),
    (dict(algorithm="fedavg", calibration_fraction=0.2), "set both or neither"),
    (dict(algorithm="fola", calibration_fraction=0.2, temperature_scaling=True),
     "--algorithm=fola does not have"),
    (dict(algorithm="virtual", calibration_fraction=0.2), "set both or neither"),
    (dict(algorithm="local", calibration_fraction=0.2), "--algorithm=local does not have"),
])
def test_impossible_flag_combinations_are_refused(flags, match, tmp_path):
  with pytest.raises(ValueError, match=match):
    driver.resolve_params(dict(flags, rounds=1, output_dir=str(tmp_path)))

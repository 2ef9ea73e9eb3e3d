"""VIRTUAL with post-hoc temperature scaling (`--temperature_scaling`).

The temperatures and the tempered S and MT NLL a VIRTUAL run reports in metrics.csv
are recomputed here by another path: the run's final state restored from its
checkpoint, each client's predictive probabilities `p` from the exported predictors
(`server_predictor`, `client_predictor`), `softmax(log p / T)` in numpy over the grid,
the argmin of the calibration NLL summed over clients. The Monte Carlo predictive
takes the same path, on the log of its averaged probabilities. The calibration split
is never trained on: the run's training split has shrunk by it.
"""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from tfbfl import driver
from tfbfl import restore
from tfbfl import temperature
from tfbfl.algorithms.base import evaluation_seed
from tfbfl.algorithms import virtual
from tfbfl.algorithms.virtual import VirtualConfig

pytestmark = pytest.mark.usefixtures("tff_runtime")


def _run(tmp_path, **kw):
  params = dict(algorithm="virtual", num_clients=6, clients_per_round=3, rounds=3,
                epochs_per_round=2, hidden_units=(16,), seed=3, client_lr=0.1,
                output_dir=str(tmp_path), verbose=False, export=False,
                temperature_scaling=True, calibration_fraction=0.25)
  params.update(kw)
  driver.run_training(params)
  with open(os.path.join(tmp_path, "metrics.csv")) as f:
    return list(csv.DictReader(f))[-1]


def _grid_nll(p, y):
  """Summed NLL of `softmax(log p / T)` at every grid T: `[grid]`."""
  z = np.log(p.astype(np.float64) + 1e-12)[None] / temperature.TEMPERATURES[:, None, None]
  z = z - z.max(-1, keepdims=True)
  log_q = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -log_q[:, np.arange(len(y)), y].sum(-1)


def _check_against_predictors(out, last, samples):
  run = restore.restore_run(str(out))
  algorithm, state, fd = run.algorithm, run.server_state, run.data
  assert fd.calibration is not None
  fits = {"server": 0.0, "mt": 0.0}
  tests = {"server": 0.0, "mt": 0.0}
  n = 0
  for i, cid in enumerate(fd.client_ids):
    x, y = fd.test[cid]
    xc, yc = fd.calibration[cid]
    assert len(yc) > 0 and len(fd.train[cid][1]) > 0
    client = run.clients.get(i) or algorithm.initial_client_state(i)
    # With samples, the predictors' fixed seeds from the run's seed (as the export
    # passes it) are the evaluation's ([seed, 0] for the server, [seed, i + 1] for
    # client i; the noise keyed by the example).
    seed = int(run.params["seed"])
    s = algorithm.server_predictor(state, seed=seed)
    m = algorithm.client_predictor(state, client, seed=seed)
    predict = {"server": s, "mt": m}
    # the grids one client reports, computed by the evaluation's own functions (from
    # the seed the driver passes, which the Monte Carlo passes do not read)
    seed = evaluation_seed(int(run.params["seed"]), i)
    sums = {**virtual.evaluate_server_client(algorithm.config, state.posterior, np.int32(i),
                                             seed, x, y, xc, yc),
            **virtual.evaluate_own_client(algorithm.config, client.shared_posterior, client.private,
                                          np.int32(i), seed, x, y, xc, yc)}
    for key in fits:
      fit, test = _grid_nll(np.asarray(predict[key](xc)), yc), _grid_nll(np.asarray(predict[key](x)), y)
      np.testing.assert_allclose(sums[f"{key}_fit_nll"], fit, rtol=1e-4, err_msg=key)
      np.testing.assert_allclose(sums[f"{key}_tempered_loss"], test, rtol=1e-4, err_msg=key)
      fits[key], tests[key] = fits[key] + fit, tests[key] + test
    n += len(y)
  for key in fits:
    best = int(np.argmin(fits[key]))
    assert float(last[f"{key}_temperature"]) == pytest.approx(temperature.TEMPERATURES[best],
                                                             rel=1e-5), key
    assert float(last[f"{key}_loss"]) == pytest.approx(tests[key][best] / n, rel=1e-4), key
  return fits


def test_posterior_mean_temperatures_match_the_predictors(tmp_path):
  last = _run(tmp_path, eval_samples=0)
  fits = _check_against_predictors(tmp_path, last, samples=0)
  # the fit is informative: the calibration NLL is not flat over the grid
  assert fits["mt"].max() > 1.5 * fits["mt"].min()


def test_monte_carlo_temperatures_match_the_seeded_predictors(tmp_path):
  """At the shipped default evaluation: the Monte Carlo predictive of 10 passes."""
  last = _run(tmp_path)
  default = VirtualConfig(input_dim=2, num_classes=2, num_clients=2).eval_samples
  assert default == 10
  _check_against_predictors(tmp_path, last, samples=default)


def test_gaussian_likelihood_is_refused():
  with pytest.raises(ValueError, match="--temperature_scaling"):
    VirtualConfig(input_dim=2, num_classes=1, num_clients=2, likelihood="gaussian",
                  temperature_scaling=True)


def test_launcher_flags_fit_temperatures(tmp_path):
  """`python -m launchers.train` with the documented flags, as a user runs it."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, "-m", "launchers.train", "--algorithm=virtual",
                        "--rounds=1", "--epochs_per_round=1", "--num_clients=4",
                        "--clients_per_round=2", "--hidden_units=8", "--eval_samples=2",
                        "--temperature_scaling", "--calibration_fraction=0.2",
                        f"--output_dir={tmp_path}"],
                       capture_output=True, text=True, timeout=240, env=env,
                       stdin=subprocess.DEVNULL)
  assert out.returncode == 0, out.stderr[-2000:]
  with open(os.path.join(tmp_path, "metrics.csv")) as f:
    last = list(csv.DictReader(f))[-1]
  for key in ("server_temperature", "mt_temperature"):
    assert np.min(np.abs(np.log(float(last[key]) / temperature.TEMPERATURES))) < 1e-4
  # without the split it reads, the flag is refused before any training, naming both flags
  bad = subprocess.run([sys.executable, "-m", "launchers.train", "--algorithm=virtual",
                        "--temperature_scaling", f"--output_dir={tmp_path / 'bad'}"],
                       capture_output=True, text=True, timeout=120, env=env,
                       stdin=subprocess.DEVNULL)
  assert bad.returncode != 0 and "--calibration_fraction" in bad.stderr
  assert not (tmp_path / "bad").exists()

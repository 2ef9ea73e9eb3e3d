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
from tfbfl import evaluation
from tfbfl import restore
from tfbfl import temperature
from tfbfl.algorithms.base import evaluation_seed
from tfbfl.algorithms.virtual import VirtualConfig
import train_in_process

pytestmark = pytest.mark.usefixtures("tff_runtime")

# The run both checks train, at the documented flags (`--temperature_scaling
# --calibration_fraction=0.2`, docs/virtual.md) on a small network; 3 clients (one
# never selected or not): the check builds and traces a predictor per client.
_SIZES = ("--num_clients=3", "--clients_per_round=2", "--rounds=3", "--epochs_per_round=2",
          "--hidden_units=16", "--seed=3", "--client_lr=0.1", "--export=false")
_DOCUMENTED = ("--temperature_scaling", "--calibration_fraction=0.2")


def _last_row(out):
  with open(os.path.join(out, "metrics.csv")) as f:
    return list(csv.DictReader(f))[-1]


def _run(tmp_path, **kw):
  params = dict(algorithm="virtual", num_clients=3, clients_per_round=2, rounds=3,
                epochs_per_round=2, hidden_units=(16,), seed=3, client_lr=0.1,
                output_dir=str(tmp_path), verbose=False, export=False,
                temperature_scaling=True, calibration_fraction=0.25)
  params.update(kw)
  driver.run_training(params)
  return _last_row(tmp_path)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
  """`launchers.train --algorithm=virtual` at the shipped default evaluation with the
  documented temperature flags, parsed as the launcher parses them and trained in
  this process (`train_in_process`): its output directory and last metrics row."""
  out = tmp_path_factory.mktemp("default_run")
  train_in_process.train("--algorithm=virtual", *_SIZES, *_DOCUMENTED, f"--output_dir={out}")
  return out, _last_row(out)


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
  assert algorithm.config.eval_samples == samples
  k = len(fd.client_ids)
  clients = [run.clients.get(i) or algorithm.initial_client_state(i) for i in range(k)]
  data = []
  for cid in fd.client_ids:
    (x, y), (xc, yc) = fd.test[cid], fd.calibration[cid]
    assert len(yc) > 0 and len(fd.train[cid][1]) > 0
    data.append((x, y, xc, yc))
  # The grids each client reports, computed by the evaluation's own computations (the
  # driver's streamed S and MT, one call each for every client), from the seeds the
  # driver passes (which the Monte Carlo passes do not read).
  seeds = [evaluation_seed(int(run.params["seed"]), i) for i in range(k)]
  reported = [{**s, **m} for s, m in zip(
      evaluation.rekey(list(range(k)), algorithm.evaluate_server(state, range(k), seeds, data)),
      evaluation.rekey(list(range(k)), algorithm.evaluate_clients(clients, range(k), seeds, data)))]
  # With samples, the predictors' fixed seeds from the run's seed (as the export
  # passes it) are the evaluation's ([seed, 0] for the server, [seed, i + 1] for
  # client i; the noise keyed by the example). One server model serves every client.
  seed = int(run.params["seed"])
  server = algorithm.server_predictor(state, seed=seed)
  fits = {"server": 0.0, "mt": 0.0}
  tests = {"server": 0.0, "mt": 0.0}
  n = 0
  mt = None
  for i in range(k):
    x, y, xc, yc = data[i]
    # Client i's model assigned into client i - 1's predictor, as the export does.
    mt = algorithm.client_predictor(state, clients[i], seed=seed, reuse=mt)
    predict = {"server": server, "mt": mt}
    for key in fits:
      fit, test = _grid_nll(np.asarray(predict[key](xc)), yc), _grid_nll(np.asarray(predict[key](x)), y)
      np.testing.assert_allclose(reported[i][f"{key}_fit_nll"], fit, rtol=1e-4, err_msg=key)
      np.testing.assert_allclose(reported[i][f"{key}_tempered_loss"], test, rtol=1e-4, err_msg=key)
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
  # the fit is informative: the calibration NLL is not flat over the grid (max / min
  # over seeds 0-4: 6.9-21.9)
  assert fits["mt"].max() > 1.5 * fits["mt"].min()


def test_monte_carlo_temperatures_match_the_seeded_predictors(default_run):
  """At the shipped default evaluation: the Monte Carlo predictive of 10 passes."""
  out, last = default_run
  default = VirtualConfig(input_dim=2, num_classes=2, num_clients=2).eval_samples
  assert default == 10
  _check_against_predictors(out, last, samples=default)


def test_gaussian_likelihood_is_refused():
  with pytest.raises(ValueError, match="--temperature_scaling"):
    VirtualConfig(input_dim=2, num_classes=1, num_clients=2, likelihood="gaussian",
                  temperature_scaling=True)


def test_launcher_flags_fit_temperatures(tmp_path, default_run):
  """`launchers.train` with the documented flags, as a user gives them: the run (parsed
  by the launcher's flags, trained in-process) fits temperatures on the grid; the
  program itself (`python -m launchers.train`) refuses the flag without its split."""
  _, last = default_run
  for key in ("server_temperature", "mt_temperature"):
    assert np.min(np.abs(np.log(float(last[key]) / temperature.TEMPERATURES))) < 1e-4
  # without the split it reads, the flag is refused before any training, naming both flags
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  bad = subprocess.run([sys.executable, "-m", "launchers.train", "--algorithm=virtual",
                        "--temperature_scaling", f"--output_dir={tmp_path / 'bad'}"],
                       capture_output=True, text=True, timeout=120, env=env,
                       stdin=subprocess.DEVNULL)
  assert bad.returncode != 0 and "--calibration_fraction" in bad.stderr
  assert not (tmp_path / "bad").exists()

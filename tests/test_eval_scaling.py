"""Streamed, cached evaluation (`tfbfl.round_loop.ExperimentRunner.evaluate`).

* The streamed path (S from the server state alone, MT per client in chunks of
  `eval_chunk`, cached until the client trains again) writes the same
  metrics.csv and client_metrics.csv as the single call with every client's
  state (`eval_chunk = 0`), chunks of 3 over 5 clients (a short last one), for
  VIRTUAL and FedAvg (with and without fitted temperatures, which need every
  client's sums before any is read).
* Only clients trained since the last evaluation have their MT recomputed
  (observed by counting the clients each `evaluate_clients` call receives), at
  the posterior means and with the Monte Carlo predictive (`eval_samples > 0`,
  drawn from seeds no round changes: the first bullet's VIRTUAL cases, at its
  default Monte Carlo predictive, check that cached sums equal recomputed ones);
  never-selected clients get no stored state.
"""

import csv
import json

import numpy as np
import pytest

from tfbfl import round_loop
from tfbfl import driver
from tfbfl import temperature

import built_runs

pytestmark = pytest.mark.usefixtures("tff_runtime")


def _params(tmp_path, **kw):
  p = dict(algorithm="virtual",
           num_clients=5,
           clients_per_round=2,
           rounds=3,
           epochs_per_round=1,
           hidden_units=(16,),
           seed=5,
           output_dir=str(tmp_path),
           verbose=False,
           export=False,
           client_lr=0.1)
  p.update(kw)
  return p


def _read(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def _assert_same_csv(a, b, skip=("wall_time_s",)):
  rows_a, rows_b = _read(a), _read(b)
  assert len(rows_a) == len(rows_b) > 0
  assert list(rows_a[0]) == list(rows_b[0])
  for ra, rb in zip(rows_a, rows_b):
    for key in ra:
      if key in skip:
        continue
      va, vb = float(ra[key]), float(rb[key])
      # the CSVs hold 6 significant digits
      np.testing.assert_allclose(va, vb, rtol=2e-5, atol=1e-6, err_msg=f"{a}: {key}")


TEMPERATURE_SCALING = dict(temperature_scaling=True, calibration_fraction=0.25)


@pytest.fixture(scope="module")
def built():
  """`(data, algorithm)` per configuration, built once: the single-call, streamed and
  counted runs of one configuration differ only in how they are evaluated."""
  return {}


def _build(built, algorithm, extra):
  key = (algorithm, json.dumps(extra, sort_keys=True))
  if key not in built:
    built[key] = built_runs.build(_params(None, algorithm=algorithm, output_dir=None, **extra))
  return built[key]


@pytest.mark.parametrize("algorithm, extra", [("virtual", {}), ("fedavg", {}),
                                              ("fedavg", TEMPERATURE_SCALING),
                                              ("virtual", dict(TEMPERATURE_SCALING, eval_samples=2))],
                         ids=["virtual", "fedavg", "fedavg_temperature_scaling",
                              "virtual_mc_temperature_scaling"])
def test_streamed_cached_evaluation_equals_single_call(tmp_path, built, algorithm, extra):
  one = tmp_path / "one_call"
  streamed = tmp_path / "streamed"
  data, algo = _build(built, algorithm, extra)
  # with fitted temperatures, the export states them (its models are untempered)
  built_runs.run_built(algo, data, _params(one, algorithm=algorithm, eval_chunk=0, **extra,
                                           **dict(export=True) if extra else {}))
  # chunks of 3 over 5 clients (a short last chunk), disk store, cache on
  built_runs.run_built(
      algo, data,
      _params(streamed, algorithm=algorithm, eval_chunk=3, client_store="disk", **extra))
  _assert_same_csv(one / "metrics.csv", streamed / "metrics.csv")
  _assert_same_csv(one / "client_metrics.csv", streamed / "client_metrics.csv")
  header = list(_read(one / "metrics.csv")[0])
  assert {"server_ece", "mt_ece", "server_accuracy", "mt_loss"} <= set(header)
  if extra:  # one fitted temperature per predictive and round, a grid value
    rows = _read(one / "metrics.csv")
    manifest = json.loads((one / "export" / "export.json").read_text())
    for key in ("server_temperature", "mt_temperature"):
      for row in rows:
        assert np.min(np.abs(np.log(float(row[key]) / temperature.TEMPERATURES))) < 1e-4
      assert manifest["run"][key] == pytest.approx(float(rows[-1][key]), rel=1e-5)


class _Counting:
  """The algorithm, with the client indices of every `evaluate_clients` and
  `evaluate_server` call recorded (results untouched)."""

  def __init__(self, algorithm):
    self._algorithm = algorithm
    self.mt_calls, self.s_calls = [], []

  def __getattr__(self, name):
    return getattr(self._algorithm, name)

  def evaluate_clients(self, states, indices, seeds, test_data):
    self.mt_calls.append(list(indices))
    return self._algorithm.evaluate_clients(states, indices, seeds, test_data)

  def evaluate_server(self, server_state, indices, seeds, test_data):
    self.s_calls.append(list(indices))
    return self._algorithm.evaluate_server(server_state, indices, seeds, test_data)


def _runner(p, eval_chunk, data, algorithm):
  p = driver.resolve_params(p)
  algorithm = _Counting(algorithm)
  config = round_loop.RunConfig(rounds=p["rounds"],
                                clients_per_round=p["clients_per_round"],
                                seed=p["seed"],
                                verbose=False,
                                eval_chunk=eval_chunk)
  return round_loop.ExperimentRunner(algorithm, data, config), algorithm


def test_only_trained_clients_recomputed(built):
  k, c = 5, 2
  # Which clients are recomputed is the evaluator's choice alone (it never reads
  # eval_samples); the sampled predictive's cached values are checked equal to
  # one call's by test_streamed_cached_evaluation_equals_single_call. Its VIRTUAL
  # (the default Monte Carlo predictive) serves here.
  p = _params(None, num_clients=k, clients_per_round=c, rounds=3, output_dir=None)
  runner, algo = _runner(p, 3, *_build(built, "virtual", {}))
  runner.run()
  per_eval = (k + 2) // 3  # S calls per evaluation
  assert len(algo.s_calls) == 3 * per_eval
  assert all(len(ids) <= 3 for ids in algo.s_calls + algo.mt_calls)
  # Evaluation 1 computes every client (cold cache): chunks over 0..4.
  first = [i for ids in algo.mt_calls[:per_eval] for i in ids]
  assert first == list(range(k))
  rest = algo.mt_calls[per_eval:]
  flat_rest = [i for ids in rest for i in ids]
  selected = [round_loop.sample_clients(5, r, k, c) for r in (2, 3)]
  # Evaluations 2 and 3: exactly the clients trained in rounds 2 and 3.
  assert flat_rest == selected[0] + selected[1], (flat_rest, selected)
  untouched = set(range(k)) - set(selected[0]) - set(selected[1])
  assert untouched and not untouched & set(flat_rest)
  # Never-selected clients have no stored state (rebuilt from their seed).
  ever = set().union(*[round_loop.sample_clients(5, r, k, c) for r in (1, 2, 3)])
  assert set(runner.state["clients"].keys()) == ever
  assert runner.eval_counts["mt_clients"] == k + len(flat_rest)

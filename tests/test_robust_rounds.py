"""Robust rounds (tfbfl.algorithms.robust, issue 16): bad client updates are
dropped before aggregation, an all-dropped round changes nothing, and a
non-finite server state stops the run with one clear line, and so do
ALL_DROPPED_STOP_ROUNDS rounds in a row with every client dropped (issue 21)."""

import csv
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfbfl import data as data_lib  # noqa: E402
from tfbfl import round_loop  # noqa: E402
from tfbfl import state_files  # noqa: E402
from tfbfl import driver  # noqa: E402
from tfbfl.algorithms import robust  # noqa: E402
from launcher_helpers import run_launcher  # noqa: E402
import built_runs  # noqa: E402

_ROUNDS = 2


def _params(algorithm, **kw):
  p = dict(algorithm=algorithm,
           num_clients=4,
           clients_per_round=4,
           epochs_per_round=2,
           hidden_units=(8,),
           rounds=_ROUNDS,
           client_lr=0.2,
           verbose=False)
  if algorithm == "virtual":
    p.update(client_lr=0.1, server_lr=0.5)
  p.update(kw)
  return driver.resolve_params(p)


@pytest.fixture(scope="module")
def digits():
  return driver.load_data(_params("fedavg"))


@pytest.fixture(scope="module")
def built(tff_runtime, digits):
  """`build(p)`: the algorithm of `p`, built once per config for the module (the scaled
  clients' shapes are the digits')."""
  del tff_runtime
  builds = built_runs.Builds()
  return lambda p: builds.algorithm(digits, p)


def _scaled(fd, client, scale):
  """`fd` with client `client`'s training features multiplied by `scale` (finite)."""
  ids = fd.client_ids
  return data_lib.from_client_arrays(
      {
          c: fd.train[c][0] * (scale if i == client else 1.0) for i, c in enumerate(ids)
      }, {c: fd.train[c][1] for c in ids}, {c: fd.test[c][0] for c in ids},
      {c: fd.test[c][1] for c in ids},
      num_classes=fd.num_classes)


def _run(p, fd, algo=None, **run_kw):
  """Runs `p` on `fd` with `algo` (built from them when not given)."""
  algo = algo or driver.build_algorithm(fd, p)
  runner = round_loop.ExperimentRunner(
      algo, fd,
      round_loop.RunConfig(rounds=p["rounds"],
                           clients_per_round=p["clients_per_round"],
                           verbose=run_kw.pop("verbose", False),
                           **run_kw))
  runner.run()
  return algo, runner


def _leaves(tree):
  return [np.asarray(t) for t in tf.nest.flatten(tree)]


def _assert_same(a, b):
  la, lb = _leaves(a), _leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------------ the rule
def test_rule_drops_non_finite_and_outlying_updates_only():
  ref = [tf.fill([10], 3.0)]  # ||ref|| = sqrt(90) ~ 9.49
  ok, ratio = robust.check_update([tf.fill([10], 1.0)], ref, 100.0)
  assert bool(ok) and np.isclose(float(ratio), np.sqrt(10) / np.sqrt(90))
  ok, ratio = robust.check_update([tf.fill([10], 300.0)], ref, 100.0)  # ratio 100: kept
  assert bool(ok) and np.isclose(float(ratio), 100.0)
  ok, _ = robust.check_update([tf.fill([10], 301.0)], ref, 100.0)
  assert not bool(ok)
  # A small reference counts as 1; the float64 norm does not overflow.
  ok, ratio = robust.check_update([tf.constant([50.0])], [tf.constant([1e-3])], 100.0)
  assert bool(ok) and np.isclose(float(ratio), 50.0)
  ok, ratio = robust.check_update([tf.constant([1e30, 1e30])], [tf.constant([1e30])], 100.0)
  assert bool(ok) and np.isclose(float(ratio), np.sqrt(2))
  for bad in (np.nan, np.inf):
    ok, ratio = robust.check_update([tf.constant([1.0, bad])], ref, 100.0)
    assert not bool(ok) and np.isinf(float(ratio))
    ok, _ = robust.check_update([tf.constant([1.0, bad])], ref, np.inf, check_norm=False)
    assert not bool(ok)
  ok, _ = robust.check_update([tf.fill([10], 1e6)], ref, np.inf)
  assert bool(ok)
  ok, _ = robust.check_update([tf.fill([10], 1e6)], ref, 100.0, check_norm=False)
  assert bool(ok)


def _gaussian(mean, precision):
  from tfbfl import gaussian  # pylint: disable=g-import-not-at-top
  mean, precision = np.asarray(mean, np.float32), np.asarray(precision, np.float32)
  return gaussian.NaturalGaussian([tf.constant(mean * precision)], [tf.constant(precision)])


def test_posterior_rule_measures_the_mean_move_not_the_natural_parameters():
  """VIRTUAL's rule (issue 21): a precision that grows 400 -> 1.2e6 (what
  --precision_step does on digits) is no outlier; the move of the mean is measured
  against the server mean, as FedAvg's weights."""
  old = _gaussian(np.full(10, 3.0), np.full(10, 400.0))  # ||mu|| = sqrt(90)
  sharper = _gaussian(np.full(10, 3.0), np.full(10, 1.2e6))
  ok, ratio = robust.check_posterior(sharper, old, 100.0)
  assert bool(ok) and float(ratio) == 0.0
  # The natural parameters (mu * prec, prec) grow ~3000-fold: the old rule dropped it.
  delta = [tf.concat([sharper.eta1[0] - old.eta1[0], sharper.eta2[0] - old.eta2[0]], 0)]
  ok, ratio = robust.check_update(delta, [tf.concat([old.eta1[0], old.eta2[0]], 0)], 100.0)
  assert not bool(ok) and float(ratio) > 1e3
  ok, ratio = robust.check_posterior(_gaussian(np.full(10, 4.0), np.full(10, 50.0)), old, 100.0)
  assert bool(ok) and np.isclose(float(ratio), np.sqrt(10) / np.sqrt(90))
  ok, ratio = robust.check_posterior(_gaussian(np.full(10, 303.0), np.full(10, 400.0)), old, 100.0)
  assert bool(ok) and np.isclose(float(ratio), 100.0)  # boundary: kept
  ok, _ = robust.check_posterior(_gaussian(np.full(10, 304.0), np.full(10, 400.0)), old, 100.0)
  assert not bool(ok)
  ok, _ = robust.check_posterior(_gaussian(np.full(10, 1e6), np.full(10, 400.0)), old, np.inf)
  assert bool(ok)
  # Non-finite entries or a non-positive precision: dropped with ratio inf, whatever
  # max_ratio.
  for mean, prec in ((np.nan, 400.0), (3.0, np.inf), (3.0, np.nan), (3.0, 0.0), (3.0, -1.0)):
    bad = _gaussian(np.r_[np.full(9, 3.0), mean], np.r_[np.full(9, 400.0), prec])
    for max_ratio in (100.0, np.inf):
      ok, ratio = robust.check_posterior(bad, old, max_ratio)
      assert not bool(ok) and np.isinf(float(ratio)), (mean, prec, max_ratio)


def test_max_update_ratio_flag_is_checked():
  assert driver.resolve_params({})["max_update_ratio"] == robust.DEFAULT_MAX_UPDATE_RATIO
  assert driver.resolve_params(dict(max_update_ratio=float("inf")))["max_update_ratio"] == np.inf
  for bad in (0.0, -1.0, float("nan")):
    with pytest.raises(ValueError, match="max_update_ratio"):
      driver.resolve_params(dict(max_update_ratio=bad))


# ------------------------------------------------------------ huge client
@pytest.mark.parametrize("algorithm", ["virtual", "fedavg", "fola"])
def test_client_with_huge_features_is_dropped(built, digits, algorithm):
  p = _params(algorithm)
  fd = _scaled(digits, 0, 1e20)
  algo, runner = _run(p, fd, built(p))
  assert [row["clients_dropped"] for row in runner.rows] == [1.0] * _ROUNDS
  assert not round_loop.non_finite_leaves(runner.state["server_state"])
  assert all(np.isfinite(row["train_loss"]) for row in runner.rows)
  assert runner.rows[-1]["server_accuracy"] > 0.3  # chance is 0.1
  # Dropped in every round: its stored state is still its initial one.
  _assert_same(runner.state["clients"][0], algo.initial_client_state(0))
  assert not np.array_equal(
      _leaves(runner.state["clients"][1])[0],
      _leaves(algo.initial_client_state(1))[0])


def test_outlier_rule_drops_a_finite_update(built, digits):
  """x 1e3 features: FedAvg's update stays finite but is far above 100 x ||w||,
  so only the norm rule drops it (with max_update_ratio=inf it is kept)."""
  fd = _scaled(digits, 0, 1e3)
  p = _params("fedavg", rounds=1)  # the huge-features case's config (ratio ~6e3)
  kept_p = driver.resolve_params(dict(p, max_update_ratio=float("inf")))
  _, kept = _run(kept_p, fd, built(kept_p))
  assert kept.rows[0]["clients_dropped"] == 0.0
  assert 100.0 < kept.rows[0]["update_ratio_max"] < np.inf
  _, dropped = _run(p, fd, built(p))
  assert dropped.rows[0]["clients_dropped"] == 1.0
  assert dropped.rows[0]["update_ratio_max"] == kept.rows[0]["update_ratio_max"]


# ------------------------------------------------------- all clients dropped
@pytest.mark.parametrize("algorithm", ["virtual", "fedavg"])
def test_huge_client_lr_drops_every_client_or_stops(built, digits, algorithm, capsys):
  p = _params(algorithm, client_lr=1e3, rounds=1)
  algo = built(p)
  try:
    _, runner = _run(p, digits, algo, verbose=True)
  except round_loop.NonFiniteServerStateError as e:  # the other allowed outcome
    assert "round 1" in str(e) and algorithm in str(e) and "--client_lr" in str(e)
    return
  assert runner.rows[0]["clients_dropped"] == 4.0
  _assert_same(runner.state["server_state"], algo.initial_server_state()._replace(round_num=1))
  for i in range(4):
    _assert_same(runner.state["clients"][i], algo.initial_client_state(i))
  assert "all 4 client updates were dropped" in capsys.readouterr().out


# ----------------------------------------- every client dropped, rounds in a row
def test_rounds_in_a_row_with_every_client_dropped_stop_the_run(tff_runtime, digits, tmp_path):
  """A tiny --max_update_ratio drops every (normal) VIRTUAL update: after
  ALL_DROPPED_STOP_ROUNDS such rounds the run stops with one line, its rounds
  written, instead of finishing untrained."""
  del tff_runtime
  stop = round_loop.ALL_DROPPED_STOP_ROUNDS
  p = _params("virtual", rounds=stop + 2, epochs_per_round=1, max_update_ratio=1e-9)
  out = str(tmp_path / "run")
  algo = driver.build_algorithm(digits, p)
  runner = round_loop.ExperimentRunner(
      algo, digits,
      round_loop.RunConfig(rounds=stop + 2, clients_per_round=4, output_dir=out, verbose=False))
  with pytest.raises(round_loop.AllClientsDroppedError,
                     match=rf"\[virtual\] rounds 1-{stop}: every client update was dropped in "
                     rf"{stop} rounds in a row .*--max_update_ratio=1e-09") as e:
    runner.run()
  assert isinstance(e.value, round_loop.RunStoppedError) and "\n" not in str(e.value)
  with open(os.path.join(out, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["round"] for r in rows] == [str(i) for i in range(1, stop + 1)]
  assert all(float(r["clients_dropped"]) == 4.0 for r in rows)
  assert all(0.0 < float(r["update_ratio_max"]) < 1.0 for r in rows)  # finite, normal moves
  assert not os.path.exists(os.path.join(out, "summary.json"))


def test_launcher_stops_an_all_dropped_run_with_one_line(tmp_path):
  """Through `launchers.train`: exit `RUN_STOPPED_STATUS`, one line naming the cause and
  the flag."""
  stop = round_loop.ALL_DROPPED_STOP_ROUNDS
  proc = run_launcher("train", "--algorithm=fedavg", "--num_clients=4", "--hidden_units=8",
                      "--epochs_per_round=1", f"--rounds={stop + 2}", "--max_update_ratio=1e-9",
                      f"--output_dir={tmp_path}")
  assert proc.returncode == round_loop.RUN_STOPPED_STATUS, proc.stderr[-3000:]
  fatal = [line for line in proc.stderr.splitlines() if line.startswith("FATAL train:")]
  assert len(fatal) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert f"rounds 1-{stop}: every client update was dropped" in fatal[0]
  assert "--max_update_ratio=1e-09" in fatal[0]
  assert f"round {stop}/{stop + 2}" in proc.stdout and f"round {stop + 1}/" not in proc.stdout


# --------------------------------------------------- non-finite server state
class _PoisonRound2:
  """Wraps an algorithm; its round 2 returns a NaN server state."""

  def __init__(self, inner):
    self._inner, self.name = inner, inner.name

  def __getattr__(self, name):
    return getattr(self._inner, name)

  def next(self, server_state, client_states, seeds, data):
    new_state, clients, metrics = self._inner.next(server_state, client_states, seeds, data)
    if int(new_state.round_num) == 2:
      weights = new_state.model_weights
      poisoned = [np.full_like(w, np.nan) for w in weights.trainable]
      new_state = new_state._replace(model_weights=type(weights)(poisoned, weights.non_trainable))
    return new_state, clients, metrics


def test_non_finite_server_state_stops_before_writing(built, digits, tmp_path):
  p = _params("fedavg", rounds=3)  # the huge-features case's config
  algo = _PoisonRound2(built(p))
  out = str(tmp_path / "run")
  runner = round_loop.ExperimentRunner(
      algo, digits,
      round_loop.RunConfig(rounds=3,
                           clients_per_round=4,
                           output_dir=out,
                           checkpoint_every=1,
                           verbose=False))
  with pytest.raises(round_loop.NonFiniteServerStateError,
                     match=r"\[fedavg\] round 2: .*non-finite.*--client_lr") as e:
    runner.run()
  assert isinstance(e.value, RuntimeError)
  assert state_files.read_meta(os.path.join(out, round_loop.CHECKPOINT))["round"] == 1
  with open(os.path.join(out, "metrics.csv")) as f:
    assert [line.split(",")[0] for line in f.read().splitlines()[1:]] == ["1"]
  assert not os.path.exists(os.path.join(out, "summary.json"))


def test_launcher_prints_one_line_for_a_non_finite_server(monkeypatch, capsys):
  from launchers import train  # pylint: disable=g-import-not-at-top

  def boom(params):
    del params
    raise round_loop.NonFiniteServerStateError(
        "[virtual] round 3: the server state became non-finite; try a smaller --client_lr")

  monkeypatch.setattr(driver, "run_training", boom)
  monkeypatch.setattr(train, "params_from_flags", dict)
  with pytest.raises(SystemExit) as e:
    train.main(["train"])
  assert e.value.code == round_loop.RUN_STOPPED_STATUS
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "round 3" in err and "Traceback" not in err

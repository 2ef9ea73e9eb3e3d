"""Server optimizers (SGD with momentum: FedAvgM; Adam: FedAdam) and client momentum
of FedAvg / FedProx / FedPA (`--server_optimizer`, `--server_momentum`,
`--server_beta_1`, `--server_beta_2`, `--server_epsilon`, `--client_momentum`).

What is checked here (each can fail):
* server momentum follows its recursion: with a constant mean delta the server
  weights after T steps are `w0 - lr sum_t (1 - beta^t) / (1 - beta) Delta`; through
  `next`, two rounds equal `m <- beta m + Delta`, `w <- w - lr m` with each round's
  Delta taken from plain FedAvg (server_lr 1) at the same server model;
* Adam's first step is `lr Delta / (|Delta| + eps / sqrt(1 - beta_2))`, i.e. about
  `lr sign(Delta)`;
* client momentum 0.9 changes the trajectory and still learns on digits;
* a checkpoint keeps the optimizer state: a resumed run equals an uninterrupted one;
* every flag, parsed as `launchers.train` parses it (trained in this process:
  `train_in_process`), runs (FedAdam, FedAvgM with client momentum on FedProx, FedPA
  with the authors' setting), is recorded in `flags.txt` and learns;
* bad combinations are one line naming the flag, before TensorFlow starts; VIRTUAL,
  Local and Global do not have these flags (one warning line names them).
(The equality with tff.learning's FedAvg with the same TFF optimizers is in
`tests/test_fedavg.py`, FedPA's round with client momentum in `tests/test_fedpa.py`.)
"""

import csv
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tfbfl import round_loop  # noqa: E402
from tfbfl import tff_learning  # noqa: E402
from tfbfl import state_files  # noqa: E402
from tfbfl import driver  # noqa: E402
from tfbfl.algorithms import fedavg  # noqa: E402
from launcher_helpers import assert_one_fatal_line_before_tensorflow  # noqa: E402
import train_in_process  # noqa: E402
import built_runs  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SEED = 3


def _params(**kw):
  p = dict(algorithm="fedavg",
           num_clients=3,
           clients_per_round=3,
           hidden_units=(12,),
           epochs_per_round=2,
           batch_size=16,
           client_lr=0.1,
           seed=_SEED,
           rounds=2,
           verbose=False)
  p.update(kw)
  return driver.resolve_params(p)


@pytest.fixture(scope="module")
def fd():
  return driver.load_data(_params())


@pytest.fixture(scope="module")
def plain(tff_runtime, fd):
  """Plain FedAvg (server_lr 1), the reference whose round reads off `Delta`; built
  once for the module's tests that use it (an algorithm holds no run's state)."""
  del tff_runtime
  return driver.build_algorithm(fd, _params(server_lr=1.0))


@pytest.fixture(scope="module")
def momentum(tff_runtime, fd):
  """FedAvgM at server_lr 0.5, momentum 0.9: built once for the closed form of its
  finalizer and its rounds through `next` (an algorithm holds no run's state)."""
  del tff_runtime
  return driver.build_algorithm(fd, _params(server_lr=0.5, server_momentum=0.9))


def _flat(weights):
  return np.concatenate([np.asarray(w, np.float64).ravel() for w in weights.trainable])


def _round(algo, state, fd, r):
  data = [fd.train[c] for c in fd.client_ids]
  seeds = [round_loop.client_seed(_SEED, r, i) for i in range(len(data))]
  clients = [algo.initial_client_state(i) for i in range(len(data))]
  new_state, _, metrics = algo.next(state, clients, seeds, data)
  return new_state, metrics


def _mean_delta(plain, weights, fd, r):
  """Round r's mean client delta `Delta` at server model `weights` (plain FedAvg,
  server_lr 1: its new server model is `weights - Delta`)."""
  state = plain.initial_server_state()._replace(model_weights=weights, round_num=np.int32(r - 1))
  new_state, _ = _round(plain, state, fd, r)
  return _flat(weights) - _flat(new_state.model_weights)


def test_server_momentum_closed_form_with_a_constant_delta(momentum):
  lr, beta, steps = 0.5, 0.9, 5
  algo = momentum
  assert (algo.config.server_step, algo.config.server_momentum) == (lr, beta)
  state = algo.initial_server_state()
  weights, fin = state.model_weights, state.finalizer_state
  rng = np.random.default_rng(0)
  delta = [rng.normal(size=np.shape(w)).astype(np.float32) for w in weights.trainable]
  for _ in range(steps):
    out = algo._finalizer.next(fin, weights, delta)  # pylint: disable=protected-access
    weights, fin = out.result, out.state
  factor = sum((1 - beta**t) / (1 - beta) for t in range(1, steps + 1))  # 16.6 for 0.9, 5
  want = _flat(state.model_weights) - lr * factor * np.concatenate([d.ravel() for d in delta])
  np.testing.assert_allclose(_flat(weights), want, atol=1e-4)
  # The accumulator is m_T = sum_t beta^(T - t) Delta.
  m = (1 - beta**steps) / (1 - beta)
  for got, d in zip(fin["accumulator"], delta):
    np.testing.assert_allclose(np.asarray(got), m * d, rtol=1e-5, atol=1e-5)


def test_server_momentum_rounds_follow_the_recursion(momentum, fd, plain):
  lr, beta = 0.5, 0.9
  algo = momentum
  assert (algo.config.server_step, algo.config.server_momentum) == (lr, beta)
  state = algo.initial_server_state()
  w, m = _flat(state.model_weights), 0.0
  for r in (1, 2, 3):
    delta = _mean_delta(plain, state.model_weights, fd, r)
    state, metrics = _round(algo, state, fd, r)
    m = beta * m + delta
    w = w - lr * m
    np.testing.assert_allclose(_flat(state.model_weights), w, atol=2e-5)
    assert metrics["update_non_finite"] == 0
  assert np.max(np.abs(m)) > 1e-2  # the momentum is not negligible
  np.testing.assert_allclose(np.concatenate(
      [np.ravel(a) for a in state.finalizer_state["accumulator"]]),
                             m,
                             atol=2e-5)


def test_adam_first_step_is_about_lr_times_sign_of_delta(tff_runtime, fd, plain):
  lr, eps, beta_2 = 0.01, 1e-7, 0.999
  algo = driver.build_algorithm(fd, _params(server_optimizer="adam", server_lr=lr))
  state = algo.initial_server_state()
  w0 = _flat(state.model_weights)
  delta = _mean_delta(plain, state.model_weights, fd, 1)
  new_state, _ = _round(algo, state, fd, 1)
  step = w0 - _flat(new_state.model_weights)
  # atol: Delta is read off float32 weights, so an entry of ~1e-6 (where the step is
  # most sensitive to it) is known to ~1e-8.
  np.testing.assert_allclose(step,
                             lr * delta / (np.abs(delta) + eps / np.sqrt(1 - beta_2)),
                             rtol=1e-4,
                             atol=2e-5)
  # Most entries: |Delta| > 1e-3, so the step is lr * sign(Delta) to within
  # (eps / sqrt(1 - beta_2)) / |Delta| < 0.32%.
  big = np.abs(delta) > 1e-3
  assert big.mean() > 0.5
  np.testing.assert_allclose(step[big], lr * np.sign(delta[big]), rtol=5e-3)
  assert int(np.asarray(new_state.finalizer_state["step"])) == 1


def test_unset_server_lr_is_one_for_sgd_and_adams_default_for_adam():
  assert _params()["server_lr"] == 1.0
  assert _params(server_momentum=0.9)["server_lr"] == 1.0
  assert _params(server_optimizer="adam")["server_lr"] == fedavg.ADAM_DEFAULT_LR
  assert _params(server_optimizer="adam", server_lr=0.2)["server_lr"] == 0.2
  config = fedavg.FedAvgConfig(input_dim=4, num_classes=2, server_optimizer="adam")
  assert config.server_step == fedavg.ADAM_DEFAULT_LR


def _run(fd, rounds, **kw):
  p = _params(rounds=rounds, **kw)
  algo = driver.build_algorithm(fd, p)
  runner = round_loop.ExperimentRunner(algo, fd, driver.run_config(p))
  runner.run()
  return runner


def test_client_momentum_changes_the_trajectory_and_learns_on_digits(tff_runtime):
  p = dict(num_clients=10,
           clients_per_round=10,
           hidden_units=(32,),
           epochs_per_round=5,
           client_lr=0.05)
  fd10 = driver.load_data(_params(**p))
  plain = _run(fd10, 4, **p)
  moment = _run(fd10, 4, client_momentum=0.9, **p)
  a = _flat(plain.state["server_state"].model_weights)
  b = _flat(moment.state["server_state"].model_weights)
  assert np.max(np.abs(a - b)) > 1e-2
  first, last = moment.rows[0], moment.rows[-1]
  assert last["server_accuracy"] > 0.8 and last["mt_accuracy"] > 0.8, moment.rows  # chance 0.1
  assert last["server_loss"] < first["server_loss"]
  assert all(row["clients_dropped"] == 0 for row in moment.rows)


def _rows(path):
  with open(os.path.join(path, "metrics.csv")) as f:
    return [{k: v for k, v in r.items() if "wall_time" not in k} for r in csv.DictReader(f)]


@pytest.mark.parametrize("flags, key", [
    (dict(algorithm="fedavg", server_momentum=0.9, server_lr=0.5,
          client_momentum=0.5), "accumulator"),
    (dict(algorithm="fedprox", server_optimizer="adam", server_lr=0.03), "preconditioner"),
])
def test_resume_keeps_the_optimizer_state(tff_runtime, tmp_path, flags, key):
  """The three runs of one configuration (uninterrupted, stopped after round 2,
  resumed) are `run_training`'s on one build of it (`built_runs.run_built`: the same
  round loop, outputs, checkpoint and recorded flags)."""
  del tff_runtime
  common = dict(checkpoint_every=1, export=False, **flags)
  params = lambda rounds, out, **kw: dict(
      _params(rounds=rounds, output_dir=str(tmp_path / out), **common), **kw)
  data, algorithm = built_runs.build(params(3, "full"))
  full = built_runs.run_built(algorithm, data, params(3, "full"))
  built_runs.run_built(algorithm, data, params(2, "part"))
  state, _ = state_files.load(str(tmp_path / "part" / round_loop.CHECKPOINT))
  saved = state["server_state"].finalizer_state[key]
  assert max(float(np.max(np.abs(np.asarray(a)))) for a in saved) > 0  # not the initial zeros
  resumed = built_runs.run_built(algorithm, data, params(3, "part", resume=True))
  assert resumed["rounds"] == 3 and len(_rows(tmp_path / "full")) == 3
  assert _rows(tmp_path / "full") == _rows(tmp_path / "part")
  assert full["final_server_accuracy"] == resumed["final_server_accuracy"]


def test_every_flag_through_the_launcher_runs_and_learns(tff_runtime, tmp_path, capsys):
  """`launchers.train`'s flags, parsed as the launcher parses them and trained in this
  process (`train_in_process`: the launcher program's own refusals are the
  subprocess cases below)."""
  del tff_runtime
  common = ("--rounds=4", "--epochs_per_round=5", "--hidden_units=32", "--export=false")
  jobs = {
      "adam": [
          "--algorithm=fedavg", "--server_optimizer=adam", "--server_beta_1=0.8",
          "--server_beta_2=0.99", "--server_epsilon=0.001"
      ],
      "fedavgm": [
          "--algorithm=fedprox", "--server_momentum=0.9", "--server_lr=0.5", "--client_momentum=0.5"
      ],
      # FedPA, the authors' setting; posterior rounds from round 3.
      "fedpa": [
          "--algorithm=fedpa", "--server_lr=0.5", "--server_momentum=0.9", "--client_momentum=0.9",
          "--fedpa_server_burn_in=2", "--fedpa_burn_in=2"
      ],
  }
  for name, args in jobs.items():
    out = str(tmp_path / name)
    capsys.readouterr()
    train_in_process.train(*common, *args, f"--output_dir={out}")
    err = capsys.readouterr().err
    assert "does not use" not in err, (name, err[-2000:])
    rows = _rows(out)
    assert len(rows) == 4
    assert float(rows[-1]["server_accuracy"]) > 0.6, (name, rows)  # chance: 0.1
    assert float(rows[-1]["server_loss"]) < float(rows[0]["server_loss"]), (name, rows)
    with open(os.path.join(out, "flags.txt")) as f:
      recorded = set(f.read().split())
    assert set(args) <= recorded, name


def _launch(argv):
  env = dict(os.environ, PYTHONPATH=_ROOT)
  return subprocess.run([sys.executable, "-X", "importtime", "-m", "launchers.train", *argv],
                        cwd=_ROOT,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=120)


@pytest.mark.parametrize("argv, flag", [
    (["--algorithm=fedavg", "--server_optimizer=adam", "--server_momentum=0.9"
     ], "--server_momentum"),
    (["--algorithm=fedprox", "--server_beta_1=0.5"], "--server_beta_1"),
    (["--algorithm=fedpa", "--server_epsilon=0.01"], "--server_epsilon"),
    (["--algorithm=fedavg", "--client_momentum=1"], "--client_momentum"),
    (["--algorithm=fedavg", "--server_momentum=-0.1"], "--server_momentum"),
    (["--algorithm=fedavg", "--server_optimizer=rmsprop"], "--server_optimizer"),
])
def test_bad_combination_is_one_line_before_tensorflow(argv, flag):
  assert_one_fatal_line_before_tensorflow(_launch(argv), flag)


@pytest.mark.parametrize("algorithm", ["virtual", "local", "global"])
def test_algorithms_without_these_flags_name_them_in_a_warning(algorithm, capsys):
  driver.resolve_params(dict(algorithm=algorithm, server_optimizer="adam", client_momentum=0.9))
  err = capsys.readouterr().err
  assert f"--algorithm={algorithm} does not use" in err
  assert "--client_momentum" in err and "--server_optimizer" in err
  # A combination only FedAvg's family refuses is not checked for them.
  driver.resolve_params(dict(algorithm=algorithm, server_optimizer="adam", server_momentum=0.9))


def test_learning_process_takes_the_settings(tff_runtime, fd):
  process = tff_learning.build_fedavg_process(fd, server_momentum=0.9, server_lr=0.5, seed=_SEED)
  assert process.algorithm.config.server_momentum == 0.9
  state = process.initialize()
  assert "accumulator" in state.algorithm.finalizer_state
  # A plain ModelConfig (no optimizer flags) still builds FedAvg.
  plain = tff_learning.build_fedavg_process(fedavg.ModelConfig(input_dim=64, num_classes=10))
  assert isinstance(plain.algorithm, fedavg.FedAvgAlgorithm)


def test_library_configs_check_the_same_rules():
  with pytest.raises(ValueError, match="--server_momentum"):
    fedavg.ModelConfig(input_dim=4, num_classes=2, server_optimizer="adam", server_momentum=0.5)
  with pytest.raises(ValueError, match="--server_beta_1"):
    fedavg.FedAvgConfig(input_dim=4, num_classes=2, server_optimizer="adam", server_beta_1=1.0)
  with pytest.raises(ValueError, match="--server_epsilon"):
    fedavg.FedAvgConfig(input_dim=4, num_classes=2, server_optimizer="adam", server_epsilon=0.0)
  with pytest.raises(ValueError, match="--server_optimizer"):
    fedavg.FedAvgConfig(input_dim=4, num_classes=2, server_optimizer="yogi")
  with pytest.raises(ValueError, match="--server_momentum"):
    driver.resolve_params(dict(algorithm="fedpa", server_optimizer="adam", server_momentum=0.9))

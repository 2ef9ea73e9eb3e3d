"""Issue 34's VIRTUAL knobs through the launcher's flags, at the shipped defaults on
digits (parsed as `launchers.train` parses them, trained in the test's process:
`train_in_process`; the launcher program's own behaviour is tested as a subprocess
elsewhere, e.g. tests/test_flags.py). Two rounds, S and MT evaluated after the last
(`--eval_every=2`; the variance trajectories are training metrics, in every row).

* `--scale_optimizer=adam`: the variance trajectories (`log_prec_*` in metrics.csv) move
  away from the initial scale, which under the paper's plain SGD they do not, and the
  run still learns (the closed-form check of what they move to: test_virtual_ep.py).
* `--private_kl_weight`: unset, the run records the paper's one beta for it; set, it
  reaches the client step (the run differs) and the run learns (the step's own checks:
  test_virtual_step.py).
"""

import csv
import os

import pytest

import train_in_process
from tfbfl import driver

_ROUNDS = 2
_INIT_LOG_PRECISION = 5.9915  # log(1 / init_scale^2), init_scale = 0.05


def _rows(out, *flags):
  train_in_process.train("--algorithm=virtual", f"--rounds={_ROUNDS}", f"--eval_every={_ROUNDS}",
                         "--seed=0", "--export=false", f"--output_dir={out}", *flags)
  with open(os.path.join(out, "metrics.csv")) as f:
    return [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def _flags(out):
  with open(os.path.join(out, "flags.txt")) as f:
    return f.read().splitlines()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tff_runtime):
  del tff_runtime
  return (_rows(tmp_path_factory.mktemp("sgd")),
          _rows(tmp_path_factory.mktemp("adam"), "--scale_optimizer=adam", "--scale_lr=1e-3"))


@pytest.fixture(scope="module")
def private_kl_run(tmp_path_factory, tff_runtime):
  del tff_runtime
  out = tmp_path_factory.mktemp("private_kl")
  return _rows(out, "--private_kl_weight=1"), _flags(out)


def test_private_kl_weight_defaults_to_beta_and_reaches_the_step(runs, private_kl_run, tmp_path):
  sgd, _ = runs
  rows, flags = private_kl_run
  assert "--private_kl_weight=1.0" in flags and "--kl_weight=0.0001" in flags
  assert rows[-1]["mt_accuracy"] > 0.5 and rows[-1]["server_accuracy"] > 0.5
  assert rows[-1]["mt_loss"] != sgd[-1]["mt_loss"]
  # unset, the run records the value it used: the paper's one beta
  resolved = driver.resolve_params(dict(algorithm="virtual", kl_weight=0.003, rounds=1,
                                        output_dir=str(tmp_path)))
  assert resolved["private_kl_weight"] == 0.003


def test_trajectories_are_reported_per_layer(runs):
  sgd, _ = runs
  keys = {k for k in sgd[0] if k.startswith("log_prec_")}
  # The digits MLP: 2 hidden layers and the output, server and client, and the laterals.
  assert keys == {f"log_prec_{role}_{l}" for role in ("shared", "private")
                  for l in (1, 2, 3)} | {"log_prec_lateral"}
  # Plain SGD (the paper's): every layer stays at the initial scale (measured: within 0.003).
  assert all(abs(r[k] - _INIT_LOG_PRECISION) < 0.01 for r in sgd for k in keys)


def test_adam_moves_the_variances_and_still_learns(runs):
  sgd, adam = runs
  # Measured (seed 0, 2 rounds): private layer 1 5.86, lateral 5.89, shared layer 3 6.06
  # (3 rounds: 5.77, 5.82, 6.09); S accuracy 0.71 against plain SGD's 0.71.
  moved = [abs(adam[-1][k] - _INIT_LOG_PRECISION) for k in adam[-1] if k.startswith("log_prec_")]
  assert max(moved) > 0.05, adam[-1]
  assert adam[-1]["server_accuracy"] > 0.5 and adam[-1]["mt_accuracy"] > 0.5
  assert abs(adam[-1]["server_accuracy"] - sgd[-1]["server_accuracy"]) < 0.05

"""`--precision_step` through the launcher's flags (issue 21; parsed as `launchers.train`
parses them and trained in the test's process, `train_in_process`): at the shipped
training defaults on digits (the run writes no SavedModels: tests/test_export.py covers them) the
natural-gradient precision step makes the shared precisions learn, no client update
is dropped by the robust-round rule, and the server model learns.

Until issue 21 the drop rule measured VIRTUAL's natural-parameter delta against
the server's natural parameters; the precision jump of round 1 (mean log
precision 5.99 -> 10.49) gave a ratio of ~1e4, every client was dropped in every
round, and the run finished untrained (S accuracy 0.109, log precision 5.99) with
exit 0."""

import csv
import os

import pytest

import train_in_process

_ROUNDS = 2  # round 1's precision jump, then a round that builds on it
_INIT_LOG_PRECISION = 5.9915  # log(1 / init_scale^2), init_scale = 0.05


@pytest.fixture(scope="module")
def run(tmp_path_factory, tff_runtime):
  del tff_runtime
  out = tmp_path_factory.mktemp("precision_step")
  _, stdout = train_in_process.train("--algorithm=virtual", f"--rounds={_ROUNDS}", "--seed=0",
                                     "--precision_step=0.05", "--export=false",
                                     f"--output_dir={out}")
  with open(os.path.join(out, "metrics.csv")) as f:
    rows = [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
  return stdout, rows


def test_no_client_is_dropped(run):
  stdout, rows = run
  assert [r["round"] for r in rows] == list(range(1, _ROUNDS + 1))
  assert [r["clients_dropped"] for r in rows] == [0.0] * _ROUNDS
  assert "dropped 0/10" in stdout and "were dropped" not in stdout
  # Measured (seed 0): update_ratio_max 0.253, 0.111: far below the default 100.
  assert all(r["update_ratio_max"] < 1.0 for r in rows)


def test_precisions_move(run):
  _, rows = run
  log_prec = [r["mean_shared_log_precision"] for r in rows]
  # Measured (seed 0): 10.49, 11.66; plain SGD stays at 5.992.
  assert log_prec[0] > _INIT_LOG_PRECISION + 2.0
  assert all(b > a for a, b in zip(log_prec, log_prec[1:]))


def test_server_accuracy_rises(run):
  _, rows = run
  acc = [r["server_accuracy"] for r in rows]
  # Measured (seed 0): 0.835, 0.895 (chance 0.1; all dropped it stayed 0.109).
  assert acc[0] > 0.5
  assert acc[-1] > acc[0]
  assert all(r["train_loss"] > 0 for r in rows)

"""Smoke tests of the PFNM launchers (tiny settings, run as subprocesses) and of
their flag validation (in-process, on private FlagValues)."""

import csv
import os

import pytest

from launcher_helpers import run_launchers_in_parallel
from absl import flags

from reproduction import pfnm_options as po

TINY = ["--trials=1", "--epochs=1", "--seed=1"]
LAUNCHERS = {
    "pfnm_batches": ["--J=2", "--hidden_units=16", "--comm_rounds=1", "--kd_hidden=16"],
    "pfnm_depth": ["--C=2", "--J=2", "--width=8", "--comm_rounds=1", "--kd_hidden=8"],
    "pfnm_streaming": ["--J=2", "--steps=2", "--hidden_units=8"],
    "pfnm_sensitivity": [
        "--J=2", "--hidden_units=8", "--sigma0_sq_grid=10", "--gamma0_grid=1",
        "--sigma_sq_grid=0.1,1"
    ],
}
FIGURES = {
    "pfnm_batches": ["fig2_constrained.png", "fig3_extra_resources.png"],
    "pfnm_depth": ["fig4_depth.png"],
    "pfnm_streaming": ["fig_streaming.png"],
    "pfnm_sensitivity": ["fig4_sensitivity.png", "fig5_sigma.png"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Starts the four launchers at once (they share 2 cores) and waits for all."""
  return run_launchers_in_parallel(LAUNCHERS, tmp_path_factory, TINY, timeout=240)


def _read_csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_launcher_writes_its_outputs(runs, name):
  out, rc, log = runs[name]
  assert rc == 0, log[-3000:]
  for f in ["results.csv", "results.md", "trials.csv", "settings.json", *FIGURES[name]]:
    assert os.path.getsize(os.path.join(out, f)) > 0, f
  for f in FIGURES[name]:
    with open(os.path.join(out, f), "rb") as fh:
      assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
  assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]  # atomic writes
  rows = _read_csv(os.path.join(out, "results.csv"))
  assert "trial 1/1" in log
  # Progress within a trial: its local networks, each method, downpour SGD's rounds.
  if name in ("pfnm_batches", "pfnm_depth"):
    for line in ("trial 1/1] 2 local networks trained", "trial 1/1] pfnm: accuracy",
                 "trial 1/1] D-SGD round 1/1: test accuracy"):
      assert line in log, (line, log[-3000:])
  if name == "pfnm_sensitivity":
    assert "trial 1/1] grid point 2/2" in log, log[-3000:]
  if name == "pfnm_sensitivity":
    assert len(rows) == 2
    assert all(0.0 <= float(r["train_accuracy_mean"]) <= 1.0 for r in rows)
    return
  methods = {r["method"] for r in rows}
  assert "pfnm" in methods or "pfnm_streaming" in methods
  assert all(0.0 <= float(r["accuracy_mean"]) <= 1.0 for r in rows)
  with open(os.path.join(out, "results.md")) as f:
    md = f.read()
  assert "PFNM" in md and "± " in md
  if name == "pfnm_batches":
    assert methods == set(po.ONESHOT_METHODS) and {r["J"] for r in rows} == {"2"}
    kd = next(r for r in rows if r["method"] == "distillation")
    assert "violates the federated constraint" in kd["constraint"]
    assert "KD (pools data) †" in md
  if name == "pfnm_depth":
    assert {r["C"] for r in rows} == {"2"}
    pf = [r for r in rows if r["method"] == "pfnm"]
    assert len(pf) == 1 and float(pf[0]["neurons_mean"]) > 0
  if name == "pfnm_streaming":
    assert {r["step"] for r in rows} == {"1", "2"}
    assert methods == set(po.STREAMING_METHODS)


def _flag_values(extra_args):
  fv = flags.FlagValues()
  po.define_data_flags(fv)
  po.define_training_flags(fv)
  po.define_matching_flags(fv)
  po.define_baseline_flags(po.ONESHOT_METHODS, fv)
  fv(["prog", "--output_dir=/tmp/unused", *extra_args])
  return fv


@pytest.mark.parametrize("args, flag", [
    (["--dataset=nonexistent"], "--dataset"),
    (["--dataset=har"], "--dataset"),
    (["--epochs=-1"], "--epochs"),
    (["--lr=0"], "--lr"),
    (["--sigma_sq=0"], "--sigma_sq"),
    (["--methods=pfnm,nonsense"], "--methods"),
    (["--hidden_units=0"], "--hidden_units"),
    (["--comm_rounds=0"], "--comm_rounds"),
])
def test_bad_flags_raise_value_errors_naming_the_flag(args, flag):
  with pytest.raises(ValueError, match=flag):
    po.settings_from_flags(_flag_values(args), po.ONESHOT_METHODS)


def test_list_parsers_name_the_flag():
  assert po.parse_int_list("J", "2, 5,10") == [2, 5, 10]
  assert po.parse_float_list("gamma0_grid", ["0.1", "1"]) == [0.1, 1.0]
  with pytest.raises(ValueError, match="--J"):
    po.parse_int_list("J", "2,x")
  with pytest.raises(ValueError, match="--J"):
    po.parse_int_list("J", "0")
  with pytest.raises(ValueError, match="--sigma_sq_grid"):
    po.parse_float_list("sigma_sq_grid", "0.1,-1")


def test_reference_settings_preset_and_explicit_overrides():
  hp = po.settings_from_flags(_flag_values([]), po.ONESHOT_METHODS).hp
  assert (hp.sigma0_sq, hp.sigma_sq, hp.gamma0, hp.popularity_cap) == (10.0, 0.1, 1.0, None)
  assert hp.softmax_precision == "class_frequency"
  ref = po.settings_from_flags(_flag_values(["--reference_settings"]), po.ONESHOT_METHODS).hp
  assert (ref.sigma0_sq, ref.sigma_sq, ref.popularity_cap, ref.truncation) == (1.0, 1.0, 10,
                                                                               "reference")
  mixed = po.settings_from_flags(_flag_values(["--reference_settings", "--sigma_sq=0.2"]),
                                 po.ONESHOT_METHODS).hp
  assert (mixed.sigma0_sq, mixed.sigma_sq, mixed.popularity_cap) == (1.0, 0.2, 10)


def test_missing_mnist_files_give_a_clear_error(tmp_path):
  settings = po.ExperimentSettings(dataset="mnist", data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match=str(tmp_path)):
    settings.load(num_clients=2, seed=0)

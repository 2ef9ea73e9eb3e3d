"""The reproduction runner: catalogue, tuning choice, records, resume after a kill, report."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from tfbfl import data as data_lib
from tfbfl import round_loop
from tfbfl import state_files
from reproduction import records as records_lib
from reproduction import reproduce
from reproduction import reproduction_report
from reproduction import runner
from reproduction import virtual_report

from launcher_helpers import ROOT


def _record(cell, curves, wall=10.0):
  """A record as `run_cell` writes it, with the given per-round curves."""
  result = dict(curves=dict(round=list(range(1, len(curves["mt_accuracy"]) + 1)), **curves),
                summary={})
  return runner.make_record(cell, cell.command("out", "/data"), result, wall, time.time())


def _write(results_dir, rec):
  path = os.path.join(results_dir, rec["cell"]["name"] + ".json")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(rec, f)


# ------------------------------------------------------------------ catalogue
def test_catalogue_names_are_unique_and_cover_the_issue():
  cells = reproduce.catalogue({})
  names = [c.name for c in cells]
  assert len(names) == len(set(names))
  for row in ("mnist", "pmnist", "femnist_mlp"):
    for alg in ("virtual", "fedavg", "fedprox", "fedpa"):
      tuned = [c for c in cells if c.experiment == "table2" and c.row == row and c.algorithm == alg]
      assert sorted(c.seed for c in tuned) == [0, 1, 2]
      assert all(c.depends for c in tuned)  # nothing tuned yet
      tuning = [c for c in cells if c.experiment == "tune" and c.row == row and c.algorithm == alg]
      assert tuning and all(c.seed == 0 for c in tuning)
      assert all(c.flag_dict["validation_fraction"] > 0 for c in tuning)
      assert all("validation_fraction" not in c.flag_dict for c in tuned)
  # The paper's protocol comes from the presets: K = 100, C = 10, E = 20, B = 20.
  mnist = next(c for c in cells if c.name.startswith("virtual/tune/mnist/fedavg"))
  f = mnist.flag_dict
  assert (f["num_clients"], f["clients_per_round"], f["epochs_per_round"],
          f["batch_size"]) == (100, 10, 20, 20)
  assert f["partition"] == "homogeneous" and f["data_dir"] == "<data_root>/mnist"
  pfnm = [c for c in cells if c.paper == "pfnm"]
  assert {c.row for c in pfnm} == {"homogeneous", "class_dirichlet"}
  fola = [c for c in cells if c.experiment == "first_round"]
  assert sorted({c.flag_dict["alpha"] for c in fola}) == [0.01, 0.1, 1.0, 10.0, 100.0]
  assert {c.flag_dict["hidden_units"] for c in fola} == {"500,300"}


def test_tuned_cells_take_the_setting_with_the_best_validation_mt(tmp_path):
  """PMNIST's FedProx: the grid's best setting, then its server step's stage at that
  setting; the default step keeps it when no other step beats it."""
  assert reproduce.step_stage("pmnist", "fedprox")
  cells = reproduce.catalogue({})
  tuning = [c for c in cells if c.experiment == "tune" and c.row == "pmnist" and
            c.algorithm == "fedprox"]
  records = {}
  rng = np.random.default_rng(0)
  scores = rng.uniform(0.5, 0.9, size=len(tuning))
  winner = int(np.argmax(scores))
  for c, s in zip(tuning, scores):
    # The best round counts (Table II's max over rounds), not the last one.
    records[c.name] = _record(c, dict(mt_accuracy=[0.1, float(s), 0.2]))
    # Missing one record: the tuned cells still wait.
    if len(records) == len(tuning) - 1:
      partial = reproduce.catalogue(records)
      assert all(c2.depends for c2 in partial
                 if c2.experiment == "table2" and c2.row == "pmnist" and c2.algorithm == "fedprox")
  def pmnist_fedprox(experiment):
    return [c for c in reproduce.catalogue(records)
            if c.experiment == experiment and c.row == "pmnist" and c.algorithm == "fedprox"]

  want = dict(reproduce._hparams(tuning[winner], "fedprox"))
  stage = pmnist_fedprox("tune_step")
  assert len(stage) == len(reproduce.STEP_STAGE["fedprox"]) - 1
  assert all("server step" in c.depends for c in pmnist_fedprox("table2"))
  for c in stage:
    assert not c.depends and c.flag_dict["seed"] == 0 and c.flag_dict["validation_fraction"] > 0
    assert {k: c.flag_dict[k] for k in want} == want
    records[c.name] = _record(c, dict(mt_accuracy=[0.1, float(scores[winner]) - 0.01]))
  tuned = pmnist_fedprox("table2")
  for c in tuned:
    assert not c.depends
    assert {k: c.flag_dict[k] for k in want} == want
    assert c.flag_dict["rounds"] == reproduce.TABLE2_ROUNDS["final"]
    assert "server_lr" not in c.flag_dict


def test_a_row_can_shrink_its_grid_and_a_fixed_axis_is_no_edge(tmp_path):
  """PMNIST's VIRTUAL cells tune the lr at the default beta; the report marks a choice
  on the lr grid's edge, never one on an axis of a single value."""
  cells = reproduce.catalogue({})
  pmnist = [c for c in cells if c.experiment == "tune" and c.row == "pmnist" and
            c.algorithm == "virtual"]
  mnist = [c for c in cells if c.experiment == "tune" and c.row == "mnist" and
           c.algorithm == "virtual"]
  lrs = reproduce.TABLE2_BASELINE_LRS
  assert sorted(c.flag_dict["client_lr"] for c in pmnist) == sorted(lrs)
  assert {c.flag_dict["kl_weight"] for c in pmnist} == {1e-4}
  assert len(mnist) == (len(reproduce.TABLE2_TUNING["virtual"]["client_lr"]) *
                        len(reproduce.TABLE2_TUNING["virtual"]["kl_weight"]))
  results = str(tmp_path / "results")
  inner = lrs[1]
  for c in pmnist:
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.9 if c.flag_dict["client_lr"] == inner
                                                 else 0.8])))
  text = "\n".join(virtual_report.table2_markdown(records_lib.read_records(results)))
  chosen = f"**client_lr={inner:g},kl_weight=0.0001: 90.0**"
  assert chosen in text and chosen + " †" not in text
  for c in pmnist:  # now the top lr wins: on the edge
    top = c.flag_dict["client_lr"] == max(lrs)
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.95 if top else 0.8])))
  text = "\n".join(virtual_report.table2_markdown(records_lib.read_records(results)))
  assert f"**client_lr={max(lrs):g},kl_weight=0.0001: 95.0** †" in text


def test_one_invocation_runs_the_tuning_then_the_cells_waiting_on_it(tmp_path, monkeypatch):
  """Tuned cells wait for their tuning: the grid, then the server step's stage at the
  grid's setting; once the last is recorded they join the queue, at the setting with
  the best validation MT."""
  names = ["virtual/tune/mnist/fedavg", "virtual/tune_step/mnist/fedavg",
           "virtual/table2/mnist/fedavg"]
  refresh = lambda records: reproduce.select(reproduce.catalogue(records), names)
  cells = refresh({})
  results, data_root = tmp_path / "results", tmp_path / "data"
  (data_root / "mnist").mkdir(parents=True)
  lrs = reproduce.TABLE2_TUNING["fedavg"]["client_lr"]
  best_lr, best_step = lrs[1], 0.6
  ran = []

  def fake_run_cell(cell, **kw):
    del kw
    ran.append(cell.name)
    f = cell.flag_dict
    good = f.get("client_lr") == best_lr and f.get("server_lr") in (None, best_step)
    rec = _record(cell, dict(mt_accuracy=[0.5, 0.6 + 0.2 * good + 0.1 * ("server_lr" in f)]))
    _write(str(results), rec)
    return rec

  # Table II's records from before the stage, at the grid's setting and the default step.
  old = {}
  for c in cells:
    if c.experiment == "table2":
      flags = reproduce._table2_flags("mnist", "fedavg", dict(client_lr=best_lr),
                                      reproduce.TABLE2_ROUNDS["final"], c.seed, False)
      old[c.name] = _record(dataclasses.replace(c, flags=flags), dict(mt_accuracy=[0.5, 0.97]))
      _write(str(results), old[c.name])
  monkeypatch.setattr(runner, "run_cell", fake_run_cell)
  runner.run(cells, results_dir=str(results), work_dir=str(tmp_path / "work"),
                data_root=str(data_root), log=lambda line: None, refresh=refresh,
                all_cells=reproduce.catalogue)
  steps = len(reproduce.STEP_STAGE["fedavg"]) - 1
  assert [n.split("/")[1] for n in ran] == ["tune"] * len(lrs) + ["tune_step"] * steps + ["table2"] * 3
  records = records_lib.read_records(str(results))
  assert all(records[n]["flags"]["client_lr"] == best_lr for n in ran[len(lrs):])
  assert all(records[n]["flags"]["server_lr"] == best_step for n in ran[-3:])
  # The old records were moved to the default step's cells before the tuned cells ran.
  for name, rec in old.items():
    moved = records[name.replace("/table2/", "/default_step/").replace("/tuned/", "/default/")]
    assert moved["refiled_from"] == name
    assert {k: moved[k] for k in ("flags", "result", "command")} == \
        {k: rec[k] for k in ("flags", "result", "command")}
  # Without `refresh` the waiting cells stay waiting.
  ran.clear()
  runner.run(refresh({}), results_dir=str(tmp_path / "again"), work_dir=str(tmp_path / "w2"),
                data_root=str(data_root), log=lambda line: None)
  assert ran and all("/tune/" in n for n in ran)


def test_select_and_status():
  cells = reproduce.catalogue({})
  pfnm = reproduce.select(cells, ["pfnm/j_sweep/homogeneous"])
  assert pfnm and all(c.name.startswith("pfnm/j_sweep/homogeneous/") for c in pfnm)
  # first_round and curves (FOLA, FedAvg, FedCurv), and the offline Laplace curves
  assert len(reproduce.select(cells, ["fola/*/alpha=0.01/*"])) == 9
  # A name `--list` prints holds commas, and absl's list flag splits on them.
  tune = [c for c in cells if "," in c.name]
  assert tune
  pieces = tune[0].name.split(",") + [pfnm[0].name]
  assert [c.name for c in reproduce.select(cells, pieces)] == sorted(
      [tune[0].name, pfnm[0].name], key=[c.name for c in cells].index)
  with pytest.raises(ValueError, match="--cells"):
    reproduce.select(cells, ["nothing/like/this"])
  c = pfnm[0]
  rec = _record(c, dict(mt_accuracy=[0.5]))
  assert runner.status(c, {}) == "todo"
  assert runner.status(c, {c.name: rec}) == "done"
  stale = dict(rec, flags=dict(rec["flags"], J=999))
  assert runner.status(c, {c.name: stale}) == "stale"
  # how often a run checkpoints does not decide its result (a resumed run equals a whole one)
  checkpointed = dict(rec, flags=dict(rec["flags"], checkpoint_every=5))
  assert runner.status(c, {c.name: checkpointed}) == "done"


def test_long_training_cells_checkpoint_and_their_older_records_stay_done():
  """A training cell estimated above CHECKPOINT_AFTER_S resumes after a stop; a short one
  does not pay for checkpoints; a record made before its cell checkpointed is done. FOLA's
  learning curves (one training run per method) checkpoint like training cells."""
  train = [c for c in reproduce.catalogue({}) if c.launcher in reproduce.RESUMABLE_LAUNCHERS]
  long = [c for c in train if c.estimate_s > reproduce.CHECKPOINT_AFTER_S]
  assert long and all(c.flag_dict.get("checkpoint_every") == reproduce.CHECKPOINT_EVERY
                      for c in long)
  assert {c.experiment for c in long} >= {"table2", "table2_conv", "table3", "table4", "beta",
                                          "v1_table2", "table2_calibrated", "curves_n"}
  assert all("checkpoint_every" not in c.flag_dict for c in train if c not in long)
  cell = next(c for c in long if not c.depends)  # (the tuned cells wait for their tuning)
  older = _record(cell, dict(mt_accuracy=[0.5]))
  older["flags"] = {k: v for k, v in older["flags"].items() if k != "checkpoint_every"}
  assert runner.status(cell, {cell.name: older}) == "done"


def test_paper_cells_evaluate_virtual_at_the_means_and_older_records_count_as_such():
  """VIRTUAL's default evaluation is the Monte Carlo predictive; every VIRTUAL cell of the
  catalogue names its evaluation, the papers' cells the means, so a record made before
  the default changed (its flags do not name `eval_samples`) is done for a means cell and
  stale for a Monte Carlo one."""
  cells = reproduce.catalogue({})
  runs_virtual = [c for c in cells if c.flag_dict.get("algorithm") == "virtual" or
                  c.launcher == "virtual_snr_cdf"]
  assert runs_virtual and all("eval_samples" in c.flag_dict for c in runs_virtual)
  table2 = [c for c in runs_virtual if c.experiment in ("tune", "table2", "v1_table2")]
  assert table2 and all(c.flag_dict["eval_samples"] == 0 for c in table2)
  means = table2[0]
  old = _record(means, dict(mt_accuracy=[0.5]))
  old["flags"] = {k: v for k, v in old["flags"].items() if k != "eval_samples"}
  assert runner.status(means, {means.name: old}) == "done"
  mc = dataclasses.replace(means, flags=tuple(sorted(dict(means.flag_dict, eval_samples=10).items())))
  assert runner.status(mc, {mc.name: old}) == "stale"


# ---------------------------------------------------------- validation split
def test_validation_split_holds_out_training_data_only():
  fd = data_lib.load_federated("digits", num_clients=5, seed=3)
  val = data_lib.load_federated("digits", num_clients=5, seed=3, validation_fraction=0.25)
  assert val.client_ids == fd.client_ids
  for cid in fd.client_ids:
    x, _ = fd.train[cid]
    xt, _ = val.train[cid]
    xv, _ = val.test[cid]
    assert len(xt) + len(xv) == len(x)
    assert len(xv) == int(np.floor(0.25 * len(x) + 0.5))
    rows = {r.tobytes() for r in x}
    # Train and validation parts are the client's training examples, disjoint.
    assert {r.tobytes() for r in xt} | {r.tobytes() for r in xv} <= rows
    assert not {r.tobytes() for r in xt} & {r.tobytes() for r in xv}
    test_rows = {r.tobytes() for r in fd.test[cid][0]}
    assert not test_rows & {r.tobytes() for r in xv}
  again = data_lib.load_federated("digits", num_clients=5, seed=3, validation_fraction=0.25)
  for cid in fd.client_ids:
    np.testing.assert_array_equal(again.test[cid][0], val.test[cid][0])


def test_calibration_split_holds_out_training_data_the_validation_split_left():
  val = data_lib.load_federated("digits", num_clients=5, seed=3, validation_fraction=0.25)
  cal = data_lib.load_federated("digits", num_clients=5, seed=3, validation_fraction=0.25,
                                calibration_fraction=0.2)
  assert val.calibration is None and set(cal.calibration) == set(cal.client_ids)
  for cid in val.client_ids:
    np.testing.assert_array_equal(cal.test[cid][0], val.test[cid][0])  # same evaluation data
    x, xt, xc = val.train[cid][0], cal.train[cid][0], cal.calibration[cid][0]
    assert len(xt) + len(xc) == len(x) and len(xc) == int(np.floor(0.2 * len(x) + 0.5))
    train_rows, cal_rows = {r.tobytes() for r in xt}, {r.tobytes() for r in xc}
    assert train_rows | cal_rows == {r.tobytes() for r in x} and not train_rows & cal_rows


def test_validation_fraction_flag_is_checked():
  proc = subprocess.run(
      [sys.executable, "-m", "launchers.train", "--validation_fraction=0.95", "--rounds=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert proc.returncode != 0
  assert "validation_fraction" in proc.stderr + proc.stdout


# ------------------------------------------------------------------ report
def test_report_judges_the_claims_from_records_alone(tmp_path):
  """The report's tables and claims come from the records alone. Its figures are drawn
  by the first and the last `write_report` (each draws every figure its records allow);
  the steps between read the same text (`report_markdown`) without drawing them again."""
  results = str(tmp_path / "results")
  # A docs page without the reproduction markers is refused.
  bare = tmp_path / "bare.md"
  bare.write_text("# no markers\n")
  with pytest.raises(ValueError, match="reproduction block"):
    reproduction_report.write_report(results, readme=str(bare))
  text_of = lambda: reproduction_report.report_markdown(records_lib.read_records(results), ())
  cells = [c for c in reproduce.catalogue({}) if c.row == "mnist" and c.experiment == "table2"]
  mt = dict(virtual=0.975, fedavg=0.970, fedprox=0.969, fedpa=0.960)
  s = dict(virtual=0.965, fedavg=0.978, fedprox=0.977, fedpa=0.970)
  for c in cells:
    jitter = 0.001 * c.seed
    _write(results, _record(c, dict(mt_accuracy=[0.5, mt[c.algorithm] + jitter],
                                    server_accuracy=[0.5, s[c.algorithm] + jitter],
                                    server_loss=[1.0, 0.1], mt_loss=[1.0, 0.2],
                                    server_ece=[0.1, 0.01], mt_ece=[0.1, 0.02])))
  readme = tmp_path / "README.md"
  readme.write_text(f"# x\n\n{reproduction_report.README_BEGIN}\nOLD-BLOCK\n{reproduction_report.README_END}\n\ntail\n")
  text = reproduction_report.write_report(results, readme=str(readme))
  assert "| mnist | virtual | 97.8 | 96.6 ± 0.1 |" in text
  assert "- mnist: VIRTUAL's MT above fedavg's: held (MT 97.6 vs 97.1" in text
  assert "- mnist: S comparable to fedavg's (within 1 pp or above): not held (S 96.6 vs 97.9)" in text
  assert "- pmnist, VIRTUAL vs fedavg: pending (0 and 0 of 3 seeds recorded)." in text
  assert os.path.exists(os.path.join(results, "figures", "table2_curves.png"))
  assert not os.path.exists(os.path.join(results, "figures", "fola_curves.png"))
  body = readme.read_text()
  assert "OLD-BLOCK" not in body and body.endswith("tail\n") and "96.6 ± 0.1" in body
  assert "](results/figures/table2_curves.png)" in body
  # MT means 0.05 pp apart with a spread of 0.2 pp over the seeds: a tie, not held.
  fem = [c for c in reproduce.catalogue({}) if c.row == "femnist_mlp" and c.experiment == "table2"]
  for c in fem:
    spread = 0.002 * (c.seed - 1)
    mt_best = 0.9725 if c.algorithm == "virtual" else 0.972
    _write(results, _record(c, dict(mt_accuracy=[0.5, mt_best + spread],
                                    server_accuracy=[0.5, 0.95])))
  tie = text_of()
  assert "- femnist_mlp: VIRTUAL's MT above fedavg's: not held (MT 97.2 vs 97.2" in tie
  assert "difference +0.05 pp, standard error 0.16" in tie
  # One seed recorded: its value, no spread of "± 0.0".
  one = next(c for c in reproduce.catalogue({})
             if c.row == "pmnist" and c.experiment == "table2" and c.algorithm == "fedavg")
  _write(results, _record(one, dict(mt_accuracy=[0.5, 0.861], server_accuracy=[0.3, 0.483])))
  text = text_of()
  assert "| pmnist | fedavg | 48.3 | 48.3 | 48.3 | 85.9 | 86.1 | 86.1 |" in text
  # Convergence: the last 10 rounds' mean against the 10 before (MT +0.1 pp a round).
  prox = next(c for c in reproduce.catalogue({})
              if c.row == "pmnist" and c.experiment == "table2" and c.algorithm == "fedprox")
  _write(results, _record(prox, dict(mt_accuracy=[0.8 + 0.001 * i for i in range(30)],
                                     server_accuracy=[0.4] * 30)))
  text = text_of()
  assert "| pmnist | fedprox | 0.00 | 1.00 |" in text
  assert "| pmnist | fedavg | — | — |" in text  # 2 rounds: too short to say
  # FOLA's learning curves (Fig. 3a): a table of the best GA and a figure.
  fola = [c for c in reproduce.catalogue({}) if c.paper == "fola" and c.experiment == "curves"]
  for c in fola[:2]:
    methods = {m: dict(curves=dict(round=[1, 2, 3], server_accuracy=[0.3, g, g + 0.01]))
               for m, g in (("fola", 0.8), ("fedavg", 0.6))}
    rec = runner.make_record(c, c.command("out", "/data"), dict(methods=methods), 10.0,
                                time.time())
    _write(results, rec)
  text = reproduction_report.write_report(results)
  assert "| fedavg | 61.0 ± 0.0 | 2 |" in text and "| fola | 81.0 ± 0.0 | 2 |" in text
  assert os.path.exists(os.path.join(results, "figures", "table2_curves.png"))
  assert os.path.exists(os.path.join(results, "figures", "fola_curves.png"))


# ----------------------------------------------------- the runner, killed
def _runner(tmp_path, *extra):
  return [sys.executable, "-m", "launchers.reproduce", "--catalogue=smoke",
          f"--results_dir={tmp_path / 'results'}", f"--work_dir={tmp_path / 'work'}", "--readme=",
          *extra]


def _launcher_of(process, arg=None):
  """The `launchers.train` children of `process` (psutil) whose command line holds `arg`
  (any, without it)."""
  found = []
  for p in process.children():
    try:
      if "launchers.train" in p.cmdline() and (arg is None or arg in p.cmdline()):
        found.append(p)
    except psutil.NoSuchProcess:  # a short-lived child (git) gone meanwhile
      pass
  return found


def test_a_killed_cell_is_redone_and_the_others_are_not(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  first = tmp_path / "results" / "smoke/digits/digits/fedavg/default/seed0.json"
  proc = subprocess.Popen(_runner(tmp_path), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
  runner_process = psutil.Process(proc.pid)
  deadline = time.time() + 240
  while not first.exists() and time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  assert first.exists(), "the first cell did not finish"
  while not _launcher_of(runner_process, "--seed=1") and time.time() < deadline and (
      proc.poll() is None):
    time.sleep(0.05)  # killed once the second cell's launcher runs
  assert _launcher_of(runner_process, "--seed=1"), "the second cell's launcher did not start"
  children = runner_process.children(recursive=True)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  psutil.wait_procs(children, timeout=30)
  assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
  done = sorted(p.name for p in (tmp_path / "results").rglob("*.json"))
  assert "seed0.json" in done and "seed2.json" not in done
  mtime = first.stat().st_mtime_ns
  out = subprocess.run(_runner(tmp_path), cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  assert first.stat().st_mtime_ns == mtime  # the finished cell was not run again
  assert "seed0" not in "".join(l for l in out.stdout.splitlines() if l.startswith("cell "))
  for seed in (1, 2):
    rec = json.loads((first.parent / f"seed{seed}.json").read_text())
    assert rec["flags"]["seed"] == seed and len(rec["result"]["curves"]["round"]) == 2
  listing = subprocess.run(_runner(tmp_path, "--list"), cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
  assert [l.split()[0] for l in listing.stdout.splitlines()] == ["done"] * 3


def test_ablation_cells_change_one_knob_of_the_tuned_setting_and_report_the_difference(tmp_path):
  waiting = [c for c in reproduce.catalogue({}) if c.experiment == "ablate"]
  assert waiting and all(c.depends for c in waiting)  # MNIST's VIRTUAL tuning not recorded
  results = str(tmp_path / "results")
  tuning = [c for c in reproduce.catalogue({}) if c.experiment == "tune" and c.row == "mnist"
            and c.algorithm == "virtual"]
  best = tuning[-1].flag_dict
  for c in tuning:
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.9 if c is tuning[-1] else 0.8])))
  records = records_lib.read_records(results)
  cells = [c for c in reproduce.catalogue(records) if c.experiment == "ablate"
           and c.row == "mnist"]
  # "tuned" at seed 0 is the chosen tuning cell itself: not run twice.
  assert len(cells) == len(reproduce.ABLATIONS) * len(reproduce.ABLATION_SEEDS) - 1
  assert not [c for c in cells if c.setting == "tuned" and c.seed == 0]
  knobs = dict(reproduce.ABLATIONS)
  for c in cells:
    assert not c.depends and c.flag_dict["validation_fraction"] == reproduce.VALIDATION_FRACTION
    want = dict(best, seed=c.seed, **knobs[c.setting])
    assert c.flag_dict == want, c.name  # the tuned setting, one knob changed
  # The report: each knob's MT beside "tuned", with the difference and its standard error.
  mt = {"tuned": 0.90, "server_lr=0.2": 0.93}
  curves = lambda c: dict(mt_accuracy=[0.5, mt[c.setting] + 0.01 * c.seed],
                          server_accuracy=[0.5, 0.9], mt_loss=[1.0, 0.3], mt_ece=[0.1, 0.02])
  for c in cells:
    if c.setting in mt:
      _write(results, _record(c, curves(c)))
  # Seed 0 of "tuned": the chosen tuning cell's record (best MT 0.90 above).
  rec = _record(tuning[-1], curves(dataclasses.replace(tuning[-1], setting="tuned")))
  _write(results, rec)
  text = "\n".join(virtual_report.ablation_markdown(records_lib.read_records(results)))
  assert "| tuned | 90.0 ± 0.0 | 90.5 ± 0.7 | — | 0.300 ± 0.000 | 0.020 ± 0.000 | 2 |" in text
  assert "| server_lr=0.2 | 90.0 ± 0.0 | 93.5 ± 0.7 | +3.00 ± 0.71 |" in text
  assert "| gate_init=0 | — | — | — | — | — | 0 |" in text


def test_the_server_step_stage_tunes_virtuals_step_after_its_grid(tmp_path):
  """MNIST's VIRTUAL picks the server step among the grid's cell (step 1/C) and the
  `STEP_STAGE` ablation cells at seed 0; a step other than the default keeps the grid's
  setting at the default step on Table II's protocol beside it, reported side by side."""
  results = str(tmp_path / "results")
  tuning = [c for c in reproduce.catalogue({}) if c.experiment == "tune" and c.row == "mnist"
            and c.algorithm == "virtual"]
  for c in tuning:
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.9 if c is tuning[-1] else 0.8])))
  grid = dict(reproduce._hparams(tuning[-1], "virtual"))
  records = records_lib.read_records(results)

  def mnist_virtual(records, experiment):
    return [c for c in reproduce.catalogue(records)
            if c.experiment == experiment and c.row == "mnist" and c.algorithm == "virtual"]

  tuned = mnist_virtual(records, "table2")
  assert all("server step" in c.depends for c in tuned)
  # A record from before the stage existed waits too; it is not re-run at no setting.
  old = _record(tuned[0], dict(mt_accuracy=[0.5, 0.97]))
  assert runner.status(tuned[0], {tuned[0].name: old}) == "waiting"
  stage = [c for c in mnist_virtual(records, "ablate")
           if c.setting.startswith("server_lr=") and c.seed == 0]
  assert sorted(c.flag_dict["server_lr"] for c in stage) == [0.05, 0.2, 0.4]
  scores = {"server_lr=0.05": 0.85, "server_lr=0.2": 0.93, "server_lr=0.4": 0.92}
  for c in stage:
    _write(results, _record(c, dict(mt_accuracy=[0.5, scores[c.setting]])))
  records = records_lib.read_records(results)
  for c in mnist_virtual(records, "table2"):
    assert not c.depends and c.flag_dict["server_lr"] == 0.2
    assert {k: c.flag_dict[k] for k in grid} == grid
  beside = mnist_virtual(records, "default_step")
  assert [c.seed for c in beside] == list(reproduce.TABLE2_SEEDS)
  assert all("server_lr" not in c.flag_dict and c.flag_dict["rounds"] == 100 for c in beside)
  # The ablations keep the grid's setting (step 1/C) as their reference.
  for c in mnist_virtual(records, "ablate"):
    assert c.flag_dict.get("server_lr") == dict(reproduce.ABLATIONS)[c.setting].get("server_lr")
  # Table II's rows whose grid is not recorded have no cells beside theirs yet (the conv
  # row's baselines wait for the FEMNIST-MLP grid: `virtual_figure_cells`).
  assert not [c for c in reproduce.catalogue(records) if c.experiment == "default_step"
              and c.row in reproduce.STEP_STAGE_ROWS and c.row != "mnist"]
  for c, mt in [(c, 0.970) for c in beside] + [(c, 0.975) for c in mnist_virtual(records, "table2")]:
    _write(results, _record(c, dict(mt_accuracy=[0.5, mt + 0.002 * c.seed],
                                    server_accuracy=[0.5, 0.97], mt_loss=[1.0, 0.2],
                                    mt_ece=[0.1, 0.02])))
  text = reproduction_report.write_report(results)
  assert "tuned step: 0.2" in text
  assert "| tuned step | 97.0 ± 0.0 | 97.7 ± 0.2 | +0.50 ± 0.16 |" in text
  assert "| mnist | virtual: server step | server_lr=0.05: 85.0; default: 90.0; " \
         "**server_lr=0.2: 93.0**; server_lr=0.4: 92.0 |" in text
  assert "server_lr=0.2" in next(l for l in text.splitlines() if l.startswith("| mnist | virtual | 97.8"))
  # The step on the stage's edge is marked; the default winning needs no cells beside it.
  for c in stage:
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.95 if c.setting == "server_lr=0.4"
                                                 else 0.5])))
  assert "**server_lr=0.4: 95.0** †" in reproduction_report.report_markdown(
      records_lib.read_records(results), ())  # the report's text (its figures drawn above)
  for c in stage:
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.5])))
  records = records_lib.read_records(results)
  assert not mnist_virtual(records, "default_step")
  assert all("server_lr" not in c.flag_dict for c in mnist_virtual(records, "table2"))


def test_pmnists_virtual_tunes_its_step_in_tune_step_cells():
  """PMNIST has no knobs' cells: VIRTUAL's step cells there are `tune_step` cells at the
  grid's setting, while on MNIST they stay its `server_lr` ablation cells."""
  tuning = [c for c in reproduce.catalogue({}) if c.experiment == "tune" and c.row == "pmnist"
            and c.algorithm == "virtual"]
  records = {c.name: _record(c, dict(mt_accuracy=[0.5, 0.9 if c is tuning[1] else 0.8]))
             for c in tuning}
  cells = reproduce.catalogue(records)
  stage = [c for c in cells if c.experiment == "tune_step" and c.algorithm == "virtual"]
  assert {c.row for c in stage} == {"pmnist"}
  assert sorted(c.flag_dict["server_lr"] for c in stage) == [0.05, 0.2, 0.4]
  grid = dict(reproduce._hparams(tuning[1], "virtual"))
  for c in stage:
    assert {k: c.flag_dict[k] for k in grid} == grid and c.flag_dict["validation_fraction"] > 0
    assert c.flag_dict["rounds"] == reproduce.TABLE2_ROUNDS["tune"] and c.seed == 0
  assert not [c for c in cells if c.experiment == "ablate" and c.row == "pmnist"]


def test_a_baselines_step_stage_and_the_records_it_refiles(tmp_path):
  """FedAvg on MNIST tunes its server lr over App. D's 0.2-0.8 and 1.5-3 beside the grid's cell
  (lr 1, averaging). When another step wins, Table II's records at the default step
  are moved, unedited but for their cell, to the `default_step` cells (`refile`), and
  the report puts the two steps side by side."""
  results = str(tmp_path / "results")

  def fedavg(records, experiment):
    return [c for c in reproduce.catalogue(records)
            if (c.experiment, c.row, c.algorithm) == (experiment, "mnist", "fedavg")]

  grid = fedavg({}, "tune")
  for c in grid:
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.9 if c is grid[0] else 0.8])))
  records = records_lib.read_records(results)
  stage = fedavg(records, "tune_step")
  assert sorted(c.flag_dict["server_lr"] for c in stage) == [0.2, 0.4, 0.6, 0.8, 1.5, 2.0, 3.0]
  assert all(c.flag_dict["client_lr"] == grid[0].flag_dict["client_lr"] for c in stage)
  assert all(not c.depends and c.flag_dict["rounds"] == 30 for c in stage)
  waiting = fedavg(records, "table2") + fedavg(records, "default_step")
  assert len(waiting) == 6 and all("server step" in c.depends for c in waiting)
  old = [_record(dataclasses.replace(c, experiment="table2", setting="tuned"),
                 dict(mt_accuracy=[0.5, 0.97], server_accuracy=[0.5, 0.97]))
         for c in fedavg(records, "default_step")]
  for rec in old:
    _write(results, rec)
  for c in stage:
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.95 if c.setting == "server_lr=0.6"
                                                 else 0.85])))
  records = records_lib.read_records(results)
  tuned, beside = fedavg(records, "table2"), fedavg(records, "default_step")
  assert [runner.status(c, records) for c in tuned] == ["stale"] * 3
  assert [runner.status(c, records) for c in beside] == ["todo"] * 3
  lines = []
  records = runner.refile(reproduce.catalogue(records), records, results, lines.append)
  assert len(lines) == 3 and records == records_lib.read_records(results)
  for rec, c in zip(old, beside):
    moved = records[c.name]
    assert moved["refiled_from"] == rec["cell"]["name"] and rec["cell"]["name"] not in records
    assert {k: v for k, v in moved.items() if k not in ("cell", "refiled_from")} == \
        {k: v for k, v in rec.items() if k != "cell"}
    assert runner.status(c, records) == "done"
  assert [runner.status(c, records) for c in fedavg(records, "table2")] == ["todo"] * 3
  # FOLA's calibration cells (issue 34) start from FedAvg's tuned client setting, without
  # the server step: FOLA's server takes the Gaussian product.
  calibration = {(c.algorithm, c.setting): c for c in reproduce.catalogue(records)
                 if (c.experiment, c.row, c.seed) == ("calibration", "mnist", 0)}
  fed = calibration["fedavg", "tuned"].flag_dict
  mean, laplace = calibration["fola", "mean"], calibration["fola", "laplace_samples=10"]
  assert fed["server_lr"] == 0.6 and not mean.depends
  assert mean.flag_dict == dict({k: v for k, v in fed.items() if k != "server_lr"},
                                algorithm="fola")
  assert laplace.flag_dict == dict(mean.flag_dict, **reproduce.LAPLACE_PREDICTIVE)
  assert runner.refile(reproduce.catalogue(records), records, results, lines.append) == records
  assert len(lines) == 3
  for c in fedavg(records, "table2"):
    assert c.flag_dict["server_lr"] == 0.6
    _write(results, _record(c, dict(mt_accuracy=[0.5, 0.98], server_accuracy=[0.5, 0.97])))
  text = reproduction_report.write_report(results)
  assert "FedAvg's server step on mnist" in text and "tuned step: 0.6" in text
  assert "| tuned step | 97.0 ± 0.0 | 98.0 ± 0.0 | +1.00 ± 0.00 |" in text
  assert "| mnist | fedavg: server step | server_lr=0.2: 85.0; server_lr=0.4: 85.0; " \
         "**server_lr=0.6: 95.0**; server_lr=0.8: 85.0; default: 90.0; server_lr=1.5: 85.0; " \
         "server_lr=2: 85.0; server_lr=3: 85.0 |" in text


def test_a_run_the_robust_rounds_stop_is_recorded_and_loses_its_tuning(tmp_path):
  """`launchers.train` exits `RUN_STOPPED_STATUS` when every client is dropped 3 rounds
  in a row; the cell's record keeps the rounds it ran and the one-line cause, and such
  a setting never wins a grid. Any other failure writes no record."""
  base = reproduce.smoke_cells()[0]
  flags = dict(base.flag_dict, rounds=5, max_update_ratio=1e-9, num_clients=3, hidden_units="8")
  cell = dataclasses.replace(base, flags=tuple(sorted(flags.items())))
  results = str(tmp_path / "results")
  kw = dict(results_dir=results, work_dir=str(tmp_path / "work"), data_root=str(tmp_path),
            log=lambda line: None)
  rec = runner.run_cell(cell, **kw)
  assert "every client update was dropped" in records_lib.stopped(rec)
  recorded = records_lib.read_records(results)[cell.name]
  assert recorded["result"]["stopped"] == records_lib.stopped(rec)
  assert len(rec["result"]["curves"]["round"]) == round_loop.ALL_DROPPED_STOP_ROUNDS
  assert "until the run stopped" in runner.headline(rec)
  fine = _record(base, dict(mt_accuracy=[0.1, 0.2]))
  halted = dict(rec, result=dict(rec["result"], curves=dict(rec["result"]["curves"],
                                                            mt_accuracy=[0.9, 0.9, 0.9])))
  assert reproduce.best_tuning_index([halted, fine]) == 1
  bad = dataclasses.replace(base, setting="bad", flags=tuple(sorted(
      dict(base.flag_dict, client_lr=-1.0).items())))
  with pytest.raises(runner.CellFailed, match="launcher exited 1"):
    runner.run_cell(bad, **kw)
  assert bad.name not in records_lib.read_records(results)


def _checkpointing_cell():
  """The first smoke cell at 4 rounds, checkpointing every round."""
  base = reproduce.smoke_cells()[0]
  return dataclasses.replace(
      base, flags=tuple(sorted(dict(base.flag_dict, rounds=4, checkpoint_every=1).items())))


@pytest.fixture(scope="module")
def crashed_cell(tmp_path_factory):
  """`_checkpointing_cell()` run by `run_cell` with its launcher's TFF worker killed
  (SIGSEGV to its `worker_binary`) as the launcher starts its rounds, before their first
  checkpoint: the runner runs the cell once more, from round 0 to the end, uninterrupted
  (the stopped cell's test compares its resumed record with this one).

  Returns (record, work_dir, the runner's lines, the pids killed)."""
  cell = _checkpointing_cell()
  tmp = tmp_path_factory.mktemp("crashed")
  lines, killed = [], []

  def log(line):
    """Kills the first attempt's `worker_binary` when the launcher says it builds its
    rounds' computations (the launcher's own: this test process may hold a worker of
    its own too)."""
    lines.append(line)
    if "building computations" in line and not killed:
      launcher, = _launcher_of(psutil.Process())
      for p in launcher.children(recursive=True):
        if p.name() == "worker_binary":
          p.send_signal(signal.SIGSEGV)
          killed.append(p.pid)

  rec = runner.run_cell(cell, results_dir=str(tmp / "results"), work_dir=str(tmp / "work"),
                        data_root=str(tmp), log=log)
  return rec, tmp / "work", lines, killed


def test_a_crashed_worker_costs_one_more_run_of_the_cell(crashed_cell):
  """A TFF worker that dies mid-run makes the launcher exit `WORKER_EXITED_STATUS` with
  one line naming the worker; the runner keeps that log and runs the cell once more
  (here from round 0: the worker died before the first checkpoint)."""
  rec, work, lines, killed = crashed_cell
  cell = _checkpointing_cell()
  assert len(killed) == 1, "one worker_binary, killed once"
  crashed = (work / cell.name / "log.crashed.txt").read_text().splitlines()
  assert crashed[-1].startswith("FATAL train: TFF worker"), crashed[-3:]
  again = [l for l in lines if "its TFF worker crashed or failed" in l and "running it again" in l]
  assert again and not [l for l in again if "from its checkpoint" in l], again
  assert rec["attempts"] == 2 and rec["result"]["curves"]["round"] == [1, 2, 3, 4]
  assert records_lib.read_records(str(work.parent / "results"))[cell.name]["attempts"] == 2


def test_a_stopped_cell_resumes_from_its_checkpoint_and_records_the_same_result(
    tmp_path, crashed_cell):
  """A cell that checkpoints, stopped mid-run (the runner interrupted: its launcher is
  terminated), continues from its checkpoint on the next invocation; its record
  equals an uninterrupted run's but for the times, and says where every invocation
  resumed (here a second one is stopped at its first round's end too). The
  uninterrupted run: the crashed cell's second one, the same cell from round 0."""
  cell = _checkpointing_cell()
  lines = []

  def stop_after_round_2(line):
    lines.append(line)
    if "round 2/" in line:
      raise KeyboardInterrupt  # what Ctrl-C does to the runner's loop

  stopped_results, work = tmp_path / "stopped", tmp_path / "work"
  with pytest.raises(KeyboardInterrupt):
    runner.run_cell(cell, results_dir=str(stopped_results), work_dir=str(work),
                       data_root=str(tmp_path), log=stop_after_round_2)
  assert not list(stopped_results.rglob("*.json"))  # no record of a stopped cell
  assert (work / cell.name / "run" / "checkpoint.npz").exists()
  # The launcher, stopped as the runner stops it (SIGTERM), finished the round in flight
  # and checkpointed it, and said so; so did the runner.
  saved = state_files.read_meta(str(work / cell.name / "run" / "checkpoint.npz"))["round"]
  last = (work / cell.name / "log.txt").read_text().splitlines()[-1]
  assert re.fullmatch(rf"train: stopped after round {saved} of 4, as asked; the checkpoint has "
                      rf"round {saved}; continue with: .*--resume", last), last
  assert lines[-1] == (f"reproduce: stopped in cell {cell.name}; the next invocation resumes it "
                       f"from its checkpoints ({saved} of its 4 rounds).")
  held = runner.checkpointed_fraction(cell, str(work))
  left = runner.remaining_seconds(cell, {}, str(work))

  def stop_after_the_last_round(line):
    # Not at round 3's line: a stop there can land before round 4 starts (CI at e46177d
    # resumed from 3, not 4).
    lines.append(line)
    if "round 4/" in line:
      raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):  # in its final outputs, after round 4's checkpoint
    runner.run_cell(cell, results_dir=str(stopped_results), work_dir=str(work),
                    data_root=str(tmp_path), log=stop_after_the_last_round)
  assert not list(stopped_results.rglob("*.json"))
  resumed = runner.run_cell(cell, results_dir=str(stopped_results), work_dir=str(work),
                               data_root=str(tmp_path), log=lines.append)
  whole = crashed_cell[0]
  # Both earlier invocations' resumes, though this one's log names only its own.
  at = resumed["resumed_from_rounds"][0]
  assert 2 <= at <= 3 and resumed["resumed_from_rounds"] == [at, 4], resumed["resumed_from_rounds"]
  # Before it resumed, its estimate left out the rounds the launcher then resumed from.
  assert held == at / 4
  # ... and ran them at the pace of the rounds it held, not at the catalogue's guess.
  clock = records_lib.clock_at_round(resumed["result"], at)
  assert left == pytest.approx(clock / at * (4 - at), rel=1e-4)
  assert runner.remaining_seconds(cell, {}, str(work / "none")) == cell.estimate_s
  assert "resumed_from_rounds" not in whole
  # One stretch per invocation, all under this checkout's code.
  assert [e["from_round"] for e in resumed["code_history"]] == [0, at, 4]
  assert {e["git_commit"] for e in resumed["code_history"]} == {resumed["git_commit"]}
  assert "code_history" not in whole
  timeless = lambda rec: {k: v for k, v in rec["result"]["curves"].items() if k != "wall_time_s"}
  assert timeless(resumed) == timeless(whole)
  assert resumed["result"]["curves"]["round"] == [1, 2, 3, 4]
  same = lambda rec: {k: v for k, v in rec["result"]["summary"].items()
                      if k not in ("wall_time_s", "code_history")}
  assert same(resumed) == same(whole)
  # Its wall time counts the rounds the stopped invocations checkpointed, too.
  earlier = resumed["earlier_invocations_wall_time_s"]
  clock = records_lib.clock_at_round(resumed["result"], 4)
  assert earlier > 0 and earlier == pytest.approx(clock, abs=0.05)
  assert resumed["wall_time_s"] > earlier and "earlier_invocations_wall_time_s" not in whole
  assert records_lib.wall_seconds(resumed) == resumed["wall_time_s"]


def _continue(processes):
  """SIGCONT to each of `processes` (psutil) still there."""
  for p in processes:
    try:
      p.send_signal(signal.SIGCONT)
    except psutil.NoSuchProcess:
      pass


def test_max_hours_stops_a_checkpointing_cell_at_the_limit_for_the_next_invocation(tmp_path):
  """A cell that checkpoints starts although its estimate passes --max_hours and, at the
  limit, its launcher stops as after Ctrl-C (the round in flight finished and
  checkpointed): no record, no launcher left, the runner says where the next
  invocation resumes it. A cell that does not checkpoint is not started."""
  base = reproduce.smoke_cells()[0]
  flags = dict(base.flag_dict, rounds=2000, checkpoint_every=500)
  cell = dataclasses.replace(base, flags=tuple(sorted(flags.items())), estimate_s=3600.0)
  results = tmp_path / "results"

  def log(line):
    """From its first round to the limit the launcher's `worker_binary` is stopped
    (SIGSTOP): its round in flight waits for the limit, at no CPU."""
    lines.append(line)
    if line.lstrip().startswith("[fedavg] round ") and not stopped:
      launcher, = _launcher_of(psutil.Process())
      stopped.extend(p for p in launcher.children(recursive=True) if p.name() == "worker_binary")
      for p in stopped:
        p.send_signal(signal.SIGSTOP)
    if line.startswith("reproduce: --max_hours reached"):  # then the runner stops the launcher
      _continue(stopped)

  # Past the launcher's start-up (~10 s quiet), within its rounds; where the start-up
  # took the first limit, a second invocation at a longer one.
  for limit_s in (20, 60):
    limit, work = limit_s / 3600, tmp_path / f"work_{limit_s}"
    lines, stopped = [], []
    try:
      ran = runner.run([cell], results_dir=str(results), work_dir=str(work),
                       data_root=str(tmp_path), max_hours=limit, log=log)
    finally:
      _continue(stopped)
    assert ran == [] and not list(results.rglob("*.json"))
    assert not [p for p in psutil.Process().children(recursive=True)
                if "launchers.train" in " ".join(p.cmdline())]
    assert lines[-1] == (f"reproduce: stopped at --max_hours={limit:g} in cell {cell.name}: "
                         f"{runner._where_it_resumes(cell, str(work))}")
    launcher_log = (work / cell.name / "log.txt").read_text().splitlines()
    in_rounds = any(l.startswith("[fedavg] round ") for l in launcher_log)
    if in_rounds:
      break
  if in_rounds:  # it stopped in its rounds
    saved = state_files.read_meta(str(work / cell.name / "run" / round_loop.CHECKPOINT))["round"]
    rows = (work / cell.name / "run" / "metrics.csv").read_text().splitlines()[1:]
    assert 1 <= saved < 500 and len(rows) == saved, (saved, len(rows))  # the stop's own
    assert re.fullmatch(rf"train: stopped after round {saved} of 2000, as asked; the checkpoint "
                        rf"has round {saved}; continue with: .*--resume", launcher_log[-1]), \
        launcher_log[-1]
    assert f"({saved} of its 2000 rounds)" in lines[-1]
  plain = dataclasses.replace(base, estimate_s=3600.0)
  assert not runner.resumable(plain) and runner.resumable(cell)
  assert runner.run([plain], results_dir=str(results), work_dir=str(work),
                    data_root=str(tmp_path), max_hours=limit, log=lines.append) == []
  assert lines[-1].startswith(f"reproduce: next cell {plain.name} (~60 min) would pass")


def test_a_stopped_learning_curves_cell_resumes_each_method_from_its_checkpoint(tmp_path):
  """A FOLA learning-curves cell (one training run per method) stopped in its second
  method's run continues on the next invocation: the finished method from its final
  checkpoint (no round trained again), the stopped one from its last checkpoint. Its
  record equals an uninterrupted one's but for the times, names each resumed run, and
  its wall time counts the rounds the stopped invocation checkpointed."""
  flags = dict(dataset="digits", architecture="mlp", hidden_units="8", num_clients=3,
               epochs_per_round=1, alphas="0.1", rounds=3, methods="fola,fedavg", seed=0,
               checkpoint_every=1)
  cell = reproduce.Cell("fola", "curves", "digits", "all", "alpha=0.1", 0, "fola_curves",
                        tuple(sorted(flags.items())), 60.0)
  lines = []

  def stop_in_fedavg_round_2(line):
    lines.append(line)
    if line.lstrip().startswith("[fedavg") and "round 2/" in line:
      raise KeyboardInterrupt  # what Ctrl-C does to the runner's loop

  stopped_results, work = tmp_path / "stopped", tmp_path / "work"
  with pytest.raises(KeyboardInterrupt):
    runner.run_cell(cell, results_dir=str(stopped_results), work_dir=str(work),
                    data_root=str(tmp_path), log=stop_in_fedavg_round_2)
  assert not list(stopped_results.rglob("*.json"))
  run = work / cell.name / "run"
  assert (run / "fola" / "alpha_0.1" / "checkpoint.npz").exists()
  assert (run / "fedavg" / "alpha_0.1" / "checkpoint.npz").exists()
  held = runner.checkpointed_fraction(cell, str(work))
  (listed,) = runner.listing([cell], {}, work_dir=str(work))
  resumed = runner.run_cell(cell, results_dir=str(stopped_results), work_dir=str(work),
                            data_root=str(tmp_path), log=lines.append)
  whole = runner.run_cell(cell, results_dir=str(tmp_path / "whole"),
                          work_dir=str(tmp_path / "work_whole"), data_root=str(tmp_path),
                          log=lines.append)
  by_run = {r["run"]: r["round"] for r in resumed["resumed_runs"]}
  methods = lambda rec: rec["result"]["methods"]
  assert by_run.keys() == {"fola/alpha_0.1", "fedavg/alpha_0.1"}
  # FedAvg's round in flight (3, its last) finished and was checkpointed.
  assert by_run["fola/alpha_0.1"] == 3 and 2 <= by_run["fedavg/alpha_0.1"] <= 3
  assert sorted(resumed["resumed_from_rounds"]) == sorted(by_run.values())
  # Before it resumed, `--list` left out the share of the rounds it then resumed from.
  assert held == pytest.approx(sum(by_run.values()) / 6)
  # ... and estimated the rest at the pace both runs kept up to their checkpoints.
  clocks = sum(records_lib.clock_at_round(methods(resumed)[run.split("/")[0]], r)
               for run, r in by_run.items())
  pace = clocks / sum(by_run.values())
  assert listed.split()[:3] == ["todo", f"{pace * (6 - sum(by_run.values())) / 60:.1f}", "min"]
  assert f"hold {held:.0%} of its rounds, {pace:.0f} s a round so far" in listed
  assert "resumed_from_rounds" not in whole and "code_history" not in whole
  # One code for both invocations; each run's stretches are named.
  assert {e["run"] for e in resumed["code_history"]} == set(by_run)
  assert {e["git_commit"] for e in resumed["code_history"]} == {resumed["git_commit"]}
  assert methods(resumed).keys() == methods(whole).keys() == {"fola", "fedavg"}
  for m in ("fola", "fedavg"):
    timeless = lambda rec: {k: v for k, v in methods(rec)[m]["curves"].items()
                            if k != "wall_time_s"}
    assert timeless(resumed) == timeless(whole), m
    assert methods(resumed)[m]["curves"]["round"] == [1, 2, 3]
  # The wall time counts FOLA's whole run and FedAvg's checkpointed rounds.
  clock = sum(records_lib.clock_at_round(methods(resumed)[run.split("/")[0]], r)
              for run, r in by_run.items())
  earlier = resumed["earlier_invocations_wall_time_s"]
  assert earlier > 0 and earlier == pytest.approx(clock, abs=0.05)
  assert resumed["wall_time_s"] > earlier and "earlier_invocations_wall_time_s" not in whole


def test_a_cells_estimate_is_what_its_other_seeds_took_else_its_kinds_rescaled():
  """Downpour SGD's cells differ in their rounds (`comm_rounds`, not `rounds`): a seed of
  the 200-round setting is estimated from that setting's recorded seeds, not from the
  mean of every round count's."""
  cells = {c.name: c for c in reproduce.catalogue({})}
  name = "pfnm/dsgd_rounds/class_dirichlet/all/rounds={}/seed{}"
  records = {n: _record(cells[n], dict(mt_accuracy=[0.5]), wall)
             for n, wall in ((name.format(10, 0), 75.0), (name.format(200, 0), 2100.0),
                             (name.format(200, 1), 1900.0))}
  assert runner.measured_seconds(cells[name.format(200, 2)], records) == 2000.0
  # No seed of its setting recorded: the kind's mean wall time (no rounds flag to scale by).
  assert runner.measured_seconds(cells[name.format(50, 0)], records) == pytest.approx(4075 / 3)


def test_wall_seconds_adds_the_resumed_rounds_clock_to_records_written_before_it_was_kept():
  curves = dict(round=[1, 2, 3], wall_time_s=[1.5, 3.0, 4.5])
  old = dict(wall_time_s=10.0, resumed_from_rounds=[2], result=dict(curves=curves))
  assert records_lib.wall_seconds(old) == 13.0  # the clock at round 2 added
  # Counted already: a record that keeps it; resumed by a second attempt of one invocation.
  assert records_lib.wall_seconds(dict(old, earlier_invocations_wall_time_s=3.0)) == 10.0
  assert records_lib.wall_seconds(dict(old, attempts=2)) == 10.0
  assert records_lib.wall_seconds(dict(old, resumed_from_rounds=None)) == 10.0
  assert records_lib.clock_at_round(dict(curves=curves), 7) == 0.0


def test_collect_train_keeps_the_fitted_temperatures_only_where_a_run_has_them(tmp_path):
  header = "round,server_accuracy,server_loss,mt_accuracy,mt_loss"
  (tmp_path / "plain").mkdir()
  (tmp_path / "plain" / "metrics.csv").write_text(f"{header}\n1,0.5,1.0,0.5,1.0\n")
  (tmp_path / "tempered").mkdir()
  (tmp_path / "tempered" / "metrics.csv").write_text(
      f"{header},server_temperature,mt_temperature\n1,0.5,1.0,0.5,1.0,0.82,1.22\n")
  plain = records_lib.collect_train(str(tmp_path / "plain"))["curves"]
  tempered = records_lib.collect_train(str(tmp_path / "tempered"))["curves"]
  assert "mt_temperature" not in plain
  assert tempered["server_temperature"] == [0.82] and tempered["mt_temperature"] == [1.22]

"""VIRTUAL Sec. IV-F launchers (Table III, Fig. 4): smoke tests as subprocesses at
tiny settings, and in-process tests of the table writer, the run reuse logic and
the SNR CDF computation."""

import collections
import csv
import json
import math
import os

import numpy as np
import pytest

from launcher_helpers import run_launcher

from tfbfl import gaussian
from tfbfl import run_outputs
from reproduction import _runs
from reproduction import virtual_tables as vx

TINY = [
    "--rounds=1", "--epochs_per_round=1", "--num_clients=3", "--clients_per_round=3",
    "--hidden_units=8", "--seed=1"
]


def _read_csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


# ------------------------------------------------------------ launchers (slow)
@pytest.fixture(scope="module")
def launched(tmp_path_factory):
  """Both launchers, one after the other, into one output directory, as a user runs
  Table III and then Fig. 4: the SNR launcher reuses the sparsity launcher's finished
  `virtual_p0` run (the same flags, checkpointed at its last round)."""
  out = str(tmp_path_factory.mktemp("table3_fig4"))
  jobs = {
      "virtual_sparsity": ["--percentiles=0,50", "--variants=virtual"],
      "virtual_snr_cdf": [],
  }
  done = {}
  for name, args in jobs.items():
    proc = run_launcher(name, f"--output_dir={out}", *TINY, *args)
    done[name] = (out, proc.returncode, proc.stdout + proc.stderr)
  return done


def test_sparsity_launcher_writes_table3(launched):
  out, rc, log = launched["virtual_sparsity"]
  assert rc == 0, log[-3000:]
  for name in ("virtual_p0", "virtual_p50", "fedprox"):
    assert os.path.exists(os.path.join(out, name, "summary.json")), name
    assert f"{name} trained" in log
  assert "[3/3]" in log
  rows = _read_csv(os.path.join(out, "table3.csv"))
  assert [(r["row"], r["metric"]) for r in rows] == [("0%", "MT"), ("0%", "S"), ("50%", "MT"),
                                                     ("50%", "S"), ("FedProx", "MT"),
                                                     ("FedProx", "S")]
  by = {(r["row"], r["metric"]): r for r in rows}
  # Pruning half of every tensor's entries shrinks the upload (sparse, 12 B/entry vs 8 dense).
  assert float(by["50%", "MT"]["delta_bytes"]) < float(by["0%", "MT"]["delta_bytes"])
  assert float(by["50%", "MT"]["delta_nonzeros"]) < float(by["0%", "MT"]["delta_nonzeros"])
  assert float(by["50%", "MT"]["zero_fraction"]) >= 0.5
  for r in rows:
    col = "fedprox" if r["row"] == "FedProx" else "virtual"
    assert 0.0 <= float(r[col]) <= 100.0
  with open(os.path.join(out, "virtual_p50", "summary.json")) as f:
    summary = json.load(f)
  assert summary["flags"]["prune_percentile"] == 50.0 and not summary["flags"]["fedavg_init"]
  assert float(by["50%", "S"]["virtual"]) == pytest.approx(100 * summary["best_server_accuracy"],
                                                           abs=1e-3)
  md = open(os.path.join(out, "table3.md")).read()
  assert "| 50% |" in md and "VIRTUAL + FedAvg init" in md and "FedProx (dense)" in md


def test_snr_cdf_launcher_writes_fig4(launched):
  out, rc, log = launched["virtual_snr_cdf"]
  assert rc == 0, log[-3000:]
  with open(os.path.join(out, "fig4_snr_cdf.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  rows = _read_csv(os.path.join(out, "fig4_snr_cdf.csv"))
  curves = collections.defaultdict(list)
  for r in rows:
    curves[int(r["layer"]), r["variant"]].append(float(r["cdf"]))
  # hidden_units=8 on digits: kernels 64x8 and 8x10, both variants.
  assert sorted(curves) == [(1, "virtual"), (1, "virtual_fedavg_init"), (2, "virtual"),
                            (2, "virtual_fedavg_init")]
  assert {r["shape"] for r in rows} == {"64x8", "8x10"}
  for cdf in curves.values():
    assert np.all(np.diff(cdf) >= 0) and cdf[-1] == pytest.approx(1.0)
  summary = _read_csv(os.path.join(out, "fig4_summary.csv"))
  assert [int(r["num_weights"]) for r in summary] == [3 * 64 * 8] * 2 + [3 * 8 * 10] * 2
  for name in ("virtual_p0", "virtual_fedavg_init_p0"):
    assert os.path.exists(os.path.join(out, name, "checkpoint.npz"))
  assert "virtual_p0 reused" in log and "virtual_fedavg_init_p0 trained" in log


# --------------------------------------------------------- table writer (fast)
def _fake_summary(best_s, best_mt, rounds=4, per_round=2, up=1000, down=1600, **flags):
  return dict(best_server_accuracy=best_s,
              best_mt_accuracy=best_mt,
              final_server_accuracy=best_s / 2,
              final_mt_accuracy=best_mt / 2,
              rounds=rounds,
              bytes_up_total=up * rounds * per_round,
              bytes_down_total=down * rounds * per_round,
              flags=dict(clients_per_round=per_round, rounds=rounds, **flags))


def test_run_record_per_client_round_sizes():
  spec = vx.RunSpec("virtual", 50.0, {})
  rows = [dict(delta_nonzeros="100"), dict(delta_nonzeros="120")]  # summed over C=2 clients
  rec = vx.run_record(spec, _fake_summary(0.8, 0.9, up=660, down=1600), metrics_rows=rows)
  assert rec["delta_bytes"] == 660 and rec["delta_nonzeros"] == 55
  assert rec["delta_entries"] == 200 and rec["zero_fraction"] == pytest.approx(1 - 55 / 200)
  fed = vx.run_record(vx.RunSpec("fedprox", None, {}),
                      _fake_summary(0.7, 0.8, up=400, down=400),
                      metrics_rows=[])
  assert fed["delta_nonzeros"] == 100 and fed["zero_fraction"] is None


def test_table3_picks_best_accuracies_and_formats_rows(tmp_path):
  records = []
  for method, pct, s, mt in [("virtual", 0, 0.90, 0.95), ("virtual_fedavg_init", 0, 0.89, 0.86),
                             ("virtual", 75, 0.908, 0.949),
                             ("virtual_fedavg_init", 75, 0.804, 0.787)]:
    spec = vx.RunSpec(method, float(pct), {})
    nnz = 400 if pct == 0 else 100
    records.append(
        vx.run_record(spec, _fake_summary(s, mt), metrics_rows=[dict(delta_nonzeros=2 * nnz)]))
  records.append(
      vx.run_record(vx.RunSpec("fedprox", None, {}), _fake_summary(0.899, 0.945), metrics_rows=[]))
  md = vx.write_table3(str(tmp_path), records[::-1], title="T")  # order-independent
  rows = _read_csv(tmp_path / "table3.csv")
  assert [(r["row"], r["metric"]) for r in rows] == [("0%", "MT"), ("0%", "S"), ("75%", "MT"),
                                                     ("75%", "S"), ("FedProx", "MT"),
                                                     ("FedProx", "S")]
  by = {(r["row"], r["metric"]): r for r in rows}
  assert float(by["75%", "MT"]["virtual"]) == pytest.approx(94.9)  # best, not final
  assert float(by["75%", "S"]["virtual_fedavg_init"]) == pytest.approx(80.4)
  assert float(by["0%", "MT"]["virtual_fedavg_init"]) == pytest.approx(86.0)
  assert float(by["FedProx", "S"]["fedprox"]) == pytest.approx(89.9)
  assert float(by["75%", "S"]["delta_nonzeros"]) == 100
  assert float(by["75%", "S"]["zero_fraction"]) == pytest.approx(0.5)  # 1 - 100 / (1600 / 8)
  assert (tmp_path / "table3.md").read_text() == md
  lines = md.splitlines()
  assert lines[0] == "T"
  assert "| 75% | 50.0% | 100 | 1kB | MT | 78.7 | 94.9 |" in lines
  assert "|  |  |  |  | S | 80.4 | 90.8 |" in lines
  assert "| FedProx (dense) | 250 | 1kB | MT | 94.5 |" in lines


def test_table3_missing_variant_is_a_dash():
  rec = vx.run_record(vx.RunSpec("virtual", 90.0, {}), _fake_summary(0.2, 0.5), metrics_rows=[])
  md = vx.format_table3_md(vx.table3_rows([rec]))
  assert "| 90% | - | - | 1kB | MT | - | 50.0 |" in md


def test_sparsity_specs_and_percentiles():
  specs = vx.sparsity_specs(dict(rounds=3, fedprox_client_lr=0.1, client_lr=0.05), [0.0, 50.0])
  assert [s.name for s in specs] == [
      "virtual_fedavg_init_p0", "virtual_p0", "virtual_fedavg_init_p50", "virtual_p50", "fedprox"
  ]
  assert specs[0].params["fedavg_init"] and not specs[1].params["fedavg_init"]
  assert specs[3].params["prune_percentile"] == 50.0 and specs[3].params["client_lr"] == 0.05
  assert specs[-1].params["algorithm"] == "fedprox" and specs[-1].params["client_lr"] == 0.1
  assert all("fedprox_client_lr" not in s.params for s in specs)
  assert vx.parse_percentiles(["90", "0", "50", "50"]) == (0.0, 50.0, 90.0)
  for bad in (["100"], ["-1"], ["x"], []):
    with pytest.raises(ValueError):
      vx.parse_percentiles(bad)
  with pytest.raises(ValueError):
    vx.sparsity_specs({}, [0.0], variants=["fedavg"])


class _FakeRunner:
  """Stands in for `driver.run_training`: writes summary.json and a checkpoint."""

  def __init__(self):
    self.calls = []

  def __call__(self, params):
    from tfbfl import round_loop, state_files, driver  # pylint: disable=g-import-not-at-top
    self.calls.append(dict(params))
    p = driver.resolve_params(params)
    flags = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}
    summary = dict(algorithm=p["algorithm"],
                   flags=flags,
                   rounds=p["rounds"],
                   best_server_accuracy=0.5,
                   best_mt_accuracy=0.6,
                   bytes_up_total=10,
                   bytes_down_total=10)
    round_loop.atomic_write_text(os.path.join(p["output_dir"], "summary.json"), json.dumps(summary))
    state_files.save(os.path.join(p["output_dir"], round_loop.CHECKPOINT),
                  dict(round=p["rounds"]),
                  meta=dict(kind="checkpoint", round=p["rounds"]))
    return summary


def test_ensure_run_reuses_resumes_and_retrains(tmp_path):
  runner, log = _FakeRunner(), []
  spec = vx.sparsity_specs(dict(rounds=2, hidden_units="8"), [50.0], ["virtual"], fedprox=False)[0]
  _, how = vx.ensure_run(spec, str(tmp_path), runner=runner, log=log.append)
  assert how == "trained" and runner.calls[-1]["checkpoint_every"] == 2
  assert not runner.calls[-1]["resume"]
  _, how = vx.ensure_run(spec, str(tmp_path), runner=runner, log=log.append)
  assert how == "reused" and len(runner.calls) == 1
  # More rounds, same flags otherwise: continue from the final checkpoint.
  longer = vx.RunSpec(spec.method, spec.percentile, dict(spec.params, rounds=5))
  _, how = vx.ensure_run(longer, str(tmp_path), runner=runner, log=log.append)
  assert how == "resumed" and runner.calls[-1]["resume"] and runner.calls[-1]["rounds"] == 5
  # Another flag changed: trained afresh, and said so.
  other = vx.RunSpec(spec.method, spec.percentile, dict(longer.params, kl_weight=1e-3))
  _, how = vx.ensure_run(other, str(tmp_path), runner=runner, log=log.append)
  assert how == "trained" and not runner.calls[-1]["resume"]
  assert any("other flags" in line for line in log)
  # The SNR launcher needs the final client states: no checkpoint, no reuse.
  os.remove(tmp_path / spec.name / "checkpoint.npz")
  n = len(runner.calls)
  assert vx.ensure_run(other, str(tmp_path), runner=runner, log=log.append)[1] == "reused"
  _, how = vx.ensure_run(other,
                         str(tmp_path),
                         runner=runner,
                         log=log.append,
                         require_checkpoint=True)
  assert how == "trained" and len(runner.calls) == n + 1
  # Interrupted after the final checkpoint but before summary.json: resumed.
  os.remove(tmp_path / spec.name / "summary.json")
  _, how = vx.ensure_run(other, str(tmp_path), runner=runner, log=log.append)
  assert how == "resumed" and runner.calls[-1]["resume"]


def test_a_finished_run_with_an_infinite_flag_is_the_same_run():
  """summary.json holds an infinite flag (the default --fola_gamma) as the string "inf"
  (strict JSON); the flags asked for hold the float: the same run, so reused."""
  wanted = dict(algorithm="virtual", fola_gamma=float("inf"), rounds=2, kl_weight=1e-3)
  saved = json.loads(json.dumps(run_outputs.strict_json(wanted)))
  assert saved["fola_gamma"] == "inf"
  assert _runs.same_flags(saved, wanted) and _runs.same_flags(wanted, saved)
  assert not _runs.same_flags(saved, dict(wanted, fola_gamma=1.0))


def test_run_sparsity_table_with_fake_runner(tmp_path):
  runner, log = _FakeRunner(), []
  records, md = vx.run_sparsity_table(dict(rounds=1, hidden_units="8"), [0.0, 90.0],
                                      str(tmp_path),
                                      runner=runner,
                                      log=log.append)
  assert len(runner.calls) == 5 and len(records) == 5
  assert sum("trained" in line for line in log) == 5
  assert (tmp_path / "table3.md").exists() and (tmp_path / "table3.csv").exists()
  log.clear()
  records2, md2 = vx.run_sparsity_table(dict(rounds=1, hidden_units="8"), [0.0, 90.0],
                                        str(tmp_path),
                                        runner=runner,
                                        log=log.append)
  assert len(runner.calls) == 5 and md2 == md and sum("reused" in line for line in log) == 5


# ----------------------------------------------------------------- SNR CDF
def _posterior(means, stds):
  means = [np.asarray(m, np.float32) for m in means]
  stds = [np.asarray(s, np.float32) for s in stds]
  return gaussian.NaturalGaussian([m / s**2 for m, s in zip(means, stds)], [1 / s**2 for s in stds])


def test_log10_snr_matches_closed_form_and_sparsity_snr():
  from tfbfl import sparsity  # pylint: disable=g-import-not-at-top
  post = _posterior([[[1.0, -10.0], [100.0, 0.5]], [3.0]], [[[1.0, 1.0], [10.0, 0.05]], [3.0]])
  got = vx.log10_snr(post)
  np.testing.assert_allclose(got[0], [[0.0, 1.0], [1.0, 1.0]], atol=1e-6)
  np.testing.assert_allclose(got[1], [0.0], atol=1e-6)
  ref = [np.log10(np.asarray(t)) for t in sparsity.snr(post)]
  for a, b in zip(got, ref):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert vx.dense_kernel_indices(post) == [0]


def test_empirical_cdf_of_known_gaussian_posteriors():
  # Means z ~ N(0, 1), std 1: SNR = |z| and P(log10 SNR <= x) = erf(10^x / sqrt 2).
  rng = np.random.default_rng(0)
  z = rng.standard_normal(20000)
  post = _posterior([z.reshape(200, 100)], [np.ones((200, 100))])
  grid = np.linspace(-2.0, 0.7, 55)
  x, f = vx.empirical_cdf(vx.log10_snr(post)[0], grid)
  exact = np.array([math.erf(10**g / math.sqrt(2)) for g in grid])
  assert np.max(np.abs(f - exact)) < 0.015  # DKW: P(> 0.015) < 2 exp(-9)
  assert np.all(np.diff(f) >= 0) and np.array_equal(x, grid)
  xs, fs = vx.empirical_cdf(vx.log10_snr(post)[0])
  assert np.all(np.diff(xs) >= 0) and np.all(np.diff(fs) > 0) and fs[-1] == 1.0


def test_empirical_cdf_counts_zero_means_at_minus_infinity():
  x, f = vx.empirical_cdf([-np.inf, 0.0, 1.0, 1.0, np.nan])
  np.testing.assert_array_equal(x, [0.0, 1.0, 1.0])
  np.testing.assert_allclose(f, [0.5, 0.75, 1.0])
  _, g = vx.empirical_cdf([-np.inf, 0.0, 1.0, 1.0], [-5.0, 0.5, 2.0])
  np.testing.assert_allclose(g, [0.25, 0.5, 1.0])
  with pytest.raises(ValueError):
    vx.empirical_cdf([np.nan])


def test_layer_log_snr_pools_trained_clients_dense_kernels():
  State = collections.namedtuple("State", ["shared_posterior", "trained"])
  ones = lambda *s: np.ones(s)

  def state(mean, trained):
    return State(
        _posterior([mean * ones(3, 2), ones(2), mean * ones(2, 4),
                    ones(4)],
                   [ones(3, 2), ones(2), ones(2, 4), ones(4)]), np.bool_(trained))

  clients = {0: state(10.0, True), 1: state(100.0, True), 2: state(1000.0, False)}
  pooled = vx.layer_log_snr(clients)
  assert sorted(pooled) == [0, 2]
  np.testing.assert_allclose(np.sort(pooled[0]), [1.0] * 6 + [2.0] * 6)
  assert pooled[2].size == 16
  rows = vx.cdf_curves(
      {
          "virtual": pooled,
          "virtual_fedavg_init": vx.layer_log_snr({0: state(1000.0, False)}, trained_only=True)
      },
      num_points=5,
      shapes={
          0: (3, 2),
          2: (2, 4)
      })
  for layer in (1, 2):
    for variant in ("virtual", "virtual_fedavg_init"):
      cdf = [r["cdf"] for r in rows if r["layer"] == layer and r["variant"] == variant]
      assert len(cdf) == 5 and cdf[-1] == 1.0 and np.all(np.diff(cdf) >= 0)
  first = [r for r in rows if r["layer"] == 1 and r["variant"] == "virtual"]
  assert first[0]["log10_snr"] == 1.0 and first[-1]["log10_snr"] == 3.0
  assert [r["cdf"] for r in first] == [0.5, 0.5, 1.0, 1.0, 1.0]
  assert first[0]["shape"] == "3x2" and first[0]["snr_db"] == 10.0
  q = vx.cdf_quantiles({"virtual": pooled})
  assert [r["num_weights"] for r in q] == [12, 16] and q[0]["q50_log10_snr"] == pytest.approx(1.5)


def test_flags_pass_through_to_training():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from tfbfl import driver  # pylint: disable=g-import-not-at-top
  fv = flags.FlagValues()
  vx.define_training_flags(fv)
  fv(["prog", "--rounds=3", "--hidden_units=8,4", "--kl_weight=0.5", "--partition=homogeneous"])
  params = vx.params_from_flags(fv)
  assert set(params) == set(vx.PASS_THROUGH) and set(vx.PASS_THROUGH) <= set(driver.DEFAULTS)
  p = driver.resolve_params(dict(params, algorithm="virtual"))
  assert p["rounds"] == 3 and p["hidden_units"] == (8, 4) and p["kl_weight"] == 0.5
  assert p["partition"] == "homogeneous" and p["server_lr"] == pytest.approx(0.1)
  # server_lr, clients_per_round and init_scale are derived when unset (1/C; min(10, K);
  # by network: 0.05 for the MLP).
  assert p["init_scale"] == 0.05
  for name in set(vx.PASS_THROUGH) - {
      "rounds", "hidden_units", "kl_weight", "partition", "server_lr", "clients_per_round",
      "filters", "lstm_units", "init_scale"
  }:
    assert p[name] == driver.DEFAULTS[name], name
  assert fv.output_dir is None and fv.fedprox_client_lr is None


def test_report_only_leaves_out_missing_and_other_flag_runs(tmp_path):
  runner, log = _FakeRunner(), []
  base = dict(rounds=1, hidden_units="8")
  vx.run_sparsity_table(base, [0.0],
                        str(tmp_path),
                        variants=["virtual"],
                        fedprox=False,
                        runner=runner,
                        log=log.append)
  log.clear()
  records, _ = vx.run_sparsity_table(base, [0.0, 50.0],
                                     str(tmp_path),
                                     report_only=True,
                                     runner=runner,
                                     log=log.append)
  assert [r["run"] for r in records] == ["virtual_p0"] and len(runner.calls) == 1
  assert sum("no result yet" in line for line in log) == 4
  records, _ = vx.run_sparsity_table(dict(base, rounds=2), [0.0],
                                     str(tmp_path),
                                     report_only=True,
                                     variants=["virtual"],
                                     fedprox=False,
                                     runner=runner,
                                     log=log.append)
  assert records == [] and any("other flags" in line for line in log)

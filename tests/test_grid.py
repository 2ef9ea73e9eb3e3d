"""The Table II grid: cells, resumption, selection of the best cell, report files."""

import csv
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from reproduction import table2 as grid  # noqa: E402

_SPEC = grid.GridSpec(client_lrs=(0.01, 0.1),
                      server_lrs=(0.5, 1.0),
                      mus=(0.1,),
                      kl_weights=(1e-5,),
                      virtual_server_lrs=(1.0,),
                      seeds=(0, 1))


def _fake_score(dataset, algorithm, hp, seed):
  """Deterministic fake accuracies; the best S and MT configurations differ."""
  base = {"digits:homogeneous": 0.8, "digits:permuted": 0.5}[dataset]
  base += {"fedavg": 0.0, "fedprox": 0.01}[algorithm]
  s = base + (0.05 if hp["client_lr"] == 0.1 else 0.0) + (0.02 if hp["server_lr"] == 0.5 else 0.0)
  mt = base + (0.04 if hp["client_lr"] == 0.01 else 0.0) + (0.03 if hp["server_lr"] == 1.0 else 0.0)
  jitter = 0.01 * seed
  return s + jitter, mt - jitter


class FakeRunner:
  """Stands in for `grid.run_cell`; counts calls and can fail at call `fail_at`."""

  def __init__(self, fail_at=None):
    self.calls, self.fail_at = 0, fail_at

  def __call__(self, params):
    self.calls += 1
    if self.fail_at is not None and self.calls == self.fail_at:
      raise KeyboardInterrupt("interrupted")
    dataset = f"{params['dataset']}:{params['partition']}"
    hp = dict(client_lr=params["client_lr"], server_lr=params["server_lr"])
    s, mt = _fake_score(dataset, params["algorithm"], hp, params["seed"])
    rounds = list(range(1, params["rounds"] + 1))
    curves = dict(round=rounds,
                  server_loss=[1.0 / r for r in rounds],
                  mt_loss=[2.0 / r for r in rounds],
                  server_accuracy=[s] * len(rounds),
                  mt_accuracy=[mt] * len(rounds))
    return dict(summary=dict(best_server_accuracy=s, best_mt_accuracy=mt), curves=curves)


def _cells():
  return grid.enumerate_cells(["digits:homogeneous", "digits:permuted"], ["fedavg", "fedprox"],
                              _SPEC)


def test_enumerate_cells_is_the_product():
  cells = _cells()
  assert len(cells) == 2 * 2 * (2 * 2) * 2  # datasets x algorithms x configs x seeds
  assert len({c.key for c in cells if c.dataset == "digits:permuted" and c.algorithm == "fedprox"
             }) == 8
  fedprox = [c for c in cells if c.algorithm == "fedprox"][0]
  assert fedprox.key == "client_lr=0.01,mu=0.1,server_lr=0.5,seed=0"
  p = fedprox.params("/out", dict(rounds=3))
  assert (p["dataset"], p["partition"], p["mu"], p["rounds"],
          p["verbose"]) == ("digits", "homogeneous", 0.1, 3, False)
  assert p["output_dir"] == os.path.join("/out", "digits-homogeneous", "fedprox",
                                         "client_lr=0.01,mu=0.1,server_lr=0.5,seed=0")
  local = grid.enumerate_cells(["digits"], ["local", "virtual"], _SPEC)
  assert [c.config_key for c in local if c.algorithm == "local"
         ] == ["client_lr=0.01", "client_lr=0.01", "client_lr=0.1", "client_lr=0.1"]
  assert {c.hparams for c in local if c.algorithm == "virtual"
         } == {(("client_lr", 0.01), ("kl_weight", 1e-5), ("server_lr", 1.0)),
               (("client_lr", 0.1), ("kl_weight", 1e-5), ("server_lr", 1.0))}


def test_interrupted_grid_resumes_without_recomputing(tmp_path):
  cells, out, fixed = _cells(), str(tmp_path), dict(rounds=3)
  first = FakeRunner(fail_at=6)
  with pytest.raises(KeyboardInterrupt):
    grid.run_grid(cells, out, fixed, cell_runner=first, log=lambda _: None)
  assert first.calls == 6  # 5 finished, the 6th interrupted
  second = FakeRunner()
  results = grid.run_grid(cells, out, fixed, cell_runner=second, log=lambda _: None)
  assert second.calls == len(cells) - 5
  assert all(r is not None for r in results)
  third = FakeRunner()
  again = grid.run_grid(cells, out, fixed, cell_runner=third, log=lambda _: None)
  assert third.calls == 0 and again == results
  # Other shared flags make every stored result stale.
  fourth = FakeRunner()
  grid.run_grid(cells, out, dict(rounds=4), cell_runner=fourth, log=lambda _: None)
  assert fourth.calls == len(cells)
  with open(os.path.join(cells[0].directory(out), grid.RESULT_FILE)) as f:
    stored = json.load(f)
  assert stored["params"]["rounds"] == 4 and stored["curves"]["round"] == [1, 2, 3, 4]


def test_table_picks_true_maximum(tmp_path):
  out = str(tmp_path)
  results = grid.run_grid(_cells(),
                          out,
                          dict(rounds=2),
                          cell_runner=FakeRunner(),
                          log=lambda _: None)
  rows = grid.write_report(out, results)
  assert [(r["dataset"], r["algorithm"]) for r in rows] == [("digits:homogeneous", "fedavg"),
                                                            ("digits:homogeneous", "fedprox"),
                                                            ("digits:permuted", "fedavg"),
                                                            ("digits:permuted", "fedprox")]
  for r in rows:
    configs = {}
    for c in _cells():
      if (c.dataset, c.algorithm) == (r["dataset"], r["algorithm"]):
        score = _fake_score(c.dataset, c.algorithm, dict(c.hparams), c.seed)
        configs.setdefault(c.config_key, []).append(score)
    s_best = max(configs, key=lambda k: np.mean([s for s, _ in configs[k]]))
    mt_best = max(configs, key=lambda k: np.mean([m for _, m in configs[k]]))
    assert r["s_hparams"] == s_best and r["mt_hparams"] == mt_best
    assert "client_lr=0.1" in s_best and "server_lr=0.5" in s_best
    assert "client_lr=0.01" in mt_best and "server_lr=1" in mt_best
    assert r["s_mean"] == pytest.approx(np.mean([s for s, _ in configs[s_best]]))
    assert r["s_std"] == pytest.approx(np.std([s for s, _ in configs[s_best]], ddof=1))
    assert r["mt_mean"] == pytest.approx(np.mean([m for _, m in configs[mt_best]]))
    assert r["num_seeds"] == 2 and r["num_configs"] == 4
  with open(os.path.join(out, "table2.csv"), newline="") as f:
    table = list(csv.DictReader(f))
  assert len(table) == 4 and table[0]["s_hparams"] == rows[0]["s_hparams"]
  md = open(os.path.join(out, "table2.md")).read()
  assert "| digits:permuted | FedProx | 58.5 ± 0.7 | 57.5 ± 0.7 |" in md
  assert "cannot be judged: no VIRTUAL rows" in md
  assert os.path.getsize(os.path.join(out, "fig3.png")) > 1000
  assert not os.path.exists(os.path.join(out, "fig2.png"))  # no VIRTUAL cells


def test_fig2_draws_one_line_per_beta(tmp_path):
  spec = grid.GridSpec(client_lrs=(0.1,),
                       kl_weights=(1e-6, 1e-4, 1e-2),
                       virtual_server_lrs=(0.5, 1.0))
  cells = grid.enumerate_cells(["digits"], ["virtual"], spec)
  results = []
  for c in cells:
    hp = dict(c.hparams)
    mt = 0.9 - abs(np.log10(hp["kl_weight"]) + 4) * 0.01 + (0.01 if hp["server_lr"] == 0.5 else 0)
    results.append(
        dict(dataset=c.dataset,
             algorithm=c.algorithm,
             hparams=hp,
             config_key=c.config_key,
             seed=c.seed,
             summary=dict(best_server_accuracy=0.8, best_mt_accuracy=mt),
             curves=dict(round=[1, 2],
                         server_loss=[1.0, 0.5],
                         mt_loss=[1.0, float("nan")],
                         server_accuracy=[0.5, 0.8],
                         mt_accuracy=[0.5, mt])))
  best = grid.select_best(grid.group_results(results)[("digits", "virtual")], "MT")
  assert best.hparams == dict(client_lr=0.1, kl_weight=1e-4, server_lr=0.5)
  path = os.path.join(tmp_path, "fig2.png")
  assert grid.plot_fig2(path, results)
  assert os.path.getsize(path) > 1000


def test_dataset_specs_and_flags():
  assert grid.parse_dataset_spec("digits:class_dirichlet:alpha=0.1") == (dict(
      dataset="digits"), dict(partition="class_dirichlet", alpha=0.1))
  assert grid.parse_dataset_spec("npz:data_dir=/x/y.npz") == (dict(dataset="npz"),
                                                              dict(data_dir="/x/y.npz"))
  base, overrides = grid.parse_dataset_spec("digits_dirichlet:num_clients=4")
  assert (base["dataset"], base["partition"], overrides) == ("digits", "class_dirichlet",
                                                             dict(num_clients=4))
  # preset < shared flags < the spec's own overrides
  cell = grid.Cell("digits_dirichlet:num_clients=4", "fedavg",
                   (("client_lr", 0.1), ("server_lr", 1.0)), 0)
  p = cell.params("/o", dict(num_clients=3, clients_per_round=3))
  assert (p["num_clients"], p["clients_per_round"], p["partition"]) == (4, 3, "class_dirichlet")
  with pytest.raises(ValueError, match="--datasets"):
    grid.parse_dataset_spec("digits:iid")
  with pytest.raises(ValueError, match="--datasets"):
    grid.parse_dataset_spec("nosuchdata")
  with pytest.raises(ValueError, match="--datasets"):
    grid.parse_dataset_spec("digits:client_lr=3")
  with pytest.raises(ValueError, match="--fixed"):
    grid.parse_assignments(["nonsense=1"])
  with pytest.raises(ValueError, match="--fixed"):
    grid.make_fixed(client_lr=0.1)
  with pytest.raises(ValueError, match="--mus"):
    grid.make_grid(mus=[0.0])
  with pytest.raises(ValueError, match="--algorithms"):
    grid.enumerate_cells(["digits"], ["fedsgd"], _SPEC)
  quick = grid.make_grid(quick=True, seeds=[0, 1])
  assert quick.seeds == (0, 1) and quick.client_lrs == (0.05,)
  assert grid.make_fixed(quick=True, rounds=None, fedavg_init=True) == dict(rounds=10,
                                                                            fedavg_init=True)
  assert grid.parse_assignments(["fedavg_init=true",
                                 "hidden_units=8,4"]) == dict(fedavg_init=True, hidden_units=(8, 4))
  full = grid.GridSpec()
  assert len(full.client_lrs) == len(full.mus) == 5
  assert full.server_lrs == (0.2, 0.4, 0.6, 0.8, 1.0)
  # The paper's grids: VIRTUAL's damped-EP step (consistent damping) and beta.
  assert full.virtual_server_lrs == (0.2, 0.4, 0.6, 0.8, 1.0)
  assert full.kl_weights == (1e-6, 1e-5, 1e-4, 1e-3)
  with pytest.raises(ValueError, match="virtual_server_lrs"):
    grid.make_grid(virtual_server_lrs=[0.5, 1.5])


def test_real_cell_runs_once_and_is_reported(tff_runtime, tmp_path, monkeypatch):
  from tfbfl import runtime  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(runtime, "set_local_runtime",
                      lambda **_: tff_runtime)  # keep the session's worker
  spec = grid.GridSpec(client_lrs=(0.1,), server_lrs=(1.0,))
  cells = grid.enumerate_cells(["digits:homogeneous:num_clients=3"], ["fedavg"], spec)
  fixed = dict(rounds=2, epochs_per_round=1, clients_per_round=3, hidden_units=(8,))
  lines = []
  results = grid.run_grid(cells, str(tmp_path), fixed, log=lines.append)
  assert len(results) == 1 and results[0]["curves"]["round"] == [1, 2]
  assert results[0]["summary"]["best_server_accuracy"] == max(
      results[0]["curves"]["server_accuracy"])
  assert any("fedavg client_lr=0.1,server_lr=1,seed=0" in line for line in lines)
  calls = []
  grid.run_grid(cells, str(tmp_path), fixed, cell_runner=calls.append, log=lambda _: None)
  assert calls == []
  rows = grid.write_report(str(tmp_path), results)
  assert rows[0]["s_hparams"] == "client_lr=0.1,server_lr=1"


def test_diverged_configuration_does_not_win():

  def result(key, acc, last_loss):
    return dict(dataset="d",
                algorithm="fedavg",
                hparams=dict(client_lr=key),
                config_key=f"client_lr={key}",
                seed=0,
                summary=dict(best_server_accuracy=acc, best_mt_accuracy=acc),
                curves=dict(round=[1, 2],
                            server_loss=[1.0, last_loss],
                            mt_loss=[1.0, last_loss],
                            server_accuracy=[acc, 0.1],
                            mt_accuracy=[acc, 0.1]))

  rows = grid.table2_rows([result(0.3, 0.9, float("nan")), result(0.1, 0.7, 0.5)])
  assert rows[0]["s_hparams"] == "client_lr=0.1" and rows[0]["s_mean"] == 0.7
  assert not rows[0]["s_diverged"]
  rows = grid.table2_rows([result(0.3, 0.9, float("nan")), result(0.1, 0.7, float("inf"))])
  assert rows[0]["mt_hparams"] == "client_lr=0.3" and rows[0]["mt_diverged"]
  assert "90.0 ± 0.0 †" in grid.format_table2_md(rows)


def test_virtual_variants_set_the_server_loss_weight(tmp_path):
  spec = grid.GridSpec(client_lrs=(0.1,),
                       kl_weights=(1e-4,),
                       virtual_server_lrs=(0.4, 1.0),
                       server_lrs=(1.0,),
                       seeds=(0,))
  cells = grid.enumerate_cells(["digits:permuted"], ["virtual", "virtual_eq3", "fedavg"], spec)
  by_alg = {}
  for c in cells:
    by_alg.setdefault(c.algorithm, []).append(c)
  # Both VIRTUAL rows are tuned over the same (VIRTUAL) values.
  assert [c.hparams for c in by_alg["virtual"]] == [c.hparams for c in by_alg["virtual_eq3"]]
  assert [dict(c.hparams)["server_lr"] for c in by_alg["virtual_eq3"]] == [0.4, 1.0]
  p1 = by_alg["virtual"][0].params("/o", {})
  p0 = by_alg["virtual_eq3"][0].params("/o", {})
  assert (p1["algorithm"], p1["server_loss_weight"]) == ("virtual", 1.0)
  assert (p0["algorithm"], p0["server_loss_weight"]) == ("virtual", 0.0)
  assert p0["output_dir"] != p1["output_dir"] and "virtual_eq3" in p0["output_dir"]
  assert "server_loss_weight" not in by_alg["fedavg"][0].params("/o", {})
  # The label must not be contradicted by a shared flag or a dataset spec.
  with pytest.raises(ValueError, match="--fixed"):
    grid.make_fixed(server_loss_weight=0.5)
  with pytest.raises(ValueError, match="--datasets"):
    grid.parse_dataset_spec("digits:server_loss_weight=1")
  assert "virtual_eq3" in grid.ALGORITHMS and "virtual_eq3" in grid.default_algorithms()

  # A runner whose scores depend on the weight it receives: the rows carry the labels.
  def runner(params):
    w = params.get("server_loss_weight")
    s, mt = {1.0: (0.9, 0.8), 0.0: (0.2, 0.85), None: (0.88, 0.82)}[w]
    curves = dict(round=[1],
                  server_loss=[1.0],
                  mt_loss=[1.0],
                  server_accuracy=[s],
                  mt_accuracy=[mt])
    return dict(summary=dict(best_server_accuracy=s, best_mt_accuracy=mt), curves=curves)

  results = grid.run_grid(cells, str(tmp_path), {}, cell_runner=runner, log=lambda _: None)
  rows = grid.write_report(str(tmp_path), results)
  labels = {r["algorithm"]: (r["label"], r["s_mean"], r["mt_mean"]) for r in rows}
  assert labels["virtual"] == ("VIRTUAL (w_S=1)", 0.9, 0.8)
  assert labels["virtual_eq3"] == ("VIRTUAL eq. 3 (w_S=0)", 0.2, 0.85)
  md = open(os.path.join(tmp_path, "table2.md")).read()
  assert "| digits:permuted | VIRTUAL (w_S=1) | 90.0 ± 0.0 | 80.0 ± 0.0 |" in md
  assert "| digits:permuted | VIRTUAL eq. 3 (w_S=0) | 20.0 ± 0.0 | 85.0 ± 0.0 |" in md
  assert "| digits:permuted | FedAvg | 88.0 ± 0.0 | 82.0 ± 0.0 |" in md
  assert "(a) VIRTUAL eq. 3 (w_S=0) MT above FedAvg MT on non-IID data, digits:permuted: held" in md
  assert "(a) VIRTUAL (w_S=1) MT above FedAvg MT on non-IID data, digits:permuted: not held" in md
  assert os.path.exists(os.path.join(tmp_path, "fig2.png"))


def test_quick_protocol_and_progress_lines(tmp_path):
  cells, fixed = grid.plan(quick=True)
  assert fixed == dict(rounds=10)
  assert len(cells) == 3 * 3 * 3  # datasets x (virtual, virtual_eq3, fedavg) x seeds, 1 config each
  assert {c.dataset for c in cells
         } == {"digits:homogeneous", "digits:class_dirichlet", "digits:permuted"}
  assert {c.algorithm for c in cells} == {"virtual", "virtual_eq3", "fedavg"}
  assert {c.seed for c in cells} == {0, 1, 2}
  step = float(
      grid.virtual.default_step(
          grid.round_loop.default_clients_per_round(grid.driver.DEFAULTS["num_clients"])))
  assert {c.hparams for c in cells if c.algorithm != "fedavg"
         } == {(("client_lr", 0.05), ("kl_weight", 1e-4), ("server_lr", step))}
  assert {c.hparams for c in cells if c.algorithm == "fedavg"} == {(("client_lr", 0.05),
                                                                    ("server_lr", 1.0))}
  # 18 VIRTUAL cells at ~40-60 s and 9 FedAvg cells at ~3 s: 15-20 minutes.
  minutes = sum(grid.estimate_seconds(c, fixed) for c in cells) / 60
  assert 12 <= minutes <= 20, minutes
  # Explicit values override the quick protocol.
  cells, fixed = grid.plan(quick=True,
                           algorithms=["fedavg"],
                           seeds=[4],
                           params=dict(rounds=3),
                           fixed_items=["fedavg_init=true"])
  assert len(cells) == 3 and {c.seed for c in cells} == {4}
  assert fixed == dict(rounds=3, fedavg_init=True)
  full, _ = grid.plan(datasets=["digits:permuted"], algorithms=["virtual"])
  assert len(full) == 5 * 4 * 5  # client lrs x betas x steps, one seed
  # One line per finished cell: i/N, dataset, algorithm, hyperparameters, seed, S/MT, ETA.
  lines = []
  grid.run_grid([cells[0], cells[2]],
                str(tmp_path),
                dict(rounds=2),
                cell_runner=FakeRunner(),
                log=lines.append)
  assert lines[0].startswith("grid: 2 cells, 0 already done, 2 to run") and "estimate" in lines[0]
  assert lines[1].startswith(
      "cell 1/2 digits:homogeneous fedavg client_lr=0.05,server_lr=1,seed=4: best S ")
  assert "MT " in lines[1] and "ETA" in lines[1] and len(lines) == 3
  assert lines[2].startswith("cell 2/2 digits:permuted fedavg ")


def _row(dataset, algorithm, s, mt, seeds=3):
  return dict(dataset=dataset,
              algorithm=algorithm,
              s_mean=s,
              s_std=0.01,
              mt_mean=mt,
              mt_std=0.02,
              s_hparams="",
              mt_hparams="",
              s_diverged=False,
              mt_diverged=False,
              num_seeds=seeds)


def test_paper_claims_held_and_not_held():
  rows = [
      _row("digits:homogeneous", "virtual", 0.900, 0.90),
      _row("digits:homogeneous", "fedavg", 0.905, 0.91),
      _row("digits:class_dirichlet", "virtual", 0.880, 0.95),
      _row("digits:class_dirichlet", "fedavg", 0.900, 0.90),
      _row("digits:permuted", "virtual", 0.800, 0.80),
      _row("digits:permuted", "fedavg", 0.850, 0.85)
  ]
  lines = grid.paper_claims(rows)
  line = lambda prefix: [x for x in lines if x.startswith(prefix)]
  a = line("(a) VIRTUAL (w_S=1)")
  assert len(a) == 2  # the non-IID rows only, not homogeneous
  assert a[0] == (
      "(a) VIRTUAL (w_S=1) MT above FedAvg MT on non-IID data, digits:class_dirichlet: held: "
      "MT 95.0 ± 2.0 vs FedAvg 90.0 ± 2.0 (%, mean ± std over 3 vs 3 seeds; "
      "MT difference +5.0 pp, standard error 1.6).")
  assert "digits:permuted: not held: MT 80.0 ± 2.0 vs FedAvg 85.0 ± 2.0" in a[1]
  b = line("(b) VIRTUAL (w_S=1)")
  assert len(b) == 3 and all("rule: mean S >= FedAvg's - 1 pp" in x for x in b)
  assert "digits:homogeneous: held" in b[0]  # 0.5 pp below: comparable
  assert "digits:class_dirichlet: not held" in b[1]  # 2 pp below
  assert "digits:permuted: not held" in b[2]
  c = line("(c) PMNIST the exception: VIRTUAL (w_S=1)")
  assert len(c) == 1 and "digits:permuted: held: MT 80.0 ± 2.0 vs FedAvg 85.0 ± 2.0; S 80.0" in c[0]
  # VIRTUAL beating FedAvg on permuted: the exception does not hold (and (a) does).
  rows[4] = _row("digits:permuted", "virtual", 0.86, 0.84)
  c = [x for x in grid.paper_claims(rows) if x.startswith("(c)")]
  assert "not held" in c[0]
  rows[4] = _row("digits:permuted", "virtual", 0.80, 0.90)  # wins MT only: still beats it
  assert "not held" in [x for x in grid.paper_claims(rows) if x.startswith("(c)")][0]
  # Both variants are judged; eq. 3 has its own lines.
  lines = grid.paper_claims(rows + [_row("digits:permuted", "virtual_eq3", 0.2, 0.86, seeds=2)])
  eq3 = [x for x in lines if "VIRTUAL eq. 3 (w_S=0)" in x]
  assert len(eq3) == 3
  # +1 pp with a standard error of sqrt(2^2/2 + 2^2/3) = 1.8 pp: a tie, not "above".
  assert eq3[0].endswith(": not held: MT 86.0 ± 2.0 vs FedAvg 85.0 ± 2.0 (%, mean ± std over 2 "
                         "vs 3 seeds; MT difference +1.0 pp, standard error 1.8).")
  # The same +1 pp over seeds that agree (std 0.1 pp) is above.
  tight = [dict(r, mt_std=0.001) for r in rows + [_row("digits:permuted", "virtual_eq3", 0.2, 0.86)]]
  assert ": held: MT 86.0 ± 0.1" in [x for x in grid.paper_claims(tight) if "eq. 3" in x][0]
  # S far below; MT a tie: it beats FedAvg on neither, so the exception holds.
  assert ": not held: " in eq3[1] and ": held: " in eq3[2]


def test_paper_claims_that_cannot_be_judged():
  assert grid.paper_claims([_row("digits:permuted", "fedavg", 0.8, 0.8)
                           ]) == ["Paper claims cannot be judged: no VIRTUAL rows in the table."]
  lines = grid.paper_claims([_row("digits:permuted", "virtual", 0.8, 0.8)])
  assert len(lines) == 3 and all("cannot be judged: no FedAvg row" in x for x in lines)
  lines = grid.paper_claims([
      _row("digits:homogeneous", "virtual", 0.8, 0.8),
      _row("digits:homogeneous", "fedavg", 0.8, 0.8)
  ])
  assert lines[0].startswith("(a)") and "cannot be judged: no non-IID dataset row" in lines[0]
  assert "held" in lines[1] and "cannot be judged: no permuted-partition row" in lines[2]
  # Partitions come from presets too: digits_permuted is the PMNIST stand-in, digits_iid is IID.
  lines = grid.paper_claims([
      _row("digits_permuted", "virtual", 0.8, 0.8),
      _row("digits_permuted", "fedavg", 0.9, 0.9),
      _row("digits_iid", "virtual", 0.8, 0.8)
  ])
  assert [x.split(":")[0] for x in lines if x.startswith("(a)")
         ] == ["(a) VIRTUAL (w_S=1) MT above FedAvg MT on non-IID data, digits_permuted"]
  assert any(x.startswith("(c)") and "digits_permuted: held" in x for x in lines)

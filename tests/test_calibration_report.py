"""Issue 34's report section, from records: the claims' rule, the per-client pairing, figures."""

import time

import numpy as np

from tfbfl import metrics
from reproduction import calibration_report
from reproduction import reproduce
from reproduction import runner


def _calibration(rng, client_nll, confidence):
  """`final_calibration` of a run whose clients have MT NLLs `client_nll` and whose
  predictions all have top probability `confidence` (right 80 % of the time)."""
  n = 50
  probs = np.full((n, 2), 1 - confidence, np.float32)
  probs[:, 0] = confidence
  labels = (rng.random(n) > 0.8).astype(int)
  bins = metrics.numpy_calibration_sums(probs, labels).tolist()
  return dict(server_bins=bins, mt_bins=bins, client_mt_nll=list(client_nll),
              client_mt_ece=[abs(confidence - 0.8)] * len(client_nll),
              client_num_examples=[n] * len(client_nll))


def _record(cell, mt_accuracy, mt_loss, client_nll, confidence, log_prec=None, server_loss=0.3):
  rng = np.random.default_rng(cell.seed)
  curves = dict(round=[1, 2], mt_accuracy=[0.5, mt_accuracy], mt_loss=[1.0, mt_loss],
                server_accuracy=[0.5, 0.9], server_loss=[1.0, server_loss], server_ece=[0.1, 0.02],
                mt_ece=[0.1, abs(confidence - 0.8)])
  if log_prec is not None:
    curves.update(log_prec_shared_1=[5.99, log_prec], log_prec_private_1=[5.99, log_prec - 1])
  result = dict(curves=curves,
                summary=dict(final_calibration=_calibration(rng, client_nll, confidence)))
  return runner.make_record(cell, cell.command("out", "/data"), result, 10.0, time.time())


def test_claims_table_and_figures_follow_the_records(tmp_path):
  cells = {c.name: c for c in reproduce.catalogue({})}
  records = {}

  def add(algorithm, setting, seed, *args, **kw):
    name = f"virtual/calibration/mnist/{algorithm}/{setting}/seed{seed}"
    records[name] = _record(cells[name], *args, **kw)

  for seed in (0, 1):
    add("fedavg", "tuned", seed, 0.915, 0.30, [0.30, 0.30, 0.30], 0.85)
    add("fedavg", "temperature_scaling", seed, 0.913, 0.29, [0.29, 0.31, 0.31], 0.81)
    add("fola", "mean", seed, 0.905, 0.33, [0.33] * 3, 0.85)
    add("fola", "laplace_samples=10", seed, 0.905, 0.33, [0.33] * 3, 0.85, server_loss=0.45)
    add("virtual", "tuned", seed, 0.910 + 0.002 * seed, 0.40, [0.40, 0.40, 0.40], 0.95, 5.99)
    # Calibrated at the tuned accuracy: lower NLL on two of three clients.
    add("virtual", "eval_samples=10", seed, 0.911, 0.28, [0.20, 0.25, 0.35], 0.82, 5.99)
    # Lower NLL but an accuracy far below the tuned setting's: not held.
    add("virtual", "scale_adam", seed, 0.85, 0.25, [0.25, 0.25, 0.25], 0.80, 4.0)
  claims = calibration_report.calibration_claims(records)
  by_setting = {l.split(":")[0].split("VIRTUAL ")[1]: l for l in claims}
  assert ": held (MT NLL 0.280 vs FedAvg 0.300" in by_setting["eval_samples=10"]
  assert ": not held (" in by_setting["scale_adam"]
  assert ": not held (" in by_setting["tuned"]  # 0.40 above FedAvg's 0.30
  share = calibration_report.paired_client_share(
      calibration_report.calibration_records(records, "mnist", "virtual", "eval_samples=10"),
      calibration_report.calibration_records(records, "mnist", "fedavg", "tuned"))
  assert share == 2 / 3
  text = "\n".join(calibration_report.calibration_markdown(records))
  assert "| VIRTUAL eval_samples=10 | 2 |" in text and "| 67 % |" in text
  assert "| FedAvg | 2 |" in text
  # the tempered FedAvg is paired with the untempered one, client by client (1 of 3 lower)
  assert "| FedAvg temperature_scaling | 2 |" in text and "| 33 % |" in text
  assert "mnist, FedAvg with fitted temperatures: MT NLL 0.290 ± 0.000 vs 0.300 ± 0.000" in text
  # FOLA beside them, its Laplace predictive's S against its mean's
  assert "| FOLA mean | 2 |" in text and "| FOLA laplace_samples=10 | 2 |" in text
  assert ("mnist, FOLA's Laplace predictive against the mean: S NLL 0.450 ± 0.000 vs "
          "0.300 ± 0.000") in text
  # One seed of a setting: its claim waits.
  del records["virtual/calibration/mnist/virtual/scale_adam/seed1"]
  assert any("scale_adam" in l and "pending" in l
             for l in calibration_report.calibration_claims(records))
  # Item 4: the choice waits for every setting, then takes the lowest MT NLL at the tuned
  # accuracy (eval_samples=10; scale_adam's lower NLL comes with a lower accuracy).
  assert reproduce.calibration_choice(records, "mnist")[0] is None
  for seed in (0, 1):
    add("virtual", "scale_adam", seed, 0.85, 0.25, [0.25, 0.25, 0.25], 0.80, 4.0)
    add("virtual", "scale_adam,eval_samples=10", seed, 0.912, 0.31, [0.3] * 3, 0.85, 4.0)
    add("virtual", "scale_adam=0.01,eval_samples=10", seed, 0.90, 0.29, [0.3] * 3, 0.85, 3.0)
    add("virtual", "private_kl=1,eval_samples=10", seed, 0.905, 0.27, [0.3] * 3, 0.85, 6.0)
    add("virtual", "eval_samples=10,temperature_scaling", seed, 0.909, 0.29, [0.3] * 3, 0.8)
  assert reproduce.calibration_choice(records, "mnist") == ("eval_samples=10", "")
  # VIRTUAL's tempered Monte Carlo predictive beside the untempered one
  assert ("mnist, VIRTUAL eval_samples=10 with fitted temperatures: MT NLL 0.290 ± 0.000 vs "
          "0.280 ± 0.000 untempered") in "\n".join(calibration_report.calibration_markdown(records))
  chosen = {c.name: c for c in reproduce.calibrated_table2_cells(records)}
  name = "virtual/table2_calibrated/mnist/virtual/eval_samples=10/seed{}"
  assert dict(chosen[name.format(0)].flags)["eval_samples"] == 10
  assert "tuning" in chosen[name.format(0)].depends  # and on the row's tuned VIRTUAL setting
  table2 = {c.name: c for c in reproduce.catalogue(records)}
  for seed in (0, 1, 2):
    records[name.format(seed)] = _record(chosen[name.format(seed)], 0.952, 0.17, [0.17], 0.9)
    for algorithm, nll in (("virtual", 0.20), ("fedavg", 0.18)):
      cell = table2[f"virtual/table2/mnist/{algorithm}/tuned/seed{seed}"]
      records[cell.name] = _record(cell, 0.951 + 0.001 * seed, nll, [nll], 0.9)
  text = "\n".join(calibration_report.table2_markdown(records))
  assert "| mnist | VIRTUAL eval_samples=10 | 3 |" in text, text
  assert "mnist, Table II protocol: a VIRTUAL setting as calibrated as FedAvg: held" in text, text
  assert "pmnist, Table II protocol: a VIRTUAL setting as calibrated as FedAvg: pending" in text
  # Where the choice is not the default evaluation (PMNIST: none yet), the default alone
  # runs on Table II's protocol too and stands in the table beside it; not where it is.
  assert "(the default)" not in text
  default = "virtual/table2_calibrated/pmnist/virtual/eval_samples=10/seed{}"
  table2 = {c.name: c for c in reproduce.catalogue(records)}
  assert dict(table2[default.format(0)].flags)["eval_samples"] == 10
  for seed in (0, 1, 2):
    records[default.format(seed)] = _record(table2[default.format(seed)], 0.88, 0.6, [0.6], 0.9)
  text = "\n".join(calibration_report.table2_markdown(records))
  assert "| pmnist | VIRTUAL eval_samples=10 (the default) | 3 |" in text, text
  assert "pmnist, Table II protocol: a VIRTUAL setting as calibrated as FedAvg: pending" in text
  for name, plot in calibration_report.FIGURES:
    assert plot(str(tmp_path / name), records), name
    assert (tmp_path / name).stat().st_size > 1000
  assert not calibration_report.plot_reliability(str(tmp_path / "none.png"), {})

"""Issue 34's report: is VIRTUAL's predictive calibrated, beside FedAvg's?

From the `virtual/calibration` records (`reproduce.calibration_cells`: the tuning
protocol of every Table II row, `reproduce.CALIBRATION_SETTINGS` of VIRTUAL beside
`reproduce.CALIBRATION_BASELINE_SETTINGS`: FedAvg at its tuned setting, with and
without fitted temperatures, and FOLA with and without its Laplace predictive;
`reproduce.CALIBRATION_SEEDS`):

* a table per row: final S and MT accuracy, NLL and ECE (mean ± standard error over
  the seeds), the MT NLL against FedAvg's, the final mean log precision of the first
  shared and private layer;
* per-client calibration: each client's MT NLL against FedAvg's on the same client and
  seed (the share of clients where it is lower), and the median client MT ECE;
* claim lines: a setting "is calibrated" when its final MT NLL is at or below FedAvg's
  mean and its final MT accuracy is within one standard error of the tuned VIRTUAL's;
  what fitted temperatures did to FedAvg's and VIRTUAL's MT, and the Laplace predictive
  to FOLA's S;
* figures: reliability diagrams (accuracy against confidence, the records' pooled
  bins summed over seeds, S and MT) and the variance trajectories (mean log
  precision per round of the shared and private layers).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from reproduction import _runs
from reproduction import records as records_lib
from reproduction import reproduce as rp

EXPERIMENT = "calibration"
ANCHOR = "virtual-calibration"
REFERENCE = "tuned"
BASELINE = "fedavg"


def experiment_records(records: Mapping[str, Mapping[str, Any]], experiment: str, row: str,
                       algorithm: str, setting: Optional[str]) -> List[Mapping[str, Any]]:
  """VIRTUAL-paper records of one experiment, row, algorithm and setting (None: any), by seed."""
  return sorted((r for r in records.values()
                 if r["cell"]["experiment"] == experiment and r["cell"]["paper"] == "virtual" and
                 (r["cell"]["row"], r["cell"]["algorithm"]) == (row, algorithm) and
                 setting in (None, r["cell"]["setting"])), key=lambda r: r["cell"]["seed"])


def calibration_records(records: Mapping[str, Mapping[str, Any]], row: str, algorithm: str,
                        setting: str) -> List[Mapping[str, Any]]:
  """The calibration records of one row, algorithm and setting, by seed."""
  return experiment_records(records, EXPERIMENT, row, algorithm, setting)


def _groups(records: Mapping[str, Mapping[str, Any]],
            row: str) -> List[Tuple[str, List[Mapping[str, Any]]]]:
  """`(label, records)` of the row: VIRTUAL's settings, then the baselines', where recorded."""
  out = [(f"VIRTUAL {name}", calibration_records(records, row, "virtual", name))
         for name, _ in rp.CALIBRATION_SETTINGS]
  out += [(_baseline_label(a, name), calibration_records(records, row, a, name))
          for a, settings in rp.CALIBRATION_BASELINE_SETTINGS.items() for name, _ in settings]
  return [(label, recs) for label, recs in out if recs]


def _baseline_label(algorithm: str, setting: str) -> str:
  name = _runs.ALGORITHM_NAMES.get(algorithm, algorithm)
  return name if setting == REFERENCE else f"{name} {setting}"


_finals = records_lib.final_values


def _style(label: str) -> dict:
  """One colour per setting in every panel (its place among all the settings); the
  baselines dashed, so that a colour shared past the tenth setting stays distinct."""
  labels = [f"VIRTUAL {name}" for name, _ in rp.CALIBRATION_SETTINGS]
  labels += [_baseline_label(a, name) for a, settings in rp.CALIBRATION_BASELINE_SETTINGS.items()
             for name, _ in settings]
  return dict(color=f"C{labels.index(label) % 10}",
              ls="-" if label.startswith("VIRTUAL") else "--")


_mean_se = _runs.mean_se


def _text(values: Sequence[Optional[float]], scale: float = 1.0, digits: int = 3) -> str:
  m, se, n = _mean_se(values, scale)
  if n == 0:
    return "—"
  return f"{m:.{digits}f}" if n == 1 else f"{m:.{digits}f} ± {se:.{digits}f}"


def _client_values(rec: Mapping[str, Any], key: str) -> Optional[List[Optional[float]]]:
  calibration = rec["result"]["summary"].get("final_calibration") or {}
  return calibration.get(key)


def paired_client_share(recs: Sequence[Mapping[str, Any]],
                        baseline: Sequence[Mapping[str, Any]]) -> Optional[float]:
  """The share of (client, seed) pairs whose final MT NLL is below the baseline's on the
  same client and seed (None without a pair)."""
  by_seed = {r["cell"]["seed"]: _client_values(r, "client_mt_nll") for r in baseline}
  wins = total = 0
  for r in recs:
    mine, theirs = _client_values(r, "client_mt_nll"), by_seed.get(r["cell"]["seed"])
    if not mine or not theirs or len(mine) != len(theirs):
      continue
    for a, b in zip(mine, theirs):
      if a is not None and b is not None:
        wins += a < b
        total += 1
  return wins / total if total else None


def _median_client_ece(recs: Sequence[Mapping[str, Any]]) -> Optional[float]:
  values = [v for r in recs for v in (_client_values(r, "client_mt_ece") or []) if v is not None]
  return float(np.median(values)) if values else None


def calibration_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Per row and VIRTUAL setting: final MT NLL at or below FedAvg's mean, at an MT accuracy
  within one standard error of the tuned VIRTUAL's (pending below two seeds of each)."""
  lines = []
  for row in rp.TABLE2_ROWS:
    reference = calibration_records(records, row, "virtual", REFERENCE)
    baseline = calibration_records(records, row, BASELINE, REFERENCE)
    for name, _ in rp.CALIBRATION_SETTINGS:
      recs = calibration_records(records, row, "virtual", name)
      if not recs:
        continue
      text = (f"{row}, VIRTUAL {name}: final MT NLL at or below FedAvg's, MT accuracy within "
              "one s.e. of the tuned VIRTUAL's")
      lines.append(_claim(text, recs, reference, baseline))
  return lines


def _claim(text: str, recs, reference, baseline, name: str = "it", prefix: str = "") -> str:
  """The claim line: `recs`' mean final MT NLL at or below `baseline`'s and their MT
  accuracy within one s.e. of `reference`'s (pending below two seeds of any)."""
  if min(len(recs), len(reference), len(baseline)) < 2:
    return (f"- {text}: pending ({len(recs)}, {len(reference)} and {len(baseline)} seeds of "
            f"{name}, the tuned VIRTUAL and FedAvg recorded).")
  nll = _mean_se(_finals(recs, "mt_loss"))[0]
  nll_base = _mean_se(_finals(baseline, "mt_loss"))[0]
  acc = _mean_se(_finals(recs, "mt_accuracy"), 100)[0]
  acc_ref, se_ref, _ = _mean_se(_finals(reference, "mt_accuracy"), 100)
  verdict = "held" if nll <= nll_base and acc >= acc_ref - se_ref else "not held"
  return (f"- {text}: {verdict} ({prefix}MT NLL {nll:.3f} vs FedAvg {nll_base:.3f}; MT "
          f"accuracy {acc:.2f} vs tuned {acc_ref:.2f} ± {se_ref:.2f} s.e.).")


_LAYERS = ("log_prec_shared_1", "log_prec_private_1")


def calibration_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """The section: one table per row, the per-client table, the claims."""
  lines = _runs.anchor(ANCHOR, "Calibration of VIRTUAL's predictive beside FedAvg's (ours, "
                       "issue 34)")
  lines += [
      f"Tuning protocol (validation split, {rp.TABLE2_ROUNDS['tune']} rounds), each row's tuned "
      "settings; a VIRTUAL setting changes the tuned one only where its name says "
      "(`scale_adam`: `--scale_optimizer=adam --scale_lr=1e-3`; `eval_samples=10`: the Monte "
      "Carlo predictive; `private_kl=1`: `--private_kl_weight=1`, the private weights' KL at "
      "Bayes by backprop's weight instead of beta; `temperature_scaling`: one temperature for "
      "S and one for MT fitted on calibration splits, 20 % of each client's training data "
      "held out, by the summed NLL over the clients, on the log of VIRTUAL's Monte Carlo "
      "probabilities). FOLA runs at FedAvg's tuned client setting (no tuning of its own; its "
      "server takes the Gaussian product, no step): `mean` evaluates S at the server "
      "Gaussian's mean, `laplace_samples=10` as its Laplace predictive (10 draws, "
      "`--laplace_prior_precision=1e4`); its MT is each client's own trained weights in both. "
      "Final round, mean ± standard error over the seeds; log precision "
      "`log(1/sigma^2)` of the first shared and private layer (4.61 is sigma = 0.1, 5.99 the "
      "initial sigma = 0.05).", ""
  ]
  header = ("setting", "seeds", "S acc", "S NLL", "S ECE", "MT acc", "MT NLL", "MT ECE",
            "log prec shared 1", "log prec private 1", "clients with MT NLL below FedAvg's",
            "median client MT ECE")
  any_row = False
  for row in rp.TABLE2_ROWS:
    groups = _groups(records, row)
    if not groups:
      continue
    any_row = True
    baseline = calibration_records(records, row, BASELINE, REFERENCE)
    table = []
    for label, recs in groups:
      share = (paired_client_share(recs, baseline)
               if label != _baseline_label(BASELINE, REFERENCE) else None)
      median = _median_client_ece(recs)
      table.append((label, len(recs), _text(_finals(recs, "server_accuracy"), 100, 2),
                    _text(_finals(recs, "server_loss")), _text(_finals(recs, "server_ece")),
                    _text(_finals(recs, "mt_accuracy"), 100, 2), _text(_finals(recs, "mt_loss")),
                    _text(_finals(recs, "mt_ece")),
                    *[_text(_finals(recs, k), digits=2) for k in _LAYERS],
                    "—" if share is None else f"{100 * share:.0f} %",
                    "—" if median is None else f"{median:.3f}"))
    lines += [f"**{row}**", ""] + _runs.md_table(header, table) + [""]
  if not any_row:
    lines += ["No record yet (`python -m launchers.reproduce --cells='virtual/calibration/*'`).",
              ""]
  claims = calibration_claims(records) + _temperature_lines(records) + _laplace_lines(records)
  return lines + claims + ([""] if claims else []) + table2_markdown(records)


# The post-hoc calibrated settings, each beside the same predictive untempered.
TEMPERED = ((BASELINE, "temperature_scaling", REFERENCE),
            ("virtual", "eval_samples=10,temperature_scaling", "eval_samples=10"))


def _temperature_lines(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Per row and `TEMPERED` pair: what the fitted temperatures did to the MT NLL and ECE,
  and their values."""
  lines = []
  for row in rp.TABLE2_ROWS:
    for algorithm, setting, untempered in TEMPERED:
      plain = calibration_records(records, row, algorithm, untempered)
      tempered = calibration_records(records, row, algorithm, setting)
      if not plain or not tempered:
        continue
      fitted = [r for r in tempered if "mt_temperature" in r["result"]["curves"]]
      temperatures = (f"; final temperature S {_text(_finals(fitted, 'server_temperature'))}, "
                      f"MT {_text(_finals(fitted, 'mt_temperature'))}" if fitted else "")
      lines.append(
          f"- {row}, {_baseline_label(algorithm, untempered)} with fitted temperatures: MT NLL "
          f"{_text(_finals(tempered, 'mt_loss'))} vs {_text(_finals(plain, 'mt_loss'))} "
          f"untempered, MT ECE {_text(_finals(tempered, 'mt_ece'))} vs "
          f"{_text(_finals(plain, 'mt_ece'))}, MT accuracy "
          f"{_text(_finals(tempered, 'mt_accuracy'), 100, 2)} vs "
          f"{_text(_finals(plain, 'mt_accuracy'), 100, 2)} (it trains on 20 % less "
          f"data){temperatures}.")
  return lines


def _laplace_lines(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Per row: what FOLA's Laplace predictive did to its S beside the server Gaussian's mean."""
  lines = []
  (mean, _), (laplace, _) = rp.CALIBRATION_BASELINE_SETTINGS["fola"]
  for row in rp.TABLE2_ROWS:
    plain = calibration_records(records, row, "fola", mean)
    sampled = calibration_records(records, row, "fola", laplace)
    if not plain or not sampled:
      continue
    lines.append(
        f"- {row}, FOLA's Laplace predictive against the mean: S NLL "
        f"{_text(_finals(sampled, 'server_loss'))} vs {_text(_finals(plain, 'server_loss'))}, "
        f"S ECE {_text(_finals(sampled, 'server_ece'))} vs "
        f"{_text(_finals(plain, 'server_ece'))}, S accuracy "
        f"{_text(_finals(sampled, 'server_accuracy'), 100, 2)} vs "
        f"{_text(_finals(plain, 'server_accuracy'), 100, 2)}.")
  return lines


def _table2_groups(records: Mapping[str, Mapping[str, Any]], row: str):
  """`(choice, why, [(label, records)])` of a row on Table II's protocol: the tuned
  VIRTUAL, the chosen setting (`reproduce.calibration_choice`), VIRTUAL's default
  evaluation alone where the choice is another setting, and FedAvg."""
  choice, why = rp.calibration_choice(records, row)
  default = ([(f"VIRTUAL {rp.DEFAULT_EVALUATION} (the default)",
               experiment_records(records, rp.CALIBRATED_EXPERIMENT, row, "virtual",
                                  rp.DEFAULT_EVALUATION))]
             if choice != rp.DEFAULT_EVALUATION else [])
  return choice, why, [
      ("VIRTUAL tuned", experiment_records(records, "table2", row, "virtual", "tuned")),
      (f"VIRTUAL {choice or '(none chosen)'}",
       experiment_records(records, rp.CALIBRATED_EXPERIMENT, row, "virtual", choice)
       if choice else []),
      *default,
      ("FedAvg", experiment_records(records, "table2", row, BASELINE, "tuned"))]


def calibrated_table2_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Per row on Table II's protocol: the chosen setting's MT NLL at or below FedAvg's at
  an MT accuracy within one s.e. of the tuned VIRTUAL's (pending until chosen and run)."""
  claims = []
  for row in rp.TABLE2_ROWS:
    choice, why, groups = _table2_groups(records, row)
    (_, reference), (label, chosen), (_, baseline) = groups[0], groups[1], groups[-1]
    text = f"{row}, Table II protocol: a VIRTUAL setting as calibrated as FedAvg"
    claims.append(f"- {text}: pending ({why})." if not choice else
                  _claim(text, chosen, reference, baseline, label, f"{label}: "))
  return claims


def table2_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Item 4: each row's chosen setting on Table II's protocol beside Table II's tuned
  VIRTUAL and FedAvg cells (`_table2_groups`), and `calibrated_table2_claims`."""
  lines = [f"**On Table II's protocol** (test split, {rp.TABLE2_ROUNDS['final']} rounds, "
           "final round, mean ± s.e. over the seeds): each row's chosen setting, the "
           "calibration setting above with the lowest MT NLL below the tuned one's at an MT "
           "accuracy within one s.e. of it.", ""]
  header = ("row", "setting", "seeds", "S acc", "S NLL", "S ECE", "MT acc", "MT NLL", "MT ECE")
  table = []
  for row in rp.TABLE2_ROWS:
    for label, recs in _table2_groups(records, row)[2]:
      if recs:
        table.append((row, label, len(recs), *[
            _text(_finals(recs, k), scale, digits) for k, scale, digits in (
                ("server_accuracy", 100, 2), ("server_loss", 1, 3), ("server_ece", 1, 3),
                ("mt_accuracy", 100, 2), ("mt_loss", 1, 3), ("mt_ece", 1, 3))]))
  claims = calibrated_table2_claims(records)
  return lines + (_runs.md_table(header, table) + [""] if table else []) + claims + [""]


def _reliability(recs: Sequence[Mapping[str, Any]], key: str) -> Optional[np.ndarray]:
  bins = [(r["result"]["summary"].get("final_calibration") or {}).get(key) for r in recs]
  bins = [np.asarray(b, np.float64) for b in bins if b is not None]
  return sum(bins) if bins else None


def plot_reliability(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """Reliability diagrams: per row, S and MT accuracy against mean confidence per bin
  (marker area by the bin's share of the examples)."""
  rows = [row for row in rp.TABLE2_ROWS
          if any(_reliability(recs, "mt_bins") is not None for _, recs in _groups(records, row))]
  if not rows:
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(len(rows), 2, figsize=(10, 4 * len(rows)), squeeze=False)
  for axes_row, row in zip(axes, rows):
    for ax, (key, name) in zip(axes_row, (("server_bins", "S"), ("mt_bins", "MT"))):
      ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
      for label, recs in _groups(records, row):
        bins = _reliability(recs, key)
        if bins is None:
          continue
        count, conf, correct = bins
        # Sparse bins zig-zag: markers sized by each bin's share of the examples.
        used = count > 0
        ax.plot(conf[used] / count[used], correct[used] / count[used], lw=1, label=label,
                **_style(label))
        ax.scatter(conf[used] / count[used], correct[used] / count[used],
                   s=4 + 200 * count[used] / count.sum(), color=_style(label)["color"])
      _runs.label_axes(ax, "confidence", "accuracy", f"{row}: {name} reliability")
  _runs.save_figure(fig, path, tight=True)
  return True


def plot_variances(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """Variance trajectories: per row, the first shared and private layer's mean log precision
  per round, one line per VIRTUAL setting (mean over seeds)."""
  rows = [row for row in rp.TABLE2_ROWS
          if any(recs and _LAYERS[0] in recs[0]["result"]["curves"]
                 for label, recs in _groups(records, row) if label.startswith("VIRTUAL"))]
  if not rows:
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3.8 * len(rows)), squeeze=False)
  for axes_row, row in zip(axes, rows):
    for ax, key in zip(axes_row, _LAYERS):
      for label, recs in _groups(records, row):
        curves = [r["result"]["curves"] for r in recs if key in r["result"]["curves"]]
        if not curves:
          continue
        length = min(len(c[key]) for c in curves)
        values = np.array([[np.nan if v is None else v for v in c[key][:length]] for c in curves])
        ax.plot(curves[0]["round"][:length], np.nanmean(values, axis=0), label=label,
                **_style(label))
      _runs.label_axes(ax, "round", "mean log precision", f"{row}: {key[len('log_prec_'):]}")
  _runs.save_figure(fig, path, tight=True)
  return True


FIGURES = (("virtual_reliability.png", plot_reliability), ("virtual_variances.png",
                                                           plot_variances))

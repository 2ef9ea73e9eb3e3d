"""The reproduction report: the papers' tables, claims and figures, and a coverage
table, rebuilt from the campaign's records alone (`tfbfl.experiments.reproduce`).

`write_report` writes `<results_dir>/REPORT.md`, `<results_dir>/figures/*.png` and the
README's reproduction block. Every number is read from a record; nothing here runs
a cell. This module imports neither TensorFlow nor absl.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfbfl import experiment
from tfbfl.experiments import _runs
from tfbfl.experiments import reproduce as rp

# The windows `_late_rise` compares: the last LATE_WINDOW evaluated rounds against
# the LATE_WINDOW before them.
LATE_WINDOW = 10


def _late_rise(rec: Mapping[str, Any], key: str) -> float:
  """Mean of curve `key` over the last `LATE_WINDOW` evaluated rounds minus its mean
  over the `LATE_WINDOW` before them (nan when the curve is shorter than both)."""
  vals = rp.curve_values(rec, key)
  if len(vals) < 2 * LATE_WINDOW:
    return float("nan")
  return float(np.mean(vals[-LATE_WINDOW:]) - np.mean(vals[-2 * LATE_WINDOW:-LATE_WINDOW]))


def _mean_std(values: Sequence[float], scale: float = 1.0) -> Tuple[float, float, int]:
  v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float) * scale
  if not len(v):
    return float("nan"), float("nan"), 0
  return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v)


def _pm(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
  m, s, n = _mean_std(values, scale)
  if n == 0:
    return "—"
  if n == 1:  # no spread to show: the seeds column says 1
    return f"{m:.{digits}f}"
  return f"{m:.{digits}f} ± {s:.{digits}f}"


def _cell_records(records: Mapping[str, Mapping[str, Any]], experiment_name: str, row: str,
                  algorithm: str) -> List[Mapping[str, Any]]:
  """The records of one experiment's row and algorithm, by seed."""
  return sorted((r for r in records.values()
                 if (r["cell"]["experiment"], r["cell"]["row"], r["cell"]["algorithm"]) ==
                 (experiment_name, row, algorithm)), key=lambda r: r["cell"]["seed"])


def table2_summary(records: Mapping[str, Mapping[str, Any]]) -> Dict[Tuple[str, str], Dict]:
  """(row, algorithm) -> the tuned cells' metrics lists over seeds, and their setting."""
  out = {}
  for row in rp.TABLE2_ROWS:
    for alg in rp.TABLE2_ALGORITHMS:
      recs = _cell_records(records, "table2", row, alg)
      m = dict(records=recs, seeds=[r["cell"]["seed"] for r in recs])
      for key in ("server_accuracy", "mt_accuracy"):
        m[f"best_{key}"] = [rp.best_value(r, key) for r in recs]
        m[f"final_{key}"] = [rp.final_value(r, key) for r in recs]
        m[f"late_rise_{key}"] = [_late_rise(r, key) for r in recs]
      for key in ("server_loss", "mt_loss", "server_ece", "mt_ece"):
        m[f"final_{key}"] = [rp.final_value(r, key) for r in recs]
      m["rounds"] = sorted({r["flags"].get("rounds") for r in recs})
      m["setting"] = ({k: v for k, v in recs[0]["flags"].items() if k in rp.setting_keys(row, alg)}
                      if recs else {})
      m["hours"] = sum(float(r["wall_time_s"]) for r in recs) / 3600
      out[(row, alg)] = m
  return out


def table2_claims(summary: Mapping[Tuple[str, str], Mapping[str, Any]]) -> List[str]:
  """VIRTUAL's claims per row: MT above FedAvg's and FedProx's (MNIST, FEMNIST), the
  PMNIST exception (VIRTUAL below FedAvg on S and MT), S comparable (within 1 pp). A
  difference in MT must exceed its standard error over the seeds to count."""
  lines = []
  for row in rp.TABLE2_ROWS:
    v = summary[(row, "virtual")]
    for base in ("fedavg", "fedprox"):
      b = summary[(row, base)]
      vm, vsd, vn = _mean_std(v["best_mt_accuracy"], 100)
      bm, bsd, bn = _mean_std(b["best_mt_accuracy"], 100)
      vs, _, _ = _mean_std(v["best_server_accuracy"], 100)
      bs, _, _ = _mean_std(b["best_server_accuracy"], 100)
      if vn < 3 or bn < 3:
        lines.append(f"- {row}, VIRTUAL vs {base}: pending ({vn} and {bn} of 3 seeds recorded).")
        continue
      diff, se = _runs.mean_difference((vm, vsd, vn), (bm, bsd, bn))
      margin = f"difference {diff:+.2f} pp, standard error {se:.2f}"
      if row == "pmnist":
        held = _runs.beyond_error(diff, se) < 0
        lines.append(f"- {row}: the paper's exception (VIRTUAL's MT below {base}'s): "
                     f"{'held' if held else 'not held'} (MT {vm:.1f} vs {bm:.1f}; {margin}).")
      else:
        held = _runs.beyond_error(diff, se) > 0
        lines.append(f"- {row}: VIRTUAL's MT above {base}'s: {'held' if held else 'not held'} "
                     f"(MT {vm:.1f} vs {bm:.1f}, best over rounds, mean of {vn} seeds; {margin}).")
      comparable = vs >= bs - _runs.S_COMPARABLE_PP
      lines.append(f"- {row}: S comparable to {base}'s (within {_runs.S_COMPARABLE_PP:g} pp or above): "
                   f"{'held' if comparable else 'not held'} (S {vs:.1f} vs {bs:.1f}).")
  return lines


def table2_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  summary = table2_summary(records)
  header = ("row", "algorithm", "S paper", "S ours (max)", "S final", "MT paper", "MT ours (max)",
            "MT final", "NLL S / MT", "ECE S / MT", "seeds", "rounds", "setting")
  rows = []
  for (row, alg), m in summary.items():
    paper = rp.VIRTUAL_TABLE2.get(row, {})
    rows.append((row, alg, paper.get("S", {}).get(alg, "—"), _pm(m["best_server_accuracy"]),
                 _pm(m["final_server_accuracy"]), paper.get("MT", {}).get(alg, "—"),
                 _pm(m["best_mt_accuracy"]), _pm(m["final_mt_accuracy"]),
                 f"{_pm(m['final_server_loss'], 1, 3)} / {_pm(m['final_mt_loss'], 1, 3)}",
                 f"{_pm(m['final_server_ece'], 1, 3)} / {_pm(m['final_mt_ece'], 1, 3)}",
                 len(m["seeds"]), ",".join(str(r) for r in m["rounds"]) or "—",
                 rp.setting_name(m["setting"]) if m["seeds"] else "—"))
  lines = ["### VIRTUAL Table II (accuracy %, mean ± std over seeds)", ""]
  lines += _runs.md_table(header, rows)
  lines += ["", "Claims:", ""] + table2_claims(summary)
  lines += ["", f"Still rising at the last round? Mean accuracy over the last {LATE_WINDOW} "
            f"rounds minus the mean over the {LATE_WINDOW} before them, pp (mean ± std over "
            "seeds; near 0: converged, > 0: still rising):", ""]
  lines += _runs.md_table(("row", "algorithm", "S", "MT"), [
      (row, alg, _pm(m["late_rise_server_accuracy"], 100, 2), _pm(m["late_rise_mt_accuracy"], 100, 2))
      for (row, alg), m in summary.items() if m["seeds"]])
  lines += ["", "Tuning (seed 0, validation split of each client's training data, "
            f"{rp.TABLE2_ROUNDS['tune']} rounds; best-round validation MT accuracy %; the chosen "
            "setting in bold, † where a value sits on its grid's edge):", ""]
  trows = []
  for row in rp.TABLE2_ROWS:
    for alg in rp.TABLE2_ALGORITHMS:
      tun = sorted(_cell_records(records, "tune", row, alg), key=lambda r: r["cell"]["setting"])
      if tun:
        chosen = tun[rp.best_tuning_index(tun)]
        cells = []
        for r in tun:
          text = f"{r['cell']['setting']}: {rp.score_text(r)}"
          if r is chosen:
            edge = any(r["flags"][k] in (min(v), max(v))
                       for k, v in rp.tuning_axes(row, alg).items()
                       if len(v) > 1)
            text = f"**{text}**" + (" †" if edge else "")
          cells.append(text)
        trows.append((row, alg, "; ".join(cells)))
      if rp.step_stage(row, alg):
        trows += _step_stage_rows(records, row, alg)
  lines += _runs.md_table(("row", "algorithm", "setting: validation MT"), trows)
  return lines


def _step_stage_rows(records: Mapping[str, Mapping[str, Any]], row: str,
                     algorithm: str) -> List[Tuple[str, str, str]]:
  """The server step's stage as a tuning-table row, steps in `rp.STEP_STAGE` order."""
  grid, _ = rp.grid_setting(records, row, algorithm)
  if grid is None:
    return []
  chosen, _ = rp.tuned_setting(records, row, algorithm)
  steps = rp.STEP_STAGE[algorithm]
  cells = []
  for step in steps:
    rec = records.get(rp.step_cell(row, algorithm, step, grid, "").name)
    if rec is None:
      continue
    label = step if step == rp.DEFAULT_STEP else rp.setting_name(dict(server_lr=step))
    text = f"{label}: {rp.score_text(rec)}"
    if chosen == rp.step_setting(grid, step):
      text = f"**{text}**" + (" †" if step in (steps[0], steps[-1]) else "")
    cells.append(text)
  return [(row, f"{algorithm}: server step", "; ".join(cells))] if cells else []


def ablation_records(records: Mapping[str, Mapping[str, Any]],
                     row: str) -> Dict[str, List[Mapping[str, Any]]]:
  """Knob name -> its recorded runs; "tuned" at seed 0 is the chosen tuning cell's."""
  by_name: Dict[str, List[Mapping[str, Any]]] = {name: [] for name, _ in rp.ABLATIONS}
  chosen, _ = rp.grid_setting(records, row, "virtual")
  if chosen is not None:
    by_name["tuned"].append(records[rp.grid_cell(row, "virtual", chosen).name])
  for r in _cell_records(records, "ablate", row, "virtual"):
    by_name[r["cell"]["setting"]].append(r)
  return by_name


def _difference_rows(by_name: Mapping[str, Sequence[Mapping[str, Any]]],
                     ref: str) -> List[Tuple[Any, ...]]:
  """One row per name: best S and MT, the MT difference to `ref` with its standard
  error over the seeds, final MT NLL and ECE, and the number of seeds."""
  ref_mt = _mean_std([rp.best_value(r, "mt_accuracy") for r in by_name[ref]], 100)
  rows = []
  for name, recs in by_name.items():
    mt = _mean_std([rp.best_value(r, "mt_accuracy") for r in recs], 100)
    diff = "—"
    if name != ref and mt[2] and ref_mt[2]:
      d, se = _runs.mean_difference(mt, ref_mt)
      diff = f"{d:+.2f} ± {se:.2f}" if min(mt[2], ref_mt[2]) > 1 else f"{d:+.2f} (1 seed: no s.e.)"
    halted = sum(bool(rp.stopped(r)) for r in recs)
    label = f"{name} (rp.stopped: {halted} of {len(recs)} seeds)" if halted else name
    rows.append((label, _pm([rp.best_value(r, "server_accuracy") for r in recs]),
                 _pm([rp.best_value(r, "mt_accuracy") for r in recs]), diff,
                 _pm([rp.final_value(r, "mt_loss") for r in recs], 1, 3),
                 _pm([rp.final_value(r, "mt_ece") for r in recs], 1, 3), len(recs)))
  return rows


_DIFFERENCE_HEADER = ("S (max)", "MT (max)", "MT − {ref}, pp (± s.e.)", "MT NLL final",
                      "MT ECE final", "seeds")


def _difference_section(title: str, first: str, by_name: Mapping[str, Sequence[Mapping[str, Any]]],
                        ref: str, ref_short: str) -> List[str]:
  header = (first,) + tuple(h.format(ref=ref_short) for h in _DIFFERENCE_HEADER)
  return [f"### {title}", ""] + _runs.md_table(header, _difference_rows(by_name, ref)) + [""]


def ablation_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """VIRTUAL's knobs beside its tuned setting: best validation S and MT, final MT NLL
  and ECE, and the MT difference to "tuned" with its standard error over the seeds."""
  lines = []
  for row in rp.ABLATION_ROWS:
    by_name = ablation_records(records, row)
    if any(by_name.values()):
      lines += _difference_section(
          f"VIRTUAL's knobs on {row} (validation split, {rp.TABLE2_ROUNDS['tune']} rounds, each "
          "changed alone from the tuning grid's setting, whose step is the default 1/C; "
          "accuracy %)", "knob", by_name, "tuned", "tuned")
  return lines


def default_step_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Table II's cells at the tuned server step beside the default step (test split)."""
  lines = []
  for row in rp.STEP_STAGE_ROWS:
    for algorithm in rp.TABLE2_ALGORITHMS:
      default = f"default step {rp.DEFAULT_STEP_TEXT[algorithm]}"
      by_name = {default: _cell_records(records, "default_step", row, algorithm),
                 "tuned step": _cell_records(records, "table2", row, algorithm)}
      if by_name[default]:
        tuned = by_name["tuned step"]
        step = tuned[0]["flags"].get("server_lr") if tuned else None
        lines += _difference_section(
            f"{_runs.ALGORITHM_NAMES[algorithm]}'s server step on {row}, Table II's protocol (test split, "
            f"{rp.TABLE2_ROUNDS['final']} rounds; tuned step: {rp.fmt_number(step) if step else '—'}; "
            "accuracy %)", "step", by_name, default, "default")
  return lines


def pfnm_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  acc: Dict[Tuple[str, int, str], List[float]] = {}
  for r in records.values():
    if r["cell"]["paper"] != "pfnm":
      continue
    J = int(r["flags"]["J"])
    for row in r["result"]["rows"]:
      acc.setdefault((r["cell"]["row"], J, row["method"]), []).append(float(row["accuracy"]))
  lines = ["### PFNM: test accuracy % vs number of batches J (MNIST, mean ± std over trials)", ""]
  header = ("partition", "J") + rp.PFNM_METHODS + ("trials",)
  rows = []
  for part in rp.PFNM_PARTITIONS:
    for J in rp.PFNM_J:
      vals = [acc.get((part, J, m), []) for m in rp.PFNM_METHODS]
      if any(vals):
        rows.append((part, J) + tuple(_pm(v) for v in vals) + (max(len(v) for v in vals),))
  lines += _runs.md_table(header, rows)
  claims = []
  for part in rp.PFNM_PARTITIONS:
    pts = [(J, np.mean(acc[(part, J, "pfnm")]), np.mean(acc[(part, J, "fedavg_shared")]),
            np.mean(acc[(part, J, "local")])) for J in rp.PFNM_J
           if acc.get((part, J, "pfnm")) and acc.get((part, J, "fedavg_shared")) and
           acc.get((part, J, "local"))]
    if pts:
      wins = sum(p > max(f, l) for _, p, f, l in pts)
      claims.append(f"- {part}: PFNM above one-shot FedAvg and the local networks at "
                    f"{wins} of {len(pts)} J values recorded "
                    f"({'held' if wins == len(pts) else 'not held'}; the paper: at every J, "
                    "Fig. 2).")
    ens = [(J, np.mean(acc[(part, J, "pfnm")]),
            max(np.mean(acc[(part, J, m)]) for m in ("uniform_ensemble", "weighted_ensemble")))
           for J in rp.PFNM_J if acc.get((part, J, "pfnm")) and
           acc.get((part, J, "uniform_ensemble")) and acc.get((part, J, "weighted_ensemble"))]
    if ens:
      close = [J for J, p, e in ens if p >= e - 0.01]
      worst = min(ens, key=lambda t: t[1] - t[2])
      claims.append(f"- {part}: PFNM within 1 pp of the better ensemble (the paper: "
                    f"\"competitive\" with them, Fig. 3) at {len(close)} of {len(ens)} J values "
                    f"({'held' if len(close) == len(ens) else 'not held'}; largest gap at "
                    f"J = {worst[0]}: {100 * worst[1]:.1f} vs {100 * worst[2]:.1f}).")
  return lines + ["", "Claims:", ""] + (claims or ["- pending (no records)."])


def fola_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  acc: Dict[Tuple[float, str], List[float]] = {}
  for r in records.values():
    if r["cell"]["experiment"] != "first_round":
      continue
    for row in r["result"]["rows"]:
      acc.setdefault((float(row["alpha"]), row["method"]), []).append(float(row["global_accuracy"]))
  lines = [
      "### FOLA: first-round global accuracy % vs alpha (MNIST-MLP 784-500-300-10, "
      f"N = {rp.FOLA_BASE['num_clients']}, E = {rp.FOLA_BASE['epochs_per_round']}, "
      f"lr = {rp.FOLA_BASE['client_lr']}, B = {rp.FOLA_BASE['batch_size']})", ""
  ]
  rows = []
  for a in rp.FOLA_ALPHAS:
    vals = [acc.get((a, m), []) for m in rp.FOLA_METHODS]
    if any(vals):
      rows.append((rp.fmt_number(a),) + tuple(_pm(v) for v in vals) + (max(len(v) for v in vals),))
  lines += _runs.md_table(("alpha",) + rp.FOLA_METHODS + ("repeats",), rows)
  claims = []
  small = [a for a in rp.FOLA_ALPHAS if a <= 0.1 and acc.get((a, "fola")) and acc.get((a, "fedavg"))]
  for a in small:
    f, g = np.mean(acc[(a, "fola")]), np.mean(acc[(a, "fedavg")])
    claims.append(f"- alpha = {rp.fmt_number(a)}: FOLA's first-round GA above FedAvg's: "
                  f"{'held' if f > g else 'not held'} ({100 * f:.1f} vs {100 * g:.1f}).")
  if acc and all(acc.get((a, "fedcurv")) == acc.get((a, "fedavg")) for a in rp.FOLA_ALPHAS):
    lines += ["", "FedCurv's first round is FedAvg's: its penalty is weighted by the other "
              "clients' Fisher information from earlier rounds, zero before round 1 (floored "
              "at 1e-30), so the two columns agree; they part from round 2 (the learning "
              "curves)."]
  curves = [r for r in records.values() if r["cell"]["experiment"] == "curves"]
  if curves:
    lines += ["", f"Learning curves (alpha = 0.01, N = 20, E = 5, lr = 0.01, "
              f"{rp.FOLA_CURVE_ROUNDS} rounds): best GA % over rounds", ""]
    best: Dict[str, List[float]] = {}
    for r in curves:
      for m, res in r["result"]["methods"].items():
        best.setdefault(m, []).append(rp.best_value({"result": res}, "server_accuracy"))
    lines += _runs.md_table(("method", "best GA", "repeats"),
                            [(m, _pm(v), len(v)) for m, v in sorted(best.items())])
  return lines + ["", "Claims:", ""] + (claims or ["- pending (no records)."])


def _mean_curve(curves: Sequence[Mapping[str, Any]], key: str) -> Tuple[np.ndarray, np.ndarray]:
  """(rounds, mean of `key` over `curves`) on the rounds every curve reached, the
  rounds without an evaluation (`--eval_every`) left out."""
  values = [[np.nan if v is None else v for v in c[key]] for c in curves]
  n = min(len(v) for v in values)
  mean = np.nanmean(np.array([v[:n] for v in values], dtype=float), axis=0)
  ok = np.isfinite(mean)
  return np.array(curves[0]["round"][:n])[ok], mean[ok]


def plot_table2_curves(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """S and MT test accuracy per round (mean over seeds), one column per row of Table II,
  VIRTUAL and its baselines on the same axes. False if there is nothing to plot."""
  summary = table2_summary(records)
  rows = [row for row in rp.TABLE2_ROWS if any(summary[(row, a)]["records"]
                                            for a in rp.TABLE2_ALGORITHMS)]
  if not rows:
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(2, len(rows), figsize=(4.5 * len(rows), 7), squeeze=False)
  for j, row in enumerate(rows):
    for alg in rp.TABLE2_ALGORITHMS:
      recs = summary[(row, alg)]["records"]
      if not recs:
        continue
      for i, key in enumerate(("server_accuracy", "mt_accuracy")):
        axes[i][j].plot(*_mean_curve([r["result"]["curves"] for r in recs], key),
                        label=f"{alg} ({len(recs)} seeds)")
    for i, label in enumerate(("S accuracy", "MT accuracy")):
      axes[i][j].set_title(f"{row}: {label}")
      axes[i][j].set_xlabel("round")
      axes[i][j].grid(alpha=0.3)
      axes[i][j].legend(fontsize=8)
  _runs.save_figure(fig, path, tight=True)
  return True


def plot_pfnm(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  acc: Dict[Tuple[str, int, str], List[float]] = {}
  for r in records.values():
    if r["cell"]["paper"] == "pfnm":
      for row in r["result"]["rows"]:
        acc.setdefault((r["cell"]["row"], int(r["flags"]["J"]), row["method"]),
                       []).append(float(row["accuracy"]))
  if not acc:
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(1, len(rp.PFNM_PARTITIONS), figsize=(11, 4), squeeze=False)
  for j, part in enumerate(rp.PFNM_PARTITIONS):
    for m in rp.PFNM_METHODS:
      pts = [(J, np.mean(acc[(part, J, m)])) for J in rp.PFNM_J if (part, J, m) in acc]
      if pts:
        axes[0][j].plot(*zip(*pts), marker="o", label=m)
    axes[0][j].set_title(f"MNIST {part}")
    axes[0][j].set_xlabel("number of batches J")
    axes[0][j].set_ylabel("test accuracy")
    axes[0][j].grid(alpha=0.3)
    axes[0][j].legend(fontsize=8)
  _runs.save_figure(fig, path, tight=True)
  return True


def plot_fola(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  acc: Dict[Tuple[float, str], List[float]] = {}
  for r in records.values():
    if r["cell"]["experiment"] == "first_round":
      for row in r["result"]["rows"]:
        acc.setdefault((float(row["alpha"]), row["method"]),
                       []).append(float(row["global_accuracy"]))
  if not acc:
    return False
  plt = _runs.pyplot()
  fig, ax = plt.subplots(figsize=(5.5, 4))
  for m in rp.FOLA_METHODS:
    pts = [(a, np.mean(acc[(a, m)])) for a in rp.FOLA_ALPHAS if (a, m) in acc]
    if pts:
      ax.plot(*zip(*pts), marker="o", label=m)
  ax.set_xscale("log")
  _save_single(fig, ax, path, "alpha (Dirichlet concentration)", "first-round global accuracy",
               "FOLA Fig. 2a, MNIST-MLP")
  return True


def _save_single(fig, ax, path: str, xlabel: str, ylabel: str, title: str) -> None:
  """Labels, grid and legend of a one-panel figure, then writes it to `path`."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  _runs.save_figure(fig, path, tight=True)


def plot_fola_curves(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """FOLA's Fig. 3a: global accuracy per round at alpha 0.01, one line per method
  (mean over repeats). False if there is nothing to plot."""
  by_method: Dict[str, List[Mapping[str, Any]]] = {}
  for r in records.values():
    if r["cell"]["paper"] == "fola" and r["cell"]["experiment"] == "curves":
      for m, res in r["result"]["methods"].items():
        by_method.setdefault(m, []).append(res["curves"])
  if not by_method:
    return False
  plt = _runs.pyplot()
  fig, ax = plt.subplots(figsize=(5.5, 4))
  for m, curves in sorted(by_method.items()):
    ax.plot(*_mean_curve(curves, "server_accuracy"), label=f"{m} ({len(curves)} repeats)")
  _save_single(fig, ax, path, "round", "global accuracy", "FOLA Fig. 3a, MNIST-MLP, alpha = 0.01")
  return True


FIGURES = (("table2_curves.png", plot_table2_curves), ("pfnm_j_sweep.png", plot_pfnm),
           ("fola_first_round.png", plot_fola), ("fola_curves.png", plot_fola_curves))
README_BEGIN = "<!-- reproduction:begin (written by `python -m launchers.reproduce --report`) -->"
README_END = "<!-- reproduction:end -->"


def report_markdown(records: Mapping[str, Mapping[str, Any]], figures: Iterable[str],
                    figure_prefix: str = "figures/") -> str:
  """The report: the three papers' tables, claims, figures and provenance."""
  commits = sorted({r.get("git_commit") or "unknown" for r in records.values()})
  hours = sum(float(r["wall_time_s"]) for r in records.values()) / 3600
  cores = sorted({r["machine"].get("cores") for r in records.values()})
  lines = [
      f"{len(records)} cell records under `results/` ({hours:.1f} CPU-wall hours on "
      f"{'/'.join(str(c) for c in cores) or '?'}-core machines), from commits "
      f"{', '.join(c[:7] for c in commits) or '—'}. Every number below is rebuilt from the "
      "records alone by `python -m launchers.reproduce --report`; each record holds its "
      "cell's command.", ""
  ]
  lines += table2_markdown(records) + [""]
  lines += default_step_markdown(records)
  lines += ablation_markdown(records)
  lines += pfnm_markdown(records) + [""]
  lines += fola_markdown(records) + [""]
  for name in figures:
    lines.append(f"![{name}]({figure_prefix}{name})")
  return "\n".join(lines).rstrip() + "\n"


def write_report(results_dir: str, readme: Optional[str] = None) -> str:
  """Writes `<results_dir>/REPORT.md` and `<results_dir>/figures/*.png` from the records;
  with `readme`, also replaces the block between `README_BEGIN` and `README_END` in
  that file (ValueError if the markers are missing). Returns the report's text."""
  records = rp.read_records(results_dir)
  figures = []
  for name, plot in FIGURES:
    if plot(os.path.join(results_dir, "figures", name), records):
      figures.append(name)
  text = report_markdown(records, figures)
  experiment.atomic_write_text(os.path.join(results_dir, "REPORT.md"),
                               "# Reproduction report\n\n" + text)
  if readme is not None:
    with open(readme) as f:
      current = f.read()
    if README_BEGIN not in current or README_END not in current:
      raise ValueError(f"{readme}: no reproduction block ({README_BEGIN!r} ... {README_END!r}).")
    head, rest = current.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    prefix = os.path.relpath(os.path.join(results_dir, "figures"),
                             os.path.dirname(os.path.abspath(readme))) + "/"
    block = report_markdown(records, figures, figure_prefix=prefix)
    experiment.atomic_write_text(readme, head + README_BEGIN + "\n" + block + README_END + tail)
  return text

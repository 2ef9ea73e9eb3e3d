"""The reproduction report: the papers' tables, claims and figures, and a coverage
table, rebuilt from the campaign's records alone (`tfbfl.experiments.records`) of the
catalogue's cells (`tfbfl.experiments.reproduce`).

`write_report` writes `<results_dir>/REPORT.md`, `<results_dir>/figures/*.png` and the
reproduction block of docs/reproduction.md (the launcher's `--readme`). Every number is
read from a record; nothing here runs a cell. This module imports neither TensorFlow
nor absl.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfbfl import round_loop
from tfbfl.experiments import _runs
from tfbfl.experiments import calibration_report
from tfbfl.experiments import records as records_lib
from tfbfl.experiments import reproduce as rp
from tfbfl.experiments import runner

# The windows `_late_rise` compares: the last LATE_WINDOW evaluated rounds against
# the LATE_WINDOW before them.
LATE_WINDOW = 10


def _late_rise(rec: Mapping[str, Any], key: str) -> float:
  """Mean of curve `key` over the last `LATE_WINDOW` evaluated rounds minus its mean
  over the `LATE_WINDOW` before them (nan when the curve is shorter than both)."""
  vals = records_lib.curve_values(rec, key)
  if len(vals) < 2 * LATE_WINDOW:
    return float("nan")
  return float(np.mean(vals[-LATE_WINDOW:]) - np.mean(vals[-2 * LATE_WINDOW:-LATE_WINDOW]))


_mean_std = _runs.mean_std


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
        m[f"best_{key}"] = [records_lib.best_value(r, key) for r in recs]
        m[f"final_{key}"] = [records_lib.final_value(r, key) for r in recs]
        m[f"late_rise_{key}"] = [_late_rise(r, key) for r in recs]
      for key in ("server_loss", "mt_loss", "server_ece", "mt_ece"):
        m[f"final_{key}"] = [records_lib.final_value(r, key) for r in recs]
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
  lines = _anchor("virtual-table-ii", "VIRTUAL Table II (accuracy %, mean ± std over seeds)")
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
          text = f"{r['cell']['setting']}: {records_lib.score_text(r)}"
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
    text = f"{label}: {records_lib.score_text(rec)}"
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
  ref_mt = _mean_std([records_lib.best_value(r, "mt_accuracy") for r in by_name[ref]], 100)
  rows = []
  for name, recs in by_name.items():
    mt = _mean_std([records_lib.best_value(r, "mt_accuracy") for r in recs], 100)
    diff = "—"
    if name != ref and mt[2] and ref_mt[2]:
      d, se = _runs.mean_difference(mt, ref_mt)
      diff = f"{d:+.2f} ± {se:.2f}" if min(mt[2], ref_mt[2]) > 1 else f"{d:+.2f} (1 seed: no s.e.)"
    halted = sum(bool(records_lib.stopped(r)) for r in recs)
    label = f"{name} (stopped: {halted} of {len(recs)} seeds)" if halted else name
    rows.append((label, _pm([records_lib.best_value(r, "server_accuracy") for r in recs]),
                 _pm([records_lib.best_value(r, "mt_accuracy") for r in recs]), diff,
                 _pm([records_lib.final_value(r, "mt_loss") for r in recs], 1, 3),
                 _pm([records_lib.final_value(r, "mt_ece") for r in recs], 1, 3), len(recs)))
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


PFNM_J_METHODS = rp.PFNM_METHODS + rp.PFNM_EXTRA_METHODS


def pfnm_j_rows(records: Mapping[str, Mapping[str, Any]],
                experiments: Sequence[str] = ("j_sweep", "extra")
                ) -> Dict[Tuple[str, int, str], List[Mapping[str, Any]]]:
  """(partition, J, method) -> the trials' rows (accuracy, neurons, params) of PFNM's
  one-shot experiments vs J."""
  out: Dict[Tuple[str, int, str], List[Mapping[str, Any]]] = {}
  for r in records.values():
    if r["cell"]["paper"] == "pfnm" and r["cell"]["experiment"] in experiments:
      for row in r["result"]["rows"]:
        out.setdefault((r["cell"]["row"], int(row["J"]), row["method"]), []).append(row)
  return out


def _column(rows: Sequence[Mapping[str, Any]], key: str) -> List[float]:
  return [float(r[key]) for r in rows]


def _mean_of(rows: Sequence[Mapping[str, Any]], key: str) -> float:
  return float(np.mean(_column(rows, key)))


def pfnm_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Figs. 2 and 3: PFNM above the constrained baselines at every J, a global model below
  the 100 J neurons of stacking the batch networks (the sizes printed: they saturate at
  the 700-neuron truncation), and competitive (within 1 pp or above) with the
  extra-resource baselines."""
  acc = pfnm_j_rows(records)
  claims = []
  for part in rp.PFNM_PARTITIONS:
    pts = [(J, _mean_of(acc[(part, J, "pfnm")], "accuracy"),
            _mean_of(acc[(part, J, "fedavg_shared")], "accuracy"),
            _mean_of(acc[(part, J, "local")], "accuracy")) for J in rp.PFNM_J
           if acc.get((part, J, "pfnm")) and acc.get((part, J, "fedavg_shared")) and
           acc.get((part, J, "local"))]
    if pts:
      wins = sum(p > max(f, l) for _, p, f, l in pts)
      claims.append(_claim(wins == len(pts), f"{part}: PFNM above one-shot FedAvg and the local "
                           "networks at every J (Fig. 2)", f"at {wins} of {len(pts)} J values"))
    sizes = [(J, _mean_of(acc[(part, J, "pfnm")], "neurons")) for J in rp.PFNM_J
             if acc.get((part, J, "pfnm"))]
    if sizes:
      claims.append(_claim(all(n < 100 * J for J, n in sizes),
                           f"{part}: PFNM's global model smaller than the 100 J neurons of the "
                           "stacked batch networks at every J (Fig. 2b/d, \"significant "
                           "compression\")", "; ".join(f"J = {J}: {n:.0f} of {100 * J}"
                                                       for J, n in sizes)))
    for m in ("uniform_ensemble", "weighted_ensemble") + rp.PFNM_EXTRA_METHODS:
      ens = [(J, _mean_of(acc[(part, J, "pfnm")], "accuracy"),
              _mean_of(acc[(part, J, m)], "accuracy")) for J in rp.PFNM_J
             if acc.get((part, J, "pfnm")) and acc.get((part, J, m))]
      if ens:
        close = [J for J, p, e in ens if p >= e - 0.01]
        worst = min(ens, key=lambda t: t[1] - t[2])
        claims.append(_claim(len(close) == len(ens), f"{part}: PFNM competitive with {m} "
                             "(within 1 pp or above; Fig. 3)",
                             f"at {len(close)} of {len(ens)} J values; largest gap at J = "
                             f"{worst[0]}: {100 * worst[1]:.1f} vs {100 * worst[2]:.1f}"))
  return claims


def pfnm_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  acc = pfnm_j_rows(records)
  lines = _anchor("pfnm-figs-2-3", "PFNM Figs. 2-3: test accuracy % vs number of batches J "
                  "(MNIST, mean ± std over trials), and PFNM's global model size")
  header = ("partition", "J") + PFNM_J_METHODS + ("PFNM neurons (of 100 J)", "PFNM params",
                                                  "trials")
  rows = []
  for part in rp.PFNM_PARTITIONS:
    for J in rp.PFNM_J:
      vals = [acc.get((part, J, m), []) for m in PFNM_J_METHODS]
      if any(vals):
        own = acc.get((part, J, "pfnm"), [])
        rows.append((part, J) + tuple(_pm(_column(v, "accuracy")) for v in vals) +
                    (f"{_mean_of(own, 'neurons'):.0f} ({100 * J})" if own else "—",
                     f"{_mean_of(own, 'params'):.0f}" if own else "—",
                     max(len(v) for v in vals)))
  lines += _runs.md_table(header, rows)
  return lines + ["", "Claims:", ""] + (pfnm_claims(records) or ["- pending (no records)."])


def _pfnm_rows_of(records: Mapping[str, Mapping[str, Any]], experiment_name: str,
                  part: str) -> List[Mapping[str, Any]]:
  return [row for r in _records_of(records, "pfnm", experiment_name, row=part)
          for row in r["result"]["rows"]]


def _summarise(rows: Sequence[Mapping[str, Any]], keys: Sequence[str],
               value: str) -> Dict[Tuple, List[float]]:
  out: Dict[Tuple, List[float]] = {}
  for row in rows:
    out.setdefault(tuple(row[k] for k in keys), []).append(float(row[value]))
  return out


def pfnm_depth_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 4: PFNM competitive (within 1 pp or above) with the extra-resource baselines at
  every depth C; supplement Fig. 2: its global model below stacking (100 J C neurons)."""
  claims = []
  for part in rp.PFNM_PARTITIONS:
    rows = _pfnm_rows_of(records, "depth", part)
    acc = _summarise(rows, ("C", "method"), "accuracy")
    neurons = _summarise(rows, ("C", "method"), "neurons")
    cs = sorted({c for c, m in acc if m == "pfnm"})
    for m in ("uniform_ensemble", "weighted_ensemble") + rp.PFNM_EXTRA_METHODS:
      pts = [(c, np.mean(acc[(c, "pfnm")]), np.mean(acc[(c, m)])) for c in cs if (c, m) in acc]
      if pts:
        close = [c for c, p, e in pts if p >= e - 0.01]
        worst = min(pts, key=lambda t: t[1] - t[2])
        claims.append(_claim(len(close) == len(pts), f"{part}: PFNM competitive with {m} at "
                             "every depth (Fig. 4, J = 10)", f"at {len(close)} of {len(pts)} C "
                             f"values; largest gap at C = {worst[0]}: {100 * worst[1]:.1f} vs "
                             f"{100 * worst[2]:.1f}"))
    if cs:
      share = [(c, np.mean(neurons[(c, "pfnm")]) / (100 * rp.PFNM_DEPTH_J * c)) for c in cs]
      worst = max(share, key=lambda t: t[1])
      claims.append(_claim(worst[1] < 1.0, f"{part}: PFNM's master network smaller than the "
                           "stacked batch networks at every depth (supplement Fig. 2)",
                           f"largest share {100 * worst[1]:.0f} % at C = {worst[0]}"))
  return claims


def pfnm_depth_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  methods = _depth_methods(records)
  lines = _anchor("pfnm-fig-4", f"PFNM Fig. 4: test accuracy % vs number of hidden layers C "
                  f"(MNIST, J = {rp.PFNM_DEPTH_J}, 100 neurons a layer; PFNM's hidden neurons "
                  "beside)")
  rows = []
  for part in rp.PFNM_PARTITIONS:
    data = _pfnm_rows_of(records, "depth", part)
    acc = _summarise(data, ("C", "method"), "accuracy")
    neurons = _summarise(data, ("C", "method"), "neurons")
    for c in sorted({c for c, _ in acc}):
      rows.append((part, c) + tuple(_pm(acc.get((c, m), [])) for m in methods) +
                  (f"{np.mean(neurons[(c, 'pfnm')]):.0f}" if (c, "pfnm") in neurons else "—",
                   max(len(acc.get((c, m), [])) for m in methods)))
  lines += _runs.md_table(("partition", "C") + tuple(methods) + ("PFNM neurons", "trials"), rows)
  return lines + ["", "Claims:", ""] + (pfnm_depth_claims(records) or ["- pending (no records)."])


def _depth_methods(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """The methods the depth records hold, PFNM first."""
  found = {row["method"] for part in rp.PFNM_PARTITIONS
           for row in _pfnm_rows_of(records, "depth", part)}
  return sorted(found, key=lambda m: (m != "pfnm", m))


def pfnm_streaming_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Supplement Fig. 3b: PFNM-Streaming, one matching a step, ends above downpour SGD and
  the local networks (it communicates as rarely as the ensembles)."""
  claims = []
  for part in rp.PFNM_PARTITIONS:
    acc = _summarise(_pfnm_rows_of(records, "streaming", part), ("step", "method"), "accuracy")
    if not acc:
      continue
    last = max(s for s, _ in acc)
    for m in ("downpour_sgd", "local"):
      if (last, "pfnm_streaming") in acc and (last, m) in acc:
        p, o = np.mean(acc[(last, "pfnm_streaming")]), np.mean(acc[(last, m)])
        claims.append(_claim(p > o, f"{part}: PFNM-Streaming above {m} at the last step",
                             f"step {last}: {100 * p:.1f} vs {100 * o:.1f}"))
  return claims


def pfnm_streaming_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("pfnm-streaming", f"PFNM streaming (supplement Fig. 3b): test accuracy % per "
                  f"step (MNIST, J = {rp.PFNM_STREAMING['J']}, S = {rp.PFNM_STREAMING['steps']})")
  rows = []
  for part in rp.PFNM_PARTITIONS:
    acc = _summarise(_pfnm_rows_of(records, "streaming", part), ("step", "method"), "accuracy")
    methods = sorted({m for _, m in acc}, key=lambda m: (m != "pfnm_streaming", m))
    steps = sorted({s for s, _ in acc})
    for s in [x for x in steps if x in (1, 5, 10) or x == steps[-1]]:
      rows.append((part, s, "; ".join(f"{m} {_pm(acc[(s, m)])}" for m in methods if (s, m) in acc)))
  lines += _runs.md_table(("partition", "step", "accuracy by method"), rows)
  return lines + ["", "Claims:", ""] + (pfnm_streaming_claims(records) or
                                        ["- pending (no records)."])


SENSITIVITY_AXES = ("sigma0_sq", "gamma0", "sigma_sq")


def pfnm_sensitivity_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Supplement Fig. 4: the training accuracy does not fluctuate much over the grid
  (range within 2 pp), sigma^2 the axis with the largest effect."""
  claims = []
  for part in rp.PFNM_PARTITIONS:
    rows = _pfnm_rows_of(records, "sensitivity", part)
    if not rows:
      continue
    grid = _summarise(rows, SENSITIVITY_AXES, "train_accuracy")
    means = [np.mean(v) for v in grid.values()]
    spread = 100 * (max(means) - min(means))
    claims.append(_claim(spread <= 2.0, f"{part}: PFNM's training accuracy stable over the "
                         "sigma0^2 x gamma0 x sigma^2 grid (range within 2 pp)",
                         f"range {spread:.1f} pp over {len(grid)} points, J = "
                         f"{rp.PFNM_SENSITIVITY_J}"))
    effect = {ax: 100 * np.ptp([np.mean(v) for v in _summarise(rows, (ax,),
                                                                "train_accuracy").values()])
              for ax in SENSITIVITY_AXES}
    top = max(effect, key=effect.get)
    claims.append(_claim(top == "sigma_sq", f"{part}: sigma^2 has the largest effect",
                         ", ".join(f"{ax} {v:.2f} pp" for ax, v in effect.items())))
  return claims


def pfnm_sensitivity_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("pfnm-sensitivity", f"PFNM sensitivity (supplement Fig. 4): accuracy % over "
                  f"sigma0^2, gamma0, sigma^2 (MNIST, J = {rp.PFNM_SENSITIVITY_J}; train / test, "
                  "mean over trials)")
  rows = []
  for part in rp.PFNM_PARTITIONS:
    data = _pfnm_rows_of(records, "sensitivity", part)
    train = _summarise(data, SENSITIVITY_AXES, "train_accuracy")
    test = _summarise(data, SENSITIVITY_AXES, "test_accuracy")
    for key in sorted(train):
      rows.append((part,) + tuple(f"{v:g}" for v in key) +
                  (f"{100 * np.mean(train[key]):.1f}", f"{100 * np.mean(test[key]):.1f}",
                   len(train[key])))
  lines += _runs.md_table(("partition", "sigma0^2", "gamma0", "sigma^2", "train", "test",
                           "trials"), rows)
  return lines + ["", "Claims:", ""] + (pfnm_sensitivity_claims(records) or
                                        ["- pending (no records)."])


def pfnm_sigma_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("pfnm-sigma", "PFNM sigma^2 for several J (supplement Fig. 5: sigma0^2 = 10, "
                  "gamma0 = 1; MNIST train / test accuracy %, mean over trials)")
  rows = []
  for part in rp.PFNM_PARTITIONS:
    data = _pfnm_rows_of(records, "sensitivity_sigma", part)
    train = _summarise(data, ("J", "sigma_sq"), "train_accuracy")
    test = _summarise(data, ("J", "sigma_sq"), "test_accuracy")
    for key in sorted(train):
      rows.append((part, key[0], f"{key[1]:g}", f"{100 * np.mean(train[key]):.1f}",
                   f"{100 * np.mean(test[key]):.1f}", len(train[key])))
  lines += _runs.md_table(("partition", "J", "sigma^2", "train", "test", "trials"), rows)
  return lines + ["", "The supplement states no claim of its own for this figure (Fig. 4's "
                  "\"sigma^2 has slightly higher impact\" is judged there)."]


def pfnm_dsgd_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Supplement Fig. 3a: downpour SGD needs far more communication (> 4000 rounds) to
  reach PFNM's one-shot accuracy (heterogeneous MNIST, J = 25)."""
  pfnm = pfnm_j_rows(records).get(("class_dirichlet", rp.PFNM_DSGD_J, "pfnm"))
  recs = _records_of(records, "pfnm", "dsgd_rounds")
  if not recs or not pfnm:
    return ["- supplement Fig. 3a: pending (no records)."]
  by_rounds = {int(r["flags"]["comm_rounds"]): float(np.mean(_column(r["result"]["rows"],
                                                                     "accuracy")))
               for r in recs}
  p = _mean_of(pfnm, "accuracy")
  most = max(by_rounds)
  return [_claim(by_rounds[most] < p, f"supplement Fig. 3a: downpour SGD below PFNM's one-shot "
                 f"accuracy after {most} communication rounds (the paper: it needs > 4000)",
                 f"{100 * by_rounds[most]:.1f} vs {100 * p:.1f}; " +
                 ", ".join(f"{k}: {100 * v:.1f}" for k, v in sorted(by_rounds.items())))]


def pfnm_dsgd_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("pfnm-dsgd", f"PFNM supplement Fig. 3a: downpour SGD vs its communication "
                  f"rounds (heterogeneous MNIST, J = {rp.PFNM_DSGD_J}, one trial; PFNM "
                  "communicates once)")
  rows = [(int(r["flags"]["comm_rounds"]), _pm(_column(r["result"]["rows"], "accuracy")))
          for r in sorted(_records_of(records, "pfnm", "dsgd_rounds"),
                          key=lambda r: int(r["flags"]["comm_rounds"]))]
  lines += _runs.md_table(("rounds", "D-SGD accuracy %"), rows)
  return lines + ["", "Claims:", ""] + pfnm_dsgd_claims(records)


def _first_round_at_n20(records: Mapping[str, Mapping[str, Any]]) -> Dict[Tuple, List[float]]:
  """(alpha, method) -> first-round GA of the `first_round` cells (N = 20)."""
  return _summarise(fola_first_round_rows(records, ("first_round",)), ("alpha", "method"),
                    "global_accuracy")


def fola_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 2(a) at N = 20: FOLA's first-round GA above FedAvg's at alpha <= 0.1."""
  acc = _first_round_at_n20(records)
  claims = []
  for a in rp.FOLA_ALPHAS:
    if a <= 0.1 and acc.get((a, "fola")) and acc.get((a, "fedavg")):
      f, g = np.mean(acc[(a, "fola")]), np.mean(acc[(a, "fedavg")])
      claims.append(_claim(f > g, f"alpha = {rp.fmt_number(a)}, N = 20: FOLA's first-round GA "
                           "above FedAvg's", f"{100 * f:.1f} vs {100 * g:.1f}"))
  return claims


def fola_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  acc = _first_round_at_n20(records)
  lines = _anchor("fola-fig-2a", "FOLA Fig. 2(a) at N = 20: first-round global accuracy % vs "
                  f"alpha (MNIST-MLP 784-500-300-10, N = {rp.FOLA_BASE['num_clients']}, E = "
                  f"{rp.FOLA_BASE['epochs_per_round']}, lr = {rp.FOLA_BASE['client_lr']}, B = "
                  f"{rp.FOLA_BASE['batch_size']})")
  rows = []
  for a in rp.FOLA_ALPHAS:
    vals = [acc.get((a, m), []) for m in rp.FOLA_METHODS]
    if any(vals):
      rows.append((rp.fmt_number(a),) + tuple(_pm(v) for v in vals) + (max(len(v) for v in vals),))
  lines += _runs.md_table(("alpha",) + rp.FOLA_METHODS + ("repeats",), rows)
  if acc and all(acc.get((a, "fedcurv")) == acc.get((a, "fedavg")) for a in rp.FOLA_ALPHAS):
    lines += ["", "FedCurv's first round is FedAvg's: its penalty is weighted by the other "
              "clients' Fisher information from earlier rounds, zero before round 1 (floored "
              "at 1e-30), so the two columns agree; they part from round 2 (the learning "
              "curves)."]
  curves = [r for r in records.values() if r["cell"]["experiment"] == "curves"]
  if curves:
    lines += [""] + _anchor("fola-fig-3a", f"FOLA Fig. 3(a): learning curves (alpha = 0.01, "
                            f"N = 20, E = 5, lr = 0.01, {rp.FOLA_CURVE_ROUNDS} rounds): best GA % "
                            "over rounds")
    best: Dict[str, List[float]] = {}
    for r in curves:
      for m, res in r["result"]["methods"].items():
        best.setdefault(m, []).append(records_lib.best_value({"result": res}, "server_accuracy"))
    lines += _runs.md_table(("method", "best GA", "repeats"),
                            [(m, _pm(v), len(v)) for m, v in sorted(best.items())])
  return lines + ["", "Claims:", ""] + (fola_claims(records) or ["- pending (no records)."])


def fola_first_round_rows(records: Mapping[str, Mapping[str, Any]],
                          experiments: Sequence[str]) -> List[Mapping[str, Any]]:
  """The rows (one per method and run: the five settings and the global accuracy) of
  FOLA's first-round records of `experiments`."""
  return [row for r in records.values()
          if r["cell"]["paper"] == "fola" and r["cell"]["experiment"] in experiments
          for row in r["result"]["rows"]]


def fola_n_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 2(a): FOLA's first-round GA above FedAvg's at small alpha for every N, and
  FedAvg's GA falling as N grows at fixed alpha (the aggregation error grows with N)."""
  acc = _summarise(fola_first_round_rows(records, ("first_round", "first_round_n")),
                   ("alpha", "num_clients", "method"), "global_accuracy")
  ns = sorted({n for _, n, _ in acc})
  claims = []
  for a in (0.01, 0.1):
    pts = [(n, np.mean(acc[(a, n, "fola")]), np.mean(acc[(a, n, "fedavg")])) for n in ns
           if (a, n, "fola") in acc and (a, n, "fedavg") in acc]
    if len(pts) > 1:
      wins = [n for n, f, g in pts if f > g]
      claims.append(_claim(len(wins) == len(pts), f"alpha = {a:g}: FOLA's first-round GA above "
                           "FedAvg's at every N", "; ".join(f"N = {n}: {100 * f:.1f} vs "
                                                           f"{100 * g:.1f}" for n, f, g in pts)))
  for a in rp.FOLA_ALPHAS:
    pts = [(n, np.mean(acc[(a, n, "fedavg")])) for n in ns if (a, n, "fedavg") in acc]
    if len(pts) == len(rp.FOLA_NS):
      falls = all(y2 <= y1 for (_, y1), (_, y2) in zip(pts, pts[1:]))
      claims.append(_claim(falls, f"alpha = {a:g}: FedAvg's first-round GA falls as N grows "
                           "(\"when N becomes larger, AE always increases\")",
                           ", ".join(f"{n}: {100 * y:.1f}" for n, y in pts)))
  return claims


def fola_n_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  acc = _summarise(fola_first_round_rows(records, ("first_round", "first_round_n")),
                   ("alpha", "num_clients", "method"), "global_accuracy")
  ns = sorted({n for _, n, _ in acc})
  rows = []
  for m in rp.FOLA_METHODS:
    if m == "fedcurv":
      continue  # its first round is FedAvg's (above)
    for a in rp.FOLA_ALPHAS:
      if any((a, n, m) in acc for n in ns):
        rows.append((m, f"{a:g}") + tuple(_pm(acc.get((a, n, m), [])) for n in ns) +
                    (max(len(acc.get((a, n, m), [])) for n in ns),))
  lines = _anchor("fola-fig-2a-n", "FOLA Fig. 2(a): first-round global accuracy % over alpha x "
                  "N (MNIST-MLP, E = 5, lr = 0.01, B = 32; mean ± std over repeats)")
  lines += _runs.md_table(("method", "alpha") + tuple(f"N = {n}" for n in ns) + ("repeats",),
                          rows)
  return lines + ["", "Claims:", ""] + (fola_n_claims(records) or ["- pending (no records)."])


def _learning_rows(records: Mapping[str, Mapping[str, Any]],
                   axis: str) -> Dict[Tuple, List[float]]:
  return _summarise(fola_first_round_rows(records, (f"first_round_{axis}",)), ("value", "method"),
                    "global_accuracy")


def fola_learning_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 2(b)-(d): FOLA raises the best first-round GA over FedAvg's (B and E panels),
  and every method's GA is best at a moderate value, not an extreme one."""
  claims = []
  for axis in rp.FOLA_LEARNING_AXES:
    acc = _learning_rows(records, axis)
    values = sorted({v for v, _ in acc})
    best = {m: max((np.mean(acc[(v, m)]), v) for v in values if (v, m) in acc)
            for m in ("fola", "fedavg") if any((v, m) in acc for v in values)}
    if len(best) == 2 and len(values) == len(rp.FOLA_LEARNING_AXES[axis][1]):
      claims.append(_claim(best["fola"][0] > best["fedavg"][0], f"{axis}: FOLA's best GA above "
                           "FedAvg's", f"{100 * best['fola'][0]:.1f} at {best['fola'][1]:g} vs "
                           f"{100 * best['fedavg'][0]:.1f} at {best['fedavg'][1]:g}"))
      inner = best["fola"][1] not in (values[0], values[-1])
      claims.append(_claim(inner, f"{axis}: FOLA's GA best at a moderate value",
                           f"best at {best['fola'][1]:g} of {values[0]:g}..{values[-1]:g}"))
  return claims


def fola_learning_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("fola-fig-2bcd", f"FOLA Fig. 2(b)-(d): first-round global accuracy % over B, E "
                  f"and lr (MNIST-MLP, N = {rp.FOLA_BASE['num_clients']}, alpha = "
                  f"{rp.FOLA_SWEEP_ALPHA:g}, the other settings at E = 5, lr = 0.01, B = 32)")
  rows = []
  for axis in rp.FOLA_LEARNING_AXES:
    acc = _learning_rows(records, axis)
    for v in sorted({v for v, _ in acc}):
      rows.append((axis, f"{v:g}") + tuple(_pm(acc.get((v, m), [])) for m in ("fola", "fedavg")) +
                  (max(len(acc.get((v, m), [])) for m in ("fola", "fedavg")),))
  lines += _runs.md_table(("axis", "value", "fola", "fedavg", "repeats"), rows)
  return lines + ["", "Claims:", ""] + (fola_learning_claims(records) or
                                        ["- pending (no records)."])


def fola_curve_records(records: Mapping[str, Mapping[str, Any]]
                       ) -> Dict[Tuple[int, str], List[Mapping[str, Any]]]:
  """(N, method) -> the curves (as records) of Fig. 3(a) at every N."""
  out: Dict[Tuple[int, str], List[Mapping[str, Any]]] = {}
  for r in records.values():
    if r["cell"]["paper"] == "fola" and r["cell"]["experiment"] in ("curves", "curves_n"):
      for m, res in r["result"]["methods"].items():
        out.setdefault((int(r["flags"]["num_clients"]), m), []).append({"result": res})
  return dict(sorted(out.items()))


def _largest_drop(rec: Mapping[str, Any]) -> float:
  """The largest fall of the global accuracy from one evaluated round to the next."""
  v = records_lib.curve_values(rec, "server_accuracy")
  return float(max([a - b for a, b in zip(v, v[1:])] + [0.0]))


def _at_round(rec: Mapping[str, Any], n: int) -> float:
  v = records_lib.curve_values(rec, "server_accuracy")
  return float(v[n - 1]) if len(v) >= n else float("nan")


def fola_curves_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 3(a): FOLA converges faster than FedAvg (GA at round 5) at every N; the offline
  Laplace method's curves "vary dramatically" (a larger fall between rounds) where FOLA's
  are smooth."""
  by = fola_curve_records(records)
  claims = []
  for n in sorted({n for n, _ in by}):
    f, g, o = by.get((n, "fola")), by.get((n, "fedavg")), by.get((n, "laplace_offline"))
    if f and g:
      a, b = np.mean([_at_round(r, 5) for r in f]), np.mean([_at_round(r, 5) for r in g])
      claims.append(_claim(a > b, f"N = {n}: FOLA's GA above FedAvg's at round 5",
                           f"{100 * a:.1f} vs {100 * b:.1f}"))
    if f and o:
      a, b = np.mean([_largest_drop(r) for r in f]), np.mean([_largest_drop(r) for r in o])
      claims.append(_claim(b > a, f"N = {n}: the offline Laplace curves vary more than FOLA's",
                           f"largest fall between rounds {100 * b:.1f} pp vs {100 * a:.1f} pp"))
  return claims


def fola_curves_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  rows = [(n, m, _pm([_at_round(r, 5) for r in recs]),
           _pm([records_lib.best_value(r, "server_accuracy") for r in recs]),
           _pm([_largest_drop(r) for r in recs]), len(recs))
          for (n, m), recs in fola_curve_records(records).items()]
  lines = _anchor("fola-fig-3a-n", f"FOLA Fig. 3(a) for several N (alpha = 0.01, E = 5, lr = "
                  f"0.01, {rp.FOLA_CURVE_ROUNDS} rounds): GA % at round 5, best, and the largest "
                  "fall between rounds (pp)")
  lines += _runs.md_table(("N", "method", "GA round 5", "best GA", "largest fall", "repeats"),
                          rows)
  return lines + ["", "Claims:", ""] + (fola_curves_claims(records) or ["- pending (no records)."])


def _mean_curve(curves: Sequence[Mapping[str, Any]], key: str) -> Tuple[np.ndarray, np.ndarray]:
  """(rounds, mean of `key` over `curves`) on the rounds every curve reached, the
  rounds without an evaluation (`--eval_every`) left out; empty where a curve lacks
  `key` (a record older than that column)."""
  values = [[np.nan if v is None else v for v in c.get(key) or []] for c in curves]
  n = min(len(v) for v in values)
  if n == 0:
    return np.zeros(0), np.zeros(0)
  with warnings.catch_warnings():  # a round no curve evaluated is dropped below
    warnings.simplefilter("ignore", RuntimeWarning)
    mean = np.nanmean(np.array([v[:n] for v in values], dtype=float), axis=0)
  ok = np.isfinite(mean)
  return np.array(curves[0]["round"][:n])[ok], mean[ok]


def curve_groups(records: Mapping[str, Mapping[str, Any]]
                 ) -> List[Tuple[str, Dict[str, List[Mapping[str, Any]]]]]:
  """(title, algorithm -> records) of every experiment with learning curves of S and MT:
  Table II's rows, the FEMNIST-conv row and Table IV (E = 100)."""
  summary = table2_summary(records)
  groups = [(row, {a: summary[(row, a)]["records"] for a in rp.TABLE2_ALGORITHMS})
            for row in rp.TABLE2_ROWS]
  groups += [("femnist_conv", conv_by_algorithm(records)),
             (f"femnist_mlp, E = {rp.TABLE4_EPOCHS}", table4_by_algorithm(records))]
  return [(t, {a: r for a, r in g.items() if r}) for t, g in groups if any(g.values())]


# The four panels of a learning-curve column: log scales separate curves that lie
# within a point of accuracy of each other (the paper's Fig. 3 plots cross-entropy).
CURVE_PANELS = (("server_loss", "S cross-entropy", False), ("mt_loss", "MT cross-entropy", False),
                ("server_accuracy", "S error", True), ("mt_accuracy", "MT error", True))


def plot_table2_curves(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """S and MT test cross-entropy and error per round (mean over seeds, log scale), one
  column per row of Table II (and the conv and E = 100 rows), VIRTUAL and its baselines
  on the same axes. False if there is nothing to plot."""
  groups = curve_groups(records)
  if not groups:
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(len(CURVE_PANELS), len(groups), figsize=(4.5 * len(groups), 13),
                           squeeze=False)
  for j, (title, by_algorithm) in enumerate(groups):
    for alg, recs in by_algorithm.items():
      for i, (key, _, error) in enumerate(CURVE_PANELS):
        x, y = _mean_curve([r["result"]["curves"] for r in recs], key)
        axes[i][j].plot(x, 1.0 - y if error else y, label=f"{alg} ({len(recs)} seeds)")
    for i, (_, name, _) in enumerate(CURVE_PANELS):
      axes[i][j].set_yscale("log")
      _label(axes[i][j], "round", name, f"{title}: {name}")
  _runs.save_figure(fig, path, tight=True)
  return True


def plot_pfnm(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """Figs. 2-3: accuracy vs J per method, and PFNM's global model size vs J."""
  acc = pfnm_j_rows(records)
  if not acc:
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(2, len(rp.PFNM_PARTITIONS), figsize=(11, 7.5), squeeze=False)
  for j, part in enumerate(rp.PFNM_PARTITIONS):
    for m in PFNM_J_METHODS:
      pts = [(J, _mean_of(acc[(part, J, m)], "accuracy")) for J in rp.PFNM_J
             if (part, J, m) in acc]
      if pts:
        axes[0][j].plot(*zip(*pts), marker="o", label=m)
      sizes = [(J, _mean_of(acc[(part, J, m)], "params")) for J in rp.PFNM_J
               if (part, J, m) in acc]
      if sizes and m in ("pfnm", "pfnm_small_gamma", "fedavg_shared", "uniform_ensemble",
                         "distillation"):
        axes[1][j].plot(*zip(*sizes), marker="o", label=m)
    axes[1][j].set_yscale("log")
    _label(axes[0][j], "number of batches J", "test accuracy", f"MNIST {part}")
    _label(axes[1][j], "number of batches J", "global model parameters", f"MNIST {part}: size")
  _runs.save_figure(fig, path, tight=True)
  return True


def plot_pfnm_more(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """Fig. 4 (accuracy vs depth C per method) and the streaming experiment (accuracy per
  step per method), one column per partition."""
  panels = [("depth", ("C", "method"), "number of hidden layers C", "Fig. 4, J = 10"),
            ("streaming", ("step", "method"), "streaming step", "streaming, J = 3")]
  data = {(e, part): _summarise(_pfnm_rows_of(records, e, part), keys, "accuracy")
          for e, keys, _, _ in panels for part in rp.PFNM_PARTITIONS}
  if not any(data.values()):
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(len(panels), len(rp.PFNM_PARTITIONS), figsize=(11, 7.5),
                           squeeze=False)
  for i, (e, _, xlabel, title) in enumerate(panels):
    for j, part in enumerate(rp.PFNM_PARTITIONS):
      acc = data[(e, part)]
      for m in sorted({m for _, m in acc}):
        pts = sorted((x, np.mean(v)) for (x, mm), v in acc.items() if mm == m)
        axes[i][j].plot(*zip(*pts), marker="o", label=m)
      _label(axes[i][j], xlabel, "test accuracy", f"MNIST {part}: {title}")
  _runs.save_figure(fig, path, tight=True)
  return True


def plot_fola(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """Fig. 2(a)-(d): first-round GA vs alpha (one line per method and N; FOLA solid,
  FedAvg dashed), then vs B, E and lr."""
  acc = _summarise(fola_first_round_rows(records, ("first_round", "first_round_n")),
                   ("alpha", "num_clients", "method"), "global_accuracy")
  if not acc:
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(1, 1 + len(rp.FOLA_LEARNING_AXES), figsize=(19, 4), squeeze=False)
  ns = sorted({n for _, n, _ in acc})
  colours = dict(zip(ns, plt.get_cmap("plasma")(np.linspace(0, 0.85, len(ns)))))
  for n in ns:
    for m, style in (("fola", "-"), ("fedavg", "--")):
      pts = [(a, np.mean(acc[(a, n, m)])) for a in rp.FOLA_ALPHAS if (a, n, m) in acc]
      if pts:
        axes[0][0].plot(*zip(*pts), style, marker="o", color=colours[n], label=f"{m} N={n}")
  axes[0][0].set_xscale("log")
  _label(axes[0][0], "alpha (Dirichlet concentration)", "first-round global accuracy",
         "FOLA Fig. 2(a), MNIST-MLP")
  for ax, axis in zip(axes[0][1:], rp.FOLA_LEARNING_AXES):
    by = _learning_rows(records, axis)
    for m in ("fola", "fedavg"):
      pts = sorted((v, np.mean(g)) for (v, mm), g in by.items() if mm == m)
      if pts:
        ax.plot(*zip(*pts), marker="o", label=m)
    ax.set_xscale("log")
    _label(ax, axis, "first-round global accuracy", f"alpha = {rp.FOLA_SWEEP_ALPHA:g}, N = 20")
  _runs.save_figure(fig, path, tight=True)
  return True


def plot_fola_curves(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """FOLA's Fig. 3(a): global accuracy per round at alpha 0.01, one panel per N, one line
  per method (mean over repeats). False if there is nothing to plot."""
  by = fola_curve_records(records)
  if not by:
    return False
  ns = sorted({n for n, _ in by})
  plt = _runs.pyplot()
  fig, axes = plt.subplots(1, len(ns), figsize=(5.5 * len(ns), 4), squeeze=False)
  for ax, n in zip(axes[0], ns):
    for (nn, m), recs in by.items():
      if nn == n:
        ax.plot(*_mean_curve([r["result"]["curves"] for r in recs], "server_accuracy"),
                label=f"{m} ({len(recs)} repeats)")
    _label(ax, "round", "global accuracy", f"FOLA Fig. 3(a), MNIST-MLP, alpha = 0.01, N = {n}")
  _runs.save_figure(fig, path, tight=True)
  return True


# ------------------------------------------------ the papers' other experiments
def _claim(held: bool, text: str, numbers: str) -> str:
  """A claim line as the coverage table counts it: `- text: held (numbers)`."""
  return f"- {text}: {'held' if held else 'not held'} ({numbers})."


def _compare(a: Sequence[float], b: Sequence[float], scale: float = 100.0
             ) -> Optional[Tuple[float, float, float, float, int, int]]:
  """(mean a, mean b, difference, its standard error, seeds a, seeds b), None if a side
  has no value."""
  ma, sa, na = _mean_std(a, scale)
  mb, sb, nb = _mean_std(b, scale)
  if not na or not nb:
    return None
  diff, se = _runs.mean_difference((ma, sa, na), (mb, sb, nb))
  return ma, mb, diff, se, na, nb


def _above_claim(text: str, a: Sequence[float], b: Sequence[float], what: str,
                 seeds: int = 3) -> str:
  """`text` holds when mean(a) exceeds mean(b) by more than its standard error."""
  c = _compare(a, b)
  if c is None or min(c[4], c[5]) < seeds:
    have = (c[4], c[5]) if c else (len(a), len(b))
    return f"- {text}: pending ({have[0]} and {have[1]} of {seeds} seeds recorded)."
  ma, mb, diff, se, na, _ = c
  return _claim(_runs.beyond_error(diff, se) > 0, text,
                f"{what} {ma:.1f} vs {mb:.1f}, mean of {na} seeds; difference {diff:+.2f} pp, "
                f"s.e. {se:.2f}")


def _records_of(records: Mapping[str, Mapping[str, Any]], paper: str, experiment_name: str,
                **fields: Any) -> List[Mapping[str, Any]]:
  """The records of one paper's experiment whose cell fields equal `fields`, by seed."""
  return sorted((r for r in records.values()
                 if r["cell"]["paper"] == paper and r["cell"]["experiment"] == experiment_name
                 and all(r["cell"][k] == v for k, v in fields.items())),
                key=lambda r: r["cell"]["seed"])


def _bests(recs: Sequence[Mapping[str, Any]], key: str) -> List[float]:
  return [records_lib.best_value(r, key) for r in recs]


_finals = records_lib.final_values


_anchor = _runs.anchor


def _per_client_round(rec: Mapping[str, Any], total: Any) -> Optional[float]:
  flags = rec["flags"]
  n = (rec["result"]["summary"].get("rounds") or flags.get("rounds") or 0) * (
      flags.get("clients_per_round") or 0)
  return float(total) / n if total is not None and n else None


def _upload_kb(rec: Mapping[str, Any]) -> Optional[float]:
  """Mean bytes one client uploads a round, kB."""
  b = _per_client_round(rec, rec["result"]["summary"].get("bytes_up_total"))
  return None if b is None else b / 1e3


def _delta_nonzeros(rec: Mapping[str, Any]) -> Optional[float]:
  """Mean non-zero entries of one client's delta a round (metrics.csv's `delta_nonzeros`
  over the clients of the round); None where the record has no such column."""
  vals = records_lib.curve_values(rec, "delta_nonzeros")
  c = rec["flags"].get("clients_per_round")
  return float(np.mean(vals)) / c if vals and c else None


def _delta_entries(rec: Mapping[str, Any]) -> Optional[float]:
  """`_delta_nonzeros`, or for a record without that column the dense delta's entries
  (its upload holds two float32 natural parameters per weight: bytes / 8)."""
  nnz = _delta_nonzeros(rec)
  if nnz is not None or rec["flags"].get("prune_percentile"):
    return nnz
  kb = _upload_kb(rec)
  return None if kb is None else kb * 1e3 / 8


def _mean_text(values: Sequence[Optional[float]], fmt: str = "{:.0f}") -> str:
  v = [x for x in values if x is not None]
  return fmt.format(float(np.mean(v))) if v else "—"


def table3_records(records: Mapping[str, Mapping[str, Any]], variant: str,
                   percentile: float) -> List[Mapping[str, Any]]:
  """Table III's runs of `variant` at `percentile` (VIRTUAL at 0 %: Table II's tuned cells)."""
  if variant == "virtual" and percentile == 0.0:
    return _records_of(records, "virtual", "table2", row=rp.FEMNIST_ROW, algorithm="virtual")
  return _records_of(records, "virtual", "table3", algorithm=variant,
                     setting=f"prune={rp.fmt_number(percentile)}")


_VARIANT_LABEL = {"virtual": "VIRTUAL", "virtual_fedavg_init": "VIRTUAL + FedAvg init"}


def table3_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Table III's claims: VIRTUAL above its FedAvg-init variant at every pruning level, and
  above FedProx (Table II) up to 75 %."""
  lines = []
  fedprox = _records_of(records, "virtual", "table2", row=rp.FEMNIST_ROW, algorithm="fedprox")
  for p in rp.TABLE3_PERCENTILES:
    v = _bests(table3_records(records, "virtual", p), "mt_accuracy")
    lines.append(_above_claim(f"{p:g} % pruned: VIRTUAL's MT above VIRTUAL + FedAvg init's", v,
                              _bests(table3_records(records, "virtual_fedavg_init", p),
                                     "mt_accuracy"), "MT"))
    if p <= 75.0:
      lines.append(_above_claim(f"{p:g} % pruned: VIRTUAL's MT above FedProx's (dense, Table II)",
                                v, _bests(fedprox, "mt_accuracy"), "MT"))
  return lines


def table3_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  rows = []
  for p in rp.TABLE3_PERCENTILES:
    for variant in rp.TABLE3_VARIANTS:
      recs = table3_records(records, variant, p)
      paper_mt, paper_s = rp.VIRTUAL_TABLE3[p][variant]
      rows.append((f"{p:g} %", _VARIANT_LABEL[variant], paper_mt,
                   _pm(_bests(recs, "mt_accuracy")), paper_s, _pm(_bests(recs, "server_accuracy")),
                   rp.VIRTUAL_TABLE3_DELTA[p], _mean_text([_delta_entries(r) for r in recs]),
                   _mean_text([_upload_kb(r) for r in recs], "{:.1f}"), len(recs)))
  fedprox = _records_of(records, "virtual", "table2", row=rp.FEMNIST_ROW, algorithm="fedprox")
  rows.append(("dense", "FedProx (Table II)", rp.VIRTUAL_TABLE2[rp.FEMNIST_ROW]["MT"]["fedprox"],
               _pm(_bests(fedprox, "mt_accuracy")),
               rp.VIRTUAL_TABLE2[rp.FEMNIST_ROW]["S"]["fedprox"],
               _pm(_bests(fedprox, "server_accuracy")), "—", "—",
               _mean_text([_upload_kb(r) for r in fedprox], "{:.1f}"), len(fedprox)))
  lines = _anchor("virtual-table-iii", "VIRTUAL Table III: SNR-pruned updates (FEMNIST-MLP, "
                  "Table II's tuned VIRTUAL setting and protocol; accuracy %, max over rounds)")
  lines += _runs.md_table(("pruned", "variant", "MT paper", "MT ours", "S paper", "S ours",
                           "delta paper", "delta non-zeros ours", "upload kB / client-round",
                           "seeds"), rows)
  lines += ["", "The paper's delta size counts the non-zero entries; ours is metrics.csv's "
            "`delta_nonzeros` per client and round (an unpruned record without that column: its "
            "dense size, upload bytes / 8) and the bytes one client uploads a round (sparse "
            "entries with their indices). Our MLP has 89,610 shared weights.", "",
            "Claims:", ""]
  return lines + table3_claims(records)


def snr_records(records: Mapping[str, Mapping[str, Any]],
                setting: str = "prune=0") -> Dict[str, List[Mapping[str, Any]]]:
  return {v: _records_of(records, "virtual", "snr_cdf", algorithm=v, setting=setting)
          for v in rp.TABLE3_VARIANTS}


def _snr_medians(recs: Sequence[Mapping[str, Any]]) -> Dict[int, float]:
  """Layer -> median log10 SNR, mean over the records."""
  by_layer: Dict[int, List[float]] = {}
  for r in recs:
    for q in r["result"]["quantiles"]:
      by_layer.setdefault(int(q["layer"]), []).append(float(q["q50_log10_snr"]))
  return {k: float(np.mean(v)) for k, v in sorted(by_layer.items())}


_SNR_SETTING_TEXT = {"prune=0": "", "prune=0,scale_adam": ", with the scales' own Adam step (ours)"}


def snr_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 4: without the FedAvg init the clients' posteriors are more compressible (a lower
  SNR for most weights), in every dense layer; at the paper's SGD and, where recorded, with
  the scales' Adam step."""
  lines = []
  for setting in rp.SNR_SETTINGS:
    by = {v: _snr_medians(recs) for v, recs in snr_records(records, setting).items()}
    layers = sorted(set(by["virtual"]) & set(by["virtual_fedavg_init"]))
    title = f"Fig. 4{_SNR_SETTING_TEXT[setting]}"
    if not layers:
      lines.append(f"- {title}: pending (no SNR records of both variants).")
      continue
    lower = [l for l in layers if by["virtual"][l] < by["virtual_fedavg_init"][l]]
    text = "; ".join(f"layer {l}: {by['virtual'][l]:.2f} vs {by['virtual_fedavg_init'][l]:.2f}"
                     for l in layers)
    lines.append(_claim(len(lower) == len(layers),
                        f"{title}: VIRTUAL's clients more compressible than with the FedAvg "
                        "init (lower median log10 SNR in every dense layer)", text))
  return lines


def snr_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  rows = []
  for setting in rp.SNR_SETTINGS:
    for variant, recs in snr_records(records, setting).items():
      by_layer: Dict[int, List[Mapping[str, Any]]] = {}
      for r in recs:
        for q in r["result"]["quantiles"]:
          by_layer.setdefault(int(q["layer"]), []).append(q)
      for layer, qs in sorted(by_layer.items()):
        rows.append((layer, _VARIANT_LABEL[variant] + _SNR_SETTING_TEXT[setting],
                     qs[0]["num_weights"]) + tuple(
                         f"{np.mean([float(q[f'q{k}_log10_snr']) for q in qs]):.2f}"
                         for k in (10, 25, 50, 75, 90)) + (len(qs),))
  lines = _anchor("virtual-fig-4", "VIRTUAL Fig. 4: SNR of the clients' final posteriors per "
                  "dense layer (FEMNIST-MLP, log10 |mu| / sigma over every client's shared "
                  "weights)")
  lines += _runs.md_table(("layer", "variant", "weights", "q10", "q25", "median", "q75", "q90",
                           "runs"), rows)
  return lines + ["", "Claims:", ""] + snr_claims(records)


def plot_snr_cdf(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """Fig. 4: the empirical CDF of log10 SNR per dense layer, one line per variant."""
  curves: Dict[Tuple[int, str, str], Tuple[List[float], List[float]]] = {}
  for setting in rp.SNR_SETTINGS:
    for variant, recs in snr_records(records, setting).items():
      for r in recs[:1]:
        for row in r["result"]["cdf"]:
          xs, ys = curves.setdefault((int(row["layer"]), variant, setting), ([], []))
          xs.append(float(row["log10_snr"]))
          ys.append(float(row["cdf"]))
  if not curves:
    return False
  layers = sorted({l for l, _, _ in curves})
  plt = _runs.pyplot()
  fig, axes = plt.subplots(1, len(layers), figsize=(4.2 * len(layers), 3.6), squeeze=False)
  for j, layer in enumerate(layers):
    for (l, variant, setting), xy in curves.items():
      if l == layer:
        axes[0][j].plot(*xy, label=_VARIANT_LABEL[variant] + _SNR_SETTING_TEXT[setting],
                        ls="-" if setting == "prune=0" else "--")
    axes[0][j].set_title(f"FEMNIST-MLP, dense layer {layer}")
    axes[0][j].set_xlabel("log10 SNR")
    axes[0][j].set_ylabel("CDF")
    axes[0][j].grid(alpha=0.3)
    axes[0][j].legend(fontsize=8)
  _runs.save_figure(fig, path, tight=True)
  return True


def _versus_table(title_anchor: Tuple[str, str], by_algorithm: Mapping[str, Sequence[Mapping]],
                  paper: Mapping[str, Mapping[str, float]]) -> List[str]:
  """Per algorithm: S and MT (max over rounds) beside the paper's, final MT NLL, seeds."""
  rows = [(_runs.ALGORITHM_NAMES.get(a, a), paper["S"].get(a, "—"),
           _pm(_bests(recs, "server_accuracy")), paper["MT"].get(a, "—"),
           _pm(_bests(recs, "mt_accuracy")), _pm(_finals(recs, "mt_loss"), 1, 3), len(recs),
           sum(bool(r.get("resumed_from_rounds")) for r in recs))
          for a, recs in by_algorithm.items()]
  return _anchor(*title_anchor) + _runs.md_table(
      ("algorithm", "S paper", "S ours", "MT paper", "MT ours", "MT NLL final", "seeds",
       "resumed"), rows)


def _virtual_above_claims(label: str, by_algorithm: Mapping[str, Sequence[Mapping]]) -> List[str]:
  v = _bests(by_algorithm["virtual"], "mt_accuracy")
  return [_above_claim(f"{label}: VIRTUAL's MT above {_runs.ALGORITHM_NAMES[b]}'s", v,
                       _bests(by_algorithm[b], "mt_accuracy"), "MT") for b in ("fedavg", "fedprox")]


def table4_by_algorithm(records: Mapping[str, Mapping[str, Any]]) -> Dict[str, List[Mapping]]:
  return {a: _records_of(records, "virtual", "table4", algorithm=a) for a in rp.TABLE4_ALGORITHMS}


def table4_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  return _virtual_above_claims("Table IV (FEMNIST-MLP, E = 100)", table4_by_algorithm(records))


def table4_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _versus_table(("virtual-table-iv", f"VIRTUAL Table IV / Fig. 6: E = {rp.TABLE4_EPOCHS} "
                         "epochs a round (FEMNIST-MLP, each algorithm at its Table II tuned "
                         "setting; accuracy %, max over rounds)"), table4_by_algorithm(records),
                        rp.VIRTUAL_TABLE4[rp.FEMNIST_ROW])
  return lines + ["", "Claims:", ""] + table4_claims(records)


def conv_by_algorithm(records: Mapping[str, Mapping[str, Any]]) -> Dict[str, List[Mapping]]:
  return {a: _records_of(records, "virtual", "table2_conv", algorithm=a)
          for a in rp.TABLE4_ALGORITHMS}


def conv_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  return _virtual_above_claims("Table II FEMNIST-conv", conv_by_algorithm(records))


def conv_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _versus_table(("virtual-table-ii-conv", "VIRTUAL Table II, FEMNIST-conv row (each "
                         "algorithm at its FEMNIST-MLP tuned setting, no grid of its own; test "
                         "split, 100 rounds, checkpointed and resumed; accuracy %)"),
                        conv_by_algorithm(records), rp.VIRTUAL_TABLE2[rp.CONV_ROW])
  return lines + ["", "Claims:", ""] + conv_claims(records)


def beta_records(records: Mapping[str, Mapping[str, Any]]) -> Dict[float, List[Mapping[str, Any]]]:
  """beta -> its runs (the tuned beta's are Table II's FEMNIST-MLP VIRTUAL cells)."""
  out: Dict[float, List[Mapping[str, Any]]] = {}
  for r in _records_of(records, "virtual", "beta") + [
      r for r in _records_of(records, "virtual", "table2", row=rp.FEMNIST_ROW, algorithm="virtual")
      if r["cell"]["seed"] in rp.BETA_SEEDS]:
    if "kl_weight" in r["flags"]:
      out.setdefault(float(r["flags"]["kl_weight"]), []).append(r)
  return dict(sorted(out.items()))


def _rank_correlation(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman's rank correlation (no ties expected)."""
  rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
  return float(np.corrcoef(rx, ry)[0, 1])


def beta_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 2: the KL term regularises: a larger beta, a lower final cross-entropy (S and MT)."""
  by = beta_records(records)
  if len(by) < 3:
    return [f"- Fig. 2: pending ({len(by)} of {len(rp.BETAS)} betas recorded)."]
  lines = []
  betas = list(by)
  for key, name in (("server_loss", "S"), ("mt_loss", "MT")):
    finals = [float(np.mean(_finals(by[b], key))) for b in betas]
    rho = _rank_correlation(betas, finals)
    best = betas[int(np.argmin(finals))]
    lines.append(_claim(rho < 0, f"Fig. 2: a larger beta lowers the final {name} cross-entropy",
                        f"rank correlation {rho:+.2f} over {len(betas)} betas; lowest at beta = "
                        f"{best:g}: {min(finals):.3f}, at 1e-6: {finals[0]:.3f}"))
  return lines


def beta_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  rows = [(f"{b:g}", _pm(_finals(recs, "server_loss"), 1, 3), _pm(_finals(recs, "mt_loss"), 1, 3),
           _pm(_bests(recs, "server_accuracy")), _pm(_bests(recs, "mt_accuracy")), len(recs))
          for b, recs in beta_records(records).items()]
  lines = _anchor("virtual-fig-2", "VIRTUAL Fig. 2: the KL multiplier beta (FEMNIST-MLP, Table "
                  "II's tuned setting and protocol but beta; cross-entropy at round 100, "
                  "accuracy % max over rounds)")
  lines += _runs.md_table(("beta", "S NLL final", "MT NLL final", "S (max)", "MT (max)", "seeds"),
                          rows)
  return lines + ["", "Claims:", ""] + beta_claims(records)


def plot_beta(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """Fig. 2: S and MT cross-entropy per round (log scale), one line per beta."""
  by = beta_records(records)
  if not by:
    return False
  plt = _runs.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
  colours = plt.get_cmap("viridis")(np.linspace(0, 1, len(by)))
  for colour, (b, recs) in zip(colours, by.items()):
    for ax, key in zip(axes, ("server_loss", "mt_loss")):
      ax.plot(*_mean_curve([r["result"]["curves"] for r in recs], key), color=colour,
              label=f"beta {b:g}")
  for ax, name in zip(axes, ("S", "MT")):
    ax.set_yscale("log")
    _label(ax, "round", f"{name} cross-entropy", f"FEMNIST-MLP: {name} loss vs beta")
  _runs.save_figure(fig, path, tight=True)
  return True


_label = _runs.label_axes


V1_NAMES = {"global": "Global", "local": "Local", "fedavg": "FedAvg", "virtual": "VIRTUAL"}


def v1_records(records: Mapping[str, Mapping[str, Any]], row: str,
               algorithm: str) -> List[Mapping[str, Any]]:
  return _records_of(records, "virtual_v1", "v1_table2", row=row, algorithm=algorithm)


def v1_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """v1 Table 2: VIRTUAL on par with Global and FedAvg on MNIST (within 1 pp) and with
  Local on P-MNIST, and above Global and FedAvg there."""
  final = lambda row, a: _finals(v1_records(records, row, a), "mt_accuracy")
  lines = []
  for base in ("global", "fedavg"):
    c = _compare(final("mnist", "virtual"), final("mnist", base))
    if c is None:
      lines.append(f"- v1 MNIST, VIRTUAL on par with {V1_NAMES[base]}: pending.")
    else:
      lines.append(_claim(c[2] >= -1.0, f"v1 MNIST: VIRTUAL on par with {V1_NAMES[base]} "
                          "(within 1 pp or above)", f"MT {c[0]:.2f} vs {c[1]:.2f}"))
    lines.append(_above_claim(f"v1 P-MNIST: VIRTUAL's MT above {V1_NAMES[base]}'s",
                              final("pmnist", "virtual"), final("pmnist", base), "MT"))
  c = _compare(final("pmnist", "virtual"), final("pmnist", "local"))
  if c is not None:
    lines.append(_claim(c[2] >= -1.0, "v1 P-MNIST: VIRTUAL on par with Local (within 1 pp or "
                        "above)", f"MT {c[0]:.2f} vs {c[1]:.2f}"))
  return lines


def v1_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  rows = []
  for a in rp.V1_ALGORITHMS:
    cells = [V1_NAMES[a]]
    for row in rp.V1_ROWS:
      recs = v1_records(records, row, a)
      cells += [rp.V1_PAPER[row]["global_" if a == "global" else a],
                _pm(_finals(recs, "mt_accuracy"), 100, 2), len(recs)]
    rows.append(tuple(cells))
  f = rp.V1_FLAGS
  lines = _anchor("virtual-v1-table-2", "VIRTUAL v1 Table 2: MT test accuracy % after training "
                  f"({f['num_clients']} clients, all in every round, {f['rounds']} rounds of "
                  f"E = {f['epochs_per_round']}, B = {f['batch_size']}; the seed draws the split; "
                  "mean ± std)")
  lines += _runs.md_table(("algorithm", "MNIST paper", "MNIST ours", "seeds", "P-MNIST paper",
                           "P-MNIST ours", "seeds"), rows)
  lines += ["", "The paper splits each client's data 25 % test; here MNIST's own test split is "
            "dealt to the same 10 clients (P-MNIST: each client its own pixel permutation).", "",
            "Claims:", ""]
  return lines + v1_claims(records)


# ------------------------------------------------------------------ coverage
@dataclasses.dataclass(frozen=True)
class CoverageItem:
  """One table or figure of a paper file (`../shared/papers/<paper>.txt`).

  `cells`: the catalogue's cell-name patterns that reproduce it (`reproduce.select`);
  none where it is not in the campaign, `note` then says why (or, with `missing`, the
  data set that no file or package here provides). `claims(records)`: its claim lines
  (`- ...: held (...)`), from the report's sections. `anchor`: its report section.
  """
  paper: str
  item: str
  cells: Tuple[str, ...] = ()
  anchor: str = ""
  claims: Optional[Callable[[Mapping[str, Mapping[str, Any]]], List[str]]] = None
  note: str = ""
  missing: str = ""


def _matching(pattern: str) -> Callable[[Mapping[str, Mapping[str, Any]]], List[str]]:
  """The claim lines of every section that mention `pattern`."""
  return lambda records: [l for l in all_claims(records) if pattern in l]


def all_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  return (table2_claims(table2_summary(records)) + conv_claims(records) + beta_claims(records) +
          snr_claims(records) + table3_claims(records) + table4_claims(records) +
          v1_claims(records) + pfnm_claims(records) + pfnm_depth_claims(records) +
          pfnm_streaming_claims(records) + pfnm_sensitivity_claims(records) +
          pfnm_dsgd_claims(records) +
          fola_claims(records) + fola_n_claims(records) + fola_learning_claims(records) +
          fola_curves_claims(records))


_NO_VSN_HAR = "VSN and UCI HAR: no file of either under ../shared/data, no package ships them"
_NO_SHAKESPEARE = "LEAF Shakespeare: not under ../shared/data, no package ships it"
_NO_CIFAR = "CIFAR-10: no batches under ../shared/data, no package installed here ships them"
_DIAGRAM = "a diagram, no experiment"

COVERAGE = (
    CoverageItem("virtual", "Table I (data statistics)",
                 note="not a run: `python -m launchers.dataset_stats` prints a row's statistics"),
    CoverageItem("virtual", "Fig. 1", note=_DIAGRAM),
    CoverageItem("virtual", "Fig. 2 (beta, FEMNIST)", ("virtual/beta",), "virtual-fig-2",
                 beta_claims),
    CoverageItem("virtual", "Table II, MNIST row",
                 ("virtual/tune/mnist", "virtual/tune_step/mnist", "virtual/table2/mnist",
                  "virtual/default_step/mnist"),
                 "virtual-table-ii", _matching("- mnist")),
    CoverageItem("virtual", "Table II, PMNIST row",
                 ("virtual/tune/pmnist", "virtual/tune_step/pmnist", "virtual/table2/pmnist",
                  "virtual/default_step/pmnist"),
                 "virtual-table-ii", _matching("- pmnist")),
    CoverageItem("virtual", "Table II, FEMNIST-MLP row",
                 ("virtual/tune/femnist_mlp", "virtual/tune_step/femnist_mlp",
                  "virtual/table2/femnist_mlp", "virtual/default_step/femnist_mlp"),
                 "virtual-table-ii", _matching("- femnist_mlp")),
    CoverageItem("virtual", "Table II, FEMNIST-conv row", ("virtual/table2_conv",),
                 "virtual-table-ii-conv", conv_claims,
                 note="at the MLP row's tuned settings, no grid of its own (cost)"),
    CoverageItem("virtual", "Table II, VSN and HAR rows", missing=_NO_VSN_HAR),
    CoverageItem("virtual", "Table II, NLP (Shakespeare) row", missing=_NO_SHAKESPEARE),
    CoverageItem("virtual", "Fig. 3 (S and MT cross-entropy per round)",
                 ("virtual/table2/mnist", "virtual/table2/pmnist", "virtual/table2/femnist_mlp",
                  "virtual/table2_conv"), "figures",
                 note="figures/table2_curves.png, log scales; VSN, HAR, NLP: no data"),
    CoverageItem("virtual", "Fig. 4 (SNR CDF)", ("virtual/snr_cdf",), "virtual-fig-4",
                 snr_claims),
    CoverageItem("virtual", "Table III (SNR-pruned updates)", ("virtual/table3",),
                 "virtual-table-iii", table3_claims),
    CoverageItem("virtual", "Table IV, FEMNIST-MLP (E = 100)", ("virtual/table4",),
                 "virtual-table-iv", table4_claims),
    CoverageItem("virtual", "Table IV, FEMNIST-conv (E = 100)",
                 note="not in the campaign: a conv cell at E = 100 is ~5 x the E = 20 cell "
                 "(~12 h of this machine each, 9 cells)"),
    CoverageItem("virtual", "Fig. 5 (training curves)",
                 ("virtual/table2/mnist", "virtual/table2/pmnist", "virtual/table2/femnist_mlp"),
                 "figures", note="the records hold every round's train loss, S and MT; "
                 "plotted as cross-entropy and error"),
    CoverageItem("virtual", "Fig. 6 (E = 100 curves)", ("virtual/table4",), "figures"),
    CoverageItem("tfbfl", "VIRTUAL's calibration beside FedAvg's (ours, issue 34)",
                 ("virtual/calibration", "virtual/table2_calibrated"), calibration_report.ANCHOR,
                 lambda records: (calibration_report.calibration_claims(records) +
                                  calibration_report.calibrated_table2_claims(records))),
    CoverageItem("tfbfl", "VIRTUAL's knobs beside Table II's setting (ours, not the paper's)",
                 ("virtual/ablate",), "virtual-table-ii",
                 note="server step, lateral gate, precision step, Monte Carlo predictive"),
    CoverageItem("virtual_v1", "Table 1 (data statistics)",
                 note="not a run: `python -m launchers.dataset_stats`"),
    CoverageItem("virtual_v1", "Figs. 1-2", note=_DIAGRAM),
    CoverageItem("virtual_v1", "Table 2, MNIST column", ("virtual_v1/v1_table2/mnist",),
                 "virtual-v1-table-2", _matching("v1 MNIST")),
    CoverageItem("virtual_v1", "Table 2, P-MNIST column", ("virtual_v1/v1_table2/pmnist",),
                 "virtual-v1-table-2", _matching("v1 P-MNIST")),
    CoverageItem("virtual_v1", "Table 2, FEMNIST column",
                 note="not in the campaign: v1 samples 10 writers with >= 300 examples; the "
                 "FEMNIST sample here has ~140 a writer (5 % of LEAF's)"),
    CoverageItem("virtual_v1", "Table 2, VSN and HAR columns", missing=_NO_VSN_HAR),
    CoverageItem("pfnm", "Figs. 1 and supplement 1", note=_DIAGRAM),
    CoverageItem("pfnm", "Fig. 2 (MNIST: accuracy and size vs J)", ("pfnm/j_sweep",),
                 "pfnm-figs-2-3", lambda r: [l for l in pfnm_claims(r) if "Fig. 2" in l]),
    CoverageItem("pfnm", "Fig. 3 (a, b: MNIST, extra-resource baselines)",
                 ("pfnm/j_sweep", "pfnm/extra"), "pfnm-figs-2-3",
                 lambda r: [l for l in pfnm_claims(r) if "Fig. 3" in l]),
    CoverageItem("pfnm", "Fig. 3 (c, d: CIFAR-10)", missing=_NO_CIFAR),
    CoverageItem("pfnm", "Fig. 4 (MNIST: depth C at J = 10)", ("pfnm/depth",), "pfnm-fig-4",
                 lambda r: [l for l in pfnm_depth_claims(r) if "Fig. 4" in l]),
    CoverageItem("pfnm", "Fig. 4 (CIFAR-10 panels)", missing=_NO_CIFAR),
    CoverageItem("pfnm", "Supplement Table 1 (settings)", note="settings, no experiment"),
    CoverageItem("pfnm", "Supplement Fig. 2 (network sizes vs J and C)",
                 ("pfnm/j_sweep", "pfnm/depth"), "pfnm-fig-4",
                 lambda r: [l for l in pfnm_depth_claims(r) if "supplement Fig. 2" in l]),
    CoverageItem("pfnm", "Supplement Fig. 3a (downpour SGD, many rounds)", ("pfnm/dsgd_rounds",),
                 "pfnm-dsgd", pfnm_dsgd_claims, note="up to 200 rounds of the paper's > 4000"),
    CoverageItem("pfnm", "Supplement Fig. 3b (streaming)", ("pfnm/streaming",), "pfnm-streaming",
                 pfnm_streaming_claims),
    CoverageItem("pfnm", "Supplement Fig. 4 (sensitivity, MNIST)", ("pfnm/sensitivity",),
                 "pfnm-sensitivity", pfnm_sensitivity_claims),
    CoverageItem("pfnm", "Supplement Fig. 4 (CIFAR-10 panels)", missing=_NO_CIFAR),
    CoverageItem("pfnm", "Supplement Fig. 5 (sigma^2 vs J)", ("pfnm/sensitivity_sigma",),
                 "pfnm-sigma"),
    CoverageItem("fola", "Fig. 1", note="an illustration, no experiment"),
    CoverageItem("fola", "Fig. 2(a) (alpha x N)", ("fola/first_round", "fola/first_round_n"),
                 "fola-fig-2a-n", lambda r: fola_claims(r) + fola_n_claims(r)),
    CoverageItem("fola", "Fig. 2(b)-(d) (B, E, lr)",
                 tuple(f"fola/first_round_{a}" for a in rp.FOLA_LEARNING_AXES), "fola-fig-2bcd",
                 fola_learning_claims),
    CoverageItem("fola", "Fig. 2(e), (f) (CIFAR10-CNN)", missing=_NO_CIFAR),
    CoverageItem("fola", "Fig. 3(a) (MNIST-MLP curves)", ("fola/curves", "fola/curves_n"),
                 "fola-fig-3a-n", fola_curves_claims),
    CoverageItem("fola", "Fig. 3(b) (CIFAR10-CNN curves)", missing=_NO_CIFAR),
)


def _claims_text(lines: Sequence[str]) -> str:
  held = sum(bool(re.search(r": held \(", l)) for l in lines)
  not_held = sum(bool(re.search(r": not held \(", l)) for l in lines)
  pending = sum("pending" in l for l in lines)
  parts = [f"{held} held"] * bool(held) + [f"{not_held} not held"] * bool(not_held) + [
      f"{pending} pending"] * bool(pending)
  return ", ".join(parts) or "—"


def coverage_rows(records: Mapping[str, Mapping[str, Any]]) -> List[Tuple[Any, ...]]:
  """One row per `COVERAGE` item: paper, item, status, records, claims, section."""
  cells = rp.catalogue(records)
  rows = []
  for item in COVERAGE:
    if item.missing:
      rows.append((item.paper, item.item, f"not runnable here: {item.missing}", 0, "—", "—"))
      continue
    if not item.cells:
      rows.append((item.paper, item.item, item.note, 0, "—", "—"))
      continue
    mine = rp.select(cells, item.cells)
    done = [c for c in mine if runner.status(c, records) == "done"]
    left = sum(runner.measured_seconds(c, records) for c in mine
               if runner.status(c, records) != "done")
    if len(done) == len(mine):
      status = "reproduced"
    elif done:
      status = f"partial: {len(done)} of {len(mine)} cells (~{left / 3600:.1f} h to run)"
    else:
      status = f"not run yet: {len(mine)} cells (~{left / 3600:.1f} h)"
    if item.note:
      status += f"; {item.note}"
    claims = _claims_text(item.claims(records)) if item.claims else "—"
    link = f"[section](#{item.anchor})" if item.anchor else "—"
    rows.append((item.paper, item.item, status, len(done), claims, link))
  return rows


def coverage_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("coverage", "Coverage: every table and figure of the four papers")
  lines += _runs.md_table(("paper", "table / figure", "status", "records", "claims", "where"),
                          coverage_rows(records))
  return lines + ["", "Status counts the campaign's cells (`python -m launchers.reproduce "
                  "--list`); hours are estimates from the recorded cells of the same kind on "
                  "this 2-core machine. A claim holds when the difference exceeds its standard "
                  "error over the seeds, or as its line states.", ""]


FIGURES = (("table2_curves.png", plot_table2_curves), ("virtual_beta.png", plot_beta),
           ("virtual_snr_cdf.png", plot_snr_cdf), ("pfnm_j_sweep.png", plot_pfnm),
           ("pfnm_depth_streaming.png", plot_pfnm_more),
           ("fola_first_round.png", plot_fola), ("fola_curves.png", plot_fola_curves)
          ) + calibration_report.FIGURES
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
  lines += coverage_markdown(records)
  lines += table2_markdown(records) + [""]
  lines += default_step_markdown(records)
  lines += ablation_markdown(records)
  lines += calibration_report.calibration_markdown(records)
  for section in (conv_markdown, table3_markdown, snr_markdown, table4_markdown, beta_markdown,
                  v1_markdown, pfnm_markdown, pfnm_depth_markdown, pfnm_streaming_markdown,
                  pfnm_sensitivity_markdown, pfnm_sigma_markdown, pfnm_dsgd_markdown, fola_markdown, fola_n_markdown,
                  fola_learning_markdown, fola_curves_markdown):
    lines += section(records) + [""]
  lines += _anchor("figures", "Figures")
  for name in figures:
    lines.append(f"![{name}]({figure_prefix}{name})")
  return "\n".join(lines).rstrip() + "\n"


def write_report(results_dir: str, readme: Optional[str] = None) -> str:
  """Writes `<results_dir>/REPORT.md` and `<results_dir>/figures/*.png` from the records;
  with `readme`, also replaces the block between `README_BEGIN` and `README_END` in
  that file (ValueError if the markers are missing). Returns the report's text."""
  records = records_lib.read_records(results_dir)
  figures = []
  for name, plot in FIGURES:
    if plot(os.path.join(results_dir, "figures", name), records):
      figures.append(name)
  text = report_markdown(records, figures)
  round_loop.atomic_write_text(os.path.join(results_dir, "REPORT.md"),
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
    round_loop.atomic_write_text(readme, head + README_BEGIN + "\n" + block + README_END + tail)
  return text

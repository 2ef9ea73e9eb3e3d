"""The reproduction report's FOLA sections, from the campaign's records alone.

FOLA's Fig. 2(a) (first-round global accuracy over alpha, at N = 20 and over N),
Fig. 2(b)-(d) (over B, E and lr) and Fig. 3(a) (learning curves, over N): per section
its markdown lines (`*_markdown`) and claim lines (`*_claims`), and the figures
(`FIGURES`) that `reproduction_report` assembles. Every number is read from a record.
This module imports neither TensorFlow nor absl.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from reproduction import _runs
from reproduction import records as records_lib
from reproduction import report_common as common
from reproduction import reproduce as rp

_anchor = _runs.anchor
_label = _runs.label_axes


def _first_round_at_n20(records: Mapping[str, Mapping[str, Any]]) -> Dict[Tuple, List[float]]:
  """(alpha, method) -> first-round GA of the `first_round` cells (N = 20)."""
  return common.summarise(fola_first_round_rows(records, ("first_round",)), ("alpha", "method"),
                          "global_accuracy")


def _first_round_over_n(records: Mapping[str, Mapping[str, Any]]) -> Dict[Tuple, List[float]]:
  """(alpha, N, method) -> first-round GA of the `first_round` and `first_round_n` cells."""
  return common.summarise(fola_first_round_rows(records, ("first_round", "first_round_n")),
                          ("alpha", "num_clients", "method"), "global_accuracy")


def fola_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 2(a) at N = 20: FOLA's first-round GA above FedAvg's at alpha <= 0.1, beyond
  the standard error over 3 repeats (`above_claim`)."""
  acc = _first_round_at_n20(records)
  claims = []
  for a in rp.FOLA_ALPHAS:
    if a <= 0.1 and acc.get((a, "fola")) and acc.get((a, "fedavg")):
      claims.append(common.above_claim(f"alpha = {rp.fmt_number(a)}, N = 20: FOLA's "
                                       "first-round GA above FedAvg's", acc[(a, "fola")],
                                       acc[(a, "fedavg")], "GA"))
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
      rows.append((rp.fmt_number(a),) + tuple(common.pm(v) for v in vals) +
                  (max(len(v) for v in vals),))
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
                            [(m, common.pm(v), len(v)) for m, v in sorted(best.items())])
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
  acc = _first_round_over_n(records)
  ns = sorted({n for _, n, _ in acc})
  claims = []
  for a in (0.01, 0.1):
    pts = [(n, np.mean(acc[(a, n, "fola")]), np.mean(acc[(a, n, "fedavg")])) for n in ns
           if (a, n, "fola") in acc and (a, n, "fedavg") in acc]
    if len(pts) > 1:
      wins = [n for n, f, g in pts if f > g]
      claims.append(common.claim(len(wins) == len(pts), f"alpha = {a:g}: FOLA's first-round GA "
                                 "above FedAvg's at every N", "; ".join(
                                     f"N = {n}: {100 * f:.1f} vs {100 * g:.1f}"
                                     for n, f, g in pts)))
  for a in rp.FOLA_ALPHAS:
    pts = [(n, np.mean(acc[(a, n, "fedavg")])) for n in ns if (a, n, "fedavg") in acc]
    if len(pts) == len(rp.FOLA_NS):
      falls = all(y2 <= y1 for (_, y1), (_, y2) in zip(pts, pts[1:]))
      claims.append(common.claim(falls, f"alpha = {a:g}: FedAvg's first-round GA falls as N "
                                 "grows (\"when N becomes larger, AE always increases\")",
                                 ", ".join(f"{n}: {100 * y:.1f}" for n, y in pts)))
  return claims


def fola_n_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  acc = _first_round_over_n(records)
  ns = sorted({n for _, n, _ in acc})
  rows = []
  for m in rp.FOLA_METHODS:
    if m == "fedcurv":
      continue  # its first round is FedAvg's (above)
    for a in rp.FOLA_ALPHAS:
      if any((a, n, m) in acc for n in ns):
        rows.append((m, f"{a:g}") + tuple(common.pm(acc.get((a, n, m), [])) for n in ns) +
                    (max(len(acc.get((a, n, m), [])) for n in ns),))
  lines = _anchor("fola-fig-2a-n", "FOLA Fig. 2(a): first-round global accuracy % over alpha x "
                  "N (MNIST-MLP, E = 5, lr = 0.01, B = 32; mean ± std over repeats)")
  lines += _runs.md_table(("method", "alpha") + tuple(f"N = {n}" for n in ns) + ("repeats",),
                          rows)
  return lines + ["", "Claims:", ""] + (fola_n_claims(records) or ["- pending (no records)."])


def _learning_rows(records: Mapping[str, Mapping[str, Any]],
                   axis: str) -> Dict[Tuple, List[float]]:
  return common.summarise(fola_first_round_rows(records, (f"first_round_{axis}",)),
                          ("value", "method"), "global_accuracy")


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
      claims.append(common.claim(best["fola"][0] > best["fedavg"][0], f"{axis}: FOLA's best GA "
                                 "above FedAvg's", f"{100 * best['fola'][0]:.1f} at "
                                 f"{best['fola'][1]:g} vs {100 * best['fedavg'][0]:.1f} at "
                                 f"{best['fedavg'][1]:g}"))
      inner = best["fola"][1] not in (values[0], values[-1])
      claims.append(common.claim(inner, f"{axis}: FOLA's GA best at a moderate value",
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
      rows.append((axis, f"{v:g}") +
                  tuple(common.pm(acc.get((v, m), [])) for m in ("fola", "fedavg")) +
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
  are smooth. Each holds beyond its standard error over 3 repeats (`above_claim`)."""
  by = fola_curve_records(records)
  claims = []
  for n in sorted({n for n, _ in by}):
    f, g, o = by.get((n, "fola")), by.get((n, "fedavg")), by.get((n, "laplace_offline"))
    if f and g:
      claims.append(common.above_claim(f"N = {n}: FOLA's GA above FedAvg's at round 5",
                                       [_at_round(r, 5) for r in f],
                                       [_at_round(r, 5) for r in g], "GA at round 5"))
    if f and o:
      claims.append(common.above_claim(f"N = {n}: the offline Laplace curves vary more than "
                                       "FOLA's", [_largest_drop(r) for r in o],
                                       [_largest_drop(r) for r in f],
                                       "largest fall between rounds"))
  return claims


def fola_curves_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  rows = [(n, m, common.pm([_at_round(r, 5) for r in recs]),
           common.pm([records_lib.best_value(r, "server_accuracy") for r in recs]),
           common.pm([_largest_drop(r) for r in recs]), len(recs))
          for (n, m), recs in fola_curve_records(records).items()]
  lines = _anchor("fola-fig-3a-n", f"FOLA Fig. 3(a) for several N (alpha = 0.01, E = 5, lr = "
                  f"0.01, {rp.FOLA_CURVE_ROUNDS} rounds): GA % at round 5, best, and the largest "
                  "fall between rounds (pp)")
  lines += _runs.md_table(("N", "method", "GA round 5", "best GA", "largest fall", "repeats"),
                          rows)
  return lines + ["", "Claims:", ""] + (fola_curves_claims(records) or ["- pending (no records)."])


def plot_fola(path: str, records: Mapping[str, Mapping[str, Any]]) -> bool:
  """Fig. 2(a)-(d): first-round GA vs alpha (one line per method and N; FOLA solid,
  FedAvg dashed), then vs B, E and lr."""
  acc = _first_round_over_n(records)
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
        ax.plot(*common.mean_curve([r["result"]["curves"] for r in recs], "server_accuracy"),
                label=f"{m} ({len(recs)} repeats)")
    _label(ax, "round", "global accuracy", f"FOLA Fig. 3(a), MNIST-MLP, alpha = 0.01, N = {n}")
  _runs.save_figure(fig, path, tight=True)
  return True


FIGURES = (("fola_first_round.png", plot_fola), ("fola_curves.png", plot_fola_curves))

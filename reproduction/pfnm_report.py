"""The reproduction report's PFNM sections, from the campaign's records alone.

PFNM's Figs. 2-3 (accuracy and global model size vs the number of batches J), Fig. 4
(depth), the supplement's streaming (Fig. 3b), sensitivity (Figs. 4 and 5) and
downpour SGD (Fig. 3a) experiments: per section its markdown lines (`*_markdown`) and
claim lines (`*_claims`), and the figures (`FIGURES`) that `reproduction_report`
assembles. Every number is read from a record. This module imports neither
TensorFlow nor absl.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from reproduction import _runs
from reproduction import report_common as common
from reproduction import reproduce as rp

_anchor = _runs.anchor
_label = _runs.label_axes

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
      claims.append(common.claim(wins == len(pts), f"{part}: PFNM above one-shot FedAvg and the "
                                 "local networks at every J (Fig. 2)",
                                 f"at {wins} of {len(pts)} J values"))
    sizes = [(J, _mean_of(acc[(part, J, "pfnm")], "neurons")) for J in rp.PFNM_J
             if acc.get((part, J, "pfnm"))]
    if sizes:
      claims.append(common.claim(all(n < 100 * J for J, n in sizes),
                                 f"{part}: PFNM's global model smaller than the 100 J neurons of "
                                 "the stacked batch networks at every J (Fig. 2b/d, \"significant "
                                 "compression\")", "; ".join(f"J = {J}: {n:.0f} of {100 * J}"
                                                             for J, n in sizes)))
    for m in ("uniform_ensemble", "weighted_ensemble") + rp.PFNM_EXTRA_METHODS:
      ens = [(J, _mean_of(acc[(part, J, "pfnm")], "accuracy"),
              _mean_of(acc[(part, J, m)], "accuracy")) for J in rp.PFNM_J
             if acc.get((part, J, "pfnm")) and acc.get((part, J, m))]
      if ens:
        close = [J for J, p, e in ens if p >= e - 0.01]
        worst = min(ens, key=lambda t: t[1] - t[2])
        claims.append(common.claim(len(close) == len(ens), f"{part}: PFNM competitive with {m} "
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
        rows.append((part, J) + tuple(common.pm(_column(v, "accuracy")) for v in vals) +
                    (f"{_mean_of(own, 'neurons'):.0f} ({100 * J})" if own else "—",
                     f"{_mean_of(own, 'params'):.0f}" if own else "—",
                     max(len(v) for v in vals)))
  lines += _runs.md_table(header, rows)
  return lines + ["", "Claims:", ""] + (pfnm_claims(records) or ["- pending (no records)."])


def _pfnm_rows_of(records: Mapping[str, Mapping[str, Any]], experiment_name: str,
                  part: str) -> List[Mapping[str, Any]]:
  return [row for r in common.records_of(records, "pfnm", experiment_name, row=part)
          for row in r["result"]["rows"]]



def pfnm_depth_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Fig. 4: PFNM competitive (within 1 pp or above) with the extra-resource baselines at
  every depth C; supplement Fig. 2: its global model below stacking (100 J C neurons)."""
  claims = []
  for part in rp.PFNM_PARTITIONS:
    rows = _pfnm_rows_of(records, "depth", part)
    acc = common.summarise(rows, ("C", "method"), "accuracy")
    neurons = common.summarise(rows, ("C", "method"), "neurons")
    cs = sorted({c for c, m in acc if m == "pfnm"})
    for m in ("uniform_ensemble", "weighted_ensemble") + rp.PFNM_EXTRA_METHODS:
      pts = [(c, np.mean(acc[(c, "pfnm")]), np.mean(acc[(c, m)])) for c in cs if (c, m) in acc]
      if pts:
        close = [c for c, p, e in pts if p >= e - 0.01]
        worst = min(pts, key=lambda t: t[1] - t[2])
        claims.append(common.claim(len(close) == len(pts), f"{part}: PFNM competitive with {m} "
                                   "at every depth (Fig. 4, J = 10)", f"at {len(close)} of "
                                   f"{len(pts)} C values; largest gap at C = {worst[0]}: "
                                   f"{100 * worst[1]:.1f} vs {100 * worst[2]:.1f}"))
    if cs:
      share = [(c, np.mean(neurons[(c, "pfnm")]) / (100 * rp.PFNM_DEPTH_J * c)) for c in cs]
      worst = max(share, key=lambda t: t[1])
      claims.append(common.claim(worst[1] < 1.0, f"{part}: PFNM's master network smaller than "
                                 "the stacked batch networks at every depth (supplement Fig. 2)",
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
    acc = common.summarise(data, ("C", "method"), "accuracy")
    neurons = common.summarise(data, ("C", "method"), "neurons")
    for c in sorted({c for c, _ in acc}):
      rows.append((part, c) + tuple(common.pm(acc.get((c, m), [])) for m in methods) +
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
  the local networks (it communicates as rarely as the ensembles), beyond the standard
  error over 3 trials (`above_claim`)."""
  claims = []
  for part in rp.PFNM_PARTITIONS:
    acc = common.summarise(_pfnm_rows_of(records, "streaming", part), ("step", "method"),
                           "accuracy")
    if not acc:
      continue
    last = max(s for s, _ in acc)
    for m in ("downpour_sgd", "local"):
      if (last, "pfnm_streaming") in acc and (last, m) in acc:
        claims.append(common.above_claim(f"{part}: PFNM-Streaming above {m} at the last step",
                                         acc[(last, "pfnm_streaming")], acc[(last, m)],
                                         f"step {last}:"))
  return claims


def pfnm_streaming_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("pfnm-streaming", f"PFNM streaming (supplement Fig. 3b): test accuracy % per "
                  f"step (MNIST, J = {rp.PFNM_STREAMING['J']}, S = {rp.PFNM_STREAMING['steps']})")
  rows = []
  for part in rp.PFNM_PARTITIONS:
    acc = common.summarise(_pfnm_rows_of(records, "streaming", part), ("step", "method"),
                           "accuracy")
    methods = sorted({m for _, m in acc}, key=lambda m: (m != "pfnm_streaming", m))
    steps = sorted({s for s, _ in acc})
    for s in [x for x in steps if x in (1, 5, 10) or x == steps[-1]]:
      rows.append((part, s, "; ".join(f"{m} {common.pm(acc[(s, m)])}" for m in methods
                                      if (s, m) in acc)))
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
    grid = common.summarise(rows, SENSITIVITY_AXES, "train_accuracy")
    means = [np.mean(v) for v in grid.values()]
    spread = 100 * (max(means) - min(means))
    claims.append(common.claim(spread <= 2.0, f"{part}: PFNM's training accuracy stable over the "
                               "sigma0^2 x gamma0 x sigma^2 grid (range within 2 pp)",
                               f"range {spread:.1f} pp over {len(grid)} points, J = "
                               f"{rp.PFNM_SENSITIVITY_J}"))
    effect = {ax: 100 * np.ptp([np.mean(v) for v in common.summarise(rows, (ax,),
                                                                     "train_accuracy").values()])
              for ax in SENSITIVITY_AXES}
    top = max(effect, key=effect.get)
    claims.append(common.claim(top == "sigma_sq", f"{part}: sigma^2 has the largest effect",
                               ", ".join(f"{ax} {v:.2f} pp" for ax, v in effect.items())))
  return claims


def pfnm_sensitivity_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("pfnm-sensitivity", f"PFNM sensitivity (supplement Fig. 4): accuracy % over "
                  f"sigma0^2, gamma0, sigma^2 (MNIST, J = {rp.PFNM_SENSITIVITY_J}; train / test, "
                  "mean over trials)")
  rows = []
  for part in rp.PFNM_PARTITIONS:
    data = _pfnm_rows_of(records, "sensitivity", part)
    train = common.summarise(data, SENSITIVITY_AXES, "train_accuracy")
    test = common.summarise(data, SENSITIVITY_AXES, "test_accuracy")
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
    train = common.summarise(data, ("J", "sigma_sq"), "train_accuracy")
    test = common.summarise(data, ("J", "sigma_sq"), "test_accuracy")
    for key in sorted(train):
      rows.append((part, key[0], f"{key[1]:g}", f"{100 * np.mean(train[key]):.1f}",
                   f"{100 * np.mean(test[key]):.1f}", len(train[key])))
  lines += _runs.md_table(("partition", "J", "sigma^2", "train", "test", "trials"), rows)
  return lines + ["", "The supplement states no claim of its own for this figure (Fig. 4's "
                  "\"sigma^2 has slightly higher impact\" is judged there)."]


def _dsgd_by_rounds(records: Mapping[str, Mapping[str, Any]]) -> Dict[int, List[float]]:
  """Downpour SGD's accuracy per trial, by its communication rounds (supplement Fig. 3a)."""
  out: Dict[int, List[float]] = {}
  for r in common.records_of(records, "pfnm", "dsgd_rounds"):
    out.setdefault(int(r["flags"]["comm_rounds"]), []).extend(
        _column(r["result"]["rows"], "accuracy"))
  return dict(sorted(out.items()))


def pfnm_dsgd_claims(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  """Supplement Fig. 3a: downpour SGD needs far more communication (> 4000 rounds) to
  reach PFNM's one-shot accuracy (heterogeneous MNIST, J = 25): PFNM above downpour SGD
  after our most rounds, beyond the standard error over 3 trials (`above_claim`)."""
  pfnm = pfnm_j_rows(records).get(("class_dirichlet", rp.PFNM_DSGD_J, "pfnm"))
  by_rounds = _dsgd_by_rounds(records)
  if not by_rounds or not pfnm:
    return ["- supplement Fig. 3a: pending (no records)."]
  most = max(rp.PFNM_DSGD_ROUNDS)
  return [common.above_claim(f"supplement Fig. 3a: PFNM's one-shot accuracy above downpour "
                             f"SGD's after {most} communication rounds (the paper: downpour "
                             "needs > 4000 to reach it)", _column(pfnm, "accuracy"),
                             by_rounds.get(most, []), "accuracy %")]


def pfnm_dsgd_markdown(records: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = _anchor("pfnm-dsgd", f"PFNM supplement Fig. 3a: downpour SGD vs its communication "
                  f"rounds (heterogeneous MNIST, J = {rp.PFNM_DSGD_J}, one trial, 3 at "
                  f"{max(rp.PFNM_DSGD_ROUNDS)} rounds; PFNM communicates once)")
  rows = [(rounds, common.pm(acc), len(acc))
          for rounds, acc in _dsgd_by_rounds(records).items()]
  lines += _runs.md_table(("rounds", "D-SGD accuracy %", "trials"), rows)
  return lines + ["", "Claims:", ""] + pfnm_dsgd_claims(records)


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
  data = {(e, part): common.summarise(_pfnm_rows_of(records, e, part), keys, "accuracy")
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


FIGURES = (("pfnm_j_sweep.png", plot_pfnm), ("pfnm_depth_streaming.png", plot_pfnm_more))

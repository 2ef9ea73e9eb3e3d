"""The reproduction report: the papers' tables, claims and figures, and a coverage
table, rebuilt from the campaign's records alone (`reproduction.records`) of the
catalogue's cells (`reproduction.reproduce`).

The sections come one module a paper: `virtual_report` (VIRTUAL and its v1),
`pfnm_report`, `fola_report`, and `calibration_report` (ours, issue 34); here they
are assembled, with the coverage table (`COVERAGE`: every table and figure of the
papers, its cells and its claims) and the provenance. `write_report` writes
`<results_dir>/REPORT.md`, `<results_dir>/figures/*.png` and the reproduction block of
docs/reproduction.md (the launcher's `--readme`). Every number is read from a record;
nothing here runs a cell. This module imports neither TensorFlow nor absl.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple

from tfbfl import round_loop
from tfbfl import run_directory
from reproduction import _runs
from reproduction import calibration_report
from reproduction import fola_report
from reproduction import pfnm_report
from reproduction import records as records_lib
from reproduction import reproduce as rp
from reproduction import runner
from reproduction import virtual_report


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
  """Every paper section's claim lines (`_matching` picks a coverage item's among them)."""
  return (virtual_report.table2_claims(virtual_report.table2_summary(records)) +
          virtual_report.conv_claims(records) + virtual_report.conv_default_step_claims(records) +
          virtual_report.beta_claims(records) +
          virtual_report.snr_claims(records) + virtual_report.table3_claims(records) +
          virtual_report.table4_claims(records) + virtual_report.v1_claims(records) +
          pfnm_report.pfnm_claims(records) + pfnm_report.pfnm_depth_claims(records) +
          pfnm_report.pfnm_streaming_claims(records) +
          pfnm_report.pfnm_sensitivity_claims(records) + pfnm_report.pfnm_dsgd_claims(records) +
          fola_report.fola_claims(records) + fola_report.fola_n_claims(records) +
          fola_report.fola_learning_claims(records) + fola_report.fola_curves_claims(records))


_NO_VSN_HAR = "VSN and UCI HAR: no file of either under ../shared/data, no package ships them"
_NO_SHAKESPEARE = "LEAF Shakespeare: not under ../shared/data, no package ships it"
_NO_CIFAR = "CIFAR-10: no batches under ../shared/data, no package installed here ships them"
_DIAGRAM = "a diagram, no experiment"

COVERAGE = (
    CoverageItem("virtual", "Table I (data statistics)",
                 note="not a run: `python -m launchers.dataset_stats` prints a row's statistics"),
    CoverageItem("virtual", "Fig. 1", note=_DIAGRAM),
    CoverageItem("virtual", "Fig. 2 (beta, FEMNIST)", ("virtual/beta",), "virtual-fig-2",
                 virtual_report.beta_claims),
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
                 "virtual-table-ii-conv", virtual_report.conv_claims,
                 note="at the MLP row's tuned settings, no grid of its own (cost)"),
    CoverageItem("tfbfl", "Table II, FEMNIST-conv row's baselines at server step 1 (ours)",
                 ("virtual/default_step/femnist_conv",), "virtual-conv-default-step",
                 virtual_report.conv_default_step_claims,
                 note="plain averaging, as the paper's FedAvg and FedProx; at the MLP row's "
                 "tuned steps some of their conv runs fell to chance"),
    CoverageItem("virtual", "Table II, VSN and HAR rows", missing=_NO_VSN_HAR),
    CoverageItem("virtual", "Table II, NLP (Shakespeare) row", missing=_NO_SHAKESPEARE),
    CoverageItem("virtual", "Fig. 3 (S and MT cross-entropy per round)",
                 ("virtual/table2/mnist", "virtual/table2/pmnist", "virtual/table2/femnist_mlp",
                  "virtual/table2_conv"), "figures",
                 note="figures/table2_curves.png, log scales; VSN, HAR, NLP: no data"),
    CoverageItem("virtual", "Fig. 4 (SNR CDF)", ("virtual/snr_cdf",), "virtual-fig-4",
                 virtual_report.snr_claims),
    CoverageItem("virtual", "Table III (SNR-pruned updates)", ("virtual/table3",),
                 "virtual-table-iii", virtual_report.table3_claims),
    CoverageItem("virtual", "Table IV, FEMNIST-MLP (E = 100)", ("virtual/table4",),
                 "virtual-table-iv", virtual_report.table4_claims),
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
                 "pfnm-figs-2-3",
                 lambda r: [l for l in pfnm_report.pfnm_claims(r) if "Fig. 2" in l]),
    CoverageItem("pfnm", "Fig. 3 (a, b: MNIST, extra-resource baselines)",
                 ("pfnm/j_sweep", "pfnm/extra"), "pfnm-figs-2-3",
                 lambda r: [l for l in pfnm_report.pfnm_claims(r) if "Fig. 3" in l]),
    CoverageItem("pfnm", "Fig. 3 (c, d: CIFAR-10)", missing=_NO_CIFAR),
    CoverageItem("pfnm", "Fig. 4 (MNIST: depth C at J = 10)", ("pfnm/depth",), "pfnm-fig-4",
                 lambda r: [l for l in pfnm_report.pfnm_depth_claims(r) if "Fig. 4" in l]),
    CoverageItem("pfnm", "Fig. 4 (CIFAR-10 panels)", missing=_NO_CIFAR),
    CoverageItem("pfnm", "Supplement Table 1 (settings)", note="settings, no experiment"),
    CoverageItem("pfnm", "Supplement Fig. 2 (network sizes vs J and C)",
                 ("pfnm/j_sweep", "pfnm/depth"), "pfnm-fig-4",
                 lambda r: [l for l in pfnm_report.pfnm_depth_claims(r)
                            if "supplement Fig. 2" in l]),
    CoverageItem("pfnm", "Supplement Fig. 3a (downpour SGD, many rounds)", ("pfnm/dsgd_rounds",),
                 "pfnm-dsgd", pfnm_report.pfnm_dsgd_claims,
                 note="up to 200 rounds of the paper's > 4000"),
    CoverageItem("pfnm", "Supplement Fig. 3b (streaming)", ("pfnm/streaming",), "pfnm-streaming",
                 pfnm_report.pfnm_streaming_claims),
    CoverageItem("pfnm", "Supplement Fig. 4 (sensitivity, MNIST)", ("pfnm/sensitivity",),
                 "pfnm-sensitivity", pfnm_report.pfnm_sensitivity_claims),
    CoverageItem("pfnm", "Supplement Fig. 4 (CIFAR-10 panels)", missing=_NO_CIFAR),
    CoverageItem("pfnm", "Supplement Fig. 5 (sigma^2 vs J)", ("pfnm/sensitivity_sigma",),
                 "pfnm-sigma"),
    CoverageItem("fola", "Fig. 1", note="an illustration, no experiment"),
    CoverageItem("fola", "Fig. 2(a) (alpha x N)", ("fola/first_round", "fola/first_round_n"),
                 "fola-fig-2a-n",
                 lambda r: fola_report.fola_claims(r) + fola_report.fola_n_claims(r)),
    CoverageItem("fola", "Fig. 2(b)-(d) (B, E, lr)",
                 tuple(f"fola/first_round_{a}" for a in rp.FOLA_LEARNING_AXES), "fola-fig-2bcd",
                 fola_report.fola_learning_claims),
    CoverageItem("fola", "Fig. 2(e), (f) (CIFAR10-CNN)", missing=_NO_CIFAR),
    CoverageItem("fola", "Fig. 3(a) (MNIST-MLP curves)", ("fola/curves", "fola/curves_n"),
                 "fola-fig-3a-n", fola_report.fola_curves_claims),
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
  lines = _runs.anchor("coverage", "Coverage: every table and figure of the four papers")
  lines += _runs.md_table(("paper", "table / figure", "status", "records", "claims", "where"),
                          coverage_rows(records))
  return lines + ["", "Status counts the campaign's cells (`python -m launchers.reproduce "
                  "--list`); hours are estimates from the recorded cells of the same kind on "
                  "this 2-core machine. A claim holds when the difference exceeds its standard "
                  "error over the seeds, or as its line states.", ""]


FIGURES = (virtual_report.FIGURES + pfnm_report.FIGURES + fola_report.FIGURES +
           calibration_report.FIGURES)
README_BEGIN = "<!-- reproduction:begin (written by `python -m launchers.reproduce --report`) -->"
README_END = "<!-- reproduction:end -->"


def provenance_line(records: Mapping[str, Mapping[str, Any]]) -> str:
  """The report's first line: how many records, their hours, and the code that made them
  (every commit a record's rounds ran, how many ran modified source or mixed code)."""
  code = lambda r: [r] + list(r.get("code_history") or ())
  commits = sorted({e.get("git_commit") or "unknown" for r in records.values() for e in code(r)})
  hours = sum(records_lib.wall_seconds(r) for r in records.values()) / 3600
  cores = sorted({r["machine"].get("cores") for r in records.values()})
  # A modified record without a diff hash predates the rule that counts only code (above).
  modified = sum(any(e.get("git_diff_sha256") for e in code(r)) for r in records.values())
  old_rule = sum(bool(r.get("git_modified")) and "git_diff_sha256" not in r
                 for r in records.values())
  mixed = sum(len(run_directory.distinct_codes(r.get("code_history") or ())) > 1
              for r in records.values())
  unknown = sum(bool(r.get("resumed_from_rounds")) and "code_history" not in r
                for r in records.values())
  return (f"{len(records)} cell records under `results/` ({hours:.1f} CPU-wall hours on "
          f"{'/'.join(str(c) for c in cores) or '?'}-core machines), from commits "
          f"{', '.join(c[:7] for c in commits) or '—'}; {modified} ran source that differs "
          f"from its commit (`git_diff_sha256` names the difference), {old_rule} carry the "
          f"older rule's `git_modified` (any tracked file, see above), {mixed} {_were(mixed)} resumed "
          "under other code than their first rounds ran (`code_history` names each stretch's), "
          f"{unknown} {_were(unknown)} resumed before records kept that history (they name the code of "
          "their last invocation only). "
          "Every number below is rebuilt from the records alone by `python -m "
          "launchers.reproduce --report`; each record holds its cell's command.")


def _were(count: int) -> str:
  return "was" if count == 1 else "were"


def report_markdown(records: Mapping[str, Mapping[str, Any]], figures: Iterable[str],
                    figure_prefix: str = "figures/") -> str:
  """The report: the three papers' tables, claims, figures and provenance."""
  lines = [provenance_line(records), ""]
  lines += coverage_markdown(records)
  lines += virtual_report.table2_markdown(records) + [""]
  lines += virtual_report.default_step_markdown(records)
  lines += virtual_report.ablation_markdown(records)
  lines += calibration_report.calibration_markdown(records)
  for section in (virtual_report.conv_markdown, virtual_report.table3_markdown,
                  virtual_report.snr_markdown, virtual_report.table4_markdown,
                  virtual_report.beta_markdown, virtual_report.v1_markdown,
                  pfnm_report.pfnm_markdown, pfnm_report.pfnm_depth_markdown,
                  pfnm_report.pfnm_streaming_markdown, pfnm_report.pfnm_sensitivity_markdown,
                  pfnm_report.pfnm_sigma_markdown, pfnm_report.pfnm_dsgd_markdown,
                  fola_report.fola_markdown, fola_report.fola_n_markdown,
                  fola_report.fola_learning_markdown, fola_report.fola_curves_markdown):
    lines += section(records) + [""]
  lines += _runs.anchor("figures", "Figures")
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
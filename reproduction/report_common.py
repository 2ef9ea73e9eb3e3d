"""What the reproduction report's paper sections share (`virtual_report`, `pfnm_report`,
`fola_report`): picking a paper's records, grouping result rows, mean curves, a
`mean ± std` cell and a claim line.

A claim line reads `- text: held (numbers).` or `- text: not held (numbers).`; the
coverage table (`reproduction_report`) counts them. A claim that one mean is above
another (`above_claim`) holds when the difference exceeds its standard error over the
seeds, and is pending until both sides have their seeds. This module imports neither
TensorFlow nor absl.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from reproduction import _runs


def pm(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
  """`mean ± std` of `values` times `scale` over the seeds ("—" for none)."""
  m, s, n = _runs.mean_std(values, scale)
  if n == 0:
    return "—"
  if n == 1:  # no spread to show: the seeds column says 1
    return f"{m:.{digits}f}"
  return f"{m:.{digits}f} ± {s:.{digits}f}"


def claim(held: bool, text: str, numbers: str) -> str:
  """A claim line as the coverage table counts it: `- text: held (numbers)`."""
  return f"- {text}: {'held' if held else 'not held'} ({numbers})."


def compare(a: Sequence[float], b: Sequence[float], scale: float = 100.0
            ) -> Optional[Tuple[float, float, float, float, int, int]]:
  """(mean a, mean b, difference, its standard error, seeds a, seeds b) of the values
  times `scale`; None if a side has no value."""
  ma, sa, na = _runs.mean_std(a, scale)
  mb, sb, nb = _runs.mean_std(b, scale)
  if not na or not nb:
    return None
  diff, se = _runs.mean_difference((ma, sa, na), (mb, sb, nb))
  return ma, mb, diff, se, na, nb


def above_claim(text: str, a: Sequence[float], b: Sequence[float], what: str,
                seeds: int = 3) -> str:
  """`text` holds when mean(a) exceeds mean(b) by more than its standard error; pending
  while either side has fewer than `seeds` values."""
  c = compare(a, b)
  if c is None or min(c[4], c[5]) < seeds:
    have = (c[4], c[5]) if c else (len(a), len(b))
    return f"- {text}: pending ({have[0]} and {have[1]} of {seeds} seeds recorded)."
  ma, mb, diff, se, na, _ = c
  return claim(_runs.beyond_error(diff, se) > 0, text,
               f"{what} {ma:.1f} vs {mb:.1f}, mean of {na} seeds; difference {diff:+.2f} "
               f"pp, s.e. {se:.2f}")


def records_of(records: Mapping[str, Mapping[str, Any]], paper: str, experiment_name: str,
               **fields: Any) -> List[Mapping[str, Any]]:
  """The records of one paper's experiment whose cell fields equal `fields`, by seed."""
  return sorted((r for r in records.values()
                 if r["cell"]["paper"] == paper and r["cell"]["experiment"] == experiment_name
                 and all(r["cell"][k] == v for k, v in fields.items())),
                key=lambda r: r["cell"]["seed"])


def summarise(rows: Sequence[Mapping[str, Any]], keys: Sequence[str],
              value: str) -> Dict[Tuple, List[float]]:
  """The `value` column of result rows (PFNM's trials, FOLA's first rounds), grouped by
  their `keys` columns: key tuple -> values."""
  out: Dict[Tuple, List[float]] = {}
  for row in rows:
    out.setdefault(tuple(row[k] for k in keys), []).append(float(row[value]))
  return out


def mean_curve(curves: Sequence[Mapping[str, Any]], key: str) -> Tuple[np.ndarray, np.ndarray]:
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

"""Seconds of a run's export (`python -m launchers.export`), source trees side by side.

Trains two runs on the bundled digits once (VIRTUAL at its defaults, so its models
are the 10-pass Monte Carlo predictive, and FedAvg; 10 clients, 1 round, no
export), then rewrites each run's export from its checkpoint with every source tree
given, alternating trees `--repeats` times, each in a fresh process run from that
tree (so that tree's `tfbfl` is the one imported). Reports the export's own seconds
(what `export_run` prints: building the server's and the 10 clients' predictors
and saving them), the median per tree and run, and each tree's ratio to the first;
the 1-minute load average before and after.

    .venv/bin/python -m benchmarks.export_time --trees=/path/to/old/checkout,.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = {"virtual": ["--algorithm=virtual"], "fedavg": ["--algorithm=fedavg"]}
_SECONDS = re.compile(r"exported the server model and \d+ client models to .* \(([0-9.]+) s\)")


def _launcher(tree: str, name: str, *args: str) -> str:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run([sys.executable, "-m", f"launchers.{name}", *args],
                        cwd=tree,
                        env=env,
                        capture_output=True,
                        text=True,
                        stdin=subprocess.DEVNULL,
                        check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"launchers.{name} in {tree} failed:\n{proc.stderr[-2000:]}")
  return proc.stdout


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--trees", default=ROOT,
                      help="comma-separated source trees (checkouts of this repository)")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  trees = [os.path.abspath(t) for t in args.trees.split(",") if t]
  for tree in trees:
    if not os.path.isfile(os.path.join(tree, "launchers", "export.py")):
      parser.error(f"--trees: {tree} has no launchers/export.py (not a checkout of tfbfl).")
  if args.repeats < 1:
    parser.error(f"--repeats must be positive, got {args.repeats}.")
  load_before = os.getloadavg()[0]
  seconds = {(t, r): [] for t in trees for r in RUNS}
  with tempfile.TemporaryDirectory(prefix="tfbfl-export-time-") as work:
    for run, flags in RUNS.items():
      _launcher(trees[0], "train", *flags, "--rounds=1", "--seed=0", "--export=false",
                f"--output_dir={os.path.join(work, run)}")
    for repeat in range(args.repeats):
      for tree in trees:
        for run in RUNS:
          out = _launcher(tree, "export", f"--output_dir={os.path.join(work, run)}",
                          f"--export_dir={os.path.join(work, 'export', run)}")
          match = _SECONDS.search(out)
          if match is None:
            raise RuntimeError(f"no export time in the output of {tree}:\n{out[-2000:]}")
          seconds[(tree, run)].append(float(match.group(1)))
          print(f"repeat {repeat + 1}: {run:8s} {float(match.group(1)):6.2f} s  ({tree})",
                flush=True)
  print(f"\nexport seconds (median of {args.repeats}; 10 clients + the server)")
  for run in RUNS:
    first = statistics.median(seconds[(trees[0], run)])
    for tree in trees:
      med = statistics.median(seconds[(tree, run)])
      print(f"  {run:8s} {med:6.2f} s  {med / first:5.2f}x  {tree}")
  print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
  main()

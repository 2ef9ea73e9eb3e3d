"""A finished (or stopped) run brought back from its checkpoint, and exported.

`restore_run(output_dir)` rebuilds a run's data and algorithm from the flags its
`checkpoint.npz` records (`tfbfl.checkpoint`) and returns them with the saved
states; `export_from_checkpoint(output_dir)` writes that state's export
(`tfbfl.export.export_run`), which is what `python -m launchers.export` runs.
This module sits above the driver (`tfbfl.driver`), which builds algorithms
from flags; nothing in the library below imports it.
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
from typing import Any, Dict, Optional

from tfbfl import checkpoint
from tfbfl import client_store as client_store_lib
from tfbfl import data as data_lib
from tfbfl import export
from tfbfl import options
from tfbfl import run_directory
from tfbfl import runtime
from tfbfl import driver

RestoredRun = collections.namedtuple(
    "RestoredRun", ["params", "data", "algorithm", "server_state", "clients", "round"])


def restore_run(output_dir: str, *, data=None, verbose: bool = False) -> RestoredRun:
  """A run's data, algorithm and final state from `<output_dir>/checkpoint.npz`
  (`tfbfl.checkpoint`: never a pickle), rebuilt from the flags the checkpoint
  records, after checking that the data have not changed since (fingerprint).
  Starts the local TFF runtime (building an algorithm needs one).

  Args:
    output_dir: the run's `--output_dir`.
    data: the `FederatedData` of a run trained on data given in code
      (`driver.run_training(data=...)`); None: loaded from the recorded flags.

  Raises:
    FileNotFoundError, ValueError: one line naming the checkpoint.
  """
  output_dir = os.path.abspath(output_dir)
  path = checkpoint.path_in(output_dir)
  meta = checkpoint.read_meta(output_dir)
  flags = dict(meta.get("flags") or {})
  unknown = sorted(k for k in flags if k not in driver.DEFAULTS)
  if unknown:
    print(f"warning: {path} records flags this tfbfl does not know, ignored: {unknown}",
          file=sys.stderr,
          flush=True)
  dataset = flags.get("dataset", driver.DEFAULTS["dataset"])
  if data is None and dataset not in data_lib.DATASETS:
    raise ValueError(f"the run in {output_dir} trained on data given in code "
                     f"(--dataset={dataset!r}); pass the same data: "
                     "tfbfl.restore.export_from_checkpoint(output_dir, data=...).")
  # The recorded values of the settings the data do not use (e.g. npz's
  # num_clients, the file's count) are left out, as the run's own flags left them.
  skip = set(data_lib.IGNORED_SETTINGS.get(dataset, ()))
  if data is not None:
    skip |= set(options.option_fields(data_lib.DataSpec))
  given = {k: v for k, v in flags.items() if k in driver.DEFAULTS and k not in skip}
  # Where the run kept things is not needed: the states come from the checkpoint.
  given.update(output_dir=None, resume=False, overwrite=False, client_store="memory")
  if data is not None:
    given["num_clients"] = len(data.client_ids)
  p = driver.resolve_params(given)
  fd = driver.load_data(p) if data is None else data
  p["dataset"] = dataset
  p["num_clients"] = len(fd.client_ids)
  saved = checkpoint.load(output_dir, data_fingerprint=run_directory.data_fingerprint(fd))
  if saved.snapshot_dir is None:
    clients = saved.clients
  else:
    if not os.path.isdir(saved.snapshot_dir):
      raise FileNotFoundError(
          f"client-state snapshot {saved.snapshot_dir} of {path} does not exist.")
    clients = client_store_lib.DiskClientStore(saved.snapshot_dir)  # read only here
  runtime.set_local_runtime()
  algorithm = driver.build_algorithm(fd, p)
  if verbose:
    print(f"restored {algorithm.name} at round {saved.round} from {path}", flush=True)
  return RestoredRun(p, fd, algorithm, saved.state["server_state"], clients, saved.round)


def recorded_export_samples(output_dir: str) -> int:
  """The run's `--export_samples` (checkpoints do not record it): from
  `summary.json`'s flags, else `flags.txt`; 0 where neither has it."""
  try:
    with open(os.path.join(output_dir, "summary.json"), encoding="utf-8") as f:
      value = json.load(f).get("flags", {}).get("export_samples")
    if value is not None:
      return int(value)
  except (OSError, ValueError, AttributeError, TypeError):
    pass
  try:
    with open(os.path.join(output_dir, run_directory.FLAGS_FILE), encoding="utf-8") as f:
      for line in f:
        m = re.match(r"^--export_samples=(\d+)\s*$", line)
        if m:
          return int(m.group(1))
  except OSError:
    pass
  return 0


def export_from_checkpoint(output_dir: str,
                           *,
                           export_dir: Optional[str] = None,
                           samples: Optional[int] = None,
                           data=None,
                           verbose: bool = True) -> Dict[str, Any]:
  """`export.export_run` of the run in `output_dir` from its last checkpoint (what
  `python -m launchers.export` runs). Holds the run directory's lock meanwhile, so
  a run still writing there is refused.

  Args:
    output_dir: the run's `--output_dir`.
    export_dir: where to write (default `<output_dir>/export`, as the driver).
    samples: `export_run`'s `samples`; None: the run's `--export_samples`
      (`recorded_export_samples`).
    data: the data of a run trained on data given in code (see `restore_run`).
  """
  output_dir = os.path.abspath(output_dir)
  if not os.path.isdir(output_dir):
    raise FileNotFoundError(f"--output_dir={output_dir} is not a directory.")
  lock = run_directory.RunLock(output_dir)
  lock.acquire()
  try:
    run = restore_run(output_dir, data=data, verbose=verbose)
    if samples is None:
      samples = recorded_export_samples(output_dir)
    info = dict(round=run.round, source=checkpoint.path_in(output_dir))
    return export.export_run(run.algorithm,
                             run.server_state,
                             export.iter_client_states(run.algorithm, run.data.client_ids,
                                                       run.clients),
                             export_dir or os.path.join(output_dir, "export"),
                             samples=samples,
                             seed=int(run.params["seed"]),
                             info=info,
                             raw_input=run.data.raw_input,
                             verbose=verbose)
  finally:
    lock.release()

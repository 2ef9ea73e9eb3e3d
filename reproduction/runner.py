"""Runs the catalogue's cells, each as its own launcher process, and writes their records.

Each cell (`reproduction.reproduce.Cell`) runs its launcher as a child process
(`python -m launchers.<name>`) in a scratch directory; when it exits 0, `run_cell` reads
the launcher's own output files (`records.COLLECTORS`) and writes the cell's record
(`make_record`) atomically to `<results_dir>/<cell name>.json`. A cell is done when its
record exists with the same flags (`status`); a cell killed mid-run has no record and
runs again next time, and the others are not touched. `refile` moves a record whose
cell now wants other flags to the cell that runs exactly them. `run` runs a selection
of cells, cheapest first; `listing` is what `--list` prints.

This module imports neither TensorFlow nor absl.
"""

from __future__ import annotations

import csv
import ctypes
import dataclasses
import os
import platform
import re
import shlex
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tfbfl import checkpoint
from tfbfl import round_loop
from tfbfl import run_directory
from reproduction import _runs
from reproduction import records as records_lib
from reproduction.reproduce import Cell
from reproduction.reproduce import RESUMABLE_LAUNCHERS


# -------------------------------------------------------- cells' records
# What ties a cell to its record (whether it is done, the record it gets, a record moved
# to another cell) lives here, above the catalogue: `records` reads records without cells.
# Flags whose default changed after records were made, with the value a record that does
# not name one ran at: VIRTUAL evaluated at the posterior means (`eval_samples=0`) until
# the Monte Carlo predictive became its default (issue 34). The cells name them.
FORMER_DEFAULTS = {"eval_samples": 0}


def _ran_with(rec: Mapping[str, Any], cell: Cell) -> bool:
  """True if record `rec` ran with `cell`'s flags (`_runs.same_flags`; a flag of
  `FORMER_DEFAULTS` that the cell names and the record does not, at its former default)."""
  flags = dict(rec.get("flags") or {})
  for name, value in FORMER_DEFAULTS.items():
    if name in cell.flag_dict:
      flags.setdefault(name, value)
  return _runs.same_flags(flags, cell.flag_dict)


def status(cell: Cell, records: Mapping[str, Mapping[str, Any]]) -> str:
  """'done', 'stale' (recorded with flags that decide another result: how often a run
  checkpoints does not), 'waiting' (tuning unfinished, even where an earlier tuning's
  record exists: its setting is not known yet) or 'todo'."""
  if cell.depends:
    return "waiting"
  rec = records.get(cell.name)
  if rec is not None:
    if _ran_with(rec, cell):
      return "done"
    return "stale"
  return "waiting" if cell.depends else "todo"


def machine() -> Dict[str, Any]:
  """Where a record was measured (its wall times depend on it)."""
  return dict(cores=os.cpu_count(), platform=platform.platform(), python=platform.python_version(),
              load_1min=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)


def make_record(cell: Cell, command: Sequence[str], result: Dict[str, Any], wall_s: float,
                started: float) -> Dict[str, Any]:
  return _runs.jsonable(
      dict(record_version=records_lib.RECORD_VERSION,
           cell=_cell_fields(cell),
           flags=cell.flag_dict,
           command=" ".join(shlex.quote(a) for a in ["python"] + list(command[1:])),
           **run_directory.source_provenance(),
           started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           wall_time_s=round(wall_s, 1),
           machine=machine(),
           result=result))


def _cell_fields(cell: Cell) -> Dict[str, Any]:
  return dict(name=cell.name, paper=cell.paper, experiment=cell.experiment, row=cell.row,
              algorithm=cell.algorithm, setting=cell.setting, seed=cell.seed,
              launcher=cell.launcher)


def refile(cells: Sequence[Cell], records: Mapping[str, Mapping[str, Any]], results_dir: str,
           log: Callable[[str], None] = _runs.log_line) -> Dict[str, Dict[str, Any]]:
  """Moves each record that its own cell no longer wants (status 'stale') to the cell of
  `cells` that has no record yet and runs exactly its launcher and flags; returns the
  records as they are then.

  This is how Table II's tuned records at the default server step become the
  `default_step` cells once the step stage chooses another step, instead of being
  overwritten by the tuned cells' new runs. The moved record keeps its result,
  command, commit and times; its `cell` is the new one and `refiled_from` names the
  old. The new file is written (atomically) before the old one is removed.
  """
  records = dict(records)
  by_name = {c.name: c for c in cells}
  for target in cells:
    if status(target, records) != "todo":
      continue
    source = next((by_name[n] for n, r in records.items()
                   if n in by_name and _ran_with(r, target) and
                   r["cell"]["launcher"] == target.launcher and
                   status(by_name[n], records) == "stale"), None)
    if source is None:
      continue
    moved = _runs.jsonable(dict(records[source.name], cell=_cell_fields(target),
                                refiled_from=source.name))
    records_lib.write_record(target.record_path(results_dir), moved)
    os.remove(source.record_path(results_dir))
    records[target.name] = moved
    del records[source.name]
    log(f"reproduce: the record of {source.name} (its cell now wants other flags) has "
        f"{target.name}'s flags; moved there")
  return records


# -------------------------------------------------------------------- running
class CellFailed(RuntimeError):
  """A cell's launcher exited non-zero (the message names the cell and its log)."""


class CellPaused(Exception):
  """A resumable cell stopped at the invocation's deadline (`--max_hours`) after its
  round in flight; the message says where the next invocation resumes it."""


def resumable(cell: Cell) -> bool:
  """Whether a stopped cell continues from its checkpoints: a launcher of
  `RESUMABLE_LAUNCHERS` with `checkpoint_every` set."""
  return cell.launcher in RESUMABLE_LAUNCHERS and bool(cell.flag_dict.get("checkpoint_every"))


# A crashed TFF worker (1 in ~290 cells of the campaign, a segfault in gRPC's server
# thread), or a remote one that died, hung or could not be reached, costs one more run
# of the cell (from its checkpoint, if it has one), not the runner's stop.
WORKER_CRASH_ATTEMPTS = 2


def _die_with_parent() -> Optional[Callable[[], None]]:
  """A `preexec_fn` that asks the kernel to SIGTERM the cell's launcher when the
  runner dies (Linux; None elsewhere). libc is loaded here, in the parent: code
  between fork and exec must not load libraries."""
  try:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
  except OSError:
    return None
  return lambda: libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_cell(cell: Cell, *, results_dir: str, work_dir: str, data_root: str,
             log: Callable[[str], None], deadline: Optional[float] = None) -> Dict[str, Any]:
  """Runs one cell's launcher; writes and returns its record.

  `deadline` (a `time.time()`; resumable cells only): then the runner stops the
  launcher as Ctrl-C does (it finishes its round in flight and checkpoints it) and
  raises `CellPaused`; a launcher stopped in its last run's last round finishes, and
  the cell is recorded.

  The launcher's output goes to the console and to `<work_dir>/<cell>/log.txt`.
  `CellFailed` (naming the log) if the launcher fails; the record is written only
  after a finished run, atomically. A training run the robust rounds stopped (exit
  `round_loop.RUN_STOPPED_STATUS`) is finished: its record keeps the rounds it ran
  and, under `result["stopped"]`, the launcher's one-line cause. A launcher whose TFF
  worker crashed, or whose remote worker died, hung or could not be reached (exit
  `round_loop.WORKER_EXITED_STATUS`), runs once more, from its checkpoint where the
  cell has one, else from the start (its log kept as `log.crashed.txt`; the record then
  says `"attempts": 2`, and its wall time counts both runs). A cell of `RESUMABLE_LAUNCHERS` that sets
  `checkpoint_every` continues each of its training runs from the checkpoint an
  interrupted invocation (or a crashed attempt) left in its directory, so a stop loses
  at most that many rounds of one run; the record lists the rounds every invocation
  resumed from (`resumed_from_rounds`; `resumed_runs` names each run where they lie in
  subdirectories, one per method) and the code of each stretch of rounds
  (`code_history`, one entry per session, which the runs' checkpoints keep;
  `git_commit` and `git_modified` are this invocation's); its wall time counts this
  invocation and the training clock of the rounds it resumed from
  (`earlier_invocations_wall_time_s`; an earlier invocation's start-up and its rounds
  after its last checkpoint are not counted).
  """
  out_dir = os.path.join(work_dir, cell.name)
  os.makedirs(out_dir, exist_ok=True)
  run_out = os.path.join(out_dir, "run")
  log_path = os.path.join(out_dir, "log.txt")
  started = time.time()
  earlier_s = 0.0  # the training clock of the rounds resumed from an earlier invocation
  for attempt in range(1, WORKER_CRASH_ATTEMPTS + 1):
    command = cell.command(run_out, data_root)
    if cell.launcher == "train":
      command.append("--resume" if _continues_from_checkpoint(cell, run_out) else "--overwrite")
    elif resumable(cell):
      command.append("--resume")  # each run with a checkpoint continues; the others start
    try:
      code, paused = _run_launcher(command, log_path, log, deadline if resumable(cell) else None)
    except KeyboardInterrupt:
      log(f"reproduce: stopped in cell {cell.name}; {_where_it_resumes(cell, work_dir)}")
      raise
    # 130: the launcher's own stop; -SIGTERM: the limit came before it set its handler.
    if paused and code in (round_loop.INTERRUPTED_STATUS, -signal.SIGTERM):
      raise CellPaused(f"cell {cell.name}: {_where_it_resumes(cell, work_dir)}")
    if attempt == 1:
      earlier_s = sum(_clock_at_round(run_dir, r) for run_dir, r in _resumed_runs(log_path))
    if code != round_loop.WORKER_EXITED_STATUS or attempt == WORKER_CRASH_ATTEMPTS:
      break
    crashed_log = os.path.join(out_dir, "log.crashed.txt")
    os.replace(log_path, crashed_log)
    log(f"reproduce: cell {cell.name}: its TFF worker crashed or failed "
        f"({_tail(crashed_log, 1).strip()[:300]}); running it again" +
        (" from its checkpoint" if _continues_from_checkpoint(cell, run_out) else ""))
  run_stopped = cell.launcher == "train" and code == round_loop.RUN_STOPPED_STATUS
  if code != 0 and not run_stopped:
    tail = _tail(log_path, 5)
    raise CellFailed(f"cell {cell.name}: launcher exited {code}; log {log_path}:\n{tail}")
  result = records_lib.COLLECTORS[cell.launcher](run_out)
  if run_stopped:  # a setting that diverges is a result (a tuning grid's included), not a failure
    result["stopped"] = _tail(log_path, 1).strip()
  record = make_record(cell, command, result, time.time() - started + earlier_s, started)
  if earlier_s:
    record["earlier_invocations_wall_time_s"] = round(earlier_s, 1)
  if attempt > 1:
    record["attempts"] = attempt
  history = _code_history(run_out) if cell.launcher in RESUMABLE_LAUNCHERS else []
  # Every invocation's resumes: the runs' histories keep them (the log, only this one's).
  resumes = [(e.get("run", ""), e["from_round"]) for e in run_directory.resumes(history)]
  if resumes:
    record["resumed_from_rounds"] = [r for _, r in resumes]
    if any(run for run, _ in resumes):
      record["resumed_runs"] = [dict(run=run, round=r) for run, r in resumes]
  if resumes or len(run_directory.distinct_codes(history)) > 1:  # each stretch's code
    record["code_history"] = history
  records_lib.write_record(cell.record_path(results_dir), record)
  return record


def _where_it_resumes(cell: Cell, work_dir: str) -> str:
  """What the next invocation of a stopped cell starts from."""
  p = checkpoint_progress(cell, work_dir)
  if not p.rounds_held:
    return "no checkpoint: the next invocation runs it from the start."
  return (f"the next invocation resumes it from its checkpoints ({p.rounds_held} of its "
          f"{p.rounds_total} rounds).")


def _training_runs(run_out: str) -> List[str]:
  """The training run in `run_out` (a `summary.json` there), or else each one in its
  subdirectories (`fola_curves`: `<method>/alpha_<alpha>`), in name order."""
  if os.path.exists(os.path.join(run_out, _runs.SUMMARY)):
    return [run_out]
  return sorted(d for d, _, files in os.walk(run_out) if _runs.SUMMARY in files)


def _relative_run(run_dir: str, run_out: str) -> str:
  """A training run's directory relative to the cell's run directory ('' for itself)."""
  rel = os.path.relpath(run_dir, run_out)
  return "" if rel == "." else rel


def _code_history(run_out: str) -> List[Dict[str, Any]]:
  """The `code_history` of the cell's training runs (their summaries'; empty where they
  have none); an entry of a run in a subdirectory names it (`run`)."""
  history = []
  for run_dir in _training_runs(run_out):
    summary = _runs.read_json(os.path.join(run_dir, _runs.SUMMARY)) or {}
    rel = _relative_run(run_dir, run_out)
    history += [dict(e, run=rel) if rel else dict(e) for e in summary.get("code_history") or ()]
  return history


def _continues_from_checkpoint(cell: Cell, run_out: str) -> bool:
  """Whether the cell's training run continues from its checkpoint: the cell is
  `resumable` and an earlier invocation left `checkpoint.npz` in its run directory
  (the launcher refuses one written with other flags or on other data)."""
  return resumable(cell) and os.path.exists(os.path.join(run_out, round_loop.CHECKPOINT))


_RESUMED = re.compile(r"^resumed from (.*) at round (\d+)$")


def _resumed_runs(log_path: str) -> List[Tuple[str, int]]:
  """(run directory, round) of each run a launcher's log says resumed from its
  checkpoint (`round_loop`'s start line), in the log's order."""
  with open(log_path) as f:
    return [(os.path.dirname(m.group(1)), int(m.group(2)))
            for m in map(_RESUMED.match, (line.rstrip("\n") for line in f)) if m]


def _clock_at_round(run_dir: str, round_num: int) -> float:
  """The training clock of the run in `run_dir` at the end of round `round_num`."""
  return records_lib.clock_at_round(records_lib.collect_train(run_dir), round_num)


def _run_launcher(command: List[str], log_path: str, log: Callable[[str], None],
                  deadline: Optional[float] = None) -> Tuple[int, bool]:
  """Runs a cell's launcher, its output to `log_path` (progress lines to `log` too);
  its exit status, and whether `deadline` (a `time.time()`) stopped it: then it got
  SIGTERM, which it takes as a stop after its round in flight. The launcher dies
  with the runner, and with an exception here."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  # Line-buffered: a runner ended by a signal (SIGTERM's default action flushes nothing)
  # leaves the log of the lines its launcher printed.
  with open(log_path, "w", buffering=1) as log_file:
    proc = subprocess.Popen(command, cwd=_repo_root(), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            preexec_fn=_die_with_parent())
    paused = threading.Event()

    def pause():
      paused.set()
      log("reproduce: --max_hours reached; the cell stops after its round in flight")
      proc.terminate()

    timer = None if deadline is None else threading.Timer(max(deadline - time.time(), 0), pause)
    try:
      if timer is not None:
        timer.daemon = True
        timer.start()
      for line in proc.stdout:
        log_file.write(line)
        if line.startswith("["):  # the launchers' progress lines
          log(f"  {line.rstrip()}")
      return proc.wait(), paused.is_set()
    except BaseException:
      _stop_launcher(proc, log_file, log)
      raise
    finally:
      if timer is not None:
        timer.cancel()


def _stop_launcher(proc: subprocess.Popen, log_file, log: Callable[[str], None],
                   timeout_s: float = 30.0) -> None:
  """Ends a launcher the runner leaves, its last lines kept in the log. SIGTERM: a
  launcher in its rounds takes it as a request to stop after the round in flight
  with a checkpoint of it (`tfbfl.flags.run`), which the runner waits for; a second
  Ctrl-C or SIGTERM to the runner sends the launcher its second SIGTERM, which stops
  it at once (it keeps its last checkpoint); SIGKILL `timeout_s` later."""
  proc.terminate()

  def copy_the_rest():
    try:
      log_file.writelines(proc.stdout)
    except (OSError, ValueError):  # the log closed: a worker of its kept the pipe open
      pass

  drain = threading.Thread(target=copy_the_rest, daemon=True)
  drain.start()
  try:
    try:
      proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
      log("  (the cell finishes its round in flight and saves a checkpoint of it; "
          "Ctrl-C or SIGTERM again to stop it at once)")
      proc.wait()
  except KeyboardInterrupt:
    proc.terminate()
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
  drain.join(timeout=5)


def _tail(path: str, n: int) -> str:
  with open(path) as f:
    return "".join(f.readlines()[-n:])


def _repo_root() -> str:
  """The repository's root: the folder holding `reproduction/` and `launchers/`."""
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measured_seconds(cell: Cell, records: Mapping[str, Mapping[str, Any]]) -> float:
  """What recorded cells of the same setting (other seeds) took on average; else the
  cell's estimate, rescaled by what recorded cells of the same kind took."""
  same = [
      r for n, r in records.items()
      if r["cell"]["launcher"] == cell.launcher and r["cell"]["row"] == cell.row and
      r["cell"]["algorithm"] == cell.algorithm and r["cell"]["experiment"] == cell.experiment
  ]
  if not same:
    return cell.estimate_s
  setting = [records_lib.wall_seconds(r) for r in same if r["cell"]["setting"] == cell.setting]
  if setting:
    return float(np.mean(setting))
  per_round = []
  for r in same:
    rounds = r["flags"].get("rounds")
    if rounds:
      per_round.append(records_lib.wall_seconds(r) / float(rounds))
  rounds = cell.flag_dict.get("rounds")
  if per_round and rounds:
    return float(np.mean(per_round)) * float(rounds)
  return float(np.mean([records_lib.wall_seconds(r) for r in same]))


@dataclasses.dataclass(frozen=True)
class CheckpointProgress:
  """What the checkpoints of a cell's run directory hold.

  `rounds_held` of `rounds_total` training rounds (each training run of the cell
  counts the cell's `rounds`: `fola_curves` has one run per method of `methods`);
  `runs_started` of `num_runs` runs have a checkpoint; `seconds_held` is the wall
  clock those runs' `metrics.csv` show at their checkpointed rounds, every earlier
  invocation counted (None where a run's clock cannot be read).
  """
  rounds_held: int = 0
  rounds_total: int = 0
  runs_started: int = 0
  num_runs: int = 1
  seconds_held: Optional[float] = None

  @property
  def fraction(self) -> float:
    return min(self.rounds_held / self.rounds_total, 1.0) if self.rounds_total else 0.0

  @property
  def seconds_per_round(self) -> Optional[float]:
    """This machine's pace on this cell so far (None before a readable checkpoint)."""
    if not self.rounds_held or not self.seconds_held:
      return None
    return self.seconds_held / self.rounds_held


def checkpoint_progress(cell: Cell, work_dir: str) -> CheckpointProgress:
  """What the checkpoints in `cell`'s run directory under `work_dir` hold: what its
  next invocation resumes instead of training (nothing for a cell that does not
  checkpoint)."""
  rounds = int(cell.flag_dict.get("rounds") or 0)
  if not resumable(cell) or rounds <= 0:
    return CheckpointProgress()
  methods = cell.flag_dict.get("methods")
  num_runs = len(str(methods).split(",")) if methods else 1
  held, started, seconds = 0, 0, 0.0
  for run_dir, _, files in os.walk(os.path.join(work_dir, cell.name, "run")):
    if checkpoint.CHECKPOINT in files:
      try:
        at = min(int(checkpoint.read_meta(run_dir)["round"]), rounds)
      except (OSError, ValueError):  # unreadable: the launcher will say so when it resumes
        continue
      held, started = held + at, started + 1
      try:
        clock = _clock_at_round(run_dir, at)
      except (OSError, ValueError, csv.Error):  # no readable metrics.csv: pace unknown
        clock = 0.0
      seconds = None if seconds is None or clock <= 0.0 else seconds + clock
  return CheckpointProgress(held, rounds * num_runs, started, num_runs, seconds)


def checkpointed_fraction(cell: Cell, work_dir: str) -> float:
  """The share of a checkpointing cell's training rounds its checkpoints under
  `work_dir` hold (0 without one)."""
  return checkpoint_progress(cell, work_dir).fraction


def remaining_seconds(cell: Cell, records: Mapping[str, Mapping[str, Any]],
                      work_dir: Optional[str]) -> float:
  """What `cell` will take from where its checkpoints under `work_dir` stand.

  Without a checkpoint: `measured_seconds`. With one, the rounds left of the runs it
  started go at the pace those runs kept on this machine (their clocks at the
  checkpoints over the rounds held: records made on a quieter or busier day do not
  set it), the runs not started at `measured_seconds`' share of one run.
  """
  p = checkpoint_progress(cell, work_dir) if work_dir is not None else CheckpointProgress()
  return _remaining_from(cell, records, p)


def _remaining_from(cell: Cell, records: Mapping[str, Mapping[str, Any]],
                    p: CheckpointProgress) -> float:
  """`remaining_seconds` given the cell's `checkpoint_progress`."""
  pace = p.seconds_per_round
  if pace is None:
    return measured_seconds(cell, records) * (1.0 - p.fraction)
  rounds_per_run = p.rounds_total // p.num_runs
  started_left = max(p.runs_started * rounds_per_run - p.rounds_held, 0)
  unstarted = measured_seconds(cell, records) * (p.num_runs - p.runs_started) / p.num_runs
  return pace * started_left + unstarted


def run(cells: Sequence[Cell], *, results_dir: str, work_dir: str, data_root: str,
        max_cells: Optional[int] = None, max_hours: Optional[float] = None,
        log: Callable[[str], None] = _runs.log_line,
        refresh: Optional[Callable[[Mapping[str, Any]], Sequence[Cell]]] = None,
        all_cells: Optional[Callable[[Mapping[str, Any]], Sequence[Cell]]] = None) -> List[str]:
  """Runs the selected cells that are not done (`status` 'todo' or 'stale'), one at a
  time, cheapest first (catalogue order among equal estimates); returns the names run.

  `refresh(records)`: the selected cells as the catalogue builds them from `records`;
  given, a waiting (tuned) cell whose tuning a finished cell completed joins the
  queue at its chosen setting, so one invocation runs the tuning and then the cells
  that wait on it. `all_cells(records)`: the whole catalogue; given, records are
  `refile`d before the plan and after each cell (selected or not, a stale cell's
  record another cell wants is moved there before the stale cell runs again).

  Prints the plan and its cost estimate first. Cells whose data folder is missing
  under `data_root` are skipped with a line naming it; `waiting` cells are listed.
  `max_cells` / `max_hours` stop the loop before a cell that would start past them;
  a resumable cell (`resumable`) starts while time is left and, at `max_hours`, stops
  after its round in flight with a checkpoint (so the invocation can end up to one of
  its rounds late), to continue at the next invocation.
  """
  records = _refiled(records_lib.read_records(results_dir), all_cells, results_dir, log)
  todo, waiting, missing = [], [], []
  for c in cells:
    s = status(c, records)
    if s == "waiting":
      waiting.append(c)
    elif s in ("todo", "stale"):
      absent = [n for n in c.needs if not os.path.isdir(os.path.join(data_root, n))]
      (missing if absent else todo).append((c, absent))
  est = {c.name: remaining_seconds(c, records, work_dir) for c, _ in todo}
  todo.sort(key=lambda item: est[item[0].name])  # stable: catalogue order among equals
  done = len(cells) - len(todo) - len(waiting) - len(missing)
  log(f"reproduce: {len(cells)} cells selected: {done} done, {len(todo)} to run "
      f"(~{_duration(sum(est.values()))}; estimate from recorded cells where there are any), "
      f"{len(waiting)} waiting for tuning, {len(missing)} without data")
  for c, absent in missing:
    log(f"  skip {c.name}: no {', '.join(os.path.join(data_root, a) for a in absent)} "
        "(--data_root)")
  for c in waiting[:5]:
    log(f"  waiting {c.name}: {c.depends}")
  if len(waiting) > 5:
    log(f"  ... and {len(waiting) - 5} more waiting")
  ran = []
  deadline = None if max_hours is None else time.time() + max_hours * 3600
  queue = [c for c, _ in todo]
  while queue:
    c = queue.pop(0)
    if status(c, records) == "done":  # a record was refiled to it
      continue
    i, total = len(ran) + 1, len(ran) + 1 + len(queue)
    if max_cells is not None and len(ran) >= max_cells:
      log(f"reproduce: stopped after --max_cells={max_cells}")
      break
    if deadline is not None and time.time() + est[c.name] > deadline and not (
        resumable(c) and time.time() < deadline):
      log(f"reproduce: next cell {c.name} (~{est[c.name] / 60:.0f} min) would pass "
          f"--max_hours={max_hours:g}; stopping")
      break
    log(f"cell {i}/{total} {c.name} (~{_duration(est[c.name])}) ...")
    try:
      rec = run_cell(c, results_dir=results_dir, work_dir=work_dir, data_root=data_root, log=log,
                     deadline=deadline)
    except CellPaused as e:
      log(f"reproduce: stopped at --max_hours={max_hours:g} in {e}")
      break
    ran.append(c.name)
    # Tuned cells whose tuning this cell completed join the queue (cheapest first),
    # as the catalogue now builds them (at the chosen setting).
    records = _refiled(records_lib.read_records(results_dir), all_cells, results_dir, log)
    fresh = {f.name: f for f in (refresh(records) if refresh is not None and waiting else ())}
    ready = [fresh[w.name] for w in waiting
             if w.name in fresh and status(fresh[w.name], records) in ("todo", "stale")]
    if ready:
      waiting = [w for w in waiting if w.name not in {r.name for r in ready}]
      est.update({w.name: remaining_seconds(w, records, work_dir) for w in ready})
      queue = sorted(queue + ready, key=lambda x: est[x.name])
      log(f"reproduce: tuning done for {len(ready)} waiting cell(s): "
          f"{', '.join(w.name for w in ready[:3])}{' ...' if len(ready) > 3 else ''}")
    left = sum(est[n.name] for n in queue)
    log(f"cell {i}/{len(ran) + len(queue)} {c.name}: {headline(rec)} "
        f"({rec['wall_time_s']:.0f} s; ~{_duration(left)} left)")
  return ran


def _refiled(records: Dict[str, Dict[str, Any]],
             all_cells: Optional[Callable[[Mapping[str, Any]], Sequence[Cell]]], results_dir: str,
             log: Callable[[str], None]) -> Dict[str, Dict[str, Any]]:
  return records if all_cells is None else refile(all_cells(records), records, results_dir, log)


def _duration(seconds: float) -> str:
  return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def headline(rec: Mapping[str, Any]) -> str:
  """One line of a record's result."""
  res = rec["result"]
  if records_lib.stopped(rec):
    return (f"best S {_pct(records_lib.best_value(rec, 'server_accuracy'))} "
            f"MT {_pct(records_lib.best_value(rec, 'mt_accuracy'))} "
            f"until the run stopped: {records_lib.stopped(rec)}")
  if "summary" in res:
    s = res["summary"]
    return (f"best S {_pct(s.get('best_server_accuracy'))} MT {_pct(s.get('best_mt_accuracy'))}")
  if "rows" in res:
    acc = {}
    for r in res["rows"]:
      key = r.get("method", "pfnm")
      val = next(r[k] for k in ("accuracy", "global_accuracy", "test_accuracy") if k in r)
      acc.setdefault(key, []).append(float(val))
    return " ".join(f"{k}={np.mean(v) * 100:.1f}" for k, v in acc.items())
  if "methods" in res:
    return " ".join(f"{m}: best {_pct(v['summary'].get('best_server_accuracy'))}"
                    for m, v in res["methods"].items())
  return ""


def _pct(v: Any) -> str:
  return "-" if v is None else f"{100 * float(v):.1f}"


# ----------------------------------------------------------------------- list
def listing(cells: Sequence[Cell], records: Mapping[str, Mapping[str, Any]],
            work_dir: Optional[str] = None) -> List[str]:
  """One line per cell: status, estimate (or recorded wall time) and name. Given
  `work_dir`, a cell's estimate starts from its checkpoints there (`remaining_seconds`)."""
  out = []
  for c in cells:
    s = status(c, records)
    p = (checkpoint_progress(c, work_dir) if s != "done" and work_dir is not None else
         CheckpointProgress())
    secs = (records_lib.wall_seconds(records[c.name]) if s == "done" else
            _remaining_from(c, records, p))
    extra = f"  ({c.depends})" if s == "waiting" else ""
    if p.rounds_held:
      extra += f"  (resumes: its checkpoints hold {p.fraction:.0%} of its rounds"
      if p.seconds_per_round is not None:
        extra += f", {p.seconds_per_round:.0f} s a round so far"
      extra += ")"
    out.append(f"{s:8s} {float(secs) / 60:7.1f} min  {c.name}{extra}")
  return out

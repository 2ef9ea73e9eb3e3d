"""The round driver shared by every federated algorithm and launcher.

It owns what is the same for all methods: client sampling, the client-state store,
evaluation with the S and MT metrics, outputs and checkpoints. An algorithm plugs
in by satisfying `tfbfl.algorithms.base.FederatedAlgorithm` (a `typing.Protocol`):

    initial_server_state() -> server_state
    initial_client_state(client_index) -> client_state
    next(server_state, client_states, seeds, data) -> (server_state, client_states, metrics)
    evaluate(server_state, client_states, seeds, test_data) -> per-client sums
        {server_loss, server_correct, mt_loss, mt_correct, num_examples}

Per-client results (client states, evaluation dicts) may carry a `client_index`;
the driver then re-keys them, as multi-worker contexts (`tfbfl.runtime.RemoteRuntime`)
return them in completion order. Under such a context, results without it are
refused. An algorithm may define `next_two_phase` (same signature as `next`); the
driver uses it instead of `next` under a multi-worker context (see
`tfbfl.algorithms.virtual`).

Client states live in the controller, in a `tfbfl.client_store` store chosen by
`RunConfig.client_store` ("memory", or "disk": one file per client under
`client_store_dir`, default `<output_dir>/client_states`; checkpoints then refer to
a hard-linked snapshot `<output_dir>/client_states_r<round>`).

An algorithm may also define `round_bytes(num_selected, round_metrics) -> (up, down)`
(see `tfbfl.communication`); the driver then adds `bytes_up`, `bytes_down` and their
running totals to every row and to `summary.json`.

Round `r` (1-based) samples `clients_per_round` clients without replacement with
`np.random.default_rng([seed, r])` and gives client `k` the stateless seed
`[seed, r * 1_000_003 + k]`, so a run, and a run resumed from a checkpoint, is
fully determined by `seed`. Metrics are weighted by client test-set size:

* S  = the server model on every client's test data;
* MT = each client's own model on its own test data (its last deployed model; a
  client never selected yet is evaluated with its initial model).

Outputs in `output_dir`, each written by one `tfbfl.run_outputs.RunOutput` that the
round loop calls (`ExperimentRunner.standard_outputs`; pass `outputs=` for others):

* `metrics.csv`: one row per round. Every row has the training metrics
  (`train_loss`, `train_accuracy`, the algorithm's own, `bytes_*`); rounds that
  are evaluated (every `eval_every`-th and the last) also have S and MT
  (`server_accuracy`, `server_loss`, `mt_accuracy`, `mt_loss`, `*_ece`), left
  empty in the others.
* `client_metrics.csv`: per-client MT accuracy per evaluated round.
* `summary.json` (strict JSON): best/final S and MT, the flags, `tfbfl_version`,
  `git_commit` (of the tfbfl checkout, or null), `git_modified` (tracked files
  differ from that commit, or null), `code_history` (the code of each stretch of
  rounds, one a session: a resumed run lists each), `data_fingerprint`.
* `flags.txt`: the run's flags as an absl flag file, so that
  `python -m launchers.train --flagfile=<output_dir>/flags.txt [--resume]`
  replays (or continues) it.
* `tb/`: TensorBoard events, one per round and tag, grouped (`accuracy/server`,
  `accuracy/mt`, `loss/server`, `loss/mt`, `ece/...`, `train/...`,
  `communication/...`, `diagnostics/...`, `time/wall_s`), and HParams (the flags
  and, as metrics, the final S/MT accuracy and loss); a resumed run first drops
  the events of rounds after its checkpoint, so no (tag, round) is written twice.
* `curves.png`: S/MT accuracy, S/MT loss, train loss and (with `bytes_up`) the
  cumulative bytes per round.
* `checkpoint.npz` (a `tfbfl.state_files` file: arrays + a JSON manifest, never a
  pickle): every `checkpoint_every` rounds, always after the last round and after
  the round a requested stop ends at (`request_stop`), so nothing trained is lost.
* `export/`: the final server and client models (`tfbfl.export.export_run`,
  unless `RunConfig.export` is off), written last.

Every file is written to a temporary name and renamed, so an interrupted run
never leaves a half-written file, and a resumed run reproduces the uninterrupted
one. Ctrl-C raises `RunInterrupted` (a `KeyboardInterrupt`) whose message says
where the run stopped and how to continue it; the launchers print it as one line.
A stop requested while the rounds run (`request_stop`: a launcher's first Ctrl-C or
SIGTERM) ends the run after the round in flight, with a checkpoint of that round,
by the same `RunInterrupted`; in the last round it lets the run finish, and the
next run of the process stops before its rounds.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import tfbfl
from tfbfl import checkpoint
from tfbfl import client_store as client_store_lib
from tfbfl import evaluation
from tfbfl import faults
from tfbfl import files
from tfbfl import options
from tfbfl import run_directory
from tfbfl import run_outputs
from tfbfl import runtime
from tfbfl import state_files
from tfbfl.algorithms import base
from tfbfl.algorithms.base import FederatedAlgorithm
from tfbfl.algorithms.base import client_seed  # noqa: F401  (the driver's seed rule)
from tfbfl.data import FederatedData

CHECKPOINT = checkpoint.CHECKPOINT
LEGACY_CHECKPOINT = checkpoint.LEGACY_CHECKPOINT
FLAGS_FILE = run_outputs.FLAGS_FILE
EXPORT_DIR = run_outputs.EXPORT_DIR
TB_DIR = run_outputs.TB_DIR
# The output helpers the runner's callers use, from their module.
BASE_COLUMNS = run_outputs.BASE_COLUMNS
atomic_write_bytes = files.atomic_write_bytes
atomic_write_text = files.atomic_write_text
write_csv = run_outputs.write_csv
evaluated = run_outputs.evaluated
curves_figure = run_outputs.curves_figure
plot_curves = run_outputs.plot_curves
strict_json = run_outputs.strict_json
json_default = run_outputs.json_default
aggregate_evaluation = evaluation.aggregate_evaluation


def default_clients_per_round(num_clients: int) -> int:
  """`--clients_per_round`'s default: every client, at most 10."""
  return min(10, int(num_clients))


@dataclasses.dataclass
class RunConfig:
  """How to drive the rounds (the algorithm-independent flags)."""
  rounds: int = options.integer(20, "Communication rounds.", low=1)
  clients_per_round: Optional[int] = options.integer(
      None,
      "Clients per round C (fixed; default min(10, number of clients)).",
      low=1,
      high=10**7,
      none_ok=True)
  eval_every: int = options.integer(1, "Evaluate S and MT every this many rounds.", low=1)
  seed: int = options.integer(0,
                              "Fixes client sampling, initialisation and data splits.",
                              high=options.MAX_SEED)
  output_dir: Optional[str] = options.text(None, "Where metrics.csv, summary.json, curves.png go.")
  checkpoint_every: int = options.integer(
      0, "Also checkpoint every N rounds (0: only at the end; with --output_dir the final "
      "state, and the state a Ctrl-C or SIGTERM stops at, are always saved).")
  resume: bool = options.boolean(
      False, "Continue from the checkpoint in --output_dir (same "
      "flags and data, checked).")
  verbose: bool = True
  client_store: str = options.choice(
      "memory", ("memory", "disk"), "Where the controller keeps client states: memory, or "
      "one file per client under <output_dir>/client_states.")
  client_store_dir: Optional[str] = None  # disk: default <output_dir>/client_states
  overwrite: bool = options.boolean(
      False, "Replace the outputs of a previous run in --output_dir (without it, or "
      "--resume, such a directory is refused).")
  data_fingerprint: Optional[str] = None  # tfbfl.run_directory.data_fingerprint; None: computed
  # Streamed evaluation (see `ExperimentRunner.evaluate`): at most this many clients
  # per evaluation call; 0: one call with every client (`algorithm.evaluate`).
  eval_chunk: int = options.integer(
      64, "Evaluate at most this many clients per call, MT cached per client where exact "
      "(0: every client in one call).")
  eval_cache: bool = True  # cache MT per client (streamed path, where exact)
  export: bool = options.boolean(True, "Write export/ SavedModels at the end of the run.")
  export_samples: int = options.integer(
      0, "MC samples of the exported server predictive (0: posterior mean).")

  def resolved(self, num_clients: int) -> "RunConfig":
    """This config with `clients_per_round` set (unset: min(10, num_clients))."""
    if self.clients_per_round is not None:
      return self
    return dataclasses.replace(self, clients_per_round=default_clients_per_round(num_clients))

  def validate(self, num_clients: int) -> None:
    if self.rounds < 1:
      raise ValueError(f"--rounds must be >= 1, got {self.rounds}.")
    if not 1 <= self.clients_per_round <= num_clients:
      raise ValueError(f"--clients_per_round must be in [1, num_clients={num_clients}], "
                       f"got {self.clients_per_round}.")
    if self.eval_every < 1:
      raise ValueError(f"--eval_every must be >= 1, got {self.eval_every}.")
    if self.checkpoint_every < 0:
      raise ValueError(f"--checkpoint_every must be >= 0, got {self.checkpoint_every}.")
    if self.eval_chunk < 0:
      raise ValueError(f"--eval_chunk must be >= 0, got {self.eval_chunk}.")
    if self.resume and not self.output_dir:
      raise ValueError("--resume needs --output_dir (where the checkpoint is).")
    if self.resume and self.overwrite:
      raise ValueError("--resume and --overwrite exclude each other (continue the run in "
                       "--output_dir, or replace it).")
    if self.client_store not in ("memory", "disk"):
      raise ValueError(f"--client_store must be 'memory' or 'disk', got {self.client_store!r}.")
    if self.client_store == "disk" and not (self.output_dir or self.client_store_dir):
      raise ValueError("--client_store=disk needs --output_dir (states go to "
                       "<output_dir>/client_states).")


# --------------------------------------------------------------------- driver
def sample_clients(seed: int, round_num: int, num_clients: int, per_round: int) -> List[int]:
  rng = np.random.default_rng([seed, round_num])
  return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))


def _flatten_metrics(metrics: Any) -> Dict[str, float]:
  """Nested metric dicts -> flat {leaf name: float}; a path joined by '/' only
  where two leaves share a name."""
  leaves = []

  def walk(m, path):
    if hasattr(m, "items"):
      for k, v in m.items():
        walk(v, path + (str(k),))
    else:
      leaves.append((path, float(np.asarray(m))))

  walk(metrics, ())
  names = [p[-1] for p, _ in leaves]
  return {(p[-1] if names.count(p[-1]) == 1 else "/".join(p)): v for p, v in leaves}


@dataclasses.dataclass(frozen=True)
class Replay:
  """How a run is started again from its `flags.txt`: the launcher's command and
  the names of its flags (None: every flag the runner was given)."""
  command: str
  flag_names: Optional[Sequence[str]] = None


# The round driver's launcher (`tfbfl.driver.REPLAY` names its flags).
TRAIN_LAUNCHER = Replay("python -m launchers.train")


class RunStoppedError(RuntimeError):
  """The robust-round rules stopped the run; `str()` is one line naming the cause
  (`launchers.train` prints it and exits with `RUN_STOPPED_STATUS`)."""


# The exit status of a launcher whose run a `RunStoppedError` stopped: its metrics up
# to the stop are written, so a caller can keep them as a result.
RUN_STOPPED_STATUS = 3

# The exit status of a launcher whose TFF worker process exited mid-run (a
# `runtime.WorkerExited`: it crashed, or was killed), or whose remote worker died, hung
# or could not be reached (`runtime.WorkerError`). The run did not finish; the same
# command (`--resume` once the worker is back) may well pass (sysexits' EX_TEMPFAIL).
WORKER_EXITED_STATUS = faults.WORKER_FAILED_STATUS

# The exit status of a launcher stopped by Ctrl-C or SIGTERM (`RunInterrupted`):
# 128 + SIGINT, as a shell reports a Ctrl-C.
INTERRUPTED_STATUS = 130


class NonFiniteServerStateError(RunStoppedError):
  """A round made the server state non-finite; the run stops before saving it."""


# Robust rounds: a run stops after this many rounds in a row in which every client
# update was dropped (the server model did not move in any of them).
ALL_DROPPED_STOP_ROUNDS = 3


class AllClientsDroppedError(RunStoppedError):
  """`ALL_DROPPED_STOP_ROUNDS` rounds in a row dropped every client update; the run
  stops after writing the last of them (instead of finishing untrained)."""


# The run in its rounds, if any (`request_stop`); one a process, as a launcher runs them.
_IN_ROUNDS: List["ExperimentRunner"] = []
# A stop asked for (`request_stop`) that has not taken effect yet: after the round in
# flight, or, asked in a run's last round, before the next run of the process.
_STOP_ASKED: List[bool] = [False]


def request_stop() -> Optional[Tuple[int, int]]:
  """Asks the run in its rounds to stop after the round in flight: that round's
  outputs are written, then a checkpoint of it, then the run raises
  `RunInterrupted`. When the round in flight is the run's last, the run finishes as
  usual (its final outputs are what is left) and the stop passes to the next run
  this process starts (a launcher of several runs): that run raises
  `RunInterrupted` before it touches its output directory. Safe in a signal handler.

  Returns:
    (the round in flight, the run's number of rounds), or None when no run is in
    its rounds (building, evaluating its final state, exporting): the caller then
    interrupts at once.
  """
  if not _IN_ROUNDS:
    return None
  run = _IN_ROUNDS[-1]
  _STOP_ASKED[0] = True
  return run._round_in_progress, run.config.rounds  # pylint: disable=protected-access


class RunInterrupted(KeyboardInterrupt):
  """Ctrl-C (a `KeyboardInterrupt`) during `ExperimentRunner.run`. `str()` is one
  line: the round it stopped in, the last checkpoint and the command that
  continues the run (or that nothing was saved)."""

  def __init__(self, message: str, round_num: Optional[int], checkpoint_round: Optional[int]):
    super().__init__(message)
    self.round_num, self.checkpoint_round = round_num, checkpoint_round


def non_finite_leaves(tree, path="server_state"):
  """Paths of the floating-point leaves of `tree` (namedtuples, lists, dicts,
  TFF structs of numpy values) that hold a NaN or an infinity."""
  if isinstance(tree, dict):
    items = [(f"{path}.{k}", v) for k, v in tree.items()]
  elif hasattr(tree, "_fields"):
    items = [(f"{path}.{k}", getattr(tree, k)) for k in tree._fields]
  elif isinstance(tree, (list, tuple)) or (hasattr(tree, "__iter__") and
                                           not isinstance(tree,
                                                          (str, bytes, np.ndarray, np.generic))):
    items = [(f"{path}[{i}]", v) for i, v in enumerate(tree)]
  else:
    a = np.asarray(tree)
    floating = np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)
    return [path] if floating and not np.all(np.isfinite(a)) else []
  return [bad for p, v in items for bad in non_finite_leaves(v, p)]


class ExperimentRunner:
  """Runs `rounds` rounds of `algorithm` on `data`; see the module docstring.

  Args:
    algorithm: object with the four members listed in the module docstring.
    data: `tfbfl.data.FederatedData`.
    config: `RunConfig`.
    flags: dict of the launcher's flags, stored in `summary.json` and checked on
      `--resume` (a checkpoint of another configuration is refused).
    round_hook: optional `fn(round_num, metrics_dict)` called after each round
      (e.g. communication accounting adds columns).
    replay: the launcher command and flags `flags.txt` and the interrupt message
      name (default `TRAIN_LAUNCHER`).
    outputs: what the run writes (`tfbfl.run_outputs.RunOutput`s, called in
      order); None: `standard_outputs(self)`, the files of the module
      docstring and the progress lines.
  """

  def __init__(self,
               algorithm,
               data: FederatedData,
               config: RunConfig,
               flags: Optional[Dict[str, Any]] = None,
               round_hook: Optional[Callable[[int, Dict[str, Any]], None]] = None,
               replay: Replay = TRAIN_LAUNCHER,
               outputs: Optional[Sequence[run_outputs.RunOutput]] = None):
    config = config.resolved(len(data.client_ids))
    config.validate(len(data.client_ids))
    if not isinstance(algorithm, FederatedAlgorithm):
      missing = [
          m for m in ("initial_server_state", "initial_client_state", "next", "evaluate")
          if not callable(getattr(algorithm, m, None))
      ]
      raise TypeError(f"{type(algorithm).__name__} is not a tfbfl.algorithms.base."
                      f"FederatedAlgorithm: it lacks {missing}.")
    self.algorithm, self.data, self.config = algorithm, data, config
    self.flags = dict(flags or {})
    self.round_hook = round_hook
    self.replay = replay
    self.client_ids = list(data.client_ids)
    self._train = [data.train[c] for c in self.client_ids]
    # A client's evaluation data: its test split, and its calibration split where the
    # data hold one (--temperature_scaling fits there).
    self._test = [data.test[c] + (data.calibration[c] if data.calibration else ())
                  for c in self.client_ids]
    self.rows: List[Dict[str, Any]] = []
    self.client_rows: List[Dict[str, Any]] = []
    self.state: Optional[checkpoint.RunState] = None
    self.outputs = None if outputs is None else list(outputs)
    self._lock = None
    self._diagnostic_keys: set = set()  # factor_diagnostics columns (TensorBoard group)
    self._round_in_progress: Optional[int] = None
    self._stage = "starting"  # what the run does now, for the one line of a fault
    self._resumed = config.resume  # False: --resume of a run that never checkpointed
    self._rounds_done = 0
    self._session_outputs: List[run_outputs.RunOutput] = []
    self.evaluator = evaluation.Evaluator(algorithm, self._test, seed=config.seed,
                                          chunk=config.eval_chunk, cache=config.eval_cache)

  # ---------------------------------------------------------------- state
  def _new_client_store(self):
    cfg = self.config
    directory = cfg.client_store_dir or (os.path.join(cfg.output_dir, "client_states")
                                         if cfg.output_dir else None)
    return client_store_lib.make_client_store(cfg.client_store, directory)

  def _fresh_state(self) -> checkpoint.RunState:
    clients = self._new_client_store()
    clients.clear()  # a fresh run in a used directory starts from no states
    return checkpoint.RunState(round=0,
                               server_state=self.algorithm.initial_server_state(),
                               clients=clients)

  def _client_state(self, state: checkpoint.RunState, index: int):
    if index not in state.clients:
      state.clients[index] = self.algorithm.initial_client_state(index)
    return state.clients[index]

  def _data_fingerprint(self) -> str:
    if self.config.data_fingerprint is None:
      self.config.data_fingerprint = run_directory.data_fingerprint(self.data)
    return self.config.data_fingerprint

  @classmethod
  def check_resumable(cls, output_dir: str, flags: Dict[str, Any], data_fingerprint: str) -> int:
    """Cheap check, before any start-up, that `--resume` into `output_dir` can
    work: its checkpoint exists and has a valid manifest written with the same
    flags and data. Returns the checkpoint's round. `run` checks everything
    again (and every array's checksum) when it loads the checkpoint.

    A run that never checkpointed (killed before its first checkpoint; or no run
    at all) is resumed from round 0, if the flags in its `flags.txt` are these
    (`_restart_state`): then this returns 0.

    Raises:
      FileNotFoundError, ValueError: one line naming the checkpoint (or the flags
        that differ from those of the run that never checkpointed).
    """
    if not checkpoint.exists(output_dir):
      cls._check_same_flags(output_dir, flags)
      return 0
    meta = checkpoint.read_meta(output_dir, flags=flags, data_fingerprint=data_fingerprint,
                                resume=True)
    return int(meta["round"])

  @staticmethod
  def _check_same_flags(output_dir: str, flags: Dict[str, Any]) -> None:
    """Refuses `--resume` of a run without a checkpoint whose `flags.txt` holds other
    flags than `flags` (those a resumed run may not change; a checkpoint keeps them)."""
    diff = run_directory.flags_file_differences(output_dir, flags,
                                                ignore=checkpoint.RESUMABLE_FLAGS)
    if diff:
      path = os.path.join(output_dir, FLAGS_FILE)
      raise ValueError(
          f"--resume: the run in {output_dir} has no checkpoint yet, and its {path} holds "
          f"other flags than these: {', '.join('--' + d for d in diff)}; pass its flags "
          f"(--flagfile={path} --resume) or replace the run (--overwrite).")

  def _restart_state(self) -> checkpoint.RunState:
    """`--resume` of a run that never checkpointed: its flags checked, its partial
    outputs removed, the fresh state of round 0 (said in one line)."""
    cfg = self.config
    self._check_same_flags(cfg.output_dir, self.flags)
    run_directory.clear_outputs(cfg.output_dir)
    self._resumed = False
    if cfg.verbose:
      print(f"--resume: no checkpoint in {cfg.output_dir} yet (the run stopped before its "
            "first); starting it from round 0 with its flags", flush=True)
    return self._fresh_state()

  def _load_checkpoint(self) -> checkpoint.RunState:
    """The state of the run's checkpoint, checked by `tfbfl.checkpoint.load`
    (file, flags, data fingerprint, snapshot); a disk store's snapshot is
    restored into this run's store. Never unpickles."""
    saved = checkpoint.load(self.config.output_dir, flags=self.flags,
                            data_fingerprint=self._data_fingerprint(), resume=True)
    if saved.snapshot_dir is None:
      clients = client_store_lib.MemoryClientStore(saved.clients)
    else:  # disk store: its files as of the checkpoint
      clients = self._new_client_store()
      try:
        clients.restore(saved.snapshot_dir)
      except FileNotFoundError as e:
        raise FileNotFoundError(f"--resume: {e}") from None
      except ValueError as e:
        raise ValueError(f"--resume: {e}") from None
    return checkpoint.RunState.from_tree(saved.state, clients)

  def _start_state(self):
    """Takes `output_dir` for this run and returns the state to start from.

    With an `output_dir`: creates it, takes its lock (`tfbfl.run_directory.RunLock`,
    held until `close()`; a directory in use by another run is refused at
    once), removes stale `.tmp-*` files of interrupted writes, then refuses a
    directory holding another run unless `resume` (its checkpoint is then
    checked) or `overwrite` (its outputs are removed first). Returns the
    checkpoint's state with `resume`, else a fresh one.
    """
    cfg = self.config
    if not cfg.output_dir:
      return self._load_checkpoint() if cfg.resume else self._fresh_state()
    run_directory.prepare(cfg.output_dir)
    if self._lock is None:
      self._lock = run_directory.RunLock(cfg.output_dir)
    self._lock.acquire(owner=self)
    try:
      store_dir = cfg.client_store_dir or os.path.join(cfg.output_dir, "client_states")
      for directory in (cfg.output_dir, store_dir):
        state_files.remove_stale_temporaries(directory)
      removed = run_directory.refuse_or_clear(cfg.output_dir,
                                            resume=cfg.resume,
                                            overwrite=cfg.overwrite)
      if removed and cfg.verbose:
        print(f"--overwrite: removed {', '.join(removed)} from {cfg.output_dir}", flush=True)
      if cfg.resume and not checkpoint.exists(cfg.output_dir):
        return self._restart_state()
      return self._load_checkpoint() if cfg.resume else self._fresh_state()
    except BaseException:
      self.close()
      raise

  def close(self) -> None:
    """Closes the outputs and releases the lock on `output_dir` (idempotent).
    `driver.run_training` calls it when the run ends; the lock also goes with
    the runner object or the process."""
    outputs, self._session_outputs = self._session_outputs, []
    for output in outputs:
      output.close()
    if self._lock is not None:
      self._lock.release()

  def _round_fn(self):
    """`algorithm.next`, or its `next_two_phase` under a multi-worker context."""
    if isinstance(self.algorithm, base.SupportsTwoPhase) and runtime.mergeable_context_active():
      return self.algorithm.next_two_phase
    return self.algorithm.next

  # ------------------------------------------------------------- evaluate
  def evaluate(self, state: checkpoint.RunState) -> Dict[str, Any]:
    """S and MT over all K clients of `state` (`tfbfl.evaluation.Evaluator`:
    streamed `eval_chunk` clients per call where the algorithm allows it, MT
    cached per client where exact)."""
    return self.evaluator(state.server_state, state.clients)

  @property
  def eval_counts(self) -> Dict[str, int]:
    """Clients whose S and MT were computed, and algorithm calls, so far."""
    return self.evaluator.counts

  # ------------------------------------------------------------------ run
  def standard_outputs(self) -> List[run_outputs.RunOutput]:
    """The files of the module docstring (with an `output_dir`) and the progress
    lines (`verbose`), in the order they are written."""
    cfg, out = self.config, self.config.output_dir
    outputs: List[run_outputs.RunOutput] = []
    if out:
      outputs += [
          run_outputs.FlagsFile(out, self.flags, self.replay.command, self.replay.flag_names),
          run_outputs.MetricsFiles(out, self.client_ids),
          run_outputs.TensorBoard(out, self.flags, self._diagnostic_keys),
          run_outputs.Checkpoints(out, cfg.checkpoint_every, self.flags, self._data_fingerprint),
          run_outputs.Curves(out, self.algorithm.name),
          run_outputs.SummaryJson(out),
      ]
      if cfg.export:
        outputs.append(
            run_outputs.Export(out, self.algorithm, self.client_ids, samples=cfg.export_samples,
                               seed=cfg.seed, raw_input=self.data.raw_input,
                               verbose=cfg.verbose))
    if cfg.verbose:
      outputs.append(run_outputs.Progress(self.algorithm.name, cfg.rounds, cfg.clients_per_round))
    return outputs

  def run(self) -> Dict[str, Any]:
    """Runs the rounds; the output directory's lock is released when it returns
    or raises. Each round adds a `metrics.csv` row and prints a progress line
    (`RunConfig.verbose`); the outputs (`tfbfl.run_outputs`) write the rest.

    Raises:
      RunInterrupted: on Ctrl-C (see the class).
      NonFiniteServerStateError, AllClientsDroppedError (`RunStoppedError`s):
        the robust-round rules stopped the run (one-line message).
      runtime.WorkerError, runtime.WorkerExited, files.FileWriteError,
        run_directory.RunDirGone, OSError: a worker or a file failed (`tfbfl.faults`);
        `faults.found(error)` is its one line (where the run was, what is kept, how
        to continue), which the launchers print.
    """
    try:
      return self._run()
    except KeyboardInterrupt as e:
      if isinstance(e, RunInterrupted):
        raise
      raise self._interrupted() from None
    except Exception as e:  # pylint: disable=broad-except  (raised as it is)
      fault = self._fault(e)
      if fault is not None:
        faults.attach(e, fault)
      raise
    finally:
      self.close()

  def _fault(self, error: Exception) -> Optional["faults.RunFault"]:
    """The one line of `error` (`faults.RunFault`: what failed, where the run was,
    what is kept, how to continue), or None when it is no fault of `tfbfl.faults` (a
    bug, a bad state file). A missing output directory wins over the error it caused."""
    cfg, r = self.config, self._round_in_progress
    if self._lock is not None:
      try:
        self._lock.check()
      except run_directory.RunDirGone as gone:
        error = gone
    if r:
      where = f"in round {r} of {cfg.rounds} ({self._stage})"
    elif self._stage == "starting":
      where = "as the run started"
    else:
      where = f"{self._stage} after round {self._rounds_done} of {cfg.rounds}"
    return faults.during_run(error, where=where, output_dir=cfg.output_dir,
                             saved_round=self._saved_round(), command=self._command())

  def _saved_round(self) -> Optional[int]:
    """The round of the checkpoint on disk now (None: none, or unreadable)."""
    if not self.config.output_dir:
      return None
    try:
      return int(state_files.read_meta(checkpoint.path_in(self.config.output_dir))["round"])
    except (OSError, ValueError, KeyError, TypeError):
      return None

  def _command(self) -> str:
    """The command that replays this run from its flags.txt (add --resume / --overwrite)."""
    return f"{self.replay.command} --flagfile=" + shlex.quote(
        os.path.join(self.config.output_dir or "", FLAGS_FILE))

  def _interrupted(self, stopped_after: Optional[int] = None,
                   before_its_rounds: bool = False) -> RunInterrupted:
    """The `RunInterrupted` of a Ctrl-C now, of a stop requested (`request_stop`)
    that took effect after round `stopped_after`, or of one carried over from an
    earlier run's last round (`before_its_rounds`; see `run`)."""
    cfg, r = self.config, self._round_in_progress
    if before_its_rounds:
      where = ("stopped before its rounds, as asked (the stop came in the last round of "
               "the run before it)")
    elif stopped_after:
      where, r = f"stopped after round {stopped_after} of {cfg.rounds}, as asked", None
    elif r:
      where = f"interrupted in round {r} of {cfg.rounds}"
    elif self._rounds_done:
      where = (f"interrupted after round {self._rounds_done} of {cfg.rounds} (writing the "
               "final outputs)")
    else:
      where = "interrupted before the first round"
    saved = self._saved_round()
    command = self._command()
    if saved:
      message = (f"{where}; the checkpoint has round {saved}; continue with: "
                 f"{command} --resume")
    elif before_its_rounds:
      message = f"{where}; it wrote nothing."
    elif cfg.output_dir:
      message = (f"{where}; nothing was saved (no checkpoint yet: see "
                 f"--checkpoint_every); start again with: {command} --overwrite")
    else:
      message = f"{where}; nothing was saved (no --output_dir)."
    return RunInterrupted(message, r, saved)

  def _run(self) -> Dict[str, Any]:
    cfg = self.config
    self._stage = "starting"
    if _STOP_ASKED[0]:  # asked for in an earlier run's last round: it takes effect here
      _STOP_ASKED[0] = False
      raise self._interrupted(before_its_rounds=True)
    state = self._start_state()  # lock, ownership of output_dir, checkpoint or fresh
    state.code_history = run_directory.extend_code_history(
        state.code_history, state.round, run_directory.source_provenance())
    self.state, self._rounds_done = state, state.round
    if self._resumed and cfg.verbose:
      print(f"resumed from {checkpoint.path_in(cfg.output_dir)} at round {state.round}",
            flush=True)
    outputs = self._session_outputs = (self.standard_outputs()
                                       if self.outputs is None else list(self.outputs))
    for output in outputs:
      output.on_start(state, self._resumed)
    k = len(self.client_ids)
    self.evaluator.reset()  # a resumed run recomputes every client's MT once
    clock = time.time() - state.wall_time_s
    round_fn = self._round_fn()
    if cfg.verbose and state.round < cfg.rounds:
      print(
          f"[{self.algorithm.name}] rounds {state.round + 1}-{cfg.rounds}, "
          f"{cfg.clients_per_round} of {k} clients each" +
          (f", outputs in {cfg.output_dir}" if cfg.output_dir else "") +
          "; building computations (the first round traces them and takes longer) ...",
          flush=True)
    _IN_ROUNDS.append(self)
    try:
      for r in range(state.round + 1, cfg.rounds + 1):
        self._round_in_progress, self._stage = r, "training"
        row = self._train_round(state, round_fn, r, clock)
        if r % cfg.eval_every == 0 or r == cfg.rounds:
          self._stage = "evaluating"
          self._evaluate_into(state, row)
        row["wall_time_s"] = time.time() - clock
        state.rows.append(row)
        self._stage = "writing its outputs"
        if self._lock is not None:
          self._lock.check()  # the output directory is still there (else: RunDirGone)
        for output in outputs:  # the progress line last: a Ctrl-C after it loses nothing
          output.on_round(state, row, row)
        self._stop_if_all_dropped(state.rows, r)
        if _STOP_ASKED[0] and r < cfg.rounds:  # in the last round it waits for the next run
          _STOP_ASKED[0] = False
          self._round_in_progress = None
          for output in outputs:
            output.on_stop(state)
          raise self._interrupted(stopped_after=r)
    finally:
      _IN_ROUNDS.remove(self)
    self._round_in_progress, self._stage = None, "writing the final outputs"
    self._evaluate_final_state(state, outputs)
    self.rows, self.client_rows = state.rows, state.client_rows
    summary = self.summary(state)
    for output in outputs:
      output.on_end(state, summary)
    return summary

  def _train_round(self, state: checkpoint.RunState, round_fn, r: int,
                   clock: float) -> Dict[str, Any]:
    """Round `r` on the clients it samples: the new states go into `state`;
    returns the round's row (training metrics, bytes)."""
    cfg = self.config
    selected = sample_clients(cfg.seed, r, len(self.client_ids), cfg.clients_per_round)
    states = [self._client_state(state, i) for i in selected]
    seeds = [client_seed(cfg.seed, r, i) for i in selected]
    data = [self._train[i] for i in selected]
    server_state, new_states, metrics = round_fn(state.server_state, states, seeds, data)
    # Robust rounds: a non-finite server state stops the run before this round
    # is stored anywhere (outputs and the last checkpoint stay as they were).
    bad = non_finite_leaves(server_state)
    if bad:
      raise NonFiniteServerStateError(
          f"[{self.algorithm.name}] round {r}: the server state became non-finite "
          f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); stopped without writing "
          f"anything of round {r} (the last checkpoint is intact). "
          "Try a smaller --client_lr or --server_lr.")
    state.server_state = server_state
    for i, s in zip(selected, evaluation.rekey(selected, new_states)):
      state.clients[i] = s
      self.evaluator.trained(i)
    state.round = self._rounds_done = r
    flat = _flatten_metrics(metrics)
    if cfg.verbose and flat.get("clients_dropped", 0) >= len(selected):
      print(
          f"[{self.algorithm.name}] round {r}: all {len(selected)} client updates were dropped "
          "(non-finite, or norm above --max_update_ratio); the server model is unchanged.",
          flush=True)
    if isinstance(self.algorithm, base.ReportsRoundBytes):
      up, down = self.algorithm.round_bytes(len(selected), flat)
      state.bytes_up_total = (state.bytes_up_total or 0) + up
      state.bytes_down_total = (state.bytes_down_total or 0) + down
      flat.update(bytes_up=up,
                  bytes_down=down,
                  bytes_up_total=state.bytes_up_total,
                  bytes_down_total=state.bytes_down_total)
    if self.round_hook is not None:
      self.round_hook(r, flat)
    state.wall_time_s = time.time() - clock
    return dict(round=r, **flat)

  def _evaluate_final_state(self, state: checkpoint.RunState, outputs) -> None:
    """A run resumed with no round left to run, from a checkpoint of a round
    without evaluation (or of round 0): its final state is evaluated now, and the
    outputs get the new values."""
    rows = state.rows
    if rows and rows[-1]["round"] == state.round and evaluated(rows[-1]):
      return
    row = rows[-1] if rows and rows[-1]["round"] == state.round else None
    new = row is None
    row = dict(round=state.round) if new else row
    before = dict(row)
    self._evaluate_into(state, row)
    if new:
      row["wall_time_s"] = state.wall_time_s
      rows.append(row)
    added = {k: v for k, v in row.items() if k not in before or new}
    for output in outputs:
      output.on_round(state, row, added)

  def _evaluate_into(self, state: checkpoint.RunState, row) -> None:
    """Adds round `row["round"]`'s S and MT (and the algorithm's diagnostics) to
    `row` and its per-client MT accuracy to `state.client_rows`."""
    if isinstance(self.algorithm, base.ReportsDiagnostics):
      extra = self.algorithm.factor_diagnostics(state.server_state, state.clients)
      self._diagnostic_keys.update(extra)
      row.update(extra)
    ev = self.evaluate(state)
    row.update({k: v for k, v in ev.items() if k not in ("client_mt_accuracy", "calibration")})
    state.calibration = ev.get("calibration")
    state.client_rows.append(
        dict(round=row["round"], **dict(zip(self.client_ids, ev["client_mt_accuracy"]))))

  def _stop_if_all_dropped(self, rows, r):
    """Raises `AllClientsDroppedError` when the last `ALL_DROPPED_STOP_ROUNDS` rows
    (rounds up to `r`, a resumed run's included) each dropped every client."""
    last = rows[-ALL_DROPPED_STOP_ROUNDS:]
    c = self.config.clients_per_round
    if len(last) == ALL_DROPPED_STOP_ROUNDS and all(
        row.get("clients_dropped", 0) >= c for row in last):
      config = getattr(self.algorithm, "config", None)  # the settings, not a hook
      ratio = config.max_update_ratio if isinstance(config, base.ClientTraining) else None
      raise AllClientsDroppedError(
          f"[{self.algorithm.name}] rounds {r - ALL_DROPPED_STOP_ROUNDS + 1}-{r}: every client "
          f"update was dropped in {ALL_DROPPED_STOP_ROUNDS} rounds in a row (non-finite, or its "
          "move above --max_update_ratio" + (f"={ratio:g}" if ratio is not None else "") + " times "
          "the server's; update_ratio_max in metrics.csv), so the server model has not moved; "
          f"stopped after writing round {r}. Try a smaller --client_lr or --server_lr, or a "
          "larger --max_update_ratio.")

  def summary(self, state: checkpoint.RunState) -> Dict[str, Any]:
    rows = [r for r in state.rows if evaluated(r)]  # S and MT: evaluated rounds
    best = lambda key: max(r[key] for r in rows)
    return dict(
        algorithm=self.algorithm.name,
        flags=self.flags,
        rounds=state.round,
        best_server_accuracy=best("server_accuracy"),
        best_mt_accuracy=best("mt_accuracy"),
        best_global_accuracy=best("server_accuracy"),
        final_server_accuracy=rows[-1]["server_accuracy"],
        final_mt_accuracy=rows[-1]["mt_accuracy"],
        final_server_loss=rows[-1]["server_loss"],
        final_mt_loss=rows[-1]["mt_loss"],
        # NLL = the test cross-entropy of the evaluated predictive (metrics.csv's losses).
        final_server_nll=rows[-1]["server_loss"],
        final_mt_nll=rows[-1]["mt_loss"],
        final_server_ece=rows[-1].get("server_ece"),
        final_mt_ece=rows[-1].get("mt_ece"),
        # The last evaluation's pooled reliability bins (S and MT) and per-client MT
        # NLL and ECE (`evaluation.aggregate_evaluation`).
        final_calibration=state.calibration,
        wall_time_s=state.wall_time_s,
        bytes_up_total=state.bytes_up_total,
        bytes_down_total=state.bytes_down_total,
        tfbfl_version=tfbfl.__version__,
        # The code this session runs: read once, at its start (`_run`).
        **run_directory.code_identity(state.code_history[-1]),
        code_history=state.code_history,
        data_fingerprint=self._data_fingerprint())

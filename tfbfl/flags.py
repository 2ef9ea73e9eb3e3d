"""absl flags made from the settings' declarations, checked while argv is parsed.

Every flag of `launchers.train` (and the flags a grid launcher shares with it) comes
from one declaration, a `tfbfl.options` field of its owner (`driver.settings()`):
same name, default and help text everywhere. Each flag gets an absl validator with
the field's rule, and one more validator checks the combinations
(`driver.resolve_params`), so a bad value ends the program with one line naming
the flag before TensorFlow is imported:

    from tfbfl import flags as tfbfl_flags

    tfbfl_flags.define()
    tfbfl_flags.run(main, "train")

`run` also quiets TensorFlow's C++ logs (`TF_CPP_MIN_LOG_LEVEL=3` unless set)
and turns Ctrl-C into one line (`tfbfl.round_loop.RunInterrupted` says the round
and the command that continues the run) and exit status 130.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional

from absl import flags as absl_flags

from tfbfl import round_loop
from tfbfl import faults
from tfbfl import options
from tfbfl import run_directory
from tfbfl import driver

FLAGS = absl_flags.FLAGS


def _define_one(name: str, default: Any, option: options.Option, flag_values) -> None:
  help_text = option.help
  if option.kind == "int":
    absl_flags.DEFINE_integer(name, default, help_text, flag_values=flag_values)
  elif option.kind == "float":
    absl_flags.DEFINE_float(name, default, help_text, flag_values=flag_values)
  elif option.kind == "bool":
    absl_flags.DEFINE_bool(name, default, help_text, flag_values=flag_values)
  elif option.kind == "str":
    absl_flags.DEFINE_string(name, default, help_text, flag_values=flag_values)
  elif option.kind == "enum":
    absl_flags.DEFINE_enum(name, default, list(option.choices), help_text, flag_values=flag_values)
  else:  # "ints", "strs": comma-separated lists
    listed = None if default is None else [str(x) for x in default]
    absl_flags.DEFINE_list(name, listed, help_text, flag_values=flag_values)

  def check(value, name=name, option=option):
    try:
      option.check(value, name)
    except ValueError as e:
      raise absl_flags.ValidationError(str(e)) from None
    return True

  absl_flags.register_validator(name, check, flag_values=flag_values)


def define(names: Optional[Iterable[str]] = None,
           flag_values=FLAGS,
           defaults: Optional[Dict[str, Any]] = None,
           check_combinations: bool = True) -> List[str]:
  """Defines the flags `names` (default: every setting and `--algorithm`).

  `defaults` overrides the declared default of some flags (a launcher running a
  paper's experiment, e.g. FOLA's B = 32); the help text says so. With
  `check_combinations`, one more validator runs `driver.resolve_params` over the
  defined flags. Returns the names defined.
  """
  table = driver.settings()
  wanted = ["algorithm", *table] if names is None else list(names)
  unknown = [n for n in wanted if n != "algorithm" and n not in table]
  if unknown:
    raise ValueError(f"no setting named {unknown}; known: {sorted(table)}.")
  defaults = dict(defaults or {})
  for name in wanted:
    if name == "algorithm":
      absl_flags.DEFINE_enum("algorithm",
                             defaults.pop(name, driver.DEFAULT_ALGORITHM),
                             list(driver.algorithm_names()),
                             "Federated algorithm: " +
                             "; ".join(f"{s.name}: {s.summary}" for s in driver.registry.specs()) +
                             " (PFNM, one-shot, not a round algorithm, has launchers of its "
                             "own: launchers.pfnm_batches, pfnm_depth, pfnm_streaming, "
                             "pfnm_sensitivity.)",
                             flag_values=flag_values)
      continue
    default, option = table[name]
    if name in defaults:
      value = defaults.pop(name)
      option = options.Option(
          **{
              **option.__dict__, "help": f"{option.help} (this "
                                         f"experiment's default; the library's: {default!r})"
          })
      default = value
    _define_one(name, default, option, flag_values)
  if check_combinations:

    def combinations(values):
      try:
        driver.resolve_params(_params(values))
      except ValueError as e:
        raise absl_flags.ValidationError(str(e)) from None
      return True

    absl_flags.register_multi_flags_validator(wanted, combinations, flag_values=flag_values)
  return wanted


def _params(values: Dict[str, Any]) -> Dict[str, Any]:
  return {k: v for k, v in values.items() if k in driver.DEFAULTS and k != "verbose"}


def params(names: Optional[Iterable[str]] = None, flag_values=FLAGS) -> Dict[str, Any]:
  """The parsed values of the settings' flags, for `driver.run_training`."""
  names = driver.DEFAULTS if names is None else names
  return _params({n: flag_values[n].value for n in names if n in flag_values})


def fail(program: str, message: str, status: int = 1) -> None:
  """Exits with `status` (default 1) after one line on stderr (absl's usage error
  would print the module help first)."""
  print(f"FATAL {program}: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
  sys.exit(status)


# TensorFlow's C++ log level for launchers: 3 hides INFO, WARNING and ERROR lines.
# 2 would keep the ERROR lines that TF 2.14 prints at every import on a machine
# with its CUDA wheels ("E tensorflow/compiler/xla/stream_executor/cuda/cuda_dnn.cc:
# ... Unable to register cuDNN factory ..."), which are harmless; real failures
# still raise Python exceptions with their message.
TF_CPP_MIN_LOG_LEVEL = "3"


def quiet_tensorflow() -> None:
  """Hides TensorFlow's C++ log lines (`I tensorflow/...`, `E external/...`) unless
  the user set `TF_CPP_MIN_LOG_LEVEL`; effective only before TensorFlow is imported."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", TF_CPP_MIN_LOG_LEVEL)
  # TensorFlow sets TF2_BEHAVIOR=1 itself when imported; a launcher imports it lazily,
  # inside `app.run`, where without the variable TF 2.14 starts with an empty
  # context-switch stack and Keras functional models fail to build (found by the
  # export). Set before the import, launchers run as the tests' subprocesses do.
  os.environ.setdefault("TF2_BEHAVIOR", "1")


def _quiet_from_now_on() -> None:
  """The program ends here, with its one line. What still runs until the process is
  gone (TFF's executor thread retrying a worker that is stopped or dead, TFF's
  finalizers disposing values on it at exit, an abandoned coroutine, a zip file a
  failed write left open) logs, warns and prints nothing more."""
  import logging  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top

  logging.disable(logging.CRITICAL)
  warnings.simplefilter("ignore")
  threading.excepthook = lambda args: None
  sys.excepthook = lambda *args: None  # weakref finalizers at exit report through it
  sys.unraisablehook = lambda unraisable: None


def fault(program: str, error: "faults.RunFault") -> None:
  """Exits with the fault's status after its one line on stderr (`tfbfl.faults`: a
  remote or local TFF worker that failed, a file that could not be written)."""
  _quiet_from_now_on()
  fail(program, str(error), error.status)


def interrupted(program: str, error: BaseException) -> None:
  """Exits with status 130 after one line on stderr: the driver's
  `RunInterrupted` message (round, checkpoint, how to continue), or that the
  program was interrupted."""
  # Already ending: a SIGTERM or Ctrl-C now (a runner's, after the terminal's Ctrl-C
  # reached both; a second Ctrl-C as a stop finishes) would cut the line below off.
  # SIGKILL still ends a cleanup that hangs.
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  _quiet_from_now_on()
  if isinstance(error, round_loop.RunInterrupted):
    line = f"{program}: {' '.join(str(error).split())}"
  else:
    line = f"{program}: interrupted."
  print(line, file=sys.stderr, flush=True)
  sys.exit(round_loop.INTERRUPTED_STATUS)


def parser(program: str, flag_values=FLAGS) -> Callable[[List[str]], List[str]]:
  """An `app.run(flags_parser=...)` that reports a bad flag in one line."""
  quiet_tensorflow()

  def parse(argv: List[str]) -> List[str]:
    try:
      for path in _flagfiles(argv):
        run_directory.check_flagfile(path)  # a run's flags.txt, truncated or changed
    except ValueError as e:
      fail(program, str(e))
    try:
      return flag_values(argv)
    except absl_flags.Error as e:
      message = str(e)
      if message.startswith("flag") and ": --" in message:  # "flag --x=v: --x must ..."
        message = message[message.index(": --") + 2:]
      fail(program, message)

  return parse


def _flagfiles(argv: List[str]) -> List[str]:
  """The paths of the `--flagfile` arguments in `argv`."""
  out = []
  for i, arg in enumerate(argv[1:], start=1):
    name, eq, value = arg.lstrip("-").partition("=")
    if not arg.startswith("-") or name != "flagfile":
      continue
    if eq:
      out.append(value)
    elif i + 1 < len(argv):
      out.append(argv[i + 1])
  return out


def _terminate_as_interrupt(signum, frame):
  """SIGTERM as Ctrl-C: a `KeyboardInterrupt` in the main thread, once."""
  del signum, frame
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  raise KeyboardInterrupt


# What stops at once after the first signal: the same again (either works).
_AGAIN = {signal.SIGINT: "Ctrl-C again", signal.SIGTERM: "SIGTERM again"}


def _stop_after_the_round(program: str) -> Callable[[int, Any], None]:
  """The handler of a launcher's first Ctrl-C or SIGTERM: a run in its rounds
  finishes the round in flight and stops with a checkpoint of it, or, in its last
  round, finishes and starts no other run (`round_loop.request_stop`); otherwise,
  and at the second signal, a `KeyboardInterrupt` at once."""

  def handler(signum, frame):
    del frame
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    asked = round_loop.request_stop()
    if asked is None:
      raise KeyboardInterrupt
    in_flight, rounds = asked
    if in_flight == rounds:
      what = (f"stopping after round {in_flight}, the round in flight and the run's last: "
              "the run writes its final outputs, and no other run starts")
    else:
      what = f"stopping after round {in_flight}, the round in flight, with a checkpoint of it"
    # os.write, not print: the main thread may be inside a print to stderr.
    os.write(sys.stderr.fileno(), (
        f"{program}: {what}; {_AGAIN[signum]} to stop at once (the last checkpoint stays)\n"
    ).encode())

  return handler


def run(main: Callable[[List[str]], Any], program: str) -> None:
  """`app.run(main)` for a launcher: a bad flag (at parse time) or a `ValueError`,
  `FileNotFoundError` or `app.UsageError` raised by `main` ends the program with one
  line `FATAL <program>: ...` and status 1, without the module's help; a fault from
  outside the run (`tfbfl.faults`: a crashed TFF worker, a remote one that died, hung
  or cannot be reached, a full disk, a file that cannot be written or read) with one
  line and the fault's status (`round_loop.WORKER_EXITED_STATUS` for a worker);
  Ctrl-C with one line and status 130 (`interrupted`), and SIGTERM the same way (what
  `kill`, a batch scheduler's preemption and the runner stopping a cell send); the
  first of them while a run's rounds run lets the round in flight finish and saves a
  checkpoint of it (`_stop_after_the_round`), the second interrupts at once.
  TensorFlow's C++ logs are quieted first (`quiet_tensorflow`)."""
  quiet_tensorflow()
  stop = _stop_after_the_round(program)
  if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, stop)
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, stop)
  from absl import app  # pylint: disable=g-import-not-at-top

  def guarded(argv):
    try:
      return main(argv)
    except (app.UsageError, ValueError, FileNotFoundError) as e:
      fail(program, str(e))
    except KeyboardInterrupt as e:
      interrupted(program, e)
    except Exception as e:  # pylint: disable=broad-except  (faults only; the rest propagates)
      found = faults.found(e)  # a worker (WorkerExited: WORKER_EXITED_STATUS) or a file
      if found is None:
        raise
      fault(program, found)

  app.run(guarded, flags_parser=parser(program))

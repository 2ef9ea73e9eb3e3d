"""Running launchers as subprocesses, as a user does (shared by the launcher tests)."""

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_launchers_in_parallel(jobs, tmp_path_factory, common_args=(), timeout=300):
  """Starts `python -m launchers.<name> --output_dir=<tmp> *common_args *args` for
  every `name: args` in `jobs` at once and waits for all.

  Returns `{name: (output_dir, returncode, combined stdout/stderr)}`; a launcher
  still running after `timeout` seconds is killed (returncode then non-zero).
  """
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  procs = {}
  for name, args in jobs.items():
    out = str(tmp_path_factory.mktemp(name))
    cmd = [sys.executable, "-m", f"launchers.{name}", f"--output_dir={out}", *common_args, *args]
    procs[name] = (out,
                   subprocess.Popen(cmd,
                                    cwd=ROOT,
                                    env=env,
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT,
                                    text=True,
                                    stdin=subprocess.DEVNULL))
  results = {}
  for name, (out, proc) in procs.items():
    try:
      log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      log, _ = proc.communicate()
    results[name] = (out, proc.returncode, log)
  return results


def run_launcher(name, *args, timeout=300):
  """`python -m launchers.<name> *args` from the repository root, output captured."""
  return subprocess.run([sys.executable, "-m", f"launchers.{name}", *args],
                        cwd=ROOT,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                        capture_output=True,
                        text=True,
                        timeout=timeout,
                        stdin=subprocess.DEVNULL)


def assert_one_fatal_line_before_tensorflow(out, flag, program="train"):
  """`out` (a run under `python -X importtime`) failed with exactly one line
  `FATAL <program>: ...` naming `flag`, and never imported TensorFlow."""
  assert out.returncode == 1, out
  lines = [l for l in out.stderr.splitlines() if not l.startswith("import time:")]
  assert len(lines) == 1 and lines[0].startswith(f"FATAL {program}: ") and flag in lines[0], lines
  imported = {
      l.split("|")[-1].strip() for l in out.stderr.splitlines() if l.startswith("import time:")
  }
  assert "tensorflow" not in imported and "tensorflow_federated" not in imported


def as_terminal_job():
  """`preexec_fn` for a child that stands in for a terminal's foreground job: SIGINT at
  its default action, as a terminal leaves it. A shell starts background jobs with
  SIGINT ignored and children inherit that, so a suite run from `cmd &` would
  otherwise start launchers deaf to the Ctrl-C the tests send."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)

"""Running launchers as subprocesses, as a user does (shared by the launcher tests)."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import grpc
import psutil

from tfbfl.runtime import channels

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


def assert_one_fatal_line(out, lines, flag, program="train"):
  """`out` exited with 1 and its stderr `lines` are one `FATAL <program>: ...` naming
  `flag`."""
  assert out.returncode == 1, out
  assert len(lines) == 1 and lines[0].startswith(f"FATAL {program}: ") and flag in lines[0], lines


def assert_one_fatal_line_before_tensorflow(out, flag, program="train"):
  """`out` (a run under `python -X importtime`) failed with exactly one line
  `FATAL <program>: ...` naming `flag`, and never imported TensorFlow."""
  assert_one_fatal_line(
      out, [l for l in out.stderr.splitlines() if not l.startswith("import time:")], flag, program)
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


# ------------------------------------------------------- tfbfl-worker services
def start_worker(port, log_dir):
  """`python -m tfbfl.worker --port=<port>` (loopback), its output in
  `<log_dir>/cli_<port>.out`; the caller ends it (SIGTERM; it exits 0)."""
  out = open(os.path.join(log_dir, f"cli_{port}.out"), "wb")  # pylint: disable=consider-using-with
  proc = subprocess.Popen([
      sys.executable, "-m", "tfbfl.worker", f"--port={port}", f"--log_dir={log_dir}",
      "--max_concurrent_computation_calls=1"
  ],
                          stdin=subprocess.DEVNULL,
                          stdout=out,
                          stderr=subprocess.STDOUT)
  out.close()
  return proc


def binary_pids(proc):
  """The pids of a `tfbfl-worker`'s children (its `worker_binary` and bridge)."""
  try:
    return [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
  except psutil.NoSuchProcess:
    return []


def is_running(pid):
  """Whether `pid` runs (a zombie does not); a pid that exits while it is asked counts
  as gone."""
  try:
    return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


def wait_gone(pids, timeout_s=10.0):
  """True once none of `pids` runs (zombies count as gone), False after `timeout_s`."""
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    if not any(is_running(p) for p in pids):
      return True
    time.sleep(0.1)
  return False


def wait_serving(proc, port, timeout_s=60.0):
  """Until the worker's binary is up (a child exists and the port accepts gRPC)."""
  # The library's short back-off: the default one grows to seconds over the retries.
  channel = grpc.insecure_channel(f"localhost:{port}", channels.LOCAL_WORKER_OPTIONS)
  try:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
      assert proc.poll() is None, f"tfbfl-worker on port {port} exited with {proc.returncode}"
      try:
        grpc.channel_ready_future(channel).result(timeout=0.5)
        if binary_pids(proc):
          return
      except grpc.FutureTimeoutError:
        pass
    raise AssertionError(f"tfbfl-worker on port {port} not serving after {timeout_s} s")
  finally:
    channel.close()


def stop_worker(proc, timeout_s=30.0):
  """Ends a `tfbfl-worker` started by `start_worker` (a stopped one is continued first);
  returns its exit status."""
  if proc.poll() is None:
    try:
      proc.send_signal(signal.SIGCONT)
      proc.send_signal(signal.SIGTERM)
      return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
  return proc.wait(timeout=timeout_s)


@contextlib.contextmanager
def importable_module(directory, text, name="mymodels"):
  """Writes `text` as `<directory>/<name>.py`, a user's module (`--model=name:...`), and
  makes it importable in this process for the context, as a launcher imports it from
  its current directory."""
  (directory / f"{name}.py").write_text(text)
  sys.path.insert(0, str(directory))
  sys.modules.pop(name, None)
  try:
    yield directory
  finally:
    sys.path.remove(str(directory))
    sys.modules.pop(name, None)

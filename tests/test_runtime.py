"""The runtime owns its worker: output to a log, no orphan, clear errors; and no TFF
computation runs in TFF's stock context, whose worker outlives the process."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import numpy as np
import psutil
import pytest

from tfbfl import runtime
from tfbfl.runtime import guard
from tfbfl.runtime import isolation
from launcher_helpers import as_terminal_job, wait_gone

_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np
    import tensorflow_federated as tff
    from tfbfl import runtime
    rt = runtime.set_local_runtime(log_dir=sys.argv[1])
    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(v):
      return tff.federated_mean(v)
    print("WORKER_PID", rt.worker.process.pid, flush=True)
    print("WORKER_ADDRESS", rt.worker.address, flush=True)
    print("RESULT", float(mean([1.0, 2.0, 6.0])), flush=True)
    if len(sys.argv) > 2:
      import time
      time.sleep(600)   # parent gets SIGKILLed by the test
""")


def _worker_once_computed(proc, timeout_s=120.0):
  """The worker pid and address that `_SCRIPT` prints, read once its computation
  printed RESULT."""
  worker_pid = address = None
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    line = proc.stdout.readline()
    if line.startswith("WORKER_PID"):
      worker_pid = int(line.split()[1])
    if line.startswith("WORKER_ADDRESS"):
      address = line.split()[1]
    if line.startswith("RESULT") or not line:
      break
  assert worker_pid is not None
  return worker_pid, address


def test_pipeline_ends_promptly_with_no_orphan(tmp_path):
  script = tmp_path / "run.py"
  script.write_text(_SCRIPT)
  t0 = time.time()
  # The failure mode being guarded against: an orphaned worker holding the pipe
  # open makes `python run.py | cat` wait forever.
  out = subprocess.run(f"{sys.executable} {script} {tmp_path} | cat",
                       shell=True,
                       capture_output=True,
                       text=True,
                       timeout=120)
  elapsed = time.time() - t0
  assert "RESULT 3.0" in out.stdout, out.stdout + out.stderr
  worker_pid = int(out.stdout.split("WORKER_PID")[1].split()[0])
  assert wait_gone([worker_pid], 5), "worker outlived its parent"
  assert elapsed < 90
  # The worker's own output went to the log file, not into our pipe.
  logs = [f for f in os.listdir(tmp_path) if f.startswith("tff_worker_")]
  assert logs, "no worker log written"


def test_worker_dies_when_parent_is_killed(tmp_path):
  script = tmp_path / "run.py"
  script.write_text(_SCRIPT)
  proc = subprocess.Popen(
      [sys.executable, str(script), str(tmp_path), "sleep"], stdout=subprocess.PIPE, text=True)
  try:
    worker_pid, address = _worker_once_computed(proc)
    os.kill(proc.pid, signal.SIGKILL)  # no atexit runs: only PDEATHSIG can help
    proc.wait(timeout=10)
    assert wait_gone([worker_pid], 10), "worker survived SIGKILL of its parent"
    if address.startswith("unix:"):  # "netns": the bridge removes its socket's directory.
      sock_dir = os.path.dirname(address[len("unix:"):])
      assert not os.path.exists(sock_dir), f"{sock_dir} outlived the killed parent"
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def test_terminal_ctrl_c_reaches_the_parent_which_ends_the_worker(tmp_path):
  # A terminal sends SIGINT to its whole foreground process group. A worker in
  # that group died with the parent's Ctrl-C while TFF still talked to it (gRPC
  # retry logs before the one-line interruption message); in a group of its own
  # it keeps serving until the interrupted parent's hooks end it.
  script = tmp_path / "run.py"
  script.write_text(_SCRIPT)
  proc = subprocess.Popen(
      [sys.executable, str(script), str(tmp_path), "sleep"],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,  # the script's group, as a terminal's
      preexec_fn=as_terminal_job)
  try:
    worker_pid, _ = _worker_once_computed(proc)
    # The script's descendants only: tests run in parallel start workers too.
    workers = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    assert worker_pid in workers
    assert all(os.getpgid(pid) != proc.pid for pid in workers), "worker in the terminal's group"
    os.killpg(proc.pid, signal.SIGINT)
    # a bound, not a timing: ending the worker took over 30 s on a loaded machine
    _, err = proc.communicate(timeout=120)
    assert "KeyboardInterrupt" in err, err[-2000:]
    for pid in workers:
      assert wait_gone([pid], 10), "worker outlived its interrupted parent"
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def test_dead_worker_gives_clear_error(tmp_path):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  rt = runtime.LocalRuntime(log_dir=str(tmp_path)).start()
  try:

    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def total(v):
      return tff.federated_sum(v)

    assert float(total([1.0, 2.0])) == 3.0
    rt.worker.process.kill()
    rt.worker.process.wait()
    with pytest.raises(Exception, match="exited with code"):
      total([1.0, 2.0])
  finally:
    rt.close()
  assert rt.worker is None


def test_startup_timeout_must_be_positive():
  with pytest.raises(ValueError, match="startup_timeout_s"):
    runtime.WorkerProcess(startup_timeout_s=0)


def test_federated_mean_through_session_runtime(tff_runtime):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def mean(v):
    return tff.federated_mean(v)

  assert float(mean([1.0, 2.0, 6.0])) == pytest.approx(3.0)
  assert tff_runtime.worker.alive()


def test_crashed_binary_inside_its_namespace_is_reported(tmp_path):
  worker = runtime.WorkerProcess(log_dir=str(tmp_path), max_concurrent_computation_calls=1)
  try:
    binaries = [
        c for c in psutil.Process(worker.process.pid).children(recursive=True)
        if "worker_binary" in " ".join(c.cmdline())
    ] or [psutil.Process(worker.process.pid)]
    binaries[0].kill()
    deadline = time.time() + 10
    while worker.alive() and time.time() < deadline:
      time.sleep(0.1)
    with pytest.raises(RuntimeError, match=r"at \S+ exited with code"):
      worker.check_alive()
  finally:
    worker.close()
  if worker.address.startswith("unix:"):
    assert not os.path.exists(os.path.dirname(worker.address[5:])), "socket directory left"


def test_default_log_is_removed_when_empty_and_kept_when_the_worker_crashed(
    tmp_path, monkeypatch):
  # Every run left an empty tff_worker_*.log in /tmp (184 after a day of runs).
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  worker = runtime.WorkerProcess(max_concurrent_computation_calls=1)
  assert os.path.dirname(worker.log_path) == str(tmp_path)
  assert os.path.isfile(worker.log_path)
  worker.close()
  assert not os.path.exists(worker.log_path), "empty log of a normal run left behind"

  crashed = runtime.WorkerProcess(max_concurrent_computation_calls=1)
  crashed.process.kill()
  crashed.process.wait()
  with pytest.raises(RuntimeError, match=re.escape(crashed.log_path)):
    crashed.check_alive()
  crashed.close()
  assert os.path.isfile(crashed.log_path), "the log an error names was removed"


def test_isolation_refuses_to_run_open_unless_asked(monkeypatch):
  # Patched where `resolve_isolation` looks them up (`runtime._netns_available` is
  # only an alias of `isolation.netns_available`).
  monkeypatch.setattr(isolation, "netns_available", lambda: False)
  monkeypatch.setattr(isolation, "loopback_shim", lambda: None)
  monkeypatch.delenv(runtime.ISOLATION_ENV, raising=False)
  with pytest.raises(RuntimeError, match="TFBFL_WORKER_ISOLATION=none"):
    runtime.resolve_isolation()
  with pytest.raises(RuntimeError, match="off the network"):
    runtime.resolve_isolation("netns")
  monkeypatch.setenv(runtime.ISOLATION_ENV, "none")
  assert runtime.resolve_isolation() == "none"


# What a library user does: import tfbfl (before or after TFF) and invoke a TFF
# computation without installing a runtime. TFF's stock context would start a
# `worker_binary` that outlives the script (reparented, e.g. to PID 1).
_NO_RUNTIME_SCRIPT = textwrap.dedent("""
    import sys
    if sys.argv[1] == "tff_first":
      import tensorflow_federated as tff
      import tfbfl
    else:
      import tfbfl
      import tensorflow_federated as tff
    import numpy as np
    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def mean(v):
      return tff.federated_mean(v)
    try:
      print("RESULT", float(mean([1.0, 2.0, 6.0])), flush=True)
    except RuntimeError as e:
      print("ERROR", e, flush=True)
""")


def _processes_with_marker(marker: bytes):
  """(pid, ppid, cmdline) of the live processes whose environment holds `marker`
  and whose command line names `worker_binary` (a /proc scan, no psutil)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if marker not in f.read().split(b"\0"):
          continue
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # Gone meanwhile, or not ours.
      continue
    state, ppid = fields[0], int(fields[1])
    if "worker_binary" in cmdline and state != "Z":
      found.append((int(pid), ppid, cmdline))
  return found


@pytest.mark.parametrize("order", ["tfbfl_first", "tff_first"])
def test_no_runtime_installed_raises_and_leaves_no_worker(tmp_path, order):
  script = tmp_path / "no_runtime.py"
  script.write_text(_NO_RUNTIME_SCRIPT)
  token = uuid.uuid4().hex  # Inherited by every process the script starts.
  env = dict(os.environ, TFBFL_LEAK_PROBE=token)
  marker = f"TFBFL_LEAK_PROBE={token}".encode()
  # Output to a file, not a pipe: a leaked worker would hold a pipe open.
  with open(tmp_path / "out.txt", "w") as out:
    subprocess.run([sys.executable, str(script), order],
                   stdout=out,
                   stderr=subprocess.STDOUT,
                   env=env,
                   timeout=120,
                   check=False)
  text = (tmp_path / "out.txt").read_text()
  deadline = time.time() + 5
  survivors = _processes_with_marker(marker)
  while survivors and time.time() < deadline:
    time.sleep(0.2)
    survivors = _processes_with_marker(marker)
  for pid, _, _ in survivors:  # Started by this test: end them, then fail.
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  assert not survivors, f"worker_binary outlived the script (pid, ppid, cmd): {survivors}"
  lines = [line for line in text.splitlines() if line.startswith(("ERROR", "RESULT"))]
  assert lines in (["RESULT 3.0"], [f"ERROR {guard.MESSAGE}"]), text[-3000:]
  assert "tfbfl.runtime.set_local_runtime()" in guard.MESSAGE


def test_guard_recognises_tff_stock_context():
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  # Built, never invoked: the stock context starts its worker on the first call.
  stock = tff.backends.native.create_sync_local_cpp_execution_context()
  assert guard.is_stock_context(stock)
  assert not guard.is_stock_context(guard.NoRuntimeContext())
  assert not guard.is_stock_context(runtime.LocalRuntime())
  with pytest.raises(runtime.NoRuntimeError, match="set_local_runtime"):
    guard.NoRuntimeContext().invoke(None, None)

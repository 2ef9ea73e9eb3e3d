"""The runtime owns its worker: output to a log, no orphan, clear errors."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from tfbfl import runtime

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
    print("RESULT", float(mean([1.0, 2.0, 6.0])), flush=True)
    if len(sys.argv) > 2:
      import time
      time.sleep(600)   # parent gets SIGKILLed by the test
""")


def _wait_gone(pid, timeout_s=10.0):
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
      return True
    time.sleep(0.1)
  return False


def _worker_pid_once_computed(proc, timeout_s=120.0):
  """The worker pid that `_SCRIPT` prints, read once its computation printed RESULT."""
  worker_pid = None
  deadline = time.time() + timeout_s
  while time.time() < deadline:
    line = proc.stdout.readline()
    if line.startswith("WORKER_PID"):
      worker_pid = int(line.split()[1])
    if line.startswith("RESULT") or not line:
      break
  assert worker_pid is not None
  return worker_pid


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
  assert _wait_gone(worker_pid, 5), "worker outlived its parent"
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
    worker_pid = _worker_pid_once_computed(proc)
    os.kill(proc.pid, signal.SIGKILL)  # no atexit runs: only PDEATHSIG can help
    proc.wait(timeout=10)
    assert _wait_gone(worker_pid, 10), "worker survived SIGKILL of its parent"
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
      start_new_session=True)  # the script's group, as a terminal's
  try:
    worker_pid = _worker_pid_once_computed(proc)
    # The script's descendants only: tests run in parallel start workers too.
    workers = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    assert worker_pid in workers
    assert all(os.getpgid(pid) != proc.pid for pid in workers), "worker in the terminal's group"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert "KeyboardInterrupt" in err, err[-2000:]
    for pid in workers:
      assert _wait_gone(pid, 10), "worker outlived its interrupted parent"
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


def test_isolation_refuses_to_run_open_unless_asked(monkeypatch):
  monkeypatch.setattr(runtime, "_netns_available", lambda: False)
  monkeypatch.setattr(runtime, "_loopback_shim", lambda: None)
  monkeypatch.delenv(runtime.ISOLATION_ENV, raising=False)
  with pytest.raises(RuntimeError, match="TFBFL_WORKER_ISOLATION=none"):
    runtime.resolve_isolation()
  with pytest.raises(RuntimeError, match="off the network"):
    runtime.resolve_isolation("netns")
  monkeypatch.setenv(runtime.ISOLATION_ENV, "none")
  assert runtime.resolve_isolation() == "none"

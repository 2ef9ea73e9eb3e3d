"""Shared fixtures and the session-wide guard against leftover processes.

Every test that invokes TFF computations uses the `tff_runtime` fixture: one owned
`worker_binary` for the whole session (per pytest-xdist worker), stopped at the
end. After the session, the guard fails the run if any child process (or any
process started under this session, found by an inherited environment marker) is
still alive, and kills it so CI never hangs on an open pipe.

The session's processes (xdist workers, launchers, TFF workers) share one temp dir
(`TMPDIR`), removed when the session passes: what lands there (the log of a worker
whose launcher a test kills on purpose, autograph's files, pytest's `tmp_path`s)
does not pile up in the system's. A failed session keeps it and says where.
"""

import atexit
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_TMP_MARKER = "TFBFL_TEST_TMPDIR"


def _remove_if_empty(path):
  try:
    os.rmdir(path)
  except OSError:  # not empty (kept on purpose), or gone
    pass


_OWNS_TMP = _TMP_MARKER not in os.environ  # the first process (xdist's controller)
if _OWNS_TMP:
  os.environ["TMPDIR"] = os.environ[_TMP_MARKER] = tempfile.mkdtemp(prefix="tfbfl-tests-")
  tempfile.tempdir = None  # gettempdir() reads TMPDIR again
  # Without a session (a usage error ends pytest before it), nothing was written there.
  atexit.register(_remove_if_empty, os.environ[_TMP_MARKER])

import psutil  # noqa: E402
import pytest  # noqa: E402

pytest_plugins = ["failure_lines"]  # a run cut short still names its failures

# Inherited by every process the tests start (and by theirs): lets the guard find
# orphans of this session without touching anybody else's processes.
_MARKER = "TFBFL_TEST_SESSION"
os.environ[_MARKER] = str(os.getpid())


@pytest.fixture(scope="session")
def tff_runtime():
  from tfbfl import runtime  # pylint: disable=g-import-not-at-top

  rt = runtime.set_local_runtime()
  yield rt
  runtime.shutdown()


@pytest.fixture
def eager_functions():
  """The test's `tf.function`s run as plain Python (`tf.config.run_functions_eagerly`).

  For checks of mathematics (two formulations of one step agree) run at many settings,
  where tracing each setting anew would be most of the suite's time for them
  (docs/tests.md, "Time"). Each such test keeps its default case in graph mode, as TFF
  runs it.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf.config.run_functions_eagerly(True)
  try:
    yield
  finally:
    tf.config.run_functions_eagerly(False)


def _leftover_processes():
  me = psutil.Process()
  found = {p.pid: p for p in me.children(recursive=True)}
  for p in psutil.process_iter(["pid"]):
    if p.pid == me.pid:
      continue
    try:
      if p.environ().get(_MARKER) == str(me.pid):
        found[p.pid] = p
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
      continue
  alive = []
  for p in found.values():
    try:
      if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
        alive.append(p)
    except psutil.NoSuchProcess:
      pass
  return alive


def _end_leftovers():
  """Stops the session's TFF worker, waits up to 5 s for the session's processes
  to end, kills those still alive and returns their command lines."""
  from tfbfl import runtime  # pylint: disable=g-import-not-at-top

  runtime.shutdown()
  deadline = time.time() + 5
  leftovers = _leftover_processes()
  while leftovers and time.time() < deadline:
    time.sleep(0.2)
    leftovers = _leftover_processes()
  lines = []
  for p in leftovers:
    try:
      lines.append(f"  pid {p.pid}: {' '.join(p.cmdline())}")
      p.kill()
    except psutil.NoSuchProcess:
      pass
  return lines


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_session():
  """Fails the session's last test (teardown) if a process it started is left.

  A fixture rather than only `pytest_sessionfinish`: under pytest-xdist each
  worker runs its own session, and a failure set in a worker's session-finish hook
  never reaches the exit status, while a teardown error is reported as a test's."""
  yield
  lines = _end_leftovers()
  if lines:
    pytest.fail("tests left processes running (killed now):\n" + "\n".join(lines))


# pytest-xdist hands whole modules (`--dist loadfile`) to whichever worker is free, in
# collection order (`--no-loadscope-reorder`, Makefile): the slowest first, so that the
# two workers end together (xdist's own order is by test count). The modules over ~20
# CPU-s, slowest first, as measured in docs/tests.md ("Time"); the others follow in file
# order.
_SLOWEST_FIRST = (
    "test_real_data", "test_reproduce", "test_export", "test_own_model_virtual",
    "test_launchers_smoke", "test_faults_launcher", "test_export_predictive",
    "test_virtual_step", "test_scale_optimizer", "test_outputs", "test_own_model",
    "test_eval_scaling", "test_layers_keras", "test_tff_learning", "test_virtual_ep",
    "test_robust_rounds", "test_virtual_architectures", "test_server_optimizers",
    "test_virtual_sparsity_launchers", "test_fola", "test_pfnm_launchers",
    "test_networks_conv_lstm", "test_client_batch", "test_fedavg", "test_runtime",
    "test_virtual", "test_virtual_temperature", "test_run_directory", "test_remote",
    "test_fola_laplace", "test_fedpa")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: file order kept


def pytest_sessionfinish(session, exitstatus):
  del exitstatus
  lines = _end_leftovers()
  if lines:
    print("\nERROR: tests left processes running (killed now):\n" + "\n".join(lines))
    session.exitstatus = 1
  if _OWNS_TMP:
    tmp = os.environ[_TMP_MARKER]
    if session.exitstatus == 0:
      shutil.rmtree(tmp, ignore_errors=True)
    elif os.listdir(tmp):
      print(f"\nThe session's temp dir (logs, tmp_path) is kept: {tmp}")

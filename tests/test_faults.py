"""The fault matrix, in process: every fault a user meets while a run writes its files
or talks to its workers ends the run with one line (`faults.RunFault`) that says what
happened, which file or worker, what is kept and how to continue, and what was written
before is intact; `--resume` then continues to the uninterrupted run's rows.

Real faults, no stand-ins for tfbfl's code: a full disk is a small tmpfs, a read-only
directory a read-only bind mount, "not writable" a process of user `nobody`, a hung
worker a SIGSTOPped `tfbfl-worker`. Mounting needs root: where it is refused, those
cases skip and say so. The round loop runs `test_outputs`' numpy-only algorithm; the
launcher-level cases (a remote worker killed mid-run, a full disk, a run killed before
its first checkpoint) are in `test_faults_launcher.py`.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np
import portpicker
import pytest

from tfbfl import checkpoint
from tfbfl import faults
from tfbfl import files
from tfbfl import round_loop
from tfbfl import run_directory
from tfbfl import runtime
from tfbfl import state_files
from reproduction import records as records_lib
from reproduction import reproduce
from reproduction import runner as runner_lib
import launcher_helpers
from test_outputs import FLAGS
from test_outputs import _Counter
from test_outputs import _csv
from test_outputs import _data
from test_outputs import _run
from test_outputs import _timeless

COMMAND = "python -m launchers.train --flagfile="


# ------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _mounted(target, *args):
  """`mount <args> <target>` for the block, unmounted after it (skips where refused)."""
  os.makedirs(target, exist_ok=True)
  done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True,
                        check=False)
  if done.returncode != 0:
    pytest.skip(f"cannot mount ({' '.join(args)}): {done.stderr.strip() or 'not root'}; "
                "the full-disk and read-only cases need root")
  try:
    yield str(target)
  finally:
    subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


def _tmpfs(target, size="4m"):
  return _mounted(target, "-t", "tmpfs", "-o", f"size={size}", "tmpfs")


def _fill(directory, leave=0):
  """A ballast file in `directory` that leaves `leave` bytes free on its file system."""
  path = os.path.join(directory, "ballast")
  free = files.free_bytes(directory)
  with open(path, "ab") as f:
    os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, max(free - leave, 0) // 4096
                       * 4096)
  return path


class _Heavy(_Counter):
  """`_Counter` with a 1 MB server state: its checkpoint needs more than the round's
  metrics files, so a nearly full disk fails on the checkpoint."""

  def initial_server_state(self):
    return dict(w=np.zeros(2**18, np.float32), r=np.int64(0))


class _Chatty(_Counter):
  """`_Counter` with 300 more training metrics: a round's TensorBoard events fill
  pages of their own (a tmpfs takes a partly filled page's room for free)."""

  def next(self, server, states, seeds, data):
    server, states, metrics = super().next(server, states, seeds, data)
    return server, states, dict(metrics, **{f"extra_{i}": float(i) for i in range(300)})


class _Failing(_Counter):
  """`_Counter` whose `method` ("next" or "evaluate") raises `error` in round `r`."""

  def __init__(self, method, r, error):
    super().__init__()
    self.method, self.r, self.error = method, r, error
    self.round = 0

  def next(self, server, states, seeds, data):
    self.round = int(server["r"]) + 1
    if self.method == "next" and self.round == self.r:
      raise self.error
    return super().next(server, states, seeds, data)

  def evaluate(self, server, states, seeds, test):
    if self.method == "evaluate" and self.round == self.r:
      raise self.error
    return super().evaluate(server, states, seeds, test)


def _runner(out, algorithm=None, round_hook=None, **kw):
  cfg = dict(rounds=3, clients_per_round=2, seed=1, verbose=False, output_dir=str(out),
             export=False, checkpoint_every=1)
  cfg.update(kw)
  return round_loop.ExperimentRunner(algorithm or _Counter(), _data(), round_loop.RunConfig(**cfg),
                                     flags=dict(FLAGS), round_hook=round_hook)


def _fault(out, raises=Exception, **kw):
  """The one line (`faults.RunFault`) of the error, of type `raises`, a run into `out`
  ends with: the error itself is raised as it is, its line attached."""
  with pytest.raises(raises) as info:
    _runner(out, **kw).run()
  fault = faults.found(info.value)
  assert isinstance(fault, faults.RunFault), info.value
  message = str(fault)
  assert "\n" not in message and message == " ".join(message.split())
  return fault


def _at_round(r, action):
  """A round hook that calls `action()` once, in round `r`."""

  def hook(round_num, row):
    del row
    if round_num == r:
      action()

  return hook


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """`fn(algorithm_class=_Counter)`: the metrics.csv rows, wall times left out, of
  `_runner`'s run of `algorithm_class()` with no fault (run once for the module)."""
  rows = {}

  def get(algorithm_class=_Counter):
    if algorithm_class not in rows:
      out = tmp_path_factory.mktemp("uninterrupted")
      _runner(out, algorithm=algorithm_class()).run()
      rows[algorithm_class] = _timeless(_csv(out))
    return rows[algorithm_class]

  return get


def _continues(out, saved_round, uninterrupted):
  """`out`'s checkpoint holds `saved_round`, intact; `--resume` continues the run to
  the uninterrupted run's metrics.csv."""
  assert checkpoint.load(str(out)).round == saved_round
  _runner(out, resume=True).run()
  assert _timeless(_csv(out)) == uninterrupted()


# ------------------------------------------------------------------ full disk
@pytest.mark.parametrize("kind", ["checkpoint", "metrics", "client_state", "tensorboard"])
def test_a_full_disk_is_one_line_naming_the_file_and_resume_continues(tmp_path, kind,
                                                                      uninterrupted):
  out = tmp_path / "run"
  out.mkdir()
  with contextlib.ExitStack() as stack:
    kw = {}
    if kind == "client_state":  # the disk store on a file system of its own
      full = stack.enter_context(_tmpfs(tmp_path / "states", "1m"))
      kw = dict(client_store="disk", client_store_dir=full)
      leave, algorithm, failed = 0, _Counter(), os.path.join(full, "client_")
    elif kind == "tensorboard":  # tb/ on a file system of its own
      full = stack.enter_context(_tmpfs(out / "tb", "1m"))
      leave, algorithm, failed = 0, _Chatty(), full
    else:
      full = stack.enter_context(_tmpfs(out, "8m"))
      # Room for the round's metrics files and TensorBoard events, not the 1 MB checkpoint.
      leave = 256 * 1024 if kind == "checkpoint" else 0
      algorithm = _Heavy()
      failed = str(out / ("checkpoint.npz" if kind == "checkpoint" else "metrics.csv"))
    ballast = []
    fault = _fault(out, files.FileWriteError, algorithm=algorithm, **kw,
                   round_hook=_at_round(2, lambda: ballast.append(_fill(full, leave))))
    message = str(fault)
    assert fault.status == faults.FILE_FAILED_STATUS == 74 and fault.kind == "file"
    assert message.startswith(f"no space left on device writing {failed}"), message
    if kind == "checkpoint":
      assert re.search(rf"\(it needs 1\.\d MB; \d+\.\d kB free on the file system of {out}\)",
                       message), message
    where = "in round 3 of 3 (training)" if kind == "client_state" else (
        "in round 2 of 3 (writing its outputs)")
    saved = 2 if kind == "client_state" else 1
    assert where in message and f"the checkpoint has round {saved}" in message, message
    assert message.endswith(f"free space there, continue with: {COMMAND}{out}/flags.txt "
                            "--resume"), message
    assert not [n for n in os.listdir(full) if n.startswith(".tmp-")]  # no half file left
    os.remove(ballast[0])  # space freed
    assert checkpoint.load(str(out)).round == saved
    _runner(out, algorithm=algorithm, resume=True, **kw).run()
    assert _timeless(_csv(out)) == uninterrupted(type(algorithm))


def test_a_full_disk_for_a_record_keeps_the_old_one_and_names_the_new(tmp_path):
  """The runner moves a record to the cell that now wants it: new file first, so on a
  full disk the old record stays; the line names the new file and what it needs."""
  with _tmpfs(tmp_path / "results", "1m") as results:
    old, new = reproduce.smoke_cells()[:2]  # the record of `old` ran `new`'s flags
    rec = dict(record_version=records_lib.RECORD_VERSION,
               cell=dict(name=old.name, launcher="train"), flags=new.flag_dict,
               result=dict(summary={}), wall_time_s=1.0)
    records_lib.write_record(old.record_path(results), rec)
    _fill(results)
    with pytest.raises(files.FileWriteError) as info:
      runner_lib.refile([old, new], records_lib.read_records(results), results,
                        log=lambda line: None)
    assert str(info.value).startswith(f"no space left on device writing "
                                      f"{new.record_path(results)} (it needs "), info.value
    assert records_lib.read_records(results) == {old.name: rec}  # the old record stays
    line = faults.outside_run(info.value)
    assert line.status == 74 and str(line).endswith(
        "; run the same command again once that is fixed.")


def test_a_full_disk_in_the_export_is_one_line_and_the_export_is_done_again(tmp_path,
                                                                           tff_runtime):
  """A real algorithm's export (`run_outputs.Export`: SavedModels, TensorFlow's writes)
  on a full disk; with room again, the export of the same state is complete."""
  del tff_runtime
  from tfbfl import driver  # pylint: disable=g-import-not-at-top
  from tfbfl import run_outputs  # pylint: disable=g-import-not-at-top

  p = driver.resolve_params(dict(algorithm="fedavg", num_clients=4, clients_per_round=2,
                                 hidden_units=[8], epochs_per_round=1))
  data = driver.load_data(p)
  algorithm = driver.build_algorithm(data, p)
  state = checkpoint.RunState(round=3, server_state=algorithm.initial_server_state(), clients={})
  out = tmp_path / "run"
  export = lambda: run_outputs.Export(str(out), algorithm, data.client_ids, samples=0, seed=0,
                                      raw_input=data.raw_input, verbose=False).on_end(state, {})
  with _tmpfs(out, "48k"):
    with pytest.raises(files.FileWriteError) as info:
      export()
    assert re.fullmatch(rf"no space left on device writing {out}/export \(it needs more; "
                        rf"\d+\.\d kB free on the file system of {out}\)",
                        str(info.value)), info.value
    line = faults.during_run(info.value, where="writing the final outputs after round 3 of 3",
                             output_dir=str(out), saved_round=3, command=f"{COMMAND}F")
    assert line.status == 74 and str(line).endswith(
        "writing the final outputs after round 3 of 3; the checkpoint has round 3, and what was "
        f"written before is intact; free space there, continue with: {COMMAND}F --resume")
    subprocess.run(["mount", "-o", "remount,size=16m", str(out)], check=True)
    export()
    assert sorted(os.listdir(out / "export" / "clients")) == sorted(data.client_ids)
    assert (out / "export" / "export.json").exists()


# ------------------------------------------------ read-only, not allowed, gone
def test_a_directory_turned_read_only_mid_run_is_one_line(tmp_path, uninterrupted):
  """The disk store's directory (no file is open in it between writes, so it can be
  remounted read-only under the run) turns read-only after round 2."""
  out, states = tmp_path / "run", tmp_path / "states"
  kw = dict(client_store="disk", client_store_dir=str(states))
  with _mounted(states, "--bind", str(states)):
    ro = lambda: subprocess.run(["mount", "-o", "remount,bind,ro", str(states)], check=True)
    fault = _fault(out, round_hook=_at_round(2, ro), **kw)
    assert re.match(rf"cannot write {states}/client_\d\.npz: {states} is on a read-only file "
                    r"system, in round 3 of 3 \(training\); the checkpoint has round 2, ",
                    str(fault)), fault
    assert "; make it writable again, continue with" in str(fault)
    subprocess.run(["mount", "-o", "remount,bind,rw", str(states)], check=True)
    _runner(out, resume=True, **kw).run()
    assert _timeless(_csv(out)) == uninterrupted()


def _closed_to_others(path):
  """The first folder from `path` up to / that other users cannot enter, or None."""
  path = os.path.abspath(path)
  while True:
    if not os.stat(path).st_mode & stat.S_IXOTH:
      return path
    if os.path.dirname(path) == path:
      return None
    path = os.path.dirname(path)


def _as_nobody(*args, **kw):
  """`args` run as user nobody (setpriv), or a skip saying why it cannot be."""
  if os.geteuid() != 0 or not shutil.which("setpriv"):
    pytest.skip("runs a process as user nobody: needs root and setpriv")
  for needed in (launcher_helpers.ROOT, sys.prefix):  # the checkout, the venv
    closed = _closed_to_others(needed)
    if closed:  # e.g. a clone inside `mktemp -d` (mode 700)
      pytest.skip(f"runs a process as user nobody, who cannot enter {closed} "
                  f"(mode {stat.S_IMODE(os.stat(closed).st_mode):o}) to reach {needed}")
  return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *args],
                        capture_output=True, text=True, timeout=120, cwd=launcher_helpers.ROOT,
                        env=dict(os.environ, TMPDIR="/tmp"), **kw)


@pytest.fixture
def shared_dir():
  """A directory user nobody can enter (under /tmp: the session's temp dir is root's)."""
  path = tempfile.mkdtemp(prefix="tfbfl-faults-", dir="/tmp")
  os.chmod(path, 0o755)
  try:
    yield path
  finally:
    shutil.rmtree(path, ignore_errors=True)


def test_files_this_user_may_not_write_or_read_are_one_line(shared_dir):
  """As user nobody: a write into root's directory (what a run meets when its directory's
  rights change mid-run), an --output_dir it cannot create, an --dataset=npz file it
  cannot read: each one line naming the path, before TensorFlow starts."""
  target = os.path.join(shared_dir, "metrics.csv")
  write = _as_nobody(sys.executable, "-c", (
      "import sys\nfrom tfbfl import faults, files\ntry:\n"
      f"  files.atomic_write_text({target!r}, 'x')\n"
      "except OSError as e:\n  print(faults.outside_run(e), e.kind)"))
  assert write.stdout.strip() == (
      f"permission denied writing {target} ({shared_dir} is not writable by uid 65534); run "
      "the same command again once that is fixed. not allowed"), write
  data = os.path.join(shared_dir, "clients.npz")
  np.savez(data, x_0=np.zeros((4, 2), np.float32), y_0=np.zeros(4, np.int64))
  os.chmod(data, 0o600)
  writable = os.path.join(shared_dir, "w")
  os.mkdir(writable)
  os.chmod(writable, 0o777)
  for args, words in (([f"--output_dir={shared_dir}/run"], (
      f"FATAL train: --output_dir={shared_dir}/run cannot be created (Permission denied).")), (
          ["--dataset=npz", f"--data_dir={data}", f"--output_dir={writable}/run"],
          (f"FATAL train: cannot use {data}: Permission denied; run the same command again "
           "once that is fixed."))):
    done = _as_nobody(sys.executable, "-X", "importtime", "-m", "launchers.train", *args)
    lines = [l for l in done.stderr.splitlines() if not l.startswith("import time:")]
    assert lines == [words], done.stderr[-2000:]
    assert done.returncode == (1 if "--output_dir" in words else 74)
    imported = {l.split("|")[-1].strip() for l in done.stderr.splitlines()
                if l.startswith("import time:")}
    assert "tensorflow" not in imported, "TensorFlow started before the file was checked"


def test_an_output_directory_removed_mid_run_stops_the_run_in_one_line(tmp_path, uninterrupted):
  out = tmp_path / "run"
  fault = _fault(out, run_directory.RunDirGone,
                 round_hook=_at_round(2, lambda: shutil.rmtree(out)))
  assert fault.kind == "gone" and fault.status == 74
  assert str(fault).startswith(
      f"--output_dir={out} was removed or moved while the run wrote into it, in round 2 of 3 "
      "(writing its outputs); stopped"), fault
  assert not out.exists(), "the run went on writing into a new directory"
  # Moved away and back: the run continues from its checkpoint.
  moved = tmp_path / "moved"
  fault = _fault(out, round_hook=_at_round(2, lambda: os.rename(out, moved)))
  assert "if it was moved, move it back and continue with" in str(fault)
  os.rename(moved, out)
  _continues(out, 1, uninterrupted)


# -------------------------------------------------------------- remote workers
def _worker_error(code=grpc.StatusCode.UNAVAILABLE):
  return runtime.WorkerError("127.0.0.1:47312", "CreateValue", code, "Socket closed", 30.0)


class _TffCall(grpc.RpcError, grpc.Call):
  """A failed call as TFF's own stub raises it (`RetryableGRPCError` wraps such a call)."""

  def code(self):
    return grpc.StatusCode.UNAVAILABLE

  def details(self):
    return "failed to connect to all addresses"

  def initial_metadata(self):
    return None

  def trailing_metadata(self):
    return None

  def is_active(self):
    return False

  def time_remaining(self):
    return None

  def cancel(self):
    return False

  def add_callback(self, callback):
    return False


@pytest.mark.parametrize("method,where", [("next", "in round 2 of 3 (training)"),
                                          ("evaluate", "in round 2 of 3 (evaluating)")])
def test_a_worker_that_fails_mid_round_or_in_evaluation_is_one_line(tmp_path, method, where,
                                                                    uninterrupted):
  out = tmp_path / "run"
  fault = _fault(out, runtime.WorkerError, algorithm=_Failing(method, 2, _worker_error()))
  assert fault.status == round_loop.WORKER_EXITED_STATUS == 75 and fault.kind == "worker"
  assert str(fault) == (
      "TFF worker 127.0.0.1:47312 is unavailable (its process died, or the address is wrong "
      f"or unreachable) during CreateValue: Socket closed, {where}; the checkpoint has round "
      "1, and what was written before is intact; once the worker is back, continue with: "
      f"{COMMAND}{out}/flags.txt --resume")
  _continues(out, 1, uninterrupted)
  # TFF's own error for a worker it cannot reach, raised in the first round: no checkpoint.
  fresh = tmp_path / "fresh"
  fault = _fault(fresh, algorithm=_Failing(method, 1, _TffCall()))
  assert str(fault).startswith("a TFF worker failed a call with UNAVAILABLE: failed to connect")
  assert str(fault).endswith(f"no checkpoint yet (see --checkpoint_every); once the worker is "
                             f"back, start it again from round 0 with: {COMMAND}{fresh}/flags.txt"
                             " --resume")


def test_a_hung_or_unreachable_worker_is_named_in_one_line(tmp_path):
  """A SIGSTOPped `tfbfl-worker`: a call to it ends at its deadline, a connection to it
  at the connect timeout; a port nobody serves is unreachable. Each is one line naming
  the address, status 75."""
  from tensorflow_federated.proto.v0 import executor_pb2  # pylint: disable=g-import-not-at-top

  port = portpicker.pick_unused_port()
  proc = launcher_helpers.start_worker(port, str(tmp_path))
  try:
    launcher_helpers.wait_serving(proc, port)
    # Short deadlines: the stopped worker never answers, however long they are.
    stub = runtime.DeadlineGrpcStub(f"127.0.0.1:{port}", call_timeout_s=0.5)
    assert stub.wait_ready(10)
    proc.send_signal(signal.SIGSTOP)
    t0 = time.time()
    with pytest.raises(runtime.WorkerError) as info:
      stub.get_executor(executor_pb2.GetExecutorRequest())
    assert time.time() - t0 < 10
    # The stub stays open through the connect checks below: a live channel to the hung
    # worker must not make a new runtime's connection to it look ready (gRPC's shared
    # subchannel pool did, in the full suite).
    line = faults.outside_run(info.value)
    assert line.status == 75 and str(line) == (
        f"TFF worker 127.0.0.1:{port} did not answer within call_timeout_s=0.5 s (hung, "
        "overloaded, unreachable, or a subround longer than the deadline) during GetExecutor: "
        "Deadline Exceeded; run the same command again once the worker is back.")
    for address in (f"127.0.0.1:{port}", f"127.0.0.1:{portpicker.pick_unused_port()}"):
      remote = runtime.RemoteRuntime([address], connect_timeout_s=0.5)
      try:
        with pytest.raises(runtime.WorkerError) as info:
          remote.start()
      finally:
        # A start that wrongly succeeds installs its context as TFF's default: closed
        # here, so that it fails this test alone and not the module's next ones.
        remote.close()
      line = faults.outside_run(info.value)
      assert str(line).startswith(f"TFF worker {address} is unavailable") and (
          "not reachable within connect_timeout_s=0.5 s" in str(line)), line
    stub.close()
  finally:
    assert launcher_helpers.stop_worker(proc) == 0


# ------------------------------------------------ truncated and changed files
def _flip(path, at):
  data = bytearray(open(path, "rb").read())
  data[at] ^= 0x10
  open(path, "wb").write(bytes(data))


def _flip_an_array(path):
  """Flips one bit in the last byte of the first array of the state file `path`."""
  import zipfile  # pylint: disable=g-import-not-at-top
  with zipfile.ZipFile(path) as archive:
    info = archive.getinfo("a0.npy")
  with open(path, "rb") as f:
    f.seek(info.header_offset + 26)
    name_len, extra_len = np.frombuffer(f.read(4), np.uint16)
  _flip(path, info.header_offset + 30 + int(name_len) + int(extra_len) + info.file_size - 1)


def _truncate(path, keep):
  data = open(path, "rb").read()
  open(path, "wb").write(data[:int(len(data) * keep)])


def test_a_truncated_or_changed_checkpoint_or_client_state_is_refused_naming_it(tmp_path):
  out = tmp_path / "run"
  _runner(out, rounds=2, client_store="disk").run()
  path = str(out / "checkpoint.npz")
  pristine = open(path, "rb").read()
  for damage, words in ((lambda: _truncate(path, 0.6), "truncated or corrupted state file"),
                        (lambda: _flip_an_array(path), "truncated or corrupted member a0")):
    damage()
    with pytest.raises(ValueError, match=rf"^--resume: {path}: .*{words}"):
      _runner(out, rounds=3, client_store="disk", resume=True).run()
    open(path, "wb").write(pristine)
  snapshot = out / "client_states_r000002"
  client = str(sorted(snapshot.iterdir())[0])
  _truncate(client, 0.5)
  with pytest.raises(ValueError, match=rf"^--resume: {client}: truncated .* start it again "
                     "with --overwrite"):
    _runner(out, rounds=3, client_store="disk", resume=True).run()


def test_a_truncated_or_changed_flags_file_is_refused_before_absl_reads_it(tmp_path):
  out = tmp_path / "run"
  _runner(out, rounds=1).run()
  path = str(out / "flags.txt")
  run_directory.check_flagfile(path)  # intact
  text = open(path).read()
  assert text.splitlines()[-1].startswith("# sha256 of the lines above: ")
  for broken, words in ((text[:len(text) // 2], "is truncated (its last line"),
                        (text.replace("--seed=1", "--seed=9"), "changed since the run wrote it"),
                        ("", "is truncated (0 bytes"), (text[:20], "is truncated (20 bytes")):
    open(path, "w").write(broken)
    with pytest.raises(ValueError, match=rf"^--flagfile={path} {re.escape(words)}"):
      run_directory.check_flagfile(path)
  old = "# The flags of this run. Continue it, or run it again:\n--seed=1\n"
  open(path, "w").write(old)  # an older tfbfl's flags.txt: no checksum, read as it is
  run_directory.check_flagfile(path)
  # Through the launcher: one line, before TensorFlow.
  open(path, "w").write(text[:len(text) - 30])
  done = launcher_helpers.run_launcher("train", f"--flagfile={path}", "--resume")
  assert done.returncode == 1 and done.stderr.strip().splitlines() == [
      f"FATAL train: --flagfile={path} is truncated (its last line, '# sha256 of the lines "
      "above: ...', is missing); pass the run's flags on the command line instead (with "
      "--resume they are checked against its checkpoint)."], done.stderr[-2000:]


def test_a_truncated_or_changed_record_is_refused_naming_it(tmp_path):
  results = tmp_path / "results"
  cell = reproduce.smoke_cells()[0]
  rec = dict(record_version=records_lib.RECORD_VERSION, cell=dict(name=cell.name),
             flags=cell.flag_dict, result=dict(summary=dict(best_mt_accuracy=0.8125)),
             wall_time_s=1.0)
  path = cell.record_path(str(results))
  records_lib.write_record(path, rec)
  assert records_lib.read_records(str(results)) == {cell.name: rec}
  text = open(path).read()
  for broken, words in ((text[:len(text) // 2], "truncated or corrupted: not JSON"),
                        (text.replace("0.8125", "0.8135"), "its checksum does not match"),
                        ("", "empty")):
    open(path, "w").write(broken)
    with pytest.raises(records_lib.DamagedRecord, match=rf"^{path}: a damaged campaign record "
                       rf"\({words}.*restore it \(git checkout -- {path}\) or remove it"):
      records_lib.read_records(str(results))
  open(path, "w").write(json.dumps(rec))  # a record written before the checksum
  assert records_lib.read_records(str(results)) == {cell.name: rec}


# ----------------------------------------------- resume before a first checkpoint
def test_resume_of_a_run_that_never_checkpointed_starts_it_from_round_0(tmp_path, capsys):
  out = tmp_path / "run"
  want = tmp_path / "want"
  _run(want, rounds=3, client_store="disk")
  with pytest.raises(round_loop.RunInterrupted):  # Ctrl-C in round 3: no checkpoint yet
    _run(out, rounds=3, client_store="disk", algorithm=_Counter(stop_at=3))
  assert not (out / "checkpoint.npz").exists() and len(_csv(out)) == 2
  assert os.listdir(out / "client_states")  # the states of rounds 1-2 are there
  with pytest.raises(ValueError, match=r"^--resume: the run in .* has no checkpoint yet, and "
                     r"its .*flags.txt holds other flags than these: --seed; pass its flags"):
    _run(out, rounds=3, client_store="disk", resume=True, flags=dict(FLAGS, seed=2))
  assert round_loop.ExperimentRunner.check_resumable(str(out), dict(FLAGS), "x") == 0
  capsys.readouterr()
  _run(out, rounds=3, client_store="disk", resume=True, verbose=True)
  printed = capsys.readouterr().out
  assert (f"--resume: no checkpoint in {out} yet (the run stopped before its first); starting "
          "it from round 0 with its flags\n") in printed and "resumed from" not in printed
  assert _timeless(_csv(out)) == _timeless(_csv(want))
  assert state_files.read_meta(str(out / "checkpoint.npz"))["round"] == 3
  # An empty directory resumes as a fresh run too.
  _run(tmp_path / "empty", rounds=3, resume=True)
  assert _timeless(_csv(tmp_path / "empty")) == _timeless(_csv(want))


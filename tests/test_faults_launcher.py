"""The fault matrix as a user meets it, through `launchers.train` and the campaign's
runner (the in-process cases are in `test_faults.py`):

* a run SIGKILLed before its first checkpoint (a kill inside that checkpoint's write
  leaves a temporary file), then, resumed from round 0, SIGKILLed in its export:
  `--resume` continues it to the uninterrupted run's metrics.csv and export;
* a full disk (the output directory on a tmpfs with room for half a checkpoint): one
  FATAL line naming the checkpoint, what it needs and what is free, no traceback;
  the earlier checkpoint intact, and `--resume` finishes once space is freed;
* a remote worker (two `tfbfl-worker` services on loopback; VIRTUAL) SIGKILLed mid-run: the
  launcher's one FATAL line names it and says to resume once it is back; the runner
  runs the cell again from its checkpoint, and the record is the finished run's.

Digits, FedAvg, 4 clients, 8 hidden units, 3 rounds: each launcher costs its start-up.
The uninterrupted run the resumed ones must reproduce trains in this process
(`train_in_process`, the same flags parsed as the launcher parses them): what is
tested is the launchers that were cut, not that one.
"""

import dataclasses
import os
import signal
import time

import portpicker
import pytest

from tfbfl import checkpoint
from tfbfl import faults
from reproduction import records as records_lib
from reproduction import reproduce
from reproduction import runner
import launcher_helpers
import train_in_process
from test_faults import _fill
from test_faults import _tmpfs
from test_outputs import _CPP_LOG
from test_outputs import _Launcher
from test_outputs import _csv
from test_outputs import _timeless
from test_run_directory import _checkpoint_round

ARGS = ("--algorithm=fedavg", "--rounds=3", "--num_clients=4", "--clients_per_round=2",
        "--hidden_units=8", "--epochs_per_round=1")


def _env():
  """The user's environment: the launcher quiets TensorFlow's C++ logs itself."""
  return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def _lines(text):
  return [l for l in text.splitlines() if l.strip()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tff_runtime):
  """metrics.csv (without wall times) of the run the others must end up with: the
  same flags, parsed as the launcher parses them, trained uninterrupted in this
  process (`train_in_process`; what is tested is the interrupted launchers)."""
  del tff_runtime
  out = tmp_path_factory.mktemp("uninterrupted")
  train_in_process.train(*ARGS, "--noexport", f"--output_dir={out}")
  return _timeless(_csv(out))


def test_killed_before_its_first_checkpoint_and_in_its_export_it_resumes_to_the_same_run(
    tmp_path, uninterrupted):
  out = tmp_path / "run"
  first = _Launcher(*ARGS, "--checkpoint_every=0", f"--output_dir={out}", env=_env())
  try:
    assert first.wait_for_line(r"^\[fedavg\] round 1/3 ", timeout=900), "".join(first.err)[-3000:]
  finally:
    first.kill()  # SIGKILL, the launcher and its TFF worker
  assert not (out / "checkpoint.npz").exists() and (out / "flags.txt").exists()
  (out / ".tmp-state-cut.npz").write_bytes(b"PK\x03\x04 cut")  # a kill inside the first save
  again = [f"--flagfile={out}/flags.txt", "--resume"]
  second = _Launcher(*again, env=_env())
  try:
    said = second.wait_for_line(r"^--resume: no checkpoint", timeout=900)
    assert said == (f"--resume: no checkpoint in {out} yet (the run stopped before its first); "
                    "starting it from round 0 with its flags\n"), "".join(second.err)[-3000:]
    deadline = time.time() + 900
    while not (out / "export").exists() and second.proc.poll() is None and time.time() < deadline:
      time.sleep(0.01)
    assert second.proc.poll() is None, "the run ended before its export began"
  finally:
    second.kill()  # in the export
  assert not (out / "export" / "export.json").exists(), "the export was complete"
  assert _checkpoint_round(out) == 3
  status, stdout, err = _Launcher(*again, env=_env()).finish(timeout=900)
  assert status == 0, err[-3000:]
  assert f"resumed from {out}/checkpoint.npz at round 3" in stdout
  assert (out / "export" / "export.json").exists() and (out / "summary.json").exists()
  assert _timeless(_csv(out)) == uninterrupted
  assert not [n for n in os.listdir(out) if n.startswith(".tmp-")]


def test_a_full_disk_is_one_fatal_line_naming_the_file_and_resume_finishes(
    tmp_path, uninterrupted):
  out = tmp_path / "run"
  with _tmpfs(out, "64m"):
    run = _Launcher(*ARGS, "--checkpoint_every=1", "--noexport", f"--output_dir={out}",
                    env=_env())
    try:
      deadline = time.time() + 900
      while _checkpoint_round(out) < 1 and run.proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
      run.proc.send_signal(signal.SIGSTOP)  # the disk fills while the launcher waits
      saved = _checkpoint_round(out)
      assert saved in (1, 2), "".join(run.err)[-3000:]
      ballast = _fill(str(out), os.path.getsize(out / "checkpoint.npz") // 2)
      run.proc.send_signal(signal.SIGCONT)
      status, stdout, err = run.finish(timeout=900)
    finally:
      run.kill()
    assert status == faults.FILE_FAILED_STATUS, (status, err[-3000:])
    assert "Traceback" not in err + stdout and "Exception ignored" not in err, err[-3000:]
    assert not [l for l in (stdout + err).splitlines() if _CPP_LOG.search(l)], err[-3000:]
    fatal, = _lines(err)
    assert fatal.startswith(f"FATAL train: no space left on device writing {out}/checkpoint.npz "
                            "(it needs "), fatal
    assert f"kB free on the file system of {out}), in round {saved + 1} of 3 (writing its " \
           f"outputs); the checkpoint has round {saved}, " in fatal, fatal
    assert fatal.endswith(f"; free space there, continue with: python -m launchers.train "
                          f"--flagfile={out}/flags.txt --resume"), fatal
    assert checkpoint.load(str(out)).round == saved  # intact
    os.remove(ballast)
    status, stdout, err = _Launcher(f"--flagfile={out}/flags.txt", "--resume",
                                    env=_env()).finish(timeout=900)
    assert status == 0, err[-3000:]
    assert f"resumed from {out}/checkpoint.npz at round {saved}" in stdout
    assert _timeless(_csv(out)) == uninterrupted


def test_a_remote_worker_killed_mid_run_is_one_line_and_the_cell_resumes(tmp_path):
  ports = [portpicker.pick_unused_port() for _ in range(2)]
  addresses = [f"127.0.0.1:{p}" for p in ports]
  workers = [launcher_helpers.start_worker(p, str(tmp_path)) for p in ports]
  base = reproduce.smoke_cells()[0]
  # VIRTUAL: its per-client results carry their client index (FedAvg's cannot run remote).
  # Evaluated at the posterior means: the computations each launcher builds and the
  # workers run are smaller, and the fault is the same.
  flags = dict(base.flag_dict, algorithm="virtual", rounds=3, checkpoint_every=1, num_clients=4,
               clients_per_round=2, hidden_units=(8,), eval_samples=0, executor="remote",
               workers=",".join(addresses), call_timeout_s=300.0)
  cell = dataclasses.replace(base, algorithm="virtual", setting="remote",
                             flags=tuple(sorted(flags.items())))
  lines, killed = [], []
  # Checked serving as a launcher starts (its start-up hides the workers').
  unchecked = list(zip(workers, ports))

  def log(line):
    """After round 2 (checkpointed): SIGKILL worker 1; once the launcher has exited,
    start it again on its port."""
    lines.append(line)
    if "loading data" in line:
      while unchecked:
        launcher_helpers.wait_serving(*unchecked.pop(0))
    if "round 2/3" in line and not killed:
      import psutil  # pylint: disable=g-import-not-at-top
      launcher, = [p for p in psutil.Process().children()
                   if "launchers.train" in " ".join(p.cmdline())]
      binaries = launcher_helpers.binary_pids(workers[1])
      workers[1].kill()
      workers[1].wait(timeout=30)
      killed.append(workers[1].pid)
      assert launcher_helpers.wait_gone(binaries), "worker_binary outlived its tfbfl-worker"
      deadline = time.time() + 300  # until it exits (not reaped here: the runner reads its status)
      while launcher.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.1)
      workers[1] = launcher_helpers.start_worker(ports[1], str(tmp_path))
      unchecked.append((workers[1], ports[1]))

  try:
    rec = runner.run_cell(cell, results_dir=str(tmp_path / "results"),
                          work_dir=str(tmp_path / "work"), data_root=str(tmp_path), log=log)
  finally:
    codes = [launcher_helpers.stop_worker(proc) for proc in workers]
  assert killed and not unchecked and codes == [0, 0]
  crashed = (tmp_path / "work" / cell.name / "log.crashed.txt").read_text()
  assert "Traceback" not in crashed, crashed[-3000:]
  fatal = [l for l in _lines(crashed) if l.startswith("FATAL")]
  assert len(fatal) == 1 and _lines(crashed)[-1] == fatal[0], crashed[-3000:]
  run_dir = tmp_path / "work" / cell.name / "run"
  assert fatal[0].startswith(f"FATAL train: TFF worker {addresses[1]} is unavailable "), fatal
  assert ", in round 3 of 3 (" in fatal[0] and "); the checkpoint has round 2, " in fatal[0]
  assert fatal[0].endswith(f"; once the worker is back, continue with: python -m launchers.train"
                           f" --flagfile={run_dir}/flags.txt --resume"), fatal
  assert [l for l in lines if "its TFF worker crashed or failed" in l and
          "running it again from its checkpoint" in l], lines
  assert rec["attempts"] == 2 and rec["resumed_from_rounds"] == [2]
  assert rec["result"]["curves"]["round"] == [1, 2, 3]
  assert records_lib.read_records(str(tmp_path / "results"))[cell.name]["attempts"] == 2

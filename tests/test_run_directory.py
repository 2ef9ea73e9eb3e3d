"""One run per output directory: the lock, old outputs refused unless --resume or
--overwrite, the data fingerprint, stale temporaries, crafted checkpoints through
the launcher, and a kill -9 / resume that reproduces metrics.csv bit for bit."""

import csv
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tfbfl import round_loop
from tfbfl import run_outputs
from tfbfl import run_directory
from tfbfl import state_files
from tfbfl import driver
from tfbfl.data import from_client_arrays
import train_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


class _Counter:
  """A numpy-only algorithm (no TFF): the server adds the selected clients'
  feature means, each client counts its rounds."""

  name = "counter"

  def initial_server_state(self):
    return dict(w=np.zeros(2, np.float32))

  def initial_client_state(self, i):
    return dict(n=np.int32(0), client_index=np.int32(i))

  def next(self, server, states, seeds, data):
    new = [dict(n=s["n"] + 1, client_index=s["client_index"]) for s in states]
    step = np.float32(sum(float(x.mean()) for x, _ in data) + float(seeds[0][1] % 7))
    return dict(w=server["w"] + step), new, dict(train_loss=float(step))

  def evaluate(self, server, states, seeds, test):
    return [
        dict(server_loss=float(server["w"][0]),
             server_correct=1.0,
             mt_loss=float(s["n"]),
             mt_correct=float(len(y) // 2),
             num_examples=float(len(y)),
             client_index=s["client_index"]) for s, (_, y) in zip(states, test)
    ]


def _data(shift=0.0):
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(12, 3)).astype(np.float32) + shift for _ in range(4)]
  ys = [np.arange(12) % 2 for _ in range(4)]
  return from_client_arrays(xs, ys, seed=0)


def _run(out, data=None, **kw):
  cfg = dict(rounds=3,
             clients_per_round=2,
             seed=1,
             verbose=False,
             output_dir=str(out),
             export=False)
  cfg.update(kw)
  runner = round_loop.ExperimentRunner(_Counter(),
                                       data or _data(),
                                       round_loop.RunConfig(**cfg),
                                       flags=dict(algorithm="counter", seed=1))
  try:
    return runner.run()
  finally:
    runner.close()


def _rows(out):
  with open(os.path.join(out, "metrics.csv")) as f:
    return [{k: v for k, v in r.items() if "wall_time" not in k} for r in csv.DictReader(f)]


def test_lock_refuses_a_second_run(tmp_path):
  holder = run_directory.RunLock(str(tmp_path)).acquire()
  try:
    with pytest.raises(run_directory.RunDirBusyError, match="in use by another run"):
      _run(tmp_path)
    with pytest.raises(run_directory.RunDirBusyError, match="in use"):
      run_directory.check_free(str(tmp_path))
  finally:
    holder.release()
  _run(tmp_path)  # free again
  # Released at the end of the run: the next one (with --overwrite) gets it.
  _run(tmp_path, overwrite=True)


def test_lock_of_another_process(tmp_path):
  script = textwrap.dedent(f"""
      import sys, time
      from tfbfl import run_directory
      lock = run_directory.RunLock({str(tmp_path)!r}).acquire()
      print("locked", flush=True)
      sys.stdin.read()  # until the test closes stdin (or dies)
      """)
  holder = subprocess.Popen([sys.executable, "-c", script],
                            cwd=ROOT,
                            env=ENV,
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, "-m", "launchers.train", f"--output_dir={tmp_path}", "--rounds=1"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    lines = [l for l in out.stderr.splitlines() if "in use" in l]
    assert len(lines) == 1 and lines[0].startswith("FATAL train: --output_dir="), out.stderr[-2000:]
    assert "USAGE" not in out.stderr and "--algorithm" not in out.stderr  # no help dump
    assert time.time() - t0 < 60
  finally:
    holder.stdin.close()
    try:
      holder.wait(timeout=30)
    except subprocess.TimeoutExpired:
      holder.kill()
      holder.wait()
  # The holder exited: the lock went with it.
  run_directory.check_free(str(tmp_path))


def test_old_run_refused_unless_resume_or_overwrite(tmp_path, monkeypatch):
  _run(tmp_path, checkpoint_every=1)
  (tmp_path / "notes.txt").write_text("mine")
  (tmp_path / "tb" / "old_events").write_text("x")
  with pytest.raises(ValueError,
                     match=r"already holds another run \(.*metrics\.csv.*--resume.*--overwrite"):
    _run(tmp_path)
  with pytest.raises(ValueError, match="already holds another run"):
    driver.run_training(dict(output_dir=str(tmp_path), rounds=1))  # refused before TFF starts
  with pytest.raises(ValueError, match="exclude each other"):
    _run(tmp_path, resume=True, overwrite=True)
  with monkeypatch.context() as m:  # no final checkpoint: any left would be the old run's
    m.setattr(run_outputs.Checkpoints, "save", lambda self, state: None)
    _run(tmp_path, overwrite=True, rounds=2)
  assert not (tmp_path / "tb" / "old_events").exists()
  assert (tmp_path / "notes.txt").read_text() == "mine"  # not a run output: kept
  assert len(_rows(tmp_path)) == 2 and not (tmp_path / round_loop.CHECKPOINT).exists()
  # --resume continues it (same flags and data).
  _run(tmp_path, checkpoint_every=1, overwrite=True, rounds=2)
  _run(tmp_path, checkpoint_every=1, resume=True, rounds=3)
  want = tmp_path / "want"
  _run(want, checkpoint_every=1)
  assert _rows(tmp_path) == _rows(want)


def test_resume_refuses_changed_data(tmp_path):
  _run(tmp_path, checkpoint_every=1, rounds=2)
  with pytest.raises(ValueError, match="the data changed since checkpoint"):
    _run(tmp_path, data=_data(shift=1e-3), resume=True)
  with pytest.raises(ValueError, match="other flags"):
    runner = round_loop.ExperimentRunner(_Counter(),
                                         _data(),
                                         round_loop.RunConfig(rounds=3,
                                                              clients_per_round=2,
                                                              seed=1,
                                                              output_dir=str(tmp_path),
                                                              resume=True,
                                                              verbose=False),
                                         flags=dict(algorithm="counter", seed=2))
    runner.run()
  runner.close()
  _run(tmp_path, resume=True)  # the same data: fine


def test_stale_temporaries_removed_at_start(tmp_path):
  (tmp_path / ".tmp-state-abc.npz").write_bytes(b"half")
  (tmp_path / ".tmp-snapshot-1").mkdir()
  (tmp_path / "client_states").mkdir()
  (tmp_path / "client_states" / ".tmp-state-x.npz").write_bytes(b"")
  _run(tmp_path, client_store="disk", checkpoint_every=1)
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
  assert not [n for n in os.listdir(tmp_path / "client_states") if n.startswith(".tmp-")]
  # The disk store's snapshot is what the checkpoint names; resume restores it.
  assert os.path.isdir(tmp_path / "client_states_r000003")
  _run(tmp_path, client_store="disk", checkpoint_every=1, resume=True, rounds=4)


def test_output_dir_errors_before_tff_starts(tmp_path, monkeypatch):
  from tfbfl import runtime  # pylint: disable=g-import-not-at-top

  def never(*a, **k):
    raise AssertionError("TFF was started")

  monkeypatch.setattr(runtime, "set_local_runtime", never)
  (tmp_path / "file").write_text("x")
  for out, match in ((tmp_path / "file", "is a regular file"), (tmp_path / "file" / "sub",
                                                                "lies under the regular file"),
                     ("/proc/tfbfl_x/y", "cannot be created")):
    with pytest.raises(ValueError, match=f"--output_dir=.*{match}"):
      driver.run_training(dict(output_dir=str(out), rounds=1))
  with pytest.raises(ValueError, match="--resume needs --output_dir"):
    driver.resolve_params(dict(resume=True))


class _Payload:

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return (open, (self.marker, "w"))


def test_crafted_checkpoints_through_the_launcher(tmp_path):
  """A pickle with a payload as checkpoint.pkl (old name) or checkpoint.npz: one
  line, exit 1, and the payload never runs, even with matching flags."""
  marker = tmp_path / "marker"
  procs = {}
  for name in ("checkpoint.pkl", "checkpoint.npz"):
    out = tmp_path / name.replace(".", "_")
    out.mkdir()
    with open(out / name, "wb") as f:
      pickle.dump(dict(round=1, flags={}, x=_Payload(marker)), f)
    procs[name] = subprocess.Popen(
        [sys.executable, "-m", "launchers.train", f"--output_dir={out}", "--resume", "--rounds=2"],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True)
  for name, proc in procs.items():
    try:
      _, err = proc.communicate(timeout=120)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, err[-2000:]
    fatal = [l for l in err.splitlines() if l.startswith("FATAL")]
    assert len(fatal) == 1 and name in fatal[0] and "pickle" in fatal[0], err[-2000:]
  assert not marker.exists()


# ------------------------------------------------------------ kill -9 / resume
def _flags(out):
  return [
      "--algorithm=fedavg", "--rounds=8", "--checkpoint_every=1", "--epochs_per_round=1",
      "--num_clients=4", "--clients_per_round=2", "--hidden_units=16", f"--output_dir={out}",
      "--noexport"
  ]


def _train_args(out):
  return [sys.executable, "-m", "launchers.train", *_flags(out)]


def _train(out, *extra):
  return subprocess.Popen([*_train_args(out), *extra],
                          cwd=ROOT,
                          env=ENV,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          text=True,
                          start_new_session=True)


def _kill_group(proc):
  if proc.poll() is None:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  proc.communicate()


def _checkpoint_round(out):
  try:
    return state_files.read_meta(os.path.join(out, round_loop.CHECKPOINT))["round"]
  except (FileNotFoundError, ValueError):
    return 0


def test_kill_9_then_resume_reproduces_metrics_bit_for_bit(tmp_path, tff_runtime):
  """A launcher killed (SIGKILL, its process group) after its second checkpoint, then
  resumed by the launcher, writes the metrics.csv of the uninterrupted run (the same
  flags trained in this process: what the training computes, not the launcher, is the
  reference)."""
  del tff_runtime
  full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
  train_in_process.train(*_flags(full_dir))
  cut = _train(cut_dir)
  try:
    deadline = time.time() + 240
    while _checkpoint_round(cut_dir) < 2 and cut.poll() is None and time.time() < deadline:
      time.sleep(0.01)
    os.killpg(cut.pid, signal.SIGKILL)  # the launcher and any worker it started
    cut.communicate(timeout=30)
    killed_at = _checkpoint_round(cut_dir)
    assert 2 <= killed_at < 8 and not (cut_dir / "summary.json").exists(), killed_at
    # Without --resume the interrupted directory is refused; with it, the run finishes.
    refused = subprocess.run(_train_args(cut_dir),
                             cwd=ROOT,
                             env=ENV,
                             capture_output=True,
                             text=True,
                             timeout=120)
    assert refused.returncode == 1 and "--resume" in refused.stderr
    resumed = _train(cut_dir, "--resume")
    log, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, log[-3000:]
    assert f"resumed from {cut_dir}" in log
  finally:
    _kill_group(cut)
    if "resumed" in locals():
      _kill_group(resumed)

  def table(d):
    with open(d / "metrics.csv") as f:
      rows = list(csv.reader(f))
    drop = [i for i, c in enumerate(rows[0]) if "wall_time" in c]
    return [[v for i, v in enumerate(r) if i not in drop] for r in rows]

  assert len(table(full_dir)) == 9
  assert table(cut_dir) == table(full_dir)  # every metric, as written, bit for bit

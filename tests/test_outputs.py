"""What a run leaves in --output_dir, read back: a metrics.csv row and a progress
line per round (evaluated or not), TensorBoard with one event per (tag, round)
across an interrupted and resumed run, HParams, curves.png's panels, summary.json's
provenance, flags.txt replayed through absl, the final checkpoint and the export
call; and, as a user runs it, the launcher's quiet start and its one-line Ctrl-C."""

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

from absl import flags as absl_flags
import numpy as np
import psutil
import pytest

import tfbfl
from tfbfl import round_loop
from tfbfl import export
from tfbfl import run_outputs
from tfbfl import flags as tfbfl_flags
from tfbfl import run_directory
from tfbfl import state_files
from tfbfl import driver
from tfbfl.data import from_client_arrays
from reproduction import _runs
from launcher_helpers import as_terminal_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Counter:
  """A numpy-only algorithm (no TFF): the server adds the selected clients'
  feature means, each client counts its rounds; `stop_at`: Ctrl-C in that round;
  `ask_stop_in`: a stop asked in that round (`round_loop.request_stop`)."""

  name = "counter"

  def __init__(self, stop_at=None, ask_stop_in=None):
    self.stop_at, self.ask_stop_in = stop_at, ask_stop_in

  def initial_server_state(self):
    return dict(w=np.zeros(2, np.float32), r=np.int64(0))

  def initial_client_state(self, i):
    return dict(n=np.int32(0), client_index=np.int32(i))

  def next(self, server, states, seeds, data):
    r = int(server["r"]) + 1
    if r == self.stop_at:
      raise KeyboardInterrupt
    if r == self.ask_stop_in:
      assert round_loop.request_stop()[0] == r  # what a launcher's first Ctrl-C does
    new = [dict(n=s["n"] + 1, client_index=s["client_index"]) for s in states]
    step = np.float32(sum(float(x.mean()) for x, _ in data) + float(seeds[0][1] % 7))
    return dict(w=server["w"] + step, r=np.int64(r)), new, dict(train_loss=float(step),
                                                                clients_seen=len(states))

  def round_bytes(self, num_selected, metrics):
    del metrics
    return 100 * num_selected, 40 * num_selected

  def evaluate(self, server, states, seeds, test):
    return [
        dict(server_loss=1.0 + float(server["w"][0]) % 3,
             server_correct=1.0,
             mt_loss=1.0 + float(s["n"]),
             mt_correct=float(len(y) // 2),
             num_examples=float(len(y)),
             client_index=s["client_index"]) for s, (_, y) in zip(states, test)
    ]


def _data():
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(12, 3)).astype(np.float32) for _ in range(4)]
  ys = [np.arange(12) % 2 for _ in range(4)]
  return from_client_arrays(xs, ys, seed=0)


FLAGS = dict(algorithm="counter", seed=1)


def _runner(out, algorithm=None, data=None, flags=None, **kw):
  cfg = dict(rounds=4,
             clients_per_round=2,
             seed=1,
             verbose=False,
             output_dir=str(out),
             export=False)
  cfg.update(kw)
  return round_loop.ExperimentRunner(algorithm or _Counter(),
                                     data or _data(),
                                     round_loop.RunConfig(**cfg),
                                     flags=dict(flags or FLAGS))


def _run(out, **kw):
  return _runner(out, **kw).run()


def _csv(out):
  with open(os.path.join(out, "metrics.csv")) as f:
    return list(csv.DictReader(f))


def _timeless(rows):
  """`metrics.csv` rows without their wall times."""
  return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rows]


def _timeless_summary(out):
  """`<out>/summary.json` without what differs between equal runs (times, places, code)."""
  summary = json.loads((out / "summary.json").read_text())
  return {k: v for k, v in summary.items()
          if "time" not in k and k not in ("code_history", "output_dir", "started")}


def _events(out):
  """[(tag, step, value or None)] of every summary value in `<out>/tb`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.core.util import event_pb2  # pylint: disable=g-import-not-at-top

  found = []
  tb = os.path.join(out, "tb")
  for name in sorted(os.listdir(tb)):
    for record in tf.data.TFRecordDataset(os.path.join(tb, name)):
      event = event_pb2.Event.FromString(record.numpy())
      for v in event.summary.value:
        value = None
        if not v.tag.startswith("_hparams_/"):
          value = float(tf.make_ndarray(v.tensor)) if v.HasField("tensor") else v.simple_value
        found.append((v.tag, event.step, value))
  return found


def _assert_once(events):
  keys = [(tag, step) for tag, step, _ in events]
  twice = sorted({k for k in keys if keys.count(k) > 1})
  assert not twice, f"(tag, step) written more than once: {twice}"


# ------------------------------------------------------------- every round
def test_every_round_has_a_row_and_a_progress_line(tmp_path, capsys):
  summary = _run(tmp_path, rounds=5, eval_every=2, verbose=True)
  out = capsys.readouterr().out
  rows = _csv(tmp_path)
  assert [r["round"] for r in rows] == ["1", "2", "3", "4", "5"]
  assert list(rows[0])[:8] == list(round_loop.BASE_COLUMNS)
  for r in rows:
    assert r["train_loss"] != "" and r["bytes_up_total"] != ""  # training metrics: every round
    assert (r["server_accuracy"] != "") == (r["round"] in ("2", "4", "5")), r  # evaluated rounds
    assert (r["mt_loss"] != "") == (r["server_accuracy"] != "")
  numeric = _runs.read_metrics(str(tmp_path), numeric=True)  # empty cells left out
  assert [("server_accuracy" in r) for r in numeric] == [False, True, False, True, True]
  assert summary["best_mt_accuracy"] == pytest.approx(max(
      r["mt_accuracy"] for r in numeric if "mt_accuracy" in r),
                                                      rel=1e-5)
  with open(tmp_path / "client_metrics.csv") as f:
    assert [r["round"] for r in csv.DictReader(f)] == ["2", "4", "5"]
  lines = out.splitlines()
  assert "building computations" in lines[0] and "rounds 1-5" in lines[0]
  progress = [l for l in lines if re.match(r"\[counter\] round \d/5 ", l)]
  assert len(progress) == 5
  assert "(not evaluated)" in progress[0] and "train loss" in progress[0]
  assert "S acc" in progress[1] and "MT acc" in progress[1]


def test_progress_paces_a_session_after_its_first_round(capsys):
  """The first round of a session (it traces the computations) is timed alone; the
  pace and the time left after it count only the rounds that followed."""
  clock = iter([0.0, 1000.0, 1300.0, 1400.0, 1500.0, 1600.0])  # made; started; 46 (300 s), 47, 48, 49
  progress = run_outputs.Progress("conv", rounds=100, clients_per_round=10,
                                  clock=lambda: next(clock))
  state = run_outputs.RunState(round=45, server_state=None, clients={})
  progress.on_start(state, resumed=True)
  for r in (46, 47, 48):
    state.round = r
    progress.on_round(state, {"round": r, "train_loss": 0.1}, {})
  lines = capsys.readouterr().out.splitlines()
  assert "300.00 s/round  ETA 4:30:00" in lines[0]  # 54 rounds left at the first round's 300 s
  assert "100.00 s/round  ETA 1:28:20" in lines[1]  # 53 x 100 s
  assert "100.00 s/round  ETA 1:26:40" in lines[2]
  progress.rounds = 55  # under an hour left: m:ss
  state.round = 49
  progress.on_round(state, {"round": 49, "train_loss": 0.1}, {})
  assert capsys.readouterr().out.rstrip().endswith("s/round  ETA 10:00")  # 6 x 100 s


@pytest.fixture(scope="module")
def six_rounds(tmp_path_factory):
  """The uninterrupted run the stopped and resumed runs below are compared with: 6
  rounds, evaluated every 2. Returns (its output directory, not to be written, and
  the summary the run returned)."""
  want = tmp_path_factory.mktemp("six_rounds") / "want"
  return want, _run(want, rounds=6, eval_every=2)


# --------------------------------------------------------------- TensorBoard
def test_tensorboard_one_event_per_round_and_tag_across_a_resume(tmp_path, six_rounds):
  want, _ = six_rounds
  cut = tmp_path / "cut"
  with pytest.raises(round_loop.RunInterrupted) as e:
    _run(cut, algorithm=_Counter(stop_at=5), rounds=6, eval_every=2, checkpoint_every=3)
  # Rounds 1-4 were written to TensorBoard, the checkpoint has round 3.
  assert e.value.round_num == 5 and e.value.checkpoint_round == 3
  assert isinstance(e.value, KeyboardInterrupt)
  assert re.fullmatch(
      r"interrupted in round 5 of 6; the checkpoint has round 3; continue with: python -m "
      r"launchers.train --flagfile=\S+/flags.txt --resume", str(e.value)), str(e.value)
  assert max(step for _, step, _ in _events(cut)) == 4
  _run(cut, rounds=6, eval_every=2, resume=True)
  events = _events(cut)
  _assert_once(events)
  assert sorted((t, s) for t, s, _ in events) == sorted((t, s) for t, s, _ in _events(want))
  values = lambda ev: {(t, s): v for t, s, v in ev if not t.startswith(("_hparams_", "time/"))}
  assert values(events) == values(_events(want))  # the same numbers, once each
  tags = {t for t, _, _ in events}
  assert tags == {
      "accuracy/server", "accuracy/mt", "loss/server", "loss/mt", "train/loss",
      "train/clients_seen", "communication/bytes_up", "communication/bytes_down",
      "communication/bytes_up_total", "communication/bytes_down_total", "time/wall_s",
      "_hparams_/experiment", "_hparams_/session_start_info"
  }
  steps = lambda tag: sorted(s for t, s, _ in events if t == tag)
  assert steps("train/loss") == [1, 2, 3, 4, 5, 6]
  assert steps("accuracy/server") == [2, 4, 6]
  # Continued past its end (more rounds): still one event per (tag, round).
  _run(cut, rounds=7, eval_every=2, resume=True)
  events = _events(cut)
  _assert_once(events)
  assert steps("train/loss") == [1, 2, 3, 4, 5, 6, 7] and steps("accuracy/server") == [2, 4, 6, 7]


@pytest.mark.parametrize("asked_in", [1, 3, 5])  # the first, mid-run, the one before the last
def test_a_stop_asked_in_a_round_ends_the_run_after_it_with_a_checkpoint(tmp_path, asked_in,
                                                                         six_rounds):
  """The round in flight finishes and is written and checkpointed (no periodic
  checkpoint here); the run resumed from it equals the uninterrupted one."""
  (want, _), cut = six_rounds, tmp_path / "cut"
  assert round_loop.request_stop() is None  # no run in its rounds: the caller interrupts
  with pytest.raises(round_loop.RunInterrupted) as e:
    _run(cut, algorithm=_Counter(ask_stop_in=asked_in), rounds=6, eval_every=2)
  assert e.value.round_num is None and e.value.checkpoint_round == asked_in
  assert re.fullmatch(
      rf"stopped after round {asked_in} of 6, as asked; the checkpoint has round {asked_in}; "
      r"continue with: python -m launchers.train --flagfile=\S+/flags.txt --resume",
      str(e.value)), str(e.value)
  assert [int(r["round"]) for r in _csv(cut)] == list(range(1, asked_in + 1))
  assert not os.path.exists(cut / "summary.json")  # the end's outputs wait for the resume
  assert round_loop.request_stop() is None
  _run(cut, rounds=6, eval_every=2, resume=True)
  assert _timeless(_csv(cut)) == _timeless(_csv(want))
  assert _timeless_summary(cut) == _timeless_summary(want)


def test_a_stop_asked_in_the_last_round_lets_the_run_finish_and_stops_the_next_one(tmp_path,
                                                                                 six_rounds):
  """In the run's last round a stop leaves only the final outputs to write: the run
  writes them and returns what the uninterrupted run returns. The stop then holds
  for the next run of the process (a launcher of several runs), which raises before
  it writes anything; the run after that runs."""
  (want, whole), cut, after = six_rounds, tmp_path / "cut", tmp_path / "after"
  asked = _run(cut, algorithm=_Counter(ask_stop_in=6), rounds=6, eval_every=2)
  try:
    with pytest.raises(round_loop.RunInterrupted) as e:
      _run(after, rounds=6, eval_every=2)
  finally:
    round_loop._STOP_ASKED[0] = False  # this process runs other tests
  assert _timeless(_csv(cut)) == _timeless(_csv(want))
  assert _timeless_summary(cut) == _timeless_summary(want)
  assert asked["best_server_accuracy"] == whole["best_server_accuracy"]
  assert e.value.round_num is None and e.value.checkpoint_round is None
  assert str(e.value) == ("stopped before its rounds, as asked (the stop came in the last "
                          "round of the run before it); it wrote nothing.")
  assert not os.path.exists(after)
  _run(after, rounds=6, eval_every=2)  # the stop was taken once
  assert _timeless(_csv(after)) == _timeless(_csv(want))


def test_interrupt_without_a_checkpoint_says_nothing_was_saved(tmp_path):
  with pytest.raises(round_loop.RunInterrupted) as e:
    _run(tmp_path, algorithm=_Counter(stop_at=2))
  assert e.value.checkpoint_round is None and e.value.round_num == 2
  assert str(e.value).startswith("interrupted in round 2 of 4; nothing was saved")
  assert str(e.value).endswith(f"--flagfile={tmp_path}/flags.txt --overwrite")
  runner = round_loop.ExperimentRunner(
      _Counter(stop_at=1), _data(),
      round_loop.RunConfig(rounds=2, clients_per_round=2, verbose=False))
  with pytest.raises(KeyboardInterrupt,
                     match=r"^interrupted in round 1 of 2; nothing was saved "
                     r"\(no --output_dir\)\.$"):
    runner.run()


def test_hparams_hold_the_flags_and_final_metrics(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import plugin_data_pb2  # pylint: disable=g-import-not-at-top
  from tensorflow.core.util import event_pb2  # pylint: disable=g-import-not-at-top

  flags = dict(FLAGS, hidden_units=[16, 8], client_lr=0.05, data_dir=None, resume=False)
  _run(tmp_path, flags=flags)
  found = {}
  for name in os.listdir(tmp_path / "tb"):
    for record in tf.data.TFRecordDataset(str(tmp_path / "tb" / name)):
      for v in event_pb2.Event.FromString(record.numpy()).summary.value:
        if v.tag.startswith("_hparams_/"):
          found[v.tag] = plugin_data_pb2.HParamsPluginData.FromString(
              v.metadata.plugin_data.content)
  start = found["_hparams_/session_start_info"].session_start_info.hparams
  assert start["algorithm"].string_value == "counter" and start["seed"].number_value == 1
  assert start["hidden_units"].string_value == "16,8" and start["client_lr"].number_value == 0.05
  assert "data_dir" not in start
  metrics = [m.name.tag for m in found["_hparams_/experiment"].experiment.metric_infos]
  assert metrics[:4] == ["accuracy/server", "accuracy/mt", "loss/server", "loss/mt"]


# ------------------------------------------------- final checkpoint, export
@pytest.mark.parametrize("every", [0, 3])
def test_final_state_always_saved(tmp_path, every):
  summary = _run(tmp_path, rounds=4, checkpoint_every=every)
  assert state_files.read_meta(str(tmp_path / round_loop.CHECKPOINT))["round"] == 4
  again = _run(tmp_path, rounds=4, checkpoint_every=every, resume=True)  # nothing left to run
  assert [e["from_round"] for e in again["code_history"]] == [0, 4]  # a session, no rounds
  drop = ("wall_time_s", "code_history")
  assert {
      k: v for k, v in again.items() if k not in drop
  } == {
      k: v for k, v in summary.items() if k not in drop
  }
  assert len(_csv(tmp_path)) == 4


def test_resumed_at_a_round_without_evaluation_evaluates_it(tmp_path):
  with pytest.raises(round_loop.RunInterrupted):
    _run(tmp_path, algorithm=_Counter(stop_at=4), rounds=6, eval_every=5, checkpoint_every=3)
  summary = _run(tmp_path, rounds=3, eval_every=5, resume=True)  # round 3 was not evaluated
  rows = _csv(tmp_path)
  assert [r["round"] for r in rows] == ["1", "2", "3"] and rows[2]["server_accuracy"] != ""
  assert summary["final_server_accuracy"] == pytest.approx(float(rows[2]["server_accuracy"]),
                                                           rel=1e-5)
  _assert_once(_events(tmp_path))


def test_export_gets_every_client_last(tmp_path, monkeypatch):
  import types  # pylint: disable=g-import-not-at-top

  calls = []

  def export_run(algorithm, server_state, client_items, directory, *, samples, seed, info,
                 raw_input):
    calls.append(
        dict(algorithm=algorithm,
             server_state=server_state,
             items=[(cid, i, dict(s)) for cid, i, s in client_items],
             directory=directory,
             samples=samples,
             seed=seed,
             raw_input=raw_input,
             info=info,
             checkpoint=state_files.read_meta(str(tmp_path / round_loop.CHECKPOINT))["round"],
             summary=os.path.exists(tmp_path / "summary.json")))

  fake = types.ModuleType("tfbfl.export")
  fake.export_run = export_run
  fake.supports_export = lambda algorithm: True
  fake.iter_client_states = export.iter_client_states
  monkeypatch.setattr(run_outputs, "export", fake)
  data = _data()
  algorithm = _Counter()
  runner = _runner(tmp_path,
                   algorithm=algorithm,
                   data=data,
                   rounds=1,
                   export=True,
                   export_samples=3)
  runner.run()
  assert len(calls) == 1
  call = calls[0]
  assert call["algorithm"] is algorithm and call["server_state"] is runner.state["server_state"]
  assert call["directory"] == os.path.join(str(tmp_path), "export")
  assert call["samples"] == 3 and call["seed"] == 1
  assert call["raw_input"] is data.raw_input  # the loader's preprocessing goes into the export
  assert call["info"] == {}  # no fitted temperatures to state (`--temperature_scaling` off)
  assert call["checkpoint"] == 1 and call["summary"]  # last: after the checkpoint and summary
  assert [(cid, i) for cid, i, _ in call["items"]
         ] == [(str(c), i) for i, c in enumerate(data.client_ids)]
  selected = round_loop.sample_clients(1, 1, 4, 2)
  for _, i, s in call["items"]:
    assert int(s["n"]) == (1 if i in selected else 0) and int(s["client_index"]) == i
  assert os.path.exists(tmp_path / "summary.json")
  calls.clear()
  _run(tmp_path / "off", rounds=1)  # export=False
  assert not calls


# ------------------------------------------------------------- summary.json
def test_summary_json_names_version_commit_and_data(tmp_path):
  data = _data()
  _run(tmp_path, data=data, rounds=2)
  text = (tmp_path / "summary.json").read_text()

  def refuse(constant):
    raise AssertionError(f"not strict JSON: {constant}")

  summary = json.loads(text, parse_constant=refuse)
  assert summary["tfbfl_version"] == tfbfl.__version__
  assert summary["data_fingerprint"] == run_directory.data_fingerprint(data)
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"],
                          cwd=ROOT,
                          capture_output=True,
                          text=True,
                          timeout=10,
                          check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    head = None
  assert summary["git_commit"] == head
  assert summary["git_modified"] in ((None,) if head is None else (True, False))


def _fake_checkout(tmp_path, monkeypatch):
  """A git work tree at `tmp_path/checkout` that `tfbfl` seems to be imported from
  (its `tfbfl/__init__.py`, returned with a `git` runner there); not yet initialised."""
  checkout = tmp_path / "checkout"
  (checkout / "tfbfl").mkdir(parents=True)
  module = checkout / "tfbfl" / "__init__.py"
  module.write_text("x = 1\n")
  monkeypatch.setattr(tfbfl, "__file__", str(module))
  for env in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
    monkeypatch.delenv(env, raising=False)

  def git(*words):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *words],
                   cwd=checkout,
                   check=True,
                   capture_output=True,
                   timeout=30)

  return checkout, module, git


def test_source_modified_follows_tracked_files(tmp_path, monkeypatch):
  checkout, module, git = _fake_checkout(tmp_path, monkeypatch)
  git("init", "-q")
  assert run_directory.source_commit.__wrapped__() is None  # no commit yet
  assert run_directory.source_modified.__wrapped__() is False  # nothing tracked differs
  git("add", ".")
  git("commit", "-q", "-m", "first")
  assert re.fullmatch(r"[0-9a-f]{40}", run_directory.source_commit.__wrapped__())
  assert run_directory.source_modified.__wrapped__() is False
  (checkout / "notes.txt").write_text("untracked\n")
  assert run_directory.source_modified.__wrapped__() is False  # untracked files are not the code
  (checkout / "README.md").write_text("docs\n")
  (checkout / "results").mkdir()
  (checkout / "results" / "r.json").write_text("{}\n")
  git("add", ".")
  git("commit", "-q", "-m", "docs and a record")
  (checkout / "README.md").write_text("docs, rewritten by a report\n")
  (checkout / "results" / "r.json").write_text("{\"moved\": 1}\n")
  assert run_directory.source_modified.__wrapped__() is False  # results and docs are not the code
  assert "git_diff_sha256" not in run_directory.source_provenance()
  module.write_text("x = 2\n")
  assert run_directory.source_modified.__wrapped__() is True
  first = run_directory.source_provenance()["git_diff_sha256"]
  module.write_text("x = 3\n")
  second = run_directory.source_provenance()
  assert second["git_modified"] is True and re.fullmatch(r"[0-9a-f]{64}", first)
  assert second["git_diff_sha256"] != first  # the hash names the difference that ran


def test_a_resumed_run_names_the_code_of_each_session(tmp_path, monkeypatch):
  _, module, git = _fake_checkout(tmp_path, monkeypatch)
  git("init", "-q")
  git("add", ".")
  git("commit", "-q", "-m", "first")
  commit = run_directory.source_commit.__wrapped__()
  out = tmp_path / "run"
  history = lambda: json.loads((out / "summary.json").read_text())["code_history"]
  _run(out, rounds=2, checkpoint_every=1)
  first = [dict(from_round=0, git_commit=commit, git_modified=False)]
  assert history() == first and run_directory.resumes(history()) == []
  _run(out, rounds=3, checkpoint_every=1, resume=True)  # the same code: a stretch a session
  same = dict(from_round=2, git_commit=commit, git_modified=False)
  assert history() == first + [same]
  module.write_text("x = 2\n")
  _run(out, rounds=5, checkpoint_every=1, resume=True)
  diff = run_directory.source_provenance()["git_diff_sha256"]
  modified = dict(from_round=3, git_commit=commit, git_modified=True, git_diff_sha256=diff)
  assert history() == first + [same, modified]
  assert run_directory.resumes(history()) == [same, modified]
  assert run_directory.distinct_codes(history()) == [
      dict(git_commit=commit, git_modified=False),
      dict(git_commit=commit, git_modified=True, git_diff_sha256=diff)]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["git_modified"] is True and summary["git_diff_sha256"] == diff
  # The history travels in the checkpoint: a fourth session under the commit's code adds
  # its stretch after the modified one.
  module.write_text("x = 1\n")
  _run(out, rounds=6, resume=True)
  assert history()[2:] == [modified, dict(from_round=5, git_commit=commit, git_modified=False)]


def test_code_history_of_a_checkpoint_written_before_it_starts_unknown():
  now = dict(git_commit="c" * 40, git_modified=False)
  assert run_directory.extend_code_history(None, 4, now) == [
      dict(from_round=0, git_commit=None, git_modified=None), dict(from_round=4, **now)]
  assert run_directory.extend_code_history(None, 0, now) == [dict(from_round=0, **now)]


def test_source_commit_is_none_outside_a_checkout(tmp_path, monkeypatch):
  fake_package = tmp_path / "site" / "tfbfl"
  fake_package.mkdir(parents=True)
  monkeypatch.setattr(tfbfl, "__file__", str(fake_package / "__init__.py"))
  assert run_directory.source_commit.__wrapped__() is None  # not a git work tree
  monkeypatch.setattr(tfbfl, "__file__", os.path.join(ROOT, "tfbfl", "__init__.py"))
  monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
  assert run_directory.source_commit.__wrapped__() is None


# ---------------------------------------------------------------- flags.txt
def test_flags_file_replays_the_run(tmp_path):
  out = tmp_path / "run"
  flags = driver.resolve_params(
      dict(algorithm="fedavg",
           rounds=4,
           hidden_units=(16, 8),
           client_lr=0.1,
           kl_weight=1e-3,
           output_dir=str(out),
           checkpoint_every=2,
           resume=False))
  flags = {k: (list(v) if isinstance(v, tuple) else v) for k, v in flags.items()}
  runner = _runner(out, flags=flags)
  runner.run()
  path = out / "flags.txt"
  lines = path.read_text().splitlines()
  assert lines[0].startswith("#") and all(l.startswith(("#", "--")) for l in lines)
  body = [l for l in lines if l.startswith("--")]
  assert body[0] == "--algorithm=fedavg" and "--hidden_units=16,8" in body
  assert not [l for l in body if l.startswith(("--resume", "--overwrite", "--verbose"))]
  assert not [l for l in body if l.endswith("=None")]
  stored = json.loads((out / "summary.json").read_text())["flags"]

  def parse(*extra):
    fv = absl_flags.FlagValues()
    tfbfl_flags.define(flag_values=fv)
    fv(["train", f"--flagfile={path}", *extra])
    replay = driver.resolve_params(tfbfl_flags.params(flag_values=fv))
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in replay.items()}

  replay = parse()
  without = lambda d: {k: v for k, v in d.items() if k != "verbose"}
  assert without(replay) == without(runner.flags)  # the driver's flags, every one
  assert without(round_loop.strict_json(replay)) == without(stored)  # as summary.json has them
  assert parse("--resume")["resume"] is True  # flags after --flagfile win


def test_flag_text_round_trips_through_absl():
  assert run_directory.flag_text(True) == "true" and run_directory.flag_text(np.float32(0.5)) == "0.5"
  assert run_directory.flag_text([1, 2]) == "1,2" and run_directory.flag_text(None) is None
  assert run_directory.flag_text(float("inf")) == "inf" and run_directory.flag_text(1e-7) == "1e-07"
  text = run_directory.flagfile_text(dict(seed=3,
                                    algorithm="virtual",
                                    data_dir=None,
                                    resume=True,
                                    output_dir="a\nb",
                                    other=1),
                               names=("algorithm", "seed", "data_dir", "resume", "output_dir"))
  assert text.splitlines() == [
      "--algorithm=virtual", "# --output_dir left out: its value has a line break", "--seed=3"
  ]


# ------------------------------------------------------------------ curves
def test_curves_panels_and_integer_round_ticks(tmp_path):
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  _run(tmp_path, rounds=3, eval_every=2)
  assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  rows = _runs.read_metrics(str(tmp_path), numeric=True)
  for drop_bytes, panels in ((False, 4), (True, 3)):
    shown = [{
        k: v for k, v in r.items() if not (drop_bytes and k.startswith("bytes"))
    } for r in rows]
    fig = round_loop.curves_figure(shown, "counter")
    try:
      axes = fig.get_axes()
      assert len(axes) == panels
      for ax in axes:
        locator = ax.xaxis.get_major_locator()
        assert isinstance(locator, MaxNLocator) and locator._integer  # pylint: disable=protected-access
        assert ax.get_xlabel() == "round"
      assert [len(l.get_xdata()) for l in axes[0].get_lines()] == [2, 2]  # evaluated: 2, 3
      assert [len(l.get_xdata()) for l in axes[2].get_lines()] == [3]  # train loss: every round
    finally:
      plt.close(fig)


# ------------------------------------------------ the launcher, as a user runs it
_CPP_LOG = re.compile(r"\b[IWEF] ?(tensorflow|external|third_party)/|^[IWEF]\d{4} ")


class _Launcher:
  """`python -m launchers.train ARGS` in its own session (process group), its
  stdout and stderr read line by line in threads (a hung run cannot block the test)."""

  def __init__(self, *args, env):
    import queue  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top

    self.proc = subprocess.Popen([sys.executable, "-m", "launchers.train", *args],
                                 cwd=ROOT,
                                 env=env,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE,
                                 text=True,
                                 start_new_session=True,
                                 preexec_fn=as_terminal_job)
    self.queues = {"out": queue.Queue(), "err": queue.Queue()}
    self.out, self.err = [], []

    def pump(stream, store, lines):
      for line in stream:
        store.append(line)
        lines.put(line)
      lines.put(None)  # end of output

    self.threads = [
        threading.Thread(target=pump, args=(self.proc.stdout, self.out, self.queues["out"]),
                         daemon=True),
        threading.Thread(target=pump, args=(self.proc.stderr, self.err, self.queues["err"]),
                         daemon=True)
    ]
    for t in self.threads:
      t.start()

  def wait_for_line(self, pattern, timeout, stream="out"):
    """The next line of `stream` ("out" or "err") that matches `pattern`, or None at
    the end of the output or after `timeout` seconds."""
    import queue  # pylint: disable=g-import-not-at-top

    lines = self.queues[stream]
    deadline = time.time() + timeout
    while time.time() < deadline:
      try:
        line = lines.get(timeout=1)
      except queue.Empty:
        continue
      if line is None:
        return None
      if re.search(pattern, line):
        return line
    return None

  def finish(self, timeout):
    """Waits for the exit (killing the group after `timeout`), then for every process of
    its group (the TFF worker included) to be gone; returns (status, stdout, stderr)."""
    try:
      self.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      pass
    finally:
      self.kill()
    for t in self.threads:
      t.join(timeout=30)
    return self.proc.returncode, "".join(self.out), "".join(self.err)

  @contextlib.contextmanager
  def worker_stopped(self):
    """The launcher's TFF worker (its `worker_binary`) stopped (SIGSTOP) for the block and
    continued after it: the round in flight waits for the worker as long as the block
    lasts, however short its training, at no CPU (a slow worker, as the launcher sees it).
    """
    binaries = [p for p in psutil.Process(self.proc.pid).children(recursive=True)
                if p.name() == "worker_binary"]
    assert binaries, "the launcher has no worker_binary"
    for p in binaries:
      p.send_signal(signal.SIGSTOP)
    try:
      yield
    finally:
      for p in binaries:
        try:
          p.send_signal(signal.SIGCONT)
        except psutil.NoSuchProcess:
          pass

  def group_alive(self):
    try:
      os.killpg(self.proc.pid, 0)
      return True
    except ProcessLookupError:
      return False

  def kill(self):
    if self.proc.poll() is None:
      os.killpg(self.proc.pid, signal.SIGKILL)
      self.proc.wait()
    deadline = time.time() + 10
    while self.group_alive() and time.time() < deadline:
      time.sleep(0.1)
    if self.group_alive():
      os.killpg(self.proc.pid, signal.SIGKILL)
      raise AssertionError("the launcher left processes of its group behind")


_LAUNCHER_ENV = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def _stopped_launcher(stop, out):
  """A launcher in its rounds into `out`, stopped in its round 2 as `stop` says: "ctrl_c"
  (SIGINT to its process group), "sigterm" (to the launcher alone) or "ctrl_c_twice" (a
  second Ctrl-C once the first was handled). Returns (status, stdout, stderr, the round
  of the checkpoint it left or None, the rounds of its metrics.csv)."""
  run = _Launcher("--algorithm=fedavg",
                  "--rounds=400",  # more than run before the signal, even on a loaded machine
                  # Off-schedule: a stop's own checkpoint (no periodic one before round 5).
                  f"--checkpoint_every={1 if stop == 'ctrl_c_twice' else 5}",
                  # Rounds of a fraction of a second; the signals land in one because its
                  # worker is stopped meanwhile (`worker_stopped`).
                  "--epochs_per_round=20",
                  "--num_clients=4",
                  "--clients_per_round=2",
                  "--hidden_units=16",
                  f"--output_dir={out}",
                  "--noexport",
                  env=_LAUNCHER_ENV)
  try:
    first = run.wait_for_line(r"^\[fedavg\] round 1/400 ", timeout=240)
    assert first, ("".join(run.out) + "".join(run.err))[-3000:]
    with run.worker_stopped():  # the round in flight waits for the signals
      time.sleep(0.5)  # past round 1's last output: in round 2
      if stop == "sigterm":
        run.proc.terminate()  # the launcher alone: it must end its TFF worker itself
      else:
        os.killpg(run.proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole process group
      # The second Ctrl-C once the first was handled (two signals before Python runs the
      # handler are one); the round goes on only after the stop was asked.
      handled = run.wait_for_line(r"^train: stopping after round ", timeout=60, stream="err")
      assert handled, ("".join(run.out) + "".join(run.err))[-3000:]
      if stop == "ctrl_c_twice":
        os.killpg(run.proc.pid, signal.SIGINT)
        run.wait_for_line(r"^train: interrupted in round ", timeout=60, stream="err")
  finally:
    status, stdout, err = run.finish(timeout=120)
  try:
    saved = state_files.read_meta(str(out / round_loop.CHECKPOINT))["round"]
  except (OSError, ValueError):
    saved = None
  rows = [int(r["round"]) for r in _csv(out)] if (out / "metrics.csv").exists() else []
  return status, stdout, err, saved, rows


@pytest.fixture(scope="module")
def ctrl_c_run(tmp_path_factory):
  """The Ctrl-C'd launcher (`_stopped_launcher`), then the command it printed, for one
  round more, SIGTERMed in that round, its last (after the rounds' computations are
  built, its worker stopped until the stop was asked). Returns (output dir, what
  `_stopped_launcher` returned, the second launcher's (status, stdout, stderr), or None
  if the first left no checkpoint)."""
  out = tmp_path_factory.mktemp("ctrl_c") / "run"
  first = _stopped_launcher("ctrl_c", out)
  saved = first[3]
  if saved is None:
    return out, first, None
  again = _Launcher(f"--flagfile={out}/flags.txt", "--resume", f"--rounds={saved + 1}",
                    env=_LAUNCHER_ENV)
  try:
    if again.wait_for_line(r"building computations", timeout=240):
      with again.worker_stopped():  # its one round waits for the signal
        time.sleep(0.5)  # in its rounds
        again.proc.terminate()
        # Its handler runs in its main thread: at once, or, seen in suite runs, only once
        # the stopped worker answers (docs/tests.md, "Time"); either way in the round,
        # which `continued` shows.
        handled = again.wait_for_line(r"^train: stopping after round ", timeout=2, stream="err")
      if not handled:
        again.wait_for_line(r"^train: stopping after round ", timeout=60, stream="err")
  finally:
    continued = again.finish(timeout=300)
  return out, first, continued


@pytest.mark.parametrize("stop", ["ctrl_c", "sigterm", "ctrl_c_twice"])
def test_launcher_ctrl_c_is_one_line_and_the_flags_file_continues_it(stop, tmp_path, request):
  """Ctrl-C (SIGINT to the terminal's process group) and SIGTERM to the launcher alone
  (`kill`, a scheduler's preemption, the runner): the round in flight finishes and is
  checkpointed, one line says so, one line names the round and the checkpoint, status
  130, no process of the launcher's left; a second Ctrl-C stops at once. After Ctrl-C
  the printed command continues the run (`ctrl_c_run`)."""
  if stop == "ctrl_c":
    out, (status, stdout, err, saved, rows), continued = request.getfixturevalue("ctrl_c_run")
  else:
    out = tmp_path / "run"
    status, stdout, err, saved, rows = _stopped_launcher(stop, out)
  assert status == 130, (stdout[-2000:], err[-3000:])
  assert "loading data" in stdout and "building computations" in stdout
  assert "Traceback" not in err and "Traceback" not in stdout, err[-3000:]
  assert not [l for l in (stdout + err).splitlines() if _CPP_LOG.search(l)], (stdout + err)[-3000:]
  # Two lines: the stop asked, then where it ended; nothing after them (TFF's threads
  # retrying the stopped worker stay quiet).
  lines = [l for l in err.splitlines() if l.strip() and "absl" not in l]
  assert len(lines) == 2 and all(l.startswith("train: ") for l in lines), err[-3000:]
  asked = re.fullmatch(r"train: stopping after round (\d+), the round in flight, with a checkpoint "
                       rf"of it; {'SIGTERM' if stop == 'sigterm' else 'Ctrl-C'} again to stop "
                       r"at once \(the last checkpoint stays\)",
                       lines[0])
  assert asked, lines[0]
  continue_with = (rf"continue with: python -m launchers.train "
                   rf"--flagfile={re.escape(str(out))}/flags.txt --resume")
  assert saved is not None and saved == rows[-1], (saved, rows)
  if stop == "ctrl_c_twice":  # at once, in the round in flight; the last checkpoint stays
    assert int(asked.group(1)) == saved + 1, (saved, lines)
    assert re.fullmatch(rf"train: interrupted in round {saved + 1} of 400; the checkpoint "
                        rf"has round {saved}; {continue_with}", lines[1]), lines[1]
    return
  # The round in flight was finished, written and checkpointed: nothing trained is lost.
  assert saved < 5 and saved >= int(asked.group(1)) >= 1, (saved, lines)
  assert rows == list(range(1, saved + 1))
  assert re.fullmatch(rf"train: stopped after round {saved} of 400, as asked; the checkpoint has "
                      rf"round {saved}; {continue_with}", lines[1]), lines[1]
  if stop == "sigterm":
    return  # continuing is the same as after Ctrl-C
  # The printed command continues the run (one round more).
  status, stdout, err = continued
  assert status == 0, err[-3000:]
  assert f"resumed from {out}" in stdout
  assert [r["round"] for r in _csv(out)] == [str(r) for r in range(1, saved + 2)]
  assert not _CPP_LOG.search(stdout + err), err[-3000:]


def test_launcher_stopped_in_its_last_round_finishes_the_run(ctrl_c_run):
  """SIGTERM (what the runner's --max_hours sends) in the last round: the launcher
  says it finishes, writes the run's final outputs and exits 0, so a cell stopped
  there needs no other invocation. (The launcher: the Ctrl-C'd run's continuation,
  one round more, `ctrl_c_run`.)"""
  out, first, continued = ctrl_c_run
  assert continued is not None, "the Ctrl-C'd launcher left no checkpoint"
  status, stdout, err = continued
  last = first[3] + 1
  assert status == 0, (stdout[-2000:], err[-3000:])
  lines = [l for l in err.splitlines() if l.strip() and "absl" not in l]
  assert lines == [f"train: stopping after round {last}, the round in flight and the run's last: "
                   "the run writes its final outputs, and no other run starts; SIGTERM again "
                   "to stop at once (the last checkpoint stays)"], err[-3000:]
  assert "Traceback" not in stdout and not _CPP_LOG.search(stdout + err), err[-3000:]
  assert [int(r["round"]) for r in _csv(out)] == list(range(1, last + 1))
  assert state_files.read_meta(str(out / round_loop.CHECKPOINT))["round"] == last
  assert json.loads((out / "summary.json").read_text())["rounds"] == last

"""Remote mode on loopback: two `tfbfl-worker` processes, VIRTUAL rounds equal to
the local run, a killed worker named in the error, no process left behind; the
deadline stub; and the client-state stores.

Everything listens on and connects to localhost only.
"""

import functools
import os
import pickle
import signal
import subprocess
import sys
import time
from concurrent import futures

import grpc
import numpy as np
import portpicker
import pytest

from tfbfl import client_store
from tfbfl import runtime
from tfbfl import state_files
import launcher_helpers


# ----------------------------------------------------------------- helpers
_start_worker = launcher_helpers.start_worker
_binary_pids = launcher_helpers.binary_pids
_wait_gone = launcher_helpers.wait_gone
_wait_serving = launcher_helpers.wait_serving


@functools.lru_cache(maxsize=None)
def _tiny_virtual():
  """One algorithm for every run of this file (its computations are traced once;
  the runs keep their states in their own runners)."""
  from tfbfl.algorithms import virtual  # pylint: disable=g-import-not-at-top

  cfg = virtual.VirtualConfig(input_dim=64,
                              num_classes=10,
                              num_clients=4,
                              hidden_units=(8,),
                              epochs=1,
                              server_lr=0.25,
                              kl_weight=1e-4,
                              jit_compile=False)
  return virtual.VirtualAlgorithm(cfg)


def _run(data, rounds, round_hook=None):
  from tfbfl import round_loop  # pylint: disable=g-import-not-at-top

  config = round_loop.RunConfig(rounds=rounds, clients_per_round=4, seed=3, verbose=False)
  runner = round_loop.ExperimentRunner(_tiny_virtual(), data, config, round_hook=round_hook)
  runner.run()
  return runner


# ------------------------------------------------------ remote VIRTUAL rounds
def test_remote_rounds_match_local_and_dead_worker_is_named(tff_runtime, tmp_path):
  """Two rounds on the two workers equal the local run's; then worker 1 is killed and
  the third round fails at once, naming it."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tfbfl import round_loop  # pylint: disable=g-import-not-at-top
  from tfbfl.data import load_federated  # pylint: disable=g-import-not-at-top

  data = load_federated("digits", num_clients=4, seed=0)
  ports = [portpicker.pick_unused_port() for _ in range(2)]
  addresses = [f"localhost:{p}" for p in ports]
  procs = [_start_worker(p, str(tmp_path)) for p in ports]  # they start while the local run runs
  started = []
  try:
    local = _run(data, rounds=2)
    for proc, port in zip(procs, ports):
      _wait_serving(proc, port)
      started += [proc.pid] + _binary_pids(proc)

    with runtime.RemoteRuntime(addresses, call_timeout_s=120, connect_timeout_s=30) as rt:
      assert tff.framework.get_context_stack().current is rt.context
      assert runtime.mergeable_context_active()
      killed_at = []

      # Kill worker 1 (SIGKILL: no clean-up; its binary dies with it) once round 3 trained
      # (the round hook runs then): its evaluation must fail at once with an error naming
      # that worker.
      def kill_in_round_3(round_num, metrics):
        del metrics
        if round_num == 3:
          binaries = _binary_pids(procs[1])
          procs[1].kill()
          procs[1].wait(timeout=10)
          assert _wait_gone(binaries), "worker_binary outlived its killed tfbfl-worker"
          killed_at.append(time.time())

      config = round_loop.RunConfig(rounds=3, clients_per_round=4, seed=3, verbose=False)
      remote = round_loop.ExperimentRunner(_tiny_virtual(), data, config,
                                           round_hook=kill_in_round_3)
      with pytest.raises(runtime.WorkerError, match=f"TFF worker {addresses[1]} ") as info:
        remote.run()
      assert killed_at and time.time() - killed_at[0] < 60, "the dead worker was not detected promptly"
      assert info.value.worker == addresses[1]
      assert info.value.status_code == grpc.StatusCode.UNAVAILABLE
      # The rounds before the kill, as the run kept them (round 3 is not kept).
      remote_rows, remote_client_rows = remote.state.rows, remote.state.client_rows
      assert len(remote_rows) == len(local.rows) == 2
      for want, got in zip(local.rows, remote_rows):
        for key in ("server_accuracy", "server_loss", "mt_accuracy", "mt_loss", "train_loss",
                    "train_accuracy"):
          np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
      eval_type = remote.algorithm.evaluate.type_signature.result.member
      if "client_index" in tff.structure.name_list(eval_type):
        # Per-client results are re-keyed by client_index (round_loop.evaluate).
        assert len(remote_client_rows) == len(local.client_rows) == 2
        for want, got in zip(local.client_rows, remote_client_rows):
          for cid in data.client_ids:
            np.testing.assert_allclose(got[cid], want[cid], rtol=1e-5, atol=1e-6)
    # The session's local context is back, and it still works.
    assert tff.framework.get_context_stack().current is tff_runtime.context
    assert not runtime.mergeable_context_active()
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    codes = [proc.wait(timeout=30) for proc in procs]
  assert codes[0] == 0, "tfbfl-worker did not exit cleanly on SIGTERM"
  assert _wait_gone(started), "a worker process is still running"
  log = (tmp_path / f"tfbfl_worker_{ports[0]}.log")
  assert log.exists(), "the worker binary's log was not written"
  assert f"listening on 127.0.0.1:{ports[0]} (this machine only" in (
      tmp_path / f"cli_{ports[0]}.out").read_text()


# ----------------------------------------------------------- failure paths
def test_unreachable_worker_is_named_at_start():
  port = portpicker.pick_unused_port()
  rt = runtime.RemoteRuntime([f"localhost:{port}"], connect_timeout_s=0.5)  # nobody serves it
  with pytest.raises(runtime.WorkerError, match=f"localhost:{port}.*not reachable"):
    rt.start()
  assert not rt.running


class _SlowHandler(grpc.GenericRpcHandler):
  """Accepts every RPC and answers only after 5 s: a hung worker."""

  def service(self, handler_call_details):

    def slow(request, context):
      del request
      time.sleep(5)
      context.abort(grpc.StatusCode.INTERNAL, "too late")

    return grpc.unary_unary_rpc_method_handler(slow)


def test_call_deadline_names_the_worker():
  from tensorflow_federated.proto.v0 import executor_pb2  # pylint: disable=g-import-not-at-top

  server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[_SlowHandler()])
  port = server.add_insecure_port("localhost:0")
  server.start()
  try:
    stub = runtime.DeadlineGrpcStub(f"localhost:{port}", call_timeout_s=0.5)
    assert stub.wait_ready(10)
    t0 = time.time()
    with pytest.raises(runtime.WorkerError,
                       match=rf"localhost:{port} did not answer within "
                       r"call_timeout_s=0.5 s.*GetExecutor") as info:
      stub.get_executor(executor_pb2.GetExecutorRequest())
    assert time.time() - t0 < 4
    assert info.value.status_code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert isinstance(info.value, grpc.RpcError)  # TFF's clean-up paths swallow it
    stub.dispose(executor_pb2.DisposeRequest())  # best effort: never raises
    stub.close()
  finally:
    server.stop(0)


def test_runtime_arguments_are_checked():
  with pytest.raises(ValueError, match="at least one worker"):
    runtime.RemoteRuntime([])
  with pytest.raises(ValueError, match="host:port"):
    runtime.RemoteRuntime(["localhost"])
  with pytest.raises(ValueError, match="distinct"):
    runtime.RemoteRuntime(["localhost:1", "localhost:1"])
  with pytest.raises(ValueError, match="call_timeout_s"):
    runtime.RemoteRuntime(["localhost:1"], call_timeout_s=0)
  assert runtime.RemoteRuntime("localhost:1, [::1]:2").workers == ("localhost:1", "[::1]:2")
  with pytest.raises(ValueError, match="needs --workers"):
    runtime.set_runtime("remote")
  with pytest.raises(ValueError, match="only used with --executor=remote"):
    runtime.set_runtime("local", workers=["localhost:1"])
  with pytest.raises(ValueError, match="--executor must be"):
    runtime.set_runtime("cluster")


def test_worker_refuses_a_taken_port(tmp_path):
  port = portpicker.pick_unused_port()
  import socket  # pylint: disable=g-import-not-at-top

  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", port))
    s.listen(1)
    out = subprocess.run(
        [sys.executable, "-m", "tfbfl.worker", f"--port={port}", f"--log_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60)
  assert out.returncode == 1
  assert f"port {port} is already in use" in out.stderr


# ------------------------------------------------------------ client stores
def _state(i):
  return {
      "factor": np.full((3, 2), i, np.float32),
      "private": [np.arange(i + 1.0)],
      "client_index": np.int32(i)
  }


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_client_store_round_trip(kind, tmp_path):
  store = client_store.make_client_store(kind, str(tmp_path / "states"))
  assert 2 not in store and len(store) == 0 and store.get(2) is None
  for i in (5, 2, 11):
    store[i] = _state(i)
  store[2] = _state(7)  # overwrite
  assert sorted(store) == sorted(store.keys()) == [2, 5, 11] and len(store) == 3
  assert 5 in store and np.int64(5) in store and 3 not in store and "x" not in store
  np.testing.assert_array_equal(store[2]["factor"], np.full((3, 2), 7, np.float32))
  np.testing.assert_array_equal(store[11]["private"][0], np.arange(12.0))
  with pytest.raises(KeyError):
    store[3]  # pylint: disable=pointless-statement
  assert sorted(i for i, _ in store.items()) == [2, 5, 11]
  assert sorted(int(v["client_index"]) for v in store.values()) == [5, 7, 11]
  again = pickle.loads(pickle.dumps(store))
  np.testing.assert_array_equal(again[5]["factor"], store[5]["factor"])
  del store[5]
  assert sorted(store) == [2, 11]
  store.clear()
  assert len(store) == 0
  if kind == "memory":
    assert isinstance(store, dict)  # code taking state["clients"] as a dict keeps working
  else:
    assert list(store) == [] and os.listdir(tmp_path / "states") == []


def test_disk_store_writes_atomically(tmp_path, monkeypatch):
  store = client_store.DiskClientStore(str(tmp_path))
  store[0] = _state(1)

  class Unstorable:  # neither an array nor a container: tfbfl.state_files refuses it
    pass

  with pytest.raises(TypeError, match="cannot store"):
    store[0] = Unstorable()

  def crash(src, dst):
    raise OSError("disk full")

  monkeypatch.setattr(client_store.os, "replace", crash)
  with pytest.raises(OSError, match="disk full"):
    store[0] = _state(2)
  monkeypatch.undo()
  # The old state is intact and no temporary file is left.
  np.testing.assert_array_equal(store[0]["factor"], np.full((3, 2), 1, np.float32))
  assert sorted(os.listdir(tmp_path)) == ["client_0.npz"]
  # A DiskClientStore pickles as its directory, not its states.
  assert len(pickle.dumps(store)) < 200


def test_disk_store_snapshot_and_restore(tmp_path):
  store = client_store.DiskClientStore(str(tmp_path / "states"))
  store[0], store[1] = _state(0), _state(1)
  name = client_store.save_snapshot(store, str(tmp_path), round_num=4)
  assert name == "client_states_r000004"
  snap = tmp_path / name
  # Hard links: no copy of unchanged states.
  assert os.stat(snap / "client_0.npz").st_ino == os.stat(store.path(0)).st_ino
  store[0], store[2] = _state(9), _state(2)  # later rounds
  assert store[0]["factor"][0, 0] == 9
  np.testing.assert_array_equal(
      state_files.load(str(snap / "client_0.npz"))[0]["factor"], np.zeros((3, 2), np.float32))
  name8 = client_store.save_snapshot(store, str(tmp_path), round_num=8)
  client_store.prune_snapshots(str(tmp_path), keep=name8)
  assert not snap.exists() and (tmp_path / name8).exists()
  fresh = client_store.DiskClientStore(str(tmp_path / "other"))
  fresh[5] = _state(5)
  fresh.restore(str(tmp_path / name8))
  assert list(fresh) == [0, 1, 2] and fresh[0]["factor"][0, 0] == 9
  with pytest.raises(ValueError, match="needs a directory"):
    client_store.make_client_store("disk")
  with pytest.raises(ValueError, match="memory' or 'disk"):
    client_store.make_client_store("s3")


# ------------------------------------------- driver with the disk store (resume)
def _driver_has_client_store():
  from tfbfl import round_loop  # pylint: disable=g-import-not-at-top

  return "client_store" in round_loop.RunConfig.__dataclass_fields__


def test_disk_store_resume_matches_uninterrupted_run(tff_runtime, tmp_path):
  if not _driver_has_client_store():
    pytest.skip("round_loop.RunConfig has no client_store yet (issue 9 change to round_loop.py)")
  from tfbfl import round_loop  # pylint: disable=g-import-not-at-top
  from tfbfl.data import load_federated  # pylint: disable=g-import-not-at-top

  data = load_federated("digits", num_clients=4, seed=0)

  def run(out, rounds, round_hook=None, **kw):
    config = round_loop.RunConfig(rounds=rounds,
                                  clients_per_round=2,
                                  seed=5,
                                  verbose=False,
                                  eval_every=10,
                                  output_dir=str(out),
                                  client_store="disk",
                                  export=False,
                                  **kw)
    return round_loop.ExperimentRunner(_tiny_virtual(), data, config, round_hook=round_hook).run()

  class _Crash(Exception):
    pass

  def crash_after_round_2(round_num, row):
    del row
    if round_num == 2:
      raise _Crash()

  snapshots = lambda out: sorted(p for p in os.listdir(out) if p.startswith("client_states_r"))
  want = run(tmp_path / "a", 3)
  # One file per client ever trained; never-selected clients are evaluated from
  # their initial state, rebuilt, not stored.
  selected = set().union(*[round_loop.sample_clients(5, r, 4, 2) for r in (1, 2, 3)])
  assert sorted(os.listdir(tmp_path / "a" / "client_states")) == sorted(
      f"client_{i}.npz" for i in selected)
  run(tmp_path / "b", 1, checkpoint_every=1)
  # Round 2 runs and rewrites client files but is never checkpointed (a crash).
  with pytest.raises(_Crash):
    run(tmp_path / "b", 3, checkpoint_every=3, resume=True, round_hook=crash_after_round_2)
  assert snapshots(tmp_path / "b") == ["client_states_r000001"]
  got = run(tmp_path / "b", 3, checkpoint_every=3, resume=True)
  for key in ("final_server_accuracy", "final_mt_accuracy", "final_server_loss", "final_mt_loss"):
    np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
  assert snapshots(tmp_path / "b") == ["client_states_r000003"]

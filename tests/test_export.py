"""Exports a user can deploy (`tfbfl.export`, `launchers.export`).

A run's `export/server` and `export/clients/<id>` SavedModels, loaded with plain
`tf.saved_model.load`, reproduce the run's final S and MT accuracies of
`summary.json` exactly (the same count of correct predictions), for VIRTUAL,
FedAvg, FOLA and Local; `python -m launchers.export` rewrites the same models from
the run's checkpoint; VIRTUAL's Monte Carlo predictives are deterministic in their
seed, are the evaluation's, and give the summary's S on the pooled test set in any
batch size (the user's check on real MNIST: tests/test_export_predictive.py);
docs/library.md's serving snippet runs as written.
"""

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from tfbfl import round_loop
from tfbfl import export
from tfbfl import predictor as predictor_lib
from tfbfl import restore
from tfbfl import run_outputs
from tfbfl import runtime
from tfbfl import driver

pytestmark = pytest.mark.usefixtures("tff_runtime")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# docs/library.md's "Serving an exported model" snippet, executed as written by
# `test_load_and_readme_snippet_serve_the_export` (from a directory where runs/virtual
# is a run of the bundled digits).
README_SNIPPET = """\
import numpy as np
import tensorflow as tf

run = "runs/virtual"  # a run's --output_dir; export/export.json lists its models
x = np.zeros([4, 64], np.float32)  # a batch of raw features, [None, *input_shape] (digits: 64)
server = tf.saved_model.load(f"{run}/export/server")  # plain TensorFlow: no tfbfl needed
probabilities = server.signatures["serving_default"](tf.constant(x))["probabilities"]
client = tf.saved_model.load(f"{run}/export/clients/client_00")  # client_00's own (MT) model
own = client.signatures["serving_default"](tf.constant(x))["probabilities"]
print(probabilities.numpy().argmax(-1), own.numpy().argmax(-1))  # predicted classes
"""

SMALL = dict(rounds=3, epochs_per_round=2, num_clients=3, clients_per_round=2)
EXPORT_TIMES = {}


def _driver_exports() -> bool:
  """Whether the round driver writes `<output_dir>/export` itself."""
  return any("export_run" in inspect.getsource(m) for m in (round_loop, driver, run_outputs))


def _launch(module, *args, timeout=300):
  """`python -m module *args` as from a user's shell: without the TF2_BEHAVIOR=1
  that importing TensorFlow put into this process's environment (with it, the
  child starts TensorFlow differently; see `tfbfl.predictor.eager_scope`)."""
  env = {k: v for k, v in os.environ.items() if k != "TF2_BEHAVIOR"}
  return subprocess.run([sys.executable, "-m", module, *args],
                        cwd=ROOT,
                        capture_output=True,
                        text=True,
                        timeout=timeout,
                        env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"),
                        stdin=subprocess.DEVNULL)


def _train(params, out, launcher=False):
  """Runs `params` into `out` and returns the summary, with the export in
  `out/export`: the driver's, or (until the driver writes one) `export_run` of
  the final state of a run driven here exactly as `driver.run_training` does.
  `launcher`: as a user runs it, `python -m launchers.train` (TensorFlow then
  starts inside `absl.app.run`, see `tfbfl.predictor.eager_scope`)."""
  params = dict(params, output_dir=str(out))
  if launcher and _driver_exports():
    start = time.time()
    args = [f"--{k}={v}" for k, v in params.items()]
    done = _launch("launchers.train", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    EXPORT_TIMES[params["algorithm"]] = ("launchers.train incl. start-up", time.time() - start)
    with open(os.path.join(out, "summary.json")) as f:
      return json.load(f)
  if _driver_exports():
    start = time.time()
    summary = driver.run_training(params)
    EXPORT_TIMES[params["algorithm"]] = ("run incl. export", time.time() - start)
    return summary
  p = driver.resolve_params(params)
  fd = driver.load_data(p)
  runtime.set_local_runtime()
  algorithm = driver.build_algorithm(fd, p)
  flags = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}
  runner = round_loop.ExperimentRunner(algorithm, fd, driver.run_config(p), flags=flags)
  summary = runner.run()
  state = runner.state
  start = time.time()
  export.export_run(algorithm,
                    state["server_state"],
                    export.iter_client_states(algorithm, fd.client_ids, state["clients"]),
                    os.path.join(out, "export"),
                    samples=int(p.get("export_samples") or 0),
                    seed=p["seed"],
                    info=dict(round=state["round"]))
  EXPORT_TIMES[params["algorithm"]] = ("export", time.time() - start)
  return summary


def _data(out):
  """The run's summary and its data (loaded from the data flags it records)."""
  from tfbfl import data as data_lib  # pylint: disable=g-import-not-at-top
  from tfbfl import options  # pylint: disable=g-import-not-at-top

  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  flags = summary["flags"]
  given = {k: flags[k] for k in options.option_fields(data_lib.DataSpec) if k in flags}
  return summary, driver.load_data(driver.resolve_params(dict(given, seed=flags["seed"])))


def _serve(path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  model = tf.saved_model.load(path)
  fn = model.signatures["serving_default"]
  dtype = fn.structured_input_signature[1]["x"].dtype.as_numpy_dtype

  def run(x):
    out = fn(x=tf.constant(np.asarray(x, dtype)))
    return out["probabilities"].numpy(), out["predictions"].numpy()

  run.model = model
  return run


def _check_argmax(p, predictions):
  """`argmax(probabilities)` is the evaluation's prediction but where the top two
  probabilities tie in float32 (the decision scores differ in float rounding only)."""
  assert p.dtype == np.float32 and predictions.dtype == np.int32
  off = np.nonzero(np.argmax(p, -1) != predictions)[0]
  for i in off:
    top = np.sort(p[i])[-2:]
    assert top[1] - top[0] <= 4 * np.spacing(top[1]), (i, p[i], predictions[i])


def _recompute(out, fd, pooled_server=False):
  """(S accuracy, MT accuracy, S loss, MT loss, outputs) from the exported models
  on every client's test data, weighted by test-set size as the driver does."""
  directory = os.path.join(out, "export")
  manifest = export.read_manifest(directory)
  assert [c["client_id"] for c in manifest["clients"]] == list(fd.client_ids)
  assert [c["client_index"] for c in manifest["clients"]] == list(range(len(fd.client_ids)))
  server = _serve(os.path.join(directory, manifest["server"]["path"]))
  if pooled_server:  # Local's ensemble is evaluated on the pooled test inputs
    p_all, c_all = server(fd.pooled("test")[0])
  s_correct = mt_correct = n = 0
  s_loss = mt_loss = 0.0
  outputs, start = {}, 0
  for entry in manifest["clients"]:
    x, y = fd.test[entry["client_id"]]
    if pooled_server:
      p_s, c_s = p_all[start:start + len(y)], c_all[start:start + len(y)]
      start += len(y)
    else:
      p_s, c_s = server(x)
    p_m, c_m = _serve(os.path.join(directory, entry["path"]))(x)
    assert p_s.shape == p_m.shape == (len(y), fd.num_classes)
    for p, c in ((p_s, c_s), (p_m, c_m)):
      np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
      _check_argmax(p, c)
    s_correct += int(np.sum(c_s == y))
    mt_correct += int(np.sum(c_m == y))
    nll = lambda p: float(-np.sum(np.log(np.maximum(p[np.arange(len(y)), y], 1e-30))))
    s_loss += nll(p_s)
    mt_loss += nll(p_m)
    n += len(y)
    outputs[entry["client_id"]] = (p_s, c_s, p_m, c_m)
  return (float(s_correct) / float(n), float(mt_correct) / float(n), s_loss / n, mt_loss / n,
          outputs)


def _check_reproduces(out, pooled_server=False):
  summary, fd = _data(out)
  s, mt, s_loss, mt_loss, outputs = _recompute(out, fd, pooled_server)
  assert s == summary["final_server_accuracy"], (s, summary["final_server_accuracy"])
  assert mt == summary["final_mt_accuracy"], (mt, summary["final_mt_accuracy"])
  # The exported predictive is the evaluated one (losses up to float32 rounding).
  np.testing.assert_allclose(s_loss, summary["final_server_loss"], rtol=1e-4)
  np.testing.assert_allclose(mt_loss, summary["final_mt_loss"], rtol=1e-4)
  return summary, fd, outputs


# --------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def virtual_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("virtual")
  # at the posterior means (the Monte Carlo predictive, the default: below)
  _train(dict(SMALL, algorithm="virtual", checkpoint_every=1, eval_samples=0), out)
  return str(out)


@pytest.fixture(scope="module")
def virtual_outputs(virtual_run):
  return _check_reproduces(virtual_run)


# ----------------------------------------------------------------- the tests
def test_virtual_export_reproduces_summary(virtual_run, virtual_outputs):
  summary, fd, _ = virtual_outputs
  manifest = export.read_manifest(os.path.join(virtual_run, "export"))
  assert manifest["algorithm"] == "virtual" and manifest["server"]["metric"] == "S"
  assert manifest["signature"]["inputs"]["x"] == dict(dtype="float32",
                                                      shape=[None, *fd.input_shape])
  assert manifest["server"]["samples"] == 0 and "mc_seed" not in manifest["server"]
  assert {c["metric"] for c in manifest["clients"]} == {"MT"}
  trained = [c["trained"] for c in manifest["clients"]]
  assert any(trained), trained  # 3 rounds of 2 of 3 clients
  # No temporaries left; every model a complete SavedModel.
  for root, dirs, files in os.walk(os.path.join(virtual_run, "export")):
    assert not [n for n in dirs + files if n.startswith(export.TMP_PREFIX)], root
  for entry in [manifest["server"], *manifest["clients"]]:
    path = os.path.join(virtual_run, "export", entry["path"])
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
  print(f"\nexport timings: {EXPORT_TIMES}")


@pytest.mark.parametrize("algorithm, pooled_server, launcher", [("fedavg", False, True),
                                                                ("fola", False, False),
                                                                ("local", True, False),
                                                                ("fedpa", False, False)])
def test_export_reproduces_summary(algorithm, pooled_server, launcher, tmp_path):
  # FedPA: one burn-in epoch of two, FedAvg's round 1 then posterior averaging.
  extra = dict(fedpa_burn_in=1, fedpa_server_burn_in=1) if algorithm == "fedpa" else {}
  _train(dict(SMALL, algorithm=algorithm, **extra), tmp_path, launcher=launcher)
  _check_reproduces(str(tmp_path), pooled_server)
  manifest = export.read_manifest(os.path.join(tmp_path, "export"))
  assert manifest["algorithm"] == algorithm
  if algorithm == "local":
    assert manifest["server"]["members"] == SMALL["num_clients"]
  print(f"\nexport timings: {EXPORT_TIMES}")


def test_launcher_rewrites_the_export_from_the_checkpoint(virtual_run, virtual_outputs):
  summary, fd, before = virtual_outputs
  first = os.path.join(virtual_run, "export_first")
  if not os.path.exists(first):
    os.rename(os.path.join(virtual_run, "export"), first)
  start = time.time()
  out = _launch("launchers.export", f"--output_dir={virtual_run}")
  elapsed = time.time() - start
  assert out.returncode == 0, out.stderr[-3000:]
  assert (f"virtual: server model and {SMALL['num_clients']} client models (round 3)"
          in out.stdout), out.stdout
  second = os.path.join(virtual_run, "export")

  def files(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)

  assert files(first) == files(second)
  m1, m2 = export.read_manifest(first), export.read_manifest(second)
  assert m2["run"]["round"] == summary["rounds"] == 3
  assert {k: v for k, v in m1.items() if k != "run"} == {k: v for k, v in m2.items() if k != "run"}
  # The same models: identical outputs on every client's test data, bit for bit,
  # hence the summary's accuracies.
  s, mt, _, _, after = _recompute(virtual_run, fd)
  assert (s, mt) == (summary["final_server_accuracy"], summary["final_mt_accuracy"])
  for cid in fd.client_ids:
    for a, b in zip(before[cid], after[cid]):
      np.testing.assert_array_equal(a, b)
  print(f"\nlauncher (subprocess incl. start-up): {elapsed:.1f} s")


def test_launcher_refuses_a_directory_without_checkpoint(tmp_path):
  out = _launch("launchers.export", f"--output_dir={tmp_path}", timeout=120)
  assert out.returncode == 1
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("FATAL export: no checkpoint at"), out.stderr


def test_monte_carlo_server_predictive(virtual_run, tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfbfl.algorithms import virtual  # pylint: disable=g-import-not-at-top

  run = restore.restore_run(virtual_run)
  algorithm, state = run.algorithm, run.server_state
  samples, seed = 4, 7
  manifest = export.export_run(algorithm,
                               state,
                               export.iter_client_states(algorithm, run.data.client_ids,
                                                         run.clients),
                               str(tmp_path),
                               samples=samples,
                               seed=seed)
  assert manifest["export_samples"] == samples
  assert manifest["server"]["samples"] == samples and manifest["server"]["mc_seed"] == [seed, 0]
  assert all(c["samples"] == 0 for c in manifest["clients"])  # MT: posterior means
  loaded = tf.saved_model.load(os.path.join(tmp_path, "server"))
  serve = loaded.signatures["serving_default"]
  mean_server = _serve(os.path.join(virtual_run, "export", "server"))
  x, y = run.data.test[run.data.client_ids[0]]
  first = serve(x=tf.constant(x))["probabilities"].numpy()
  np.testing.assert_array_equal(first, serve(x=tf.constant(x))["probabilities"].numpy())
  np.testing.assert_allclose(first.sum(-1), 1.0, atol=1e-5)
  assert np.all(first >= 0)
  assert not np.array_equal(first, mean_server(x)[0])  # sampled, not the means
  # Deterministic given the seed: an independent build with the same seed serves
  # the same probabilities bit for bit; another seed other ones.
  same = algorithm.server_predictor(state, samples=samples, seed=seed)
  np.testing.assert_array_equal(same(x).numpy(), first)
  other = algorithm.server_predictor(state, samples=samples, seed=seed + 1)
  assert not np.array_equal(other(x).numpy(), first)
  # `predict_seeded` at the evaluation's seed (the server network's, `[run seed, 0]`:
  # `virtual.evaluation.predictive_seed`) is S of an evaluation with eval_samples = 4
  # (`virtual.evaluate_server_client`, plain TF here), whatever seed the driver passes.
  seeded = loaded.signatures["predict_seeded"]
  cfg = dataclasses.replace(algorithm.config, eval_samples=samples)
  assert cfg.seed == 0
  for i, cid in enumerate(run.data.client_ids):
    x, y = run.data.test[cid]
    got = seeded(x=tf.constant(x), seed=tf.constant([0, 0], tf.int64))
    sums = virtual.evaluate_server_client(cfg, state.posterior, np.int32(i),
                                          np.array([0, 12345 + i], np.int64), x, y)
    assert float(np.sum(got["predictions"].numpy() == y)) == float(sums["server_correct"])
    p = got["probabilities"].numpy()
    np.testing.assert_allclose(-np.sum(np.log(p[np.arange(len(y)), y] + 1e-12)),
                               float(sums["server_loss"]),
                               rtol=1e-5)


def test_monte_carlo_exports_give_the_summary_in_any_batch(tmp_path):
  """With eval_samples > 0 S and MT are Monte Carlo predictives whose noise is keyed
  by the example, at the exported models' seeds ([seed, 0] for the server, [seed, i + 1]
  for client i): `serving_default` gives the summary's accuracies client by client, on
  the pooled test set, and in batches of any size."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  # Two clients: each exported model is a traced Monte Carlo predictive.
  _train(
      dict(algorithm="virtual",
           rounds=2,
           epochs_per_round=1,
           num_clients=2,
           clients_per_round=2,
           eval_samples=3), tmp_path)
  summary, fd = _data(str(tmp_path))
  directory = os.path.join(tmp_path, "export")
  manifest = export.read_manifest(directory)
  assert manifest["server"]["samples"] == 3 and manifest["server"]["mc_seed"] == [0, 0]
  assert [c["mc_seed"] for c in manifest["clients"]] == [[0, i + 1] for i in range(2)]
  load = lambda path: tf.saved_model.load(os.path.join(directory, path)).signatures
  server = load("server")["serving_default"]
  predict = lambda fn, x, b: np.concatenate(
      [fn(x=tf.constant(x[i:i + b]))["predictions"].numpy() for i in range(0, len(x), b)])
  s_correct = mt_correct = mt_small = n = 0
  for entry in manifest["clients"]:
    x, y = fd.test[entry["client_id"]]
    client = load(entry["path"])["serving_default"]
    s_correct += int(np.sum(predict(server, x, len(x)) == y))
    mt_correct += int(np.sum(predict(client, x, len(x)) == y))
    mt_small += int(np.sum(predict(client, x, 7) == y))
    n += len(y)
    p = client(x=x)["probabilities"].numpy()  # fixed seed [0, i + 1]
    np.testing.assert_array_equal(p, client(x=x)["probabilities"].numpy())
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
  assert float(s_correct) / n == summary["final_server_accuracy"]
  assert float(mt_correct) / n == float(mt_small) / n == summary["final_mt_accuracy"]
  x, y = fd.pooled("test")
  for batch in (len(y), 64, 5):  # the pooled test set, as a user serves it
    assert abs(float(np.mean(predict(server, x, batch) == y)) -
               summary["final_server_accuracy"]) <= 0.002, batch


def test_load_and_readme_snippet_serve_the_export(virtual_run, virtual_outputs, tmp_path):
  _, fd, outputs = virtual_outputs
  directory = os.path.join(virtual_run, "export")
  first = os.path.join(virtual_run, "export_first")
  if not os.path.exists(os.path.join(directory, "export.json")) and os.path.exists(first):
    shutil.rmtree(directory, ignore_errors=True)  # the launcher test failed half-way
    os.rename(first, directory)
  manifest = export.read_manifest(directory)
  cid = manifest["clients"][1]["client_id"]
  model = export.load(os.path.join(directory, manifest["clients"][1]["path"]))
  x, _ = fd.test[cid]
  np.testing.assert_array_equal(model(x), outputs[cid][2])
  np.testing.assert_array_equal(model.predictions(x), outputs[cid][3])
  # The docs/library.md snippet, as written, from a directory where runs/virtual is the run,
  # in a fresh Python where tfbfl cannot be imported: plain TensorFlow serves it.
  os.makedirs(tmp_path / "runs")
  os.symlink(virtual_run, tmp_path / "runs" / "virtual")
  (tmp_path / "snippet.py").write_text(README_SNIPPET)
  check = ("import sys\n"
           "sys.modules['tfbfl'] = None  # any import of tfbfl fails\n"
           "exec(compile(open('snippet.py').read(), 'snippet.py', 'exec'))\n"
           "for p in (probabilities.numpy(), own.numpy()):\n"
           "  assert p.shape == (4, 10) and abs(p.sum(-1) - 1).max() < 1e-5, p\n"
           "print('served', 'tfbfl' in sys.modules and sys.modules['tfbfl'] is not None)\n")
  env = {k: v for k, v in os.environ.items() if k not in ("TF2_BEHAVIOR", "PYTHONPATH")}
  done = subprocess.run([sys.executable, "-c", check],
                        cwd=tmp_path,
                        capture_output=True,
                        text=True,
                        timeout=300,
                        env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"),
                        stdin=subprocess.DEVNULL)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().splitlines()[-1] == "served False", done.stdout


# ----------------------------------------------------------- files, no training
def test_client_dir_names_are_safe_and_unique():
  names = export.client_dir_names(["client_00", "a/b", "..", "x y", "A", "a", "client_00", ""])
  assert names[0] == "client_00" and names[4] == "A"
  assert len({n.lower() for n in names}) == len(names)
  for n in names:
    assert n and not n.startswith(".") and "/" not in n and " " not in n


def test_interrupted_save_leaves_no_half_written_model(tmp_path, monkeypatch):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  w = tf.Variable([[1.0, -1.0]])
  predictor = predictor_lib.make_predictor(
      lambda x: (tf.nn.softmax(x * w), tf.argmax(x * w, -1, output_type=tf.int32)),
      input_shape=(1,),
      input_dtype="float32",
      num_classes=2,
      variables=[w])
  path = str(tmp_path / "server")
  predictor_lib.save_predictor(predictor, path)
  x = np.array([[2.0], [-1.0]], np.float32)
  before = export.load(path)(x)
  np.testing.assert_allclose(before, tf.nn.softmax(x * w.numpy()).numpy(), rtol=1e-6)
  w.assign([[3.0, 0.0]])

  def broken_save(obj, directory, signatures=None, options=None):
    with open(os.path.join(directory, "saved_model.pb"), "wb") as f:
      f.write(b"half")
    raise KeyboardInterrupt("killed while writing")

  monkeypatch.setattr(tf.saved_model, "save", broken_save)
  with pytest.raises(KeyboardInterrupt):
    predictor_lib.save_predictor(predictor, path)
  monkeypatch.undo()
  assert sorted(os.listdir(tmp_path)) == ["server"]  # no temporary left, old model intact
  np.testing.assert_array_equal(export.load(path)(x), before)
  predictor_lib.save_predictor(predictor, path)  # replaces the model
  np.testing.assert_allclose(export.load(path)(x), tf.nn.softmax(x * w.numpy()).numpy(), rtol=1e-6)
  assert sorted(os.listdir(tmp_path)) == ["server"]


@pytest.mark.parametrize("raw", [False, True])
def test_a_monte_carlo_predictor_is_traced_once_and_saving_reuses_it(raw, tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tfbfl.data import preprocessing  # pylint: disable=g-import-not-at-top

  traces = []
  w = tf.Variable([[1.0, -1.0]])

  def seeded(x, seed):
    traces.append(1)  # runs once per trace of the forward pass
    logits = x * w + tf.random.stateless_normal(tf.shape(x * w), seed)
    return tf.nn.softmax(logits), tf.argmax(logits, -1, output_type=tf.int32)

  kw = dict(input_shape=(1,), input_dtype="float32", num_classes=2, variables=[w])
  model = predictor_lib.make_predictor(None, seeded_forward=seeded, default_seed=(3, 4), **kw)
  if raw:  # the raw-input wrapper calls the features' functions, traced above
    raw_input = preprocessing.RawInput(dtype="uint8", shape=(1,), divisor=255.0)
    model = predictor_lib.with_raw_input(model, raw_input)
  assert len(traces) == 1  # serving_default calls predict_seeded at its fixed seed
  path = predictor_lib.save_predictor(model, str(tmp_path / "m"))
  assert len(traces) == 1  # saving found the trace: no second one
  loaded = tf.saved_model.load(path)
  x = tf.constant([[200], [7]], tf.uint8) if raw else tf.constant([[2.0], [-1.0]])
  fixed = loaded.signatures["serving_default"](x=x)["probabilities"]
  seeded_out = loaded.signatures["predict_seeded"](x=x, seed=tf.constant([3, 4], tf.int64))
  np.testing.assert_array_equal(fixed.numpy(), seeded_out["probabilities"].numpy())
  with predictor_lib.saving_scope():  # a predictor made while a save is under way
    predictor_lib.make_predictor(None, seeded_forward=seeded, default_seed=(3, 4), **kw)


def test_a_predictor_described_anew_serves_its_new_values_and_seed_without_a_new_trace(
    tmp_path):
  """What the export does for a run's clients: another model's values assigned to a
  predictor's variables and its seed and description set by `describe` are what it
  serves, in-process and saved, from the first trace."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  traces = []
  w = tf.Variable([[1.0, -1.0]])

  def seeded(x, seed):
    traces.append(1)
    logits = x * w + tf.random.stateless_normal(tf.shape(x * w), seed)
    return tf.nn.softmax(logits), tf.argmax(logits, -1, output_type=tf.int32)

  kw = dict(input_shape=(1,), input_dtype="float32", num_classes=2, variables=[w])
  model = predictor_lib.make_predictor(None, seeded_forward=seeded, default_seed=(3, 4), **kw)
  assert [id(v) for v in model.weights] == [id(w)]  # the seed is not a weight
  w.assign([[0.5, 2.0]])
  assert model.describe(dict(client=1), (5, 6)) is model
  assert model.info == dict(client=1, mc_seed=[5, 6])
  loaded = tf.saved_model.load(predictor_lib.save_predictor(model, str(tmp_path / "m")))
  assert len(traces) == 1  # (a call outside a save's context traces anew: not the export's)
  x = tf.constant([[2.0], [-1.0]])
  at = lambda s: model.serve_seeded(x, tf.constant(s, tf.int64))["probabilities"].numpy()
  np.testing.assert_array_equal(
      loaded.signatures["serving_default"](x=x)["probabilities"].numpy(), at([5, 6]))
  np.testing.assert_array_equal(model(x).numpy(), at([5, 6]))
  assert not np.array_equal(at([5, 6]), at([3, 4]))
  with pytest.raises(ValueError, match="needs `default_seed`"):
    model.describe({})
  deterministic = predictor_lib.make_predictor(lambda x: seeded(x, [0, 0]), **kw)
  with pytest.raises(ValueError, match="Monte Carlo"):
    deterministic.describe({}, (1, 2))


def test_virtual_client_predictors_share_one_trace_and_are_each_clients_model(virtual_run):
  """VIRTUAL's `client_predictor(..., reuse=)` assigns each client into one traced
  predictor (as the export passes them): at the means and as a Monte Carlo
  predictive, what it serves and states for each client is what a predictor built
  for that client alone serves and states; another kind of predictor is not reused."""
  run = restore.restore_run(virtual_run)
  algorithm, state = run.algorithm, run.server_state
  clients = [s for _, _, s in export.iter_client_states(algorithm, run.data.client_ids,
                                                          run.clients)]
  assert len(clients) > 1, virtual_run
  x = run.data.test[run.data.client_ids[0]][0][:50]
  for samples in (0, 3):
    shared = None
    served = []
    for client in clients:
      alone = algorithm.client_predictor(state, client, samples=samples, seed=7)
      got = algorithm.client_predictor(state, client, samples=samples, seed=7, reuse=shared)
      assert shared is None or got is shared
      shared = got
      served.append(got(x).numpy())
      np.testing.assert_array_equal(served[-1], alone(x).numpy())
      assert got.info == alone.info
    assert any(not np.array_equal(served[0], s) for s in served[1:])  # models differ
    traced = shared.serve_seeded if samples else shared.serve
    assert traced.experimental_get_tracing_count() == 1  # calls included
  server = algorithm.server_predictor(state, samples=3)
  assert algorithm.client_predictor(state, clients[0], samples=3, reuse=server) is not server


def test_algorithm_without_hooks_is_refused(tmp_path):
  with pytest.raises(NotImplementedError, match="cannot be exported"):
    export.export_run(object(), None, [], str(tmp_path))


def test_raw_input_predictor_applies_the_preprocessing(tmp_path):
  """`with_raw_input` on a toy model: uint8 in, x / 255 (and a client's permutation)
  inside, the features model kept as `predict_features` (no data files needed)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfbfl.data import preprocessing  # pylint: disable=g-import-not-at-top

  w = tf.Variable(np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32))

  def forward(x):
    logits = tf.reshape(x, [-1, 6]) @ w
    return tf.nn.softmax(logits), tf.argmax(logits, -1, output_type=tf.int32)

  features = predictor_lib.make_predictor(forward,
                                   input_shape=(2, 3),
                                   input_dtype="float32",
                                   num_classes=3,
                                   variables=[w])
  raw_input = preprocessing.mnist_raw_input((2, 3), {"c0": [5, 4, 3, 2, 1, 0]})
  raw = np.random.default_rng(1).integers(0, 256, size=(7, 2, 3)).astype(np.uint8)
  for client_id in (None, "c0"):
    path = str(tmp_path / f"m_{client_id}")
    predictor_lib.save_predictor(predictor_lib.with_raw_input(features, raw_input, client_id), path)
    served = tf.saved_model.load(path).signatures
    assert served["serving_default"].structured_input_signature[1]["x"].dtype == tf.uint8
    x = raw_input.apply(raw, client_id)
    want = features.serve(tf.constant(x))
    got = served["serving_default"](x=tf.constant(raw))
    np.testing.assert_array_equal(got["predictions"].numpy(), want["predictions"].numpy())
    np.testing.assert_array_equal(got["probabilities"].numpy(), want["probabilities"].numpy())
    np.testing.assert_array_equal(
        served[export.FEATURES_SIGNATURE](x=tf.constant(x))["probabilities"].numpy(),
        want["probabilities"].numpy())
  flat = (raw.reshape(7, 6).astype(np.float32) / np.float32(255))[:, [5, 4, 3, 2, 1, 0]]
  np.testing.assert_array_equal(raw_input.apply(raw, "c0").reshape(7, 6), flat)
  # FEMNIST: LEAF's float pixels (1.0 = background) in, 1 - pixel inside.
  leaf = preprocessing.leaf_femnist_raw_input()
  w28 = tf.Variable(np.random.default_rng(2).normal(size=(784, 3)).astype(np.float32))
  model = predictor_lib.make_predictor(
      lambda x: (tf.nn.softmax(tf.reshape(x, [-1, 784]) @ w28),
                 tf.argmax(tf.reshape(x, [-1, 784]) @ w28, -1, output_type=tf.int32)),
      input_shape=(28, 28),
      input_dtype="float32",
      num_classes=3,
      variables=[w28])
  path = str(tmp_path / "femnist")
  predictor_lib.save_predictor(predictor_lib.with_raw_input(model, leaf), path)
  pixels = np.random.default_rng(3).random((5, 28, 28)).astype(np.float32)
  got = tf.saved_model.load(path).signatures["serving_default"](x=tf.constant(pixels))
  want = model.serve(tf.constant(np.float32(1) - pixels))
  np.testing.assert_array_equal(got["probabilities"].numpy(), want["probabilities"].numpy())


# ------------------------------------------------- real data: raw input served
# (VIRTUAL's server model on real MNIST's raw pixels: tests/test_export_predictive.py)
def _real_pmnist_run(tmp_path):
  """A tiny FedAvg run on real PMNIST (skipped where ../shared/data/mnist is absent),
  exported from its checkpoint (`launchers.export`'s path); returns (run dir, export
  dir)."""
  directory = _mnist_dir()
  out = tmp_path / "pmnist"
  driver.run_training(
      dict(algorithm="fedavg",
           dataset="pmnist",
           data_dir=directory,
           num_clients=20,
           clients_per_round=2,
           rounds=2,
           epochs_per_round=1,
           batch_size=50,
           checkpoint_every=1,
           export=False,
           output_dir=str(out)))
  exported = restore.export_from_checkpoint(str(out), verbose=False)
  assert exported["signature"]["inputs"]["x"] == {"dtype": "uint8", "shape": [None, 28, 28]}
  assert exported["raw_input"]["divisor"] == 255.0 and not exported["raw_input"]["invert"]
  return str(out), os.path.join(str(out), "export")


def test_real_pmnist_client_exports_apply_their_permutation(tmp_path):
  """FedAvg on real PMNIST: a client's exported model takes raw (unpermuted) MNIST
  pixels and applies the client's permutation inside; the server model none."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfbfl import data as data_lib  # pylint: disable=g-import-not-at-top

  out, directory = _real_pmnist_run(tmp_path)
  manifest = export.read_manifest(directory)
  assert manifest["raw_input"]["permuted"] and not manifest["server"]["raw_input"]["permuted"]
  fd = data_lib.load_pmnist(_mnist_dir(), num_clients=20)  # the run's data (seed 0)
  base = data_lib.load_mnist(_mnist_dir(), partition="homogeneous", num_clients=20)
  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  correct = n = 0
  for entry in manifest["clients"][:3]:
    assert entry["raw_input"]["permuted"]
    cid = entry["client_id"]
    model = tf.saved_model.load(os.path.join(directory, entry["path"]))
    xt, yt = fd.test[cid]  # the client's permuted features
    pixels = np.rint(base.test[cid][0] * 255).astype(np.uint8)  # its raw, unpermuted images
    got = model.signatures["serving_default"](x=tf.constant(pixels))
    want = model.signatures[export.FEATURES_SIGNATURE](x=tf.constant(xt))
    np.testing.assert_array_equal(got["predictions"].numpy(), want["predictions"].numpy())
    np.testing.assert_array_equal(got["probabilities"].numpy(), want["probabilities"].numpy())
  server = tf.saved_model.load(os.path.join(directory, "server"))
  for cid in fd.client_ids:
    xt, yt = fd.test[cid]
    pixels = np.rint(xt * 255).astype(np.uint8)  # the permuted images, as S evaluates
    pred = server.signatures["serving_default"](x=tf.constant(pixels))["predictions"].numpy()
    correct += int(np.sum(pred == yt))
    n += len(yt)
  assert correct / n == summary["final_server_accuracy"]


def _mnist_dir():
  from datafiles import real_data_dir  # pylint: disable=g-import-not-at-top
  return real_data_dir("mnist")

"""The accuracy a run reports is the one its export gives, checked as a user checks it.

A user takes the run's `export/` and the raw MNIST test set (the t10k file, which
the clients' test sets partition), feeds the pixels to `serving_default` of the
server model, pooled, in whatever batches they like, and compares with the final S
of `summary.json`; and a client's model on that client's test images with its MT.
VIRTUAL's default predictive is a 10-pass Monte Carlo average: its noise is keyed by
the example (`tfbfl.layers.base.example_keyed_noise`), so the evaluation client by
client and the export in any batch draw the same noise for the same example
(docs/library.md, "Deploying a trained model"). Checked here at that default and at
the posterior means (`--eval_samples=0`), for the server and two clients (one
trained, one never selected), in two batch sizes each: the accuracies agree to
`TOLERANCE` (the issue's bound; measured: equal), and the probabilities of the two
batch sizes agree to float rounding.

The posterior-means run's server model also takes the t10k file's uint8 pixels
and predicts exactly what the in-library model predicts on x = pixel / 255 (its
features signature too), and every client's raw test images give the run's S
exactly.

The user's check needs real MNIST (skipped, naming the folder, where
../shared/data/mnist is absent); the property it rests on (an example's Monte Carlo
probabilities do not depend on its batch, for the MLP, conv and LSTM networks, both
heads) and the training noise being untouched are checked without data.
"""

import gzip
import json
import os

import numpy as np
import pytest

from tfbfl import driver
from tfbfl import export
from tfbfl import restore

import built_runs

pytestmark = pytest.mark.usefixtures("tff_runtime")

TOLERANCE = 0.002  # |exported accuracy - summary accuracy|, issue 67's bound
# A small real-MNIST run (the user's check does not depend on its size): 5 clients
# (about 2,000 test images each; 6 models to export), 2 rounds of 1 client, so
# some clients never train.
RUN = dict(algorithm="virtual",
           dataset="mnist",
           num_clients=5,
           clients_per_round=1,
           rounds=2,
           epochs_per_round=1,
           batch_size=50,
           seed=0)
SERVER_BATCHES = (10000, 333)  # the whole test set in one batch; batches of 333
CLIENT_BATCHES = (1000, 111)


# ------------------------------------------------- the noise, without data
NETWORKS = {
    # (network class, keyword arguments, one example's shape and dtype); wide
    # posteriors (init_scale), so that the noise moves the predictions.
    "mlp": ("VirtualNetworks", dict(input_dim=12, num_classes=4, hidden_units=(16, 8)), (12,),
            np.float32),
    "conv": ("VirtualConvNetworks",
             dict(input_shape=(6, 6), num_classes=4, filters=(3,), kernel_size=3,
                  hidden_units=(8,)), (36,), np.float32),
    "lstm": ("VirtualLSTMNetworks", dict(vocab_size=9, embedding_dim=4, lstm_units=(6,)), (5,),
             np.int32),
}


@pytest.mark.parametrize("architecture", sorted(NETWORKS))
def test_an_examples_monte_carlo_predictive_does_not_depend_on_its_batch(architecture):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tfbfl import networks  # pylint: disable=g-import-not-at-top
  from tfbfl.algorithms.virtual import evaluation  # pylint: disable=g-import-not-at-top

  name, kwargs, shape, dtype = NETWORKS[architecture]
  net = getattr(networks, name)(init_scale=0.3, seed=1, **kwargs)
  num_classes = kwargs.get("num_classes", kwargs.get("vocab_size"))
  rng = np.random.default_rng(0)
  if dtype == np.int32:
    x = rng.integers(0, kwargs["vocab_size"], size=(40, *shape)).astype(np.int32)
  else:
    x = rng.normal(size=(40, *shape)).astype(np.float32)
  x[7] = x[3]  # equal examples get equal noise
  seed = tf.constant([0, 5], tf.int64)
  specs = [tf.TensorSpec([None, *shape], tf.as_dtype(dtype)), tf.TensorSpec([2], tf.int64)]
  for head in (0, 1):
    fn = tf.function(lambda x, seed, head=head: evaluation.predictive(  # one trace
        net, head, x, 10, seed, num_classes), input_signature=specs, autograph=False)
    whole = fn(x, seed).numpy()
    assert np.all(np.isfinite(whole))
    np.testing.assert_allclose(whole.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(whole[7], whole[3])
    for part in (slice(0, 1), slice(5, 18), slice(11, 40)):
      np.testing.assert_allclose(fn(x[part], seed).numpy(), whole[part], rtol=1e-5, atol=1e-7)
    shuffled = rng.permutation(len(x))
    np.testing.assert_allclose(fn(x[shuffled], seed).numpy(), whole[shuffled], rtol=1e-5,
                               atol=1e-7)
    # Sampled (not the means), and another seed draws other noise.
    means = tf.nn.softmax(net.forward(tf.constant(x))[head]).numpy()
    assert np.max(np.abs(whole - means)) > 1e-3
    other = fn(x, tf.constant([0, 6], tf.int64)).numpy()
    assert np.max(np.abs(whole - other)) > 1e-3


def test_training_noise_is_unchanged_and_keyed_noise_is_standard_normal():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tfbfl.layers import BayesianDense  # pylint: disable=g-import-not-at-top
  from tfbfl.layers import base  # pylint: disable=g-import-not-at-top

  layer = BayesianDense(6, init_scale=0.5, seed=0)
  layer.build([None, 3])
  x = tf.constant(np.random.default_rng(1).normal(size=(5, 3)), tf.float32)
  seed = tf.constant([2, 3], tf.int64)
  # Outside the scope (every training path): one stateless_normal draw over the batch.
  mean = tf.matmul(x, layer.kernel_loc) + layer.bias_loc
  variance = (tf.matmul(tf.square(x), tf.square(base.scale_from_untransformed(
      layer.kernel_untransformed_scale, layer.min_scale))) + tf.square(
          base.scale_from_untransformed(layer.bias_untransformed_scale, layer.min_scale)))
  want = mean + tf.sqrt(variance + layer.variance_epsilon) * tf.random.stateless_normal(
      [5, 6], seed=seed)
  np.testing.assert_array_equal(layer(x, seed=seed).numpy(), want.numpy())
  with base.example_keyed_noise(base.example_keys(x)):
    keyed = layer(x, seed=seed).numpy()
  assert not np.allclose(keyed, want.numpy())
  np.testing.assert_array_equal(layer(x, seed=seed).numpy(), want.numpy())  # scope left
  # Every one of the 2^23 uniform levels maps to a finite normal; the levels' moments
  # are N(0, 1)'s; a large keyed draw has N(0, 1)'s moments and no correlations.
  levels = tf.bitwise.left_shift(tf.cast(tf.range(2**23), tf.uint32), tf.constant(9, tf.uint32))
  z = tf.math.ndtri(base._open_unit_interval(levels)).numpy()  # pylint: disable=protected-access
  assert np.all(np.isfinite(z)) and abs(z.mean()) < 1e-6 and abs(z.var() - 1) < 1e-4
  keys = base.example_keys(tf.random.stateless_uniform([2000, 20], seed=[1, 2]))
  e = base.keyed_normal([2000, 250], seed, keys).numpy()
  sd = 1 / np.sqrt(e.size)  # 0.0014
  assert abs(e.mean()) < 5 * sd and abs(e.var() - 1) < 5 * np.sqrt(2) * sd
  assert abs(np.corrcoef(e[:, 1:].ravel(), e[:, :-1].ravel())[0, 1]) < 5 * sd
  assert abs(np.corrcoef(e[1:].ravel(), e[:-1].ravel())[0, 1]) < 5 * sd


# ------------------------------------------------- the user's check, real MNIST
def _t10k(directory):
  from tfbfl.data import mnist  # pylint: disable=g-import-not-at-top

  out = []
  for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
    with gzip.open(os.path.join(directory, name + ".gz"), "rb") as f:
      out.append(mnist.parse_idx(f.read(), name)[1])
  return out[0], out[1].astype(np.int64)


def _serve(path):
  """`x, batch -> (probabilities, predictions)` of `serving_default` (plain TF)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  fn = tf.saved_model.load(path).signatures["serving_default"]

  def run(x, batch):
    outs = [fn(x=tf.constant(x[i:i + batch])) for i in range(0, len(x), batch)]
    return (np.concatenate([o["probabilities"].numpy() for o in outs]),
            np.concatenate([o["predictions"].numpy() for o in outs]))

  return run


def _client_mt(run_dir):
  """Each client's final MT accuracy, `client_metrics.csv`'s last row (6 digits)."""
  import csv  # pylint: disable=g-import-not-at-top

  with open(os.path.join(run_dir, "client_metrics.csv"), newline="") as f:
    last = list(csv.DictReader(f))[-1]
  return {k: float(v) for k, v in last.items() if k != "round"}


def _accuracies(serve, x, y, batches):
  """Accuracy of `serve` on `(x, y)` at each batch size; the probabilities of the
  batch sizes agree to float rounding (the noise does not depend on the batch)."""
  accuracies, first = [], None
  for batch in batches:
    p, c = serve(x, batch)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    accuracies.append(float(np.mean(c == y)))
    if first is None:
      first = p
    else:
      np.testing.assert_allclose(p, first, rtol=1e-4, atol=1e-6)
  return accuracies


@pytest.fixture(scope="module")
def mnist():
  """`(data_dir, data)`: the runs' real MNIST, loaded once for both runs and the checks."""
  from datafiles import real_data_dir  # pylint: disable=g-import-not-at-top

  directory = real_data_dir("mnist")
  return directory, driver.load_data(driver.resolve_params(dict(RUN, data_dir=directory)))


@pytest.fixture(scope="module")
def run_dir(mnist, tmp_path_factory):
  """`run_dir(eval_samples)`: the directory of RUN at `eval_samples` (None: the
  default), run once (`run_training`'s round loop and outputs on the loaded data)."""
  directory, data = mnist
  runs = {}

  def get(eval_samples):
    if eval_samples not in runs:
      out = tmp_path_factory.mktemp("run")
      params = dict(RUN, data_dir=directory, output_dir=str(out))
      if eval_samples is not None:
        params["eval_samples"] = eval_samples
      algorithm = driver.build_algorithm(data, driver.resolve_params(params))
      built_runs.run_built(algorithm, data, params)
      runs[eval_samples] = str(out)
    return runs[eval_samples]

  return get


@pytest.mark.parametrize("eval_samples", [None, 0], ids=["default_predictive", "means"])
def test_exported_models_give_the_runs_accuracies_as_a_user_checks(eval_samples, mnist, run_dir):
  directory, fd = mnist
  run = run_dir(eval_samples)
  with open(os.path.join(run, "summary.json")) as f:
    summary = json.load(f)
  assert np.isfinite(summary["final_server_loss"]) and np.isfinite(summary["final_mt_loss"])
  out = os.path.join(run, "export")
  manifest = export.read_manifest(out)
  samples = 10 if eval_samples is None else eval_samples
  assert manifest["server"]["samples"] == samples
  assert all(c["samples"] == samples for c in manifest["clients"])

  # The server: the raw t10k pixels, pooled, against the final S.
  pixels, labels = _t10k(directory)
  server = _serve(os.path.join(out, manifest["server"]["path"]))
  got = _accuracies(server, pixels, labels, SERVER_BATCHES)
  s = summary["final_server_accuracy"]
  print(f"\neval_samples={samples}: S {s:.4f}, exported server on the pooled raw t10k "
        f"at batch sizes {SERVER_BATCHES}: {got}")
  assert all(abs(a - s) <= TOLERANCE for a in got), (got, s)

  # Two clients (a trained one and one never selected): their own test images, raw.
  assert sum(len(fd.test[c][1]) for c in fd.client_ids) == len(labels)  # t10k, partitioned
  client_mt = _client_mt(run)
  trained = [c for c in manifest["clients"] if c["trained"]]
  untrained = [c for c in manifest["clients"] if not c["trained"]]
  assert trained and untrained, manifest["clients"]
  for entry in (trained[0], untrained[0]):
    x, y = fd.test[entry["client_id"]]
    raw = np.rint(x * 255).astype(np.uint8)  # the t10k bytes (x = pixel / 255)
    np.testing.assert_array_equal(fd.raw_input.apply(raw), x)
    got = _accuracies(_serve(os.path.join(out, entry["path"])), raw, y, CLIENT_BATCHES)
    mt = client_mt[entry["client_id"]]
    print(f"client {entry['client_id']} (trained: {entry['trained']}): MT {mt:.4f}, exported "
          f"at batch sizes {CLIENT_BATCHES}: {got}")
    assert all(abs(a - mt) <= TOLERANCE for a in got), (entry["client_id"], got, mt)


def test_real_mnist_export_serves_raw_pixels(mnist, run_dir):
  """VIRTUAL on real MNIST at the posterior means: the exported server model takes the
  t10k file's uint8 pixels and predicts what the in-library model predicts on
  x = pixel / 255; fed every client's raw test images it reproduces the run's final S
  accuracy exactly."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  directory, data = mnist
  out = run_dir(0)
  exported = export.read_manifest(os.path.join(out, "export"))
  assert exported["signature"]["inputs"]["x"] == {"dtype": "uint8", "shape": [None, 28, 28]}
  assert exported["raw_input"]["divisor"] == 255.0 and not exported["raw_input"]["invert"]
  run = restore.restore_run(out, data=data)
  assert run.data.raw_input is not None
  server = tf.saved_model.load(os.path.join(out, "export", "server"))
  batch = _t10k(directory)[0][:256]
  got = server.signatures["serving_default"](x=tf.constant(batch))
  library = run.algorithm.server_predictor(run.server_state)  # the in-library model
  x = batch.astype(np.float32) / np.float32(255)
  want = library.serve(tf.constant(x))
  np.testing.assert_array_equal(got["predictions"].numpy(), want["predictions"].numpy())
  np.testing.assert_allclose(got["probabilities"].numpy(),
                             want["probabilities"].numpy(),
                             rtol=1e-6,
                             atol=1e-7)
  features = server.signatures[export.FEATURES_SIGNATURE](x=tf.constant(x))
  np.testing.assert_array_equal(features["predictions"].numpy(), want["predictions"].numpy())
  # Every client's test images back as the file's bytes (x * 255 is exact): S accuracy.
  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  correct = n = 0
  for cid in run.data.client_ids:
    xt, yt = run.data.test[cid]
    pixels = np.rint(xt * 255).astype(np.uint8)
    np.testing.assert_array_equal(run.data.raw_input.apply(pixels), xt)
    pred = server.signatures["serving_default"](x=tf.constant(pixels))["predictions"].numpy()
    correct += int(np.sum(pred == yt))
    n += len(yt)
  assert correct / n == summary["final_server_accuracy"], (correct / n, summary)
  assert correct / n > 0.5  # real MNIST, 2 rounds: learnt

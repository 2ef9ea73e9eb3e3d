"""VIRTUAL federates the user's own Keras model (`--model`, `run_training(model=)`).

* One path: a Keras model that spells out a built-in network (the MLP, the conv
  family) gives the built-in run at the same seed, `metrics.csv` equal in every
  column but times; and the Bayesian columns built from it are the families'
  `VirtualNetworks` / `VirtualConvNetworks`, tensor for tensor.
* The README's conv net, which no preset has (average pooling), trains from
  `launchers.train --model=mymodels:build`, its export reproduces the run's final S
  (on the pooled test set) and MT at the default predictive, and `--resume` with
  another model is refused in one line naming both.
"""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfbfl import driver, models, networks
from tfbfl.networks import builders, progressive

from launcher_helpers import ROOT
from test_export import _check_reproduces

# No export: the runs compare their metrics.csv (the user model's export is checked below).
_SMALL = dict(algorithm="virtual", rounds=2, epochs_per_round=1, num_clients=4,
              clients_per_round=2, seed=3, eval_samples=0, export=False)


def spelled_out_mlp():
  """The preset `--architecture=mlp --hidden_units=16` on digits, by hand."""
  return tf.keras.Sequential([
      tf.keras.Input((64,)),
      tf.keras.layers.Dense(16, activation="relu", kernel_initializer="glorot_normal"),
      tf.keras.layers.Dense(10, kernel_initializer="glorot_normal"),
  ])


def spelled_out_conv():
  """The preset `--architecture=conv --filters=4,8 --hidden_units=16` on digits."""
  layers = [tf.keras.Input((64,)), tf.keras.layers.Reshape((8, 8, 1))]
  for f in (4, 8):
    layers += [tf.keras.layers.Conv2D(f, 5, padding="same", activation="relu"),
               tf.keras.layers.MaxPool2D(2)]
  layers += [tf.keras.layers.Flatten(), tf.keras.layers.Dense(16, activation="relu"),
             tf.keras.layers.Dense(10)]
  return tf.keras.Sequential(layers)


def _metrics(output_dir):
  with open(os.path.join(output_dir, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  return [{k: v for k, v in row.items() if "time" not in k and not k.endswith("_s")}
          for row in rows]


def _same(a, b):
  fa, fb = tf.nest.flatten(a), tf.nest.flatten(b)
  return len(fa) == len(fb) and all(np.array_equal(np.asarray(x), np.asarray(y))
                                    for x, y in zip(fa, fb))


def test_columns_from_a_model_are_the_families_networks():
  x, seed = tf.random.stateless_uniform([3, 64], [1, 2]), tf.constant([4, 5], tf.int64)
  mlp = builders.template_for(None, architecture="mlp", input_shape=(64,), num_classes=10,
                              hidden_units=(16, 8))
  conv = builders.template_for(None, architecture="conv", input_shape=(64,), num_classes=10,
                               image_shape=(8, 8, 1), filters=(4, 8), hidden_units=(16,))
  pairs = [(networks.VirtualNetworks(64, 10, (16, 8), init_scale=0.05, seed=7),
            progressive.ProgressiveNetworks(mlp, init_scale=0.05, seed=7)),
           (networks.VirtualConvNetworks((8, 8, 1), 10, filters=(4, 8), hidden_units=(16,),
                                         init_scale=0.005, seed=7),
            progressive.ProgressiveNetworks(conv, init_scale=0.005, seed=7))]
  for family, generic in pairs:
    assert _same(family.shared_posterior(), generic.shared_posterior())
    assert _same(family.get_private_weights(), generic.get_private_weights())
    assert _same(family.forward(x, seed), generic.forward(x, seed))
    assert _same(family.server_logits(x, seed), generic.server_logits(x, seed))
  assert progressive.is_dense_stack(mlp) and not progressive.is_dense_stack(conv)
  # The stateless initial values agree with the built columns.
  assert _same(progressive.initial_private_weights_of_template(conv, 0.005, seed=11),
               networks.initial_private_weights_conv((8, 8, 1), 10, (4, 8), 5, 2, "same", (16,),
                                                     0.005, seed=11))


def test_a_lateral_joins_every_weight_layer_of_a_user_model():
  def build():
    return tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(3, 3, strides=2, activation="tanh"),
        tf.keras.layers.AveragePooling2D(1),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(5, activation="relu"),
        tf.keras.layers.Dense(4),
    ])

  tmpl = models.template(build, input_shape=(8, 8, 1), num_classes=4)
  net = progressive.ProgressiveNetworks(tmpl, seed=0)
  assert [type(l).__name__ for l in net.server_layers] == [
      "BayesianConv2D", "BayesianDense", "BayesianDense"]
  assert len(net.laterals) == 3 and [lat.units for lat in net.laterals] == [3, 5, 4]
  server, client = net.forward(tf.zeros([2, 8, 8, 1]), seed=tf.constant([0, 1], tf.int64))
  assert server.shape == client.shape == (2, 4)
  # Gates at zero: the client column is a network of its own, the same ops.
  for lat in net.laterals:
    lat.gate.assign(tf.zeros_like(lat.gate))
  x = tf.random.stateless_normal([2, 8, 8, 1], [3, 4])
  _, alone = net.forward(x)
  h = x
  for layer, act in zip(net.client_layers, ("tanh", "relu", "linear")):
    h = tf.keras.activations.get(act)(layer(h))
    if layer is net.client_layers[0]:
      h = tf.reshape(tf.nn.avg_pool2d(h, 1, 1, "VALID"), [2, -1])
  np.testing.assert_allclose(alone, h, rtol=1e-6)


@pytest.mark.parametrize("preset, spelled", [
    (dict(hidden_units=(16,)), spelled_out_mlp),
    (dict(architecture="conv", filters=(4, 8), hidden_units=(16,)), spelled_out_conv),
])
def test_a_model_that_spells_out_a_preset_is_the_preset_run(tff_runtime, tmp_path, preset,
                                                             spelled):
  del tff_runtime
  a, b = str(tmp_path / "preset"), str(tmp_path / "model")
  driver.run_training(dict(_SMALL, output_dir=a, verbose=False, **preset))
  summary = driver.run_training(dict(_SMALL, output_dir=b, verbose=False), model=spelled)
  assert _metrics(a) == _metrics(b) and len(_metrics(a)) == 2
  with open(os.path.join(b, "flags.txt")) as f:
    assert f"--model=test_own_model_virtual:{spelled.__name__}" in f.read()
  assert summary["final_server_accuracy"] > 0


# The README's example, run here (tests/test_readme.py checks the page shows this text).
README_SNIPPET_OWN_MODEL = """
import tensorflow as tf

def build():
  return tf.keras.Sequential([
      tf.keras.Input((64,)),                       # one example of the data
      tf.keras.layers.Reshape((8, 8, 1)),
      tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
      tf.keras.layers.AveragePooling2D(2),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(32, activation="relu"),
      tf.keras.layers.Dense(10),                   # logits, one per class
  ])
"""

README_SNIPPET_OWN_MODEL_PYTHON = """
from tfbfl import driver
from tfbfl.data import from_client_arrays

fd = from_client_arrays({"alice": x_a, "bob": x_b}, {"alice": y_a, "bob": y_b})
summary = driver.run_training(dict(algorithm="virtual", rounds=3), data=fd, model=build)
"""


def test_the_readme_python_example_runs(tff_runtime):
  del tff_runtime
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  x, y = load_digits(return_X_y=True)
  x = (x / 16.0).astype(np.float32)
  # Two clients of 200 examples (150 to train on): what the snippet does is the point.
  scope = dict(x_a=x[:200], y_a=y[:200], x_b=x[200:400], y_b=y[200:400])
  exec(README_SNIPPET_OWN_MODEL, scope)  # pylint: disable=exec-used
  exec(README_SNIPPET_OWN_MODEL_PYTHON, scope)  # pylint: disable=exec-used
  summary = scope["summary"]
  assert summary["rounds"] == 3 and summary["best_mt_accuracy"] > 0.3, summary


def _train(workdir, *args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
      [str(workdir), ROOT, os.environ.get("PYTHONPATH", "")]))
  return subprocess.run([sys.executable, "-m", "launchers.train", *args], cwd=str(workdir),
                        env=env, capture_output=True, text=True, timeout=600,
                        stdin=subprocess.DEVNULL)


def test_a_user_conv_net_trains_exports_and_guards_its_checkpoint(tmp_path):
  (tmp_path / "mymodels.py").write_text(README_SNIPPET_OWN_MODEL)
  out = tmp_path / "run"
  # Two clients: fewer models to export and serve (each a traced Monte Carlo predictive).
  args = ["--algorithm=virtual", "--model=mymodels:build", "--rounds=3", "--epochs_per_round=2",
          "--num_clients=2", "--clients_per_round=2", "--client_lr=0.1", "--seed=0",
          f"--output_dir={out}"]
  done = _train(tmp_path, *args)
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["flags"]["model"] == "mymodels:build"
  assert summary["flags"]["init_scale"] == 0.005  # a conv model takes the conv default
  # Above chance (0.1) on digits after 3 rounds (seeds 0-4: best S 0.75-0.84, MT 0.85-0.92).
  assert summary["best_server_accuracy"] > 0.2 and summary["best_mt_accuracy"] > 0.2
  # Its SavedModels give the run's final S (pooled test set) and MT, at the default
  # Monte Carlo predictive.
  _check_reproduces(str(out), pooled_server=True)

  # Another model, same name: its fingerprint differs and --resume is refused.
  (tmp_path / "mymodels.py").write_text(README_SNIPPET_OWN_MODEL.replace("Dense(32", "Dense(24"))
  refused = _train(tmp_path, f"--flagfile={out / 'flags.txt'}", "--resume")
  # TensorFlow's C++ start-up lines aside, one line: the FATAL one, naming both models.
  lines = [l for l in refused.stderr.strip().splitlines() if "cuda" not in l]
  assert refused.returncode == 1 and len(lines) == 1, refused.stderr[-3000:]
  assert lines[0].startswith("FATAL train: --resume: ") and "--model" in lines[0], lines
  saved = json.loads((out / "summary.json").read_text())["flags"]["model_fingerprint"]
  assert saved in lines[0], lines

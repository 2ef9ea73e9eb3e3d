"""The deterministic algorithms federate the user's own Keras model (`--model`).

* One path: a Keras model that spells out the preset MLP gives the preset run at
  the same seed, `metrics.csv` equal in every column but times (FedAvg from
  `launchers.train`'s flags `--model=mymodels:...`, parsed as the launcher parses
  them, FOLA from `run_training`'s params; both in-process: the launcher program's
  own `--model` run, as a subprocess, is tests/test_own_model_virtual.py's).
* A conv net no preset has trains with FedAvg, FedProx, FedPA, FOLA and Local to
  above chance on digits (in-process, `run_training(params)` with `--model`'s
  string, imported as the launcher imports it); Local's export (K user models as
  an ensemble) reproduces its S and MT.
* Refusals: every bad model is one `ModelError` line naming --model (in-process),
  and the launcher's form is one `FATAL train:` line (two quick subprocesses).
* Non-trainable weights: FedAvg's server takes the clients' example-weighted mean
  of BatchNormalization's statistics and keeps a frozen layer bit for bit; FOLA
  refuses BatchNormalization and takes frozen layers.
* `tff_learning.build_process("fedavg", fd, model_fn=...)` runs a round.

VIRTUAL's part is `tests/test_own_model_virtual.py`, PFNM's
`tests/test_pfnm_own_model.py`.
"""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from tfbfl import data as data_lib
from tfbfl import driver, models, tff_learning
from tfbfl.algorithms import base, fedavg, fola

import train_in_process
from launcher_helpers import ROOT, assert_one_fatal_line_before_tensorflow, importable_module
from test_export import _check_reproduces

# No export where the runs compare their metrics.csv (the conv net's are checked below).
_SMALL = dict(rounds=2, epochs_per_round=1, num_clients=4, clients_per_round=2, seed=3,
              export=False)

# The user's module, as a user writes it (imported from PYTHONPATH / sys.path).
_MYMODELS = '''
import tensorflow as tf

L = tf.keras.layers


def spelled_out_mlp():
  """The preset `--architecture=mlp` (hidden 100, 100) on digits, by hand."""
  return tf.keras.Sequential([
      tf.keras.Input((64,)),
      L.Dense(100, activation="relu", kernel_initializer="glorot_normal"),
      L.Dense(100, activation="relu", kernel_initializer="glorot_normal"),
      L.Dense(10, kernel_initializer="glorot_normal"),
  ])


def build():
  """A conv net no preset has: one strided convolution, no pooling."""
  return tf.keras.Sequential([
      tf.keras.Input((64,)),
      L.Reshape((8, 8, 1)),
      L.Conv2D(8, 3, strides=2, activation="relu"),
      L.Flatten(),
      L.Dense(10),
  ])


NOT_CALLABLE = 3


def not_a_model():
  return "a model"


def seven_logits():
  return tf.keras.Sequential([tf.keras.Input((64,)), L.Dense(7)])


def wrong_input():
  return tf.keras.Sequential([tf.keras.Input((32,)), L.Dense(10)])


class Mine(tf.keras.Model):

  def __init__(self):
    super().__init__()
    self.dense = L.Dense(10)

  def call(self, x):
    return self.dense(x)


def subclassed():
  return Mine()


def with_dropout():
  return tf.keras.Sequential([tf.keras.Input((64,)), L.Dense(16), L.Dropout(0.2), L.Dense(10)])


def batchnorm_and_frozen():
  """BatchNormalization (moving statistics: non-trainable, updated in training) and
  a frozen Dense layer (non-trainable, never updated)."""
  return tf.keras.Sequential([
      tf.keras.Input((64,)),
      L.Dense(16, activation="relu"),
      L.BatchNormalization(),
      L.Dense(12, activation="relu", trainable=False),
      L.Dense(10),
  ])


def frozen_only():
  return tf.keras.Sequential([
      tf.keras.Input((64,)),
      L.Dense(16, activation="relu", trainable=False),
      L.Dense(10),
  ])
'''


@pytest.fixture(scope="module")
def mymodels(tmp_path_factory):
  """The directory holding `mymodels.py`, importable in-process for the module."""
  with importable_module(tmp_path_factory.mktemp("user"), _MYMODELS) as where:
    yield where


def _metrics(output_dir):
  with open(os.path.join(output_dir, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  return [{k: v for k, v in row.items() if "time" not in k and not k.endswith("_s")}
          for row in rows]


def _user_env(where):
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
              PYTHONPATH=os.pathsep.join([str(where), ROOT, os.environ.get("PYTHONPATH", "")]))


# ------------------------------------------------------------- preset equality
def test_fedavg_with_the_preset_spelled_out_is_the_preset_run(tff_runtime, mymodels, tmp_path):
  del tff_runtime, mymodels
  preset = str(tmp_path / "preset")
  driver.run_training(dict(_SMALL, algorithm="fedavg", output_dir=preset))
  # The launcher's form: its flags, the user's module named by the --model string.
  model = str(tmp_path / "model")
  args = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in _SMALL.items()]
  train_in_process.train("--algorithm=fedavg", "--model=mymodels:spelled_out_mlp",
                         f"--output_dir={model}", *args)
  assert _metrics(preset) == _metrics(model) and len(_metrics(model)) == 2
  with open(os.path.join(model, "flags.txt")) as f:
    assert "--model=mymodels:spelled_out_mlp" in f.read()


def test_fola_with_the_preset_spelled_out_is_the_preset_run(tff_runtime, mymodels, tmp_path):
  del tff_runtime, mymodels
  a, b = str(tmp_path / "preset"), str(tmp_path / "model")
  driver.run_training(dict(_SMALL, algorithm="fola", output_dir=a))
  driver.run_training(dict(_SMALL, algorithm="fola", output_dir=b,
                           model="mymodels:spelled_out_mlp"))
  assert _metrics(a) == _metrics(b) and len(_metrics(a)) == 2


# ------------------------------------------------------------- a user conv net
def test_a_user_conv_net_trains_with_every_deterministic_algorithm(tff_runtime, mymodels,
                                                                   tmp_path):
  del tff_runtime, mymodels
  # Two clients: each run exports every client's model (Local's ensemble: K of them).
  common = dict(_SMALL, rounds=3, epochs_per_round=2, num_clients=2, clients_per_round=2,
                client_lr=0.1, model="mymodels:build", export=True)
  extra = dict(fedprox=dict(mu=0.01),
               fedpa=dict(fedpa_server_burn_in=1, fedpa_burn_in=1, epochs_per_round=3))
  accuracy = {}
  for name in ("fedavg", "fedprox", "fedpa", "fola", "local"):
    out = tmp_path / name
    summary = driver.run_training(dict(common, algorithm=name, output_dir=str(out),
                                       **extra.get(name, {})))
    assert summary["flags"]["model"] == "mymodels:build"
    accuracy[name] = (summary["best_server_accuracy"], summary["best_mt_accuracy"])
    assert (out / "export" / "server").is_dir()  # the export builds the user's model too
  # Local's export (an ensemble of K user models, and each client's own) gives its S and MT.
  _check_reproduces(str(tmp_path / "local"), pooled_server=True)
  # Chance is 0.1 on digits.
  print(f"\nbest S and MT accuracy of the user conv net: {accuracy}")
  # (measured over seeds 0-4: S 0.71-0.92, MT 0.74-0.94 after these 3 short rounds)
  assert all(s > 0.25 and mt > 0.25 for s, mt in accuracy.values()), accuracy


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("spec, says", [
    ("nosuchmodule:build", "cannot import module 'nosuchmodule'"),
    ("mymodels:missing", "has no attribute 'missing'"),
    ("mymodels:NOT_CALLABLE", "is not callable"),
    ("mymodels:not_a_model", "must return a tf.keras.Model"),
    ("mymodels:seven_logits", "expected 10 logits"),
    ("mymodels:wrong_input", "examples have shape (64,)"),
    ("mymodels:subclassed", "subclassed Keras model"),
    ("mymodels:with_dropout", "(Dropout) draws noise in training"),
    ("mymodels", "MODULE:FUNCTION"),
])
def test_a_bad_model_is_one_line_naming_the_flag(mymodels, spec, says):
  del mymodels
  with pytest.raises(models.ModelError) as e:
    driver.run_training(dict(_SMALL, algorithm="fedavg", model=spec))
  message = str(e.value)
  assert message.startswith("--model") and spec in message and says in message, message
  assert "\n" not in message


def test_the_model_and_a_builtin_networks_flag_are_refused(mymodels):
  del mymodels
  with pytest.raises(ValueError, match="--model=mymodels:build brings its own layers; "
                     "--hidden_units"):
    driver.run_training(dict(_SMALL, algorithm="fola", model="mymodels:build",
                             hidden_units=(32,)))


def test_the_launcher_refuses_in_one_fatal_line(mymodels):
  def train(*args):
    env = dict(_user_env(mymodels), TF_CPP_MIN_LOG_LEVEL="3")  # the launcher's own default
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "launchers.train",
                           "--algorithm=fedavg", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)

  # Checked with the flags, before TensorFlow starts.
  assert_one_fatal_line_before_tensorflow(train("--model=mymodels:build", "--hidden_units=32"),
                                          "--hidden_units")
  # Checked once the data are loaded (tfbfl.models loads TensorFlow).
  out = train("--model=nosuchmodule:build")
  lines = [l for l in out.stderr.splitlines() if not l.startswith("import time:")]
  assert out.returncode == 1 and lines == [
      "FATAL train: --model=nosuchmodule:build: cannot import module 'nosuchmodule' "
      "(ModuleNotFoundError: No module named 'nosuchmodule'); it is imported from the current "
      "directory or PYTHONPATH."], lines


# ------------------------------------------------------- non-trainable weights
def _digits(num_clients=3):
  return data_lib.load_federated("digits", num_clients=num_clients, seed=0)


def test_fedavg_averages_batchnorm_statistics_and_keeps_frozen_layers(tff_runtime, mymodels):
  del tff_runtime
  import mymodels as user  # pylint: disable=import-outside-toplevel,import-error
  del mymodels
  fd = _digits()
  tmpl = models.template(user.batchnorm_and_frozen, input_shape=fd.input_shape,
                         num_classes=fd.num_classes)
  algo = fedavg.FedAvgAlgorithm(fedavg.FedAvgConfig(input_dim=64, input_shape=(64,),
                                                    num_classes=10, model=tmpl, epochs=1,
                                                    seed=0))
  state = algo.initial_server_state()
  start = [np.asarray(w) for w in state.model_weights.non_trainable]
  assert len(start) == 4  # moving mean and variance; the frozen kernel and bias
  data = [fd.train[c] for c in fd.client_ids[:2]]
  seeds = [base.client_seed(0, 1, k) for k in range(2)]
  state, clients, _ = algo.next(state, [algo.initial_client_state(k) for k in range(2)], seeds,
                                data)
  n = np.array([len(y) for _, y in data], np.float64)
  for j, w0 in enumerate(start):
    own = [np.asarray(c.non_trainable[j]) for c in clients]
    server = np.asarray(state.model_weights.non_trainable[j])
    if j < 2:  # BatchNormalization: the clients' statistics moved; the server takes their mean
      assert not np.allclose(own[0], w0)
      expected = w0 + sum(k * (o - w0) for k, o in zip(n, own)) / n.sum()
      np.testing.assert_allclose(server, expected, rtol=1e-5, atol=1e-6)
    else:  # the frozen layer: unchanged everywhere, bit for bit
      for w in own + [server]:
        np.testing.assert_array_equal(w, w0)
  # The server model is evaluated with its averaged statistics.
  scores = algo.evaluate(state, clients, seeds, [fd.test[c] for c in fd.client_ids[:2]])
  assert all(np.isfinite(float(s["server_loss"])) for s in scores)


def test_fola_refuses_batchnorm_and_takes_frozen_layers(tff_runtime, mymodels):
  del tff_runtime
  import mymodels as user  # pylint: disable=import-outside-toplevel,import-error
  del mymodels
  make = lambda fn: fola.LaplaceConfig(input_shape=(64,), num_classes=10, epochs=1, model=(
      models.template(fn, input_shape=(64,), num_classes=10, label=f"mymodels:{fn.__name__}")))
  with pytest.raises(models.ModelError, match=r"--model=mymodels:batchnorm_and_frozen: fola .*"
                     r"'batch_normalization\w*' \(BatchNormalization\)"):
    fola.FolaAlgorithm(make(user.batchnorm_and_frozen))
  algo = fola.FolaAlgorithm(make(user.frozen_only))
  assert [w.shape for w in algo.initial_weights] == [(16, 10), (10,)]  # the trainable ones


# --------------------------------------------------------------- tff.learning
def test_tff_learning_build_process_takes_a_model_fn(tff_runtime, mymodels):
  del tff_runtime
  import mymodels as user  # pylint: disable=import-outside-toplevel,import-error
  del mymodels
  fd = _digits()
  process = tff_learning.build_process("fedavg", fd, model_fn=user.build, epochs=1)
  assert process.algorithm.config.model.label == "mymodels:build"
  state = process.initialize()
  client_data = tff_learning.to_client_data(fd)
  state, metrics = process.next(state, tff_learning.client_inputs(client_data, [0, 2]))
  assert float(metrics["num_examples"]) == sum(len(fd.train[fd.client_ids[i]][1]) for i in (0, 2))
  weights = process.get_model_weights(state)
  assert [tuple(w.shape) for w in weights.trainable] == [(3, 3, 1, 8), (8,), (72, 10), (10,)]
  assert 0 <= tff_learning.evaluate(process, state, fd)["server_accuracy"] <= 1
  with pytest.raises(TypeError, match="model= or model_fn="):
    tff_learning.build_process("fedavg", fd, model=user.build, model_fn=user.build)
  with pytest.raises(ValueError, match="hidden_units= describes a built-in network"):
    tff_learning.build_process("fedavg", fd, model=user.build, hidden_units=(8,))
  with pytest.raises(models.ModelError, match="expected 10 logits"):
    tff_learning.build_process("fedavg", fd, model_fn=user.seven_logits)

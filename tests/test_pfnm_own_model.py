"""PFNM's launchers take the user's network (`--model=MODULE:FUNCTION`): a Keras ReLU
MLP whose widths and depth the clients' networks take; anything else is refused in
one line naming --model."""

import csv
import json
import os

import pytest
from absl import flags

from tfbfl import models
from reproduction import pfnm_figures as px
from reproduction import pfnm_options as po

from launcher_helpers import ROOT, importable_module, run_launchers_in_parallel

_MYMODELS = '''
import tensorflow as tf

L = tf.keras.layers


def mlp(*widths):
  return tf.keras.Sequential([tf.keras.Input((64,))] +
                             [L.Dense(w, activation="relu") for w in widths] + [L.Dense(10)])


def mlp50():
  return mlp(50)


def mlp100():  # the launchers' default --hidden_units=100, spelled out
  return mlp(100)


def mlp30_20():
  return mlp(30, 20)


def conv():
  return tf.keras.Sequential([tf.keras.Input((64,)), L.Reshape((8, 8, 1)),
                              L.Conv2D(4, 3, activation="relu"), L.Flatten(), L.Dense(10)])


def tanh_mlp():
  return tf.keras.Sequential([tf.keras.Input((64,)), L.Dense(20, activation="tanh"),
                              L.Dense(10)])


def linear():
  return tf.keras.Sequential([tf.keras.Input((64,)), L.Dense(10)])
'''

_TINY = ["--trials=1", "--epochs=1", "--seed=1", "--J=2"]
_METHODS = "--methods=pfnm,local,fedavg_shared"


@pytest.fixture(scope="module")
def mymodels(tmp_path_factory):
  """The directory holding `mymodels.py`, importable in-process for the module."""
  with importable_module(tmp_path_factory.mktemp("user"), _MYMODELS) as where:
    yield where


def _settings(*args):
  fv = flags.FlagValues()
  po.define_launcher_flags(po.ONESHOT_METHODS, fv)
  fv(["prog", "--output_dir=/tmp/unused", *args])
  return po.settings_from_flags(fv, po.ONESHOT_METHODS)


def test_the_models_widths_are_the_clients_networks(mymodels):
  del mymodels
  default, spelled = _settings(), _settings("--model=mymodels:mlp100")
  assert spelled.model == "mymodels:mlp100" and spelled.hidden_units == (100,)
  assert spelled.to_json() == dict(default.to_json(), model="mymodels:mlp100")
  assert _settings("--model=mymodels:mlp30_20").hidden_units == (30, 20)


@pytest.mark.parametrize("spec, says", [
    ("mymodels:conv", "PFNM needs a stack of Dense layers with ReLU (the paper's networks); "
     "layer 'conv2d"),
    ("mymodels:tanh_mlp", "PFNM needs ReLU hidden layers and linear logits; Dense layer"),
    ("mymodels:linear", "PFNM matches hidden neurons; the model has no hidden layer"),
])
def test_a_model_pfnm_cannot_match_is_refused(mymodels, spec, says):
  del mymodels
  with pytest.raises(models.ModelError) as e:
    _settings(f"--model={spec}")
  assert str(e.value).startswith(f"--model={spec}: ") and says in str(e.value)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="--hidden_units describes a built-in network"):
    _settings("--model=mymodels:mlp50", "--hidden_units=50")


def _rows(path):
  with open(path, newline="") as f:
    return [{k: v for k, v in r.items() if "time" not in k and not k.endswith("_s")}
            for r in csv.DictReader(f)]


def test_the_launchers_train_the_model_and_refuse_a_conv_net(tff_runtime, mymodels,
                                                            tmp_path_factory, tmp_path,
                                                            monkeypatch):
  del tff_runtime
  monkeypatch.setenv("PYTHONPATH",
                     os.pathsep.join([str(mymodels), ROOT, os.environ.get("PYTHONPATH", "")]))
  runs = run_launchers_in_parallel(
      {"pfnm_batches": ["--model=mymodels:mlp50", _METHODS],
       "pfnm_sensitivity": ["--model=mymodels:conv", "--sigma_sq_grid=0.1"]},
      tmp_path_factory, _TINY, timeout=300)
  out, rc, log = runs["pfnm_batches"]
  assert rc == 0, log[-3000:]
  with open(os.path.join(out, "settings.json")) as f:
    recorded = json.load(f)["settings"]
  assert recorded["model"] == "mymodels:mlp50" and recorded["hidden_units"] == [50]
  # The same experiment with --hidden_units=50, in-process: the same results.
  settings = _settings(_METHODS, "--hidden_units=50", "--seed=1", "--epochs=1")
  px.run_batches(settings, [2], 1, str(tmp_path))
  for name in ("results.csv", "trials.csv"):
    assert _rows(os.path.join(out, name)) == _rows(os.path.join(tmp_path, name)), name
  _, rc, log = runs["pfnm_sensitivity"]
  fatal = [l for l in log.splitlines() if l.startswith("FATAL")]
  assert rc == 1 and len(fatal) == 1 and "Traceback" not in log, log[-3000:]
  assert fatal[0].startswith("FATAL pfnm_sensitivity: --model=mymodels:conv: PFNM needs a "
                             "stack of Dense layers"), fatal

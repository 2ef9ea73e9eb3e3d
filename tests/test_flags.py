"""Settings declared once: flags made from them, checked at parse time, before TensorFlow.

What is checked here (each can fail):
* `launchers.train --rounds=-1` prints one line naming `--rounds` and exits 1 within a
  few seconds, TensorFlow never imported, and every launcher refuses an unknown flag so
  (each in a process of its own, run as `python -m` runs it; forked from one interpreter
  that holds the TensorFlow-free modules launchers import first: `launcher_forks`);
* the absl validators and `driver.resolve_params` apply the same rule to a value;
* every setting has one declaration (`driver.settings` refuses a second one with
  another default) and the flags' defaults are the configs' field defaults;
* nothing in `tfbfl/algorithms/` imports the driver, the runtime, absl or the data
  loaders, and importing the algorithms (every spec registered) loads no TensorFlow;
* every registered algorithm builds its config from the shipped defaults.
"""

import ast
import dataclasses
import glob
import math
import os
import re
import subprocess
import sys
import types

from absl import flags as absl_flags
import pytest

from tfbfl import flags as tfbfl_flags
from tfbfl import options
from tfbfl import driver
from tfbfl.algorithms import base
from tfbfl.algorithms import registry
from launcher_forks import LauncherForks
import launcher_helpers

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, **kw):
  env = dict(os.environ, PYTHONPATH=_ROOT)
  return subprocess.run([sys.executable, *args],
                        cwd=_ROOT,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=120,
                        **kw)


@pytest.fixture(scope="module")
def forks():
  launchers = LauncherForks()
  yield launchers
  launchers.close()


def _assert_one_fatal_line_before_tensorflow(out, flag, program="train"):
  """`out` (a launcher's `launcher_forks.Result`) failed with exactly one line
  `FATAL <program>: ...` naming `flag`, and never imported TensorFlow."""
  launcher_helpers.assert_one_fatal_line(out, out.stderr.splitlines(), flag, program)
  assert out.tensorflow_modules == [], out  # none loaded, and the list was made


@pytest.mark.parametrize("argv, flag", [(["--rounds=-1"], "--rounds"),
                                        (["--kl_weight=nan"], "--kl_weight"),
                                        (["--clients_per_round=11"], "--clients_per_round"),
                                        (["--hidden_units=8,x"], "--hidden_units"),
                                        (["--executor=remote"], "--executor"),
                                        (["--algorithm=nope"], "--algorithm")])
def test_bad_flag_is_one_line_before_tensorflow(forks, argv, flag):
  out = forks.run("launchers.train", *argv)
  _assert_one_fatal_line_before_tensorflow(out, flag)
  # Generous for a loaded CI machine; ~0.05 s quiet after the shared imports (~0.3 s
  # from a fresh interpreter).
  assert out.elapsed < 15, out.elapsed


_LAUNCHERS = sorted(
    os.path.basename(p)[:-3]
    for p in glob.glob(os.path.join(_ROOT, "launchers", "*.py"))
    if not os.path.basename(p).startswith("_"))


@pytest.mark.parametrize("program", _LAUNCHERS)
def test_every_launcher_refuses_an_unknown_flag_before_tensorflow(forks, program):
  # The PFNM launchers imported TensorFlow with their experiment modules: a typo cost
  # ~8 s and TensorFlow's start-up lines before the one line naming it.
  out = forks.run(f"launchers.{program}", "--no_such_flag=1")
  _assert_one_fatal_line_before_tensorflow(out, "no_such_flag", program)


def test_algorithm_help_points_to_the_pfnm_launchers_that_exist():
  """PFNM is not an `--algorithm` (one-shot): the flag's help names its launchers."""
  values = absl_flags.FlagValues()
  tfbfl_flags.define(["algorithm"], flag_values=values, check_combinations=False)
  named = re.findall(r"\b(pfnm_\w+)", values["algorithm"].help)
  assert len(named) >= 4, values["algorithm"].help
  for name in named:
    assert os.path.exists(os.path.join(_ROOT, "launchers", name + ".py")), name


def test_algorithms_import_no_tensorflow():
  code = (
      "import sys, tfbfl.algorithms, tfbfl.flags, tfbfl.driver\n"
      "from tfbfl.algorithms import registry\n"
      "assert 'fedpa' in registry.names() and 'virtual' in registry.names()\n"
      "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_federated')]\n"
      "assert not bad, bad[:5]\n")
  out = _run(["-c", code])
  assert out.returncode == 0, out.stderr[-2000:]


_DRIVER = ("tfbfl.driver", "tfbfl.round_loop", "reproduction", "tfbfl.runtime",
           "tfbfl.flags", "tfbfl.data", "tfbfl.export", "tfbfl.restore", "tfbfl.checkpoint", "absl")


def _imports(path):
  names = []
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "load" and node.args and
          isinstance(node.args[0], ast.Constant)):  # _lazy.load("...")
      names.append(node.args[0].value)
  return names


@pytest.mark.parametrize(
    "path", sorted(glob.glob(os.path.join(_ROOT, "tfbfl/algorithms/**/*.py"), recursive=True)))
def test_algorithms_do_not_import_the_driver(path):
  bad = [n for n in _imports(path) if any(n == d or n.startswith(d + ".") for d in _DRIVER)]
  assert not bad, (os.path.basename(path), bad)


def test_validators_and_resolve_params_agree():
  """A value refused by resolve_params is refused at parse time, with the same message."""
  fv = absl_flags.FlagValues()
  tfbfl_flags.define(flag_values=fv)
  table = driver.settings()
  cases = [("rounds", "0"), ("rounds", "7"), ("client_lr", "1e4"), ("client_lr", "0.5"),
           ("server_lr", "-1"), ("fola_gamma", "inf"), ("prune_percentile", "101"),
           ("max_update_ratio", "inf"), ("kl_weight", "-0.1"), ("seed", "-1")]
  for name, text in cases:
    value = float(text) if table[name][1].kind == "float" else int(text)
    try:
      driver.resolve_params({name: value})
      want = None
    except ValueError as e:
      want = str(e)
    fv.unparse_flags()
    try:
      fv(["prog", f"--{name}={text}"])
      got = None
    except absl_flags.IllegalFlagValueError as e:
      got = str(e)
    assert (want is None) == (got is None), (name, text, want, got)
    if want:
      assert want in got, (want, got)


def test_each_setting_is_declared_once():
  table = driver.settings()
  assert driver.DEFAULTS["batch_size"] == 20 and driver.DEFAULTS["server_lr"] is None
  # Flag defaults are the declaring classes' field defaults (no second table).
  for cls in (*driver.COMMON_SETTINGS, *(s.config_cls for s in registry.specs())):
    for name, default in options.defaults(cls).items():
      assert table[name][0] == default, (cls.__name__, name)

  @dataclasses.dataclass(frozen=True)
  class Clash:
    batch_size: int = options.integer(32, "Another default.", low=1)

  spec = registry.AlgorithmSpec("clash_test", Clash, lambda *a: None, "test only")
  registry.register(spec)
  try:
    with pytest.raises(ValueError, match="--batch_size is declared by"):
      driver.settings()
  finally:
    registry._SPECS.pop("clash_test")  # pylint: disable=protected-access


def test_option_rules():
  opt = options.Option("float", "x", low=0.0, high=1.0, low_open=True)
  assert opt.check(1, "x") == 1.0
  for bad in (0.0, 1.5, math.nan, -math.inf, "0.5", True):
    with pytest.raises(ValueError, match="^--x "):
      opt.check(bad, "x")
  assert options.Option("float", "y", inf_ok=True, high=None).check(math.inf, "y") == math.inf
  ints = options.Option("ints", "z")
  assert ints.check("8, 4", "z") == (8, 4) and ints.check("", "z") is None
  with pytest.raises(ValueError, match="--z entries"):
    ints.check([0], "z")
  with pytest.raises(ValueError, match="--n must be an integer"):
    options.Option("int", "n").check(2.5, "n")


def test_every_algorithm_builds_its_config_from_the_defaults():
  data = types.SimpleNamespace(input_shape=(64,), num_classes=10, client_ids=list(range(10)),
                               train={})
  for spec in registry.specs():
    p = driver.resolve_params(dict(algorithm=spec.name))
    config = spec.make_config(p, data)
    assert isinstance(config, spec.config_cls)
    assert config.epochs == p["epochs_per_round"] and config.batch_size == p["batch_size"]
    for field, value in spec.fixed.items():
      assert getattr(config, field) == value
  p4 = driver.resolve_params(dict(clients_per_round=4))
  assert p4["server_lr"] == pytest.approx(1 / 4)  # recorded as used
  virtual_config = registry.get("virtual").make_config(p4, data)
  assert virtual_config.step == pytest.approx(1 / 4)  # VIRTUAL's derived default, 1/C
  p = driver.resolve_params(dict(algorithm="fedavg"))
  assert p["server_lr"] == 1.0 and registry.get("fedavg").make_config(p, data).server_step == 1.0
  assert registry.get("fedavg").make_config(dict(p, mu=0.5), data).mu == 0.0  # pinned
  assert registry.get("fedprox").make_config(p, data).mu == 0.01


def _image_configs(input_shape, **flags):
  """The config of every registered algorithm with a convolutional architecture."""
  data = types.SimpleNamespace(input_shape=input_shape, num_classes=10,
                               client_ids=list(range(10)), train={})
  out = {}
  for spec in registry.specs():
    for architecture in base.IMAGE_ARCHITECTURES:
      p = driver.resolve_params(dict(algorithm=spec.name, architecture=architecture, **flags))
      try:
        out[spec.name] = spec.make_config(p, data)
      except ValueError as e:
        if "--architecture must be one of" not in str(e):
          raise
  return out


def test_conv_architectures_read_examples_as_the_same_image():
  flat = _image_configs((64,))
  assert {"virtual", "fedavg", "fedprox", "fola", "fedcurv"} <= set(flat)
  assert {c.image_shape for c in flat.values()} == {(8, 8, 1)}  # flat square: sqrt n
  assert {c.image_shape for c in _image_configs((28, 28)).values()} == {(28, 28, 1)}
  given = _image_configs((784,), image_shape=(28, 28))
  assert {c.image_shape for c in given.values()} == {(28, 28, 1)}
  assert {c.image_shape for c in _image_configs((12,), image_shape=(2, 2, 3)).values()} == {
      (2, 2, 3)}


@pytest.mark.parametrize("name", ["virtual", "fedavg", "fola"])
@pytest.mark.parametrize("input_shape, image_shape, match", [
    ((64,), (7, 7), r"--image_shape=7,7,1 holds 49 entries; the data's examples \(shape \(64,\)\) hold 64"),
    ((64,), (8, 8, 2), r"--image_shape=8,8,2 holds 128 entries"),
    ((60,), None, r"--architecture=c[a-z]+ reads each example as an image; .* not a square number of entries: pass --image_shape=H,W\[,C\] with H\*W\*C = 60"),
    ((64,), (64,), r"--image_shape must be H,W or H,W,C"),
])
def test_an_image_shape_that_does_not_fit_the_examples_is_an_error(name, input_shape,
                                                                 image_shape, match):
  # Before, VIRTUAL reshaped a batch of 20 into 10 images (a shape error deep in tracing)
  # and FOLA's CNN failed inside TFF's worker with a gRPC status.
  data = types.SimpleNamespace(input_shape=input_shape, num_classes=10,
                               client_ids=list(range(10)), train={})
  spec = registry.get(name)
  architecture = "cnn" if name == "fola" else "conv"
  p = driver.resolve_params(dict(algorithm=name, architecture=architecture, image_shape=image_shape))
  with pytest.raises(ValueError, match=match):
    spec.make_config(p, data)


def test_data_spec_reaches_the_loader():
  spec = driver.data_spec(
      driver.resolve_params(dict(num_clients=4, clients_per_round=4, seed=3, alpha=0.2)))
  assert (spec.num_clients, spec.seed, spec.alpha) == (4, 3, 0.2)
  from tfbfl import data as data_lib  # pylint: disable=g-import-not-at-top
  a = data_lib.load_federated(spec)
  b = data_lib.load_federated("digits", num_clients=4, seed=3, alpha=0.2)
  assert a.client_ids == b.client_ids
  assert all((a.train[c][1] == b.train[c][1]).all() for c in a.client_ids)


# ----------------------------------------------------- flags that mean what they say
@pytest.mark.parametrize("bad, match", [
    (dict(dataset="digits", data_dir="/tmp/x"), "--data_dir is not used by --dataset=digits"),
    (dict(dataset="npz", data_dir="x.npz", num_clients=50), "--num_clients is not used by"),
    (dict(dataset="npz", data_dir="x.npz", partition="homogeneous"), "--partition is not used"),
    (dict(dataset="femnist", data_dir="d", alpha=0.1), "--alpha is not used by --dataset=femnist"),
])
def test_a_flag_the_dataset_ignores_is_an_error(bad, match):
  with pytest.raises(ValueError, match=match):
    driver.resolve_params(bad)


def test_defaults_of_ignored_flags_are_accepted():
  # The same values at their defaults (e.g. a grid passing every flag) are fine.
  p = driver.resolve_params(
      dict(dataset="npz",
           data_dir="x.npz",
           num_clients=10,
           partition=driver.DEFAULTS["partition"]))
  assert p["dataset"] == "npz"


def test_an_unused_algorithm_flag_is_one_warning_line(capsys):
  driver.resolve_params(dict(algorithm="fedavg", kl_weight=0.5))
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["warning: --algorithm=fedavg does not use --kl_weight."]
  driver.resolve_params(dict(algorithm="virtual", kl_weight=0.5))
  assert capsys.readouterr().err == ""


def test_clients_per_round_defaults_to_min_10_clients():
  assert driver.DEFAULTS["clients_per_round"] is None
  assert driver.resolve_params(dict(num_clients=3))["clients_per_round"] == 3
  assert driver.resolve_params(dict(num_clients=30))["clients_per_round"] == 10
  p = driver.resolve_params(dict(num_clients=4, algorithm="virtual"))
  assert p["server_lr"] == pytest.approx(1 / 4)  # VIRTUAL's 1/C follows


def test_test_fraction_is_a_flag():
  fv = absl_flags.FlagValues()
  tfbfl_flags.define(flag_values=fv)
  fv(["prog", "--test_fraction=0.4"])
  assert tfbfl_flags.params(flag_values=fv)["test_fraction"] == 0.4


@pytest.mark.usefixtures("tff_runtime")
def test_run_training_takes_federated_data(tmp_path):
  from tfbfl import data as data_lib  # pylint: disable=g-import-not-at-top
  x, y = data_lib.load_digits_arrays()
  fd = data_lib.from_client_arrays([x[:300], x[300:600], x[600:900]],
                                   [y[:300], y[300:600], y[600:900]],
                                   [x[900:1000], x[1000:1100], x[1100:1200]],
                                   [y[900:1000], y[1000:1100], y[1100:1200]])
  summary = driver.run_training(dict(algorithm="fedavg",
                                       rounds=2,
                                       epochs_per_round=2,
                                       verbose=False),
                                  data=fd)
  assert summary["flags"]["num_clients"] == 3 and summary["flags"]["clients_per_round"] == 3
  assert summary["final_server_accuracy"] > 0.5  # 10 classes: chance 0.1
  with pytest.raises(ValueError, match="leave --dataset unset"):
    driver.run_training(dict(dataset="digits"), data=fd)

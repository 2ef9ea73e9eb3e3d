"""The PFNM launchers' settings as `tfbfl.options` fields: flags made from the option
dataclasses of `reproduction.pfnm_options`, parsed back into them, bad values named."""

import dataclasses
import math

import pytest
from absl import flags

from launcher_helpers import run_launcher
from tfbfl import options
from reproduction import pfnm_options as po

OWN = (po.BatchesOptions, po.DepthOptions, po.StreamingOptions, po.SensitivityOptions)
SHARED = (po.DataOptions, po.TrainingOptions, po.MatchingOptions, po.BaselineOptions)


def _parsed(cls, *args):
  fv = flags.FlagValues()
  po.define_options(cls, fv)
  fv(["prog", *args])
  return po.options_from_flags(cls, fv)


@pytest.mark.parametrize("cls", OWN + SHARED)
def test_flag_defaults_parse_back_to_the_declared_defaults(cls):
  expected = cls()
  if cls is po.BaselineOptions:  # an empty list flag parses to None (tfbfl.options' rule)
    expected = dataclasses.replace(expected, fedavg_hidden_units=None)
  assert _parsed(cls) == expected


def test_launcher_options_are_typed():
  assert _parsed(po.BatchesOptions, "--J=2, 5", "--trials=3") == po.BatchesOptions(J=(2, 5),
                                                                                   trials=3)
  grid = _parsed(po.SensitivityOptions, "--sigma_sq_grid=0.5,2")
  assert grid.sigma_sq_grid == (0.5, 2.0) and grid.sigma0_sq_grid == (1.0, 10.0, 100.0)
  assert _parsed(po.StreamingOptions, "--init_noise=0").init_noise == 0.0


@pytest.mark.parametrize("cls, args, flag", [
    (po.BatchesOptions, ["--J=0"], "--J"),
    (po.BatchesOptions, ["--J=2,x"], "--J"),
    (po.BatchesOptions, ["--J="], "--J"),
    (po.BatchesOptions, ["--trials=0"], "--trials"),
    (po.DepthOptions, ["--C="], "--C"),
    (po.DepthOptions, ["--width=0"], "--width"),
    (po.StreamingOptions, ["--init_noise=-1"], "--init_noise"),
    (po.StreamingOptions, ["--steps=0"], "--steps"),
    (po.SensitivityOptions, ["--sigma_sq_grid=0.1,-1"], "--sigma_sq_grid"),
    (po.SensitivityOptions, ["--gamma0_grid=x"], "--gamma0_grid"),
    (po.SensitivityOptions, ["--sigma0_sq_grid=inf"], "--sigma0_sq_grid"),
])
def test_bad_launcher_flags_raise_value_errors_naming_the_flag(cls, args, flag):
  with pytest.raises(ValueError, match=flag):
    _parsed(cls, *args)


def test_launcher_flags_belong_to_the_given_module():
  fv = flags.FlagValues()
  names = po.define_options(po.DepthOptions, fv, module_name="launchers.pfnm_depth")
  assert names == ["C", "J", "width", "trials"]
  key = fv.get_key_flags_for_module("launchers.pfnm_depth")
  assert sorted(f.name for f in key) == sorted(names)


def test_define_options_overrides_skips_and_keeps_list_defaults():
  fv = flags.FlagValues()
  po.define_training_flags(fv, hidden_units=False)
  po.define_baseline_flags(("pfnm", "local"), fv)
  po.define_options(po.SensitivityOptions, fv)
  assert "hidden_units" not in fv and "lr" in fv
  assert fv["methods"].help == "Comma list of methods, or 'all': ['pfnm', 'local']."
  assert fv["sigma_sq_grid"].default == ["0.03", "0.1", "0.3", "1"]
  assert fv["fedavg_hidden_units"].default == []


def _settings(*args):
  fv = flags.FlagValues()
  po.define_launcher_flags(po.ONESHOT_METHODS, fv)
  fv(["prog", "--output_dir=/tmp/unused", *args])
  return po.settings_from_flags(fv, po.ONESHOT_METHODS)


def test_settings_from_flags():
  s = _settings("--hidden_units=16,8", "--popularity_cap=5", "--methods=pfnm, local")
  assert s.hidden_units == (16, 8) and s.fedavg_hidden_units is None
  assert s.hp.popularity_cap == 5 and s.hp.seed == s.seed == 0
  assert s.methods == ("pfnm", "local")
  assert s.training == dict(epochs=10, batch_size=32, learning_rate=0.01, l2=1e-6, init_std=0.1,
                            bias_init=0.1, shared_init=False)
  cifar = _settings("--dataset=cifar10").training  # Table 1's CIFAR-10 column
  assert (cifar["learning_rate"], cifar["l2"]) == (0.001, 1e-5)
  given = _settings("--dataset=cifar10", "--lr=0.05").training
  assert (given["learning_rate"], given["l2"]) == (0.05, 1e-5)
  with pytest.raises(ValueError, match="--output_dir"):
    po.settings_from_flags(flags.FlagValues(), po.ONESHOT_METHODS)


def test_real_list_option():
  rule = options.Option("reals", "numbers", low=0.0, low_open=True)
  assert rule.check("0.5, 2", "g") == (0.5, 2.0) and rule.check(["3"], "g") == (3.0,)
  assert rule.check("", "g") is None and rule.check(None, "g") is None
  for bad in ("0", "-1", "nan", "inf", "x"):
    with pytest.raises(ValueError, match="--g"):
      rule.check(bad, "g")
  assert options.real_list((1, 2), "x").default == (1.0, 2.0)
  wide = options.Option("ints", "ints", high=math.inf)
  assert wide.check("20000000", "w") == (20000000,)
  with pytest.raises(ValueError, match="--w"):
    options.Option("ints", "ints").check("20000000", "w")  # int_list's default ceiling


@pytest.mark.parametrize("name, args, flag", [
    ("pfnm_batches", ["--J=0"], "--J"),
    ("pfnm_streaming", ["--init_noise=-1"], "--init_noise"),
])
def test_launchers_fail_with_one_line_naming_the_flag(tmp_path, name, args, flag):
  out = run_launcher(name, f"--output_dir={tmp_path}", *args, timeout=240)
  fatal = [l for l in out.stderr.splitlines() if l.startswith("FATAL")]
  assert out.returncode == 1 and len(fatal) == 1, out.stderr[-2000:]
  assert fatal[0].startswith(f"FATAL {name}: {flag} "), fatal
  assert not list(tmp_path.iterdir())

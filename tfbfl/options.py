"""Settings declared once, as dataclass fields: one default, one help text, one check.

A config dataclass (an algorithm's `VirtualConfig`, the driver's `RunConfig`, the
data's `DataSpec`, ...) declares each user-facing setting with one of the field
helpers below:

    @dataclasses.dataclass(frozen=True)
    class MyConfig:
      client_lr: float = options.real(0.05, "Client SGD learning rate.", low=0.0, low_open=True)
      epochs: int = options.integer(20, "Local epochs per round.", low=1, flag="epochs_per_round")

The field's metadata holds an `Option`: the flag name (the field name unless given),
the help text and the rule a value must satisfy. `tfbfl.flags` turns every such
field into an absl flag with a validator; `check` applies the same rules to a dict
of flag values (the launchers' grids build such dicts), and `from_flags` builds a
config from one. Both fail with one `ValueError` naming the flag. This module
imports neither TensorFlow nor absl, so every check runs before either starts.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

MAX_RATE = 1e3  # learning rates / steps and prior / initial scales
MAX_WEIGHT = 1e6  # penalty strengths and loss weights (KL beta, mu, lambdas)
MAX_SEED = 2**63 - 1
MAX_COUNT = 10**9  # rounds, epochs, batch sizes, ...
# Upper bounds that only guard the command line against typos (see `Option.check`).
SANITY_CEILINGS = (MAX_RATE, MAX_WEIGHT, MAX_COUNT)

KINDS = ("int", "float", "bool", "str", "enum", "ints", "strs", "reals")


@dataclasses.dataclass(frozen=True)
class Option:
  """How one config field is shown and checked as a flag.

  kind: "int", "float", "bool", "str" (free text or a path; None allowed),
    "enum" (one of `choices`), "ints" (comma-separated positive integers, a tuple
    or None), "strs" (comma-separated strings, a tuple or None), "reals"
    (comma-separated numbers, a tuple of floats or None).
  low/high: closed bounds of numbers (`low_open`: `low` itself is refused);
    for "ints" and "reals" the bounds of each entry.
  inf_ok: a float (a "reals" entry) may be +inf (e.g. "no bound").
  none_ok: None is a value (it means what the help text says).
  """
  kind: str
  help: str
  flag: Optional[str] = None
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  inf_ok: bool = False
  none_ok: bool = False
  choices: Tuple[str, ...] = ()

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"Option kind must be one of {KINDS}, got {self.kind!r}.")
    if not self.help:
      raise ValueError("Option needs a help text.")

  def check(self, value: Any, flag: str, *, upper: bool = True) -> Any:
    """`value` normalised to the field's type; ValueError naming `--flag` if invalid.

    `upper=False` skips an upper bound that is only a command-line sanity ceiling
    (`SANITY_CEILINGS`: of learning rates, weights, counts), which library callers
    may exceed (e.g. a test that makes a client diverge on purpose); bounds that are
    part of the meaning (a fraction <= 1, a percentile <= 100) always hold.
    """
    if value is None:
      if self.none_ok or self.kind in ("str", "ints", "strs", "reals"):
        return None
      raise ValueError(f"--{flag} needs a value.")
    if not upper and self.high in SANITY_CEILINGS and self.kind in ("int", "float"):
      return dataclasses.replace(self, high=None).check(value, flag)
    return getattr(self, f"_check_{self.kind}")(value, flag)

  def _bounds(self, x, flag, what="") -> None:
    low_bad = self.low is not None and (x <= self.low if self.low_open else x < self.low)
    if low_bad or (self.high is not None and x > self.high):
      lo = "(" if self.low_open else "["
      low = "-inf" if self.low is None else f"{self.low:g}"
      high = "inf" if self.high is None else f"{self.high:g}"
      raise ValueError(f"--{flag}{what} must be in {lo}{low}, {high}], got {x:g}.")

  def _check_int(self, v, flag):
    if isinstance(v, numbers.Real) and not isinstance(v, (bool, numbers.Integral)):
      if not (math.isfinite(float(v)) and float(v).is_integer()):
        raise ValueError(f"--{flag} must be an integer, got {v!r}.")
      v = int(v)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
      raise ValueError(f"--{flag} must be an integer, got {v!r}.")
    self._bounds(int(v), flag)
    return int(v)

  def _check_float(self, v, flag):
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
      raise ValueError(f"--{flag} must be a number, got {v!r}.")
    x = float(v)
    if math.isnan(x) or (math.isinf(x) and not (self.inf_ok and x > 0)):
      raise ValueError(f"--{flag} must be finite, got {x}.")
    self._bounds(x, flag)
    return x

  def _check_bool(self, v, flag):
    if isinstance(v, numbers.Integral) and v in (0, 1):  # bool, np.bool_ and 0/1
      return bool(v)
    if hasattr(v, "dtype") and getattr(v, "shape", None) == () and v.dtype == bool:
      return bool(v)
    raise ValueError(f"--{flag} must be a bool, got {v!r}.")

  def _check_str(self, v, flag):
    if not isinstance(v, (str, os.PathLike)):
      raise ValueError(f"--{flag} must be a string, got {v!r}.")
    return os.fspath(v)

  def _check_enum(self, v, flag):
    if v not in self.choices:
      raise ValueError(f"--{flag} must be one of {tuple(self.choices)}, got {v!r}.")
    return v

  def _items(self, v, flag, what):
    items = v.split(",") if isinstance(v, str) else v
    try:
      return [str(x).strip() for x in items if str(x).strip()]
    except TypeError:
      raise ValueError(f"--{flag} must be a comma-separated list of {what}, got {v!r}.") from None

  def _check_ints(self, v, flag):
    items = self._items(v, flag, "integers")
    try:
      out = tuple(int(x) for x in items)
    except ValueError:
      raise ValueError(f"--{flag} must be a comma-separated list of integers, got {v!r}.") from None
    low = 1 if self.low is None else self.low
    high = 10**7 if self.high is None else self.high
    if any(x < low or x > high for x in out):
      raise ValueError(f"--{flag} entries must be in [{low:g}, {high:g}], got {v!r}.")
    return out or None

  def _check_strs(self, v, flag):
    return tuple(self._items(v, flag, "strings")) or None

  def _check_reals(self, v, flag):
    items = self._items(v, flag, "numbers")
    try:
      out = tuple(float(x) for x in items)
    except ValueError:
      raise ValueError(f"--{flag} must be a comma-separated list of numbers, got {v!r}.") from None
    for x in out:
      if math.isnan(x) or (math.isinf(x) and not (self.inf_ok and x > 0)):
        raise ValueError(f"--{flag} entries must be finite, got {v!r}.")
      self._bounds(x, flag, " entries")
    return out or None


def _field(default, option: Option):
  return dataclasses.field(default=default, metadata={"option": option})


def integer(default: Optional[int],
            help: str,
            *,
            low: float = 0,
            high: float = MAX_COUNT,
            flag: Optional[str] = None,
            none_ok: bool = False):
  """An int setting in [low, high]."""
  return _field(default, Option("int", help, flag, low, high, none_ok=none_ok))


def real(default: Optional[float],
         help: str,
         *,
         low: Optional[float] = 0.0,
         high: Optional[float] = MAX_RATE,
         low_open: bool = False,
         inf_ok: bool = False,
         flag: Optional[str] = None,
         none_ok: bool = False):
  """A float setting in [low, high] (or (low, high] with `low_open`); +inf if `inf_ok`."""
  return _field(default, Option("float", help, flag, low, high, low_open, inf_ok, none_ok))


def boolean(default: bool, help: str, *, flag: Optional[str] = None):
  return _field(default, Option("bool", help, flag))


def text(default: Optional[str], help: str, *, flag: Optional[str] = None):
  """A string (a path, an address); None allowed."""
  return _field(default, Option("str", help, flag))


def choice(default: str, choices: Sequence[str], help: str, *, flag: Optional[str] = None):
  return _field(default, Option("enum", help, flag, choices=tuple(choices)))


def int_list(default: Optional[Sequence[int]],
             help: str,
             *,
             flag: Optional[str] = None,
             low: Optional[float] = None,
             high: Optional[float] = None):
  """A tuple of ints (comma-separated on the command line); None or () if empty.

  Each entry in [low, high]: by default [1, 10**7]; `high=math.inf` for no ceiling."""
  default = None if default is None else tuple(default)
  return _field(default, Option("ints", help, flag, low, high))


def real_list(default: Optional[Sequence[float]],
              help: str,
              *,
              low: Optional[float] = 0.0,
              high: Optional[float] = MAX_RATE,
              low_open: bool = False,
              inf_ok: bool = False,
              flag: Optional[str] = None):
  """A tuple of floats (comma-separated on the command line), each in [low, high]
  (`low_open`: (low, high]); None or () if empty."""
  default = None if default is None else tuple(float(x) for x in default)
  return _field(default, Option("reals", help, flag, low, high, low_open, inf_ok))


def str_list(default: Optional[Sequence[str]], help: str, *, flag: Optional[str] = None):
  default = None if default is None else tuple(default)
  return _field(default, Option("strs", help, flag))


def option_fields(cls) -> Dict[str, Tuple[dataclasses.Field, Option]]:
  """flag name -> (field, Option) of every setting declared on the dataclass `cls`."""
  out = {}
  for f in dataclasses.fields(cls):
    option = f.metadata.get("option")
    if option is not None:
      out[option.flag or f.name] = (f, option)
  return out


def defaults(cls) -> Dict[str, Any]:
  """flag name -> default of every setting of `cls`."""
  return {name: f.default for name, (f, _) in option_fields(cls).items()}


def check(cls, values: Mapping[str, Any]) -> Dict[str, Any]:
  """`values` (flag name -> value) restricted to `cls`'s settings, checked and normalised."""
  fields = option_fields(cls)
  return {name: fields[name][1].check(v, name) for name, v in values.items() if name in fields}


def from_flags(cls, params: Mapping[str, Any], **fixed):
  """An instance of `cls` from flag values (missing ones: the field defaults).

  `fixed` sets fields by their field name (values that come from the data, such as
  `input_dim`, or that an algorithm pins); they win over `params`.
  """
  kwargs = {}
  for name, (f, option) in option_fields(cls).items():
    if name in params and f.name not in fixed:
      kwargs[f.name] = option.check(params[name], name)
  names = {f.name for f in dataclasses.fields(cls)}
  kwargs.update({k: v for k, v in fixed.items() if k in names})
  return cls(**kwargs)

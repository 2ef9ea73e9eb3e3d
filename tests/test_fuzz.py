"""Property-based fuzzing (hypothesis) of what users hand us: `.npz` data files and
flag values. Every input gives either a valid result or one clear `ValueError`
line; never another exception.

Examples are derandomized (the same on every CI run); set TFBFL_FUZZ_EXAMPLES
to explore more, e.g. TFBFL_FUZZ_EXAMPLES=5000 with a random seed locally:
`TFBFL_FUZZ_RANDOM=1`.
"""

import math
import os
import tempfile

import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import numpy as np
import pytest

from tfbfl import driver
from tfbfl.data import FederatedData
from tfbfl.data.npz import load_npz

_N = int(os.environ.get("TFBFL_FUZZ_EXAMPLES", "0"))
_SETTINGS = dict(deadline=None,
                 database=None,
                 derandomize=not os.environ.get("TFBFL_FUZZ_RANDOM"),
                 suppress_health_check=list(hypothesis.HealthCheck))

_DTYPES = [
    np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64, np.bool_,
    np.complex64
]


def _array(dtype, shape):
  if np.dtype(dtype).kind == "f":
    elements = st.floats(allow_nan=True, allow_infinity=True, width=np.dtype(dtype).itemsize * 8)
  else:
    elements = None
  return hnp.arrays(dtype, shape, elements=elements)


@st.composite
def _client_arrays(draw):
  arrays = {}
  n_clients = draw(st.integers(0, 3))
  ids = draw(
      st.lists(st.sampled_from(["a", "b", "c0", "test_x", "é", "1"]),
               min_size=n_clients,
               max_size=n_clients,
               unique=True))
  feature_shape = draw(st.lists(st.integers(0, 3), min_size=0, max_size=2))
  with_test = draw(st.sampled_from(["none", "all", "some"]))
  for j, cid in enumerate(ids):
    n = draw(st.integers(0, 6))
    x_shape = (n, *feature_shape) if draw(st.booleans()) else tuple(
        draw(st.lists(st.integers(0, 3), max_size=3)))
    arrays[f"x_{cid}"] = draw(_array(draw(st.sampled_from(_DTYPES)), x_shape))
    y_n = n if draw(st.integers(0, 4)) else draw(st.integers(0, 6))
    y_dtype = draw(st.sampled_from([np.int64, np.int8, np.uint8, np.float32, np.float64, np.bool_]))
    if np.dtype(y_dtype).kind in "iu" and draw(st.booleans()):
      arrays[f"y_{cid}"] = draw(hnp.arrays(y_dtype, (y_n,), elements=st.integers(0, 4)))
    else:
      arrays[f"y_{cid}"] = draw(_array(y_dtype, (y_n,)))
    if with_test == "all" or (with_test == "some" and j == 0):
      m = draw(st.integers(0, 3))
      arrays[f"x_test_{cid}"] = draw(_array(np.float32, (m, *feature_shape)))
      arrays[f"y_test_{cid}"] = draw(hnp.arrays(np.int64, (m,), elements=st.integers(-1, 5)))
    if draw(st.integers(0, 6)) == 0:
      del arrays[f"y_{cid}"]  # an x without its y
  extra = draw(st.sampled_from([None, "num_classes", "weights", "y_"]))
  if extra is not None:
    arrays[extra] = draw(
        _array(draw(st.sampled_from(_DTYPES)), tuple(draw(st.lists(st.integers(0, 2),
                                                                   max_size=2)))))
  return arrays


@hypothesis.settings(max_examples=_N or 150, **_SETTINGS)
@hypothesis.given(arrays=_client_arrays(), test_fraction=st.sampled_from([0.0, 0.25, 0.5]))
def test_npz_loader_gives_data_or_a_clear_error(arrays, test_fraction):
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "fuzz.npz")
    np.savez(path, **arrays)
    try:
      fd = load_npz(path, test_fraction=test_fraction)
    except ValueError as e:
      message = str(e)
      assert "fuzz.npz" in message and "\n" not in message, message
      hypothesis.event("clear ValueError")
      return
  hypothesis.event("valid FederatedData")
  assert isinstance(fd, FederatedData) and fd.client_ids
  for cid in fd.client_ids:
    x, y = fd.train[cid]
    assert len(x) == len(y) >= 1 and np.all(np.isfinite(x))
    assert y.min() >= 0 and y.max() < fd.num_classes


@hypothesis.settings(max_examples=_N or 60, **_SETTINGS)
@hypothesis.given(data=st.binary(max_size=600),
                  cut=st.integers(0, 4000),
                  kind=st.sampled_from(["bytes", "truncated", "npy"]))
def test_npz_loader_on_damaged_files(data, cut, kind):
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "fuzz.npz")
    if kind == "bytes":
      with open(path, "wb") as f:
        f.write(data)
    elif kind == "truncated":
      np.savez(path, x_a=np.ones((4, 2), np.float32), y_a=np.array([0, 1, 0, 1]))
      with open(path, "rb") as f:
        whole = f.read()
      with open(path, "wb") as f:
        f.write(whole[:cut % len(whole)])
    else:
      with open(path, "wb") as f:
        np.save(f, np.frombuffer(data, np.uint8))
    with pytest.raises(ValueError, match="fuzz.npz") as info:
      load_npz(path)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ flags
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**70),
                                                                max_value=2**70),
    st.sampled_from([0, 1, -1, 0.0, 1e3, 1e3 + 1e-9, 1e30, -0.0, 5e-324, True, False]))
_FLAGS = sorted(set(driver._INT_FLAGS) | set(driver._REAL_FLAGS))  # pylint: disable=protected-access


@hypothesis.settings(max_examples=_N or 400, **_SETTINGS)
@hypothesis.given(values=st.dictionaries(
    st.sampled_from([f for f in _FLAGS if f in driver.DEFAULTS]), _NUMBERS, max_size=4))
def test_resolve_params_gives_params_or_a_named_error(values):
  try:
    p = driver.resolve_params(values)
  except ValueError as e:
    message = str(e)
    assert "\n" not in message and any(f"--{name}" in message for name in values), message
    hypothesis.event("named ValueError")
    return
  hypothesis.event("accepted")
  for name, (low, high, _) in driver._INT_FLAGS.items():  # pylint: disable=protected-access
    if name in p:
      assert type(p[name]) is int and low <= p[name] <= high, (name, p[name])
  for name, (low, high, low_open, inf_ok) in driver._REAL_FLAGS.items():  # pylint: disable=protected-access
    if name in p and p[name] is not None:
      x = float(p[name])
      assert not math.isnan(x) and (math.isfinite(x) or inf_ok), (name, x)
      assert (x > low if low_open else x >= low) and x <= high, (name, x)
  assert p["clients_per_round"] <= p["num_clients"]


@pytest.mark.parametrize("flag, value", [("client_lr", math.inf), ("server_lr", math.inf),
                                         ("kl_weight", math.nan), ("init_scale", 1e30),
                                         ("prior_scale", -1.0), ("clients_per_round", 0),
                                         ("checkpoint_every", -1), ("rounds", 2.5), ("seed", -3),
                                         ("fola_gamma", math.nan), ("hidden_units", "8,x"),
                                         ("mu", "0.1")])
def test_named_flag_errors(flag, value):
  with pytest.raises(ValueError, match=f"^--{flag}"):
    driver.resolve_params({flag: value})


def test_documented_bounds_accept_their_edges():
  p = driver.resolve_params(
      dict(client_lr=1e3,
           init_scale=1e3,
           prior_scale=1e-12,
           fola_gamma=math.inf,
           rounds=3.0,
           checkpoint_every=0))
  assert p["rounds"] == 3 and type(p["rounds"]) is int and p["fola_gamma"] == math.inf

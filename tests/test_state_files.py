"""State files (`tfbfl.state_files`): exact round trips, and crafted or damaged files
(pickles with a payload, truncated, random, empty, wrong version, modified arrays)
give one clear error naming the file and never run code."""

import collections
import io
import json
import os
import pickle
import tempfile
import zipfile

import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import numpy as np
import pytest

from tfbfl import client_store
from tfbfl import gaussian
from tfbfl import state_files
from tfbfl import tff_learning

Plain = collections.namedtuple("Plain", ["a", "b"])


class _Payload:
  """Unpickling this would create `marker` (a stand-in for `os.system(...)`)."""

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return (open, (self.marker, "w"))


def _nested():
  return dict(round=3,
              wall_time_s=1.25,
              nan=float("nan"),
              inf=float("inf"),
              big=2**90,
              none=None,
              text="é client",
              flag=True,
              server_state=Plain(a=gaussian.NaturalGaussian([np.ones((2, 3), np.float32)],
                                                            [np.full((2, 3), 4.0, np.float32)]),
                                 b=np.int32(7)),
              clients={
                  0: [np.arange(5, dtype=np.int64), np.float32(0.5)],
                  3: (np.zeros((0, 4)),)
              },
              rows=[dict(round=1, server_accuracy=0.25, mt_accuracy=np.float64(0.5))],
              ordered=collections.OrderedDict([("z", 1), ("a", np.bool_(False))]),
              strings=np.array(["a", "bc"]),
              half=np.array([1.5, -2.0], np.float16),
              fortran=np.asfortranarray(np.arange(6.0).reshape(2, 3)))


def _assert_same(a, b, path="$"):
  assert type(a) is type(b) or (hasattr(a, "_fields") and type(a).__name__ == type(b).__name__ and
                                a._fields == b._fields), (path, type(a), type(b))
  if isinstance(a, np.ndarray):
    assert a.dtype == b.dtype and a.shape == b.shape, path
    np.testing.assert_array_equal(a, b, err_msg=path)
  elif isinstance(a, np.generic):
    assert a.dtype == b.dtype and (a == b or (a != a and b != b)), path
  elif isinstance(a, dict):
    assert list(a) == list(b), path
    for k in a:
      _assert_same(a[k], b[k], f"{path}[{k!r}]")
  elif isinstance(a, (list, tuple)):
    assert len(a) == len(b), path
    for i, (x, y) in enumerate(zip(a, b)):
      _assert_same(x, y, f"{path}[{i}]")
  elif isinstance(a, float) and a != a:
    assert b != b, path
  else:
    assert a == b, path


def test_round_trip_is_exact(tmp_path):
  tree = _nested()
  path = str(tmp_path / "s.npz")
  state_files.save(path, tree, meta=dict(round=3, flags=dict(lr=0.1, gamma=float("inf"), h=[8])))
  got, meta = state_files.load(path)
  _assert_same(tree, got)
  assert meta == dict(round=3, flags=dict(lr=0.1, gamma=float("inf"), h=[8]))
  assert state_files.read_meta(path) == meta
  # tfbfl namedtuples come back as their own class; others as namedtuples of the
  # same fields (never imported by name).
  assert type(got["server_state"].a) is gaussian.NaturalGaussian
  assert got["server_state"]._fields == ("a", "b")
  # A plain numpy .npz that numpy itself reads without pickles.
  with np.load(path, allow_pickle=False) as z:
    assert "__manifest__" in z.files


def test_real_algorithm_namedtuples_keep_their_class(tmp_path):
  from tfbfl.algorithms import fedavg  # pylint: disable=g-import-not-at-top

  state = fedavg.ServerState(*[np.float32(i) for i in range(len(fedavg.ServerState._fields))])
  state_files.save(str(tmp_path / "s.npz"), [state])
  got, _ = state_files.load(str(tmp_path / "s.npz"))
  assert type(got[0]) is fedavg.ServerState


def test_unknown_namedtuple_name_is_not_imported(tmp_path):
  path = str(tmp_path / "s.npz")
  state_files.save(path, Plain(1, 2))
  _rewrite_manifest(path, lambda m: m["structure"].update(name="os:system"))
  got, _ = state_files.load(path)
  assert got == (1, 2) and got._fields == ("a", "b") and type(got).__name__ == "system"


def test_refuses_what_it_cannot_store_before_writing(tmp_path):
  path = tmp_path / "s.npz"
  for bad in (np.array([object()], dtype=object), {"x": _Payload(tmp_path / "m")}, {1, 2}):
    with pytest.raises(TypeError, match="cannot store"):
      state_files.save(str(path), bad)
  assert os.listdir(tmp_path) == []


def test_save_is_atomic(tmp_path, monkeypatch):
  path = str(tmp_path / "s.npz")
  state_files.save(path, dict(v=np.ones(3)))

  def crash(src, dst):
    raise OSError("disk full")

  monkeypatch.setattr(state_files.os, "replace", crash)
  with pytest.raises(OSError, match="disk full"):
    state_files.save(path, dict(v=np.zeros(3)))
  monkeypatch.undo()
  np.testing.assert_array_equal(state_files.load(path)[0]["v"], np.ones(3))
  assert os.listdir(tmp_path) == ["s.npz"]


# --------------------------------------------------------------- bad files
def _one_line_error(path, match, exc=ValueError):
  with pytest.raises(exc, match=match) as info:
    state_files.load(str(path))
  message = str(info.value)
  assert str(path) in message and "\n" not in message, message
  return message


def _valid(tmp_path, name="s.npz"):
  path = tmp_path / name
  state_files.save(str(path), _nested(), meta=dict(round=3))
  return path


def _rewrite_zip(path, change):
  """Rewrites the archive with `change(name, bytes) -> bytes` applied to members."""
  with zipfile.ZipFile(path) as z:
    members = [(n, z.read(n)) for n in z.namelist()]
  with zipfile.ZipFile(path, "w") as z:
    for n, data in members:
      z.writestr(n, change(n, data))


def _rewrite_manifest(path, edit):

  def change(name, data):
    if name != "__manifest__.npy":
      return data
    raw = np.lib.format.read_array(io.BytesIO(data))
    manifest = json.loads(raw.tobytes())
    edit(manifest)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(json.dumps(manifest).encode(), np.uint8))
    return buf.getvalue()

  _rewrite_zip(path, change)


def test_crafted_pickle_is_never_executed(tmp_path):
  marker = tmp_path / "marker"
  for name in ("checkpoint.npz", "client_0.npz"):
    path = tmp_path / name
    with open(path, "wb") as f:
      pickle.dump({"round": 1, "x": _Payload(marker)}, f, protocol=4)
    _one_line_error(path, "pickle, which tfbfl never loads")
    assert not marker.exists()
  # The disk store refuses it the same way.
  store = client_store.DiskClientStore(str(tmp_path))
  with pytest.raises(ValueError, match="client_0.npz.*pickle"):
    store[0]  # pylint: disable=pointless-statement
  assert not marker.exists()


def test_pickled_object_array_inside_the_archive_is_never_executed(tmp_path):
  marker = tmp_path / "marker"
  path = _valid(tmp_path)

  def change(name, data):
    if name != "a0.npy":
      return data
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    return buf.getvalue()

  _rewrite_zip(path, change)
  _one_line_error(path, "corrupted member a0.*[Oo]bject arrays cannot be loaded")
  assert not marker.exists()


def test_legacy_pickle_client_states_are_never_loaded(tmp_path):
  marker = tmp_path / "marker"
  snap = tmp_path / "client_states_r000001"
  snap.mkdir()
  with open(snap / "client_0.pkl", "wb") as f:
    pickle.dump(_Payload(marker), f)
  store = client_store.DiskClientStore(str(tmp_path / "client_states"))
  with pytest.raises(ValueError, match=r"client_0\.pkl.*never loaded"):
    store.restore(str(snap))
  os.link(snap / "client_0.pkl", tmp_path / "client_states" / "client_0.pkl")
  assert 0 not in store and len(store) == 0
  with pytest.raises(KeyError):
    store[0]  # pylint: disable=pointless-statement
  store.clear()  # a fresh run removes old pickles
  assert os.listdir(tmp_path / "client_states") == []
  assert not marker.exists()


def test_empty_random_truncated_files(tmp_path):
  empty = tmp_path / "empty.npz"
  empty.write_bytes(b"")
  _one_line_error(empty, "empty file")
  rand = tmp_path / "random.npz"
  rand.write_bytes(np.random.default_rng(0).bytes(3000))
  _one_line_error(rand, "not a tfbfl state file")
  valid = _valid(tmp_path).read_bytes()
  for cut in (10, len(valid) // 2, len(valid) - 30):
    truncated = tmp_path / f"cut{cut}.npz"
    truncated.write_bytes(valid[:cut])
    _one_line_error(truncated, "truncated or corrupted")
  _one_line_error(tmp_path / "missing.npz", "no such state file", FileNotFoundError)
  with pytest.raises(ValueError, match="not a regular file"):
    state_files.load(str(tmp_path))


def test_wrong_version_format_and_structure(tmp_path):
  path = _valid(tmp_path)
  _rewrite_manifest(path, lambda m: m.update(version=2))
  _one_line_error(path, "format version 2, this tfbfl reads version 1")
  path = _valid(tmp_path, "b.npz")
  _rewrite_manifest(path, lambda m: m.update(format="other"))
  _one_line_error(path, "not a tfbfl state file")
  path = _valid(tmp_path, "c.npz")
  _rewrite_manifest(path, lambda m: m.update(structure={"t": "exec", "v": []}))
  _one_line_error(path, "unknown node type")
  path = _valid(tmp_path, "d.npz")
  _rewrite_manifest(path, lambda m: m.update(structure={"t": "array", "k": "a999"}))
  _one_line_error(path, "missing array|not referenced")
  path = _valid(tmp_path, "e.npz")
  _rewrite_manifest(path, lambda m: m["arrays"].pop("a0"))
  _one_line_error(path, "members do not match the manifest")
  plain = tmp_path / "plain.npz"
  np.savez(plain, x=np.ones(3))
  _one_line_error(plain, "no __manifest__ member")


def test_checksum_mismatch(tmp_path):
  path = _valid(tmp_path)

  def change(name, data):  # same dtype and shape, other values, valid zip CRCs
    if name != "a0.npy":
      return data
    a = np.lib.format.read_array(io.BytesIO(data))
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a + 1 if a.dtype.kind in "iuf" else a[::-1])
    return buf.getvalue()

  _rewrite_zip(path, change)
  _one_line_error(path, "checksum mismatch in array a0")


def test_stale_temporaries_are_removed(tmp_path):
  (tmp_path / ".tmp-state-abc.npz").write_bytes(b"half")
  (tmp_path / ".tmp-snapshot-x").mkdir()
  (tmp_path / ".tmp-snapshot-x" / "client_0.npz").write_bytes(b"")
  (tmp_path / "keep.txt").write_text("mine")
  removed = state_files.remove_stale_temporaries(str(tmp_path))
  assert sorted(removed) == [".tmp-snapshot-x", ".tmp-state-abc.npz"]
  assert os.listdir(tmp_path) == ["keep.txt"]
  assert state_files.remove_stale_temporaries(str(tmp_path / "nope")) == []


# ------------------------------------------------------------ property tests
_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=5),
    hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0,
                                                     max_side=3)),
    hnp.from_dtype(np.dtype(np.float32)).map(np.float32))
_trees = st.recursive(
    _leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.tuples(kids, kids),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-5, 5)), kids, max_size=3),
        st.builds(Plain, kids, kids)),
    max_leaves=12)


@hypothesis.settings(max_examples=int(os.environ.get("TFBFL_FUZZ_EXAMPLES", 0)) or 80,
                     deadline=None,
                     database=None,
                     derandomize=not os.environ.get("TFBFL_FUZZ_RANDOM"),
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(tree=_trees, flip=st.integers(0, 10**6), byte=st.integers(1, 255))
def test_any_tree_round_trips_and_any_flipped_byte_is_caught(tree, flip, byte):
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "s.npz")
    state_files.save(path, tree)
    got, _ = state_files.load(path)
    _assert_same(tree, got)
    data = bytearray(open(path, "rb").read())
    data[flip % len(data)] ^= byte
    with open(path, "wb") as f:
      f.write(data)
    try:
      again, _ = state_files.load(path)
    except ValueError as e:
      assert "s.npz" in str(e) and "\n" not in str(e)
    else:  # the byte was in a part nobody reads (zip metadata): the contents are intact
      _assert_same(tree, again)


def test_a_type_recorded_under_a_renamed_module_loads_as_the_class():
  """Files written before issue 33's renames name `tfbfl.learning:ProcessState` and the
  like; they load into the class under its new module, not into a look-alike."""
  fields = tuple(tff_learning.ProcessState._fields)
  assert state_files._namedtuple_type("tfbfl.learning:ProcessState",
                                      fields) is tff_learning.ProcessState
  assert state_files._namedtuple_type("tfbfl.tff_learning:ProcessState",
                                      fields) is tff_learning.ProcessState
  look_alike = state_files._namedtuple_type("tfbfl.nowhere:ProcessState", fields)
  assert look_alike is not tff_learning.ProcessState and look_alike._fields == fields

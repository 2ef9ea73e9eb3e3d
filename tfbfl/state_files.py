"""State files that cannot execute code: `.npz` arrays plus a JSON manifest.

Checkpoints (`tfbfl.round_loop`) and stored client states (`tfbfl.client_store`)
are nested Python structures of numpy arrays and scalars, strings, lists,
tuples, dicts, OrderedDicts and namedtuples (`ServerState`, `ClientState`,
`tfbfl.gaussian.NaturalGaussian`, ...). `save(path, tree, meta=...)` writes
such a structure as ONE file, a plain numpy `.npz` archive:

* every array (and every numpy scalar, as a 0-d array) is a member `a<N>`,
  written with `np.lib.format` (never pickled: object arrays are refused);
* the member `__manifest__` is a uint8 array holding UTF-8 JSON:
  `{"format": "tfbfl-state", "version": 1, "meta": ..., "structure": ...,
  "arrays": {"a<N>": {"dtype", "shape", "sha256"}}}`. `structure` is a JSON
  tree whose leaves are JSON scalars or references to array members;
  namedtuples are recorded by module, name and field names.

Guarantees:

* Loading never runs code named by the file. Arrays are read with
  `allow_pickle=False`; namedtuple types are looked up, never imported: a type
  registered with `register_namedtuple`, or a namedtuple class defined in an
  already imported `tfbfl` or `tensorflow_federated` module with exactly the
  recorded fields; any other
  name becomes a plain `collections.namedtuple` with the recorded fields.
* `load` validates everything before it returns: the file is a zip archive,
  the format and version are known, every array's dtype, shape and sha256
  checksum match the manifest, no member is missing or unexpected, and the
  structure is well formed. Any failure is one `ValueError` (or
  `FileNotFoundError`) whose message names the file and says what is wrong
  (empty, truncated, not a state file, a pickle, wrong version, checksum
  mismatch, ...).
* `save` is atomic: the archive is written to a temporary file
  (`.tmp-state-*`) in the destination directory, flushed and fsynced, then
  renamed over `path`, and the directory is fsynced. A crash leaves either the
  old file or the new one, plus at most a stale temporary file, which
  `remove_stale_temporaries` deletes.
* A round trip is exact: arrays keep dtype, shape and bytes; numpy scalars
  stay numpy scalars of their dtype; Python floats (incl. NaN and +-inf),
  ints (any size), bools, str and None are restored as such; list/tuple/dict/
  OrderedDict/namedtuple containers keep their type and order.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import io
import json
import keyword
import math
import os
import shutil
import sys
import tempfile
import types
import zipfile
from typing import Any, Dict, Optional, Tuple

import numpy as np

from tfbfl import files

FORMAT = "tfbfl-state"
VERSION = 1
MANIFEST = "__manifest__"
TMP_PREFIX = ".tmp-"
# Array kinds a state may hold (no object arrays, no void/structured records).
_ALLOWED_KINDS = frozenset("biufcUSmM")

# Packages whose already imported namedtuple classes are re-created by name.
_TRUSTED_MODULE_ROOTS = ("tfbfl", "tensorflow_federated")

_REGISTRY: Dict[str, type] = {}


def register_namedtuple(cls: type) -> type:
  """Makes `cls` (a namedtuple class) the type re-created for its name on load.

  Usable as a class decorator. Types defined in an imported `tfbfl` module are
  found without registration; register types defined elsewhere.
  """
  if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
    raise TypeError(f"register_namedtuple needs a namedtuple class, got {cls!r}.")
  _REGISTRY[_type_name(cls)] = cls
  return cls


def _type_name(cls: type) -> str:
  return f"{cls.__module__}:{cls.__qualname__}"


def _is_namedtuple(x) -> bool:
  return isinstance(x, tuple) and isinstance(getattr(type(x), "_fields", None), tuple)


# Modules renamed since state files recorded their types (issue 33): a file written
# before a rename still loads into the class, found under its new module.
MOVED_MODULES = {"tfbfl.experiment": "tfbfl.round_loop", "tfbfl.training": "tfbfl.driver",
                 "tfbfl.learning": "tfbfl.tff_learning", "tfbfl.state_io": "tfbfl.state_files",
                 "tfbfl.run_dir": "tfbfl.run_directory",
                 "tfbfl.matching.pfnm": "tfbfl.matching.single_layer",
                 "tfbfl.experiments.pfnm": "reproduction.pfnm_figures",
                 "tfbfl.experiments.pfnm_figures": "reproduction.pfnm_figures"}


def _namedtuple_type(name: str, fields: Tuple[str, ...]) -> type:
  """The class for a recorded namedtuple, found without importing anything."""
  module_name, _, qualname = name.partition(":")
  name = f"{MOVED_MODULES.get(module_name, module_name)}:{qualname}"
  cls = _REGISTRY.get(name)
  if cls is None:
    module_name, _, qualname = name.partition(":")
    trusted = module_name.split(".")[0] in _TRUSTED_MODULE_ROOTS
    module = sys.modules.get(module_name) if trusted else None
    obj = module
    for part in qualname.split(".") if module is not None else ():
      # The namespace dict, not getattr: no module __getattr__ (lazy import) runs.
      obj = vars(obj).get(part) if isinstance(obj, (type, types.ModuleType)) else None
    if isinstance(obj, type) and issubclass(obj, tuple) and getattr(obj, "_fields", None) == fields:
      cls = obj
  if cls is not None and tuple(cls._fields) == fields:
    return cls
  # Unknown: a plain namedtuple with the same fields (no code of the file runs).
  short = name.rpartition(":")[2].rpartition(".")[2]
  ok = short.isidentifier() and not keyword.iskeyword(short)
  return _plain_namedtuple(short if ok else "State", fields)


@functools.lru_cache(maxsize=None)
def _plain_namedtuple(name: str, fields: Tuple[str, ...]) -> type:
  return collections.namedtuple(name, fields)


# -------------------------------------------------------------------- encode
class _Encoder:
  """Turns a structure into (JSON tree, {key: array})."""

  def __init__(self, allow_arrays: bool = True):
    self.arrays: Dict[str, np.ndarray] = {}
    self.allow_arrays = allow_arrays

  def _array(self, a: np.ndarray, scalar: bool, path: str):
    if not self.allow_arrays:
      raise TypeError(f"state_files: meta may hold only JSON scalars, lists and dicts; "
                      f"got an array at {path}.")
    if a.dtype.kind not in _ALLOWED_KINDS or a.dtype.hasobject:
      raise TypeError(f"state_files: cannot store dtype {a.dtype} at {path} (object and "
                      "structured arrays are not supported).")
    key = f"a{len(self.arrays)}"
    self.arrays[key] = _contiguous(a)
    return {"t": "scalar" if scalar else "array", "k": key}

  def encode(self, x, path: str = "$"):
    if x is None or isinstance(x, (bool, str)):
      return x
    if isinstance(x, int) and type(x) is int:  # pylint: disable=unidiomatic-typecheck
      return x
    if type(x) is float:  # pylint: disable=unidiomatic-typecheck
      if math.isfinite(x):
        return x
      return {"t": "float", "v": repr(x)}  # 'nan', 'inf', '-inf'
    if isinstance(x, np.generic):
      return self._array(np.asarray(x), True, path)
    if isinstance(x, np.ndarray):
      return self._array(x, False, path)
    if hasattr(x, "numpy") and callable(x.numpy):  # tf.Tensor / tf.Variable
      value = x.numpy()
      return self.encode(value if isinstance(value, np.ndarray) else np.asarray(value), path)
    if _is_namedtuple(x):
      cls = type(x)
      return {
          "t": "namedtuple",
          "name": _type_name(cls),
          "fields": list(cls._fields),
          "v": [self.encode(v, f"{path}.{f}") for f, v in zip(cls._fields, x)]
      }
    if isinstance(x, (list, tuple)):
      if type(x) not in (list, tuple):
        raise TypeError(f"state_files: cannot store {type(x).__name__} at {path}.")
      return {
          "t": "list" if isinstance(x, list) else "tuple",
          "v": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(x)]
      }
    if isinstance(x, dict):
      tag = "odict" if isinstance(x, collections.OrderedDict) else "dict"
      keys = list(x.keys())
      return {
          "t": tag,
          "k": [self.encode(k, f"{path}<key>") for k in keys],
          "v": [self.encode(x[k], f"{path}[{k!r}]") for k in keys]
      }
    raise TypeError(f"state_files: cannot store a {type(x).__module__}.{type(x).__qualname__} "
                    f"at {path}; states hold arrays, scalars, str, lists, tuples, dicts "
                    "and namedtuples only.")


# -------------------------------------------------------------------- decode
class _Decoder:

  def __init__(self, arrays: Dict[str, np.ndarray], where: str):
    self.arrays, self.where, self.used = arrays, where, set()

  def fail(self, what: str):
    raise ValueError(f"{self.where}: malformed structure in the manifest ({what}).")

  def decode(self, node, depth: int = 0):
    if depth > 200:
      self.fail("nested deeper than 200 levels")
    if node is None or isinstance(node, (bool, str, int, float)):
      return node
    if not isinstance(node, dict) or not isinstance(node.get("t"), str):
      self.fail(f"unexpected node {str(node)[:60]!r}")
    tag = node["t"]
    if tag in ("array", "scalar"):
      key = node.get("k")
      if key not in self.arrays:
        self.fail(f"reference to a missing array {str(key)[:40]!r}")
      self.used.add(key)
      a = self.arrays[key]
      if tag == "scalar":
        if a.ndim != 0:
          self.fail(f"scalar {key} has shape {a.shape}")
        return a[()]
      return a
    if tag == "float":
      if node.get("v") not in ("nan", "inf", "-inf"):
        self.fail(f"bad float {str(node.get('v'))[:20]!r}")
      return float(node["v"])
    values = node.get("v")
    if not isinstance(values, list):
      self.fail(f"{tag} without a value list")
    items = [self.decode(v, depth + 1) for v in values]
    if tag == "list":
      return items
    if tag == "tuple":
      return tuple(items)
    if tag == "namedtuple":
      name, fields = node.get("name"), node.get("fields")
      if (not isinstance(name, str) or not isinstance(fields, list) or len(fields) != len(items) or
          not all(
              isinstance(f, str) and f.isidentifier() and not f.startswith("_") and
              not keyword.iskeyword(f) for f in fields) or len(set(fields)) != len(fields)):
        self.fail(f"bad namedtuple {str(name)[:60]!r}")
      return _namedtuple_type(name, tuple(fields))(*items)
    if tag in ("dict", "odict"):
      keys = node.get("k")
      if not isinstance(keys, list) or len(keys) != len(items):
        self.fail(f"{tag} keys do not match its values")
      try:
        pairs = [(_hashable(self.decode(k, depth + 1)), v) for k, v in zip(keys, items)]
      except TypeError:
        self.fail("unhashable dict key")
      return (collections.OrderedDict if tag == "odict" else dict)(pairs)
    self.fail(f"unknown node type {tag[:20]!r}")


def _hashable(k):
  hash(k)
  return k


# ---------------------------------------------------------------------- save
def _contiguous(a: np.ndarray) -> np.ndarray:
  # Not np.ascontiguousarray, which turns 0-d arrays into 1-d ones.
  return a if a.flags.c_contiguous else np.array(a, order="C")


def _sha256(a: np.ndarray) -> str:
  return hashlib.sha256(_contiguous(a).tobytes()).hexdigest()


fsync_dir = files.fsync_dir


def save(path: str,
         tree: Any,
         *,
         meta: Optional[Dict[str, Any]] = None,
         fsync: bool = True,
         mode: Optional[int] = None) -> None:
  """Writes `tree` (and the JSON-scalar dict `meta`) to `path` atomically.

  Args:
    path: destination file (conventionally `.npz`); its directory must exist.
    tree: nested arrays / scalars / str / None / lists / tuples / dicts /
      OrderedDicts / namedtuples. tf.Tensors are stored as numpy arrays.
    meta: small dict of JSON values (str, int, float incl. inf/NaN, bool,
      None, lists, dicts) readable cheaply with `read_meta`.
    fsync: flush the file and its directory to disk (durable across power
      loss); False trades that for speed.
    mode: file permissions (default: 0o666 minus the umask, as `open` gives).

  Raises:
    TypeError: `tree` holds something else (an object array, a custom class),
      before anything is written.
    tfbfl.files.FileWriteError: the write failed (no space, permissions, a
      read-only file system, the directory gone): one line naming `path` (and, for
      a full disk, what the file needs and what is free); `path` is unchanged.
  """
  enc = _Encoder()
  structure = enc.encode(tree)
  meta_tree = _Encoder(allow_arrays=False).encode(dict(meta or {}), "meta")
  manifest = {
      "format": FORMAT,
      "version": VERSION,
      "meta": meta_tree,
      "structure": structure,
      "arrays": {
          k: {
              "dtype": a.dtype.str,
              "shape": list(a.shape),
              "sha256": _sha256(a)
          } for k, a in enc.arrays.items()
      }
  }
  manifest_bytes = json.dumps(manifest, allow_nan=False, separators=(",", ":")).encode("utf-8")
  members = dict(enc.arrays)
  members[MANIFEST] = np.frombuffer(manifest_bytes, dtype=np.uint8)
  directory = os.path.dirname(os.path.abspath(path))
  tmp = None
  try:
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + "state-", suffix=".npz", dir=directory)
    with os.fdopen(fd, "wb") as f:
      _write_npz(f, members)
      if fsync:
        f.flush()
        os.fsync(f.fileno())
    if mode is None:
      mode = 0o666 & ~files.umask()
    os.chmod(tmp, mode)  # mkstemp makes 0600
    os.replace(tmp, path)
    tmp = None
  except BaseException as e:
    files.remove_quietly(tmp)
    failed = files.write_error(e, path, _archive_bytes(members)) if isinstance(e, OSError) else None
    if failed is not None and failed is not e:
      raise failed from e
    raise
  if fsync:
    fsync_dir(directory)


def _write_npz(f, members: Dict[str, np.ndarray]) -> None:
  """`np.savez(f, **members)`'s archive (stored, zip64 members of `.npy` arrays, no
  pickles), closed on every path: `np.savez` leaves its zip file open when a write
  fails, and its finalizer then prints "Exception ignored ... seek of closed file"."""
  with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
    for key, value in members.items():
      with archive.open(key + ".npy", "w", force_zip64=True) as member:
        np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def _archive_bytes(members: Dict[str, np.ndarray]) -> int:
  """About the size of the archive of `members` (arrays, `.npy` headers, zip records)."""
  return sum(a.nbytes + 128 + 2 * (len(k) + 4) + 130 for k, a in members.items()) + 22


# ---------------------------------------------------------------------- load
def _open_checked(path: str):
  """(zipfile, manifest) of `path`, checking the file before any array is read."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such state file.")
  if not os.path.isfile(path):
    raise ValueError(f"{path}: not a regular file (a tfbfl state file is expected).")
  with open(path, "rb") as f:
    head = f.read(4)
  if not head:
    raise ValueError(f"{path}: empty file (0 bytes), not a tfbfl state file "
                     "(interrupted copy?).")
  if head[:1] == b"\x80":
    raise ValueError(f"{path}: is a Python pickle, which tfbfl never loads (a pickle can "
                     "execute code); state files are .npz archives with a JSON manifest.")
  if not head.startswith(b"PK\x03\x04"):
    raise ValueError(f"{path}: not a tfbfl state file (not an .npz/zip archive; it starts "
                     f"with {head!r}).")
  try:
    archive = zipfile.ZipFile(path)
  except Exception as e:  # pylint: disable=broad-except  (any parse failure of a damaged file)
    raise ValueError(f"{path}: truncated or corrupted state file ({str(e)[:100]}).") from None
  try:
    names = archive.namelist()
    if MANIFEST + ".npy" not in names:
      raise ValueError(f"{path}: not a tfbfl state file (no {MANIFEST} member).")
    raw = _read_member(archive, MANIFEST, path)
    if raw.dtype != np.uint8 or raw.ndim != 1:
      raise ValueError(f"{path}: bad manifest (dtype {raw.dtype}, shape {raw.shape}).")
    try:
      manifest = json.loads(raw.tobytes().decode("utf-8"),
                            parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
      raise ValueError(f"{path}: the manifest is not valid JSON ({str(e)[:80]}).") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
      raise ValueError(
          f"{path}: not a tfbfl state file (format "
          f"{str(manifest.get('format') if isinstance(manifest, dict) else None)[:40]!r}).")
    if manifest.get("version") != VERSION:
      raise ValueError(f"{path}: state file format version "
                       f"{str(manifest.get('version'))[:20]}, this tfbfl reads version "
                       f"{VERSION}.")
    specs = manifest.get("arrays")
    if not isinstance(specs, dict) or "structure" not in manifest:
      raise ValueError(f"{path}: the manifest lacks 'arrays' or 'structure'.")
    expected = {f"{k}.npy" for k in specs} | {MANIFEST + ".npy"}
    if set(names) != expected or len(names) != len(expected):
      extra, missing = sorted(set(names) - expected), sorted(expected - set(names))
      raise ValueError(f"{path}: archive members do not match the manifest (missing "
                       f"{missing[:3]}, unexpected {extra[:3]}).")
    return archive, manifest
  except BaseException:
    archive.close()
    raise


def _read_member(archive: zipfile.ZipFile, key: str, path: str) -> np.ndarray:
  try:
    with archive.open(key + ".npy") as f:
      data = f.read()
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
  except Exception as e:  # pylint: disable=broad-except  (any parse failure of a damaged file)
    raise ValueError(f"{path}: truncated or corrupted member {key} ({str(e)[:100]}).") from None


def read_meta(path: str) -> Dict[str, Any]:
  """The `meta` dict of the state file `path`, after checking its manifest
  (not its arrays: cheap; `load` checks everything).

  Raises:
    FileNotFoundError: no file at `path`.
    ValueError: naming `path`, when it is not a valid state file.
  """
  archive, manifest = _open_checked(path)
  archive.close()
  return _decode_meta(manifest, path)


def _decode_meta(manifest, path):
  meta = _Decoder({}, path).decode(manifest.get("meta", {"t": "dict", "k": [], "v": []}))
  if not isinstance(meta, dict):
    raise ValueError(f"{path}: malformed structure in the manifest (meta is not a dict).")
  return meta


def load(path: str) -> Tuple[Any, Dict[str, Any]]:
  """Reads a state file written by `save`; returns `(tree, meta)`.

  Every array is checked against the manifest (dtype, shape, sha256) and the
  structure decoded before anything is returned.

  Raises:
    FileNotFoundError: no file at `path`.
    ValueError: one line naming `path` and what is wrong, for any file that
      is not an intact state file of this format version.
  """
  archive, manifest = _open_checked(path)
  with archive:
    arrays = {}
    for key, spec in manifest["arrays"].items():
      if not isinstance(spec, dict):
        raise ValueError(f"{path}: bad manifest entry for array {key[:40]}.")
      a = _read_member(archive, key, path)
      try:
        want_dtype = np.dtype(str(spec.get("dtype")))
      except (TypeError, ValueError):
        raise ValueError(f"{path}: bad dtype in the manifest for array {key}.") from None
      if a.dtype != want_dtype or list(a.shape) != spec.get("shape"):
        raise ValueError(f"{path}: array {key} is {a.dtype}{list(a.shape)}, the manifest "
                         f"says {spec.get('dtype')}{spec.get('shape')} (corrupted).")
      if _sha256(a) != spec.get("sha256"):
        raise ValueError(f"{path}: checksum mismatch in array {key} (the file was modified "
                         "or corrupted).")
      arrays[key] = a
  decoder = _Decoder(arrays, path)
  tree = decoder.decode(manifest["structure"])
  unused = set(arrays) - decoder.used
  if unused:
    raise ValueError(f"{path}: malformed structure in the manifest (arrays "
                     f"{sorted(unused)[:3]} are not referenced).")
  return tree, _decode_meta(manifest, path)


# ------------------------------------------------------------------ cleanup
def remove_stale_temporaries(directory: str) -> list:
  """Deletes `.tmp-*` files and directories left in `directory` by an
  interrupted atomic write (call only while owning the directory, e.g. under
  the run lock). Returns the names removed; a missing directory is no error."""
  removed = []
  try:
    names = os.listdir(directory)
  except (FileNotFoundError, NotADirectoryError):
    return removed
  for name in names:
    if not name.startswith(TMP_PREFIX):
      continue
    full = os.path.join(directory, name)
    try:
      if os.path.isdir(full) and not os.path.islink(full):
        shutil.rmtree(full)
      else:
        os.unlink(full)
      removed.append(name)
    except FileNotFoundError:
      pass
  return removed


def sha256_arrays(arrays) -> str:
  """A sha256 hex digest over a sequence of arrays (dtype, shape and bytes of
  each, in order): the fingerprint of data contents."""
  h = hashlib.sha256()
  for a in arrays:
    a = _contiguous(np.asarray(a))
    h.update(f"{a.dtype.str}{a.shape};".encode())
    h.update(a.tobytes())
  return h.hexdigest()

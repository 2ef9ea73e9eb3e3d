"""Deployable results: a run's server model and every client's model as TF SavedModels.

`export_run(algorithm, server_state, client_states, out_dir)` writes

    out_dir/export.json          the manifest (below)
    out_dir/server/              SavedModel: the model metric S evaluates
    out_dir/clients/<name>/      SavedModel: client <client_id>'s model, the one
                                 metric MT evaluates for it

The round driver calls it at the end of a run with `--output_dir` (into
`<output_dir>/export`); `python -m launchers.export --output_dir=RUN` does the same
from the last `checkpoint.npz` of a run that stopped earlier
(`export_from_checkpoint`).

Each SavedModel is plain TensorFlow: its weights are variables of the SavedModel
and its graph uses core TF ops only, so `tf.saved_model.load(path)` serves it in a
process that has no tfbfl. Signature `serving_default`:

    x: the features as the algorithm's evaluation takes them,
       float32 [None, *input_shape] (int32 token ids [None, seq_len] for
       VIRTUAL's LSTM); for real data with `raw_input`, the published raw
       input instead (below: MNIST uint8 pixels, FEMNIST LEAF pixels)
    -> probabilities: float32 [None, num_classes], the model's predictive
       predictions:   int32 [None], the class the evaluation counts as the
                      prediction (the argmax of its own decision score: logits
                      for the deterministic models, log(p + 1e-12) for VIRTUAL),
                      so `mean(predictions == y)` is exactly the S or MT accuracy
                      of `summary.json`; `argmax(probabilities)` can differ from it
                      only where two classes tie in float32.

`tfbfl.export.load(path)` returns a numpy callable `x -> probabilities`.

Real data: raw input in, the loader's preprocessing inside. Where the run's data
come from a loader of a published dataset (`FederatedData.raw_input`, a
`tfbfl.data.preprocessing.RawInput`; `export_run(raw_input=...)`), `serving_default`
takes the raw input as the files hold it and applies the loader's preprocessing
inside the graph before the model:

    MNIST, PMNIST: x uint8 [None, 28, 28], the IDX pixels (0..255); the model
                   divides by 255 (PMNIST client models then apply their
                   client's pixel permutation; the server model, which S
                   evaluates on every client's permuted images, applies none)
    FEMNIST:       x float32 [None, 28, 28], LEAF's/TFF's pixels in [0, 1] with
                   1.0 the background (a LEAF JSON list of 784 reshaped
                   row-major); the model inverts them (1 - x)

and a second signature `predict_features(x)` takes the features as the
evaluation takes them (what `serving_default` takes without `raw_input`). The
manifest's `raw_input` states the preprocessing. Monte Carlo predictives keep
`predict_seeded(x, seed)` on the raw input.

Which model each file is (the algorithms' `server_predictor` / `client_predictor`
hooks compute exactly what their `evaluate` computes):

* VIRTUAL: server = the server network with the server posterior's means (with
  `eval_samples > 0`, or `samples > 0` here, the Monte Carlo predictive of that many
  forward passes); client = the client network (its posterior q_i's means and its
  private weights, with the lateral connections), as MT evaluates it.
* FedAvg, FedProx, FedPA: server = the server weights; client = the client's
  deployed weights (after its last local training; the initial model if never
  selected).
* FOLA, laplace_offline, FedCurv: server = the server mean; client = the client's
  last trained weights.
* Local: client = its own model; server = the uniform ensemble of all K clients'
  predictive distributions (the run has no server model: `export_run` gives the
  hook every client's state). Global: server = every client = the pooled model.

Monte Carlo predictives draw their noise from a seed: `serving_default` uses a fixed
seed (recorded in the manifest, from `seed`: `[seed, 0]` for the server, `[seed, i + 1]`
for client i), so equal input batches give equal outputs; the signature
`predict_seeded(x, seed)` (seed int64 [2]) takes it as an input, e.g. the
evaluation's `client_seed(run seed, -1 - round, i)` to replay an evaluation exactly.
The noise is drawn per batch (local reparameterization), so an example's output
depends on its batch.

Every SavedModel is written to a temporary directory next to its destination
(`.tmp-export-*`) and renamed into place, so an interrupted export never leaves a
half-written model. `export.json` is removed when an export starts and written
last: a directory without it holds an incomplete export. Stale temporaries are
removed by the next export.

Manifest (`export.json`, format "tfbfl-export", version 1):

    {"format": "tfbfl-export", "version": 1, "algorithm": "virtual",
     "signature": {"name": "serving_default",
                   "inputs": {"x": {"dtype": "float32", "shape": [null, 64]}},
                   "outputs": {"probabilities": {"dtype": "float32", "shape": [null, 10]},
                               "predictions": {"dtype": "int32", "shape": [null]}}},
     "num_classes": 10, "export_samples": 0, "seed": 0,
     "server": {"path": "server", "metric": "S", "model": "...", "samples": 0, ...},
     "mt_rule": "...",
     "clients": [{"client_id": "client_00", "client_index": 0,
                  "path": "clients/client_00", "metric": "MT", "samples": 0, ...}, ...],
     "run": {...}}    # what the caller adds (`info`: e.g. the round)

`clients/<name>`: the client id where it is a safe file name ([A-Za-z0-9._-], not
starting with '.'), else the cleaned id with `.<client_index>` appended; the
manifest maps ids to paths.

Hooks (what an algorithm defines to be exportable, `supports_export`):

    server_predictor(server_state, *, samples=None, seed=0) -> predictor
    client_predictor(server_state, client_state, *, samples=None, seed=0) -> predictor

returning `make_predictor(...)` modules (`samples=None`: what the evaluation
computes); an algorithm whose server model needs every client's state sets
`export_server_needs_clients = True` and takes `client_states=` (Local).

Cost (measured, bundled digits, MLP 64-100-100-10, 2 CPU cores): VIRTUAL 0.35 s
and 0.37 MB per model (the server plus one per client; most of the time is
`tf.saved_model.save`), 3.9 s for K = 10 clients (8 s with the cores busy);
FedAvg 0.1 s and 0.1 MB per model. Linear in K.

This module imports TensorFlow on first use only (the driver imports it before the
runtime starts).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np

from tfbfl import _lazy
from tfbfl import state_io

tf = _lazy.load("tensorflow")

FORMAT = "tfbfl-export"
VERSION = 1
MANIFEST = "export.json"
SERVER_DIR = "server"
CLIENTS_DIR = "clients"
SIGNATURE = "serving_default"
SEEDED_SIGNATURE = "predict_seeded"
FEATURES_SIGNATURE = "predict_features"  # with raw input: the evaluation's features
TMP_PREFIX = ".tmp-export-"
HOOKS = ("server_predictor", "client_predictor")


# ------------------------------------------------------------------ predictors
@contextlib.contextmanager
def eager_scope():
  """Makes `tf.compat.v1.executing_eagerly_outside_functions()` true inside
  graphs entered from eager code, as in any TF2 program, while the export builds
  models.

  Where TensorFlow is first imported inside `absl.app.run` (every launcher
  imports it lazily, after parsing its flags) and `TF2_BEHAVIOR` is not set in
  the environment, the stack of context switches (`tensorflow.python.eager.
  context`, TF 2.14) starts empty instead of with its base entry "eager"
  (measured: 0 entries vs 1 after a plain import; a process that imported
  TensorFlow sets TF2_BEHAVIOR=1, so programs it starts do not show it). That
  check is then false inside any graph, and Keras builds a functional model
  (`tf.keras.Input` + `Sequential`: FedAvg's and FOLA's models) with v1
  placeholders and fails ("Output tensors of a Sequential model must be the
  output of a TensorFlow `Layer`"). The missing entry is pushed for the scope and
  popped after it; nothing else changes."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top

  ctx = context.context()
  switches = ctx.context_switches
  added = ctx.executing_eagerly() and not switches.stack
  if added:
    switches.push(is_building_function=False,
                  enter_context_fn=context.eager_mode,
                  device_stack=None)
  try:
    yield
  finally:
    if added and switches.stack:
      switches.pop()


def make_predictor(forward: Callable,
                   *,
                   input_shape: Sequence[int],
                   input_dtype: str,
                   num_classes: int,
                   variables: Sequence[Any],
                   info: Optional[Dict[str, Any]] = None,
                   seeded_forward: Optional[Callable] = None,
                   default_seed: Optional[Sequence[int]] = None,
                   features=None,
                   name: str = "predictor"):
  """A `tf.Module` that `save_predictor` writes as a SavedModel (the hooks' result).

  Args:
    forward: `x -> (probabilities [n, num_classes] float32, predictions [n] int32)`,
      TF ops on tensors (traced once, with `x` of shape `[None, *input_shape]`).
      Ignored when `seeded_forward` is given.
    input_shape, input_dtype: one example's shape and dtype ("float32" or "int32").
    num_classes: width of the probabilities.
    variables: every variable `forward` reads (they become the SavedModel's
      variables; unused ones are dropped).
    info: JSON-able description of the model (goes to the manifest).
    seeded_forward: `(x, seed) -> (probabilities, predictions)` for a Monte Carlo
      predictive (`seed` int64 [2]); `serving_default` then uses `default_seed`
      and the extra signature `predict_seeded(x, seed)` takes it as an input.
    features: a predictor on the evaluation's features that this one wraps
      (`with_raw_input`); saved with it as the signature `predict_features`.
    name: module name.

  The module is callable in-process: `module(x)` -> probabilities (a tensor).
  """
  cls = _predictor_class()
  return cls(forward,
             input_shape=tuple(int(d) for d in input_shape),
             input_dtype=str(input_dtype),
             num_classes=int(num_classes),
             variables=variables,
             info=info,
             seeded_forward=seeded_forward,
             default_seed=default_seed,
             features=features,
             name=name)


_PREDICTOR_CLASS = None


def _predictor_class():
  """The predictor `tf.Module` class, defined on first use (TensorFlow loads then)."""
  global _PREDICTOR_CLASS
  if _PREDICTOR_CLASS is not None:
    return _PREDICTOR_CLASS

  class Predictor(tf.Module):
    """See `make_predictor`."""

    def __init__(self, forward, *, input_shape, input_dtype, num_classes, variables, info,
                 seeded_forward, default_seed, features, name):
      super().__init__(name=name)
      if features is not None:
        self.features = features  # tracked: saved with this module
      spec = tf.TensorSpec([None, *input_shape], tf.as_dtype(input_dtype), name="x")
      # Plain attributes (not tracked, not saved): the description and shapes.
      object.__setattr__(self, "info", dict(info or {}))
      object.__setattr__(self, "input_shape", tuple(input_shape))
      object.__setattr__(self, "input_dtype", str(input_dtype))
      object.__setattr__(self, "num_classes", int(num_classes))
      object.__setattr__(self, "seeded", seeded_forward is not None)

      def outputs(p, c):
        return {
            "probabilities": tf.ensure_shape(tf.cast(p, tf.float32), [None, num_classes]),
            "predictions": tf.ensure_shape(tf.cast(c, tf.int32), [None])
        }

      if seeded_forward is None:

        def serve(x):
          return outputs(*forward(x))

        self.serve = tf.function(serve, input_signature=[spec])
        functions = [self.serve]
      else:
        if default_seed is None:
          raise ValueError("a seeded (Monte Carlo) predictor needs `default_seed`.")
        fixed = np.asarray(default_seed, np.int64).reshape([2])
        self.info["mc_seed"] = [int(s) for s in fixed]

        def serve(x):
          return outputs(*seeded_forward(x, tf.constant(fixed)))

        def serve_seeded(x, seed):
          return outputs(*seeded_forward(x, seed))

        self.serve = tf.function(serve, input_signature=[spec])
        self.serve_seeded = tf.function(
            serve_seeded, input_signature=[spec, tf.TensorSpec([2], tf.int64, name="seed")])
        functions = [self.serve, self.serve_seeded]
      # Trace now, then keep (track) exactly the variables the graphs read.
      read = {}
      with eager_scope():
        for f in functions:
          for v in f.get_concrete_function().variables:
            read[id(v)] = v
      wanted = [v for v in variables if id(v) in read]
      wanted += [v for k, v in read.items() if k not in {id(w) for w in wanted}]
      self.weights = wanted

    def __call__(self, x):
      """Probabilities of `x` (a tensor or array), in-process."""
      if not tf.is_tensor(x):
        x = np.asarray(x, np.dtype(self.input_dtype))
      return self.serve(tf.convert_to_tensor(x, tf.as_dtype(self.input_dtype)))["probabilities"]

    @property
    def signatures(self) -> Dict[str, Any]:
      out = {SIGNATURE: self.serve}
      if self.seeded:
        out[SEEDED_SIGNATURE] = self.serve_seeded
      features = getattr(self, "features", None)
      if features is not None:
        out[FEATURES_SIGNATURE] = features.serve
      return out

  _PREDICTOR_CLASS = Predictor
  return Predictor


def with_raw_input(predictor, raw_input, client_id: Optional[str] = None):
  """`predictor` (on the evaluation's features) as a predictor on the raw input of
  `raw_input` (a `tfbfl.data.preprocessing.RawInput`): its graph applies the
  loader's preprocessing (with `client_id`'s permutation, if any) and then
  `predictor`, whose own signature stays as `predict_features`."""
  pre = lambda x: raw_input.apply_tf(x, client_id)
  unpack = lambda out: (out["probabilities"], out["predictions"])
  seeded_forward = None
  if predictor.seeded:
    seeded_forward = lambda x, seed: unpack(predictor.serve_seeded(pre(x), seed))
  info = dict(predictor.info)
  info.pop("mc_seed", None)
  info["raw_input"] = raw_input.to_json(client_id)
  return make_predictor(lambda x: unpack(predictor.serve(pre(x))),
                        input_shape=raw_input.shape,
                        input_dtype=raw_input.dtype,
                        num_classes=predictor.num_classes,
                        variables=list(predictor.weights),
                        info=info,
                        seeded_forward=seeded_forward,
                        default_seed=predictor.info.get("mc_seed"),
                        features=predictor,
                        name=f"raw_{predictor.name}")


# ---------------------------------------------------------------- writing files
def _fsync_tree(path: str) -> None:
  for root, _, files in os.walk(path):
    for name in files:
      fd = os.open(os.path.join(root, name), os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    state_io.fsync_dir(root)


def save_predictor(predictor, path: str) -> str:
  """Writes `predictor` as a SavedModel at `path` atomically: into a temporary
  directory next to it (`.tmp-export-*`), flushed, then renamed into place (an
  existing model there is replaced). Returns `path`."""
  path = os.path.abspath(path)
  parent = os.path.dirname(path)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
  old = None
  try:
    with _quiet_tensorflow_logs():
      tf.saved_model.save(predictor, tmp, signatures=predictor.signatures)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; exports get the usual mode
    _fsync_tree(tmp)
    if os.path.lexists(path):
      old = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
      os.replace(path, os.path.join(old, "previous"))
    os.replace(tmp, path)
    state_io.fsync_dir(parent)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    previous = None if old is None else os.path.join(old, "previous")
    if previous is not None and os.path.lexists(previous) and not os.path.lexists(path):
      os.replace(previous, path)  # the old model stays where it was
    raise
  finally:
    if old is not None:
      shutil.rmtree(old, ignore_errors=True)
  return path


@contextlib.contextmanager
def _quiet_tensorflow_logs():
  """TensorFlow's INFO lines of a save ("Assets written to", "Writing
  fingerprint"), which absl's logging prints in launchers, are left out."""
  loggers = [logging.getLogger(name) for name in ("tensorflow", "absl")]
  levels = [logger.level for logger in loggers]
  for logger in loggers:
    if logger.getEffectiveLevel() < logging.WARNING:
      logger.setLevel(logging.WARNING)
  absl_logging = sys.modules.get("absl.logging")
  verbosity = absl_logging.get_verbosity() if absl_logging is not None else None
  if verbosity is not None and verbosity > absl_logging.WARNING:
    absl_logging.set_verbosity(absl_logging.WARNING)
  try:
    yield
  finally:
    for logger, level in zip(loggers, levels):
      logger.setLevel(level)
    if verbosity is not None:
      absl_logging.set_verbosity(verbosity)


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def _write_json(path: str, obj) -> None:
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=directory)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(obj, f, indent=2, sort_keys=True, allow_nan=False)
      f.write("\n")
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
    state_io.fsync_dir(directory)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def remove_stale_temporaries(directory: str) -> list:
  """Removes `.tmp-export-*` entries of an interrupted export in `directory`."""
  removed = []
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return removed
  for name in names:
    if name.startswith(TMP_PREFIX):
      full = os.path.join(directory, name)
      if os.path.isdir(full) and not os.path.islink(full):
        shutil.rmtree(full, ignore_errors=True)
      else:
        os.unlink(full)
      removed.append(name)
  return removed


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class _DirNames:
  """Directory names for client ids, one at a time: the id where it is a safe file
  name ([A-Za-z0-9._-], not starting with '.', unique ignoring case), else the
  cleaned id with the client's index appended."""

  def __init__(self):
    self._used = set()

  def __call__(self, client_id: str, index: int) -> str:
    cid = str(client_id)
    name = _SAFE.sub("_", cid).lstrip(".")[:100]
    if name != cid or not name or name.lower() in self._used:
      name = f"{name or 'client'}.{int(index)}"
    while name.lower() in self._used:
      name += "_"
    self._used.add(name.lower())
    return name


def client_dir_names(client_ids: Sequence[str]) -> list:
  """The directory name of each client id under `clients/` (see `_DirNames`)."""
  namer = _DirNames()
  return [namer(cid, i) for i, cid in enumerate(client_ids)]


# ------------------------------------------------------------------ the export
def supports_export(algorithm) -> bool:
  """Whether `algorithm` has the hooks `export_run` needs."""
  return all(callable(getattr(algorithm, h, None)) for h in HOOKS)


def iter_client_states(algorithm, client_ids: Sequence[str],
                       store) -> Iterator[Tuple[str, int, Any]]:
  """`(client_id, client_index, state)` of every client in the driver's order, from a
  client-state store (a mapping index -> state; a client without a state gets
  `algorithm.initial_client_state(index)`). Loads one state at a time."""
  for i, cid in enumerate(client_ids):
    state = store.get(i) if store is not None else None
    yield str(cid), i, (algorithm.initial_client_state(i) if state is None else state)


def _check_signature(predictor, first, who):
  got = (predictor.input_shape, predictor.input_dtype, predictor.num_classes)
  if first is not None and got != first:
    raise ValueError(f"{who}'s model takes {got}, the server's {first}: every exported model "
                     "must share one signature.")
  return got


def export_run(algorithm,
               server_state,
               client_states: Iterable[Tuple[str, int, Any]],
               out_dir: str,
               *,
               samples: int = 0,
               seed: int = 0,
               info: Optional[Dict[str, Any]] = None,
               raw_input=None,
               verbose: bool = False) -> Dict[str, Any]:
  """Writes out_dir/server and out_dir/clients/<client_id>/ SavedModels; returns a small
  manifest dict (paths, input signature, which MT rule) also written to out_dir/export.json.

  Args:
    algorithm: a federated algorithm with `server_predictor` and `client_predictor`
      (`supports_export`).
    server_state: its final server state.
    client_states: `(client_id, client_index, state)` of every client, in the
      driver's order (a never-selected client with `initial_client_state(index)`;
      `iter_client_states` makes them from a client store). Consumed once, one
      state at a time, except for algorithms whose server model needs every
      client (Local's ensemble: `export_server_needs_clients`).
    out_dir: the export directory (the driver's `<output_dir>/export`).
    samples: > 0: the server model is a `samples`-sample Monte Carlo predictive
      where the algorithm is Bayesian (VIRTUAL); 0: what metric S evaluates.
    seed: seeds the Monte Carlo predictives' fixed noise (`serving_default`).
    info: JSON-able facts about the run for the manifest's "run" entry (e.g. round).
    raw_input: the data's `FederatedData.raw_input` (a
      `tfbfl.data.preprocessing.RawInput`): the models then take the raw input as
      the published files hold it and apply the loader's preprocessing inside
      (`with_raw_input`); None: they take the evaluation's features.
    verbose: print one line when done.

  Raises:
    NotImplementedError: the algorithm has no export hooks.
    ValueError: a model with another signature than the server's.
  """
  if not supports_export(algorithm):
    raise NotImplementedError(
        f"algorithm {getattr(algorithm, 'name', type(algorithm).__name__)!r} cannot be "
        f"exported: it has no {' / '.join(HOOKS)} hooks (tfbfl.export).")
  samples = int(samples or 0)
  if samples < 0:
    raise ValueError(f"--export_samples must be >= 0, got {samples}.")
  with eager_scope():
    return _export_run(algorithm, server_state, client_states, out_dir, samples, seed, info,
                       raw_input, verbose)


def _export_run(algorithm, server_state, client_states, out_dir, samples, seed, info, raw_input,
                verbose):
  raw = (lambda model, client_id=None: model) if raw_input is None else (
      lambda model, client_id=None: with_raw_input(model, raw_input, client_id))
  start = time.time()
  out_dir = os.path.abspath(out_dir)
  clients_dir = os.path.join(out_dir, CLIENTS_DIR)
  os.makedirs(clients_dir, exist_ok=True)
  for directory in (out_dir, clients_dir):
    remove_stale_temporaries(directory)
  # A directory without a manifest is an incomplete export: the old one goes first.
  if os.path.exists(os.path.join(out_dir, MANIFEST)):
    os.unlink(os.path.join(out_dir, MANIFEST))

  kwargs = dict(seed=int(seed))
  if samples > 0:
    kwargs["samples"] = samples
  needs_clients = bool(getattr(algorithm, "export_server_needs_clients", False))
  if needs_clients:
    client_states = sorted(list(client_states), key=lambda t: int(t[1]))
    kwargs["client_states"] = [s for _, _, s in client_states]
  server = raw(algorithm.server_predictor(server_state, **kwargs))
  signature = _check_signature(server, None, "the server")
  save_predictor(server, os.path.join(out_dir, SERVER_DIR))
  server_info = dict(path=SERVER_DIR, **server.info)
  server_info.setdefault("samples", 0)
  if samples > 0 and server_info["samples"] == 0:
    server_info["note"] = f"export_samples={samples} not used: the model is deterministic"
  del server, kwargs

  entries, names, namer = [], [], _DirNames()
  for cid, index, state in client_states:  # one state in memory at a time
    cid, index = str(cid), int(index)
    name = namer(cid, index)
    model = raw(algorithm.client_predictor(server_state, state, seed=int(seed)), cid)
    _check_signature(model, signature, f"client {cid!r}")
    save_predictor(model, os.path.join(out_dir, CLIENTS_DIR, name))
    entry = dict(client_id=cid, client_index=index, path=f"{CLIENTS_DIR}/{name}", **model.info)
    entry.setdefault("samples", 0)
    entries.append(entry)
    names.append(name)
    del model, state
  # Models of clients a previous export had and this one has not.
  keep = set(names)
  for name in os.listdir(clients_dir):
    full = os.path.join(clients_dir, name)
    if name not in keep and os.path.isdir(full) and os.path.exists(
        os.path.join(full, "saved_model.pb")):
      shutil.rmtree(full, ignore_errors=True)

  input_shape, input_dtype, num_classes = signature
  manifest = collections.OrderedDict(
      format=FORMAT,
      version=VERSION,
      algorithm=str(getattr(algorithm, "name",
                            type(algorithm).__name__)),
      signature=dict(name=SIGNATURE,
                     inputs=dict(x=dict(dtype=input_dtype, shape=[None, *input_shape])),
                     outputs=dict(probabilities=dict(dtype="float32", shape=[None, num_classes]),
                                  predictions=dict(dtype="int32", shape=[None]))),
      num_classes=num_classes,
      export_samples=samples,
      seed=int(seed),
      server=server_info,
      mt_rule=entries[0].get("model", "") if entries else "",
      clients=entries,
      run=_json_safe(dict(info or {})),
  )
  if raw_input is not None:
    features = dict(name=FEATURES_SIGNATURE,
                    inputs=dict(x=dict(dtype="float32", shape=[None, *raw_input.shape])))
    manifest["signature"]["features"] = features
    manifest["raw_input"] = raw_input.to_json()
    manifest["raw_input"]["permuted"] = bool(raw_input.client_permutations)
  _write_json(os.path.join(out_dir, MANIFEST), manifest)
  if verbose:
    print(
        f"exported the server model and {len(entries)} client models to {out_dir} "
        f"({time.time() - start:.1f} s)",
        flush=True)
  return json.loads(json.dumps(manifest))


def _json_safe(o):
  if isinstance(o, dict):
    return {str(k): _json_safe(v) for k, v in o.items()}
  if isinstance(o, (list, tuple)):
    return [_json_safe(v) for v in o]
  if isinstance(o, (np.integer,)):
    return int(o)
  if isinstance(o, (np.floating, float)):
    v = float(o)
    return v if np.isfinite(v) else str(v)
  if o is None or isinstance(o, (bool, int, str)):
    return o
  return str(o)


def read_manifest(out_dir: str) -> Dict[str, Any]:
  """The manifest of the export in `out_dir` (`ValueError` if it is not one)."""
  path = os.path.join(out_dir, MANIFEST)
  with open(path, encoding="utf-8") as f:
    manifest = json.load(f)
  if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
    raise ValueError(f"{path} is not a {FORMAT} version {VERSION} manifest.")
  return manifest


# --------------------------------------------------------------------- loading
def load(path: str) -> Callable[[np.ndarray], np.ndarray]:
  """The exported model at `path` (a SavedModel directory) as a numpy callable
  `x -> probabilities` ([n, *input_shape] -> [n, num_classes]), through its
  `serving_default` signature. The callable also has `predictions(x)` (the
  evaluation's predicted classes), `signature` (the TF function) and `model`
  (the loaded object)."""
  model = tf.saved_model.load(path)
  fn = model.signatures[SIGNATURE]
  spec = fn.structured_input_signature[1]["x"]
  dtype = spec.dtype.as_numpy_dtype

  def run(x):
    return fn(x=tf.constant(np.asarray(x, dtype)))

  def predict(x):
    return run(x)["probabilities"].numpy()

  predict.predictions = lambda x: run(x)["predictions"].numpy()
  predict.signature = fn
  predict.model = model  # keeps the variables alive
  predict.input_spec = spec
  return predict


# ------------------------------------------------------- from a run's checkpoint
RestoredRun = collections.namedtuple(
    "RestoredRun", ["params", "data", "algorithm", "server_state", "clients", "round"])


def restore_run(output_dir: str, *, data=None, verbose: bool = False) -> RestoredRun:
  """A run's data, algorithm and final state from `<output_dir>/checkpoint.npz`
  (`tfbfl.state_io`: never a pickle), rebuilt from the flags the checkpoint
  records, after checking that the data have not changed since (fingerprint).
  Starts the local TFF runtime (building an algorithm needs one).

  Args:
    output_dir: the run's `--output_dir`.
    data: the `FederatedData` of a run trained on data given in code
      (`training.run_training(data=...)`); None: loaded from the recorded flags.

  Raises:
    FileNotFoundError, ValueError: one line naming the checkpoint.
  """
  from tfbfl import client_store as client_store_lib  # pylint: disable=g-import-not-at-top
  from tfbfl import data as data_lib  # pylint: disable=g-import-not-at-top
  from tfbfl import experiment  # pylint: disable=g-import-not-at-top
  from tfbfl import options  # pylint: disable=g-import-not-at-top
  from tfbfl import run_dir  # pylint: disable=g-import-not-at-top
  from tfbfl import runtime  # pylint: disable=g-import-not-at-top
  from tfbfl import training  # pylint: disable=g-import-not-at-top

  output_dir = os.path.abspath(output_dir)
  path = os.path.join(output_dir, experiment.CHECKPOINT)
  if not os.path.exists(path):
    legacy = os.path.join(output_dir, experiment.LEGACY_CHECKPOINT)
    if os.path.exists(legacy):
      raise ValueError(f"{legacy} is a pickle checkpoint of an older tfbfl, which is never "
                       "loaded (a pickle can execute code).")
    raise FileNotFoundError(f"no checkpoint at {path} (run with --checkpoint_every=N to "
                            "write one).")
  meta = state_io.read_meta(path)
  if meta.get("kind") != "checkpoint" or not isinstance(meta.get("round"), int):
    raise ValueError(f"{path} is a tfbfl state file but not a checkpoint.")
  flags = dict(meta.get("flags") or {})
  unknown = sorted(k for k in flags if k not in training.DEFAULTS)
  if unknown:
    print(f"warning: {path} records flags this tfbfl does not know, ignored: {unknown}",
          file=sys.stderr,
          flush=True)
  dataset = flags.get("dataset", training.DEFAULTS["dataset"])
  if data is None and dataset not in data_lib.DATASETS:
    raise ValueError(f"the run in {output_dir} trained on data given in code "
                     f"(--dataset={dataset!r}); pass the same data: "
                     "tfbfl.export.export_from_checkpoint(output_dir, data=...).")
  # The recorded values of the settings the data do not use (e.g. npz's
  # num_clients, the file's count) are left out, as the run's own flags left them.
  skip = set(data_lib.IGNORED_SETTINGS.get(dataset, ()))
  if data is not None:
    skip |= set(options.option_fields(data_lib.DataSpec))
  given = {k: v for k, v in flags.items() if k in training.DEFAULTS and k not in skip}
  # Where the run kept things is not needed: the states come from the checkpoint.
  given.update(output_dir=None, resume=False, overwrite=False, client_store="memory")
  if data is not None:
    given["num_clients"] = len(data.client_ids)
  p = training.resolve_params(given)
  fd = training.load_data(p) if data is None else data
  p["dataset"] = dataset
  p["num_clients"] = len(fd.client_ids)
  fingerprint = run_dir.data_fingerprint(fd)
  if meta.get("data_fingerprint") != fingerprint:
    raise ValueError(f"the data changed since checkpoint {path} was written (data fingerprint "
                     f"{str(meta.get('data_fingerprint'))[:12]}..., now {fingerprint[:12]}...).")
  state, meta = state_io.load(path)
  if (not isinstance(state, dict) or state.get("round") != meta["round"] or
      "server_state" not in state):
    raise ValueError(f"{path} is a tfbfl state file but not a checkpoint.")
  if "clients" in state:
    clients = dict(state["clients"])
  else:
    snapshot = state.get("client_snapshot")
    if not isinstance(snapshot, str) or snapshot != client_store_lib.snapshot_name(state["round"]):
      raise ValueError(f"{path} names a bad client-state snapshot {snapshot!r:.60}.")
    directory = os.path.join(output_dir, snapshot)
    if not os.path.isdir(directory):
      raise FileNotFoundError(f"client-state snapshot {directory} of {path} does not exist.")
    clients = client_store_lib.DiskClientStore(directory)  # read only here
  runtime.set_local_runtime()
  algorithm = training.build_algorithm(fd, p)
  if verbose:
    print(f"restored {algorithm.name} at round {state['round']} from {path}", flush=True)
  return RestoredRun(p, fd, algorithm, state["server_state"], clients, int(state["round"]))


def recorded_export_samples(output_dir: str) -> int:
  """The run's `--export_samples` (checkpoints do not record it): from
  `summary.json`'s flags, else `flags.txt`; 0 where neither has it."""
  try:
    with open(os.path.join(output_dir, "summary.json"), encoding="utf-8") as f:
      value = json.load(f).get("flags", {}).get("export_samples")
    if value is not None:
      return int(value)
  except (OSError, ValueError, AttributeError, TypeError):
    pass
  try:
    with open(os.path.join(output_dir, "flags.txt"), encoding="utf-8") as f:
      for line in f:
        m = re.match(r"^--export_samples=(\d+)\s*$", line)
        if m:
          return int(m.group(1))
  except OSError:
    pass
  return 0


def export_from_checkpoint(output_dir: str,
                           *,
                           export_dir: Optional[str] = None,
                           samples: Optional[int] = None,
                           data=None,
                           verbose: bool = True) -> Dict[str, Any]:
  """`export_run` of the run in `output_dir` from its last checkpoint (what
  `python -m launchers.export` runs). Holds the run directory's lock meanwhile, so
  a run still writing there is refused.

  Args:
    output_dir: the run's `--output_dir`.
    export_dir: where to write (default `<output_dir>/export`, as the driver).
    samples: `export_run`'s `samples`; None: the run's `--export_samples`
      (`recorded_export_samples`).
    data: the data of a run trained on data given in code (see `restore_run`).
  """
  from tfbfl import run_dir  # pylint: disable=g-import-not-at-top

  output_dir = os.path.abspath(output_dir)
  if not os.path.isdir(output_dir):
    raise FileNotFoundError(f"--output_dir={output_dir} is not a directory.")
  lock = run_dir.RunLock(output_dir)
  lock.acquire()
  try:
    run = restore_run(output_dir, data=data, verbose=verbose)
    if samples is None:
      samples = recorded_export_samples(output_dir)
    info = dict(round=run.round, source=os.path.join(output_dir, "checkpoint.npz"))
    return export_run(run.algorithm,
                      run.server_state,
                      iter_client_states(run.algorithm, run.data.client_ids, run.clients),
                      export_dir or os.path.join(output_dir, "export"),
                      samples=samples,
                      seed=int(run.params["seed"]),
                      info=info,
                      raw_input=getattr(run.data, "raw_input", None),
                      verbose=verbose)
  finally:
    lock.release()

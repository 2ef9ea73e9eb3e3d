"""A model as a plain-TensorFlow SavedModel: build one, write it atomically, load it.

`make_predictor(forward, ...)` wraps an algorithm's forward pass as a `tf.Module`
(the algorithms' `server_predictor` / `client_predictor` hooks return one);
`save_predictor(module, path)` writes it as a SavedModel; `load(path)` serves one
as a numpy callable. A run's export (`tfbfl.export`) is made of these.

Each SavedModel is plain TensorFlow: its weights are variables of the SavedModel
and its graph uses core TF ops only, so `tf.saved_model.load(path)` serves it in a
process that has no tfbfl. Signature `serving_default`:

    x -> probabilities: float32 [None, num_classes], the model's predictive
         predictions:   int32 [None], the class the evaluation counts as the
                        prediction (the argmax of its own decision score)

A Monte Carlo predictive also has `predict_seeded(x, seed)` (seed int64 [2]);
`serving_default` then uses a fixed seed (`default_seed`, a variable of the
SavedModel, recorded in `info` as `mc_seed`). `with_raw_input` puts a loader's
preprocessing in front of a predictor (`serving_default` on the raw input,
`predict_features` on the features).

This module imports TensorFlow on first use only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

from tfbfl import _lazy
from tfbfl import files

tf = _lazy.load("tensorflow")

SIGNATURE = "serving_default"
SEEDED_SIGNATURE = "predict_seeded"
FEATURES_SIGNATURE = "predict_features"  # with raw input: the evaluation's features
TMP_PREFIX = ".tmp-export-"


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


@contextlib.contextmanager
def saving_scope():
  """The context `tf.saved_model.save` traces a module's functions in (default
  `tf.saved_model.SaveOptions`).

  A `tf.function`'s traces are keyed by, among others, the variable policy of the
  save context around the call (TF 2.14, `function_context.make_function_context`),
  so a function traced outside such a context is traced again when saved.
  `make_predictor` traces in this scope and `save_predictor` reuses those traces
  (docs/performance.md, "Export"). Inside a save already under way it adds nothing."""
  from tensorflow.python.saved_model import save_context  # pylint: disable=g-import-not-at-top

  if save_context.in_save_context():
    yield
    return
  with save_context.save_context(tf.saved_model.SaveOptions()):
    yield


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
                   source: Any = None,
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
    source: what the code that made the module needs to assign another model into
      it later (e.g. the network whose variables `forward` reads); kept as
      `module.source`, not saved. See `Predictor.describe`.
    name: module name.

  The module is callable in-process: `module(x)` -> probabilities (a tensor).
  Its functions read `variables` when called, so values assigned to them later
  (followed by `describe`) are the model it serves and saves, without a new trace.
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
             source=source,
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
                 seeded_forward, default_seed, features, source, name):
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
      object.__setattr__(self, "source", source)

      def outputs(p, c):
        return {
            "probabilities": tf.ensure_shape(tf.cast(p, tf.float32), [None, num_classes]),
            "predictions": tf.ensure_shape(tf.cast(c, tf.int32), [None])
        }

      if seeded_forward is None:

        def serve(x):
          return outputs(*forward(x))

        self.serve = tf.function(serve, input_signature=[spec], autograph=False)
        functions = [self.serve]
      else:
        # A variable, so that `describe` can give the traced graphs another seed.
        self.default_seed = tf.Variable(np.zeros([2], np.int64),
                                        trainable=False,
                                        name="default_seed")
        self.describe(self.info, default_seed)

        def serve_seeded(x, seed):
          return outputs(*seeded_forward(x, seed))

        self.serve_seeded = tf.function(
            serve_seeded, input_signature=[spec, tf.TensorSpec([2], tf.int64, name="seed")],
            autograph=False)

        # Calls the seeded function rather than tracing the forward pass a second time.
        def serve(x):
          return self.serve_seeded(x, self.default_seed.read_value())

        self.serve = tf.function(serve, input_signature=[spec], autograph=False)
        functions = [self.serve_seeded, self.serve]
      # Trace now, as saving will (`saving_scope`), then keep (track) exactly the
      # variables the graphs read.
      read = {}
      with eager_scope(), saving_scope():
        for f in functions:
          for v in f.get_concrete_function().variables:
            read[id(v)] = v
      if self.seeded:
        read.pop(id(self.default_seed), None)  # saved as `default_seed`, not a weight
      wanted = [v for v in variables if id(v) in read]
      wanted += [v for k, v in read.items() if k not in {id(w) for w in wanted}]
      self.weights = wanted

    def describe(self, info: Dict[str, Any], default_seed: Optional[Sequence[int]] = None):
      """Sets the description (`info`) and, for a Monte Carlo predictive, the fixed
      seed of `serving_default` (`default_seed`, recorded in `info` as `mc_seed`).
      The code that made this module calls it after assigning another model's
      values to its variables (the algorithms' export hooks, given `reuse=`), so
      that one trace serves every client of a run. Returns the module."""
      info = dict(info)
      if self.seeded:
        if default_seed is None:
          raise ValueError("a seeded (Monte Carlo) predictor needs `default_seed`.")
        fixed = np.asarray(default_seed, np.int64).reshape([2])
        self.default_seed.assign(fixed)
        info["mc_seed"] = [int(s) for s in fixed]
      elif default_seed is not None:
        raise ValueError("`default_seed` is for a seeded (Monte Carlo) predictor only.")
      object.__setattr__(self, "info", info)
      return self

    def __call__(self, x):
      """Probabilities of `x` (a tensor or array), in-process."""
      if not tf.is_tensor(x):
        x = np.asarray(x, np.dtype(self.input_dtype))
      with saving_scope():  # the context of the traces made above: no new trace
        return self.serve(tf.convert_to_tensor(x, tf.as_dtype(
            self.input_dtype)))["probabilities"]

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


# ---------------------------------------------------------------- writing
def _fsync_tree(path: str) -> None:
  for root, _, names in os.walk(path):
    for name in names:
      fd = os.open(os.path.join(root, name), os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    files.fsync_dir(root)


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
    with _quiet_tensorflow_logs(), eager_scope():  # as `make_predictor` traced
      tf.saved_model.save(predictor, tmp, signatures=predictor.signatures)
    os.chmod(tmp, 0o777 & ~files.umask())  # mkdtemp makes 0700; exports get the usual mode
    _fsync_tree(tmp)
    if os.path.lexists(path):
      old = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
      os.replace(path, os.path.join(old, "previous"))
    os.replace(tmp, path)
    files.fsync_dir(parent)
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



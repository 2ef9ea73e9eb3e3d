"""Deployable results: a run's server model and every client's model as TF SavedModels.

`export_run(algorithm, server_state, client_states, out_dir)` writes

    out_dir/export.json          the manifest (below)
    out_dir/server/              SavedModel: the model metric S evaluates
    out_dir/clients/<name>/      SavedModel: client <client_id>'s model, the one
                                 metric MT evaluates for it

The round driver calls it at the end of a run with `--output_dir` (into
`<output_dir>/export`); `python -m launchers.export --output_dir=RUN` does the same
from the last `checkpoint.npz` of a run that stopped earlier
(`tfbfl.restore.export_from_checkpoint`).

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

`tfbfl.predictor.load(path)` (also `tfbfl.export.load`) returns a numpy callable
`x -> probabilities`.

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

* VIRTUAL: server = the server network's Monte Carlo predictive of `eval_samples`
  forward passes (the default 10; `samples > 0` here asks for that many), at the
  server posterior's means with `eval_samples == 0`; client = the client network (its
  posterior q_i and its private weights, with the lateral connections), the same way,
  as MT evaluates it. Both run the evaluation's function
  (`virtual.evaluation.predictive`).
* FedAvg, FedProx, FedPA: server = the server weights; client = the client's
  deployed weights (after its last local training; the initial model if never
  selected).
* FOLA, laplace_offline, FedCurv: server = the server mean; client = the client's
  last trained weights.
* Local: client = its own model; server = the uniform ensemble of all K clients'
  predictive distributions (the run has no server model: `export_run` gives the
  hook every client's state). Global: server = every client = the pooled model.

Monte Carlo predictives draw their noise from a seed: `serving_default` uses a fixed
seed (recorded in the manifest as `mc_seed`, from `seed`: `[seed, 0]` for the server,
`[seed, i + 1]` for client i), the seed the evaluation draws S and MT from
(`virtual.evaluation.predictive_seed`); the signature `predict_seeded(x, seed)` (seed
int64 [2]) takes it as an input. The noise is keyed by the example
(`tfbfl.layers.base.example_keyed_noise`): an example's noise in each pass is a
function of the seed, the pass and the example's features, not of its place in a
batch, so an example's probabilities do not depend on the batch it comes in (up to
float rounding of the batch's matrix products), and the server model on the pooled
test set, in any batch size, gives the S of `summary.json`, each client model on its
test set its MT (measured: docs/library.md, "Deploying a trained model").

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
    client_predictor(server_state, client_state, *, samples=None, seed=0,
                     reuse=None) -> predictor

returning `tfbfl.predictor.make_predictor(...)` modules (`samples=None`: what the evaluation
computes); an algorithm whose server model needs every client's state sets
`export_server_needs_clients = True` and takes `client_states=` (Local). `reuse` is
the previous client's predictor: a hook may assign this client's model into it
instead of tracing a new one (VIRTUAL does: one trace of its client network a run).

Linear in K: one predictor saved per model (measured seconds: docs/performance.md,
"Export").

The models themselves are `tfbfl.predictor` modules; this module writes a run's set
of them and its manifest. It imports TensorFlow on first use only (the driver
imports it before the runtime starts).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import time
from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np

from tfbfl import files
from tfbfl import predictor as predictor_lib
from tfbfl.algorithms import base

FORMAT = "tfbfl-export"
VERSION = 1
MANIFEST = "export.json"
SERVER_DIR = "server"
CLIENTS_DIR = "clients"
HOOKS = base.hook_members(base.SupportsExport)
# The predictor's names, re-exported: an export's files are predictors.
SIGNATURE = predictor_lib.SIGNATURE
SEEDED_SIGNATURE = predictor_lib.SEEDED_SIGNATURE
FEATURES_SIGNATURE = predictor_lib.FEATURES_SIGNATURE
TMP_PREFIX = predictor_lib.TMP_PREFIX
load = predictor_lib.load


# ---------------------------------------------------------------- writing files
def _write_json(path: str, obj) -> None:
  files.atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n",
                          prefix=TMP_PREFIX)


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
  """Whether `algorithm` has the hooks `export_run` needs (`base.SupportsExport`)."""
  return isinstance(algorithm, base.SupportsExport)


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
  with predictor_lib.eager_scope():
    return _export_run(algorithm, server_state, client_states, out_dir, samples, seed, info,
                       raw_input, verbose)


def _export_run(algorithm, server_state, client_states, out_dir, samples, seed, info, raw_input,
                verbose):
  raw = (lambda model, client_id=None: model) if raw_input is None else (
      lambda model, client_id=None: predictor_lib.with_raw_input(model, raw_input, client_id))
  start = time.time()
  out_dir = os.path.abspath(out_dir)
  clients_dir = os.path.join(out_dir, CLIENTS_DIR)
  os.makedirs(clients_dir, exist_ok=True)
  for directory in (out_dir, clients_dir):
    predictor_lib.remove_stale_temporaries(directory)
  # A directory without a manifest is an incomplete export: the old one goes first.
  if os.path.exists(os.path.join(out_dir, MANIFEST)):
    os.unlink(os.path.join(out_dir, MANIFEST))

  kwargs = dict(seed=int(seed))
  if samples > 0:
    kwargs["samples"] = samples
  needs_clients = bool(algorithm.export_server_needs_clients)
  if needs_clients:
    client_states = sorted(list(client_states), key=lambda t: int(t[1]))
    kwargs["client_states"] = [s for _, _, s in client_states]
  server = raw(algorithm.server_predictor(server_state, **kwargs))
  signature = _check_signature(server, None, "the server")
  predictor_lib.save_predictor(server, os.path.join(out_dir, SERVER_DIR))
  server_info = dict(path=SERVER_DIR, **server.info)
  server_info.setdefault("samples", 0)
  if samples > 0 and server_info["samples"] == 0:
    server_info["note"] = f"export_samples={samples} not used: the model is deterministic"
  del server, kwargs

  entries, names, namer = [], [], _DirNames()
  previous = None  # the previous client's model: the hook may assign the next one into it
  for cid, index, state in client_states:  # one state in memory at a time
    cid, index = str(cid), int(index)
    name = namer(cid, index)
    previous = algorithm.client_predictor(server_state, state, seed=int(seed), reuse=previous)
    model = raw(previous, cid)
    _check_signature(model, signature, f"client {cid!r}")
    predictor_lib.save_predictor(model, os.path.join(out_dir, CLIENTS_DIR, name))
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



"""tfbfl's algorithms as `tff.learning` processes over `tff.simulation` client data.

`build_process(name, source, **settings)` returns, for every algorithm that
declares the hook `tfbfl.algorithms.base.SupportsLearningProcess` (VIRTUAL, FOLA,
FedAvg, FedProx, FedPA; `build_virtual_process` etc. are shorthands), a
`tff.learning.templates.LearningProcess` (so a `tff.templates.IterativeProcess`):

    state = process.initialize()                               # ProcessState @SERVER
    state, metrics = process.next(state, client_inputs)        # LearningProcessOutput
    weights = process.get_model_weights(state)                 # tff.learning.models.ModelWeights
    state = process.set_model_weights(state, weights)

They are built from the algorithm classes' own TFF computations, not from a
copy of their maths: `next` calls the algorithm's round computation
(its `learning_round`: `VirtualAlgorithm.next_per_client`, `FolaAlgorithm.next`,
`FedAvgAlgorithm.next`, signature `(server_state@SERVER, client_states@CLIENTS, seeds@CLIENTS,
data@CLIENTS)`) inside one federated computation that adds only what the driver
(`tfbfl.round_loop`) does outside TFF: the clients' seeds, their states, and
turning a client's `tf.data.Dataset` into the `(x, y)` tensors the algorithms
train on.

#### Your own model

`build_process(name, federated_data, model_fn=my_model, ...)` (or `model=`) trains
`my_model`, a zero-argument callable returning an *uncompiled* Keras `Sequential`
or functional model whose output is the logits, as `tff.learning` takes a
`model_fn` (but returning the Keras model itself, not a
`tff.learning.models.VariableModel`: the algorithms bring their own loss,
cross-entropy on the logits, and optimizers). It is called once to check it
against the data's shapes (`tfbfl.models.template`), then rebuilt from its
config with every initializer seeded by `seed`. Without it, the built-in network
of `architecture` / `hidden_units` (as `launchers.train --model=MODULE:FUNCTION`
and `--architecture`).

#### Client data

`process.next`'s second argument is placed at CLIENTS; each client's member is
a `ClientInput(client_index, data)`:

* `data`: a `tf.data.Dataset` of *batches* `(x, y)`, `x` `[b, *input_shape]`
  (float32), `y` `[b]` (int32): what `to_client_data(federated_data)` (a
  `tff.simulation.datasets.ClientData`) yields, or any dataset with that element
  type (`ds.map(lambda d: (d["pixels"], d["label"])).batch(20)` for TFF's own
  datasets). The client concatenates its batches in order and trains on the
  result with the algorithm's own minibatch schedule (`batch_size`, `epochs`,
  stateless per-client shuffles): the dataset's batching does not change what
  is learnt, only how the data travel.
* `client_index`: the client's position in `federated_data.client_ids` (int32).
  The algorithms need it: every client's minibatch order and sampling noise is
  drawn from the driver's stateless seed `[seed, round * 1_000_003 + index]`
  (`tfbfl.algorithms.base.client_seed`), and VIRTUAL's client state (below) is
  keyed by it. `client_inputs(client_data, ids)` builds the list.

So a round of a process equals a round of `tfbfl.round_loop.ExperimentRunner` on
the same clients (`tests/test_tff_learning.py` checks it; measured on digits: the
same server posterior / weights to the last bit). Any `tff.simulation` loop
works, e.g. `tff.simulation.run_training_process(process, lambda r:
client_inputs(client_data, ids_of_round(r)), total_rounds)`. VIRTUAL runs one
TFF client computation per client (`next_per_client`): `clients_per_group` is
not used.

#### Client state: what each process keeps, and what a user loses

* VIRTUAL: a client's state is its site factor `s_i` (the cavity of its next
  round is `s / s_i`) and its private network; both change what the client
  learns, so VIRTUAL cannot honestly be run with stateless clients. The process
  keeps every client's state *at SERVER*, stacked over the K clients, in
  `ProcessState.clients`: a selected client receives its own row with
  `tff.federated_select` (not the others'), trains, and its new state returns
  through a `tff.federated_aggregate` that writes its row. The server posterior
  is then exactly the driver's. What a user loses against a deployment: the
  private networks and site factors are no longer private (whoever holds the
  process state sees them), the state grows with K (every client's factor and
  private network; fine for tens or hundreds of clients, not for millions), and
  the TFF signature shows the state traffic as server <-> client communication
  (a device would keep its row; `VirtualAlgorithm.round_bytes` counts what
  VIRTUAL really sends). The stored rows are the driver's client-state store:
  `evaluate` uses them for the MT metric.
* FOLA and FedAvg: a client's state is only its last trained model (the MT
  metric's deployed model) and, for FOLA, its Fisher; neither is read by the
  next round's training. So these processes are *stateless clients*: every
  selected client gets `algorithm.initial_client_state(index)`, its output
  states are dropped, and the server state is exactly the driver's. What a user
  loses: the per-client deployed models, so `evaluate` reports S (the server
  model) only, no MT.

Execution: a sync context, e.g. `tfbfl.runtime.set_local_runtime()`. A VIRTUAL
process with `aggregator="secure_sum"` runs under `tfbfl.aggregators.
secure_sum_context(...)` like the algorithm itself (checked by hand: the
posterior then differs from the plain sum's by the quantisation, 3e-5); the multi-worker
(`RemoteRuntime`) context is not supported (federated_select /
federated_aggregate state rows are not split into mergeable subrounds here).

#### Example

```python
from tfbfl import data, round_loop, tff_learning, runtime
runtime.set_local_runtime()
fd = data.load_federated("digits", num_clients=4, seed=0)
client_data = tff_learning.to_client_data(fd)
process = tff_learning.build_virtual_process(fd, hidden_units=(32,), epochs=2, clients_per_round=2)
state = process.initialize()
for r in range(1, 4):
  ids = round_loop.sample_clients(0, r, 4, 2)
  state, metrics = process.next(state, tff_learning.client_inputs(client_data, ids))
  print(r, tff_learning.evaluate(process, state, fd)["server_accuracy"])
```
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tfbfl import models
from tfbfl.algorithms import base  # (importing the package registers every algorithm)
from tfbfl.algorithms import fedavg
from tfbfl.algorithms import registry
from tfbfl.data import FederatedData

ClientInput = collections.namedtuple("ClientInput", ["client_index", "data"])
ClientInput.__doc__ = """One client's member of `process.next`'s CLIENTS argument:
`client_index` (int32, position in `FederatedData.client_ids`) and `data` (a
`tf.data.Dataset` of `(x, y)` batches)."""

ProcessState = collections.namedtuple("ProcessState", ["algorithm", "clients", "round_num"])
ProcessState.__doc__ = """The state of a tfbfl learning process (placed at SERVER).

`algorithm`: the algorithm's own server state (e.g. VIRTUAL's `ServerState(
posterior, aggregator_state, round_num)`, FOLA's `FolaServerState`, FedAvg's
`ServerState`), exactly what `tfbfl.round_loop` keeps. `clients`: VIRTUAL: every
client's `ClientState`, each leaf stacked over the K clients (row i = client i;
never-selected clients hold their initial state); stateless processes: `()`.
`round_num`: rounds done (int32); round `round_num + 1` is next."""

DEFAULT_BATCH_SIZE = 32



# --------------------------------------------------------------- structures
def _leaves(value) -> list:
  """Tensor leaves of a nested Python / TFF structure, in TFF's order."""
  try:
    struct = tff.structure.from_container(value, recursive=True)
  except TypeError:  # a tensor / array
    return [value]
  return tff.structure.flatten(struct)


def _leaf_types(type_spec) -> List[tff.TensorType]:
  out = []
  tff.types.structure_from_tensor_type_tree(out.append, type_spec)
  return out


def _pack(type_spec, leaves):
  """`leaves` packed as `type_spec`, with the type's Python containers."""
  leaves = list(leaves)
  it = iter(leaves)
  return tff.types.structure_from_tensor_type_tree(lambda _: next(it), type_spec)


def _stacked_type(type_spec, k: int):
  """`type_spec` with a leading axis of size `k` on every leaf."""
  return tff.to_type(
      tff.types.structure_from_tensor_type_tree(
          lambda t: tff.TensorType(t.dtype, (k,) + tuple(t.shape)), type_spec))


def _constant(type_spec, value):
  """A no-argument `tff.tensorflow.computation` returning `value` (a Python
  structure of arrays shaped like `type_spec`) as `type_spec`."""
  types = _leaf_types(type_spec)
  leaves = [np.asarray(v) for v in _leaves(value)]
  if len(leaves) != len(types):
    raise ValueError(f"value has {len(leaves)} leaves, type {type_spec} has {len(types)}.")
  leaves = [np.asarray(v, dtype=t.dtype) for v, t in zip(leaves, types)]

  @tff.tensorflow.computation
  def constant():
    return _pack(type_spec, [tf.constant(v) for v in leaves])

  return constant


# -------------------------------------------------------------- client data
def to_client_data(federated_data: FederatedData,
                   split: str = "train",
                   batch_size: int = DEFAULT_BATCH_SIZE) -> tff.simulation.datasets.ClientData:
  """A `tff.simulation.datasets.ClientData` of `federated_data`'s `split`.

  Client ids are `federated_data.client_ids` (same order); a client's dataset
  yields its examples in array order in batches `(x [b, *input_shape], y [b])`
  of at most `batch_size` (`FederatedData.to_client_data` batched), the element
  type the processes of this module take.
  """
  if isinstance(batch_size, bool) or not isinstance(batch_size,
                                                    (int, np.integer)) or batch_size < 1:
    raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
  batch_size = int(batch_size)
  return federated_data.to_client_data(split).preprocess(lambda ds: ds.batch(batch_size))


def client_inputs(client_data: tff.simulation.datasets.ClientData,
                  clients: Sequence[Any]) -> List[ClientInput]:
  """`process.next`'s CLIENTS argument for `clients` of `client_data`.

  Args:
    client_data: e.g. `to_client_data(federated_data)`; a client's index is its
      position in `client_data.client_ids` (which must be the
      `FederatedData.client_ids` order the process was built with).
    clients: client ids (str) or indices (int), e.g.
      `tfbfl.round_loop.sample_clients(seed, round, K, C)`. Each at most once.
  """
  ids = list(client_data.client_ids)
  position = {c: i for i, c in enumerate(ids)}
  out = []
  for c in clients:
    if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
      if not 0 <= int(c) < len(ids):
        raise ValueError(f"client index {c} is outside [0, {len(ids)}).")
      index = int(c)
    elif c in position:
      index = position[c]
    else:
      raise ValueError(f"unknown client {c!r}; expected an id of client_data or an index.")
    out.append(ClientInput(np.int32(index), client_data.create_tf_dataset_for_client(ids[index])))
  chosen = [int(x.client_index) for x in out]
  if len(set(chosen)) != len(chosen):
    raise ValueError(f"a client may appear once per round, got indices {chosen}.")
  return out


# ----------------------------------------------------------------- process
class TfbflLearningProcess(tff.learning.templates.LearningProcess):
  """A `tff.learning.templates.LearningProcess` over a tfbfl algorithm.

  Besides TFF's members: `algorithm` (the algorithm object, whose evaluation
  `evaluate` uses), `seed` (of the clients' stateless seeds), `num_clients`
  (K), `stateful_clients` (whether `ProcessState.clients` holds the client
  states), `client_state_type` (one client's state type).
  """

  algorithm: Any
  seed: int
  num_clients: Optional[int]
  stateful_clients: bool
  client_state_type: Any


def _build_process(algorithm) -> TfbflLearningProcess:
  """The learning process around `algorithm.learning_round` (module docstring;
  `base.SupportsLearningProcess`). The model weights are the algorithm's
  `model_weights` / `with_model_weights`, plain TF on its server state."""
  round_comp = algorithm.learning_round
  seed = algorithm.config.seed
  stateful = bool(algorithm.stateful_clients)
  num_clients = algorithm.config.num_clients if stateful else None
  params = round_comp.type_signature.parameter
  server_type, client_state_type = params[0].member, params[1].member
  data_type = params[3].member
  if not (isinstance(data_type, tff.StructType) and len(data_type) == 2):
    raise TypeError(f"the algorithm's client data must be (x, y), got {data_type}.")
  x_type, y_type = data_type[0], data_type[1]
  sequence_type = tff.SequenceType(data_type)
  input_type = tff.to_type(ClientInput(tff.TensorType(np.int32), sequence_type))
  index_type = tff.TensorType(np.int32)
  seed = int(seed)

  if stateful:
    k = int(num_clients)
    store_type = _stacked_type(client_state_type, k)
    initial_states = [algorithm.initial_client_state(i) for i in range(k)]
    store_value = [
        np.stack([np.asarray(_leaves(s)[j])
                  for s in initial_states])
        for j in range(len(_leaf_types(client_state_type)))
    ]
    clients_type, clients_value = store_type, store_value
  else:
    k = num_clients
    clients_type, clients_value = tff.StructType([]), ()
  state_type = tff.to_type(ProcessState(server_type, clients_type, index_type))
  initial_state = _constant(
      state_type, ProcessState(algorithm.initial_server_state(), clients_value, np.int32(0)))

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_eval(initial_state, tff.SERVER)

  # ------------------------------------------------------------ client side
  x_shape = tuple(x_type.shape)[1:]

  @tff.tensorflow.computation(sequence_type)
  def concatenate(dataset):
    """The client's batches, concatenated in order: `(x [n, ...], y [n])`."""
    start = (tf.zeros((0,) + x_shape, x_type.dtype), tf.zeros((0,), y_type.dtype))
    return dataset.reduce(
        start, lambda acc, batch:
        (tf.concat([acc[0], batch[0]], 0), tf.concat([acc[1], batch[1]], 0)))

  @tff.tensorflow.computation(index_type, index_type)
  def make_seed(index, rounds_done):
    """`base.client_seed(seed, rounds_done + 1, index)`."""
    r = tf.cast(rounds_done, tf.int64) + 1
    return tf.stack(
        [tf.constant(seed, tf.int64), r * base.SEED_STRIDE + tf.cast(index, tf.int64)])

  @tff.tensorflow.computation(index_type)
  def increment(rounds_done):
    return rounds_done + 1

  if stateful:
    row_types = _leaf_types(client_state_type)
    row_type = tff.to_type(tuple(row_types))
    count_type = tff.TensorType(np.int32, (k,))
    acc_type = tff.to_type((store_type, count_type))

    @tff.tensorflow.computation(index_type)
    def as_key(index):
      return tf.reshape(index, [1])

    @tff.tensorflow.computation(store_type, index_type)
    def select_row(store, key):
      check = tf.debugging.assert_less(key, k, message="client_index must be < num_clients")
      with tf.control_dependencies([check, tf.debugging.assert_non_negative(key)]):
        return tuple(tf.gather(leaf, key) for leaf in _leaves(store))

    @tff.tensorflow.computation(tff.SequenceType(row_type))
    def first_row(rows):
      start = tuple(tf.zeros(t.shape, t.dtype) for t in row_types)
      row = rows.reduce(start, lambda _, r: tuple(_leaves(r)))
      return _pack(client_state_type, _leaves(row))

    zeros = _constant(
        acc_type,
        ([np.zeros((k,) + tuple(t.shape), t.dtype) for t in row_types], np.zeros((k,), np.int32)))

    @tff.tensorflow.computation(acc_type, tff.to_type((index_type, client_state_type)))
    def accumulate(acc, item):
      store, count = acc
      index, state = item
      where = tf.reshape(index, [1, 1])
      rows = [
          tf.tensor_scatter_nd_update(s, where, tf.expand_dims(tf.cast(r, s.dtype), 0))
          for s, r in zip(_leaves(store), _leaves(state))
      ]
      return _pack(store_type, rows), tf.tensor_scatter_nd_add(count, where, [1])

    def _take(mask, new, old):
      mask = tf.reshape(mask, [k] + [1] * (new.shape.rank - 1))
      return tf.where(mask, new, old)

    @tff.tensorflow.computation(acc_type, acc_type)
    def merge(a, b):
      rows = [_take(b[1] > 0, rb, ra) for ra, rb in zip(_leaves(a[0]), _leaves(b[0]))]
      return _pack(store_type, rows), a[1] + b[1]

    @tff.tensorflow.computation(acc_type)
    def report(acc):
      return acc

    @tff.tensorflow.computation(store_type, acc_type)
    def write_rows(store, acc):
      new, count = acc
      check = tf.debugging.assert_less_equal(
          tf.reduce_max(count), 1, message="a client appeared more than once in one round")
      with tf.control_dependencies([check]):
        rows = [_take(count > 0, n, o) for n, o in zip(_leaves(new), _leaves(store))]
        return _pack(store_type, [tf.identity(r) for r in rows])

    def client_states_of(state, indices):
      keys = tff.federated_map(as_key, indices)
      rows = tff.federated_select(keys, tff.federated_value(np.int32(k - 1), tff.SERVER),
                                  state.clients, select_row)
      return tff.federated_map(first_row, rows)

    def new_store(state, indices, new_states):
      acc = tff.federated_aggregate(tff.federated_zip((indices, new_states)), zeros(), accumulate,
                                    merge, report)
      return tff.federated_map(write_rows, (state.clients, acc))
  else:
    if not _same_states(algorithm.initial_client_state(0), algorithm.initial_client_state(1)):
      raise ValueError("stateless clients need one initial client state for all clients.")
    initial_client = _constant(client_state_type, algorithm.initial_client_state(0))

    @tff.tensorflow.computation(index_type)
    def initial_client_state(index):
      del index
      return initial_client()

    def client_states_of(state, indices):
      del state
      return tff.federated_map(initial_client_state, indices)

    def new_store(state, indices, new_states):
      del indices, new_states
      return state.clients

  @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                             tff.FederatedType(input_type, tff.CLIENTS))
  def next_fn(state, client_input):
    indices = client_input.client_index
    data = tff.federated_map(concatenate, client_input.data)
    seeds = tff.federated_map(make_seed, (indices, tff.federated_broadcast(state.round_num)))
    client_states = client_states_of(state, indices)
    out = round_comp(state.algorithm, client_states, seeds, data)
    new_state = ProcessState(out[0], new_store(state, indices, out[1]),
                             tff.federated_map(increment, state.round_num))
    return tff.learning.templates.LearningProcessOutput(state=tff.federated_zip(new_state),
                                                        metrics=out[2])

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    state = _pack(state_type, _leaves(state))
    return _model_weights(*algorithm.model_weights(state.algorithm))

  weights_type = get_model_weights.type_signature.result

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, weights):
    state = _pack(state_type, _leaves(state))
    weights = _pack(weights_type, _leaves(weights))
    algorithm_state = algorithm.with_model_weights(state.algorithm, weights.trainable,
                                                   weights.non_trainable)
    return _pack(state_type, _leaves(state._replace(algorithm=algorithm_state)))

  process = TfbflLearningProcess(initialize_fn, next_fn, get_model_weights, set_model_weights)
  process.algorithm = algorithm
  process.seed = seed
  process.num_clients = k
  process.stateful_clients = stateful
  process.client_state_type = client_state_type
  return process


def _same_states(a, b) -> bool:
  la, lb = _leaves(a), _leaves(b)
  return len(la) == len(lb) and all(
      np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


# ----------------------------------------------------------------- builders
# The config fields a user's model replaces (as `tfbfl.driver` refuses their flags).
_MODEL_REPLACES = ("architecture", "hidden_units", "filters", "image_shape")


def _model_setting(settings: Dict[str, Any]):
  """Pops `model` and its `tff.learning` spelling `model_fn` from `settings`; the
  one given (None if neither)."""
  given = [key for key in ("model", "model_fn") if settings.get(key) is not None]
  if len(given) > 1:
    raise TypeError("pass the network once: model= or model_fn= (its alias), not both.")
  values = [settings.pop(key, None) for key in ("model", "model_fn")]
  return values[0] if values[0] is not None else values[1]


def _algorithm(name: str, source, settings: Dict[str, Any]):
  """The algorithm `name` from an algorithm object, its config, or a
  `FederatedData` plus config fields (`settings`; the data's shapes, K and
  `seed` are filled in as the launchers do, `registry.model_fields`). A
  `model` (or `model_fn`) setting is checked against the data's shapes
  (`tfbfl.models.template`) and the config gets the template."""
  spec = registry.get(name)
  settings = dict(settings)
  model = _model_setting(settings)
  if isinstance(source, FederatedData):
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    unknown = sorted(set(settings) - fields)
    if unknown:
      raise TypeError(f"{spec.config_cls.__name__} has no field(s) {unknown}.")
    if model is not None:
      if "model" not in fields:
        raise TypeError(f"{spec.config_cls.__name__} takes no model.")
      clash = [key for key in _MODEL_REPLACES if key in settings]
      if clash:
        raise ValueError(f"model= brings its own layers; {clash[0]}= describes a built-in "
                         "network: leave it unset.")
      if not isinstance(model, models.ModelTemplate):
        model = models.template(models.resolve_builder(model, flag="model"),
                                input_shape=source.input_shape,
                                num_classes=source.num_classes,
                                flag="model")
      settings["model"] = model
    run = {key: settings[key] for key in ("seed", "clients_per_round") if key in settings}
    kwargs = {k: v for k, v in registry.model_fields(source, run).items() if k in fields}
    kwargs.update(spec.fixed)
    kwargs.update(settings)
    return spec.build(source, spec.config_cls(**kwargs), None)
  if model is not None:
    settings["model"] = model
  if settings:
    raise TypeError(f"settings {sorted(settings)} are only taken with a FederatedData source.")
  if isinstance(source, spec.config_cls):
    return spec.build(None, source, None)
  if spec.algorithm_cls is not None and isinstance(source, spec.algorithm_cls):
    return source
  raise TypeError(f"expected a FederatedData, a {spec.config_cls.__name__} or the algorithm "
                  f"object, got {type(source).__name__}.")


def _model_weights(trainable, non_trainable=()):
  return tff.learning.models.ModelWeights(list(trainable), list(non_trainable))


def build_process(name: str, source, **settings) -> TfbflLearningProcess:
  """Algorithm `name` (`registry.names()`) as a `tff.learning.templates.LearningProcess`.

  Any algorithm whose class provides `base.SupportsLearningProcess` has one
  (today: VIRTUAL, FOLA and its offline variant, FedAvg, FedProx, FedPA); its
  module declares the hook, nothing here names it.

  Args:
    name: the algorithm's registered name.
    source: the algorithm object, its config, or a `FederatedData` with config
      fields as `settings` (e.g. `hidden_units=(32,)`, `epochs=2`,
      `clients_per_round=2`; `seed` defaults to 0), as the launchers build it.
    **settings: config fields (with a `FederatedData` only). `model=` (or
      `model_fn=`, `tff.learning`'s name) is the network, as `tff.learning`'s
      `model_fn`: a zero-argument callable returning an uncompiled Keras
      `Sequential` or functional model with logits out (or its
      `"MODULE:FUNCTION"`); it is built once and checked against the data (one
      input of the examples' shape, `num_classes` logits), then rebuilt from its
      config and seeded by `seed` (`tfbfl.models`). It replaces `architecture`,
      `hidden_units`, `filters` and `image_shape` (given with it: ValueError).
      E.g. `build_process("fedavg", fd, model_fn=my_model, epochs=2)`.

  Returns:
    A `TfbflLearningProcess`. State: `ProcessState(algorithm=the algorithm's
    server state, clients=every client's state stacked over K with stateful
    clients (VIRTUAL) else (), round_num)`. `next(state, [ClientInput])` runs the
    algorithm's `learning_round` on the selected clients with the driver's seeds;
    metrics are that computation's. Model weights: the algorithm's
    `model_weights` (VIRTUAL: the server posterior's means, whose
    `set_model_weights` keeps the precisions; FOLA: mu_S, keeping the precision
    and the penalty centre; FedAvg family: the server weights).

  Raises:
    TypeError: the algorithm has no `tff.learning` adapter, or `source` is not
      one of the above.
    tfbfl.models.ModelError: (a ValueError) the model cannot be imported, built,
      or trained on the data; the message names `model`.
  """
  spec = registry.get(name)
  if spec.algorithm_cls is None or base.SupportsLearningProcess not in spec.hooks:
    able = [s.name for s in registry.specs() if base.SupportsLearningProcess in s.hooks]
    raise TypeError(f"algorithm {name!r} has no tff.learning process (no "
                    f"base.SupportsLearningProcess hooks); these have one: {able}.")
  return _build_process(_algorithm(name, source, settings))


def build_virtual_process(source, **settings) -> TfbflLearningProcess:
  """`build_process("virtual", ...)`: VIRTUAL with stateful clients (its state
  `ProcessState(algorithm=ServerState(posterior, aggregator_state, round_num),
  clients=every client's ClientState stacked over K, round_num)`)."""
  return build_process("virtual", source, **settings)


def build_fola_process(source, **settings) -> TfbflLearningProcess:
  """`build_process("fola", ...)`: FOLA (or, by config, its offline / identity-
  Fisher variants) with stateless clients."""
  return build_process("fola", source, **settings)


def build_fedavg_process(source, **settings) -> TfbflLearningProcess:
  """`build_process("fedavg", ...)`: tfbfl's FedAvg / FedProx (by config) with
  stateless clients; a plain `ModelConfig` is taken as FedAvg's."""
  if type(source) is fedavg.ModelConfig and not settings:  # pylint: disable=unidiomatic-typecheck
    source = fedavg.FedAvgAlgorithm(source)  # the spec's config is its subclass FedAvgConfig
  return build_process("fedavg", source, **settings)


# --------------------------------------------------------------- evaluation
def client_states(process: TfbflLearningProcess, state) -> list:
  """Every client's stored state (a stateful process's `ProcessState.clients`
  unstacked: row i is client i's `ClientState`, numpy leaves)."""
  if not process.stateful_clients:
    raise ValueError("this process keeps no client states (stateless clients).")
  leaves = [np.asarray(t) for t in _leaves(state.clients)]
  return [
      _pack(process.client_state_type, [t[i] for t in leaves]) for i in range(process.num_clients)
  ]


def evaluate(process: TfbflLearningProcess,
             state,
             federated_data: FederatedData,
             split: str = "test") -> Dict[str, float]:
  """S (and, for a stateful process, MT) on `federated_data`'s `split`, with the
  algorithm's own evaluation computations and the driver's evaluation seeds.

  Returns `{server_accuracy, server_loss, num_examples}` (S: the server model on
  every client's data, example-weighted) plus `{mt_accuracy, mt_loss}` when
  the process keeps client states (MT: each client's own stored model on its
  own data; a client never selected is evaluated with its initial state).
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
  algorithm = process.algorithm
  ids = list(federated_data.client_ids)
  k = len(ids)
  if process.num_clients is not None and k != process.num_clients:
    raise ValueError(f"the process was built for {process.num_clients} clients, the data has {k}.")
  data = [(federated_data.train if split == "train" else federated_data.test)[c] for c in ids]
  seeds = [base.evaluation_seed(process.seed, i) for i in range(k)]
  server_state = state.algorithm
  if isinstance(algorithm, base.SupportsStreamedEvaluation):
    per_client = algorithm.evaluate_server(server_state, list(range(k)), seeds, data)
  else:
    states = [algorithm.initial_client_state(i) for i in range(k)]
    per_client = algorithm.evaluate(server_state, states, seeds, data)
  total = lambda rows, key: float(sum(float(r[key]) for r in rows))
  n = total(per_client, "num_examples")
  if n <= 0:
    raise ValueError(f"no {split} examples to evaluate on.")
  out = dict(server_accuracy=total(per_client, "server_correct") / n,
             server_loss=total(per_client, "server_loss") / n,
             num_examples=n)
  if process.stateful_clients and isinstance(algorithm, base.SupportsStreamedEvaluation):
    own = algorithm.evaluate_clients(client_states(process, state), list(range(k)), seeds, data)
    out.update(mt_accuracy=total(own, "mt_correct") / n, mt_loss=total(own, "mt_loss") / n)
  return out

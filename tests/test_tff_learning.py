"""tfbfl.tff_learning (our algorithms as `tff.learning` processes over `tff.simulation`
client data) and `tfbfl.aggregators.PrecisionWeightedMeanFactory` (a
`model_aggregator` for `tff.learning.algorithms.build_weighted_fed_avg`).

References: the round driver `tfbfl.round_loop.ExperimentRunner` on the same
algorithm object, clients and seeds (the processes must reproduce it), TFF's
`MeanFactory` and numpy closed forms of the precision-weighted mean.
"""

import contextlib
import io

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tfbfl import aggregators
from tfbfl import data as data_lib
from tfbfl import round_loop
from tfbfl import tff_learning
from tfbfl.algorithms import fedavg
from tfbfl.algorithms import fola

pytestmark = pytest.mark.usefixtures("tff_runtime")

# docs/library.md's snippets: executed as-is by the tests at the end of this file.
README_SNIPPET_PROCESS = """\
from tfbfl import data, round_loop, tff_learning, runtime
runtime.set_local_runtime()
fd = data.load_federated("digits", num_clients=4, seed=0)
client_data = tff_learning.to_client_data(fd)  # tff.simulation ClientData: batches of (x, y)
process = tff_learning.build_virtual_process(fd, hidden_units=(32,), epochs=5, clients_per_round=2)
state = process.initialize()  # a tff.learning.templates.LearningProcess
accuracy = [tff_learning.evaluate(process, state, fd)["server_accuracy"]]
for r in range(1, 4):
  ids = round_loop.sample_clients(0, r, 4, 2)  # the driver's sampling; any ids will do
  state, metrics = process.next(state, tff_learning.client_inputs(client_data, ids))
  accuracy.append(tff_learning.evaluate(process, state, fd)["server_accuracy"])
  print(f"round {r}: train loss {metrics['train']['train_loss']:.3f}, S accuracy {accuracy[-1]:.3f}")
"""

README_SNIPPET_AGGREGATOR = """\
import tensorflow as tf, tensorflow_federated as tff
from tfbfl import aggregators, data, tff_learning, runtime
runtime.set_local_runtime()
client_data = tff_learning.to_client_data(data.load_federated("digits", num_clients=4, seed=0))
datasets = [client_data.create_tf_dataset_for_client(c) for c in client_data.client_ids]
model_fn = lambda: tff.learning.models.from_keras_model(
    tf.keras.Sequential([tf.keras.layers.Dense(10, input_shape=(64,))]), input_spec=client_data.element_type_structure,
    loss=tf.keras.losses.SparseCategoricalCrossentropy(True), metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])
process = tff.learning.algorithms.build_weighted_fed_avg(model_fn, tff.learning.optimizers.build_sgdm(0.5),
    model_aggregator=aggregators.PrecisionWeightedMeanFactory())  # plain weights: precisions 1, i.e. FedAvg
state, accuracy = process.initialize(), []
for r in range(1, 6):
  state, metrics = process.next(state, datasets)
  accuracy.append(float(metrics["client_work"]["train"]["sparse_categorical_accuracy"]))
  print(f"round {r}: train accuracy {accuracy[-1]:.3f}")
"""

_K, _C, _SEED, _ROUNDS = 4, 2, 0, 2


@pytest.fixture(scope="module")
def digits():
  return data_lib.load_federated("digits", num_clients=_K, seed=_SEED)


@pytest.fixture(scope="module")
def client_data(digits):
  return tff_learning.to_client_data(digits, batch_size=16)


def _drive(algorithm, fd):
  """Our own driver on `algorithm`: `_ROUNDS` rounds of `_C` clients, seed `_SEED`."""
  runner = round_loop.ExperimentRunner(
      algorithm, fd,
      round_loop.RunConfig(rounds=_ROUNDS,
                           clients_per_round=_C,
                           seed=_SEED,
                           eval_every=_ROUNDS,
                           verbose=False))
  runner.run()
  return runner


def _run_process(process, client_data):
  """The same rounds through the process: the driver's client sampling."""
  state = process.initialize()
  states, all_metrics = [state], []
  for r in range(1, _ROUNDS + 1):
    ids = round_loop.sample_clients(_SEED, r, _K, _C)
    state, metrics = process.next(state, tff_learning.client_inputs(client_data, ids))
    states.append(state)
    all_metrics.append(metrics)
  return states, all_metrics


def _assert_same_tree(actual, expected, rtol=1e-6, atol=1e-7):
  a, e = tff_learning._leaves(actual), tff_learning._leaves(expected)  # pylint: disable=protected-access
  assert len(a) == len(e)
  for x, y in zip(a, e):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# ---------------------------------------------------------------- client data
def test_to_client_data_yields_the_clients_arrays_in_batches(digits, client_data):
  assert list(client_data.client_ids) == list(digits.client_ids)
  x_spec, y_spec = client_data.element_type_structure
  assert x_spec.shape.as_list() == [None, 64] and x_spec.dtype == tf.float32
  assert y_spec.shape.as_list() == [None] and y_spec.dtype == tf.int32
  cid = digits.client_ids[2]
  batches = list(client_data.create_tf_dataset_for_client(cid))
  assert max(len(b[1]) for b in batches) == 16
  np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), digits.train[cid][0])
  np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), digits.train[cid][1])
  inputs = tff_learning.client_inputs(client_data, [3, digits.client_ids[1]])
  assert [int(i.client_index) for i in inputs] == [3, 1]
  with pytest.raises(ValueError, match="once per round"):
    tff_learning.client_inputs(client_data, [1, 1])
  with pytest.raises(ValueError, match="outside"):
    tff_learning.client_inputs(client_data, [_K])


# -------------------------------------------------------------------- VIRTUAL
@pytest.fixture(scope="module")
def readme_process_run():
  """`README_SNIPPET_PROCESS` executed once (its namespace and what it printed): the
  snippet's test reads its run, and the VIRTUAL tests below take its process (VIRTUAL
  on the module's digits clients, K = 4, C = 2, seed 0, 32 hidden units, 5 epochs), so
  the module builds and traces that process once. A process holds no run's state
  (each call gets the state passed in): the snippet's rounds leave it as built."""
  return _exec(README_SNIPPET_PROCESS)


@pytest.fixture(scope="module")
def virtual_runs(readme_process_run, digits, client_data):
  process = readme_process_run[0]["process"]
  algorithm = process.algorithm
  config = algorithm.config
  assert (config.num_clients, config.clients_per_round, config.seed) == (_K, _C, _SEED)
  assert tuple(config.hidden_units) == (32,) and config.epochs == 5
  states, metrics = _run_process(process, client_data)
  return algorithm, process, states, metrics, _drive(algorithm, digits)


def test_virtual_process_is_a_learning_process_with_client_states_at_server(virtual_runs):
  algorithm, process, states, _, _ = virtual_runs
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert process.stateful_clients and process.num_clients == _K
  init = states[0]
  _assert_same_tree(init.algorithm, algorithm.initial_server_state(), rtol=0, atol=0)
  stored = tff_learning.client_states(process, init)
  for i in range(_K):
    _assert_same_tree(stored[i], algorithm.initial_client_state(i), rtol=0, atol=0)
  assert int(states[-1].round_num) == _ROUNDS


def test_virtual_process_rounds_equal_the_driver(virtual_runs):
  """Same clients and seeds: the server posterior and every stored client state
  (factor, posterior, private network) equal the driver's after each run."""
  _, process, states, _, runner = virtual_runs
  final = states[-1]
  _assert_same_tree(final.algorithm.posterior, runner.state["server_state"].posterior)
  assert int(final.algorithm.round_num) == int(runner.state["server_state"].round_num) == _ROUNDS
  stored = tff_learning.client_states(process, final)
  selected = set()
  for r in range(1, _ROUNDS + 1):
    selected |= set(round_loop.sample_clients(_SEED, r, _K, _C))
  for i in range(_K):
    expected = runner.state["clients"].get(i) if i in selected else None
    if expected is None:
      expected = process.algorithm.initial_client_state(i)
    _assert_same_tree(stored[i], expected)
    assert bool(stored[i].trained) == (i in selected)


def test_virtual_process_learns_and_evaluates_like_the_driver(virtual_runs, digits):
  _, process, states, metrics, runner = virtual_runs
  before = tff_learning.evaluate(process, states[0], digits)
  after = tff_learning.evaluate(process, states[-1], digits)
  assert after["server_accuracy"] > before["server_accuracy"] + 0.1, (before, after)
  assert metrics[-1]["num_examples"] > 0
  row = runner.rows[-1]
  assert after["server_accuracy"] == pytest.approx(row["server_accuracy"], abs=1e-6)
  assert after["mt_accuracy"] == pytest.approx(row["mt_accuracy"], abs=1e-6)


def test_virtual_model_weights_are_posterior_means(virtual_runs):
  _, process, states, _, _ = virtual_runs
  state = states[-1]
  weights = process.get_model_weights(state)
  posterior = state.algorithm.posterior
  assert len(weights.trainable) == len(posterior.eta1) and not weights.non_trainable
  for w, e1, e2 in zip(weights.trainable, posterior.eta1, posterior.eta2):
    np.testing.assert_allclose(w, np.asarray(e1) / np.asarray(e2), rtol=1e-6)
  moved = tff.learning.models.ModelWeights([np.asarray(w) + 1.0 for w in weights.trainable], [])
  new_state = process.set_model_weights(state, moved)
  for w, g in zip(moved.trainable, process.get_model_weights(new_state).trainable):
    np.testing.assert_allclose(g, w, rtol=1e-5)
  _assert_same_tree(new_state.algorithm.posterior.eta2, posterior.eta2, rtol=0, atol=0)
  _assert_same_tree(new_state.clients, state.clients, rtol=0, atol=0)


# ----------------------------------------------------------- FOLA and FedAvg
@pytest.fixture(scope="module")
def fola_runs(digits, client_data):
  algorithm = fola.FolaAlgorithm(
      fola.LaplaceConfig(input_shape=(64,),
                         num_classes=10,
                         hidden_units=(16,),
                         epochs=2,
                         batch_size=20,
                         client_lr=0.1,
                         seed=_SEED))
  process = tff_learning.build_fola_process(algorithm)
  states, metrics = _run_process(process, client_data)
  return process, states, metrics, _drive(algorithm, digits)


def test_fola_process_rounds_equal_the_driver(fola_runs, digits):
  """Stateless clients lose nothing for FOLA's training: weights, precisions and
  penalty centre equal the driver's, and so does the S metric."""
  process, states, metrics, runner = fola_runs
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert not process.stateful_clients
  final, expected = states[-1].algorithm.model, runner.state["server_state"].model
  _assert_same_tree(final.weights, expected.weights)
  _assert_same_tree(final.precision, expected.precision)
  _assert_same_tree(final.prior_mean, expected.prior_mean)
  assert int(final.round_num) == _ROUNDS
  assert float(np.max(np.abs(np.asarray(final.precision[0])))) > 0  # a Fisher was aggregated
  ev = tff_learning.evaluate(process, states[-1], digits)
  assert ev["server_accuracy"] == pytest.approx(runner.rows[-1]["server_accuracy"], abs=1e-6)
  assert "mt_accuracy" not in ev
  assert ev["server_accuracy"] > tff_learning.evaluate(process, states[0], digits)["server_accuracy"]
  weights = process.get_model_weights(states[-1])
  _assert_same_tree(weights.trainable, final.weights, rtol=0, atol=0)
  assert metrics[-1]["clients_dropped"] == 0


def test_fedavg_process_rounds_equal_the_driver(digits, client_data):
  algorithm = fedavg.FedAvgAlgorithm(
      fedavg.ModelConfig(input_dim=64, num_classes=10, hidden_units=(16,), epochs=2, seed=_SEED))
  process = tff_learning.build_fedavg_process(algorithm)
  states, _ = _run_process(process, client_data)
  runner = _drive(algorithm, digits)
  _assert_same_tree(process.get_model_weights(states[-1]),
                    runner.state["server_state"].model_weights)
  ev = tff_learning.evaluate(process, states[-1], digits)
  assert ev["server_accuracy"] == pytest.approx(runner.rows[-1]["server_accuracy"], abs=1e-6)


def test_fedpa_gets_its_process_from_its_own_hooks(digits, client_data):
  """FedPA declares no process of its own: `build_process("fedpa", ...)` finds its
  `base.SupportsLearningProcess` hooks, and its rounds equal the driver's."""
  process = tff_learning.build_process("fedpa", digits, hidden_units=(16,), epochs=3,
                                   fedpa_burn_in=1, fedpa_server_burn_in=1, seed=_SEED)
  assert process.algorithm.name == "fedpa" and not process.stateful_clients
  states, _ = _run_process(process, client_data)
  runner = _drive(process.algorithm, digits)
  _assert_same_tree(process.get_model_weights(states[-1]),
                    runner.state["server_state"].model_weights)
  ev = tff_learning.evaluate(process, states[-1], digits)
  assert ev["server_accuracy"] == pytest.approx(runner.rows[-1]["server_accuracy"], abs=1e-6)


def test_build_process_names_the_algorithms_that_have_one(digits):
  with pytest.raises(TypeError, match=r"'local' has no tff.learning process.*'fedpa'"):
    tff_learning.build_process("local", digits)


def test_builders_take_data_and_settings_and_refuse_unknown_fields(digits):
  process = tff_learning.build_fola_process(digits, hidden_units=(8,), epochs=1, seed=3)
  assert process.algorithm.config.seed == 3 and process.seed == 3
  assert process.algorithm.config.input_shape == (64,)
  with pytest.raises(TypeError, match="no field"):
    tff_learning.build_fola_process(digits, not_a_field=1)
  with pytest.raises(TypeError, match="expected a FederatedData"):
    tff_learning.build_virtual_process(object())


# ------------------------------------------------- precision-weighted mean
_SHAPES = [(3, 2), (2,)]
_WEIGHTS = [1.0, 2.0, 5.0]


def _values(seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return [[(scale * rng.normal(size=s)).astype(np.float32) for s in _SHAPES] for _ in _WEIGHTS]


def _weights_type():
  return tff.to_type([tff.TensorType(np.float32, s) for s in _SHAPES])


def _run_aggregation(process, values, weights):
  out = process.next(process.initialize(), values, [np.float32(w) for w in weights])
  return out.result, out.measurements


def test_adapter_with_equal_precisions_is_tffs_weighted_mean():
  """Plain weights (precision 1) and any common precision give MeanFactory's mean."""
  values = _values(0)
  mean, _ = _run_aggregation(
      tff.aggregators.MeanFactory().create(_weights_type(), tff.TensorType(np.float32)), values,
      _WEIGHTS)
  plain, measurements = _run_aggregation(
      aggregators.PrecisionWeightedMeanFactory().create(_weights_type(),
                                                        tff.TensorType(np.float32)), values,
      _WEIGHTS)
  for p, m in zip(plain, mean):
    np.testing.assert_array_equal(p, m)
  assert int(measurements["zero_precision"]) == 0
  common = [np.random.default_rng(1).uniform(0.1, 10.0, s).astype(np.float32) for s in _SHAPES]
  pw_type = tff.to_type(aggregators.PrecisionWeighted(_weights_type(), _weights_type()))
  out, _ = _run_aggregation(
      aggregators.PrecisionWeightedMeanFactory().create(pw_type, tff.TensorType(np.float32)),
      [aggregators.PrecisionWeighted(v, common) for v in values], _WEIGHTS)
  for got, m in zip(out.value, mean):
    np.testing.assert_allclose(got, m, rtol=2e-6, atol=1e-6)
  for got, c in zip(out.precision, common):
    np.testing.assert_allclose(got, c, rtol=1e-6)


def test_adapter_with_known_precisions_is_the_closed_form():
  """v = sum a_n lambda_n v_n / sum a_n lambda_n, Lambda = sum a_n lambda_n (numpy),
  and 0 where no client has precision."""
  values = _values(2, scale=3.0)
  rng = np.random.default_rng(3)
  precisions = [[rng.uniform(0.0, 4.0, s).astype(np.float32) for s in _SHAPES] for _ in _WEIGHTS]
  for p in precisions:  # coordinate (0, 1) of the first leaf: nobody knows anything
    p[0][0, 1] = 0.0
  pw_type = tff.to_type(aggregators.PrecisionWeighted(_weights_type(), _weights_type()))
  process = aggregators.PrecisionWeightedMeanFactory().create(pw_type, tff.TensorType(np.float32))
  out, measurements = _run_aggregation(
      process, [aggregators.PrecisionWeighted(v, p) for v, p in zip(values, precisions)], _WEIGHTS)
  a = np.asarray(_WEIGHTS, np.float64) / np.sum(_WEIGHTS)
  for j in range(len(_SHAPES)):
    lam = sum(a[n] * precisions[n][j].astype(np.float64) for n in range(len(_WEIGHTS)))
    num = sum(
        a[n] * precisions[n][j] * values[n][j].astype(np.float64) for n in range(len(_WEIGHTS)))
    expected = np.divide(num, lam, out=np.zeros_like(num), where=lam > 0)
    np.testing.assert_allclose(out.value[j], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.precision[j], lam, rtol=1e-5)
    # Not the plain weighted mean (precisions differ across clients):
    plain = sum(a[n] * values[n][j] for n in range(len(_WEIGHTS)))
    assert np.max(np.abs(expected - plain)) > 1e-2
  assert out.value[0][0, 1] == 0.0
  assert int(measurements["zero_precision"]) == 1


def test_adapter_refuses_what_it_cannot_average():
  factory = aggregators.PrecisionWeightedMeanFactory()
  with pytest.raises(TypeError, match="floating-point"):
    factory.create(tff.to_type([tff.TensorType(np.int32, (2,))]), tff.TensorType(np.float32))
  with pytest.raises(TypeError, match="same structure"):
    factory.create(
        tff.to_type(
            aggregators.PrecisionWeighted(_weights_type(), [tff.TensorType(np.float32, (3, 2))])),
        tff.TensorType(np.float32))
  assert isinstance(factory, tff.aggregators.WeightedAggregationFactory)


def _linear_client_data(num_clients=3, seed=4):
  rng = np.random.default_rng(seed)
  out = []
  for n in range(num_clients):
    size = 5 + 3 * n
    x = rng.normal(size=(size, 2)).astype(np.float32)
    y = (x @ np.array([[1.5], [-2.0]], np.float32) + 0.3 * n).astype(np.float32)
    out.append((x, y))
  return out


def _linear_fed_avg(model_aggregator, lr):

  def model_fn():
    keras_model = tf.keras.Sequential(
        [tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", input_shape=(2,))])
    return tff.learning.models.from_keras_model(keras_model,
                                                input_spec=(tf.TensorSpec([None, 2], tf.float32),
                                                            tf.TensorSpec([None, 1], tf.float32)),
                                                loss=tf.keras.losses.MeanSquaredError())

  return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(lr),
      model_aggregator=model_aggregator)


def test_adapter_in_build_weighted_fed_avg_equals_the_closed_form():
  """One round, one full-batch SGD step per client from w = 0 on MSE:
  w_1 = sum_n a_n (w_0 - lr * grad_n), a_n = n_n / N (plain weights: equal
  precisions), which is also what TFF's default MeanFactory gives."""
  lr = 0.1
  clients = _linear_client_data()
  datasets = [tf.data.Dataset.from_tensor_slices((x, y)).batch(len(y)) for x, y in clients]
  process = _linear_fed_avg(aggregators.PrecisionWeightedMeanFactory(), lr)
  state = process.initialize()
  state, metrics = process.next(state, datasets)
  got = np.asarray(process.get_model_weights(state).trainable[0])
  sizes = np.array([len(y) for _, y in clients], np.float64)
  steps = [
      -lr * (2.0 / len(y)) * x.T.astype(np.float64) @ (-y.astype(np.float64)) for x, y in clients
  ]  # w_0 = 0: grad = 2/n X^T (X w_0 - y)
  expected = sum(a * s for a, s in zip(sizes / sizes.sum(), steps))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  assert int(metrics["aggregator"]["zero_precision"]) == 0
  reference = _linear_fed_avg(tff.aggregators.MeanFactory(), lr)
  ref_state, _ = reference.next(reference.initialize(), datasets)
  np.testing.assert_allclose(got, reference.get_model_weights(ref_state).trainable[0], rtol=1e-6)


# ------------------------------------------------------------ README snippets
def _exec(snippet):
  namespace = {"__name__": "__readme__"}
  stdout = io.StringIO()
  with contextlib.redirect_stdout(stdout):
    exec(compile(snippet, "<readme>", "exec"), namespace)  # pylint: disable=exec-used
  return namespace, stdout.getvalue()


def test_readme_snippet_process_runs_and_learns(readme_process_run):
  assert 8 <= len(README_SNIPPET_PROCESS.strip().splitlines()) <= 15
  namespace, printed = readme_process_run
  assert printed.count("round ") == 3
  accuracy = namespace["accuracy"]
  assert accuracy[-1] > accuracy[0] + 0.2, accuracy
  assert isinstance(namespace["process"], tff.learning.templates.LearningProcess)


def test_readme_snippet_aggregator_runs_and_learns():
  assert 8 <= len(README_SNIPPET_AGGREGATOR.strip().splitlines()) <= 15
  namespace, printed = _exec(README_SNIPPET_AGGREGATOR)
  assert printed.count("train accuracy") == 5
  accuracy = [float(a) for a in namespace["accuracy"]]
  assert accuracy[-1] > accuracy[0] + 0.2, accuracy
  assert int(namespace["metrics"]["aggregator"]["zero_precision"]) == 0

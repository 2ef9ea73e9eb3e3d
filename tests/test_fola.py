"""Gaussian product + FOLA, offline Laplace and FedCurv (tfbfl.algorithms.fola).

The reference computations here are written independently of the module: a
closed-form Bayesian linear regression, and a hand-written SGD loop on a manual
MLP forward pass that only shares the minibatch order (`fola.shuffle_order`).
"""

import importlib
import json
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from tfbfl import compression  # noqa: E402
from tfbfl import data as data_lib  # noqa: E402
from tfbfl import round_loop  # noqa: E402
from tfbfl import gaussian  # noqa: E402
from tfbfl import driver  # noqa: E402
from tfbfl.algorithms import fola  # noqa: E402
from reproduction import fola_figures  # noqa: E402

pytestmark = pytest.mark.usefixtures("tff_runtime")

_HIDDEN = (16,)


@pytest.fixture(scope="module")
def digits():
  return data_lib.load_federated("digits",
                                 partition="label_dirichlet",
                                 alpha=0.1,
                                 num_clients=4,
                                 seed=3)


def _config(fd, **kw):
  base = dict(input_shape=fd.input_shape,
              num_classes=fd.num_classes,
              hidden_units=_HIDDEN,
              epochs=2,
              batch_size=64,
              client_lr=0.1,
              seed=1)
  base.update(kw)
  return fola.LaplaceConfig(**base)


def _mlp_logits(weights, x):
  k0, b0, k1, b1 = weights
  return tf.nn.relu(x @ k0 + b0) @ k1 + b1


def _reference_sgd(weights0, x, y, seed, epochs, batch, lr, lam=0.0, prior=None):
  """Plain SGD on mean CE + lam/2 (w - m)^T diag(P) (w - m); online Fisher of eq. 15."""
  ws = [tf.Variable(w) for w in weights0]
  n = len(y)
  order = fola.shuffle_order(seed, epochs, n).numpy()
  fisher = [np.zeros_like(w) for w in weights0]
  steps = 0
  for e in range(epochs):
    for i in range(math.ceil(n / batch)):
      idx = order[e, i * batch:(i + 1) * batch]
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[idx],
                                                           logits=_mlp_logits(ws, x[idx])))
      grads = [g.numpy() for g in tape.gradient(loss, ws)]
      for j, (w, g) in enumerate(zip(ws, grads)):
        fisher[j] += len(idx) * g**2
        if prior is not None:
          mean, prec = prior
          g = g + lam * prec[j] * (w.numpy() - mean[j])
        w.assign_sub(lr * g)
      steps += 1
  return [w.numpy() for w in ws], [f / steps for f in fisher]


def _offline_fisher(weights, x, y, batch):
  fisher, steps = [np.zeros_like(w) for w in weights], 0
  ws = [tf.constant(w) for w in weights]
  for i in range(math.ceil(len(y) / batch)):
    sl = slice(i * batch, (i + 1) * batch)
    with tf.GradientTape() as tape:
      tape.watch(ws)
      loss = tf.reduce_mean(
          tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y[sl],
                                                         logits=_mlp_logits(ws, x[sl])))
    for j, g in enumerate(tape.gradient(loss, ws)):
      fisher[j] += len(y[sl]) * g.numpy()**2
    steps += 1
  return [f / steps for f in fisher]


def _close(a, b, rtol=2e-4, atol=2e-6):
  for x, y in zip(a, b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# ----------------------------------------------------------------- server product
def _product_inputs(rng, sizes, d=6):
  means = [rng.normal(size=d).astype(np.float32) for _ in sizes]
  precs = [rng.uniform(0.1, 5.0, size=d).astype(np.float32) for _ in sizes]
  return means, precs


def _run_product(product, process, means, precs, sizes, previous):
  natural = [gaussian.NaturalGaussian([p * m], [p]) for m, p in zip(means, precs)]
  _, mean, precision, weak = product(process.initialize(), natural, [np.float32(s) for s in sizes],
                                     [previous])
  return np.asarray(mean[0]), np.asarray(precision[0]), int(weak)


def test_exact_global_posterior_for_bayesian_linear_regression():
  """Linear-Gaussian model with per-client diagonal X_n^T X_n: each client's
  diagonal Laplace posterior is exact. Client n's per-example posterior
  (mean NLL + prior / M, M = sum m_n) has Lambda_n = X_n^T X_n / (s2 m_n) + P0 / M,
  mu_n = Lambda_n^-1 X_n^T y_n / (s2 m_n). With a_n = m_n / M, the tempered
  product has mean = the global posterior mean and precision = (global
  posterior precision) / M, with the global posterior in closed form."""
  rng = np.random.default_rng(0)
  d, s2, sizes = 5, 0.25, [12, 30, 7, 21]
  total = sum(sizes)
  p0 = np.full(d, 2.0)
  w_true = rng.normal(size=d)
  xs, ys = [], []
  for m in sizes:
    q, _ = np.linalg.qr(rng.normal(size=(m, d)))  # orthonormal columns
    x = q * rng.uniform(0.2, 3.0, size=d)  # X^T X diagonal, client-specific
    xs.append(x)
    ys.append(x @ w_true + np.sqrt(s2) * rng.normal(size=m))
  means, precs = [], []
  for x, y, m in zip(xs, ys, sizes):
    lam = np.diag(x.T @ x) / (s2 * m) + p0 / total
    means.append((x.T @ y / (s2 * m)) / lam)
    precs.append(lam)
  x_all, y_all = np.concatenate(xs), np.concatenate(ys)
  global_prec = x_all.T @ x_all / s2 + np.diag(p0)
  global_mean = np.linalg.solve(global_prec, x_all.T @ y_all / s2)

  weights_type = tff.to_type([tff.TensorType(np.float32, (d,))])
  process, product = fola.build_gaussian_product(weights_type, eps=1e-8)
  mean, precision, weak = _run_product(product, process, [m.astype(np.float32) for m in means],
                                       [p.astype(np.float32) for p in precs], sizes,
                                       np.zeros(d, np.float32))
  np.testing.assert_allclose(mean, global_mean, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(precision, np.diag(global_prec) / total, rtol=1e-5)
  assert weak == 0
  # The test can tell: a plain (FedAvg) weighted mean of the means is far off.
  fedavg = sum(m * n for m, n in zip(means, sizes)) / total
  assert np.max(np.abs(fedavg - global_mean)) > 1e-2


def test_mean_invariant_to_common_precision_scale_and_epsilon_keeps_previous_mean():
  rng = np.random.default_rng(1)
  sizes = [10.0, 40.0, 25.0]
  means, precs = _product_inputs(rng, sizes)
  for p in precs:
    p[2] = 0.0  # nobody has information on entry 2
  weights_type = tff.to_type([tff.TensorType(np.float32, (6,))])
  process, product = fola.build_gaussian_product(weights_type, eps=1e-8)
  previous = np.full(6, 0.75, np.float32)
  base, base_prec, weak = _run_product(product, process, means, precs, sizes, previous)
  scaled, scaled_prec, _ = _run_product(product, process, means, [1e3 * p for p in precs], sizes,
                                        previous)
  np.testing.assert_allclose(scaled, base, rtol=1e-5)
  np.testing.assert_allclose(scaled_prec, 1e3 * base_prec, rtol=1e-5)
  # Eq. (9) by hand, and the explicit epsilon: entry 2 keeps the previous mean.
  a = np.array(sizes) / sum(sizes)
  lam = sum(ai * p for ai, p in zip(a, precs))
  want = sum(ai * p * m for ai, p, m in zip(a, precs, means)) / np.where(lam > 0, lam, 1)
  keep = np.arange(6) != 2
  np.testing.assert_allclose(base[keep], want[keep], rtol=1e-5)
  assert base[2] == pytest.approx(0.75) and np.all(np.isfinite(base)) and weak == 1
  # Scaling one client only moves the mean (so the invariance is not trivial).
  moved, _, _ = _run_product(product, process, means, [precs[0] * 1e3] + precs[1:], sizes, previous)
  assert np.max(np.abs(moved - base)) > 1e-2


# ------------------------------------------------------------------ FOLA client
def test_client_update_is_penalised_sgd_with_online_fisher_and_eq17(digits):
  algo = fola.FolaAlgorithm(_config(digits, fola_lambda=0.7))
  rng = np.random.default_rng(2)
  w0 = algo.initial_weights
  prior_mean = [w + 0.1 * rng.normal(size=w.shape).astype(np.float32) for w in w0]
  precision = [rng.uniform(0.0, 2.0, size=w.shape).astype(np.float32) for w in w0]
  model = fola.ServerModel(w0, precision, prior_mean, np.int32(2))  # round r = 3
  x, y = digits.train[digits.client_ids[1]]
  seed = np.array([5, 11], np.int64)
  out = algo.client_update(model, algo.initial_client_state(0), seed, (x, y))
  want_w, want_f = _reference_sgd(w0,
                                  x,
                                  y,
                                  seed,
                                  epochs=2,
                                  batch=64,
                                  lr=0.1,
                                  lam=0.7,
                                  prior=(prior_mean, precision))
  _close(out.client_state.weights, want_w)
  _close(out.client_state.fisher, want_f, rtol=1e-3, atol=1e-7)
  upload = [f / 3 + 2 / 3 * p for f, p in zip(want_f, precision)]  # eq. (17)
  _close(out.upload.eta2, upload, rtol=1e-3, atol=1e-7)
  _close(out.upload.eta1, [u * w for u, w in zip(out.upload.eta2, out.client_state.weights)],
         rtol=1e-5,
         atol=1e-8)
  assert float(out.num_examples) == len(y)


def test_cnn_client_update_on_digits_images(digits):
  algo = fola.FolaAlgorithm(_config(digits, architecture="cnn", epochs=1, client_lr=0.05))
  assert algo.config.image_shape == (8, 8, 1)
  shapes = [w.shape for w in algo.initial_weights]
  assert shapes[0] == (5, 5, 1, 32) and shapes[-1] == (10,) and len(shapes) == 8
  out = algo.client_update(algo.initial_server_state().model, algo.initial_client_state(0),
                           np.array([3, 4], np.int64), digits.train[digits.client_ids[0]])
  assert all(np.all(np.isfinite(w)) for w in out.client_state.weights)
  assert all(np.all(np.asarray(f) >= 0) for f in out.client_state.fisher)
  assert any(np.any(np.asarray(f) > 0) for f in out.client_state.fisher)
  assert float(out.non_finite) == 0.0


def test_offline_variant_computes_fisher_after_training(digits):
  algo = fola.FolaAlgorithm(_config(digits, fisher="offline", epochs=1))
  assert algo.name == "laplace_offline"
  state = algo.initial_server_state()
  x, y = digits.train[digits.client_ids[0]]
  out = algo.client_update(state.model, algo.initial_client_state(0), np.array([1, 2], np.int64),
                           (x, y))
  want = _offline_fisher(list(out.client_state.weights), x, y, batch=64)
  _close(out.client_state.fisher, want, rtol=1e-3, atol=1e-8)
  _close(out.upload.eta2, want, rtol=1e-3, atol=1e-8)  # r = 1: F_n alone


def _round(algo, fd, clients, seed=0, round_num=1, state=None, client_states=None):
  state = state if state is not None else algo.initial_server_state()
  client_states = client_states or [algo.initial_client_state(i) for i in clients]
  seeds = [round_loop.client_seed(seed, round_num, i) for i in clients]
  batches = [fd.train[fd.client_ids[i]] for i in clients]
  return algo.next(state, client_states, seeds, batches), seeds, batches


@pytest.fixture(scope="module")
def identity_product(digits):
  """lambda = 0 and unit precisions (the round-1 prior N(0, 0.5 I), which lambda = 0
  leaves out of every update): built once for the module's tests that compare a round
  with FedAvg's (an algorithm holds no run's state)."""
  return fola.FolaAlgorithm(_config(digits, fisher="identity", fola_lambda=0.0, fola_gamma=0.5))


def test_no_penalty_and_equal_precisions_is_a_fedavg_round(digits, identity_product):
  """lambda = 0 and unit precisions: the product is FedAvg's weighted average of
  the clients' trained weights (here: an in-test SGD and average, since
  tfbfl.algorithms.fedavg does not exist yet)."""
  algo = identity_product
  clients = [0, 1, 2, 3]
  (state, _, metrics), seeds, batches = _round(algo, digits, clients)
  trained = [
      _reference_sgd(algo.initial_weights, x, y, s, 2, 64, 0.1)[0]
      for (x, y), s in zip(batches, seeds)
  ]
  sizes = np.array([len(y) for _, y in batches], np.float64)
  fedavg = [sum(n * t[j] for n, t in zip(sizes, trained)) / sizes.sum() for j in range(4)]
  _close(state.model.weights, fedavg)
  _close(state.model.precision, [np.ones_like(w) for w in fedavg], rtol=1e-6)
  assert int(state.model.round_num) == 1 and metrics["weak_precision"] == 0


def test_fola_round_uses_precisions_and_compression(digits):
  clients = [0, 1, 2, 3]
  plain = fola.FolaAlgorithm(_config(digits, epochs=1))
  (state, new_clients, metrics), _, batches = _round(plain, digits, clients)
  weights = [np.asarray(c.weights[0]) for c in new_clients]
  fishers = [np.asarray(c.fisher[0]) for c in new_clients]
  sizes = np.array([len(y) for _, y in batches], np.float32)[:, None, None]
  lam = np.sum(sizes * np.stack(fishers), 0) / sizes.sum()
  eta1 = np.sum(sizes * np.stack(fishers) * np.stack(weights), 0) / sizes.sum()
  want = (eta1 + 1e-8 * plain.initial_weights[0]) / (lam + 1e-8)
  np.testing.assert_allclose(state.model.weights[0], want, rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(state.model.prior_mean[0], state.model.weights[0])
  dense = sum(w.nbytes for w in plain.initial_weights)
  assert plain.round_bytes(4, metrics) == (4 * 2 * dense, 4 * 2 * dense)

  p = 0.05
  comp = fola.FolaAlgorithm(_config(digits, epochs=1, compress_p=p))
  (cstate, cclients, _), _, _ = _round(comp, digits, clients)
  out = comp.client_update(plain.initial_server_state().model, comp.initial_client_state(0),
                           round_loop.client_seed(0, 1, 0), batches[0])
  for prec, fisher in zip(out.upload.eta2, out.client_state.fisher):
    np.testing.assert_allclose(prec,
                               compression.decode(compression.encode(np.asarray(fisher), p)),
                               rtol=1e-5,
                               atol=1e-9)
  up, down = comp.round_bytes(4, {})
  assert up == 4 * (dense +
                    compression.structure_bytes(comp.initial_weights, p)) and up < 4 * 2 * dense
  assert down == 4 * 2 * dense
  assert not np.allclose(cstate.model.weights[0], state.model.weights[0])


def test_diverged_clients_upload_nothing_and_server_keeps_its_weights(digits):
  algo = fola.FolaAlgorithm(_config(digits, epochs=1, client_lr=1e9))
  (state, _, metrics), _, _ = _round(algo, digits, [0, 1, 2, 3])
  assert metrics["non_finite_clients"] == 4
  _close(state.model.weights, algo.initial_weights, rtol=1e-6, atol=0)
  assert all(np.all(np.asarray(p) == 0) for p in state.model.precision)


# ---------------------------------------------------------------------- FedCurv
def test_fedcurv_server_sums_and_client_deltas(digits, identity_product):
  algo = fola.FedCurvAlgorithm(_config(digits, fedcurv_lambda=0.0))
  fedavg = identity_product  # the same training (2 epochs), unit precisions, no penalty
  (state, clients, _), _, batches = _round(algo, digits, [0, 1, 2])
  (ref, _, _), _, _ = _round(fedavg, digits, [0, 1, 2])
  _close(state.model.weights, ref.model.weights)  # lambda = 0: a FedAvg round
  u = sum(np.asarray(c.fisher[0]) for c in clients)
  v = sum(np.asarray(c.fisher[0]) * np.asarray(c.weights[0]) for c in clients)
  np.testing.assert_allclose(state.model.curvature.eta2[0], u, rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(state.model.curvature.eta1[0], v, rtol=1e-4, atol=1e-8)
  for c, (x, y) in zip(clients, batches):
    _close(c.fisher, _offline_fisher(list(c.weights), x, y, 64), rtol=1e-3, atol=1e-8)

  # Round 2 with clients 0 and 1 only: client 2's stored contribution stays,
  # 0 and 1 replace theirs (each subtracts its own old factor).
  curv = fola.FedCurvAlgorithm(_config(digits, fedcurv_lambda=5.0))
  (state2, clients2, _), _, _ = _round(curv,
                                       digits, [0, 1],
                                       round_num=2,
                                       state=state,
                                       client_states=clients[:2])
  u2 = sum(np.asarray(c.fisher[0]) for c in list(clients2) + [clients[2]])
  np.testing.assert_allclose(state2.model.curvature.eta2[0], u2, rtol=1e-4, atol=1e-8)
  (free, _, _), _, _ = _round(algo,
                              digits, [0, 1],
                              round_num=2,
                              state=state,
                              client_states=clients[:2])
  assert not np.allclose(state2.model.weights[0], free.model.weights[0])  # penalty acts


# ------------------------------------------------------------ drivers and flags
def _fedavg_available():
  try:
    importlib.import_module("tfbfl.algorithms.fedavg")
    return True
  except ModuleNotFoundError:
    return False


def test_no_penalty_and_equal_precisions_matches_registered_fedavg(digits):
  if not _fedavg_available():
    pytest.skip("tfbfl.algorithms.fedavg not available")
  p = driver.resolve_params(
      dict(algorithm="fedavg",
           hidden_units=_HIDDEN,
           epochs_per_round=2,
           batch_size=64,
           client_lr=0.1,
           seed=1))
  fedavg = driver.build_algorithm(digits, p)
  ours = fola_figures.EXTRA_METHODS["product_identity"](digits, p)
  (state, _, _), _, _ = _round(ours, digits, [0, 1, 2, 3])
  (ref, _, _), _, _ = _round(fedavg, digits, [0, 1, 2, 3])
  _close(state.model.weights, ref.model_weights.trainable, rtol=1e-5, atol=1e-6)


def test_first_round_accuracy_on_digits_alpha_0_1():
  base = dict(dataset="digits",
              num_clients=10,
              batch_size=32,
              epochs_per_round=1,
              client_lr=0.05,
              hidden_units=(32,),
              seed=0)
  lines = []
  rows = fola_figures.first_round_accuracy(base, ["fola", "fedavg", "fedcurv"], {"alpha": [0.1]},
                                           repeats=2,
                                           log=lines.append)
  stats = {s["method"]: s for s in fola_figures.summarise(rows)}
  want = {"fola", "fedcurv"} | ({"fedavg"} if _fedavg_available() else set())
  assert set(stats) == want
  if "fedavg" not in want:
    assert any("skipping fedavg" in line for line in lines)
  for s in stats.values():
    assert s["count"] == 2 and math.isfinite(s["mean"]) and 0.0 <= s["mean"] <= 1.0
  assert all(r["num_clients"] == 10 and r["alpha"] == 0.1 for r in rows)
  if "fedavg" in want:
    # FedCurv's first round has no penalty yet: it is FedAvg's round (up to
    # float rounding, at most one test example apart).
    for a, b in zip([r for r in rows if r["method"] == "fedcurv"],
                    [r for r in rows if r["method"] == "fedavg"]):
      assert a["global_accuracy"] == pytest.approx(b["global_accuracy"], abs=1 / 400)


def test_registry_run_writes_bytes_and_best_global_accuracy(tmp_path):
  params = dict(algorithm="fola",
                dataset="digits",
                partition="label_dirichlet",
                alpha=1.0,
                num_clients=3,
                clients_per_round=3,
                rounds=2,
                epochs_per_round=1,
                batch_size=64,
                hidden_units=(8,),
                output_dir=str(tmp_path),
                verbose=False,
                export=False,
                compress_p=0.1,
                fola_lambda=2.0)
  summary = driver.run_training(params)
  assert summary["bytes_up_total"] > 0 and summary["bytes_down_total"] > 0
  header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
  assert {"bytes_up", "bytes_down", "weak_precision"} <= set(header)
  fola_figures.add_best_global_accuracy(str(tmp_path))
  saved = json.loads((tmp_path / "summary.json").read_text())
  assert saved["best_global_accuracy"] == saved["best_server_accuracy"]
  assert saved["flags"]["compress_p"] == 0.1


@pytest.mark.parametrize("field,value,flag", [("fola_lambda", -1.0, "fola_lambda"),
                                              ("fola_gamma", 0.0, "fola_gamma"),
                                              ("eps", 0.0, "fola_eps"),
                                              ("compress_p", 1.5, "compress_p"),
                                              ("architecture", "rnn", "architecture"),
                                              ("clip_norm", -1.0, "fola_clip_norm"),
                                              ("epochs", 0, "epochs_per_round")])
def test_bad_flags_are_named(field, value, flag):
  with pytest.raises(ValueError, match=f"--{flag}"):
    fola.LaplaceConfig(input_shape=(64,), num_classes=10, **{field: value})
  with pytest.raises(ValueError, match="--architecture=cnn"):
    fola.LaplaceConfig(input_shape=(10,), num_classes=10, architecture="cnn")


def test_cifar10_path_names_the_missing_files(tmp_path):
  if "cifar10" not in data_lib.DATASETS:
    with pytest.raises(ValueError, match="data_batch_1"):
      fola_figures.check_dataset_available("cifar10")
  params = dict(dataset="cifar10",
                data_dir=str(tmp_path),
                architecture="cnn",
                rounds=1,
                verbose=False)
  with pytest.raises((ValueError, FileNotFoundError), match="data_batch_1"):
    fola_figures.learning_curves(params, ["fola"], [0.1], str(tmp_path / "out"))


@pytest.mark.parametrize("methods", [["fola", "bogus"], []])
def test_an_unknown_method_is_refused_before_any_run(methods, tmp_path):
  """A bad `--methods` entry fails at once, naming the flag, not after the runs of
  the methods listed before it."""
  params = dict(dataset="digits", rounds=1, verbose=False)
  with pytest.raises(ValueError, match="--methods must be a non-empty list"):
    fola_figures.learning_curves(params, methods, [0.1], str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()  # nothing ran

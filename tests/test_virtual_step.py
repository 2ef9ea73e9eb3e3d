"""The lean VIRTUAL client step (`tfbfl.algorithms.virtual.step`) against the Keras path.

The default lean step is the fused one (`fused_step`: packed parameters, one
update expression per role); `test_fused_step_equals_reference_step` checks it
against the reference `sgd_step` directly, one client and clients batched, and the
Keras comparisons below run it (and `sgd_step` where the natural precision step
is on).

The lean step draws its noise from the seeds the Keras network uses, so with the
same step seed both paths see the same normals: one SGD step agrees to float
rounding, with or without noise. Its data loss and gradient agree with the layers'
for a fixed epsilon (and for the posterior-mean pass), its analytic KL gradient with
autodiff of `kl_shared()`/`kl_private()`, and end to end it learns digits as the
Keras path does.

The equalities are checked at the default settings in graph mode (the library's
`tf.function`s, as TFF's computations run them) and at the other settings eagerly
(`eager_functions`, tests/conftest.py): the mathematics is the same, without a trace
per setting.
"""

import csv
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tfbfl import gaussian
from tfbfl import driver
from tfbfl.algorithms import registry
from tfbfl.algorithms import virtual
from tfbfl.algorithms.virtual import step as virtual_step


def _config(**kw):
  base = dict(input_dim=8,
              num_classes=3,
              num_clients=4,
              hidden_units=(6, 5),
              epochs=1,
              batch_size=16,
              jit_compile=False,
              kl_weight=0.5,
              init_scale=0.05)
  base.update(kw)
  return virtual.VirtualConfig(**base)


def _data(n=13, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, 8)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32))


def _flat(parts):
  return np.concatenate([np.reshape(np.asarray(t, np.float64), [-1]) for t in parts])


def _both_paths(cfg, x, y, seed=(3, 4)):
  post = virtual.initial_posterior(cfg)
  # A client seen before: its factor differs from s^(0)^(1/K), so the cavity and
  # the KL target are not flat.
  state = virtual.initial_client_state(cfg, 1, post)
  state = state._replace(shared_factor=gaussian.NaturalGaussian(
      [0.7 * e for e in state.shared_factor.eta1], [0.7 * e for e in state.shared_factor.eta2]))
  outs = []
  for lean in (False, True):
    c = dataclasses.replace(cfg, lean_step=lean)
    outs.append(virtual.client_update(c, post, state, tf.constant(seed, tf.int64), x, y))
  return outs


def _assert_same_update(a, b, atol, rtol=1e-4):
  # float32 summation order differs (flat vectors vs per-layer tensors); a stiff
  # step (lr 0.5, beta 50) amplifies it to ~6e-5 relative on the private weights.
  loc_a, scale_a = gaussian.to_loc_scale(a.client_state.shared_posterior)
  loc_b, scale_b = gaussian.to_loc_scale(b.client_state.shared_posterior)
  np.testing.assert_allclose(_flat(loc_b), _flat(loc_a), atol=atol, rtol=rtol)
  np.testing.assert_allclose(_flat(scale_b), _flat(scale_a), atol=atol, rtol=rtol)
  np.testing.assert_allclose(_flat(b.client_state.private),
                             _flat(a.client_state.private),
                             atol=atol,
                             rtol=rtol)
  for key in a.metrics:
    # The variance trajectories are functions of the scales: the scales' tolerance.
    tol = rtol if key.startswith("log_prec_") else 1e-5
    np.testing.assert_allclose(float(b.metrics[key]), float(a.metrics[key]), rtol=tol)
  assert float(a.dropped) == float(b.dropped) == 0.0


@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # the default objective, noise on
        dict(precision_step=0.3),  # natural precision step of the scales
        dict(server_loss_weight=0.0),  # eq. (3) alone
        dict(private=False),  # server network only
        dict(kl_weight=50.0, client_lr=0.5),  # stiff KL: proximal step matters
        dict(private_kl_weight=20.0, client_lr=0.5),  # the private KL weighted on its own
    ])
def test_one_step_matches_keras_path(kw, request):
  if kw:  # the variants eagerly, the default in graph mode (module docstring)
    request.getfixturevalue("eager_functions")
  cfg = _config(**kw)
  x, y = _data(13)  # 13 < batch_size 16: one masked step
  a, b = _both_paths(cfg, x, y)
  _assert_same_update(a, b, atol=1e-5)
  # The step moved the parameters (the comparison is not vacuous).
  post = virtual.initial_posterior(cfg)
  moved = _flat(gaussian.to_loc_scale(b.client_state.shared_posterior)[0]) - _flat(
      gaussian.to_loc_scale(post)[0])
  assert np.max(np.abs(moved)) > 1e-3


@pytest.mark.usefixtures("eager_functions")
def test_several_epochs_match_keras_path():
  cfg = _config(epochs=3, batch_size=5)  # 3 steps an epoch, the last masked
  x, y = _data(13)
  a, b = _both_paths(cfg, x, y, seed=(5, 9))
  _assert_same_update(a, b, atol=1e-4)


def _net_and_layout(cfg, seed=0):
  net = virtual.build_networks(cfg)
  post = virtual.initial_posterior(cfg)
  net.set_shared_posterior(post)
  state = virtual.initial_client_state(cfg, 2, post)
  net.set_private_weights(state.private)
  rng = np.random.default_rng(seed)
  # Random, distinct KL targets for both roles.
  prior = net.shared_prior()
  net.set_shared_prior(
      gaussian.NaturalGaussian(
          [rng.normal(size=e.shape).astype(np.float32) for e in prior.eta1],
          [rng.uniform(0.5, 50.0, size=e.shape).astype(np.float32) for e in prior.eta2]))
  # Move the scales off their common initial value.
  for v in net.shared_trainable_variables[1::2] + net.private_trainable_variables:
    if "untransformed_scale" in v.name:
      v.assign(v + rng.uniform(-1.0, 1.0, size=v.shape).astype(np.float32))
  return net, virtual_step.Layout(net)


def _keras_in_layout(layout, grads_by_var, role):
  variables = {
      "shared_loc": layout.shared_loc_vars,
      "shared_u": layout.shared_u_vars,
      "private_loc": layout.private_loc_vars,
      "private_u": layout.private_u_vars,
      "gates": layout.gate_vars
  }[role]
  return _flat([grads_by_var[v.ref()] for v in variables])


@pytest.mark.parametrize("noise", [True, False])
def test_data_loss_and_gradient_match_keras_layers(noise):
  cfg = _config()
  net, layout = _net_and_layout(cfg)
  x, y = _data(16, seed=1)
  mask = tf.constant([1.0] * 12 + [0.0] * 4)
  seed = tf.constant([7, 11], tf.int64)
  variables = net.shared_trainable_variables + net.private_trainable_variables
  with tf.GradientTape() as tape:
    server_out, client_out = net.forward(x, seed=seed if noise else None)
    count = tf.reduce_sum(mask)
    keras_loss = (virtual.data_loss(cfg, y, client_out, mask)[0] +
                  virtual.data_loss(cfg, y, server_out, mask)[0]) / count
  keras_grads = tape.gradient(keras_loss,
                              variables,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
  by_var = {v.ref(): g for v, g in zip(variables, keras_grads)}
  # The lean step is batched over clients: this is C = 1.
  eps = virtual_step.draw_noise(layout, seed[None], 16) if noise else None
  loss, _, grads = virtual_step.data_loss_and_gradients(cfg, layout, layout.read_parameters(),
                                                        x[None], y[None], mask[None], eps,
                                                        virtual.data_loss)
  np.testing.assert_allclose(float(loss[0]), float(keras_loss), rtol=1e-6)
  for role in virtual_step.Parameters._fields:
    np.testing.assert_allclose(_flat([getattr(grads, role)]),
                               _keras_in_layout(layout, by_var, role),
                               atol=1e-6,
                               rtol=1e-5,
                               err_msg=role)
  # A fixed epsilon given explicitly gives the same forward as the drawn one.
  if noise:
    zeros = [tf.zeros_like(e) for e in eps]
    s0, c0 = virtual_step.forward(layout, layout.read_parameters(), x[None], zeros)
    s_mean, c_mean = net.forward(x)
    np.testing.assert_allclose(s0[0], s_mean, atol=1e-6)
    np.testing.assert_allclose(c0[0], c_mean, atol=1e-6)


def test_analytic_kl_gradient_equals_autodiff():
  cfg = _config()
  net, layout = _net_and_layout(cfg, seed=4)
  params = layout.read_parameters()
  for kl, role, prior in ((net.kl_shared, "shared", layout.shared_prior()),
                          (net.kl_private, "private", layout.private_prior())):
    loc_vars = getattr(layout, f"{role}_loc_vars")
    u_vars = getattr(layout, f"{role}_u_vars")
    with tf.GradientTape() as tape:
      value = kl()
    g_loc, g_u = tape.gradient(value, [loc_vars, u_vars])
    a_loc, a_u = virtual_step.kl_gradients(
        getattr(params, f"{role}_loc")[0],
        getattr(params, f"{role}_u")[0], getattr(layout, f"{role}_min_scale"), *prior)
    # float32: sigma prec_t - 1/sigma cancels (prec_t up to 50), ~1e-4 relative.
    np.testing.assert_allclose(a_loc, _flat(g_loc), atol=1e-5, rtol=1e-5, err_msg=role)
    np.testing.assert_allclose(a_u, _flat(g_u), atol=1e-4, rtol=5e-4, err_msg=role)


def test_natural_precision_update_equals_keras_step():
  rng = np.random.default_rng(0)
  u = rng.normal(size=50).astype(np.float32)
  prec_t = rng.uniform(1.0, 100.0, size=50).astype(np.float32)
  g_data = rng.normal(scale=1e-3, size=50).astype(np.float32)
  kl_scale, min_scale, rho = 1e-3, 1e-6, 0.2
  sigma = tf.nn.softplus(u) + min_scale
  grad_total = g_data + kl_scale * (sigma * prec_t - 1.0 / sigma) * tf.math.sigmoid(u)
  var = tf.Variable(u)
  virtual.assign_natural_precision_step(var, grad_total, prec_t, min_scale, kl_scale, rho)
  new_u = virtual_step.natural_precision_update(u, g_data, prec_t, min_scale, rho, kl_scale)
  np.testing.assert_allclose(new_u, var.numpy(), atol=1e-4, rtol=1e-4)


def test_layout_round_trips_network_values():
  cfg = _config()
  net, layout = _net_and_layout(cfg)
  params = layout.read_parameters()
  before = net.get_private_weights()
  post = net.shared_posterior()
  bumped = virtual_step.Parameters(*[p + 1.0 for p in params])
  layout.write_parameters(bumped)
  for w0, w1 in zip(before, net.get_private_weights()):
    np.testing.assert_allclose(w1, np.asarray(w0) + 1.0, rtol=1e-6)
  layout.write_parameters(params)
  np.testing.assert_allclose(_flat(net.shared_posterior().eta1), _flat(post.eta1), rtol=1e-6)
  # The state conversions the batched step uses agree with the network's.
  stacked = [np.asarray(w)[None] for w in before]
  flat = layout.private_from_list(stacked, 1)
  for a, b in zip(flat, (params.private_loc, params.private_u, params.gates)):
    np.testing.assert_array_equal(a, b)
  for w0, w1 in zip(before, layout.private_to_list(*flat)):
    np.testing.assert_array_equal(np.asarray(w1)[0], w0)
  loc, u = layout.shared_from_natural(
      tf.nest.map_structure(lambda t: tf.convert_to_tensor(t)[None], post), 1)
  np.testing.assert_allclose(loc, params.shared_loc, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(u, params.shared_u, rtol=1e-4, atol=1e-5)
  back = layout.shared_to_natural(loc, u)
  np.testing.assert_allclose(_flat([t[0] for t in back.eta2]), _flat(post.eta2), rtol=1e-4)


def _rows(tmp_path, lean, monkeypatch):
  spec = registry.get("virtual")
  monkeypatch.setitem(
      registry._SPECS,
      "virtual",
      dataclasses.replace(  # pylint: disable=protected-access
          spec,
          build=lambda data, config, run: spec.build(
              data, dataclasses.replace(config, lean_step=lean), run)))
  out = tmp_path / ("lean" if lean else "keras")
  p = dict(algorithm="virtual",
           num_clients=6,
           clients_per_round=6,
           rounds=2,  # best S 0.59-0.81, MT 0.86-0.92 over seeds 0-5
           epochs_per_round=5,
           hidden_units=(32,),
           seed=3,
           output_dir=str(out),
           verbose=False,
           export=False,  # SavedModels: tests/test_export.py
           client_lr=0.1)
  summary = driver.run_training(p)
  with open(out / "metrics.csv") as f:
    return summary, list(csv.DictReader(f))


def test_digits_rounds_learn_as_the_keras_path(tff_runtime, tmp_path, monkeypatch):
  lean_summary, lean_rows = _rows(tmp_path, True, monkeypatch)
  keras_summary, keras_rows = _rows(tmp_path, False, monkeypatch)
  # Same seed, same noise: S and MT agree far inside 0.03 (float rounding only).
  for key in ("best_server_accuracy", "best_mt_accuracy"):
    assert abs(lean_summary[key] - keras_summary[key]) <= 0.03, (key, lean_summary, keras_summary)
  for a, b in zip(lean_rows, keras_rows):
    for key in ("server_accuracy", "mt_accuracy"):
      assert abs(float(a[key]) - float(b[key])) <= 0.03, (key, a[key], b[key])
  assert all(float(r["factor_gap"]) <= 1e-5 for r in lean_rows)
  assert lean_summary["best_mt_accuracy"] > 0.6 and lean_summary["best_server_accuracy"] > 0.4


def _train_inputs(cfg, clients, seed=0):
  """`(layout, params, shared_prior, x, y, n, seeds)` of `clients` stacked clients of
  uneven sizes, with distinct KL targets (as `client_update_batch` builds them)."""
  net, layout = _net_and_layout(cfg, seed=seed)
  params = layout.read_parameters()
  params = virtual_step.Parameters(*[tf.tile(p, [clients, 1]) for p in params])
  eta1, eta2 = layout.shared_prior()
  shared_prior = (tf.stack([eta1 * (1.0 + 0.1 * c) for c in range(clients)]),
                  tf.stack([eta2 * (1.0 + 0.2 * c) for c in range(clients)]))
  sizes = [13, 7, 10][:clients]
  x = np.zeros([clients, max(sizes), 8], np.float32)
  y = np.zeros([clients, max(sizes)], np.int32)
  for c, size in enumerate(sizes):
    x[c, :size], y[c, :size] = _data(size, seed=seed + c)
  seeds = tf.constant([[3, 4 + c] for c in range(clients)], tf.int64)
  return layout, params, shared_prior, x, y, tf.constant(sizes, tf.int32), seeds


@pytest.mark.parametrize("clients", [1, 3])
@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # the default objective
        dict(private=False),  # server network only
        dict(kl_weight=1.0, client_lr=0.3),  # a strong KL (targets of precision up to 50)
        dict(server_loss_weight=0.0, hidden_units=(6,)),  # one hidden layer, eq. (3) alone
        dict(private_kl_weight=5.0, client_lr=0.1),  # the private KL weighted on its own
    ])
def test_fused_step_equals_reference_step(kw, clients, request):
  if kw:
    request.getfixturevalue("eager_functions")
  cfg = _config(**dict(dict(epochs=3, batch_size=5), **kw))
  layout, params, shared_prior, x, y, n, seeds = _train_inputs(cfg, clients)
  out = {}
  for fused in (True, False):
    out[fused] = virtual_step.train_clients(cfg, layout, params, shared_prior, x, y, n, seeds,
                                            virtual.data_loss, fused=fused)
  (p_f, loss_f, correct_f), (p_r, loss_r, correct_r) = out[True], out[False]
  # Same objective, minibatches and noise; float32 summation order differs (the
  # bias inside the matmul, grouped kernels, the update's constants).
  for role in virtual_step.Parameters._fields:
    np.testing.assert_allclose(getattr(p_f, role), getattr(p_r, role), atol=2e-5, rtol=1e-4,
                               err_msg=role)
  np.testing.assert_allclose(loss_f, loss_r, rtol=1e-5)
  np.testing.assert_array_equal(correct_f, correct_r)
  assert np.all(np.isfinite(p_f.shared_loc)) and np.all(np.isfinite(p_f.shared_u))
  moved = np.max(np.abs(np.asarray(p_f.shared_loc) - np.asarray(params.shared_loc)))
  assert moved > 1e-3


def test_private_kl_weight_defaults_to_beta_and_pulls_the_private_means_to_their_prior():
  assert _config().private_beta == 0.5 and _config(private_kl_weight=2.0).private_beta == 2.0
  out = {}
  for weight in (None, 0.5, 6.0):  # unset, set to beta, stronger (lr k_p prec = 0.9 < 1)
    cfg = _config(epochs=3, batch_size=5, private_kl_weight=weight, client_lr=0.1)
    layout, params, shared_prior, x, y, n, seeds = _train_inputs(cfg, 1)
    out[weight] = virtual_step.train_clients(cfg, layout, params, shared_prior, x, y, n, seeds,
                                             virtual.data_loss)[0]
  for role in virtual_step.Parameters._fields:  # setting it to beta is leaving it unset
    np.testing.assert_array_equal(getattr(out[None], role), getattr(out[0.5], role))
  # the prior N(0, 1) pulls the private means towards 0: a smaller norm
  norm = lambda p: float(np.linalg.norm(p.private_loc))
  assert norm(out[6.0]) < 0.9 * norm(out[0.5]), (norm(out[6.0]), norm(out[0.5]))


def test_fused_plan_packs_aligned_blocks_and_round_trips():
  cfg = _config(hidden_units=(6, 5))
  _, layout = _net_and_layout(cfg)
  plan = virtual_step.FusedPlan(layout, private=True)
  # Every block is a whole number of 64-byte lines (one-client views alias the vector).
  assert all(size % 16 == 0 for size in plan.sizes) and plan.size == sum(plan.sizes)
  # Server and client layer 1 read x: one group, one matmul.
  assert plan.group_of[("S", 0)] is plan.group_of[("C", 0)]
  assert plan.group_of[("S", 1)] is plan.group_of[("V", 0)]
  params = layout.read_parameters()
  packed = plan.pack(params.shared_loc, params.private_loc)
  shared, private = plan.unpack(packed)
  np.testing.assert_array_equal(shared, params.shared_loc)
  np.testing.assert_array_equal(private, params.private_loc)
  # Each layer's kernel and bias sit in its group's block: the block's matmul with
  # [h, 1] is the layer's h W + b.
  h = np.random.default_rng(0).normal(size=[4, 8]).astype(np.float32)
  block = plan.views(packed[0])[id(plan.group_of[("S", 0)])]
  got = tf.matmul(tf.concat([h, tf.ones([4, 1])], -1), block)
  for j, tag in enumerate(plan.group_of[("S", 0)].tags):
    layer = layout.server_layers[0] if tag[0] == "S" else layout.net.client_layers[0]
    start = sum(plan.group_of[("S", 0)].units[:j])
    want = h @ layer.kernel_loc.numpy() + layer.bias_loc.numpy()
    np.testing.assert_allclose(got[:, start:start + layer.units], want, rtol=1e-5, atol=1e-6)


def test_jit_compile_reaches_the_lean_step():
  # `jit_compile` marks the lean (fused) step function for XLA: plain-TF callers
  # get it; TFF's worker has no XLA (BUILD.md, performance).
  cfg = _config(jit_compile=True)
  x, y = _data(13)
  post = virtual.initial_posterior(cfg)
  state = virtual.initial_client_state(cfg, 1, post)
  net = virtual.build_networks(cfg)
  fn = tf.function(lambda: virtual.client_update(cfg, post, state, tf.constant([1, 2], tf.int64),
                                                 x, y, net=net),
                   autograph=False)  # as the library's own functions
  graph = fn.get_concrete_function().graph.as_graph_def()
  compiled = [
      f.signature.name
      for f in graph.library.function
      if f.attr.get("_XlaMustCompile") is not None and f.attr["_XlaMustCompile"].b
  ]
  assert any("fused_fn" in name for name in compiled), compiled

"""SNR pruning of VIRTUAL deltas (Sec. IV-F) and its byte accounting."""

import numpy as np
import pytest
import tensorflow as tf

from tfbfl import communication
from tfbfl import gaussian
from tfbfl import sparsity
from tfbfl.algorithms import virtual


def test_snr_of_known_gaussian_is_closed_form():
  mu = np.array([[1.0, -2.0], [0.5, 0.0]], np.float32)
  sigma = np.array([[0.5, 4.0], [0.25, 1.0]], np.float32)
  got = sparsity.snr(gaussian.from_loc_scale([mu], [sigma]))[0]
  np.testing.assert_allclose(got, np.abs(mu) / sigma, rtol=1e-6)


@pytest.mark.parametrize("per_layer", [True, False])
def test_half_pruned_exactly(per_layer):
  rng = np.random.default_rng(0)
  values = [rng.uniform(size=(7, 5)).astype(np.float32), rng.uniform(size=(5,)).astype(np.float32)]
  mask = sparsity.keep_mask(values, 50.0, per_layer=per_layer)
  if per_layer:
    for v, m in zip(values, mask):
      m = np.asarray(m)
      assert (m == 0).sum() == round(v.size / 2)
      assert v[m == 0].max() <= v[m == 1].min()  # the lowest-SNR entries go
  else:
    flat_v = np.concatenate([v.ravel() for v in values])
    flat_m = np.concatenate([np.asarray(m).ravel() for m in mask])
    assert (flat_m == 0).sum() == round(flat_v.size / 2)
    assert flat_v[flat_m == 0].max() <= flat_v[flat_m == 1].min()


def test_percentile_validation():
  with pytest.raises(ValueError, match="prune_percentile"):
    sparsity.keep_mask([np.ones(3, np.float32)], 100.0)
  with pytest.raises(ValueError, match="prune_percentile"):
    virtual.VirtualConfig(input_dim=2, num_classes=2, num_clients=2, prune_percentile=-1)


def _round(tff_runtime, percentile):
  rng = np.random.default_rng(0)
  clients = [(rng.normal(size=(30, 6)).astype(np.float32), rng.integers(0, 3, 30).astype(np.int32))
             for _ in range(3)]
  # No hidden layer (the shared posterior's kernel and bias are the pruned tensors):
  # what is checked is the pruning of whatever Delta_i the clients upload, and the
  # network's depth only adds tracing.
  cfg = virtual.VirtualConfig(input_dim=6,
                              num_classes=3,
                              num_clients=3,
                              hidden_units=(),
                              epochs=2,
                              batch_size=10,
                              server_lr=1.0,
                              prune_percentile=percentile)
  alg = virtual.VirtualAlgorithm(cfg)
  server = alg.initial_server_state()
  states = [alg.initial_client_state(i) for i in range(3)]
  seeds = [np.array([0, i], np.int64) for i in range(3)]
  new_server, new_states, metrics = alg.next(server, states, seeds, clients)
  return alg, server, new_server, new_states, metrics


def test_zero_percentile_is_the_unpruned_run(tff_runtime):
  *_, s0, _, m0 = _round(tff_runtime, 0.0)  # 0, the default, takes no pruning branch
  total = sum(np.size(t) for t in tf.nest.flatten(s0.posterior.eta1))
  assert int(m0["delta_nonzeros"]) == 3 * total  # dense: every entry moved


def test_half_pruned_deltas_halve_bytes_and_keep_server_valid(tff_runtime):
  alg, server, new_server, new_states, metrics = _round(tff_runtime, 50.0)
  sizes = [np.size(t) for t in tf.nest.flatten(server.posterior.eta1)]
  want_nnz = 3 * sum(s - round(s / 2) for s in sizes)
  assert int(metrics["delta_nonzeros"]) == want_nnz
  # Pruned entries leave the server posterior untouched: per layer, at least half
  # of each tensor's entries are unchanged after the round (3 clients prune
  # possibly different entries, so more may change).
  prec = gaussian.precision(new_server.posterior)
  assert all(np.all(np.asarray(p) > 0) for p in prec)
  up, down = alg.round_bytes(3, metrics)
  dense = 3 * communication.dense_bytes(server.posterior)
  assert down == dense
  assert up == communication.sparse_bytes(want_nnz, value_bytes=8)
  assert up < dense * 0.8

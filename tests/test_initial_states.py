"""A never-trained client's initial private weights and state, from the cached template.

`initial_private_weights*` eagerly draw from a template cached per architecture;
each value must equal what building a fresh model at that seed gives, at every seed
after the first (the cache warm), and what the uncached graph path gives.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfbfl import networks  # noqa: E402
from tfbfl.algorithms.virtual import model  # noqa: E402
from tfbfl.algorithms.virtual.config import VirtualConfig  # noqa: E402

_ARCHS = {
    "mlp": (networks.VirtualNetworks, networks.initial_private_weights,
            dict(input_dim=6, num_classes=3, hidden_units=[5, 4])),
    "conv": (networks.VirtualConvNetworks, networks.initial_private_weights_conv,
             dict(input_shape=(8, 8), num_classes=5, filters=(3, 4), kernel_size=3,
                  hidden_units=(6,))),
    "lstm": (networks.VirtualLSTMNetworks, networks.initial_private_weights_lstm,
             dict(vocab_size=12, embedding_dim=4, lstm_units=(5, 6))),
}


@pytest.mark.parametrize("arch", sorted(_ARCHS))
def test_every_seed_equals_a_fresh_model_and_the_graph_path(arch):
  network, initial, dims = _ARCHS[arch]
  kw = dict(dims, init_scale=2e-3, adapter_units=3, gate_init=0.25)
  for seed in (5, 6, 2**31 - 1, 5):
    weights = initial(**kw, seed=seed)
    fresh = network(**kw, seed=seed).get_private_weights()
    assert len(weights) == len(fresh)
    for w, f in zip(weights, fresh):
      assert isinstance(w, np.ndarray) and w.dtype == np.float32
      np.testing.assert_array_equal(w, f.numpy())
  in_graph = tf.function(lambda: initial(**kw, seed=6))()
  for w, g in zip(initial(**kw, seed=6), in_graph):
    np.testing.assert_array_equal(w, g.numpy())
  # a value drawn from the template is the caller's: changing it changes no later draw
  first = initial(**kw, seed=7)
  kept = [w.copy() for w in first]
  for w in first:
    w.fill(np.nan)
  for w, again in zip(kept, initial(**kw, seed=7)):
    np.testing.assert_array_equal(w, again)


def test_bad_seed_is_refused_by_name():
  _, initial, dims = _ARCHS["mlp"]
  with pytest.raises(ValueError, match="seed"):
    initial(**dims, seed=1.5)


def test_client_states_with_the_factor_computed_once_equal_computed_each_time():
  cfg = VirtualConfig(input_dim=6, num_classes=3, hidden_units=(5, 4), num_clients=4, seed=3)
  posterior = model.initial_posterior(cfg)
  factor = model.initial_factor(cfg, posterior)
  for index in (0, 3):
    once = model.initial_client_state(cfg, index, posterior, factor)
    each = model.initial_client_state(cfg, index, posterior)
    for a, b in zip(tf.nest.flatten(once), tf.nest.flatten(each)):
      np.testing.assert_array_equal(a, b)
  # s^(0)^(1/K): the precision and the precision-weighted mean divided by K
  for f, p in zip(tf.nest.flatten(factor), tf.nest.flatten(posterior)):
    np.testing.assert_allclose(f, p.numpy() / cfg.num_clients, rtol=1e-6)
  # every state owns its arrays: changing one client's factor leaves the next one's
  state = model.initial_client_state(cfg, 1, posterior, factor)
  state.shared_factor.eta1[0][...] = 0.0
  assert np.any(model.initial_client_state(cfg, 2, posterior, factor).shared_factor.eta1[0])
  assert np.any(factor.eta1[0])

"""Every VIRTUAL architecture trains inside a real TFF round: MLP, FEMNIST-style
conv net and Shakespeare-style LSTM, each on a tiny fixed batch."""

import numpy as np
import pytest

from tfbfl.algorithms import virtual


def _mt_loss(alg, states, data):
  """The clients' MT loss per example, by the driver's streamed evaluation (built with
  the algorithm; MT reads the client states alone)."""
  seeds = [np.array([9, i], np.int64) for i in range(len(states))]
  per_client = alg.evaluate_clients(states, list(range(len(states))), seeds, data)
  return sum(float(c["mt_loss"]) for c in per_client) / sum(
      float(c["num_examples"]) for c in per_client)


@pytest.mark.parametrize("arch", ["mlp", "conv", "lstm"])
def test_rounds_reduce_client_loss(tff_runtime, arch):
  rng = np.random.default_rng(0)
  if arch == "lstm":
    vocab, length = 12, 6
    x = [rng.integers(1, vocab, size=(16, length)).astype(np.int32) for _ in range(2)]
    y = [(xi[:, -1] + 1) % vocab for xi in x]  # next token: a learnable rule
    kw = dict(input_dim=length,
              input_shape=(length,),
              num_classes=vocab,
              architecture="lstm",
              vocab_size=vocab,
              embedding_dim=4,
              lstm_units=(8,))
  else:
    x = [rng.normal(size=(16, 8, 8)).astype(np.float32) for _ in range(2)]
    y = [(xi[:, 0, 0] > 0).astype(np.int32) for xi in x]
    kw = dict(input_dim=64,
              input_shape=(8, 8),
              num_classes=2,
              architecture=arch,
              filters=(4, 4),
              kernel_size=3,
              hidden_units=(8,))
  # The LSTM learns the "last token" rule slowly at a stable learning rate.
  lr, epochs = (0.05, 20) if arch == "lstm" else (0.1, 8)
  cfg = virtual.VirtualConfig(num_clients=2,
                              epochs=epochs,
                              batch_size=8,
                              client_lr=lr,
                              server_lr=0.5,
                              **kw)
  alg = virtual.VirtualAlgorithm(cfg)
  data = [(xi, yi.astype(np.int32)) for xi, yi in zip(x, y)]
  server = alg.initial_server_state()
  states = [alg.initial_client_state(i) for i in range(2)]
  before = _mt_loss(alg, states, data)
  for r in range(2):
    server, states, metrics = alg.next(server, states,
                                       [np.array([r, i], np.int64) for i in range(2)], data)
  after = _mt_loss(alg, states, data)
  assert np.isfinite(after)
  assert after < (0.97 if arch == "lstm" else 0.8) * before, (arch, before, after)

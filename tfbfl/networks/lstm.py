"""VIRTUAL's recurrent (LSTM) networks and their deterministic twin.

* `VirtualLSTMNetworks`: the Shakespeare next-character model (8-d Gaussian
  embedding, two Bayesian LSTMs of 100 units, logits over the vocabulary) as a
  server network plus one client's laterally connected private network, with the
  interface of `tfbfl.networks.mlp.VirtualNetworks`.
* `initial_shared_posterior_lstm`, `initial_private_weights_lstm`: the initial
  values of a fresh `VirtualLSTMNetworks`, from stateless ops only, deterministic
  in `seed`.
* `build_deterministic_lstm`: the point-estimate Keras model (logits) with the
  server network's shapes, for FedAvg/FedProx/FOLA.
* `DEFAULT_VOCAB_SIZE`: the vocabulary of VIRTUAL's Shakespeare task.
"""

import numpy as np
import tensorflow as tf

from tfbfl.layers import BayesianDense, BayesianLSTM, GaussianEmbedding
from tfbfl.layers.base import check_positive_int, check_seed, derive_seed
from tfbfl.networks.base import (
    SERVER,
    LateralNetworks,
    initial_private_weights_of,
    initial_shared_posterior_from_plan,
    lateral_connection,
    plan_depth,
    positive_ints,
)

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "VirtualLSTMNetworks",
    "build_deterministic_lstm",
    "initial_private_weights_lstm",
    "initial_shared_posterior_lstm",
]

# Vocabulary of the Shakespeare model: 86 characters, id 0 for padding and the last
# id for out-of-vocabulary characters (`tfbfl.data.shakespeare.VOCAB_SIZE`).
DEFAULT_VOCAB_SIZE = 86 + 2


def _lstm_geometry(vocab_size, embedding_dim, lstm_units, return_sequences):
  """Checked `(vocab_size, embedding_dim, lstm_units)`; `return_sequences` a bool."""
  vocab_size = check_positive_int("vocab_size", vocab_size)
  embedding_dim = check_positive_int("embedding_dim", embedding_dim)
  lstm_units = positive_ints("lstm_units", lstm_units, allow_empty=False)
  if not isinstance(return_sequences, (bool, np.bool_)):
    raise ValueError(f"`return_sequences` must be a bool, got {return_sequences!r}.")
  return vocab_size, embedding_dim, lstm_units


def _lstm_plan(
    vocab_size,
    embedding_dim,
    lstm_units,
    return_sequences,
    forget_bias,
    adapter_activation,
    prior_scale,
    init_scale,
    adapter_units,
    gate_init,
    seed,
):
  vocab_size, embedding_dim, lstm_units = _lstm_geometry(vocab_size, embedding_dim, lstm_units,
                                                         return_sequences)
  if adapter_units is not None:
    adapter_units = check_positive_int("adapter_units", adapter_units)
  seed = check_seed(seed)
  common = dict(prior_scale=prior_scale, init_scale=init_scale)
  lateral = lambda units, l: lateral_connection(units, adapter_units, adapter_activation, gate_init,
                                                seed, l, common)
  plan = [
      plan_depth(
          0,
          seed,
          GaussianEmbedding,
          (None, None),
          (lateral(embedding_dim, 0), (None, None, embedding_dim)),
          input_dim=vocab_size,
          output_dim=embedding_dim,
          **common,
      )
  ]
  n_in = embedding_dim
  for k, units in enumerate(lstm_units):
    l = k + 1
    sequences = return_sequences or k < len(lstm_units) - 1
    out_shape = (None, None, units) if sequences else (None, units)
    plan.append(
        plan_depth(
            l,
            seed,
            BayesianLSTM,
            (None, None, n_in),
            (lateral(units, l), out_shape),
            units=units,
            return_sequences=sequences,
            forget_bias=forget_bias,
            **common,
        ))
    n_in = units
  l = len(lstm_units) + 1
  out_shape = (None, None, vocab_size) if return_sequences else (None, vocab_size)
  plan.append(
      plan_depth(
          l,
          seed,
          BayesianDense,
          (None, n_in),
          (lateral(vocab_size, l), out_shape),
          units=vocab_size,
          **common,
      ))
  return plan


class VirtualLSTMNetworks(LateralNetworks):
  """VIRTUAL's recurrent next-character server network and one client's network.

  Inputs are character ids `x` (`[batch, T]`, integer or float). With
  `L = len(lstm_units)` Bayesian LSTMs, depth 0 the embedding and depth `L + 1` the
  logits:

  ```none
  server:  e_s = E_s[x];   h_s^k = LSTM_s^k(h_s^(k-1)), h_s^0 = e_s;
           logits_s = W_s h_s^L + b_s
  client:  e_c = E_c[x] + lat_0(e_s)
           h_c^k = LSTM_c^k(h_c^(k-1)) + lat_k(h_s^k),   h_c^0 = e_c
           logits_c = W_c h_c^L + b_c + lat_(L+1)(logits_s)
  lat_l(h) = g_l * (U_l act(V_l h + c_l) + d_l)      (at every time step)
  ```

  `E` are `GaussianEmbedding` tables (`embedding_dim`, default 8), the LSTMs
  `BayesianLSTM` (one weight draw per call, shared across time steps and the batch,
  Fortunato et al. [3]) and `W, b` a `BayesianDense` logits layer over the whole
  vocabulary.

  **Lateral form.** Every client layer's *output* sequence receives the gated
  adapter of the server output at the same depth before it is passed on, so the
  server's LSTM outputs enter the client's next LSTM through its *input* kernel (the
  Progressive-Networks adapter [(Rusu et al., 2016)][2] with the server column's
  features as extra input to the next client layer). The client LSTM itself stays a
  plain `BayesianLSTM`: the lateral does not enter its gates at the same depth, which
  would need a second input path through the recurrence. At the embedding the
  lateral maps the server embedding into the client's, at the logits the server
  logits into the client's, as in `tfbfl.networks.mlp.VirtualNetworks`. The adapters
  (`LateralConnection`, `BayesianDense` maps on the last axis) use local
  reparameterization independently at each time step, unlike the LSTM weights:
  cheaper, and the per-step marginals are exact. With all gates at zero the client
  network is independent of the server parameters.

  `return_sequences=False` (default) predicts the character following each
  sequence (LEAF Shakespeare as `tfbfl.data.shakespeare` loads it: 80 ids in, one
  label out, so logits are `[batch, vocab_size]` and labels `[batch]`, the data
  layout of the other tasks);
  `True` predicts at every step (`[batch, T, vocab_size]`, labels `[batch, T]`;
  mask padding in the loss).

  Parameters, seeds and the natural-parameter interface are those of
  `tfbfl.networks.mlp.VirtualNetworks`: `shared_posterior()` is a `NaturalGaussian` over
  `[embeddings, kernel_1, recurrent_kernel_1, bias_1, ..., kernel, bias]` of the
  server layers; `private_trainable_variables` are the client layers' posterior
  variables, then per depth the lateral's `V`, `U`, gate. All variables are created
  in `__init__`, deterministically in `seed`, with the values of
  `initial_shared_posterior_lstm` and `initial_private_weights_lstm`.

  Args:
    vocab_size: positive int; default 88 = the 86 characters of VIRTUAL's
      Shakespeare task plus a padding and an out-of-vocabulary id, the id layout
      of `tfbfl.data.shakespeare` (0 padding, 1..86 characters, 87 OOV).
    embedding_dim: positive int, embedding width (8 in VIRTUAL).
    lstm_units: non-empty sequence of positive ints, one LSTM layer each.
    return_sequences: bool, see above.
    forget_bias: constant added to every LSTM's forget gate (see `BayesianLSTM`).
    adapter_activation: Keras activation of the adapters' hidden layer.
    prior_scale: standard deviation of the zero-mean priors.
    init_scale: initial posterior standard deviation of every Bayesian weight.
    adapter_units: width of every adapter's hidden layer; `None` uses the width of
      the client layer it feeds.
    gate_init: initial value of every lateral gate.
    seed: Python int (or `None` for unseeded initialisation).
    name: module name.

  #### Examples

  ```python
  import tensorflow as tf
  from tfbfl import networks

  net = networks.VirtualLSTMNetworks(vocab_size=20, lstm_units=(6, 6))
  x = tf.random.uniform([3, 10], maxval=20, dtype=tf.int32)
  server_logits, client_logits = net.forward(x, seed=tf.constant([0, 1]))  # [3, 20]
  kl = net.kl_shared() + net.kl_private()
  s = net.shared_posterior()                    # [embeddings, k1, r1, b1, ..., k, b]
  ```

  #### References

  [1]: Luca Corinzia, Ami Beuret, Joachim M. Buhmann. Variational Federated
       Multi-Task Learning. https://arxiv.org/abs/1906.06268
  [2]: Andrei A. Rusu et al. Progressive Neural Networks.
       https://arxiv.org/abs/1606.04671
  [3]: Meire Fortunato, Charles Blundell, Oriol Vinyals. Bayesian Recurrent Neural
       Networks. https://arxiv.org/abs/1704.02798
  [4]: Luke Vilnis, Andrew McCallum. Word Representations via Gaussian Embedding.
       https://arxiv.org/abs/1412.6623
  """

  def __init__(
      self,
      vocab_size=DEFAULT_VOCAB_SIZE,
      embedding_dim=8,
      lstm_units=(100, 100),
      return_sequences=False,
      forget_bias=1.0,
      adapter_activation="relu",
      prior_scale=1.0,
      init_scale=1e-3,
      adapter_units=None,
      gate_init=1.0,
      seed=0,
      name=None,
  ):
    super().__init__(name=name)
    plan = _lstm_plan(
        vocab_size,
        embedding_dim,
        lstm_units,
        return_sequences,
        forget_bias,
        adapter_activation,
        prior_scale,
        init_scale,
        adapter_units,
        gate_init,
        seed,
    )
    self.vocab_size = int(vocab_size)
    self.num_classes = self.vocab_size
    self.embedding_dim = int(embedding_dim)
    self.lstm_units = tuple(int(u) for u in lstm_units)
    self.return_sequences = bool(return_sequences)
    self._build_plan(plan)


def initial_shared_posterior_lstm(
    vocab_size=DEFAULT_VOCAB_SIZE,
    embedding_dim=8,
    lstm_units=(100, 100),
    init_scale=1e-3,
    seed=0,
):
  """`VirtualLSTMNetworks(..., seed=seed).shared_posterior()` without a model.

  Stateless ops only: deterministic in `seed`, usable eagerly or in a graph/TFF
  computation. (`return_sequences` and `forget_bias` do not change parameters.)
  """
  plan = _lstm_plan(
      vocab_size,
      embedding_dim,
      lstm_units,
      False,
      1.0,
      "relu",
      1.0,
      init_scale,
      None,
      1.0,
      seed,
  )
  return initial_shared_posterior_from_plan(plan)


def initial_private_weights_lstm(
    vocab_size=DEFAULT_VOCAB_SIZE,
    embedding_dim=8,
    lstm_units=(100, 100),
    init_scale=1e-3,
    adapter_units=None,
    gate_init=1.0,
    seed=0,
):
  """`VirtualLSTMNetworks(..., seed=seed).get_private_weights()` without a model.

  Stateless ops only, deterministic in `seed`; numpy arrays when executing
  eagerly, tensors inside a graph.
  """
  args = (
      vocab_size, embedding_dim, lstm_units, False, 1.0, "relu", 1.0, init_scale, adapter_units,
      gate_init)
  return initial_private_weights_of(_lstm_plan, args, seed)


def build_deterministic_lstm(
    vocab_size=DEFAULT_VOCAB_SIZE,
    embedding_dim=8,
    lstm_units=(100, 100),
    seed=0,
    return_sequences=False,
    sequence_length=None,
):
  """The point-estimate next-character model with the server network's shapes.

  `Input([sequence_length])` of ids (float ids are cast by the embedding),
  `Embedding(vocab_size, embedding_dim)`, the `LSTM` layers (Keras defaults:
  `sigmoid`/`tanh`, `unit_forget_bias=True`, the counterpart of `BayesianLSTM`'s
  `forget_bias=1`), and a linear `Dense(vocab_size)` on the last step (or on every
  step with `return_sequences=True`). Kernels Glorot-normal, recurrent kernels
  orthogonal, all seeded from `seed` (deterministic). `model.weights` are in the
  order and shapes of `VirtualLSTMNetworks.shared_posterior()`.
  """
  vocab_size, embedding_dim, lstm_units = _lstm_geometry(vocab_size, embedding_dim, lstm_units,
                                                         return_sequences)
  if sequence_length is not None:
    sequence_length = check_positive_int("sequence_length", sequence_length)
  seed = check_seed(seed)
  glorot = lambda l: tf.keras.initializers.GlorotNormal(seed=derive_seed(seed, SERVER, l))
  layers = [
      tf.keras.Input(shape=(sequence_length,)),
      tf.keras.layers.Embedding(vocab_size,
                                embedding_dim,
                                embeddings_initializer=glorot(0),
                                name="embedding"),
  ]
  for k, units in enumerate(lstm_units):
    layers.append(
        tf.keras.layers.LSTM(
            units,
            return_sequences=return_sequences or k < len(lstm_units) - 1,
            kernel_initializer=glorot(k + 1),
            recurrent_initializer=tf.keras.initializers.Orthogonal(
                seed=derive_seed(seed, SERVER, k + 1, 1)),
            name=f"lstm_{k}",
        ))
  layers.append(
      tf.keras.layers.Dense(vocab_size,
                            kernel_initializer=glorot(len(lstm_units) + 1),
                            name="logits"))
  return tf.keras.Sequential(layers, name="deterministic_lstm")

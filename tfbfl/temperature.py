"""Post-hoc temperature scaling (Guo et al., 2017, "On Calibration of Modern Neural Networks"),
fitted federatedly: one temperature per predictive, from every client's held-out data.

A trained model's logits `z` become `z / T`, with the temperature `T > 0` that minimises
the negative log-likelihood on held-out data the model never trained on,

```none
T* = argmin_T  sum_k sum_{i in calibration split of client k} -log softmax(z_i / T)[y_i].
```

The argmin is taken over a fixed log-spaced grid (`TEMPERATURES`), so the fit needs no
iteration and no extra round trip: each client reports, for every grid temperature,
its summed calibration NLL (`calibration_nll`) and its test NLL and reliability bins
(`tempered_sums`); the sums add over clients, and the server reads the test metrics at
the grid point of the smallest total calibration NLL (`select`). Accuracy is unchanged
(the argmax of `z / T` is that of `z`).

One temperature for all clients, not one per client: a client's calibration split is
small (digits: ~26 examples), and a set its model gets all right has its NLL falling
all the way to the grid's lowest temperature, which then makes every wrong test
prediction of that client near-certain (`tests/test_temperature.py`).
"""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from tfbfl import _lazy
from tfbfl import metrics as metrics_lib

tf = _lazy.load("tensorflow")

# 0.05..20, ~10 % apart.
TEMPERATURES = np.exp(np.linspace(np.log(0.05), np.log(20.0), 61)).astype(np.float32)


def _scaled(logits, temperatures):
  logits = tf.convert_to_tensor(logits, tf.float32)
  t = tf.constant(temperatures, tf.float32)
  return logits[None] / t[:, None, None]  # [grid, n, classes]


def _nll_per_temperature(scaled, labels):
  tiled = tf.broadcast_to(tf.cast(labels, tf.int32)[None], tf.shape(scaled)[:2])
  return tf.reduce_sum(
      tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tiled, logits=scaled), axis=1)


def calibration_nll(logits, labels, temperatures=TEMPERATURES):
  """Summed NLL of `labels` under `logits / T` for each grid `T`: float32 `[grid]`
  (zeros for an empty split). TF ops, usable inside TFF computations."""
  return _nll_per_temperature(_scaled(logits, temperatures), labels)


def tempered_sums(logits, labels, temperatures=TEMPERATURES):
  """For each grid `T`, the summed test NLL `[grid]` and the reliability bins
  `[grid, 3, bins]` (`tfbfl.metrics.calibration_sums`) of `logits / T`."""
  scaled = _scaled(logits, temperatures)
  bins = tf.map_fn(lambda z: metrics_lib.calibration_sums(tf.nn.softmax(z), labels), scaled)
  return _nll_per_temperature(scaled, labels), bins


def fit_sums(prefix: str, logits, labels, calibration_logits, calibration_labels):
  """The grids one client reports for `prefix`'s temperature (`select`):
  `{prefix}_fit_nll` (`calibration_nll` of its calibration split),
  `{prefix}_tempered_loss` and `{prefix}_tempered_calibration` (`tempered_sums` of its
  test split). A predictive given as probabilities `p` (a Monte Carlo average) passes
  `log p` as its logits: `softmax(log p / T)` is `p^(1/T)` renormalised. TF ops, a dict."""
  loss, bins = tempered_sums(logits, labels)
  return {f"{prefix}_fit_nll": calibration_nll(calibration_logits, calibration_labels),
          f"{prefix}_tempered_loss": loss, f"{prefix}_tempered_calibration": bins}


def select(per_client: Sequence[Dict[str, np.ndarray]], key: str,
           temperatures=TEMPERATURES) -> float:
  """Fits `key`'s temperature (`server` or `mt`) and rewrites each client's sums in place.

  Each client dict carries `{key}_fit_nll` `[grid]`, `{key}_tempered_loss` `[grid]` and
  `{key}_tempered_calibration` `[grid, 3, bins]`; its `{key}_loss` and
  `{key}_calibration` become those at the temperature of the smallest summed
  `{key}_fit_nll`, and the three grids are removed. Returns that temperature.

  Raises:
    ValueError: no client holds a calibration example (every `{key}_fit_nll` zero).
  """
  total = sum(np.asarray(c[f"{key}_fit_nll"], np.float64) for c in per_client)
  if not np.any(total > 0):
    raise ValueError("temperature scaling: no client has a calibration example "
                     "(raise --calibration_fraction).")
  best = int(np.argmin(total))
  for c in per_client:
    c[f"{key}_loss"] = np.asarray(c.pop(f"{key}_tempered_loss"))[best]
    c[f"{key}_calibration"] = np.asarray(c.pop(f"{key}_tempered_calibration"))[best]
    del c[f"{key}_fit_nll"]
  return float(temperatures[best])

r"""A user's Keras model against the built-in network it spells out: VIRTUAL's rounds.

    python -m benchmarks.own_model                  # MNIST MLP, then FEMNIST conv
    python -m benchmarks.own_model --legs=mnist_mlp --rounds=3

Both sides of a pair are one run each of `tfbfl.driver.run_training` in this
process, in the order preset, model, model, preset, ... (`protocols.abba`) so that a
drifting load hits both alike; a side's time is the median over its runs of the mean wall time of the
rounds after the second (the first two trace the rounds' and the evaluation's computations). Printed: each side's
seconds a round and the ratio model / preset (target <= 1.05; issue 64).

  mnist_mlp   the paper's MNIST protocol (`reproduction.presets` "mnist": 100 clients x
              600, C = 10, B = 20, MLP 784-100-100-10), `--epochs` a round; the
              model: `Input((28, 28)), Flatten, Dense(100) x 2, Dense(10)`.
  femnist_conv the FEMNIST-conv protocol (preset "femnist_conv", 100 writers of
              `../shared/data/femnist`), `--epochs` a round; the model: VIRTUAL's
              FEMNIST conv net written as a Keras `Sequential`.
A leg whose files are absent is skipped with the reason. The rounds are the
launcher's (evaluation included, at `--eval_samples=0`).
"""

import os
import statistics
import sys
import time

from absl import app, flags

from benchmarks.protocols import (DEFAULT_MNIST_DIR, abba, dataset_params, mnist_missing,
                                  user_femnist_conv, user_mlp)
from reproduction import presets
from tfbfl import driver

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FEMNIST_DIR = os.path.normpath(os.path.join(_REPO, "..", "shared", "data", "femnist"))

_LEGS = flags.DEFINE_list("legs", ["mnist_mlp", "femnist_conv"], "Which pairs to time.")
_ROUNDS = flags.DEFINE_integer("rounds", 4,
                               "Rounds per run (the first two are not timed: tracing).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs per side, in ABBA order.")
_EPOCHS = flags.DEFINE_integer("epochs", 2, "Local epochs per round.")
_MNIST = flags.DEFINE_string("mnist_dir", DEFAULT_MNIST_DIR, "MNIST idx files (.gz).")
_FEMNIST = flags.DEFINE_string("femnist_dir", DEFAULT_FEMNIST_DIR, "LEAF FEMNIST JSON.")


def _legs():
  """name -> (params, user model builder) or the reason it is skipped."""
  femnist_missing = None if os.path.isdir(_FEMNIST.value) else (
      f"FEMNIST skipped: {_FEMNIST.value} is absent")
  out = {}
  for name in _LEGS.value:
    if name == "mnist_mlp":
      reason = mnist_missing(_MNIST.value)
      params = dataset_params("mnist", _MNIST.value, _EPOCHS.value)
      out[name] = reason or (params, user_mlp((28, 28), (100, 100), 10))
    elif name == "femnist_conv":
      params = dict(presets.preset("femnist_conv"), data_dir=_FEMNIST.value,
                    epochs_per_round=_EPOCHS.value)
      out[name] = femnist_missing or (params, user_femnist_conv)
    else:
      raise app.UsageError(f"--legs: mnist_mlp or femnist_conv, got {name!r}.")
  return out


def _seconds_a_round(params, model=None):
  """Mean wall time of a run's rounds after the second. The round hook runs once a
  round has trained, before its evaluation, so the span from round 1's hook to round
  2's holds the evaluation's tracing; from round 2's hook on, each span is one
  evaluation and one round's training, both traced before."""
  times = []
  driver.run_training(dict(params, rounds=_ROUNDS.value, eval_samples=0, export=False,
                           verbose=False),
                      model=model,
                      round_hook=lambda r, row: times.append(time.perf_counter()))
  return (times[-1] - times[1]) / (len(times) - 2)


def main(argv):
  del argv
  if _ROUNDS.value < 3:
    raise app.UsageError("--rounds must be >= 3 (the first two rounds are not timed).")
  print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)", flush=True)
  for name, leg in _legs().items():
    if isinstance(leg, str):
      print(f"{name}: {leg}", flush=True)
      continue
    params, model = leg
    params = dict(params, algorithm="virtual", seed=0)
    user = {k: v for k, v in params.items() if k not in ("architecture", "hidden_units",
                                                          "image_shape", "filters")}
    sides = {"preset": [], "model": []}
    start = time.time()
    for side in abba(("preset", "model"), _REPEATS.value):
      sides[side].append(_seconds_a_round(params) if side == "preset" else
                         _seconds_a_round(user, model))
    preset_s, model_s = (statistics.median(sides[k]) for k in ("preset", "model"))
    print(f"{name}: preset {preset_s:.3f} s/round {sides['preset']}, --model {model_s:.3f} "
          f"s/round {sides['model']}, ratio model/preset {model_s / preset_s:.3f} "
          f"({time.time() - start:.0f} s; load average now {os.getloadavg()[0]:.2f})",
          flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(app.run(main))

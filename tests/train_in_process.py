"""`launchers.train`'s flags, parsed as the launcher parses them, trained in this process.

For tests whose subject is what a flag does to a run (the variances it moves, the
clients it keeps), not the launcher program itself: the flags of every setting are
defined on a fresh absl `FlagValues` (`tfbfl.flags.define`, with the combination
validator the launcher runs), `argv` is parsed by them, and `driver.run_training`
runs the parsed settings in the test's process, on the session's TFF worker. Same
settings, same run as `python -m launchers.train *argv` (its defaults are the same
declarations), without a second TensorFlow start-up and TFF worker. The launcher's
own behaviour (bad flags, FATAL lines, exit codes, signals) stays tested as a
subprocess (`launcher_helpers.run_launcher`).
"""

import contextlib
import io


def train(*argv):
  """Returns `(summary, stdout)` of `launchers.train *argv` run in this process."""
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top
  from tfbfl import driver  # pylint: disable=g-import-not-at-top
  from tfbfl import flags as tfbfl_flags  # pylint: disable=g-import-not-at-top

  flag_values = absl_flags.FlagValues()
  tfbfl_flags.define(flag_values=flag_values)
  flag_values(["train", *argv])
  params = tfbfl_flags.params(flag_values=flag_values)
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    summary = driver.run_training(params)
  return summary, out.getvalue()

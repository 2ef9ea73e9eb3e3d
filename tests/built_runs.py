"""`driver.run_training`'s run of an algorithm built once, for tests that run one
configuration several times (a resume test's uninterrupted, interrupted and resumed
runs).

Building an algorithm traces its TFF computations, and its first round and
evaluation compile them: ~15 CPU-s for a small VIRTUAL on digits, against ~1 s for
the same three rounds again on the same object (an algorithm holds no run's state:
every call gets the states passed in). `run_built` drives the round loop
(`round_loop.ExperimentRunner`) on the given algorithm with the run's settings and
the flags `run_training` records (`flags.txt`, the checkpoint's manifest, which
`--resume` checks), so its outputs and checkpoints are those of `run_training` with
the same parameters, and `run_training(..., resume=True)` accepts or refuses them as
its own. What `run_training` itself adds (flag checks, the output directory's
checks before start-up, the runtime) stays tested through it elsewhere
(test_run_directory, test_outputs, test_faults).
"""

from tfbfl import driver
from tfbfl import round_loop


def recorded_flags(params):
  """The resolved flags `run_training(params)` records for a built-in network."""
  p = driver.resolve_params(params)
  return p, {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.items()}


def build(params):
  """`(data, algorithm)` of `params` (loaded and built as `run_training` does)."""
  p = driver.resolve_params(params)
  data = driver.load_data(p, params)
  return data, driver.build_algorithm(data, p)


class Builds:
  """Algorithms built once per algorithm configuration (`driver.configs(...).algorithm`)
  for a module's runs: an algorithm holds no run's state and reads only its
  configuration and the data's shapes, so runs of one configuration (on data of those
  shapes) share its computations."""

  def __init__(self):
    self._built = []  # (config, algorithm): configs are compared, not hashed

  def algorithm(self, data, params):
    """The algorithm `driver.build_algorithm(data, params)` builds, built once."""
    p = driver.resolve_params(params)
    config = driver.configs(p, data).algorithm
    for built_config, algorithm in self._built:
      if type(built_config) is type(config) and built_config == config:
        return algorithm
    algorithm = driver.build_algorithm(data, p)
    self._built.append((config, algorithm))
    return algorithm


def run_built(algorithm, data, params):
  """The summary of `run_training(params)` run on `algorithm` (built for the same
  configuration, e.g. by `build`) and `data`, on the session's runtime."""
  p, flags = recorded_flags(params)
  assert algorithm.config == driver.configs(p, data).algorithm, "another configuration"
  runner = round_loop.ExperimentRunner(algorithm, data, driver.run_config(p), flags=flags,
                                       replay=driver.REPLAY)
  try:
    return runner.run()
  finally:
    runner.close()

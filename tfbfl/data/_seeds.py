"""Seed handling shared by the data modules: one rule for ints and Generators."""

import numbers

import numpy as np


def as_generator(seed, name="seed"):
  """Returns a `np.random.Generator` for `seed`.

  Args:
    seed: A non-negative int (a fresh `np.random.default_rng(seed)` is built, so
      the same int always gives the same stream) or a `np.random.Generator`
      (used as is, so repeated calls continue its stream).
    name: The argument name used in error messages.

  Raises:
    ValueError: if `seed` is neither a non-negative int nor a Generator.
  """
  if isinstance(seed, np.random.Generator):
    return seed
  if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
    if seed < 0:
      raise ValueError(f"`{name}` must be a non-negative int, got {seed}.")
    return np.random.default_rng(int(seed))
  raise ValueError(f"`{name}` must be a non-negative int or a np.random.Generator, got "
                   f"{seed!r} of type {type(seed).__name__}.")


def derive_seeds(seed, count):
  """Returns `count` independent non-negative int seeds derived from `seed`.

  `seed` is an int or a Generator; with an int the result is a pure function
  of (seed, count), so each stage of a pipeline (partition, split, permutation)
  gets its own stream and changing one stage does not shift the others.
  """
  if isinstance(seed, np.random.Generator):
    return [int(s) for s in seed.integers(0, 2**63 - 1, size=count)]
  as_generator(seed)  # validates
  children = np.random.SeedSequence(int(seed)).spawn(count)
  return [int(c.generate_state(1, dtype=np.uint64)[0]) >> 1 for c in children]

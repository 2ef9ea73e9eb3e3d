"""A restricted unpickler for data files that are pickles of plain arrays.

`pickle.load` runs whatever callable a pickle names, so an untrusted pickle
can execute code. `RestrictedUnpickler` resolves only the globals listed in
`ALLOWED_GLOBALS` and refuses every other one with `UnsafePickleError`
before anything is called. Plain containers (dict, list, tuple, str, bytes,
int, float, bool, None) need no global and always load.

`ALLOWED_GLOBALS` holds what pickled numpy arrays need, and nothing else:

* `numpy.core.multiarray._reconstruct`, `numpy.ndarray`, `numpy.dtype`:
  protocols 0-4 (the CIFAR-10 python batches: Python 2 cPickle, protocol 2);
* `numpy.core.numeric._frombuffer`: protocol 5;
* the same two functions under `numpy._core` (numpy >= 2 writes that name);
* `_codecs.encode`: Python 3 writes bytes this way at protocols 0-2 (it
  encodes a str; it calls nothing else).

Persistent ids and out-of-band buffers are refused by `pickle.Unpickler`
itself (no `persistent_load`, no `buffers`).
"""

import pickle

ALLOWED_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
})


class UnsafePickleError(pickle.UnpicklingError, ValueError):
  """The pickle references a global outside `ALLOWED_GLOBALS`."""


class RestrictedUnpickler(pickle.Unpickler):
  """A `pickle.Unpickler` whose `find_class` admits only `ALLOWED_GLOBALS`.

  Args:
    file: a binary file object.
    source: name of the file, for error messages.
    **kwargs: passed to `pickle.Unpickler` (e.g. `encoding="bytes"`).
  """

  def __init__(self, file, *, source="<pickle>", **kwargs):
    super().__init__(file, **kwargs)
    self._source = source

  def find_class(self, module, name):
    if (module, name) in ALLOWED_GLOBALS:
      return super().find_class(module, name)
    raise UnsafePickleError(f"{self._source!r} references {module}.{name}, which is not allowed: "
                            "this loader only admits plain containers and numpy arrays "
                            f"({', '.join(sorted(m + '.' + n for m, n in ALLOWED_GLOBALS))}). "
                            "The file is not the expected data file and was not loaded.")


def load(path, *, encoding="bytes"):
  """Unpickles the file `path` with `RestrictedUnpickler`.

  Raises:
    UnsafePickleError: (a ValueError) a disallowed global is referenced.
    ValueError: naming the file, when it is truncated or not a pickle.
  """
  with open(path, "rb") as f:
    try:
      return RestrictedUnpickler(f, source=path, encoding=encoding).load()
    except UnsafePickleError:
      raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, MemoryError) as e:
      raise ValueError(f"{path!r} is not a complete pickle file (truncated or corrupted: "
                       f"{type(e).__name__}: {e}).") from e

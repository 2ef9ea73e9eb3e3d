"""Errors raised by the dataset loaders."""


class MissingDataError(FileNotFoundError):
  """A dataset file is missing; the message names the path and how to get it.

  Nothing is ever downloaded at run time: loaders raise this instead.
  """


def missing_file(path, what, how_to_get):
  """Returns a `MissingDataError` naming `path`, what it is and where to get it."""
  return MissingDataError(f"{what} not found at {str(path)!r}. {how_to_get}")

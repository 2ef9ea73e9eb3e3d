"""A pytest plugin: each failure is named on its own line when it happens.

pytest names failing tests only in its summary, at the end. A run cut short there
(CI's time limit, a stopped session) shows an `F` among the progress dots and no
name; with this plugin its log already says which test failed and in which phase.
Under pytest-xdist the line comes from the controller, which receives every worker's
reports.
"""

import pytest


class FailureLines:
  """Writes `FAILED <node id> (<phase>)` to the terminal as each failure arrives."""

  def __init__(self, reporter):
    self._reporter = reporter

  @pytest.hookimpl(trylast=True)  # after the reporter's own `F`
  def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
    if report.failed:
      self._reporter.write("\n")  # off the progress dots' line
      self._reporter.write_line(
          f"FAILED {report.nodeid} ({report.when}); its traceback is in the summary")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
  reporter = config.pluginmanager.get_plugin("terminalreporter")
  if reporter is not None and not hasattr(config, "workerinput"):  # not an xdist worker
    config.pluginmanager.register(FailureLines(reporter), "failure-lines")

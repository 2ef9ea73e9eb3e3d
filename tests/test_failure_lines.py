"""The suite's `failure_lines` plugin names a failure when it happens, before the
summary, in one process and under pytest-xdist as `make test` runs it."""

import os
import subprocess
import sys

import pytest

_TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_failure_is_named_before_the_summary(tmp_path, workers):
  (tmp_path / "test_two.py").write_text(
      "def test_passes():\n  pass\n\n"
      "def test_fails():\n  assert 1 == 2\n")
  env = dict(os.environ, PYTHONPATH=_TESTS)
  done = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "failure_lines", "-p", "no:cacheprovider",
       "-n", workers, f"--rootdir={tmp_path}", str(tmp_path / "test_two.py")],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert done.returncode == 1, done.stdout + done.stderr
  out = done.stdout
  line = "FAILED test_two.py::test_fails (call); its traceback is in the summary"
  assert line in out.splitlines(), out
  assert out.index(line) < out.index("= FAILURES =") < out.index("1 failed, 1 passed"), out
  assert "test_passes (" not in out, out  # a passing test gets no line

"""Launchers run as `python -m launchers.<name> ARGS` runs them, each in a process of
its own forked from one interpreter that has already imported the TensorFlow-free
modules every launcher imports first (absl, numpy, grpc, `tfbfl.flags`,
`tfbfl.driver`): for the tests of what a launcher does before TensorFlow (its flag
refusals), whose ~1 s of interpreter start-up and imports each was most of their time.

Each launcher runs alone in its child, as `__main__` (`runpy`, `sys.argv` as `python
-m` sets it), with its own absl flags and its own imports of everything else, stdin
from /dev/null, stdout and stderr captured, and its exit status returned as a
process's (`SystemExit`'s code; an uncaught exception: its traceback, status 1). When
it ends, the child lists the TensorFlow modules it holds (`tensorflow_modules`): the
server refuses to start if its preloaded modules imported any, so a listed module was
imported by the launcher, which is what `python -X importtime` told before.
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOADED = ("absl.app", "absl.flags", "numpy", "tfbfl.flags", "tfbfl.driver")

_SERVER = r'''
import importlib, json, os, runpy, sys, traceback

TF = ("tensorflow", "tensorflow_federated")


def tf_modules():
  return sorted(m for m in sys.modules if m.split(".")[0] in TF)


for name in json.loads(sys.argv[1]):
  importlib.import_module(name)
if tf_modules():
  print(json.dumps(dict(error="preloading imported TensorFlow: %s" % tf_modules()[:5])),
        flush=True)
  sys.exit(1)
print(json.dumps(dict(ready=True)), flush=True)


def child(req):
  code = 1
  try:
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, req["stdout"], os.O_WRONLY | os.O_TRUNC),
                            (2, req["stderr"], os.O_WRONLY | os.O_TRUNC)):
      os.dup2(os.open(path, flags), fd)
    sys.argv = [req["module"], *req["argv"]]  # runpy sets argv[0] to the module's file
    try:
      runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as e:
      if e.code is None or isinstance(e.code, int):
        code = e.code or 0
      else:
        print(e.code, file=sys.stderr)
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
    with open(req["result"], "w") as f:
      json.dump(dict(tensorflow_modules=tf_modules()), f)
  finally:
    os._exit(code)


for line in sys.stdin:
  req = json.loads(line)
  pid = os.fork()
  if pid == 0:
    child(req)
  _, status = os.waitpid(pid, 0)
  print(json.dumps(dict(returncode=os.waitstatus_to_exitcode(status))), flush=True)
'''


class Result:
  """What a forked launcher did: `returncode`, `stdout`, `stderr`, `tensorflow_modules`
  (the TensorFlow modules it had imported when it ended) and `elapsed` (seconds)."""

  def __init__(self, returncode, stdout, stderr, tensorflow_modules, elapsed):
    self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
    self.tensorflow_modules, self.elapsed = tensorflow_modules, elapsed

  def __repr__(self):
    return (f"Result(returncode={self.returncode}, stderr={self.stderr[-2000:]!r}, "
            f"tensorflow_modules={self.tensorflow_modules[:5]})")


class LauncherForks:
  """The forking interpreter (from the repository root, `PYTHONPATH` on it); `run`
  starts one launcher; `close` ends the interpreter."""

  def __init__(self, timeout=120):
    self.timeout = timeout
    self._dir = tempfile.mkdtemp(prefix="launcher-forks-")
    self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-c", _SERVER, json.dumps(PRELOADED)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True)  # its own process group: a hung launcher ends with it
    reply = self._reply()
    if not reply.get("ready"):
      self.close()
      raise RuntimeError(reply)

  def _reply(self):
    """The interpreter's next line; it and its launcher are killed after `timeout`."""
    ready, _, _ = select.select([self._proc.stdout], [], [], self.timeout)
    if not ready:
      os.killpg(self._proc.pid, signal.SIGKILL)
      self._proc.wait()
      raise TimeoutError(f"no reply from the forking interpreter in {self.timeout} s")
    line = self._proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the forking interpreter exited ({self._proc.wait()})")
    return json.loads(line)

  def run(self, module, *argv):
    """`python -m <module> *argv`, forked; returns a `Result`."""
    paths = {k: os.path.join(self._dir, k) for k in ("stdout", "stderr", "result")}
    for path in paths.values():
      open(path, "w").close()  # pylint: disable=consider-using-with
    start = time.monotonic()
    self._proc.stdin.write(json.dumps(dict(module=module, argv=list(argv), **paths)) + "\n")
    self._proc.stdin.flush()
    returncode = self._reply()["returncode"]
    elapsed = time.monotonic() - start
    texts = {}
    for k, path in paths.items():
      with open(path) as f:
        texts[k] = f.read()
    # None where the child ended before it could list them (then no test passes on it).
    modules = json.loads(texts["result"])["tensorflow_modules"] if texts["result"] else None
    return Result(returncode, texts["stdout"], texts["stderr"], modules, elapsed)

  def close(self):
    if self._proc.poll() is None:
      self._proc.stdin.close()
      try:
        self._proc.wait(timeout=self.timeout)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait()
    self._proc.stdout.close()
    for name in os.listdir(self._dir):
      os.remove(os.path.join(self._dir, name))
    os.rmdir(self._dir)

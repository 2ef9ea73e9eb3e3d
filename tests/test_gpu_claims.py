"""GPUs as they are: rounds run in TFF's `worker_binary`, which links no CUDA runtime.

`tfbfl.runtime.check.scan_for_cuda` reads the binary (its `ldd` dependencies and its
bytes) rather than asserting a sentence; `make check-install` prints its verdict; and
BUILD.md says that rounds run on the CPU instead of claiming that the worker uses a GPU.
"""

import io
import os
import re

import pytest

from tfbfl.runtime import check
from tfbfl.runtime.worker_process import worker_binary_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_MD = os.path.join(ROOT, "BUILD.md")

# The claims BUILD.md made before issue 33: nobody ran them, and the first two are false.
OLD_CLAIMS = (
    "The TFF worker runs TensorFlow ops inside its own process and sees the same devices",
    "worker runs TensorFlow ops inside its own process and sees the same devices",
    "Launchers need no flag for the GPU",
    "it uses the GPU if CUDA 11.8 / cuDNN 8.6",
)


def _fake_binary(tmp_path, name, content: bytes) -> str:
  """Returns the path of a small file holding `content` (not a real ELF file)."""
  path = tmp_path / name
  path.write_bytes(b"\x7fELF-not-really\0" + content + b"\0tail")
  return str(path)


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def _gpu_section(text):
  """Returns BUILD.md's `## ...GPU...` section (up to the next `## ` heading)."""
  match = re.search(r"^## [^\n]*GPU[^\n]*\n(.*?)(?=^## )", text, re.M | re.S)
  assert match, "BUILD.md has no section with GPU in its heading"
  return match.group(0)


def test_installed_worker_binary_is_cpu_only():
  path = worker_binary_path()
  scan = check.scan_for_cuda(path)
  assert scan.path == path
  assert not scan.has_cuda, scan.evidence()
  assert scan.cuda_libraries == () and scan.cuda_markers == ()
  line = check.rounds_line(scan)
  assert line.startswith(f"rounds: TFF worker_binary at {path}, CPU only")
  assert "links no CUDA runtime" in line


def test_installed_worker_binary_scan_lists_its_libraries_where_ldd_exists():
  if not check.shutil.which("ldd"):
    pytest.skip("no ldd on this machine")
  scan = check.scan_for_cuda(worker_binary_path())
  assert scan.dependencies, "ldd listed no dependency of the worker binary"
  assert any(d.startswith("libc.so") for d in scan.dependencies), scan.dependencies
  assert f"among its {len(scan.dependencies)} dependencies" in scan.evidence()


def test_verdict_comes_from_the_file_bytes(tmp_path):
  cuda = check.scan_for_cuda(_fake_binary(tmp_path, "with_cuda", b"libcudart.so.11.0"))
  assert cuda.has_cuda
  assert cuda.cuda_markers == ("cudart",)
  assert "references CUDA" in check.rounds_line(cuda)
  assert "CPU only" not in check.rounds_line(cuda)

  factory = check.scan_for_cuda(
      _fake_binary(tmp_path, "with_factory", b"N10tensorflow16GPUDeviceFactoryE"))
  assert factory.has_cuda and factory.cuda_markers == ("GPUDeviceFactory",)

  clean = check.scan_for_cuda(_fake_binary(tmp_path, "clean", b"ThreadPoolDeviceFactory"))
  assert not clean.has_cuda
  assert "CPU only" in check.rounds_line(clean)


def test_empty_file_has_no_cuda(tmp_path):
  path = tmp_path / "empty"
  path.write_bytes(b"")
  assert not check.scan_for_cuda(str(path)).has_cuda


def test_without_ldd_the_byte_scan_decides(tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))  # no ldd on it
  assert check.shutil.which("ldd") is None
  cuda = check.scan_for_cuda(_fake_binary(tmp_path, "with_cuda", b"libcudart.so.12"))
  assert cuda.dependencies is None and cuda.has_cuda
  clean = check.scan_for_cuda(_fake_binary(tmp_path, "clean", b"libc.so.6"))
  assert clean.dependencies is None and not clean.has_cuda
  assert "ldd unavailable" in check.rounds_line(clean)


def test_a_cuda_library_among_the_dependencies_counts(tmp_path, monkeypatch):
  deps = ("linux-vdso.so.1", "libcudart.so.11.0", "libcublasLt.so.11", "libc.so.6")
  monkeypatch.setattr(check, "_ldd_dependencies", lambda path: deps)
  scan = check.scan_for_cuda(_fake_binary(tmp_path, "linked", b"nothing to see"))
  assert scan.cuda_markers == ()
  assert scan.cuda_libraries == ("libcudart.so.11.0", "libcublasLt.so.11")
  assert scan.has_cuda
  assert "ldd lists libcudart.so.11.0, libcublasLt.so.11" in check.rounds_line(scan)


def test_check_install_prints_where_rounds_run():
  out = io.StringIO()
  assert check.check_install(stream=out) == pytest.approx(3.0)
  lines = out.getvalue().splitlines()
  gpu = [line for line in lines if "GPUs visible" in line]
  assert len(gpu) == 1
  assert gpu[0].startswith(
      "GPUs visible to the launcher process's TensorFlow (not where rounds run): ")
  rounds = [line for line in lines if line.startswith("rounds: ")]
  assert rounds == [check.rounds_line(check.scan_for_cuda(worker_binary_path()))]
  assert "CPU only" in rounds[0]


def test_build_md_drops_the_gpu_claims():
  text = _read(BUILD_MD)
  flat = " ".join(text.split())
  for claim in OLD_CLAIMS:
    assert claim not in flat, claim
  assert "sees the same devices" not in flat


def test_build_md_gpu_section_says_rounds_run_on_the_cpu():
  section = " ".join(_gpu_section(_read(BUILD_MD)).split())
  assert re.search(r"[Rr]ounds run on the CPU", section), section[:300]
  assert "worker_binary" in section
  assert "links no CUDA runtime" in section
  # The evidence: the commands and TFF's two open reports.
  assert "ldd" in section and "cudart" in section
  assert "3709" in section and "4600" in section
  assert "none of it was built, installed or run here" in section

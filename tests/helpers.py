"""Shared test helpers: the float64 reference, the error measure, input generation, and a child
process with a time limit (the watchdog's)."""

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pytest
import torch

from monarch_fftconv.policy import ERROR_BUDGETS as BUDGETS  # noqa: F401  (re-exported)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_script(name: str, path) -> object:
    """A script that is not a package module (benchmarks/*.py), imported under `name`, registered
    in sys.modules first: dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def is_png(path) -> bool:
    """Whether the file at path starts as a PNG does (the plots the benchmark and examples write)."""
    with open(path, "rb") as f:
        return f.read(len(PNG_MAGIC)) == PNG_MAGIC


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

WATCHDOG_CHILD_ENV = "MONARCH_FFTCONV_WATCHDOG_CHILD"  # set in a watchdog's child: run the test here
WATCHDOG_REPORT_ENV = "MONARCH_FFTCONV_WATCHDOG_REPORT"  # the file that child writes its tests' events to
# The limit of a watched GPU test (conftest.py's watchdog marker), from the test's start in the
# child (the child's own start has conftest's WATCHDOG_IDLE_S): the tests take well under a second.
GPU_WATCHDOG_S = 60


# fp16's range on the tensor-core route (README, "Precision"; the portable engine rounds where the
# mma.sync kernel does). Floor: the filtered spectrum, 1/N folded in, rounded among fp16's
# subnormals (spacing 2^-24); N such roundings leave about this error norm on each output.
def fp16_subnormal_error(fft_size: int) -> float:
    return 2.0**-24 * (fft_size / 6) ** 0.5


# Ceiling: stage 1 sums a column's ceil(L/M) live rows into an fp16 operand; a constant input
# above this overflows it.
def fp16_constant_ceiling(length: int) -> float:
    from monarch_fftconv.planner import plan_for

    return torch.finfo(torch.float16).max / -(-length // plan_for(length).row_size)


def randn(gen: torch.Generator, *shape: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Standard normal values drawn on the CPU from `gen` (reproducible on any device)."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def reference(u: torch.Tensor, k: torch.Tensor, D: torch.Tensor | None = None) -> torch.Tensor:
    """Causal convolution in float64 with torch.fft (independent of the package)."""
    length = u.shape[-1]
    n = 2 * length
    y = torch.fft.irfft(torch.fft.rfft(u.double(), n=n) * torch.fft.rfft(k.double(), n=n), n=n)[..., :length]
    if D is not None:
        y = y + D.double().unsqueeze(-1) * u.double()
    return y


def two_sided_circle(k: torch.Tensor, n: int) -> torch.Tensor:
    """A bidirectional filter bank (G, 2, Lk) as float64 N-point circles: causal tap s at bin s,
    anti-causal tap s at bin N - s."""
    k = k.cpu().double()
    taps = k.shape[-1]
    circle = torch.zeros(k.shape[0], n, dtype=torch.float64)
    circle[:, :taps] += k[:, 0]
    circle[:, 0] += k[:, 1, 0]
    circle[:, n - torch.arange(1, taps)] += k[:, 1, 1:]
    return circle


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.is_complex() or ref.is_complex():  # .double() would drop the imaginary parts
        out, ref = out.to(torch.complex128), ref.to(torch.complex128)
        return ((out - ref).abs().norm() / ref.abs().norm()).item()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@dataclass(frozen=True)
class ChildRun:
    returncode: int | None  # None: still running at the time limit, and killed
    output: str             # stdout and stderr, interleaved as written
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]


class Child:
    """A process in a session of its own, for a caller that polls it and may kill it: its output
    goes to a file (a pipe nobody reads while polling would fill and block the child)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, cwd=None):
        self.started = time.monotonic()
        self.killed = False
        self._output = tempfile.TemporaryFile()
        self.process = subprocess.Popen(argv, stdout=self._output, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                        start_new_session=True)

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None if still running after `timeout` seconds."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL to the whole session: a process spinning in a hung kernel ignores nothing else
        reliably, and anything it started goes with it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.killed = True

    def output(self) -> str:
        self._output.seek(0)
        return self._output.read().decode(errors="replace")

    def result(self) -> ChildRun:
        """What it left: its exit status (None if it was killed), its output, its time."""
        return ChildRun(None if self.killed else self.process.returncode, self.output(),
                        time.monotonic() - self.started)


def run_child(argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd=None) -> ChildRun:
    """Runs argv in a session of its own; past `timeout` seconds the whole session is killed, so
    the caller gets the output so far instead of waiting forever."""
    child = Child(argv, env, cwd)
    if child.wait(timeout) is None:
        child.kill()
    return child.result()


def run_python(code: str, timeout: float) -> ChildRun:
    """A snippet in a child python with the parent's environment, under run_child's time limit."""
    return run_child([sys.executable, "-c", code], timeout)

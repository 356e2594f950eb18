"""Shared test helpers: the float64 reference, the error measure, input generation, and a child
process with a time limit (the watchdog's)."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import torch

from monarch_fftconv.policy import ERROR_BUDGETS as BUDGETS  # noqa: F401  (re-exported)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

WATCHDOG_CHILD_ENV = "MONARCH_FFTCONV_WATCHDOG_CHILD"  # set in a watchdog's child: run the test here
# The limit of a watched GPU test (conftest.py's watchdog marker): a child's start (torch, the
# built extension, a CUDA context) takes seconds, the tests themselves well under one.
GPU_WATCHDOG_S = 60


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


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
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


def run_child(argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd=None) -> ChildRun:
    """Runs argv in a session of its own; past `timeout` seconds the whole session is killed
    (SIGKILL: a process spinning in a hung kernel ignores nothing else reliably), so the caller
    gets the output so far instead of waiting forever."""
    start = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                             start_new_session=True)
    try:
        output, _ = child.communicate(timeout=timeout)
        return ChildRun(child.returncode, output, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        return ChildRun(None, output, time.monotonic() - start)


def run_python(code: str, timeout: float) -> ChildRun:
    """A snippet in a child python with the parent's environment, under run_child's time limit."""
    return run_child([sys.executable, "-c", code], timeout)

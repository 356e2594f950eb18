"""Shared test helpers: the float64 reference, the error measure, input generation."""

import pytest
import torch

from monarch_fftconv.policy import ERROR_BUDGETS as BUDGETS  # noqa: F401  (re-exported)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


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

"""Precision policy: which matmul operand precision a call uses.

Resolution order, first match wins:
1. the per-call argument  ``fftconv(..., precision="bf16")``;
2. the innermost ``with monarch_fftconv.precision("bf16"):`` block of the calling thread;
3. the module attribute    ``FFTConv(..., precision="bf16")`` / ``module.precision = ...``;
4. the environment variable ``MONARCH_FFTCONV_PRECISION`` (read at call time, never at import);
5. the default: ``"fp32"`` (fp32-accurate) for float32/float64 inputs, the input's own type
   for bfloat16/float16 inputs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

# Relative L2 error against a float64 torch.fft reference that each precision promises
# (docs/design.md, "Error budgets"). The one home of these numbers: tests, the benchmark
# and the docs read them from here.
ERROR_BUDGETS = {"fp32": 2e-6, "tf32": 1e-3, "fp16": 2e-3, "bf16": 1e-2}
ENV_VAR = "MONARCH_FFTCONV_PRECISION"

class _ThreadOverrides(threading.local):
    """Each thread's stack of precision() blocks, innermost last: thread-local like
    PyTorch's own modes (autocast, no_grad). threading.local rather than a ContextVar:
    torch.compile traces (and guards on) reads of it, while ContextVar.get breaks the graph."""

    def __init__(self) -> None:
        self.stack: list[str] = []


overrides = _ThreadOverrides()

_DEFAULT_FOR_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# (precision, source) of the default per input dtype, built once: resolve() runs on every call.
_DEFAULTS = {dtype: (_DEFAULT_FOR_DTYPE.get(dtype, "fp32"), f"the default for {str(dtype).removeprefix('torch.')} input")
             for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def check_precision(name: object, source: str = "precision", optional: bool = True) -> str:
    """name, if it is a precision; else a ValueError naming `source` (None: allowed when optional)."""
    if not isinstance(name, str) or name not in PRECISIONS:
        allowed = ", ".join(map(repr, PRECISIONS)) + (" or None" if optional else "")
        raise ValueError(f"{source} must be one of {allowed}, got {name!r}")
    return name


@contextlib.contextmanager
def precision(name: str) -> Iterator[None]:
    """Override the precision of every call inside the block that passes no ``precision=``."""
    stack = overrides.stack
    stack.append(check_precision(name, "monarch_fftconv.precision(name): name", optional=False))
    try:
        yield
    finally:
        stack.pop()


def resolve(call_arg: str | None, dtype: torch.dtype, module_attr: str | None = None) -> tuple[str, str]:
    """Return (precision, where it came from)."""
    if call_arg is not None:
        return check_precision(call_arg), "the precision= argument"
    if stack := overrides.stack:
        return stack[-1], "the monarch_fftconv.precision() context"
    if module_attr is not None:
        return check_precision(module_attr, "FFTConv.precision"), "the module's precision attribute"
    if env := os.environ.get(ENV_VAR):
        return check_precision(env, ENV_VAR, optional=False), f"the {ENV_VAR} environment variable"
    return _DEFAULTS[dtype]

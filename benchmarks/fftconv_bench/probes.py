"""Probes of one method beyond its time: peak GPU memory and kernel launches of one call
(torch.profiler), and board energy per call from NVML (--energy). All are None on the CPU."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence

import torch

Call = Callable[[], Any]


def peak_extra_memory(call: Call, device: str) -> Optional[int]:
    """Peak GPU memory allocated during one call beyond what was allocated before (bytes,
    outputs included)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def count_kernel_launches(call: Call, device: str) -> Optional[Dict[str, int]]:
    """CUDA kernels (and memcpy/memset operations) of one call, from torch.profiler."""
    if device != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = call()
        torch.cuda.synchronize()
    del out
    kernels = memops = 0
    for ev in prof.events():
        if getattr(ev, "device_type", None) != DeviceType.CUDA:
            continue
        name = ev.name.lower()
        if name.startswith("memcpy") or name.startswith("memset"):
            memops += 1
        else:
            kernels += 1
    return {"kernels": kernels, "memops": memops}


class EnergyMeter:
    """Board energy from NVML (nvmlDeviceGetTotalEnergyConsumption, mJ since driver load)."""

    def __init__(self, device: str):
        self.handle = None
        self.note = None
        if device != "cuda":
            self.note = "energy skipped: no CUDA device"
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            handle = _nvml_handle_of_current_device(pynvml)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            self.handle = handle
            self.note = ("energy: NVML total board energy per call (includes idle/static power), "
                         "averaged over >= 1 s of back-to-back calls")
        except Exception as e:  # noqa: BLE001
            self.note = f"energy skipped: NVML unavailable ({type(e).__name__}: {e})"

    @property
    def available(self) -> bool:
        return self.handle is not None

    def per_call_mj(self, calls: Sequence[Call], median_s: float,
                    min_seconds: float = 1.0, min_calls: int = 50) -> Optional[float]:
        """Board energy per call (mJ) over >= min_seconds and >= min_calls back-to-back calls."""
        if self.handle is None:
            return None
        n_calls = max(min_calls, int(math.ceil(min_seconds / max(median_s, 1e-7))))
        torch.cuda.synchronize()
        before_mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        for i in range(n_calls):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
        after_mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        return (after_mj - before_mj) / n_calls


def _nvml_handle_of_current_device(pynvml):
    """The NVML device of torch's current device, matched by PCI address (NVML and CUDA may
    number devices differently); by index when torch does not report the address."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain = getattr(props, "pci_domain_id", 0)
        dev = getattr(props, "pci_device_id", 0)
        bus_id = f"{domain:08X}:{bus:02X}:{dev:02X}.0"
        for arg in (bus_id, bus_id.encode()):   # pynvml versions differ: str or bytes
            try:
                return pynvml.nvmlDeviceGetHandleByPciBusId(arg)
            except Exception:  # noqa: BLE001
                pass
    return pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

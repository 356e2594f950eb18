"""The clocks: seconds per call, two ways; their median and IQR; the device copy bandwidth; and
how many input buffer sets keep the inputs out of the cache.

Back-to-back (throughput): after the warm-up, `reps` calls are enqueued one after another with a
CUDA event pair around each. The host runs ahead of the GPU, so one call's Python dispatch and
kernel launches overlap the previous call's kernels: the time is what the GPU spends per call
in a steady stream, as in a training loop that never synchronizes.

Per-call latency: one call at a time on an idle GPU. torch.cuda.synchronize() drains the queue,
an event is recorded just before the call (the idle GPU passes it at once), and the time runs
until the call's last kernel is done. Host overhead (Python, dispatch, launch latency, any host
synchronization inside the call) is now on the critical path, since the GPU has nothing queued
while the host works. At small sizes, where a call's kernels take microseconds, that overhead
dominates and the latency can be several times the back-to-back time; at large sizes the two
converge. A method that launches fewer kernels or does less host work gains more here.

Before either, a warm-up that lasts until the times settle (warm_up), not a fixed count.
An optional cache flush between reps (a write of a large buffer) stays outside both timed
regions. CPU: time.perf_counter around each call for both figures (no asynchrony: they measure
the same thing and differ only by noise).
"""
from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

Call = Callable[[], Any]
MAX_BUFFERS = 64
GPU_FLUSH_BYTES = 256 * 2**20   # > 4x a 60 MB L2
HOST_CACHE_GUESS_BYTES = 32 * 2**20
GPU_L2_FALLBACK_BYTES = 60 * 2**20
# Warm-up (warm_up): at least a time, then windows of calls until two in a row agree. The
# time comes first because a slow start can be flat: a host process's first calls ran at 23 ms
# for ~0.3 s, then at 0.15 ms, and two windows of that plateau agree with each other.
CPU_WARMUP_SECONDS = 1.0
GPU_WARMUP_SECONDS = 0.2     # clocks ramping up from idle
WARMUP_WINDOW = 5
SETTLE_TOLERANCE = 0.10
WARMUP_MAX_SECONDS = 10.0
# IQR / median above which a timing is noise rather than a measurement (guard.validate_spread,
# the CLI's --max-spread): a rerun's median could move by about as much.
MAX_SPREAD = 0.25


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def warm_up(calls: Sequence[Call], warmup: int, device: str, *, min_seconds: float,
            flush: Optional[torch.Tensor] = None,
            max_seconds: float = WARMUP_MAX_SECONDS) -> Dict[str, Any]:
    """Calls until their times settle: `warmup` calls, every buffer set once (plans, caches,
    compilation) and `min_seconds` of calls; then windows of WARMUP_WINDOW calls on the
    back-to-back clock until two in a row have medians within SETTLE_TOLERANCE, or
    `max_seconds` have passed. First-call costs (allocator, thread pools, clocks) can last
    longer than a fixed count, and the run's first method then pays them in its median.

    Returns {"calls", "seconds", "settled"}: settled False means the times were still moving
    when the time ran out."""
    start = time.perf_counter()
    calls_made = 0
    while calls_made < max(warmup, len(calls)) or time.perf_counter() - start < min_seconds:
        calls[calls_made % len(calls)]()
        calls_made += 1
        if calls_made % len(calls) == 0:
            synchronize(device)   # min_seconds of device work, not of calls queued ahead of it
    synchronize(device)
    previous = None
    settled = False
    while not settled and time.perf_counter() - start < max_seconds:
        window = statistics.median(time_back_to_back(calls, reps=WARMUP_WINDOW, device=device,
                                                     flush=flush))
        calls_made += WARMUP_WINDOW
        settled = previous is not None and abs(window - previous) <= SETTLE_TOLERANCE * min(window, previous)
        previous = window
    return {"calls": calls_made, "seconds": time.perf_counter() - start, "settled": settled}


def time_back_to_back(calls: Sequence[Call], *, reps: int, device: str,
                      flush: Optional[torch.Tensor] = None) -> List[float]:
    """Seconds per rep for `reps` calls, rotating through `calls` (one per input buffer set)."""
    n = len(calls)
    if device != "cuda":
        return [_host_seconds(calls[i % n], flush) for i in range(reps)]
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_()
        starts[i].record()
        calls[i % n]()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]


def time_per_call_latency(calls: Sequence[Call], *, reps: int, device: str,
                          flush: Optional[torch.Tensor] = None) -> List[float]:
    """Seconds from just before each call, the device idle, until its work is done."""
    n = len(calls)
    if device != "cuda":
        return [_host_seconds(calls[i % n], flush) for i in range(reps)]
    times = []
    for i in range(reps):
        if flush is not None:
            flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        calls[i % n]()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def _host_seconds(call: Call, flush: Optional[torch.Tensor]) -> float:
    if flush is not None:
        flush.zero_()
    t0 = time.perf_counter()
    out = call()
    t1 = time.perf_counter()
    del out
    return t1 - t0


def busy_cpu_seconds() -> Optional[float]:
    """CPU seconds every process on the host has been busy since boot (Linux /proc/stat: user,
    nice, system, irq, softirq, and steal: time a hypervisor ran something else), or None."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(t) for t in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """The cores that other processes kept busy from its creation until other_cores(): the host
    clock times this process alone only when they leave it the cores its threads need."""

    def __init__(self) -> None:
        self.busy, self.own, self.wall = busy_cpu_seconds(), time.process_time(), time.perf_counter()

    def other_cores(self) -> Optional[float]:
        busy, wall = busy_cpu_seconds(), time.perf_counter() - self.wall
        if busy is None or self.busy is None or wall <= 0:
            return None
        others = (busy - self.busy) - (time.process_time() - self.own)
        return max(0.0, others / wall)


def summarize(times: Sequence[float]) -> Dict[str, float]:
    """Median, quartiles, inter-quartile range, min and max (seconds)."""
    ts = sorted(times)
    if len(ts) >= 2:
        q1, _, q3 = statistics.quantiles(ts, n=4, method="inclusive")
    else:
        q1 = q3 = ts[0]
    return {"median_s": statistics.median(ts), "q1_s": q1, "q3_s": q3, "iqr_s": q3 - q1,
            "min_s": ts[0], "max_s": ts[-1]}


def spread(summary: Dict[str, float]) -> float:
    """IQR / median of a summary: the relative spread of one clock's reps (inf at median 0)."""
    return summary["iqr_s"] / summary["median_s"] if summary["median_s"] > 0 else math.inf


def relative_gap(a: float, b: float) -> float:
    """|a - b| / min(a, b): how far apart two medians are (inf if one is 0)."""
    return abs(a - b) / min(a, b) if min(a, b) > 0 else math.inf


def milliseconds(summary: Dict[str, float], prefix: str = "") -> Dict[str, float]:
    """{'median_s': x} -> {prefix + 'median_ms': 1e3 x}: the row fields of a summary."""
    return {prefix + name[:-2] + "_ms": seconds * 1e3 for name, seconds in summary.items()}


def copy_bandwidth(device: str, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device copy bandwidth in bytes/s: a large copy, (bytes read + bytes written) / time."""
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy = [lambda: dst.copy_(src)]
    warm_up(copy, 2, device, min_seconds=0.0)
    median_s = statistics.median(time_back_to_back(copy, reps=reps, device=device))
    del copy, src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * n * 4 / median_s


def cache_bytes(device: str) -> int:
    """The GPU's L2 size; on the host a guess at the last-level cache."""
    if device != "cuda":
        return HOST_CACHE_GUESS_BYTES
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 0) or 0
    return int(l2) if l2 > 0 else GPU_L2_FALLBACK_BYTES


def flush_bytes(device: str) -> int:
    """Size of the buffer written between reps to evict the inputs from the cache."""
    return GPU_FLUSH_BYTES if device == "cuda" else 2 * cache_bytes(device)


def buffer_plan(set_bytes: int, cache_size: int) -> Tuple[int, bool]:
    """(number of input buffer sets, whether an explicit cache flush is needed): enough sets that
    their total is >= 2x the cache; if that would take more than MAX_BUFFERS, flush instead."""
    need = max(2, math.ceil(2 * cache_size / max(set_bytes, 1)))
    if need <= MAX_BUFFERS:
        return need, False
    return 2, True

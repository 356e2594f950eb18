"""What the run prints: its header (device, sources, copy bandwidth), progress, one plain-text
table per shape, and the closing summary."""
from __future__ import annotations

import math
import sys
from typing import Any, Dict, List, Sequence

from fftconv_bench.guard import ATOL, RTOL, grad_names, is_accurate
from fftconv_bench.outputs import CPU_NOTE

RULE = "=" * 100
TABLE_COLUMNS = ["method", "backend", "prec", "b2b ms", "b2b IQR", "latency ms", "lat. IQR",
                 "check", "speedup", "GB/s", "TFLOP/s", "rel err", "allclose", "budget", "peak MB",
                 "kernels", "mJ/call"]
TIMING_LEGEND = ("  b2b: median of calls enqueued back to back (throughput); latency: one call at "
                 "a time, device idle before it, host overhead included; speedup, GB/s and "
                 "TFLOP/s from b2b")


def format_value(value: Any, spec: str = ".3g", none: str = "-") -> str:
    if value is None:
        return none
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def header_lines(env: Dict[str, Any], device: str) -> List[str]:
    """The lines naming what ran where, printed before the first shape: the GPU and CUDA, or
    the CPU (no CUDA version: none was used)."""
    lines = [RULE, f"monarch_fftconv vs torch.fft ({env['fft_library']}) benchmark "
                   f"(sources {env['source_digest']}, git {env.get('git_commit') or '?'})"]
    if device == "cuda":
        lines.append(f"GPU: {env['gpu_name']} ({env['gpu_memory_gib']} GiB, "
                     f"sm_{env['gpu_capability']}, L2 {env['l2_cache_bytes'] / 2**20:.0f} MiB) | "
                     f"torch {env['torch_version']} | CUDA {env['cuda_version']}")
    else:
        lines.append(f"DEVICE: CPU, {env['cpu']} ({env['threads']} torch thread(s) of "
                     f"{env['cores']} cores) | torch {env['torch_version']}")
        lines.append("*** " + CPU_NOTE + " ***")
    return lines


def check_legend(max_spread: float) -> str:
    """What the check column's verdicts mean, the noise threshold stated."""
    return (f"  check: OK; NOISY, an IQR above {max_spread:.0%} of the median on either clock, or "
            f"on CPU the two clocks' medians that far apart or other processes holding cores "
            f"this run needed (untrusted: no speedup); INVALID, under the memory floor")


def _accuracy_cells(row: Dict[str, Any]) -> List[str]:
    """rel err (with the grads' in brackets), allclose (y/grads), error budget."""
    err = format_value(row.get("rel_err"), ".2e")
    grads = grad_names(row)
    if grads:
        err += " (" + ", ".join(f"d{name} {format_value(row[f'grad_{name}_rel_err'], '.1e')}"
                                for name in grads) + ")"
    allclose = "yes" if row.get("allclose") else "NO"
    if grads:
        allclose += "/" + ("yes" if all(row[f"grad_{name}_allclose"] for name in grads) else "NO")
    budget = "-"
    if row.get("error_budget") is not None:
        budget = (("ok" if row.get("within_error_budget") else "OVER")
                  + f" {row['error_budget']:.0e}")
    return [err, allclose, budget]


def _speedup_cell(row: Dict[str, Any]) -> str:
    if row.get("validity") == "INVALID":
        return "INVALID"
    if row.get("same_computation_as"):
        return "=" + row["same_computation_as"]
    if row.get("validity") == "NOISY":
        return "NOISY"
    speedup = row.get("speedup_vs_reference")
    if not speedup:
        return "-"
    return format_value(speedup, ".2f") + "x" + ("" if is_accurate(row) else "*")


def table_cells(row: Dict[str, Any]) -> List[str]:
    """One row of the printed table, aligned with TABLE_COLUMNS."""
    name = [row["method"], row.get("backend") or "-", row.get("precision") or "-"]
    if row["status"] != "ok":
        return name + ["ERROR"] + [""] * (len(TABLE_COLUMNS) - 4)
    return name + [
        format_value(row["median_ms"], ".4f"), format_value(row["iqr_ms"], ".4f"),
        format_value(row.get("latency_median_ms"), ".4f"),
        format_value(row.get("latency_iqr_ms"), ".4f"), row["validity"], _speedup_cell(row),
        format_value(row.get("gbps"), ".3g"), format_value(row.get("tflops"), ".3g"),
        *_accuracy_cells(row),
        format_value(row.get("peak_extra_mb"), ".1f"),
        format_value(row.get("kernel_launches"), "d"), format_value(row.get("energy_mj"), ".2f")]


def _aligned(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(c), *(len(str(t[i])) for t in cells)) for i, c in enumerate(columns)]

    def line(values):
        return "  ".join(str(v).ljust(w) for v, w in zip(values, widths)).rstrip()
    return [line(columns), line(["-" * w for w in widths])] + [line(t) for t in cells]


def format_table(rows: Sequence[Dict[str, Any]], max_spread: float) -> str:
    """Plain-text table for one shape/pass, with its footnotes; `max_spread` is the run's
    noise threshold (IQR / median)."""
    if not rows:
        return ""
    r0 = rows[0]
    operator = r0.get("operator", "plain")
    head = (f"{r0['shape']} (BxCxL, {r0.get('io_dtype', 'float32')})"
            f"{'' if operator == 'plain' else f'  operator={operator}'}  pass={r0['pass']}  reps={r0['reps']}  "
            f"buffers={r0['n_buffers']}{' +L2 flush' if r0['l2_flush'] else ''}"
            f"{' (inputs cache-resident: --quick)' if r0.get('cache_resident_inputs') else ''}  "
            f"memory floor={format_value(r0['floor_ms'], '.4f')} ms")
    cells = [table_cells(r) for r in rows]
    out = [head] + _aligned(TABLE_COLUMNS, cells) + [TIMING_LEGEND, check_legend(max_spread)]
    if any(c[TABLE_COLUMNS.index("speedup")].endswith("*") for c in cells):
        out.append(f"  * fails allclose(atol={ATOL:.0e}, rtol={RTOL:.0e}) vs float64: the speedup "
                   "is not at equal accuracy")
    if any(r.get("validity") == "INVALID" for r in rows):
        out.append("  INVALID: median time under the memory floor (compulsory bytes / measured "
                   "copy bandwidth): a measurement or correctness bug, not a speedup")
    noisy = [f"{r['method']} ({r['noisy_because']})" for r in rows if r.get("validity") == "NOISY"]
    if noisy:
        out.append(f"  NOISY: {', '.join(noisy)}: more --reps, fewer --threads or a quieter "
                   "machine may settle them")
    if any(r.get("same_computation_as") for r in rows):
        out.append("  =X: runs the same code as row X (entry point, backend and kernel): its time "
                   "differs from X's by noise alone, so no speedup of its own; plotted once")
    unsettled = [r["method"] for r in rows if r.get("warmup_settled") is False]
    if unsettled:
        out.append(f"  warm-up still unsettled at its time limit: {', '.join(unsettled)} (their "
                   "medians may hold first-call costs)")
    out.extend(f"  ! {r['method']}: {r['error']}" for r in rows if r["status"] != "ok")
    return "\n".join(out)


def skip_lines(skipped: Sequence[Dict[str, Any]]) -> List[str]:
    """One line per reason: the methods it keeps from running, e.g. 'cudnn, cudnn.backward:
    skipped (no module named 'cudnn'; pip install ...)'."""
    methods_by_reason: Dict[str, List[str]] = {}
    for skip in skipped:
        methods_by_reason.setdefault(skip["reason"], []).append(skip["method"])
    return [f"{', '.join(methods)}: skipped ({reason})" for reason, methods in methods_by_reason.items()]


def row_summary(row: Dict[str, Any]) -> str:
    """A finished row in a few words, for the progress line."""
    if row["status"] != "ok":
        return "ERROR"
    return (f"b2b {format_value(row['median_ms'], '.4f')} ms, latency "
            f"{format_value(row.get('latency_median_ms'), '.4f')} ms, {row['validity']}")


class Progress:
    """tqdm if importable, else a printed counter: '[i/n] what ... result' (both on stderr)."""

    def __init__(self, total: int):
        self.total, self.started, self.bar = total, 0, None
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, file=sys.stderr, leave=False, dynamic_ncols=True)
        except Exception:  # noqa: BLE001
            self.bar = None

    def start(self, desc: str) -> None:
        self.started += 1
        if self.bar is not None:
            self.bar.set_description(desc)
        else:
            print(f"  [{self.started}/{self.total}] {desc} ...", end="", file=sys.stderr,
                  flush=True)

    def finish(self, row: Dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(row_summary(row))
            self.bar.update(1)
        else:
            print(" " + row_summary(row), file=sys.stderr, flush=True)

    def skip(self, line: str) -> None:
        """The started method was skipped: `line` says why."""
        if self.bar is not None:
            self.bar.update(1)
            self.bar.write(line)
        else:
            print(" skipped", file=sys.stderr, flush=True)
            print(line, flush=True)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

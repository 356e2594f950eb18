#!/usr/bin/env python
"""Read an Nsight Compute report (.ncu-rep) where no ncu is installed, and print what tuning a
kernel needs: the kernel-level metrics, the warp-stall breakdown of the PC samples, and the
instructions (and source lines) where the samples and the memory traffic fall.

    python benchmarks/ncu_report.py gpu_out/prof_bf16.ncu-rep
    python benchmarks/ncu_report.py prof.ncu-rep --top 60 --metrics 'l1tex__t_.*hit_rate'
    python benchmarks/ncu_report.py prof.ncu-rep --csv perpc.csv --cubin-out kernel.cubin
    python benchmarks/ncu_report.py prof.ncu-rep --nvdisasm /usr/local/cuda/bin/nvdisasm

Prints, for one profiled kernel launch (--kernel picks one where the report holds several):
(1) selected kernel metrics (duration, cycles, registers, grid and block, speed-of-light %,
    tensor-pipe %, issue activity, warp cycles per issued instruction, spills, L2 and shared
    memory excess), and every metric whose name matches --metrics;
(2) the stall breakdown: the smsp__pcsamp_warps_issue_stalled_* totals, sorted, as % of
    smsp__pcsamp_sample_count;
(3) the --top instructions by PC samples, with their top stall reasons and per-instruction
    counters (executed instructions, L2 global sectors and their ideal, shared wavefronts and
    their ideal); with nvdisasm, each with its SASS and innermost (inlined) source line, and
    (4) the same per source line.
nvdisasm is the one given by --nvdisasm, else the one on PATH, else DEFAULT_NVDISASM (the pip
wheel nvidia-cuda-nvdisasm unpacked there); --no-nvdisasm uses none. Without it (3) names PC
offsets only, and (4) is left out; the offsets are nvdisasm's, so a listing of the --cubin-out
file made elsewhere (`nvdisasm -c -gi`) lines up with them.
--csv writes every instruction of the kernel (and every PC a counter names) with all per-PC
counters; --cubin-out writes the cubin the report embeds (for cuobjdump or nvdisasm elsewhere).

The format, as read here (no schema ships with ncu; the field numbers were matched against
reports and the names of NVIDIA's ProfilerReport messages as open-source readers use them):
- the file is b"NVR\\0", then frames: a uint32 little-endian length and one protobuf message;
- frame 0 is the FileHeader {1: version};
- then blocks: a BlockHeader frame {1: NumSources, 2: NumResults, 4: StringTable {1: repeated
  metric name}, 5: PayloadSize (the bytes of the frames that follow it, length words included)},
  followed by NumSources ProfileSource frames and NumResults ProfileResult frames. The string
  tables of successive blocks concatenate: a metric's NameId indexes all names read so far;
- ProfileSource {1: ID, 4: cubin (ELF), 8: embedded files {1: repeated {1: path, 2: text}},
  9: function table {1: repeated {1: mangled name, 2: load address, 3: ELF symbol index}}};
- ProfileResult (one profiled launch) {5: mangled name, 6: function name, 7: demangled name,
  10: grid {1, 2, 3}, 11: block {1, 2, 3}, 13: repeated ProfileMetricResult, 15: Source {1: ID}};
- ProfileMetricResult {1: NameId, 2: ProfileMetricValue, 3: repeated list element {1: key,
  2: value}, both ProfileMetricValue}; ProfileMetricValue {1: string, 2: float (fixed32),
  3: double (fixed64), 4: uint32, 5: uint64}.
Per-instruction counters (the source view's) are list metrics keyed by the absolute PC; the
function's load address (its function-table entry, or launch__function_pcs) is subtracted to
get the offset that nvdisasm prints for the kernel's .text section.
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

MAGIC = b"NVR\0"
DEFAULT_NVDISASM = Path("/tmp/whl/x/nvidia/cu13/bin/nvdisasm")
SAMPLES = "smsp__pcsamp_sample_count"
STALL_PREFIX = "smsp__pcsamp_warps_issue_stalled_"
NOT_ISSUED = "_not_issued"
# The per-instruction counters of the tables (the CSV has every per-PC metric).
EXECUTED = "inst_executed"
L2_SECTORS = "memory_l2_theoretical_sectors_global"
L2_IDEAL = "memory_l2_theoretical_sectors_global_ideal"
SHM_WAVEFRONTS = "memory_l1_wavefronts_shared"
SHM_IDEAL = "memory_l1_wavefronts_shared_ideal"

# (label, metric, unit) printed in (1) where the report has the metric.
KERNEL_METRICS = (
    ("duration", "gpu__time_duration.sum", "ns"),
    ("elapsed cycles (GPC max)", "gpc__cycles_elapsed.max", ""),
    ("SM active cycles (avg)", "sm__cycles_active.avg", ""),
    ("registers per thread", "launch__registers_per_thread", ""),
    ("shared memory per block", "launch__shared_mem_per_block", "B"),
    ("achieved occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active", "%"),
    ("SOL compute (SM throughput)", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%"),
    ("SOL memory", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%"),
    ("DRAM throughput", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "%"),
    ("tensor pipe active", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "%"),
    ("issue active (SM)", "sm__issue_active.avg.pct_of_peak_sustained_elapsed", "%"),
    ("issue active per cycle (SMSP)", "smsp__issue_active.avg.per_cycle_active", ""),
    ("warp cycles per issued instruction", "smsp__average_warp_latency_per_inst_issued.ratio", ""),
    ("instructions executed (HW)", "smsp__inst_executed.sum", ""),
    ("spill requests (local)", "derived__local_spilling_requests", ""),
    ("L2 sectors, local memory", "memory_l2_theoretical_sectors_local", ""),
    ("L2 sectors, global", L2_SECTORS, ""),
    ("L2 sectors, global ideal", L2_IDEAL, ""),
    ("L2 excess sectors, global", "derived__memory_l2_theoretical_sectors_global_excessive", ""),
    ("shared wavefronts", SHM_WAVEFRONTS, ""),
    ("shared excess wavefronts", "derived__memory_l1_wavefronts_shared_excessive", ""),
    ("PC samples", SAMPLES, ""),
    ("PC sampling interval", "smsp__pcsamp_interval_cycles", "cycles"),
)

Value = Union[int, float, str, None]


# ---------------------------------------------------------------- protobuf wire format

WIRE_VARINT, WIRE_FIXED64, WIRE_LEN, WIRE_FIXED32 = 0, 1, 2, 5


def read_varint(buf: memoryview, pos: int, base: int = 0) -> tuple[int, int]:
    """The base-128 varint at buf[pos:] and the position after it; `base` is buf's offset in
    the file, for the error."""
    if pos < len(buf) and buf[pos] < 0x80:  # one byte: most keys, lengths and small counts
        return buf[pos], pos + 1
    value = shift = 0
    start = pos
    while True:
        if pos >= len(buf):
            raise ValueError(f"truncated varint at offset {base + start}")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError(f"varint longer than 10 bytes at offset {base + start}")


def iter_fields(buf: memoryview, base: int = 0) -> Iterator[tuple[int, int, object, int]]:
    """The fields of one message: (number, wire type, value, value's offset in the file).
    The value is an int (varint), 8 or 4 raw bytes (fixed64, fixed32) or a memoryview (length-
    delimited: a string, bytes or a nested message; the reader decides which)."""
    pos, end = 0, len(buf)
    while pos < end:
        at = pos
        key, pos = read_varint(buf, pos, base)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError(f"field number 0 at offset {base + at}: not a protobuf message")
        if wire == WIRE_VARINT:
            value, pos = read_varint(buf, pos, base)
            yield number, wire, value, base + at
            continue
        if wire == WIRE_LEN:
            size, pos = read_varint(buf, pos, base)
        elif wire == WIRE_FIXED64:
            size = 8
        elif wire == WIRE_FIXED32:
            size = 4
        else:  # 3, 4 (groups) and 6, 7 appear in no report
            raise ValueError(f"unsupported wire type {wire} (field {number}) at offset {base + at}")
        if pos + size > end:
            raise ValueError(f"field {number} at offset {base + at} runs {pos + size - end} bytes "
                             f"past the end of its message (truncated or corrupt)")
        yield number, wire, buf[pos:pos + size], base + pos
        pos += size


class Message:
    """One decoded message: its fields by number, in file order. Nested messages are decoded
    when asked for (`message`), so a reader pays only for what it reads."""

    __slots__ = ("fields", "offset")

    def __init__(self, buf: memoryview, offset: int = 0):
        self.offset = offset
        self.fields: dict[int, list[tuple[int, object, int]]] = {}
        for number, wire, value, at in iter_fields(buf, offset):
            self.fields.setdefault(number, []).append((wire, value, at))

    def raw(self, number: int, wire: int) -> list[tuple[object, int]]:
        out = []
        for got, value, at in self.fields.get(number, ()):
            if got != wire:
                raise ValueError(f"field {number} at offset {at}: wire type {got}, expected {wire}")
            out.append((value, at))
        return out

    def varint(self, number: int, default: Optional[int] = None) -> Optional[int]:
        values = self.raw(number, WIRE_VARINT)
        return values[-1][0] if values else default  # protobuf: the last one wins

    def blob(self, number: int) -> Optional[memoryview]:
        values = self.raw(number, WIRE_LEN)
        return values[-1][0] if values else None

    def string(self, number: int, default: str = "") -> str:
        raw = self.blob(number)
        return default if raw is None else bytes(raw).decode("utf-8", errors="replace")

    def strings(self, number: int) -> list[str]:
        return [bytes(v).decode("utf-8", errors="replace") for v, _ in self.raw(number, WIRE_LEN)]

    def messages(self, number: int) -> list[Message]:
        return [Message(value, at) for value, at in self.raw(number, WIRE_LEN)]

    def message(self, number: int) -> Optional[Message]:
        values = self.messages(number)
        return values[-1] if values else None


def metric_value(buf: Optional[memoryview], offset: int = 0) -> Value:
    """A ProfileMetricValue: its one set field, as int, float or str; None where it is empty.
    Decoded straight from the wire: a report holds hundreds of thousands of them."""
    if buf is None:
        return None
    for number, wire, value, at in iter_fields(buf, offset):
        if number == 1 and wire == WIRE_LEN:
            return bytes(value).decode("utf-8", errors="replace")
        if number == 2 and wire == WIRE_FIXED32:
            return struct.unpack("<f", value)[0]
        if number == 3 and wire == WIRE_FIXED64:
            return struct.unpack("<d", value)[0]
        if number in (4, 5) and wire == WIRE_VARINT:
            return value
        raise ValueError(f"metric value field {number} (wire type {wire}) at offset {at}: not a known kind")
    return None


def _metric_entry(buf: memoryview, offset: int) -> tuple[Optional[int], Value, list[tuple[Value, Value]]]:
    """A ProfileMetricResult: (NameId, value, [(key, value)] of its list elements)."""
    index, value, elements = None, None, []
    for number, wire, field_value, at in iter_fields(buf, offset):
        if number == 1 and wire == WIRE_VARINT:
            index = field_value
        elif number == 2 and wire == WIRE_LEN:
            value = metric_value(field_value, at)
        elif number == 3 and wire == WIRE_LEN:
            key = element = None
            for n, w, v, a in iter_fields(field_value, at):
                if w == WIRE_LEN and n == 1:
                    key = metric_value(v, a)
                elif w == WIRE_LEN and n == 2:
                    element = metric_value(v, a)
            elements.append((key, element))
    return index, value, elements


# ---------------------------------------------------------------- frames and the report

def read_frames(data: Union[bytes, memoryview]) -> Iterator[tuple[int, memoryview]]:
    """(offset of the message, message bytes) for every frame after the magic."""
    buf = memoryview(data)
    if bytes(buf[:4]) != MAGIC:
        raise ValueError(f"not an Nsight Compute report: offset 0 holds {bytes(buf[:4])!r}, not {MAGIC!r}")
    pos = len(MAGIC)
    while pos < len(buf):
        if pos + 4 > len(buf):
            raise ValueError(f"truncated frame length at offset {pos}: {len(buf) - pos} of 4 bytes")
        (size,) = struct.unpack_from("<I", buf, pos)
        if pos + 4 + size > len(buf):
            raise ValueError(f"frame at offset {pos} declares {size} bytes but {len(buf) - pos - 4} remain "
                             f"(truncated file?)")
        yield pos + 4, buf[pos + 4:pos + 4 + size]
        pos += 4 + size


@dataclass
class Source:
    """A ProfileSource: a loaded module, its cubin and the functions it defines."""
    id: Optional[int]
    cubin: Optional[bytes]
    functions: dict[str, int]          # mangled name -> load address
    symbol_index: dict[str, int]       # mangled name -> ELF symbol index (nvdisasm -fun)
    files: dict[str, str]              # path -> the embedded source text (--import-source yes)


@dataclass
class Report:
    """One profiled kernel launch of a report.

    `metrics` maps every metric name to its value (None for the few with only a list).
    `pc_metrics` maps each per-instruction metric to {offset: value}, the offset from the
    function's first instruction (`base_pc`), as nvdisasm numbers it. `lists` holds the other
    list metrics (occupancy curves, per-opcode counts) as [(key, value)]."""
    kernel: str
    mangled: str = ""
    demangled: str = ""
    grid: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    metrics: dict[str, Value] = field(default_factory=dict)
    pc_metrics: dict[str, dict[int, Value]] = field(default_factory=dict)
    lists: dict[str, list[tuple[Value, Value]]] = field(default_factory=dict)
    base_pc: Optional[int] = None
    cubin: Optional[bytes] = None
    symbol_index: Optional[int] = None
    files: dict[str, str] = field(default_factory=dict)

    @property
    def stall_reasons(self) -> list[str]:
        """The PC-sampling stall reasons the report has (e.g. 'long_scoreboard')."""
        names = set(self.metrics) | set(self.pc_metrics)
        return sorted(n[len(STALL_PREFIX):] for n in names
                      if n.startswith(STALL_PREFIX) and not n.endswith(NOT_ISSUED))


def _parse_source(msg: Message) -> Source:
    functions, symbols = {}, {}
    table = msg.message(9)
    for entry in table.messages(1) if table else ():
        name = entry.string(1)
        functions[name] = entry.varint(2, 0)
        if entry.varint(3) is not None:
            symbols[name] = entry.varint(3)
    cubin = msg.blob(4)
    embedded = msg.message(8)
    files = {f.string(1): f.string(2) for f in embedded.messages(1)} if embedded else {}
    return Source(msg.varint(1), bytes(cubin) if cubin is not None else None, functions, symbols, files)


def _parse_result(msg: Message, names: list[str], sources: list[Source]) -> Report:
    report = Report(kernel=msg.string(6), mangled=msg.string(5), demangled=msg.string(7))
    for number, attr in ((10, "grid"), (11, "block")):
        dims = msg.message(number)
        if dims is not None:
            setattr(report, attr, tuple(dims.varint(i, 0) for i in (1, 2, 3)))
    lists = {}
    for buf, at in msg.raw(13, WIRE_LEN):
        index, value, elements = _metric_entry(buf, at)
        if index is None or index >= len(names):
            raise ValueError(f"metric at offset {at} names string {index}, "
                             f"but the string table has {len(names)}")
        report.metrics[names[index]] = value
        if elements:
            lists[names[index]] = elements

    # The module the launch ran: the source whose ID the result names, else the only one.
    source_id = msg.message(15).varint(1) if msg.message(15) is not None else None
    source = next((s for s in sources if source_id is not None and s.id == source_id), None)
    if source is None and len(sources) == 1:
        source = sources[0]
    if source is not None:
        report.cubin, report.files = source.cubin, source.files
        report.base_pc = source.functions.get(report.mangled)
        report.symbol_index = source.symbol_index.get(report.mangled)
    if report.base_pc is None:  # the launch's own record of its function's address
        pcs = lists.get("launch__function_pcs") or []
        report.base_pc = pcs[0][1] if pcs and isinstance(pcs[0][1], int) else None

    # A list keyed by integers at or above the function's address is a per-instruction counter;
    # the rest (keyed by 0, a register count, an opcode name) are not.
    for name, pairs in lists.items():
        base = report.base_pc
        if base and all(isinstance(k, int) and k >= base for k, _ in pairs):
            report.pc_metrics[name] = {k - base: v for k, v in pairs}
        else:
            report.lists[name] = pairs
    return report


def read_reports(path: Union[str, os.PathLike]) -> list[Report]:
    """Every profiled kernel launch in the report, in file order. A malformed file raises
    ValueError naming the file and the offset where reading failed."""
    try:
        return _read(Path(path).read_bytes())
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _read(data: bytes) -> list[Report]:
    frames = read_frames(data)
    try:
        next(frames)  # FileHeader {1: version}: nothing here depends on it
    except StopIteration:
        raise ValueError(f"no file header after the magic (offset {len(MAGIC)})") from None
    names: list[str] = []
    sources: list[Source] = []
    results: list[Message] = []
    for offset, frame in frames:
        header = Message(frame, offset)
        table = header.message(4)
        if table is not None:
            names.extend(table.strings(1))
        payload, counted = header.varint(5, 0), 0
        for kind in (1, 2):  # NumSources ProfileSource frames, then NumResults ProfileResult frames
            for _ in range(header.varint(kind, 0)):
                try:
                    at, body = next(frames)
                except StopIteration:
                    raise ValueError(f"block header at offset {offset - 4} announces more frames than the "
                                     f"file holds (truncated file?)") from None
                counted += 4 + len(body)
                if kind == 1:
                    sources.append(_parse_source(Message(body, at)))
                else:
                    results.append(Message(body, at))
        if payload != counted:  # offset - 4: where the header's frame (its length word) starts
            raise ValueError(f"block header at offset {offset - 4} declares a {payload}-byte payload, "
                             f"its frames hold {counted}")
    # Results are decoded last: a later block may add the module a launch ran.
    return [_parse_result(msg, names, sources) for msg in results]


# ---------------------------------------------------------------- nvdisasm

@dataclass
class Instruction:
    sass: str
    lines: list[tuple[str, int]]  # the inline chain, innermost first: (file, line)

    @property
    def source(self) -> Optional[tuple[str, int]]:
        return self.lines[0] if self.lines else None


_LINE_INFO = re.compile(r'//## File "([^"]+)", line (\d+)')
_INSTRUCTION = re.compile(r"^\s*\{?\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;?\s*\}?\s*$")
_SECTION = re.compile(r"^\s*\.section\s+([^,\s]+)")


def parse_disassembly(text: str, section: str) -> dict[int, Instruction]:
    """offset -> instruction of one .text section of `nvdisasm -c -gi` output. A run of '//##'
    lines is one instruction's inline chain (innermost first); it holds until the next run."""
    out: dict[int, Instruction] = {}
    current = None
    chain: list[tuple[str, int]] = []
    in_run = False
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            current, chain, in_run = m.group(1), [], False
            continue
        if current != section:
            continue
        m = _LINE_INFO.search(line)
        if m:
            if not in_run:
                chain, in_run = [], True
            chain.append((m.group(1), int(m.group(2))))
            continue
        in_run = False
        m = _INSTRUCTION.match(line)
        if m:
            out[int(m.group(1), 16)] = Instruction(m.group(2), list(chain))
    return out


def find_nvdisasm(given: Optional[str]) -> Optional[str]:
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise SystemExit(f"--nvdisasm {given}: no such executable")
        return given
    found = shutil.which("nvdisasm")
    if found:
        return found
    return str(DEFAULT_NVDISASM) if os.access(DEFAULT_NVDISASM, os.X_OK) else None


def disassemble(report: Report, nvdisasm: str) -> dict[int, Instruction]:
    """The kernel's instructions by offset, from the embedded cubin; ValueError where nvdisasm
    fails or the cubin has no .text section of the kernel."""
    if not report.cubin:
        raise ValueError("the report embeds no cubin")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(report.cubin)
        command = [nvdisasm, "-c", "-gi"]
        if report.symbol_index is not None:  # only the kernel's section: a cubin may hold many
            command += ["-fun", str(report.symbol_index)]
        done = subprocess.run([*command, str(cubin)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"{' '.join(command)} failed: {done.stderr.strip()[:300]}")
    instructions = parse_disassembly(done.stdout, f".text.{report.mangled}")
    if not instructions:
        raise ValueError(f"no section .text.{report.mangled} in the disassembly")
    return instructions


# ---------------------------------------------------------------- output

def fmt(value: Value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value or abs(value) < 1000:  # NaN, or small enough for 4 significant digits
            return f"{value:.4g}"
        return f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def short_path(path: str) -> str:
    """The last two components: 'tc/engine_consumer.cuh' names the file, the rest is noise."""
    return "/".join(Path(path).parts[-2:])


def _num(value: Value) -> float:
    return value if isinstance(value, (int, float)) else 0


def stall_totals(report: Report) -> list[tuple[str, float, float]]:
    """(reason, samples, not-issued samples), most samples first: the report's totals, or the
    per-PC sums where it has no totals."""
    rows = []
    for reason in report.stall_reasons:
        name = STALL_PREFIX + reason
        total = report.metrics.get(name)
        if not isinstance(total, (int, float)):
            total = sum(_num(v) for v in report.pc_metrics.get(name, {}).values())
        not_issued = report.metrics.get(name + NOT_ISSUED)
        if not isinstance(not_issued, (int, float)):
            not_issued = sum(_num(v) for v in report.pc_metrics.get(name + NOT_ISSUED, {}).values())
        rows.append((reason, total, not_issued))
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def top_stalls(counts: dict[str, float], n: int = 3) -> str:
    ranked = sorted((c, r) for r, c in counts.items() if c)
    return ", ".join(f"{r} {fmt(c)}" for c, r in reversed(ranked[-n:]))


def print_kernel_metrics(report: Report, pattern: Optional[str], out) -> None:
    print("(1) Kernel metrics", file=out)
    if report.grid or report.block:
        print(f"  {'grid x block':36s} {'x'.join(map(str, report.grid))} x {'x'.join(map(str, report.block))}",
              file=out)
    missing = []
    for label, name, unit in KERNEL_METRICS:
        if report.metrics.get(name) is None:
            missing.append(name)
            continue
        print(f"  {label:36s} {fmt(report.metrics[name]) + (' ' + unit if unit else ''):>16s}   {name}", file=out)
    if missing:
        print(f"  (not in this report: {', '.join(missing)})", file=out)
    if pattern:
        regex = re.compile(pattern)
        matched = sorted(n for n in report.metrics if regex.search(n))
        print(f"\n  metrics matching --metrics {pattern!r}: {len(matched)}", file=out)
        for name in matched:
            value = report.metrics[name]
            extra = ""
            if name in report.pc_metrics:
                extra = f"   [{len(report.pc_metrics[name])} PCs]"
            elif name in report.lists:
                extra = f"   [{len(report.lists[name])} instances]"
            print(f"  {name:80s} {fmt(value):>16s}{extra}", file=out)


def print_stalls(report: Report, out) -> Optional[float]:
    """Prints the breakdown; returns the sample total ((3) and (4) take their % of it)."""
    rows = stall_totals(report)
    print("\n(2) Warp stalls at the PC samples (smsp__pcsamp_warps_issue_stalled_*)", file=out)
    if not rows:
        print("  no PC sampling in this report (ncu's SourceCounters section, in --set full, takes it)",
              file=out)
        return None
    reasons_sum = sum(r[1] for r in rows)
    total = report.metrics.get(SAMPLES)
    if not isinstance(total, (int, float)) or not total:
        total = reasons_sum
    print(f"  {'reason':24s} {'samples':>10s} {'%':>7s} {'not issued':>11s}", file=out)
    for reason, samples, not_issued in rows:
        if samples:
            pct = 100.0 * samples / total if total else 0.0
            print(f"  {reason:24s} {fmt(samples):>10s} {pct:6.2f}% {fmt(not_issued):>11s}", file=out)
    zero = [r for r, s, _ in rows if not s]
    note = f"  total {fmt(total)} samples ({SAMPLES})"
    if reasons_sum != total:
        note += f"; the reasons sum to {fmt(reasons_sum)}"
    if zero:
        note += f"; no samples: {', '.join(zero)}"
    print(note, file=out)
    return total


def per_pc_rows(report: Report, instructions: dict[int, Instruction]) -> list[dict]:
    """One row per offset any per-PC metric or the disassembly names, in address order."""
    offsets = set(instructions)
    for values in report.pc_metrics.values():
        offsets.update(values)
    rows = []
    for offset in sorted(offsets):
        inst = instructions.get(offset)
        row = {"offset": offset, "sass": inst.sass if inst else "",
               "lines": inst.lines if inst else []}
        for name, values in report.pc_metrics.items():
            if offset in values:
                row[name] = values[offset]
        rows.append(row)
    return rows


def _pair(row: dict, a: str, b: str) -> str:
    """'sectors/ideal'; '-' where the instruction moves none."""
    return f"{fmt(row.get(a, 0))}/{fmt(row.get(b, 0))}" if _num(row.get(a)) or _num(row.get(b)) else "-"


def _where(place: Optional[tuple[str, int]]) -> str:
    return f"{short_path(place[0])}:{place[1]}" if place else "?"


def _table(header: list[str], rows: list[list[str]], left: set[int], out) -> None:
    """Columns as wide as their widest cell; `left` lists the left-aligned ones."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        print(("  " + "  ".join(cells)).rstrip(), file=out)


def _share(part: float, total: Optional[float]) -> str:
    return f"{100.0 * part / total:.1f}%" if total else "-"


def print_instructions(report: Report, rows: list[dict], total: Optional[float], top: int,
                       disassembled: bool, out) -> None:
    sampled = [r for r in rows if _num(r.get(SAMPLES))]
    base = f" {report.base_pc:#x}" if report.base_pc else ""
    print(f"\n(3) Top {top} instructions by PC samples (offset from the function start{base})", file=out)
    if not sampled:
        print("  no per-instruction PC samples in this report", file=out)
        return
    header = ["offset", "samples", "%", "executed", "L2 sect/ideal", "shm wavef/ideal", "top stalls"]
    if disassembled:
        header += ["source (innermost < caller)", "SASS"]
    table = []
    for row in sorted(sampled, key=lambda r: (-_num(r[SAMPLES]), r["offset"]))[:top]:
        samples = _num(row[SAMPLES])
        cells = [f"{row['offset']:#x}", fmt(samples), _share(samples, total), fmt(row.get(EXECUTED)),
                 _pair(row, L2_SECTORS, L2_IDEAL), _pair(row, SHM_WAVEFRONTS, SHM_IDEAL),
                 top_stalls({r: _num(row.get(STALL_PREFIX + r)) for r in report.stall_reasons})]
        if disassembled:
            # The innermost line is often a library header (cuda_bf16.hpp, cute): its caller says where.
            chain = row["lines"]
            cells += [_where(chain[0] if chain else None) + (f" < {_where(chain[1])}" if len(chain) > 1 else ""),
                      row["sass"]]
        table.append(cells)
    _table(header, table, {6, 7, 8}, out)


def print_source_lines(report: Report, rows: list[dict], total: Optional[float], top: int, out) -> None:
    """The counters summed per innermost source line (what the compiler attributes an inlined
    instruction to: the line inside the callee, not the call), with the call site that has most
    of its samples."""
    reasons = report.stall_reasons
    sums: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    callers: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        chain = row["lines"]
        if not chain:
            continue
        acc = sums[chain[0]]
        acc["instructions"] += 1
        for name in (SAMPLES, EXECUTED, L2_SECTORS, L2_IDEAL, SHM_WAVEFRONTS, SHM_IDEAL,
                     *(STALL_PREFIX + r for r in reasons)):
            acc[name] += _num(row.get(name))
        if len(chain) > 1:
            callers[chain[0]][chain[1]] += _num(row.get(SAMPLES))
    ranked = sorted(((k, v) for k, v in sums.items() if v[SAMPLES]), key=lambda kv: (-kv[1][SAMPLES], kv[0]))
    print(f"\n(4) Top {top} source lines by PC samples (innermost inlined line; SASS: its instructions)",
          file=out)
    table = []
    for place, acc in ranked[:top]:
        caller = ""
        if callers[place]:
            site, samples = callers[place].most_common(1)[0]
            caller = f"{_where(site)} ({_share(samples, acc[SAMPLES])})"
        text = ""
        lines = report.files.get(place[0], "").splitlines()
        if 0 < place[1] <= len(lines):
            text = " ".join(lines[place[1] - 1].split())[:70]
        table.append([_where(place), str(acc["instructions"]), fmt(acc[SAMPLES]), _share(acc[SAMPLES], total),
                      fmt(acc[EXECUTED]), _pair(acc, L2_SECTORS, L2_IDEAL), _pair(acc, SHM_WAVEFRONTS, SHM_IDEAL),
                      top_stalls({r: acc[STALL_PREFIX + r] for r in reasons}), caller, text])
    _table(["source line", "SASS", "samples", "%", "executed", "L2 sect/ideal", "shm wavef/ideal", "top stalls",
            "top caller (its share)", "text"], table, {0, 7, 8, 9}, out)


def write_csv(path: str, report: Report, rows: list[dict]) -> None:
    reasons = [STALL_PREFIX + r for r in report.stall_reasons]
    first = [n for n in (SAMPLES, *reasons, EXECUTED, L2_SECTORS, L2_IDEAL, SHM_WAVEFRONTS, SHM_IDEAL)
             if n in report.pc_metrics]
    names = first + sorted(set(report.pc_metrics) - set(first))
    base = report.base_pc or 0
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["offset", "pc", "sass", "source", "inline_chain", *names])
        for row in rows:
            lines = row["lines"]
            writer.writerow([f"{row['offset']:#x}", f"{base + row['offset']:#x}", row["sass"],
                             f"{lines[0][0]}:{lines[0][1]}" if lines else "",
                             " <- ".join(f"{p}:{n}" for p, n in lines),
                             *("" if row.get(n) is None else row[n] for n in names)])


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="an .ncu-rep file")
    p.add_argument("--kernel", type=int, default=0,
                   help="which profiled launch, where the report holds several (default 0: the first)")
    p.add_argument("--top", type=int, default=40, help="instructions and source lines to list")
    p.add_argument("--metrics", metavar="REGEX", help="also print every metric whose name matches")
    p.add_argument("--nvdisasm", metavar="PATH", help=f"nvdisasm to use (default: PATH, then {DEFAULT_NVDISASM})")
    p.add_argument("--no-nvdisasm", action="store_true", help="print PC offsets only, even where nvdisasm exists")
    p.add_argument("--cubin-out", metavar="FILE", help="write the embedded cubin here")
    p.add_argument("--csv", metavar="FILE", help="write the per-instruction table here")
    args = p.parse_args(argv)
    out = sys.stdout

    try:
        reports = read_reports(args.report)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if not reports:
        print(f"{args.report}: no profiled kernel in the report", file=sys.stderr)
        return 1
    if not 0 <= args.kernel < len(reports):
        raise SystemExit(f"--kernel {args.kernel}: the report holds {len(reports)} launches (0..{len(reports) - 1})")
    report = reports[args.kernel]
    print(f"{args.report}: kernel {args.kernel} of {len(reports)}: {report.demangled or report.kernel}", file=out)
    if len(reports) > 1:
        print(f"  (others: {', '.join(f'{i}: {r.kernel}' for i, r in enumerate(reports) if i != args.kernel)}; "
              f"--kernel N picks one)", file=out)
    if args.cubin_out:
        if report.cubin is None:
            raise SystemExit("--cubin-out: the report embeds no cubin")
        Path(args.cubin_out).write_bytes(report.cubin)
        print(f"  cubin ({len(report.cubin):,} bytes) written to {args.cubin_out}", file=out)

    instructions: dict[int, Instruction] = {}
    nvdisasm = None if args.no_nvdisasm else find_nvdisasm(args.nvdisasm)
    disasm_note = ("--no-nvdisasm" if args.no_nvdisasm else "no nvdisasm found (--nvdisasm PATH)") + \
        ": printed PC offsets only, no SASS or source lines"
    if nvdisasm:
        try:
            instructions = disassemble(report, nvdisasm)
            disasm_note = ""
        except ValueError as e:
            disasm_note = f"disassembly failed ({e}): printed PC offsets only, no SASS or source lines"

    print_kernel_metrics(report, args.metrics, out)
    total = print_stalls(report, out)
    rows = per_pc_rows(report, instructions)
    if disasm_note:
        print(f"\n  note: {disasm_note}", file=out)
    print_instructions(report, rows, total, args.top, bool(instructions), out)
    if instructions:
        unmatched = [r["offset"] for r in rows if not r["sass"]]
        if unmatched:  # a counter off every instruction boundary: the base address is wrong
            print(f"  warning: {len(unmatched)} counted PCs are no instruction of the disassembly "
                  f"(first {unmatched[0]:#x})", file=out)
        print_source_lines(report, rows, total, args.top, out)
    if args.csv:
        write_csv(args.csv, report, rows)
        print(f"\n{len(rows)} instructions written to {args.csv}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

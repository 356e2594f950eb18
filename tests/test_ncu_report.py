"""benchmarks/ncu_report.py: the reader of Nsight Compute reports, with no ncu.

The reports here are synthetic: written by the small protobuf writer below (independent of the
reader's decoder), with fresh random values each run, and read back. A fake nvdisasm (a shell
script printing a disassembly made for the synthetic kernel) stands in for the real one. One test
reads a real report where this machine has it (never committed: 7 MB)."""
import csv
import os
import random
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "ncu_report.py"
REAL_REPORT = Path("/tmp/ncu/prof_bf16.ncu-rep")
SEED_ENV = "MONARCH_FFTCONV_TEST_SEED"   # as conftest's gen: replays a failing run
STALL = "smsp__pcsamp_warps_issue_stalled_"
SAMPLES = "smsp__pcsamp_sample_count"


@pytest.fixture(scope="module")
def ncu():
    return load_script("ncu_report", SCRIPT)


@pytest.fixture
def rng(request) -> random.Random:
    """A fresh seed per test, printed; MONARCH_FFTCONV_TEST_SEED=<seed> replays it."""
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2 ** 32))
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed} (replay: {SEED_ENV}={seed})")
    return random.Random(seed)


# ---------------------------------------------------------------- a protobuf writer

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def f_int(number: int, n: int) -> bytes:
    return tag(number, 0) + varint(n)


def f_len(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


def f_str(number: int, s: str) -> bytes:
    return f_len(number, s.encode())


def value_message(v) -> bytes:
    """A ProfileMetricValue. Floats as double (3), ints as uint64 (5), a ('f32', x) pair as float (2)."""
    if isinstance(v, tuple):
        return tag(2, 5) + struct.pack("<f", v[1])
    if isinstance(v, float):
        return tag(3, 1) + struct.pack("<d", v)
    if isinstance(v, int):
        return f_int(5, v)
    return f_str(1, v)


def frame(message: bytes) -> bytes:
    return struct.pack("<I", len(message)) + message


@dataclass
class Kernel:
    """What one synthetic launch holds: the truth the reader must give back."""
    name: str
    mangled: str
    grid: tuple
    block: tuple
    scalars: dict                                  # name -> value (float, int, str or ('f32', x))
    per_pc: dict = field(default_factory=dict)     # name -> {absolute pc: value}
    source_id: int = 0
    base: int = 0                                  # the function's load address


@dataclass
class Synthetic:
    data: bytes
    kernels: list
    base: dict           # mangled name -> load address
    cubin: bytes
    frame_offsets: list  # offset of every frame's length word
    symbol: int


def metric_entry(index: int, value, pairs=()) -> bytes:
    body = f_int(1, index)
    if value is not None:
        body += f_len(2, value_message(value))
    for k, v in pairs:
        body += f_len(3, f_len(1, value_message(k)) + f_len(2, value_message(v)))
    return body + f_int(4, 0)


def result_message(kernel: Kernel, names: list) -> bytes:
    body = f_int(1, 4242) + f_str(5, kernel.mangled) + f_str(6, kernel.name) + f_str(7, f"void {kernel.name}(Params)")
    body += f_len(10, b"".join(f_int(i + 1, d) for i, d in enumerate(kernel.grid)))
    body += f_len(11, b"".join(f_int(i + 1, d) for i, d in enumerate(kernel.block)))
    for name in sorted(set(kernel.scalars) | set(kernel.per_pc)):
        pairs = sorted(kernel.per_pc.get(name, {}).items())
        body += f_len(13, metric_entry(names.index(name), kernel.scalars.get(name), pairs))
    return body + f_len(15, f_int(1, kernel.source_id)) + f_int(16, 0)


def block_header(num_sources: int, num_results: int, strings: list, payload: bytes) -> bytes:
    table = f_len(4, b"".join(f_str(1, s) for s in strings)) if strings else f_len(4, b"")
    process = f_len(6, f_int(1, 1234) + f_str(3, "/usr/bin/python3"))
    return frame(f_int(1, num_sources) + f_int(2, num_results) + table + f_int(5, len(payload)) + process)


def build(kernels: list, rng: random.Random, files: dict = None, symbol: int = 7) -> Synthetic:
    """A report: the file header, an info block, a block with the module (its cubin and function
    table), then one block per kernel, each adding the names it uses to the string table."""
    cubin = b"\x7fELF" + rng.randbytes(rng.randrange(16, 200))
    base = {k.mangled: k.base for k in kernels}
    functions = b"".join(f_len(1, f_str(1, m) + f_int(2, b) + f_int(3, symbol + i))
                         for i, (m, b) in enumerate(base.items()))
    embedded = b"".join(f_len(1, f_str(1, p) + f_str(2, text)) for p, text in (files or {}).items())
    source = frame(f_int(1, kernels[0].source_id) + f_len(4, cubin) + f_int(5, 9) + f_len(8, embedded)
                   + f_len(9, functions))
    parts = [b"NVR\0", frame(f_int(1, 7)), block_header(0, 0, [], b""), block_header(1, 0, [], source), source]
    names: list = []
    for kernel in kernels:
        new = [n for n in sorted(set(kernel.scalars) | set(kernel.per_pc)) if n not in names]
        rng.shuffle(new)  # the table's order is the writer's, not the reader's guess
        names += new
        result = frame(result_message(kernel, names))
        parts += [block_header(0, 1, new, result), result]
    offsets, pos = [], 4
    for part in parts[1:]:
        offsets.append(pos)
        pos += len(part)
    return Synthetic(b"".join(parts), kernels, base, cubin, offsets, symbol)


REASONS = ("long_scoreboard", "barrier", "wait", "selected", "mio_throttle", "tex_throttle")


def random_kernel(rng: random.Random, name: str = "fft_kernel", n_pcs: int = 12) -> Kernel:
    """A kernel with double and uint64 scalars, PC samples per stall reason at random PCs (one
    reason never sampled), and per-PC counters; the totals are the per-PC sums, as ncu's are."""
    base = rng.randrange(1 << 40, 1 << 47) & ~0xFF
    offsets = sorted(rng.sample(range(0, 4096, 16), n_pcs))
    per_pc = {}
    for reason in REASONS:
        sampled = 0 if reason == "tex_throttle" else rng.randrange(1, 60)
        per_pc[STALL + reason] = {base + o: rng.randrange(0, sampled + 1) for o in offsets}
        per_pc[STALL + reason + "_not_issued"] = {pc: rng.randrange(0, v + 1)
                                                  for pc, v in per_pc[STALL + reason].items()}
    for reason in REASONS[:-1]:  # every sampled reason has a sample somewhere
        per_pc[STALL + reason][base + offsets[0]] += 1
    per_pc[SAMPLES] = {base + o: sum(per_pc[STALL + r][base + o] for r in REASONS) for o in offsets}
    per_pc["inst_executed"] = {base + o: rng.randrange(1, 2 ** 40) for o in offsets}
    per_pc["memory_l2_theoretical_sectors_global"] = {base + o: rng.randrange(1, 10 ** 6) for o in offsets[::3]}
    per_pc["memory_l2_theoretical_sectors_global_ideal"] = {base + o: rng.randrange(1, 10 ** 6) for o in offsets[::3]}
    per_pc["derived__avg_thread_executed"] = {base + o: rng.uniform(0, 32) for o in offsets}
    scalars = {name: sum(v.values()) for name, v in per_pc.items()
               if name.startswith(STALL) or name in (SAMPLES, "inst_executed")}
    scalars.update({
        "gpu__time_duration.sum": rng.uniform(1e3, 1e7),
        "gpc__cycles_elapsed.max": float(rng.randrange(10 ** 4, 10 ** 8)),
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": rng.uniform(0, 100),
        "launch__registers_per_thread": rng.randrange(16, 256),
        "derived__memory_l2_theoretical_sectors_global_excessive": rng.randrange(0, 2 ** 64),  # a 10-byte varint
        "smsp__pcsamp_interval_cycles": ("f32", float(2 ** rng.randrange(5, 15))),  # exact in fp32
        "launch__kernel_name": name,
    })
    return Kernel(name, f"_Z{len(name)}{name}v", (rng.randrange(1, 200), 1, 1), (rng.randrange(32, 1024), 1, 1),
                  scalars, per_pc, source_id=rng.randrange(1, 2 ** 40), base=base)


def expected_scalar(v):
    return v[1] if isinstance(v, tuple) else v


def write(tmp_path: Path, synthetic: Synthetic, name: str = "synthetic.ncu-rep") -> Path:
    path = tmp_path / name
    path.write_bytes(synthetic.data)
    return path


def run_main(ncu, argv, capsys, monkeypatch, nvdisasm_found: bool = False) -> str:
    """The CLI in this process; nvdisasm found nowhere unless asked (CI may or may not have one)."""
    if not nvdisasm_found:
        monkeypatch.setenv("PATH", "")
        monkeypatch.setattr(ncu, "DEFAULT_NVDISASM", Path("/nonexistent/nvdisasm"))
    assert ncu.main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


# ---------------------------------------------------------------- the reader

def test_wire_format_round_trip(ncu, rng):
    values = [rng.randrange(0, 2 ** 64) for _ in range(50)] + [0, 127, 128, 2 ** 63, 2 ** 64 - 1]
    for v in values:
        assert ncu.read_varint(memoryview(varint(v)), 0) == (v, len(varint(v)))
    payload = rng.randbytes(rng.randrange(0, 300))
    d, f = rng.uniform(-1e300, 1e300), rng.randrange(2 ** 32)
    message = (f_int(3, values[0]) + f_len(7, payload) + tag(9, 1) + struct.pack("<d", d)
               + tag(2, 5) + struct.pack("<I", f))
    fields = [(n, w, v if isinstance(v, int) else bytes(v)) for n, w, v, _ in ncu.iter_fields(memoryview(message))]
    assert fields == [(3, 0, values[0]), (7, 2, payload), (9, 1, struct.pack("<d", d)), (2, 5, struct.pack("<I", f))]


def test_reader_recovers_what_was_written(ncu, rng, tmp_path):
    kernel = random_kernel(rng)
    synthetic = build([kernel], rng)
    (report,) = ncu.read_reports(write(tmp_path, synthetic))
    assert (report.kernel, report.mangled, report.grid, report.block) == (kernel.name, kernel.mangled,
                                                                          kernel.grid, kernel.block)
    assert report.base_pc == kernel.base
    assert report.cubin == synthetic.cubin
    assert report.symbol_index == synthetic.symbol
    for name, value in kernel.scalars.items():
        got = report.metrics[name]
        assert got == expected_scalar(value) and type(got) is type(expected_scalar(value)), name
    assert set(report.pc_metrics) == set(kernel.per_pc)
    for name, values in kernel.per_pc.items():
        assert report.pc_metrics[name] == {pc - kernel.base: v for pc, v in values.items()}, name
    assert report.stall_reasons == sorted(REASONS)
    assert report.lists == {}


def test_lists_not_keyed_by_pc_stay_lists(ncu, rng, tmp_path):
    """ncu stores launch__* values also as one-element lists keyed 0, and per-opcode counts keyed
    by name: neither is a per-instruction counter."""
    kernel = random_kernel(rng)
    synthetic = build([kernel], rng)
    opcodes = [("FFMA", rng.randrange(1, 10 ** 9)), ("LDG", rng.randrange(1, 10 ** 9))]
    names = sorted(set(kernel.scalars) | set(kernel.per_pc)) + ["sass__inst_executed_per_opcode"]
    registers = kernel.scalars.pop("launch__registers_per_thread")  # written below, with its list
    result = result_message(kernel, names)
    result += f_len(13, metric_entry(names.index("launch__registers_per_thread"), registers, [(0, registers)]))
    result += f_len(13, metric_entry(names.index("sass__inst_executed_per_opcode"), None, opcodes))
    result_frame = frame(result)
    source_end = synthetic.frame_offsets[4]
    data = synthetic.data[:source_end] + block_header(0, 1, names, result_frame) + result_frame
    path = tmp_path / "lists.ncu-rep"
    path.write_bytes(data)
    (report,) = ncu.read_reports(path)
    assert report.lists["sass__inst_executed_per_opcode"] == opcodes
    assert report.metrics["sass__inst_executed_per_opcode"] is None
    assert report.lists["launch__registers_per_thread"] == [(0, registers)]
    assert report.metrics["launch__registers_per_thread"] == registers
    assert "launch__registers_per_thread" not in report.pc_metrics


def test_several_kernels_and_a_growing_string_table(ncu, rng, tmp_path):
    """Each result block adds only its new names: the second kernel's indices run past the first
    block's table, into the concatenation."""
    first, second = random_kernel(rng, "first_kernel"), random_kernel(rng, "second_kernel")
    second.scalars["only_in_second.sum"] = rng.uniform(0, 1)
    second.source_id = first.source_id
    synthetic = build([first, second], rng)
    reports = ncu.read_reports(write(tmp_path, synthetic))
    assert [r.kernel for r in reports] == ["first_kernel", "second_kernel"]
    for report, kernel in zip(reports, (first, second)):
        assert report.base_pc == kernel.base
        assert report.metrics == {n: expected_scalar(v) for n, v in kernel.scalars.items()} | {
            n: None for n in kernel.per_pc if n not in kernel.scalars}
        assert report.pc_metrics[SAMPLES] == {pc - kernel.base: v for pc, v in kernel.per_pc[SAMPLES].items()}


# ---------------------------------------------------------------- corrupt files

def test_truncated_file_names_the_frame(ncu, rng, tmp_path):
    synthetic = build([random_kernel(rng)], rng)
    last = synthetic.frame_offsets[-1]  # the result frame's length word
    cut = rng.randrange(last + 5, len(synthetic.data))
    path = tmp_path / "cut.ncu-rep"
    path.write_bytes(synthetic.data[:cut])
    with pytest.raises(ValueError, match=rf"frame at offset {last} declares .* \(truncated file\?\)"):
        ncu.read_reports(path)
    path.write_bytes(synthetic.data[:last + 2])  # inside the length word
    with pytest.raises(ValueError, match=rf"truncated frame length at offset {last}"):
        ncu.read_reports(path)


def test_corrupt_message_names_the_offset(ncu, rng, tmp_path):
    synthetic = build([random_kernel(rng)], rng)
    last = synthetic.frame_offsets[-1]
    # The result frame's first field claims more bytes than the frame holds.
    garbage = tag(5, 2) + varint(10 ** 6) + rng.randbytes(8)
    data = synthetic.data[:synthetic.frame_offsets[-2]] + block_header(0, 1, [], frame(garbage)) + frame(garbage)
    path = tmp_path / "corrupt.ncu-rep"
    path.write_bytes(data)
    start = len(data) - len(garbage)  # where the message's first field starts
    with pytest.raises(ValueError, match=rf"field 5 at offset {start} runs .* past the end"):
        ncu.read_reports(path)
    path.write_bytes(b"PK\x03\x04" + synthetic.data[4:])
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not an Nsight Compute report: offset 0"):
        ncu.read_reports(path)
    done = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "error:" in done.stderr and "offset 0" in done.stderr  # no traceback
    assert "Traceback" not in done.stderr
    # A block whose declared payload is not its frames' bytes.
    header_at = synthetic.frame_offsets[-2]
    result = synthetic.data[last:]
    wrong = block_header(0, 1, [], result + b"x")
    path.write_bytes(synthetic.data[:header_at] + wrong + result)
    with pytest.raises(ValueError, match=rf"block header at offset {header_at} declares a {len(result) + 1}-byte"):
        ncu.read_reports(path)
    assert last > header_at


# ---------------------------------------------------------------- the CLI

def stall_rows(out: str) -> list[tuple[str, int, str]]:
    section = out.split("(2) Warp stalls")[1].split("\n(3)")[0]
    rows = []
    for line in section.splitlines()[2:]:
        m = re.match(r"\s+(\w+)\s+([\d,]+)\s+([\d.]+%)\s+([\d,]+)$", line)
        if m:
            rows.append((m.group(1), int(m.group(2).replace(",", "")), m.group(3)))
    return rows


def test_cli_stall_table_sorted_with_percentages(ncu, rng, tmp_path, capsys, monkeypatch):
    kernel = random_kernel(rng)
    out = run_main(ncu, [write(tmp_path, build([kernel], rng))], capsys, monkeypatch)
    total = kernel.scalars[SAMPLES]
    sampled = sorted(((r, kernel.scalars[STALL + r]) for r in REASONS if kernel.scalars[STALL + r]),
                     key=lambda rc: (-rc[1], rc[0]))
    assert stall_rows(out) == [(r, c, f"{100 * c / total:.2f}%") for r, c in sampled]
    assert f"total {total:,} samples" in out
    assert "no samples: tex_throttle" in out
    assert f"{kernel.scalars['launch__registers_per_thread']:,}" in out
    assert f"{kernel.grid[0]}x1x1 x {kernel.block[0]}x1x1" in out


def test_cli_without_nvdisasm_prints_offsets_only(ncu, rng, tmp_path, capsys, monkeypatch):
    kernel = random_kernel(rng)
    top = rng.randrange(2, 6)
    csv_path = tmp_path / "perpc.csv"
    out = run_main(ncu, [write(tmp_path, build([kernel], rng)), "--top", top, "--csv", csv_path], capsys, monkeypatch)
    assert "no nvdisasm found" in out and "printed PC offsets only" in out
    assert "(4)" not in out  # no per-source-line table without line info
    section = out.split("(3) Top")[1]
    listed = re.findall(r"^\s+(0x[0-9a-f]+)\s+([\d,]+)\s", section, re.M)
    samples = {pc - kernel.base: v for pc, v in kernel.per_pc[SAMPLES].items() if v}
    want = sorted(samples, key=lambda o: (-samples[o], o))[:top]
    assert [(int(o, 16), int(s.replace(",", ""))) for o, s in listed] == [(o, samples[o]) for o in want]
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("offset,pc,sass,source,inline_chain," + SAMPLES)
    assert len(lines) == 1 + len(kernel.per_pc[SAMPLES])


def test_cli_as_a_script(rng, tmp_path):
    """The entry point, as the docstring runs it; --no-nvdisasm whatever this machine has."""
    kernel = random_kernel(rng)
    cubin_out = tmp_path / "k.cubin"
    synthetic = build([kernel], rng)
    done = subprocess.run([sys.executable, str(SCRIPT), str(write(tmp_path, synthetic)), "--no-nvdisasm",
                           "--cubin-out", str(cubin_out), "--metrics", r"^gpu__time"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--no-nvdisasm: printed PC offsets only" in done.stdout
    assert cubin_out.read_bytes() == synthetic.cubin
    assert re.search(r"metrics matching --metrics '\^gpu__time': 1\n\s+gpu__time_duration.sum", done.stdout)


def fake_disassembly(kernel: Kernel, pcs: list, path_a: str, path_b: str) -> str:
    """nvdisasm -c -gi's shape: a section per kernel; runs of '//##' lines, innermost first, before
    the instructions they hold for. Instruction i sits at offsets[i]; even ones are inlined."""
    lines = ["\t.headerflags\t@\"EF_CUDA_SM90\"",
             "\t.section\t.text._Z5otherv,\"ax\",@progbits",
             "\t//## File \"/src/other.cu\", line 1",
             "        /*0000*/                   EXIT ;",
             f"\t.section\t.text.{kernel.mangled},\"ax\",@progbits"]
    for i, offset in enumerate(pcs):
        if i % 2 == 0:
            lines.append(f'\t//## File "{path_a}", line {10 + i} inlined at "{path_b}", line {100 + i}')
        lines.append(f'\t//## File "{path_b}", line {100 + i}')
        lines.append(f"        /*{offset:04x}*/                   FFMA R{i}, R{i}, R{i}, RZ ;")
    return "\n".join(lines) + "\n"


def test_cli_joins_pcs_to_sass_and_lines(ncu, rng, tmp_path, capsys, monkeypatch):
    kernel = random_kernel(rng)
    offsets = sorted(pc - kernel.base for pc in kernel.per_pc[SAMPLES])
    path_a, path_b = "/inc/lib/helpers.cuh", "/src/tc/kernel.cu"
    files = {path_a: "\n".join(f"helper_line_{n}();" for n in range(1, 40))}
    report_path = write(tmp_path, build([kernel], rng, files=files))
    listing = tmp_path / "listing.txt"
    listing.write_text(fake_disassembly(kernel, offsets, path_a, path_b))
    nvdisasm = tmp_path / "nvdisasm"
    nvdisasm.write_text(f"#!{sys.executable}\nimport pathlib, sys\n"  # python: the test empties PATH
                        f"pathlib.Path({str(tmp_path / 'args')!r}).write_text(' '.join(sys.argv[1:]))\n"
                        f"sys.stdout.write(pathlib.Path({str(listing)!r}).read_text())\n")
    nvdisasm.chmod(0o755)
    csv_path = tmp_path / "joined.csv"
    out = run_main(ncu, [report_path, "--nvdisasm", nvdisasm, "--top", 50, "--csv", csv_path], capsys, monkeypatch)
    assert (tmp_path / "args").read_text().split()[:4] == ["-c", "-gi", "-fun", "7"]
    assert "offsets only" not in out and "warning" not in out
    samples = {o: kernel.per_pc[SAMPLES][kernel.base + o] for o in offsets}
    for i, offset in enumerate(offsets):
        if not samples[offset]:
            continue
        innermost = f"lib/helpers.cuh:{10 + i} < tc/kernel.cu:{100 + i}" if i % 2 == 0 else f"tc/kernel.cu:{100 + i}"
        assert re.search(rf"^\s+{offset:#x}\s.*{re.escape(innermost)}\s+FFMA R{i}, R{i}, R{i}, RZ$", out, re.M), offset
    lines_section = out.split("(4) Top")[1]
    for i, offset in enumerate(offsets):
        if samples[offset] and i % 2 == 0:  # the embedded file's text, at the innermost line
            line = rf"lib/helpers.cuh:{10 + i}\s.*tc/kernel.cu:{100 + i} \(100.0%\)\s+helper_line_{10 + i}\(\);"
            assert re.search(line, lines_section), offset
    rows = list(csv.reader(csv_path.read_text().splitlines()))
    assert [int(r[0], 16) for r in rows[1:]] == offsets
    assert [int(r[1], 16) for r in rows[1:]] == [kernel.base + o for o in offsets]
    assert rows[1][3] == f"{path_a}:10" and rows[1][4] == f"{path_a}:10 <- {path_b}:100"
    assert [int(r[5]) for r in rows[1:]] == [samples[o] for o in offsets]


def test_cli_where_nvdisasm_fails(ncu, rng, tmp_path, capsys, monkeypatch):
    kernel = random_kernel(rng)
    nvdisasm = tmp_path / "nvdisasm"
    nvdisasm.write_text(f"#!{sys.executable}\nimport sys\nsys.exit('not a valid cubin')\n")
    nvdisasm.chmod(0o755)
    out = run_main(ncu, [write(tmp_path, build([kernel], rng)), "--nvdisasm", nvdisasm], capsys, monkeypatch)
    assert "disassembly failed" in out and "not a valid cubin" in out and "printed PC offsets only" in out


def test_cli_picks_a_kernel(ncu, rng, tmp_path, capsys, monkeypatch):
    first, second = random_kernel(rng, "first_kernel"), random_kernel(rng, "second_kernel")
    second.source_id = first.source_id
    out = run_main(ncu, [write(tmp_path, build([first, second], rng)), "--kernel", 1], capsys, monkeypatch)
    assert "kernel 1 of 2: void second_kernel(Params)" in out and "0: first_kernel" in out
    assert f"total {second.scalars[SAMPLES]:,} samples" in out


# ---------------------------------------------------------------- a real report

@pytest.mark.skipif(not REAL_REPORT.exists(), reason=f"{REAL_REPORT} is not on this machine")
def test_real_report(ncu, tmp_path, capsys, monkeypatch):
    (report,) = ncu.read_reports(REAL_REPORT)
    assert report.kernel == "engine_forward_kernel"
    assert report.metrics["gpu__time_duration.sum"] == 261792
    assert report.metrics["gpc__cycles_elapsed.max"] == 475242
    assert report.metrics["launch__registers_per_thread"] == 168
    assert (report.grid, report.block) == ((132, 1, 1), (384, 1, 1))
    total = report.metrics[SAMPLES]
    assert total == 27495
    assert sum(report.metrics[STALL + r] for r in report.stall_reasons) == total
    assert sum(report.pc_metrics[SAMPLES].values()) == total
    assert report.cubin[:4] == b"\x7fELF"
    out = run_main(ncu, [REAL_REPORT, "--top", 5], capsys, monkeypatch, nvdisasm_found=True)
    assert stall_rows(out)[0] == ("long_scoreboard", 8641, f"{100 * 8641 / 27495:.2f}%")
    if shutil.which("nvdisasm") or os.access(ncu.DEFAULT_NVDISASM, os.X_OK):
        assert "warning" not in out and "offsets only" not in out  # every counted PC is an instruction

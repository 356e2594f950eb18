"""The loader and the build: backend selection without a GPU, fallbacks that warn once, the
nvcc compile check of every kernel unit (CI has nvcc but no GPU), and the packaging."""

import ast
import concurrent.futures
import json
import importlib.util
import math
import operator
import os
import re
import shutil
import site
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from monarch_fftconv import _extension
from monarch_fftconv.planner import plan_for

NVCC = shutil.which("nvcc")
SOURCES = _extension.kernel_sources()


needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
needs_cutlass = pytest.mark.skipif(not _extension.cutlass_include_dirs(),
                                   reason="CUTLASS headers not installed (nvidia-cutlass)")


def nvcc_check(source: Path, out_dir: Path, defines: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """nvcc on one unit with the build's flags, stopped after ptxas (-cubin): the front end
    checks host and device code, cicc and ptxas generate sm_90a code (inline PTX is checked by
    ptxas alone). Left out: the host compiler's pass over nvcc's launch stubs, 15% of the time.
    `defines`: build switches (NAME=VALUE), as MONARCH_FFTCONV_NVCC_DEFINES would pass them."""
    includes = [f"-I{d}" for d in (_extension.CSRC, *_extension.cutlass_include_dirs())]
    cmd = [NVCC, *_extension.NVCC_FLAGS, *includes, *(f"-D{d}" for d in defines),
           "-Xptxas", "-v", "-cubin", str(source),  # -v: spills (stderr)
           "-o", str(out_dir / f"{source.stem}.cubin")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def terminal_writer(config: pytest.Config):
    """print() for a fixture: the line reaches the terminal at once, even under pytest -q and
    output capture (which would otherwise hold it until a test fails)."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    terminal = config.pluginmanager.get_plugin("terminalreporter")

    def write(line: str) -> None:
        if terminal is None:  # -p no:terminal
            return
        with capture.global_and_fixture_disabled():
            terminal.write_line(line)
    return write


def unit_name(source: Path) -> str:
    return source.relative_to(_extension.CSRC).as_posix()


@pytest.fixture(scope="module")
def cubin_dir(tmp_path_factory) -> Path:
    """Where compiled_units leaves each unit's cubin (<stem>.cubin)."""
    return tmp_path_factory.mktemp("cubins")


@pytest.fixture(scope="module")
def compiled_units(request, cubin_dir):
    """Every kernel unit compiled by nvcc, one per core at a time (more only thrash the cores:
    CI has two), each reported with its time as it finishes: together they take minutes."""
    out = cubin_dir
    write = terminal_writer(request.config)
    cores = len(os.sched_getaffinity(0))
    write(f"nvcc: compiling {len(SOURCES)} kernel units for sm_90a, {cores} at a time")

    def timed_check(source: Path) -> tuple[subprocess.CompletedProcess, float]:
        start = time.perf_counter()
        return nvcc_check(source, out), time.perf_counter() - start

    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=cores) as pool:
        pending = {pool.submit(timed_check, source): source for source in SOURCES}
        for done in concurrent.futures.as_completed(pending):
            source = pending[done]
            results[source], seconds = done.result()
            verdict = "ok" if results[source].returncode == 0 else "FAILED"
            write(f"  [{len(results)}/{len(SOURCES)}] {unit_name(source)}: {verdict} in {seconds:.1f} s")
    return results


@needs_nvcc
@needs_cutlass
@pytest.mark.parametrize("source", SOURCES, ids=[unit_name(s) for s in SOURCES])
def test_kernel_compiles(source, compiled_units):
    result = compiled_units[source]
    assert result.returncode == 0, result.stderr[-4000:]


# --------------------------------------------------------------------------- the binding

HOST_CXX = shutil.which("g++") or shutil.which("c++")


@needs_nvcc
@pytest.mark.skipif(HOST_CXX is None, reason="no host C++ compiler")
def test_binding_compiles_against_torch_headers(tmp_path):
    """binding.cpp, the one file that speaks to torch, through the host compiler's front end with
    the build's C++ flags and this torch's headers: an error there otherwise shows first on the GPU
    machine, minutes into its build. A CPU torch wheel lacks one generated header of c10/cuda
    (impl/cuda_cmake_macros.h); an empty stand-in takes its place (its macros only select DLL
    export attributes)."""
    from torch.utils.cpp_extension import include_paths
    import sysconfig

    stand_in = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text("#pragma once\n")
    # nvcc's own include directory, as its dry run reports it (nvcc may be a wrapper script)
    dry = subprocess.run([NVCC, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True, timeout=60)
    cuda_includes = re.findall(r'^#\$ INCLUDES="-I([^"]+)"', dry.stdout + dry.stderr, re.MULTILINE)
    assert cuda_includes, dry.stderr[-2000:]
    includes = [tmp_path, *include_paths(), *cuda_includes, _extension.CSRC, sysconfig.get_paths()["include"]]
    cmd = [HOST_CXX, *[f for f in _extension.CXX_FLAGS if f.startswith("-std")], "-fsyntax-only",
           "-DTORCH_EXTENSION_NAME=monarch_fftconv_ext", *[f"-I{d}" for d in includes],
           str(Path(_extension.CSRC) / "binding.cpp")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


# --------------------------------------------------------------------------- spills

SPILL_RECORD = Path(__file__).with_name("ptxas_spills.json")
RECORD_SPILLS_ENV = "MONARCH_FFTCONV_RECORD_SPILLS"  # =1: rewrite the record from this compile
_PTXAS_PROPERTIES = re.compile(r"Function properties for (\S+)\n\s*\d+ bytes stack frame, (\d+) bytes spill stores, "
                               r"(\d+) bytes spill loads")
# An anonymous namespace's mangled name (<length>_GLOBAL__N__...) carries hashes of the unit (and
# at times a numeric suffix, so its length varies too): the whole component is left out of the key.
_ANONYMOUS_NAMESPACE = re.compile(r"(\d+)_GLOBAL__N__")


def without_anonymous_namespace(name: str) -> str:
    """A mangled name with its anonymous namespace component, length prefix included, as _ANON_."""
    while (found := _ANONYMOUS_NAMESPACE.search(name)) is not None:
        end = found.start() + len(found.group(1)) + int(found.group(1))
        name = name[:found.start()] + "_ANON_" + name[end:]
    return name


def kernel_spills(ptxas_log: str) -> dict[str, tuple[int, int]]:
    """ptxas -v's spill stores and loads in bytes per thread, per kernel (entry functions only),
    keyed by the mangled name without the anonymous namespace (without_anonymous_namespace)."""
    return {without_anonymous_namespace(name): (int(stores), int(loads))
            for name, stores, loads in _PTXAS_PROPERTIES.findall(ptxas_log) if "_kernel" in name}


def spill_record_text(spills: dict[str, tuple[int, int]]) -> str:
    """The record's JSON, one kernel a line: "unit:mangled name": [stored, loaded]."""
    lines = [f"  {json.dumps(name)}: [{stored}, {loaded}]" for name, (stored, loaded) in sorted(spills.items())]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def unit_spills(source: Path, ptxas_log: str) -> dict[str, tuple[int, int]]:
    """kernel_spills of one unit's ptxas log, keyed as the record keys them ("unit:mangled name")."""
    return {f"{unit_name(source)}:{name}": spill for name, spill in kernel_spills(ptxas_log).items()}


def recorded_spills() -> dict[str, tuple[int, int]]:
    """tests/ptxas_spills.json: (stored, loaded) bytes a thread per "unit:mangled name"."""
    return {name: tuple(spill) for name, spill in json.loads(SPILL_RECORD.read_text()).items()}


def test_kernel_spills_parses_ptxas_output():
    hashed = "_ZN15monarch_fftconv57_GLOBAL__N__433820f6_24_fftconv_fp32_backward_cu_67898586"
    kernel = "11fp32_detail24fftconv_fp32_grad_kernelILi13EfEEvNS1_8GradArgsE"
    log = (f"ptxas info    : Compiling entry function '{hashed}{kernel}' for 'sm_90a'\n"
           f"ptxas info    : Function properties for {hashed}{kernel}\n"
           "    144 bytes stack frame, 160 bytes spill stores, 432 bytes spill loads\n"
           "ptxas info    : Used 128 registers, used 1 barriers, 144 bytes cumulative stack size\n"
           "ptxas info    : Function properties for _Z6helperv\n"
           "    0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n")
    assert kernel_spills(log) == {f"_ZN15monarch_fftconv_ANON_{kernel}": (160, 432)}
    suffixed = "_ZN15monarch_fftconv59_GLOBAL__N__c1ad403f_21_grad_instances_f32_cu_958806a2_5564"
    assert without_anonymous_namespace(suffixed + kernel) == f"_ZN15monarch_fftconv_ANON_{kernel}"


@needs_nvcc
@needs_cutlass
def test_spills_do_not_grow(compiled_units):
    """A ratchet on register spills (local-memory traffic the profiler shows as L1/L2 requests:
    2.4 million in the fp32 grad kernel at 16x256x8192): no kernel spills more bytes than
    tests/ptxas_spills.json records for it, and a kernel the record lacks spills nothing. Lower
    figures are welcome; rewrite the record with MONARCH_FFTCONV_RECORD_SPILLS=1 to keep them."""
    measured = {}
    for source, result in compiled_units.items():
        assert result.returncode == 0, result.stderr[-4000:]
        measured.update(unit_spills(source, result.stderr))
    assert measured, "ptxas -v printed no kernel's properties"
    if os.environ.get(RECORD_SPILLS_ENV) == "1":
        SPILL_RECORD.write_text(spill_record_text(measured))
    record = recorded_spills()
    was = {name: record.get(name, (0, 0)) for name in measured}  # a kernel the record lacks: no spill allowed
    grown = {name: (was[name], now) for name, now in measured.items() if now[0] > was[name][0] or now[1] > was[name][1]}
    assert not grown, "spills grew (recorded -> now, bytes stored/loaded per thread):\n" + "\n".join(
        f"  {name}: {was} -> {now}" for name, (was, now) in sorted(grown.items()))
    assert set(record) <= set(measured), f"recorded kernels no longer built: {sorted(set(record) - set(measured))}"


# --------------------------------------------------------------------------- the engine's register pool

class Section(NamedTuple):
    name: str
    offset: int
    size: int
    link: int  # the index of an associated section: a symbol table's string table


def _elf_sections(data: bytes) -> list[Section]:
    """The section headers of a little-endian ELF64 file (a cubin), in their order."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a little-endian ELF64 file"
    (table,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, table + i * entry_size) for i in range(count)]
    names = headers[names_index][4]
    return [Section(_c_string(data, names + h[0]), h[4], h[5], h[6]) for h in headers]


def _c_string(data: bytes, start: int) -> str:
    return data[start:data.index(b"\0", start)].decode()


def _nv_info(data: bytes, offset: int, size: int):
    """The attributes of an .nv.info section: (attribute, payload bytes). Each is a format byte
    and an attribute byte, then two bytes (format 1: padding, 2: one byte, 3: a 16-bit value),
    or for format 4 a 16-bit size and as many bytes."""
    end = offset + size
    while offset < end:
        form, attribute = data[offset], data[offset + 1]
        if form == 4:
            (length,) = struct.unpack_from("<H", data, offset + 2)
            yield attribute, data[offset + 4:offset + 4 + length]
            offset += 4 + length
        else:
            yield attribute, data[offset + 2:offset + 4]
            offset += 4


EIATTR_REGCOUNT = 0x2F  # in the cubin's .nv.info: (symbol index, registers) of each kernel


def kernel_registers(cubin: Path) -> dict[str, int]:
    """ptxas's register count of each function of a cubin, by mangled name: the count a thread
    starts with, which cuobjdump --dump-resource-usage prints as REG (read here from the ELF,
    so no CUDA binary utility is needed)."""
    data = cubin.read_bytes()
    sections = _elf_sections(data)
    (symtab,) = [s for s in sections if s.name == ".symtab"]
    strtab = sections[symtab.link]
    symbols = [_c_string(data, strtab.offset + struct.unpack_from("<I", data, at)[0])  # Elf64_Sym: st_name first
               for at in range(symtab.offset, symtab.offset + symtab.size, 24)]
    (info,) = [s for s in sections if s.name == ".nv.info"]
    return {symbols[index]: registers
            for attribute, payload in _nv_info(data, info.offset, info.size) if attribute == EIATTR_REGCOUNT
            for index, registers in [struct.unpack("<II", payload)]}


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv}


def engine_constants(defines: dict[str, int] | None = None) -> dict[str, int]:
    """EngineTraits' `static constexpr int kName = expression;` constants whose expressions are
    integer arithmetic on literals and the constants before them, evaluated as C++ does
    (`/` truncates: every operand here is positive), with the build switches at their defaults
    or, for those `defines` names, at its values (as -DNAME=value builds them)."""
    text = (_extension.CSRC / "tc" / "engine_traits.cuh").read_text()
    traits = text[text.index("struct EngineTraits"):]
    # the build switches' defaults (#ifndef NAME / #define NAME value) as names the constants use
    constants: dict[str, int] = {name: int(value) for name, value in
                                 re.findall(r"#define (MONARCH_FFTCONV_\w+) (\d+)\n", text)}
    constants.update(defines or {})

    def evaluate(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return constants[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](evaluate(node.left), evaluate(node.right))
        raise KeyError(ast.dump(node))

    for name, expression in re.findall(r"static constexpr int (k\w+) =\s+([^;]+);", traits):
        try:
            constants[name] = evaluate(ast.parse(expression.strip(), mode="eval").body)
        except (KeyError, SyntaxError):  # N1::value and the like: not arithmetic
            pass
    return constants


def test_engine_constants_are_read_from_the_traits():
    c = engine_constants()
    assert (c["kWarpgroup"], c["kConsumers"], c["kThreads"]) == (128, 2, 384)
    assert c["kRegsAtEntry"] == 168  # 65,536 / 384 = 170.7, down to the allocation granule of 8
    assert (c["kProducerRegs"], c["kConsumerRegs"]) == (40, 232)  # the default split


@needs_nvcc
@needs_cutlass
def test_engine_register_split_fits_the_pool_ptxas_gives(compiled_units, cubin_dir):
    """setmaxnreg only moves registers inside the CTA's pool, kThreads x the count ptxas gives
    a thread at entry. The traits' kRegsAtEntry is that count, and the split fits the pool, for
    every engine instance: 48/232 asked 1,024 registers more than 384 x 168 and hung the GPU."""
    (source,) = [s for s in SOURCES if s.name == "engine_instances.cu"]
    assert compiled_units[source].returncode == 0, compiled_units[source].stderr[-4000:]
    assert_split_fits_the_pool(cubin_dir / f"{source.stem}.cubin", engine_constants())


def assert_split_fits_the_pool(cubin: Path, c: dict[str, int]) -> None:
    """The cubin's six engine instances (bf16 and fp16 operands x fp32, bf16 and fp16 I/O) start
    with the traits' kRegsAtEntry registers, as ptxas gives them, and the split c names
    (kProducerRegs/kConsumerRegs) fits the pool kThreads x that."""
    kernels = {name: count for name, count in kernel_registers(cubin).items() if "engine_forward_kernel" in name}
    assert len(kernels) == 6, kernels
    split = c["kWarpgroup"] * c["kProducerRegs"] + c["kConsumers"] * c["kWarpgroup"] * c["kConsumerRegs"]
    for name, at_entry in kernels.items():
        assert at_entry == c["kRegsAtEntry"], f"{name}: ptxas gives {at_entry} registers at entry"
        assert split <= c["kThreads"] * at_entry, (
            f"{name}: the split {c['kProducerRegs']}/{c['kConsumerRegs']} asks {split} registers, "
            f"the pool is {c['kThreads']} x {at_entry} = {c['kThreads'] * at_entry}")


def assert_spills_within(spills: dict[str, tuple[int, int]], record: dict[str, tuple[int, int]], slack: int = 0) -> None:
    """Each kernel of `spills` stores and loads at most `slack` bytes a thread more than the
    record's figures for it (a kernel the record lacks: `slack` at most)."""
    for name, (stored, loaded) in spills.items():
        was = record.get(name, (0, 0))
        assert stored <= was[0] + slack and loaded <= was[1] + slack, (name, was, (stored, loaded))


@needs_nvcc
@needs_cutlass
def test_every_engine_instance_has_its_filter_image_kernel(compiled_units, cubin_dir):
    """The engine's six instances (bf16/fp16 operands x fp32/bf16/fp16 I/O) each launch a
    filter_image_kernel first (the producer copies a channel's image, never the spectrum): six of
    those too, and no engine switch left but those still to measure (session 36 measured them
    and kept the image, the corner by index and 2-byte I/O as the code, and deleted the coalesced
    loads; session 38 measured the paired loads and made them the code)."""
    (source,) = [s for s in SOURCES if s.name == "engine_instances.cu"]
    assert compiled_units[source].returncode == 0, compiled_units[source].stderr[-4000:]
    registers = kernel_registers(cubin_dir / f"{source.stem}.cubin")
    assert sum("filter_image_kernel" in name for name in registers) == 6, sorted(registers)
    assert {name for name in _extension._switch_macros() if name.startswith("MONARCH_FFTCONV_ENGINE_")} == {
        "MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT", TWIDDLE_TABLE, PRODUCER_REGS, LOADS_IN_FLIGHT}  # those still to measure


def switch_build(unit: str, switch: str, out_dir: Path, value: int = 1) -> tuple[Path, subprocess.CompletedProcess]:
    """The kernel unit named `unit` compiled (nvcc_check) with the build switch `switch`=value;
    the compile must succeed."""
    (source,) = [s for s in SOURCES if s.name == unit]
    result = nvcc_check(source, out_dir, (f"{switch}={value}",))
    assert result.returncode == 0, result.stderr[-4000:]
    return source, result


# The engine's one unmeasured build switch (session 38): the consumers' twiddle seeds from a table.
TWIDDLE_TABLE = "MONARCH_FFTCONV_ENGINE_TWIDDLE_TABLE"


@needs_nvcc
@needs_cutlass
def test_the_twiddle_table_build_compiles_and_fits(tmp_path):
    """MONARCH_FFTCONV_ENGINE_TWIDDLE_TABLE=1, the engine switch to measure next: the engine unit
    compiles with it, its six instances keep the registers at entry the split assumes, and no
    kernel of the unit spills more than tests/ptxas_spills.json records for the default build
    (the seeds' loads replace sincospif chains; the producer, which spills, is untouched)."""
    source, result = switch_build("engine_instances.cu", TWIDDLE_TABLE, tmp_path)
    assert_split_fits_the_pool(tmp_path / f"{source.stem}.cubin", engine_constants({TWIDDLE_TABLE: 1}))
    record, spills = recorded_spills(), unit_spills(source, result.stderr)
    print("twiddle table, engine spills (stored/loaded bytes a thread):",
          {name.split("engine_forward_kernel")[1][:40]: spill for name, spill in spills.items() if "engine_forward" in name})
    assert sum("engine_forward_kernel" in name for name in spills) == 6
    assert_spills_within(spills, record)


# The engine's producer registers to measure next (session 39; the default 40).
PRODUCER_REGS = "MONARCH_FFTCONV_ENGINE_PRODUCER_REGS"


@needs_nvcc
@needs_cutlass
def test_the_producer_registers_build_spills_nothing(tmp_path):
    """MONARCH_FFTCONV_ENGINE_PRODUCER_REGS=56: the traits give the consumers 224 of the pool, the
    split fits it (384 x 168 registers at entry, as ptxas gives), and no engine instance spills
    (at the default 40/232 the producer spills 98-122/188-264 B)."""
    source, result = switch_build("engine_instances.cu", PRODUCER_REGS, tmp_path, value=56)
    c = engine_constants({PRODUCER_REGS: 56})
    assert (c["kProducerRegs"], c["kConsumerRegs"]) == (56, 224)
    assert_split_fits_the_pool(tmp_path / f"{source.stem}.cubin", c)
    spills = {name: spill for name, spill in unit_spills(source, result.stderr).items() if "engine_forward" in name}
    assert len(spills) == 6 and set(spills.values()) == {(0, 0)}, spills


# The producer's 16-byte loads in flight a thread, to measure next (session 40; the default 4).
LOADS_IN_FLIGHT = "MONARCH_FFTCONV_ENGINE_LOADS_IN_FLIGHT"


@needs_nvcc
@needs_cutlass
def test_eight_loads_in_flight_fit_72_producer_registers(tmp_path):
    """MONARCH_FFTCONV_ENGINE_LOADS_IN_FLIGHT=8 with PRODUCER_REGS=72 (the pair to measure): the
    unit compiles (the traits' static_assert holds whole chunks of both sequences a round: two of
    a fp32 sequence, four of a 2-byte one), the split 72/216 fits the pool, and the fp32-I/O instances (the route's, `monarch[bf16]`) spill nothing, where
    56 registers spill 106-338 bytes a thread with 8 loads in flight (nvcc 13.0). The 2-byte-I/O
    instances spill at most what the default records for them."""
    defines = {PRODUCER_REGS: 72, LOADS_IN_FLIGHT: 8}
    (source,) = [s for s in SOURCES if s.name == "engine_instances.cu"]
    result = nvcc_check(source, tmp_path, tuple(f"{name}={value}" for name, value in defines.items()))
    assert result.returncode == 0, result.stderr[-4000:]
    c = engine_constants(defines)
    assert (c["kProducerRegs"], c["kConsumerRegs"], c["kLoadsInFlight"]) == (72, 216, 8)
    assert engine_constants()["kLoadsInFlight"] == 4
    assert_split_fits_the_pool(tmp_path / f"{source.stem}.cubin", c)
    spills = {name: spill for name, spill in unit_spills(source, result.stderr).items() if "engine_forward" in name}
    fp32_io = {name: spill for name, spill in spills.items() if "IOTypeE0E" in name}
    assert len(spills) == 6 and len(fp32_io) == 2 and set(fp32_io.values()) == {(0, 0)}, spills
    assert_spills_within(spills, recorded_spills())


# An unmeasured build switch of the fp32 radix kernels (session 38): the gated kernels ask L2 for
# the gate rows (and the forward for the next sequence's u) a sequence ahead.
GATED_L2_PREFETCH = "MONARCH_FFTCONV_GATED_L2_PREFETCH"
# Bytes a thread the switch's gated fp32 forward may spill beyond the default's record (nvcc 13.0,
# session 38: N = 16384 60/56 -> 40/44, N = 32768 28/24 -> 28/32, the others the same or fewer).
GATED_L2_PREFETCH_SPILL_SLACK = 8


@needs_nvcc
@needs_cutlass
def test_the_gated_l2_prefetch_build_compiles_and_fits(tmp_path):
    """MONARCH_FFTCONV_GATED_L2_PREFETCH=1, the switch to measure next: the forward unit compiles
    with it; its fp32 gated instances (the ones it changes) spill at most
    GATED_L2_PREFETCH_SPILL_SLACK bytes beyond tests/ptxas_spills.json's default figures, and
    every other kernel of the unit spills exactly as recorded (the switch leaves them alone)."""
    source, result = switch_build("forward_uniform_f32.cu", GATED_L2_PREFETCH, tmp_path)
    record, spills = recorded_spills(), unit_spills(source, result.stderr)
    print("gated L2 prefetch, forward spills (stored/loaded bytes a thread):",
          {name.split(":")[1][:90]: spill for name, spill in spills.items() if "gated" in name})
    changed = [name for name in spills if "gated_uniform_pairs_kernel" in name and "EfEEv" in name]
    assert len(changed) >= 5, sorted(spills)
    assert_spills_within({name: spills[name] for name in changed}, record, GATED_L2_PREFETCH_SPILL_SLACK)
    for name in spills.keys() - set(changed):
        assert spills[name] == record.get(name, (0, 0)), (name, record.get(name), spills[name])


# The unmeasured build switch of session 39: shared-memory addresses computed again from an opaque
# tx where they are used, not held (and spilled) through the mid pass or across the sequence loop
# (the fp32 forward and the four-step inner kernel).
TX_FENCES = "MONARCH_FFTCONV_TX_FENCES"
# Bytes a thread a kernel of the unit may spill beyond the default's record with it (nvcc 13.0,
# session 39: the plain kernel at N = 32768 16/12 -> 28/24; the rest the same or far fewer).
TX_FENCES_SPILL_SLACK = 12


@needs_nvcc
@needs_cutlass
def test_the_tx_fences_build_cuts_the_fp32_forward_spills(tmp_path):
    """MONARCH_FFTCONV_TX_FENCES=1: the fp32 forward unit compiles with it; its plain
    kernels at N = 4096 and 8192 (the 16x256x2048 and x4096 calls') spill nothing (232/228 and
    144/140 B by default), the gated one at N = 16384 (the training step's at 16x256x8192) less
    than by default, and no kernel of the unit more than TX_FENCES_SPILL_SLACK beyond the
    default's record."""
    source, result = switch_build("forward_uniform_f32.cu", TX_FENCES, tmp_path)
    record, spills = recorded_spills(), unit_spills(source, result.stderr)
    print("tx fences, fp32 forward spills (stored/loaded bytes a thread):",
          {name.split(":")[1][:90]: spill for name, spill in spills.items()})

    def kernel(prefix: str, logm: int) -> str:
        (name,) = [n for n in spills if f"{prefix}_kernelILi{logm}EfE" in n]
        return name

    for logm in (11, 12):
        assert spills[kernel("33fftconv_fp32_uniform_pairs", logm)] == (0, 0)
    gated = kernel("gated_uniform_pairs", 13)
    assert spills[gated][0] < record[gated][0] and spills[gated][1] < record[gated][1], (spills[gated], record[gated])
    assert_spills_within(spills, record, TX_FENCES_SPILL_SLACK)


@needs_nvcc
@needs_cutlass
def test_the_tx_fences_build_cuts_the_bf16_io_forward_spills(tmp_path):
    """MONARCH_FFTCONV_TX_FENCES=1 on the bf16-I/O forward unit (the loop fence and, but at N =
    4096 and 8192, the inverse fence): its plain kernels at N = 16384 and 32768 spill nothing
    (16/12 and 64/76 B by default), and no kernel of the unit more than the default's record."""
    source, result = switch_build("forward_uniform_bf16.cu", TX_FENCES, tmp_path)
    record, spills = recorded_spills(), unit_spills(source, result.stderr)
    print("tx fences, bf16-I/O forward spills:", {name.split(":")[1][:90]: spill for name, spill in spills.items()})
    for logm in (13, 14):
        (name,) = [n for n in spills if f"33fftconv_fp32_uniform_pairs_kernelILi{logm}E13__nv_bfloat16" in n]
        assert spills[name] == (0, 0), (name, spills[name])
    assert_spills_within(spills, record)


@needs_nvcc
@needs_cutlass
def test_the_tx_fences_build_cuts_the_inner_kernels_spills(tmp_path):
    """MONARCH_FFTCONV_TX_FENCES=1 on the four-step unit: the inner kernel at M = 4096 (N =
    2^19) spills nothing in its modes with forward and inverse passes (208-368 B by default);
    kInverse, which the switch leaves alone, and every other kernel of the unit as recorded."""
    source, result = switch_build("fftconv_fourstep.cu", TX_FENCES, tmp_path)
    record, spills = recorded_spills(), unit_spills(source, result.stderr)
    inner_4096 = {name: spill for name, spill in spills.items() if "inner_kernelILi12E" in name}
    print("tx fences, inner kernel spills at M = 4096:", {n.split("InnerMode")[1][:3]: s for n, s in inner_4096.items()})
    assert len(inner_4096) == 6
    for name, spill in spills.items():
        if name in inner_4096 and "InnerModeE3E" not in name:  # kInverse is mode 3
            assert spill == (0, 0), (name, spill)
        else:
            assert spill == record.get(name, (0, 0)), (name, record.get(name), spill)


# setmaxnreg exists on sm_90a but not on sm_90; tcgen05 (Blackwell) not on sm_90a.
SM90A_ONLY_PTX = "setmaxnreg.inc.sync.aligned.u32 240;"
LATER_GPU_PTX = "tcgen05.fence::before_thread_sync;"


@needs_nvcc
@pytest.mark.parametrize("ptx, compiles", [(SM90A_ONLY_PTX, True), (LATER_GPU_PTX, False)], ids=["sm_90a", "sm_100a"])
def test_compile_check_targets_sm_90a(tmp_path, ptx, compiles):
    """The check compiles for sm_90a exactly, through ptxas: a kernel with an sm_90a-only
    instruction passes, one with an instruction sm_90a lacks fails (only ptxas can tell)."""
    source = tmp_path / "probe.cu"
    source.write_text(f'__global__ void probe() {{ asm volatile("{ptx}"); }}\n')
    result = nvcc_check(source, tmp_path)
    assert (result.returncode == 0) == compiles, result.stderr[-2000:]
    if not compiles:
        assert "not supported on .target 'sm_90a'" in result.stderr


def kernel_splits(macro: str = "MONARCH_FFTCONV_SPLITS") -> list[tuple[int, int]]:
    """A split list of fftconv.h, read from the header."""
    header = (_extension.CSRC / "fftconv.h").read_text()
    line = re.search(rf"#define {macro}\(X\)(.*)", header).group(1)
    return [(int(a), int(b)) for a, b in re.findall(r"X\((\d+),\s*(\d+)\)", line)]


def test_kernel_splits_are_the_planners():
    """The kernels are built for exactly the planner's factorisation of N = 256 .. 16384."""
    assert kernel_splits() == [plan_for(n // 2).factors for n in (256, 512, 1024, 2048, 4096, 8192, 16384)]


def test_radix_only_splits_have_the_planners_spectrum_shape():
    """N = 32768 (three factors) runs the radix kernels on the spectrum shape the planner (and
    so the ops' fake kernels) gives it: (n1, row length)."""
    plan = plan_for(16384)
    assert kernel_splits("MONARCH_FFTCONV_RADIX_ONLY_SPLITS") == [(plan.n1, plan.row_size)]
    assert len(plan.factors) == 3 and plan.fft_size == 32768


def csrc_files() -> list[Path]:
    """Every file of the csrc/ tree, at any depth."""
    return sorted(p for p in _extension.CSRC.rglob("*") if p.is_file())


def test_kernel_sources_are_torch_free():
    """Kernel units and headers include no torch header: they compile ~10x faster that way.
    binding.cpp is the one torch-facing file."""
    files = [p for p in csrc_files() if p != _extension.CSRC / "binding.cpp"]
    assert set(SOURCES) <= set(files) and any(p.parent != _extension.CSRC for p in files)
    for path in files:
        text = path.read_text()
        assert "#include <torch" not in text and "#include <ATen" not in text and "#include <c10" not in text, path


def test_kernel_source_names_are_unique():
    """The JIT build (torch.utils.cpp_extension) names each object file after its source's base
    name: two units called x.cu in different directories would overwrite each other's object."""
    stems = [p.stem for p in SOURCES]
    assert len(stems) == len(set(stems)), sorted(stems)


def test_includes_are_relative_to_csrc():
    """Every quoted include names a file by its path from csrc/ (the include directory the
    builds pass), e.g. "common/residency.cuh", whichever directory the including file is in."""
    for path in csrc_files():
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.MULTILINE):
            assert (_extension.CSRC / name).is_file(), f"{path.relative_to(_extension.CSRC)}: #include \"{name}\""


def header_constant(name: str) -> int:
    header = (_extension.CSRC / "fftconv.h").read_text()
    value = re.search(rf"constexpr int64_t {name} = ([^;]+);", header).group(1)
    shift = re.fullmatch(r"1 << (\d+)", value)
    return 1 << int(shift.group(1)) if shift else int(value)


def fourstep_coverage() -> frozenset[tuple[int, int]]:
    """What the binding reports for the four-step kernels: (N, inner size) from the header's
    range and the package's split (a GPU test compares the split with the binding's)."""
    from monarch_fftconv import fourstep

    sizes = [1 << e for e in range(16, 24) if header_constant("kFourStepMinSize") <= 1 << e <= header_constant("kFourStepMaxSize")]
    return frozenset((n, fourstep.inner_for(n)) for n in sizes)


def test_fourstep_range_is_the_packages():
    from monarch_fftconv import fourstep

    assert (header_constant("kFourStepMinSize"), header_constant("kFourStepMaxSize")) == (fourstep.MIN_FFT_SIZE, fourstep.MAX_FFT_SIZE)
    # every split has an outer size one of the outer kernels takes: registers or shared memory
    assert all(n // m in (8, 16, 32, 128, 256, 512, 1024) for n, m in fourstep_coverage())


@pytest.fixture
def hopper_kernels(monkeypatch):
    """Pretend the CUDA extension loaded with the kernels' coverage: the decision is then
    checkable without a GPU."""
    from monarch_fftconv import backends

    coverage = _extension.Coverage(frozenset(kernel_splits()), frozenset(kernel_splits("MONARCH_FFTCONV_RADIX_ONLY_SPLITS")),
                                   frozenset({torch.float32, torch.bfloat16, torch.float16}), fourstep_coverage())
    monkeypatch.setattr(_extension, "coverage", lambda build=True: coverage)
    monkeypatch.setattr(backends, "_decisions", {})
    monkeypatch.setattr(backends, "_multiprocessors", lambda device: H200_SMS)
    return backends


H200_SMS = 132


@pytest.mark.parametrize("request_, dtype, kernel", [
    (None, torch.float32, "the mma.sync kernel"),
    ("engine", torch.float32, "the tensor-core engine"),
    ("engine", torch.bfloat16, "the tensor-core engine"),  # 2-byte I/O too (session 36)
    ("mma", torch.float32, "the mma.sync kernel"),
])
def test_explain_names_the_requested_tensor_core_kernel(hopper_kernels, monkeypatch, request_, dtype, kernel):
    """A small bf16 call at N = 16384 (it takes the tensor cores) names the kernel that
    MONARCH_FFTCONV_TC_KERNEL selects in tc/dispatch.cu, and the decision follows the variable."""
    if request_ is None:
        monkeypatch.delenv(hopper_kernels.TC_KERNEL_ENV, raising=False)
    else:
        monkeypatch.setenv(hopper_kernels.TC_KERNEL_ENV, request_)
    backend = hopper_kernels.select_backend(torch.device("cuda", 0), dtype, "bf16", plan_for(8192), sequences=7)
    assert backend.name == "cuda-tensor-core" and kernel in backend.kernel


@pytest.mark.parametrize("value", ["sm90", "Engine", "mma.sync"])  # the deleted wgmma kernel's name; misspellings
def test_an_unknown_tensor_core_kernel_is_refused(hopper_kernels, monkeypatch, value):
    """MONARCH_FFTCONV_TC_KERNEL names "engine" or "mma": any other value raises at the call's
    decision (and in the binding, before a launch), where it once ran the mma.sync kernel silently;
    fp32 calls, which no tensor-core kernel runs, too (a misspelt environment is refused
    wherever it is read)."""
    monkeypatch.setenv(hopper_kernels.TC_KERNEL_ENV, value)
    for precision in ("bf16", "fp32"):
        with pytest.raises(ValueError, match=f"MONARCH_FFTCONV_TC_KERNEL must be one of 'engine', 'mma' or unset, "
                                             f"got '{value}'"):
            hopper_kernels.select_backend(torch.device("cuda", 0), torch.float32, precision, plan_for(8192), sequences=7)


@pytest.mark.parametrize("precision, name", [("fp32", "cuda-fp32"), ("bf16", "cuda-tensor-core")])
def test_gpu_calls_a_kernel_covers_take_it(hopper_kernels, precision, name):

    for length in (129, 1000, 8192):
        backend = hopper_kernels.select_backend(torch.device("cuda", 0), torch.float32, precision, plan_for(length))
        assert backend.name == name
        assert hopper_kernels.select_backend(torch.device("cuda", 0), torch.float32, precision, plan_for(length)) is backend


@pytest.mark.parametrize("length", [129, 1000, 2048])
def test_tf32_takes_the_tensor_cores_only_below_half_a_wave(hopper_kernels, length):
    """At N <= 4096 tf32's tensor-core kernel measured faster up to half of the fp32 kernel's
    wave (TENSOR_CORE_WAVE_SHARE): tf32 calls take it below that and the fp32 kernel from there
    (asked for as fp32, so the binding picks it), saying why."""
    cuda = torch.device("cuda", 0)
    plan = plan_for(length)
    assert plan.fft_size <= hopper_kernels.TF32_TENSOR_CORE_MAX_FFT
    share = hopper_kernels.TENSOR_CORE_WAVE_SHARE["tf32"]
    assert 0 < share < hopper_kernels.TENSOR_CORE_WAVE_SHARE["bf16"]
    wave = H200_SMS * hopper_kernels.FP32_KERNEL_POINTS_PER_SM // plan.fft_size  # sequences
    threshold = math.ceil(share * wave)
    filled = hopper_kernels.select_backend(cuda, torch.float32, "tf32", plan, threshold)
    assert filled.name == "cuda-fp32" and filled.runs_as == "fp32"
    assert "measured faster than the tf32 tensor-core kernel" in filled.reason
    small = hopper_kernels.select_backend(cuda, torch.float32, "tf32", plan, threshold - 1)
    assert small.name == "cuda-tensor-core" and small.runs_as is None
    # between tf32's threshold and a full wave, bf16 still takes the tensor cores
    assert hopper_kernels.select_backend(cuda, torch.float32, "bf16", plan, threshold).name == "cuda-tensor-core"


@pytest.mark.parametrize("length", [3000, 8191])
def test_tf32_takes_the_fp32_kernel_past_n_4096(hopper_kernels, length):
    """At N = 8192 and 16384 tf32 takes the fp32 kernel whatever the size (measured slower at
    N = 16384 on a single sequence; not measured at 8192)."""
    plan = plan_for(length)
    assert plan.fft_size > hopper_kernels.TF32_TENSOR_CORE_MAX_FFT
    backend = hopper_kernels.select_backend(torch.device("cuda", 0), torch.float32, "tf32", plan, 1)
    assert backend.name == "cuda-fp32" and backend.runs_as == "fp32"
    assert f"N={plan.fft_size}" in backend.reason


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("length", [129, 1000, 3000, 8192])
def test_half_precision_calls_that_fill_the_gpu_take_the_fp32_kernel(hopper_kernels, monkeypatch, precision,
                                                                     length):
    """bf16/fp16 calls with enough sequences to fill every SM with the fp32 kernel once take it
    (it measured faster there); one sequence fewer, they take the tensor cores. Asked for as fp32,
    so the binding runs the fp32 kernel, and the reason says why. (The engine route, which takes
    the largest fp32-I/O calls at N = 16384 from the fp32 kernel, has its own test below.)"""
    monkeypatch.setattr(hopper_kernels, "ENGINE_ROUTE", False)
    cuda = torch.device("cuda", 0)
    plan = plan_for(length)
    wave = H200_SMS * hopper_kernels.FP32_KERNEL_POINTS_PER_SM // plan.fft_size  # sequences
    for dtype in (torch.float32, torch.bfloat16):
        filled = hopper_kernels.select_backend(cuda, dtype, precision, plan, wave)
        assert filled.name == "cuda-fp32" and filled.runs_as == "fp32"
        assert "fills the GPU" in filled.reason and precision in filled.reason
        assert hopper_kernels.select_backend(cuda, dtype, precision, plan, 16 * wave) == filled
        small = hopper_kernels.select_backend(cuda, dtype, precision, plan, wave - 1)
        assert small.name == "cuda-tensor-core" and small.runs_as is None
        assert hopper_kernels.select_backend(cuda, dtype, "fp32", plan, wave - 1).name == "cuda-fp32"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_engine_route_takes_large_calls_at_n_16384(hopper_kernels, monkeypatch, precision):
    """With ENGINE_ROUTE on, a bf16/fp16 call at N = 16384 with fp32, bf16 or fp16 I/O and at
    least ENGINE_MIN_SEQUENCES sequences takes the tensor cores, naming the engine and why; one
    sequence fewer, another N, or a kernel named in MONARCH_FFTCONV_TC_KERNEL other than the
    engine keep the fp32 kernel (float64 I/O: torch.fft). The switch is on by default; off, nothing is routed."""
    cuda, plan, many = torch.device("cuda", 0), plan_for(8192), hopper_kernels.ENGINE_MIN_SEQUENCES
    monkeypatch.delenv(hopper_kernels.TC_KERNEL_ENV, raising=False)
    assert hopper_kernels.ENGINE_ROUTE is True
    monkeypatch.setattr(hopper_kernels, "ENGINE_ROUTE", False)
    assert hopper_kernels.select_backend(cuda, torch.float32, precision, plan, many).name == "cuda-fp32"
    monkeypatch.setattr(hopper_kernels, "ENGINE_ROUTE", True)
    routed = hopper_kernels.select_backend(cuda, torch.float32, precision, plan, many)
    assert routed.name == "cuda-tensor-core" and routed.runs_as is None
    assert "the tensor-core engine" in routed.kernel and "measured faster than the fp32 kernel" in routed.reason
    assert hopper_kernels.select_backend(cuda, torch.float32, precision, plan, 16 * many) is routed
    assert hopper_kernels.select_backend(cuda, torch.float32, precision, plan, many - 1).name == "cuda-fp32"
    for io_dtype in (torch.bfloat16, torch.float16):
        two_byte = hopper_kernels.select_backend(cuda, io_dtype, precision, plan, many)
        assert two_byte.name == "cuda-tensor-core" and "the tensor-core engine" in two_byte.kernel, io_dtype
    assert hopper_kernels.select_backend(cuda, torch.float64, precision, plan, many).name == "torch.fft"
    assert hopper_kernels.select_backend(cuda, torch.float32, precision, plan_for(4096), many).name == "cuda-fp32"
    assert hopper_kernels.select_backend(cuda, torch.float32, "fp32", plan, many).name == "cuda-fp32"
    for named, route in (("mma", "cuda-fp32"), ("engine", "cuda-tensor-core")):
        monkeypatch.setenv(hopper_kernels.TC_KERNEL_ENV, named)
        assert hopper_kernels.select_backend(cuda, torch.float32, precision, plan, many).name == route, named
    # below the fp32 kernel's wave the tensor cores serve as before: the mma.sync kernel
    monkeypatch.delenv(hopper_kernels.TC_KERNEL_ENV)
    small = hopper_kernels.select_backend(cuda, torch.float32, precision, plan, 7)
    assert small.name == "cuda-tensor-core" and "the mma.sync kernel" in small.kernel
    # a call's remembered decision (functional._decided) follows the switch too
    from monarch_fftconv import functional
    u, k = torch.empty(16, 256, 8192, device="meta"), torch.empty(256, 8192, device="meta")
    call = (u, k, None, None, None, False, precision, None)
    routed_key = functional._call_key(*call)
    monkeypatch.setattr(hopper_kernels, "ENGINE_ROUTE", False)
    assert functional._call_key(*call) != routed_key


def test_a_precision_the_route_leaves_out_takes_the_fp32_kernel_at_the_engine_size(hopper_kernels, monkeypatch):
    """Both precisions the engine runs are on its route by default (fp16 back since session 30,
    with the filter's peak near 2^-7: test_tc_engine_dataflow.py's model). One left out of
    ENGINE_ROUTE_PRECISIONS (as fp16 was in session 29, and must be again for a build with the
    peak exponent at 0) takes the fp32 kernel at the route's size, asked for as fp32 and saying
    why in words true of either precision (with the route off, as every call of that size did
    before the route); the engine on request still runs it; below the route's size the mma.sync
    kernel serves as before."""
    cuda, plan, many = torch.device("cuda", 0), plan_for(8192), hopper_kernels.ENGINE_MIN_SEQUENCES
    monkeypatch.delenv(hopper_kernels.TC_KERNEL_ENV, raising=False)
    assert hopper_kernels.ENGINE_ROUTE_PRECISIONS == ("bf16", "fp16") and hopper_kernels.ENGINE_ROUTE is True
    from monarch_fftconv import functional
    u, k = torch.empty(16, 256, 8192, device="meta"), torch.empty(256, 8192, device="meta")
    for left_out, kept in (("fp16", "bf16"), ("bf16", "fp16")):
        routed = hopper_kernels.select_backend(cuda, torch.float32, left_out, plan, many)
        assert routed.name == "cuda-tensor-core" and "the tensor-core engine" in routed.kernel
        call = (u, k, None, None, None, False, left_out, None)
        key_on_route = functional._call_key(*call)
        monkeypatch.setattr(hopper_kernels, "ENGINE_ROUTE_PRECISIONS", (kept,))
        # the route's precisions are part of every remembered decision, here and in functional's
        # call key: taking a precision off (or putting it back) is seen by the next identical call
        assert functional._call_key(*call) != key_on_route
        backend = hopper_kernels.select_backend(cuda, torch.float32, left_out, plan, many)
        assert backend.name == "cuda-fp32" and backend.runs_as == "fp32"
        assert f"leaves {left_out} out" in backend.reason and f"ENGINE_ROUTE_PRECISIONS: {kept};" in backend.reason
        assert "fp16's range" in backend.reason and "overflow" not in backend.reason  # true of bf16 too
        assert hopper_kernels.select_backend(cuda, torch.float32, kept, plan, many).name == "cuda-tensor-core"
        monkeypatch.setattr(hopper_kernels, "ENGINE_ROUTE", False)
        unrouted = hopper_kernels.select_backend(cuda, torch.float32, left_out, plan, many)
        assert unrouted.name == "cuda-fp32" and "fills the GPU" in unrouted.reason
        monkeypatch.setattr(hopper_kernels, "ENGINE_ROUTE", True)
        monkeypatch.setenv(hopper_kernels.TC_KERNEL_ENV, "engine")
        requested = hopper_kernels.select_backend(cuda, torch.float32, left_out, plan, many)
        assert requested.name == "cuda-tensor-core" and "the tensor-core engine (on request)" in requested.kernel
        monkeypatch.delenv(hopper_kernels.TC_KERNEL_ENV)
        small = hopper_kernels.select_backend(cuda, torch.float32, left_out, plan, 7)
        assert small.name == "cuda-tensor-core" and "the mma.sync kernel" in small.kernel
        # the tensor-core kernel's name for a call of the route's size, were it to reach the op
        assert "mma.sync" in hopper_kernels.tensor_core_backend(plan, left_out, torch.float32, many).kernel
        assert "engine" in hopper_kernels.tensor_core_backend(plan, kept, torch.float32, many).kernel
        monkeypatch.setattr(hopper_kernels, "ENGINE_ROUTE_PRECISIONS", ("bf16", "fp16"))
        assert hopper_kernels.select_backend(cuda, torch.float32, left_out, plan, many) == routed
        assert functional._call_key(*call) == key_on_route


def test_the_engine_threshold_is_the_dispatchers():
    """backends.ENGINE_MIN_SEQUENCES (which calls reach the tensor cores) is tc/dispatch.cu's
    kEngineMinSequences (which of them the engine runs): one number in two languages."""
    from monarch_fftconv import backends
    source = (_extension.CSRC / "tc" / "dispatch.cu").read_text()
    found = re.findall(r"constexpr int64_t kEngineMinSequences = (\d+);", source)
    assert found == [str(backends.ENGINE_MIN_SEQUENCES)]
    assert backends.ENGINE_FACTORS == (128, 128) and "p.n1 != 128 || p.n2 != 128" in source
    # and the route's precisions: bf16 and fp16 in both. The dispatcher's route filters no
    # precision, so it takes every one engine::pick runs (its switch's cases); Python's tuple
    # names the same ones.
    assert backends.ENGINE_ROUTE_PRECISIONS == ("bf16", "fp16")
    route = re.search(r"case TensorCoreKernel::kRoute:.*?;", source, re.S).group(0)
    assert "engine::pick(p)" in route and "precision" not in route
    # Every I/O type (backends.engine_applies): the route filters none, and pick_io has all three.
    assert "io_type" not in route
    pick_io = re.search(r"tc::LaunchFn pick_io\(IOType io\) \{.*?\n\}", source, re.S).group(0)
    assert sorted(re.findall(r"case IOType::k(\w+): return &launch<P, IOType::k\1>;", pick_io)) == [
        "BFloat16", "Float16", "Float32"]
    pick = re.search(r"inline tc::LaunchFn pick\(const ConvForwardParams& p\) \{.*?\n\}", source, re.S).group(0)
    picked = re.findall(r"case Precision::k(\w+): return pick_io<Precision::k\1>\(p.io_type\);", pick)
    assert sorted(name.lower() for name in picked) == sorted(backends.ENGINE_ROUTE_PRECISIONS)


def test_the_seed_shape_fills_the_gpu_and_the_tiny_shapes_do_not(hopper_kernels):
    cuda = torch.device("cuda", 0)
    assert hopper_kernels.fills_fp32_kernel(cuda, plan_for(8192), 16 * 256)
    assert hopper_kernels.fills_fp32_kernel(cuda, plan_for(1024), 16 * 256)
    assert not hopper_kernels.fills_fp32_kernel(cuda, plan_for(1000), 3 * 5)
    assert not hopper_kernels.fills_fp32_kernel(cuda, plan_for(8191), 1 * 7)


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_gpu_calls_at_n_32768_take_the_radix_kernel_in_every_precision(hopper_kernels, precision):
    for length in (8193, 12345, 16384):
        backend = hopper_kernels.select_backend(torch.device("cuda", 0), torch.float32, precision, plan_for(length))
        assert backend.name == "cuda-fp32"
        assert precision == "fp32" or "no tensor-core kernel at N=32768" in backend.reason


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_calls_at_n_65536_to_2_23_take_the_four_step_kernels(hopper_kernels, precision, dtype):
    for length, split in ((16385, "8x8192"), (131072, "32x8192"), (200000, "128x4096"), (1 << 22, "1024x8192")):
        backend = hopper_kernels.select_backend(torch.device("cuda", 0), dtype, precision, plan_for(length))
        assert backend.name == "cuda-four-step" and split in backend.kernel


def test_four_step_stages_name_the_launches_and_their_bytes(hopper_kernels):
    """explain()'s stages: five launches; the conv's three move u once in, y once out and
    the one complex intermediate (B·C, P/2+1, M) three times each way."""
    batch, channels, length = 2, 3, 100_000  # N = 262144 = 32 x 8192
    backend = hopper_kernels.select_backend(torch.device("cuda", 0), torch.bfloat16, "fp32", plan_for(length))
    stages = backend.stages(plan_for(length), batch, channels, 2)
    scratch = batch * channels * 17 * 8192 * 8
    assert [s["stage"].split(":")[0] for s in stages] == ["filter spectrum", "filter spectrum", "outer forward", "inner",
                                                          "outer inverse"]
    assert stages[2]["reads"] == batch * channels * length * 2 and stages[2]["writes"] == scratch
    assert stages[4]["reads"] == scratch and stages[4]["writes"] == batch * channels * length * 2
    assert scratch < batch * channels * 262144 * 8  # at most one complex intermediate of the padded size


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("length, dtype, why", [((1 << 22) + 1, torch.float32, "N=16777216"), (100, torch.float64, "float64"),
                                                (64, torch.float32, "N=128")])
def test_gpu_calls_no_kernel_covers_take_cufft(hopper_kernels, length, dtype, why, precision):

    backend = hopper_kernels.select_backend(torch.device("cuda", 0), dtype, precision, plan_for(length))
    assert backend.name == "torch.fft" and why in backend.reason


def test_gpu_without_kernels_takes_cufft_and_explain_never_builds(monkeypatch):
    from monarch_fftconv import backends

    monkeypatch.setattr(backends, "_decisions", {})
    monkeypatch.setattr(_extension, "_result", None)
    monkeypatch.setattr(_extension, "unavailable_reason", lambda: None)
    monkeypatch.setattr(_extension, "_aot_library", lambda: None)
    monkeypatch.setattr(_extension, "build", lambda: pytest.fail("explain() must not build"))
    pending = backends.select_backend(torch.device("cuda", 0), torch.float32, "fp32", plan_for(1000), build=False)
    assert pending.name == "pending" and pending.flops(plan_for(1000), 1, 1) is None
    assert backends._decisions == {}  # not remembered: the real call decides

    monkeypatch.setattr(_extension, "unavailable_reason", lambda: "nvcc not found")
    backend = backends.select_backend(torch.device("cuda", 0), torch.float32, "fp32", plan_for(1000), build=False)
    assert backend.name == "torch.fft" and "nvcc not found" in backend.reason


def test_import_has_no_global_side_effects():
    import subprocess
    import sys

    code = (
        "import torch; s = torch.random.get_rng_state().clone();"
        "import monarch_fftconv;"
        "assert torch.equal(s, torch.random.get_rng_state()), 'RNG touched';"
        "import sys; assert 'monarch_fftconv_cuda' not in str(torch.ops.loaded_libraries)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_toolchain_falls_back_with_one_warning(monkeypatch):

    monkeypatch.setattr(_extension, "unavailable_reason", lambda: "nvcc not found (set CUDA_HOME)")
    monkeypatch.setattr(_extension, "_result", None)
    with pytest.warns(UserWarning, match="nvcc not found") as record:
        assert _extension.coverage() == "nvcc not found (set CUDA_HOME)"
        assert _extension.coverage() == "nvcc not found (set CUDA_HOME)"  # decided once: no second warning
    assert len(record) == 1


def test_failed_build_falls_back_with_one_warning_saying_what_failed(monkeypatch):

    def broken_build(verbose=False):
        raise RuntimeError("nvcc: error: something is wrong")

    monkeypatch.setattr(_extension, "unavailable_reason", lambda: None)
    monkeypatch.setattr(_extension, "_aot_library", lambda: None)
    monkeypatch.setattr(_extension, "build", broken_build)
    monkeypatch.setattr(_extension, "_result", None)
    with pytest.warns(UserWarning, match="building the CUDA extension failed: nvcc: error") as record:
        reason = _extension.coverage()
        assert _extension.coverage() is reason
    assert len(record) == 1 and "something is wrong" in reason


def test_cutlass_path_override(monkeypatch, tmp_path):

    (tmp_path / "include").mkdir()
    monkeypatch.setenv(_extension.CUTLASS_ENV, str(tmp_path))
    assert _extension.cutlass_include_dirs() == [str(tmp_path / "include")]


# --------------------------------------------------------------------------- packaging

REPO = Path(__file__).resolve().parent.parent
INSTALLED_CHECK = """
import sys
from monarch_fftconv import _extension
sources = _extension.binding_sources()
assert all(p.is_file() for p in sources), [str(p) for p in sources if not p.is_file()]
assert "site-packages" in str(_extension.CSRC), _extension.CSRC
print(len(sources), _extension.CSRC)
"""


def _env_without_checkout() -> dict[str, str]:
    """The environment minus any PYTHONPATH entry that points at this checkout."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def test_wheel_ships_the_kernel_sources(tmp_path):
    """A regular (non-editable) install carries the csrc/ tree, so it can JIT-build the kernels."""
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    # Built from a clean copy: a stale in-tree build/ could hide missing package data.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                               ".whl", "gpu_out", "bench_out"))
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(dist),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("monarch_fftconv-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"monarch_fftconv/csrc/{p.relative_to(_extension.CSRC).as_posix()}" for p in csrc_files()}
    assert any("/" in name.removeprefix("monarch_fftconv/csrc/") for name in expected)  # the subdirectories too
    assert expected <= names and "monarch_fftconv/py.typed" in names, expected - names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # torch from this interpreter's site-packages (it may itself be a venv), not the checkout
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "parent-site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # The checkout stays off the path here too: an in-tree build's egg-info there would make
    # pip think the package is already installed.
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                             cwd=tmp_path, env=_env_without_checkout(), capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    check = subprocess.run([str(python), "-c", INSTALLED_CHECK], cwd=tmp_path, env=_env_without_checkout(),
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    assert str(venv) in check.stdout


_CPP_TO_SCHEMA = {"const at::Tensor&": "Tensor", "const std::optional<at::Tensor>&": "Optional[Tensor]",
                  "int64_t": "int", "double": "float", "bool": "bool", "c10::string_view": "str"}


def _cpp_parameters(source: str, function: str) -> list[str]:
    """The parameter types of `function`'s definition in a C++ source (no default values,
    no nested parentheses in the parameter list)."""
    match = re.search(rf"^\S[^\n;]*?\b{function}\(([^)]*)\)\s*\{{", source, re.MULTILINE)
    assert match, f"no definition of {function} in binding.cpp"
    params = [" ".join(p.split()) for p in match.group(1).split(",") if p.strip()]
    return [p.rsplit(" ", 1)[0] for p in params]


def test_binding_signatures_match_the_op_schemas():
    """Each C++ kernel the binding registers takes the arguments of the op's schema, in order
    and type: a mismatch aborts the process when the extension loads, which no CPU test would
    otherwise see."""
    import monarch_fftconv  # noqa: F401  (defines the ops)

    source = (_extension.CSRC / "binding.cpp").read_text()
    registered = re.findall(r'm\.impl\("(\w+)",\s*&(\w+)\)', source)
    assert {name for name, _ in registered} >= {"filter_spectrum", "conv_forward", "fftconv", "fftconv_backward"}
    for name, function in registered:
        schema = getattr(torch.ops.monarch_fftconv, name).default._schema
        want = [str(argument.type) for argument in schema.arguments]
        got = [_CPP_TO_SCHEMA.get(t, t) for t in _cpp_parameters(source, function)]
        assert got == want, (name, function)


def test_the_fill_rule_compiles_into_a_graph(monkeypatch):
    """torch.compile(fullgraph=True) traces a bf16 decision: the SM count is a constant to it,
    asked eagerly (here the cache is filled, as a first eager call on a GPU would)."""
    from monarch_fftconv import backends

    cuda = torch.device("cuda", 0)
    monkeypatch.setitem(backends._MULTIPROCESSORS, cuda, H200_SMS)
    plan = plan_for(8192)

    def scaled(x):
        return x * (2.0 if backends.fills_fp32_kernel(cuda, plan, x.shape[0]) else 1.0)

    compiled = torch.compile(scaled, fullgraph=True, backend="eager")  # dynamo is what is tested
    assert compiled(torch.ones(16 * 256))[0].item() == 2.0
    assert compiled(torch.ones(15))[0].item() == 1.0


# --------------------------------------------------------------------------- the library as a module

def test_python_module_imports_the_loaded_library_once(tmp_path, monkeypatch):
    """_extension.python_module(): None before a library is loaded (it never builds), the module
    once one is (a JIT build by its path, under its own name), asked once; None, not an error,
    for a library without the module's init (an older build), and asked once too."""
    monkeypatch.setattr(_extension, "_library", None)
    monkeypatch.setattr(_extension, "_module", None)
    assert _extension.python_module() is None
    good = tmp_path / "stand_in_library.py"  # any importable file stands in for the .so
    good.write_text("MARK = 7\n")
    monkeypatch.setattr(_extension, "_library", ("stand_in_library", str(good)))
    module = _extension.python_module()
    assert module is not None and module.MARK == 7
    good.write_text("MARK = 8\n")
    assert _extension.python_module() is module  # imported once
    bad = tmp_path / "broken_library.py"
    bad.write_text("raise ImportError('dynamic module does not define module export function')\n")
    monkeypatch.setattr(_extension, "_library", ("broken_library", str(bad)))
    monkeypatch.setattr(_extension, "_module", None)
    assert _extension.python_module() is None
    bad.unlink()
    assert _extension.python_module() is None  # the answer is kept: not retried each call


def test_build_defines_name_the_kernels_switches_and_reach_the_jit_build(monkeypatch):
    """MONARCH_FFTCONV_NVCC_DEFINES: each entry a switch some source defaults with #ifndef, an
    integer value; anything else is a ValueError naming it (a misspelt switch must not build
    the defaults under its name). Set, the JIT build gets the -D flags and an installed
    prebuilt library is passed over (it has the defaults)."""
    monkeypatch.delenv(_extension.DEFINES_ENV, raising=False)
    assert _extension.build_defines() == []
    switches = _extension._switch_macros()
    assert {"MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT", "MONARCH_FFTCONV_FWD_DIRECT_SKIP",
            "MONARCH_FFTCONV_FWD_PREFETCH_POINT", GATED_L2_PREFETCH} <= switches
    monkeypatch.setenv(_extension.DEFINES_ENV,
                       "MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT=6, MONARCH_FFTCONV_FWD_DIRECT_SKIP=1")
    flags = _extension.build_defines()
    assert flags == ["-DMONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT=6", "-DMONARCH_FFTCONV_FWD_DIRECT_SKIP=1"]
    assert _extension._aot_library() is None
    captured = {}
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda **kwargs: captured.update(kwargs) or "built.so")
    assert _extension.build() == "built.so"
    assert captured["extra_cuda_cflags"][-2:] == flags
    for bad in ("MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONNENT=6", "MONARCH_FFTCONV_FWD_DIRECT_SKIP", "NDEBUG=1",
                "MONARCH_FFTCONV_FWD_DIRECT_SKIP=yes", "MONARCH_FFTCONV_FWD_DIRECT_SKIP=--6"):
        monkeypatch.setenv(_extension.DEFINES_ENV, bad)
        with pytest.raises(ValueError, match=re.escape(bad)):
            _extension.build_defines()
    monkeypatch.setenv(_extension.DEFINES_ENV, "MONARCH_FFTCONV_FWD_DIRECT_SKIP=1,MONARCH_FFTCONV_FWD_DIRECT_SKIP=0")
    with pytest.raises(ValueError, match="MONARCH_FFTCONV_FWD_DIRECT_SKIP is given twice"):
        _extension.build_defines()
    monkeypatch.setenv(_extension.DEFINES_ENV, "MONARCH_FFTCONV_FWD_DIRECT_SKIP=1,")  # a trailing comma is no entry
    assert _extension.build_defines() == ["-DMONARCH_FFTCONV_FWD_DIRECT_SKIP=1"]

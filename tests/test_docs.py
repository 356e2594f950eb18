"""The docs' statements that the code can check: the ranges the README's Backends section and
docs/design.md give for each kernel family, against the constants the kernels are built and
routed with; the README's Layout against the files; and the CPU path's FFTs against the plain
torch.fft model's (docs/reliability.md). A range that changes in the code fails here until the
docs say the new one."""

import collections
import re
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import monarch_fftconv as mf
from monarch_fftconv import backends, fourstep
from monarch_fftconv.planner import plan_for

from helpers import is_png
from test_build import H200_SMS, header_constant, kernel_splits

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DESIGN = (REPO / "docs" / "design.md").read_text()


def section(text: str, heading: str) -> str:
    """The text under a markdown heading, up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1:]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def number(written: str | None) -> int | None:
    """A size as the docs write it: 16384, 4,194,304, 2^23, 4M (None: an optional part left out)."""
    if written is None:
        return None
    written = written.replace(",", "")
    if match := re.fullmatch(r"2\^(\d+)", written):
        return 1 << int(match.group(1))
    if match := re.fullmatch(r"(\d+)M", written):
        return int(match.group(1)) << 20
    return int(written)


def longest_input(fft_size: int) -> int:
    """The largest L the planner gives this N (N = 2·next_pow2(L))."""
    longest = fft_size // 2
    assert plan_for(longest).fft_size == fft_size and plan_for(longest + 1).fft_size == 2 * fft_size
    return longest


def split_sizes(macro: str) -> list[int]:
    return [n1 * n2 for n1, n2 in kernel_splits(macro)]


# The ranges as the code has them: fftconv.h's split lists and four-step bounds (the kernels are
# built for exactly these), fourstep.py's copy of the bounds, backends.py's routing constants.
TENSOR_CORE_SIZES = split_sizes("MONARCH_FFTCONV_SPLITS")
FP32_SIZES = TENSOR_CORE_SIZES + split_sizes("MONARCH_FFTCONV_RADIX_ONLY_SPLITS")
TC_MIN, TC_MAX = min(TENSOR_CORE_SIZES), max(TENSOR_CORE_SIZES)
FP32_MIN, FP32_MAX = min(FP32_SIZES), max(FP32_SIZES)
FOURSTEP_MIN, FOURSTEP_MAX = header_constant("kFourStepMinSize"), header_constant("kFourStepMaxSize")
SIZE = r"(\d[\d,]*M?|2\^\d+)"  # a size as the docs write it (see `number`)


def test_the_ranges_compared_here_are_the_packages():
    """The constants read from the header are the ones Python routes with, and the families
    tile the sizes: four-step picks up where the fp32 kernels end."""
    assert (FOURSTEP_MIN, FOURSTEP_MAX) == (fourstep.MIN_FFT_SIZE, fourstep.MAX_FFT_SIZE)
    assert FP32_MIN == TC_MIN and FOURSTEP_MIN == 2 * FP32_MAX
    assert sorted(FP32_SIZES) == [1 << e for e in range(FP32_MIN.bit_length() - 1, FP32_MAX.bit_length())]


def stated(text: str, pattern: str) -> list[tuple[int, ...]]:
    """The numbers of every statement matching `pattern` (at least one must be there)."""
    matches = list(re.finditer(pattern, text))
    assert matches, f"no statement matches {pattern!r}: the docs changed; update the test with them"
    return [tuple(number(g) for g in m.groups()) for m in matches]


BACKENDS = section(README, "## Backends")

README_RANGES = [
    # (what, pattern, the code's values)
    ("tensor cores", rf"`cuda-tensor-core`: [^\n]*?N = 2L from {SIZE} to {SIZE}\s+\(L ≤ {SIZE}\)",
     lambda: (TC_MIN, TC_MAX, longest_input(TC_MAX))),
    ("a wave of the fp32 kernel", rf"B·C·N < SMs × {SIZE}; on an H200, fewer than {SIZE} sequences at\s+L = {SIZE}",
     lambda: (backends.FP32_KERNEL_POINTS_PER_SM, H200_SMS * backends.FP32_KERNEL_POINTS_PER_SM // TC_MAX,
              longest_input(TC_MAX))),
    ("the engine's split and route",  # and its precisions: backends.ENGINE_ROUTE_PRECISIONS
     rf"At N = {SIZE}, {'/'.join(backends.ENGINE_ROUTE_PRECISIONS)} calls of B·C ≥ {SIZE} with fp32, bf16 or fp16 I/O\s+"
     rf"take the tensor-core engine",
     lambda: (TC_MAX, backends.ENGINE_MIN_SEQUENCES)),
    ("tf32 on tensor cores", rf"tf32 variant measured\s+slower than the fp32 kernel but on small calls at N ≤ {SIZE}",
     lambda: (backends.TF32_TENSOR_CORE_MAX_FFT,)),
    ("fp32", rf"`cuda-fp32`: the fused fp32 kernel, N = {SIZE} to {SIZE} \(L ≤ {SIZE}\)",
     lambda: (FP32_MIN, FP32_MAX, longest_input(FP32_MAX))),
    ("fp32 beyond the tensor cores", rf"at N = {SIZE} \({SIZE} < L ≤ {SIZE}\) it serves every precision",
     lambda: (FP32_MAX, longest_input(TC_MAX), longest_input(FP32_MAX))),
    ("four-step", rf"`cuda-four-step`: long sequences, N = {SIZE} to {SIZE} \({SIZE} < L ≤ {SIZE}\)",
     lambda: (FOURSTEP_MIN, FOURSTEP_MAX, longest_input(FOURSTEP_MIN // 2), longest_input(FOURSTEP_MAX))),
    ("torch.fft on the GPU", rf"other GPUs, float64, L ≤ {SIZE} where N < {SIZE}, L > {SIZE}\)",
     lambda: (longest_input(TC_MIN // 2), FP32_MIN, longest_input(FOURSTEP_MAX))),
]


@pytest.mark.parametrize("what, pattern, code", README_RANGES, ids=[r[0] for r in README_RANGES])
def test_readme_backends_ranges_are_the_codes(what, pattern, code):
    assert set(stated(BACKENDS, pattern)) == {code()}, what


def test_readme_routing_thresholds_are_the_codes():
    """The thresholds the README's tables and the Precision section give for routing."""
    assert set(stated(README, rf"B·C·N ≥ SMs × {SIZE}")) == {(backends.FP32_KERNEL_POINTS_PER_SM,)}
    assert set(stated(README, rf"small calls at N ≤ {SIZE}\)")) == {(backends.TF32_TENSOR_CORE_MAX_FFT,)}
    assert set(stated(README, rf"except small ones\s+at N ≤ {SIZE} \(below half")) == {(backends.TF32_TENSOR_CORE_MAX_FFT,)}
    assert backends.TENSOR_CORE_WAVE_SHARE["tf32"] == 0.5  # "below half the fp32 kernel's wave"


DESIGN_RANGES = [
    ("every kernel", rf"The kernels cover N = {SIZE} to {SIZE} \(L ≤ {SIZE}\)",
     lambda: (FP32_MIN, FOURSTEP_MAX, longest_input(FOURSTEP_MAX))),
    ("tensor cores", rf"the tensor-core kernels N = {SIZE} to {SIZE}", lambda: (TC_MIN, TC_MAX)),
    ("fp32", rf"the fp32 radix kernels N = {SIZE} to {SIZE}", lambda: (FP32_MIN, FP32_MAX)),
    ("four-step", rf"four-step kernels N = {SIZE} to {SIZE}\.", lambda: (FOURSTEP_MIN, FOURSTEP_MAX)),
    ("cuFFT", rf"N below {SIZE} \(L ≤ {SIZE}\)\s+and N above {SIZE} \(L > {SIZE}\) take cuFFT",
     lambda: (FP32_MIN, longest_input(FP32_MIN // 2), FOURSTEP_MAX, longest_input(FOURSTEP_MAX))),
    ("the four-step source tree", rf"`fourstep/`: long sequences \(N ≥ {SIZE}\)", lambda: (FOURSTEP_MIN,)),
    ("the largest radix-only size", rf"No tensor-core kernel covers N = {SIZE}", lambda: (FP32_MAX,)),
    ("on chip", rf"Above N = {SIZE} one FFT no longer fits on chip", lambda: (FP32_MAX,)),
    ("the four-step ops", rf"From N = {SIZE} the `monarch_fftconv::\*` ops take the four-step", lambda: (FOURSTEP_MIN,)),
    ("the engine's split", rf"the 128×128 split \(N = {SIZE},\s+{SIZE} < L ≤ {SIZE}\)",
     lambda: (TC_MAX, longest_input(TC_MAX // 2), longest_input(TC_MAX))),
    ("tf32 on tensor cores", rf"for calls at N ≤ {SIZE} below half", lambda: (backends.TF32_TENSOR_CORE_MAX_FFT,)),
    ("a wave of the fp32 kernel", rf"B·C·N ≥ SMs × {SIZE}", lambda: (backends.FP32_KERNEL_POINTS_PER_SM,)),
]


@pytest.mark.parametrize("what, pattern, code", DESIGN_RANGES, ids=[r[0] for r in DESIGN_RANGES])
def test_design_ranges_are_the_codes(what, pattern, code):
    assert set(stated(DESIGN, pattern)) == {code()}, what


def test_design_four_step_memory_table_has_the_codes_splits():
    """Each row, `| first L .. last L (N) | P × M |`: the lengths the planner sends to N, the
    split the kernels take at N; the rows start at the four-step's first N and end at its last."""
    rows = stated(DESIGN, rf"\| (?:{SIZE} )?\.\. {SIZE} \({SIZE}\) \| {SIZE} × {SIZE} \|")
    sizes = []
    for first, last, fft_size, outer, inner in rows:
        assert last == longest_input(fft_size) and inner == fourstep.inner_for(fft_size) and outer * inner == fft_size
        assert first is None or first == longest_input(fft_size // 2) + 1
        sizes.append(fft_size)
    assert sizes[0] == FOURSTEP_MIN and sizes[-1] == FOURSTEP_MAX and sizes == sorted(sizes)


def test_any_n_outside_statement_gives_the_whole_covered_range():
    """The statement issue #31 found ('N outside 256..16384 take cuFFT'): wherever a doc says
    which N are outside the kernels, it must give the whole range they cover."""
    for name, text in (("README.md", README), ("docs/design.md", DESIGN)):
        for match in re.finditer(rf"N outside {SIZE}\s*\.\.\s*{SIZE}", text):
            assert tuple(map(number, match.groups())) == (FP32_MIN, FOURSTEP_MAX), f"{name}: {match.group(0)}"
    assert re.search(rf"N outside {SIZE}\s*\.\.\s*{SIZE}", "N outside 256..16384 take cuFFT")  # the pattern finds it


PERFORMANCE = (REPO / "docs" / "performance.md").read_text()


def test_readme_performance_sources_are_sections_of_the_log():
    """The README's performance section names the perf-log sections its figures come from (the
    tables themselves are one run's, checked against its JSON: test_readme_tables.py): each must
    exist."""
    cited = set(re.findall(r'"(Session \d+)"', section(README, "## Performance")))
    headings = set(re.findall(r"^## (Session \d+)\b", PERFORMANCE, re.MULTILINE))
    assert cited and cited <= headings


def test_every_log_entry_heading_carries_its_date_and_sources():
    """docs/performance.md's session headings: 'recorded YYYY-MM-DD' (or 'date not recorded'),
    and the sources measured (a digest, a git commit or tree, or 'not recorded')."""
    entries = re.findall(r"^#{2,4} Session \d+.*$", PERFORMANCE, re.MULTILINE)
    assert len(entries) >= 11
    for heading in entries:
        assert re.search(r"recorded \d{4}-\d{2}-\d{2}|date not recorded", heading), heading
        assert re.search(r"digest [0-9a-f]{12}|digest not recorded|git [0-9a-f]{7}|tree [0-9a-f]{7}", heading), heading


def test_readme_layout_names_every_doc_and_module():
    layout = section(README, "## Layout")
    docs = sorted(p.name + ("/" if p.is_dir() else "") for p in (REPO / "docs").iterdir())
    modules = sorted(p.name for p in (REPO / "monarch_fftconv").glob("*.py"))
    assert docs and modules
    assert [d for d in docs if f"`{d}`" not in layout] == []
    assert [m for m in modules if f"`{m}`" not in layout] == []


class FFTCalls(TorchDispatchMode):
    """The ATen FFT ops a region runs, with their output shapes."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "fft" in func.overloadpacket.__name__:
            self.calls[func.overloadpacket.__name__, tuple(out.shape)] += 1
        return out


def plain_model(u, k, skip):
    """The plain torch.fft long convolution (docs/training.md's `torch.fft` model)."""
    n = 2 * u.shape[-1]
    return torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n)[..., : u.shape[-1]] + skip.unsqueeze(-1) * u


def fft_calls(conv, gen, length: int) -> tuple[collections.Counter, collections.Counter]:
    u = torch.randn(2, 3, length, generator=gen, requires_grad=True)
    k = torch.randn(3, length, generator=gen, requires_grad=True)
    skip = torch.randn(3, generator=gen, requires_grad=True)
    with FFTCalls() as forward:
        y = conv(u, k, skip)
    with FFTCalls() as backward:
        y.backward(torch.randn(y.shape, generator=gen))
    return forward.calls, backward.calls


@pytest.mark.parametrize("precision", mf.PRECISIONS)
def test_cpu_calls_run_the_plain_models_ffts(gen, precision):
    """docs/reliability.md: a CPU call runs the plain model's FFTs forward, no more (the rest is
    input checks and the backend choice), whatever the precision; its backward runs an rfft of
    the gradient and a real inverse per input, where the plain model's autograd runs the same
    rfft and a complex inverse of all N points per input (rfft's backward)."""
    length = 1024  # a power of two: the plain model's 2L is the planner's N
    n, bins = plan_for(length).fft_size, length + 1
    assert n == 2 * length
    package = fft_calls(lambda u, k, skip: mf.fftconv(u, k, D=skip, precision=precision), gen, length)
    plain = fft_calls(plain_model, gen, length)
    assert package[0] == plain[0]
    assert sum(package[0].values()) == 3  # rfft of u, rfft of k, irfft
    assert plain[1] == {("_fft_r2c", (2, 3, bins)): 1, ("_fft_c2c", (2, 3, n)): 1, ("_fft_c2c", (3, n)): 1}
    assert package[1] == {("_fft_r2c", (2, 3, bins)): 1, ("_fft_c2r", (2, 3, n)): 1, ("_fft_c2r", (3, n)): 1}


def test_every_image_the_docs_show_is_in_the_repository():
    """Each image a markdown file links (README.md, docs/*.md, by a path relative to that file)
    is a PNG in the repository: a figure renamed or left uncommitted fails here, not on a reader."""
    linked = 0
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target:
                continue
            image = (page.parent / target).resolve()
            assert image.is_file(), f"{page.name} shows {target}, which is not in the repository"
            assert is_png(image), f"{target} is not a PNG"
            linked += 1
    assert linked >= 8   # the README's two figures, performance.md's four, training.md's two

#!/usr/bin/env python
"""The performance tables of README.md and docs/performance.md, written from one run's JSON.

    python benchmarks/readme_tables.py                          # gpu_out/bench_json/*.json
    python benchmarks/readme_tables.py gpu_out/bench_json       # a directory of results.json files
    python benchmarks/readme_tables.py a/results.json b/results.json --check
    python benchmarks/readme_tables.py docs/runs/RUN --figure docs/img/readme_times.png   # the committed form

Reads the results.json files that `bench_cufft.py` writes (benchmarks/fftconv_bench/outputs.py:
the run's metadata and one row per shape x pass x method) and writes one markdown table per
question, with the run's date, device, sources and commands above them:
- forward, L <= 8192 (N <= 16384, where every kernel family runs);
- training step (forward + backward by torch.autograd.grad), every shape;
- long sequences, forward, L > 8192 (N >= 32768: the fp32 radix and four-step kernels);
- peers: methods neither of this package nor the reference (cufft-tuned, compile-reference,
  cudnn), beside `monarch[fp32]`, when the run has them;
- where this package is slower: each row of it that took longer than the reference or a peer of
  its shape, pass and training step, b2b or latency (or a line saying none did); below it the
  methods the run skipped, and why (e.g. cudnn where cuDNN could not be loaded).
`benchmarks/run_gpu.sh` runs the forward, training-step and long-sequence benchmarks and
copies their JSON into $OUT/bench_json/, the default here. The files given must be one run's:
the same sources digest and device (the script refuses a mix).

`--figure PATH` also draws the run as one PNG (benchmarks/fftconv_bench/plots.py,
plot_method_bars): the forward and the training step side by side, a bar per method of
FIGURE_METHODS (the reference, cuDNN, `monarch[fp32]`, `monarch[bf16]`) at each shape, b2b ms on a
log axis, NOISY bars hatched; the block then shows it above the tables (its path relative to
each file). `--check --figure PATH` checks the link, not the PNG.

The tables replace what lies between the markers `<!-- tables:begin -->` and
`<!-- tables:end -->` in each file (README.md and docs/performance.md by default); a file
without exactly one pair is an error. `--check` writes nothing and exits 1 when a file differs
from what the JSON gives.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
for _path in (HERE, REPO_ROOT):   # fftconv_bench, and monarch_fftconv from the checkout
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fftconv_bench.cli import build_parser  # noqa: E402
from monarch_fftconv.planner import plan_for  # noqa: E402

BEGIN = "<!-- tables:begin -->"
END = "<!-- tables:end -->"
DEFAULT_RUN = REPO_ROOT / "gpu_out" / "bench_json"
DEFAULT_FILES = (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "performance.md")
# From this N on no tensor-core kernel runs (the fp32 radix kernel at 32768, then four-step).
LONG_FROM_FFT_SIZE = 32768
PACKAGE_FAMILY = "monarch"
REFERENCE_FAMILY = "reference"
TRAINING_STEP = "autograd.grad"   # the training-step variant the tables show
PEER_BASELINE = "monarch[fp32]"    # what a user's default call runs, beside each peer
NONE = "—"


class TablesError(Exception):
    """A file or a run that the tables cannot be written from (the message says why)."""


@dataclass
class RunFile:
    path: Path
    meta: Dict[str, Any]
    rows: List[Dict[str, Any]]


# ------------------------------------------------------------------------------------ reading

def json_files(sources: Sequence[Path]) -> List[Path]:
    """Each source is a results.json or a directory: its *.json, else its */results.json."""
    files: List[Path] = []
    for source in sources:
        if source.is_dir():
            found = sorted(source.glob("*.json")) or sorted(source.glob("*/results.json"))
            if not found:
                raise TablesError(f"{source}: no *.json or */results.json in this directory")
            files.extend(found)
        elif source.is_file():
            files.append(source)
        else:
            raise TablesError(f"{source}: no such file or directory")
    return files


def load_run(sources: Sequence[Path]) -> List[RunFile]:
    """The benchmark JSON files of one run, checked to be one run's."""
    run = []
    for path in json_files(sources):
        data = json.loads(path.read_text())
        if data.get("benchmark") != "bench_cufft" or not isinstance(data.get("results"), list):
            raise TablesError(f"{path}: not a bench_cufft.py results.json")
        meta = {k: v for k, v in data.items() if k != "results"}
        run.append(RunFile(path, meta, data["results"]))
    run.sort(key=lambda f: str(f.meta.get("timestamp_utc", "")))   # in the order they ran
    for key in ("source_digest", "device", "gpu_name"):
        values = {str(f.meta.get(key)) for f in run}
        if len(values) > 1:
            raise TablesError(f"not one run: the files differ in {key} ({', '.join(sorted(values))}): "
                              + ", ".join(str(f.path) for f in run))
    seen = set()
    for f in run:
        for row in f.rows:
            key = (row["shape"], row["pass"], row["method"])
            if key in seen:
                raise TablesError(f"{f.path}: {key} measured twice in this run")
            seen.add(key)
    return run


def command(args: Dict[str, Any]) -> str:
    """The bench_cufft.py command line that ran, from the JSON's parsed arguments."""
    words = ["python", "benchmarks/bench_cufft.py"]
    for action in build_parser()._actions:
        if not action.option_strings or action.dest not in args:
            continue
        value = args[action.dest]
        if value == action.default or value is None:
            continue
        option = action.option_strings[-1]
        if isinstance(value, bool):
            words.append(option)
        elif action.dest == "shapes":
            words += [option, ",".join("x".join(map(str, shape)) for shape in value)]
        else:
            words += [option, str(value) if " " not in str(value) else f"'{value}'"]
    return " ".join(words)


# ------------------------------------------------------------------------------------ cells

def ms(value: Optional[float]) -> str:
    return NONE if value is None else f"{value:.4g}"


def ratio(value: Optional[float]) -> str:
    return NONE if value is None else f"{value:.2f}x"


def error(value: Optional[float]) -> str:
    return NONE if value is None else f"{value:.1e}"


def shape(row: Dict[str, Any]) -> str:
    return f"{row['B']}×{row['C']}×{row['L']}"


def speedups(row: Dict[str, Any]) -> str:
    if row.get("validity") == "INVALID":
        return "INVALID (under the memory floor)"
    if row.get("validity") == "NOISY":  # the benchmark gives an untrusted timing no speedup
        # Each reason once: runs before the benchmark's fix (session 19) repeated one per later row.
        reasons = dict.fromkeys(filter(None, (row.get("noisy_because") or "").split("; ")))
        return f"NOISY ({'; '.join(reasons) or 'spread'})"
    return f"{ratio(row.get('speedup_vs_reference'))} / {ratio(row.get('latency_speedup_vs_reference'))}"


def timing_cells(row: Dict[str, Any]) -> List[str]:
    """b2b ms, latency ms, speedups: or the error, when the method failed."""
    if row.get("status") != "ok":
        return [f"error: {str(row.get('error') or '')[:80]}", NONE, NONE]
    return [ms(row.get("median_ms")), ms(row.get("latency_median_ms")), speedups(row)]


def fft_size(row: Dict[str, Any]) -> int:
    return row.get("fft_size") or plan_for(row["L"]).fft_size


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


# ------------------------------------------------------------------------------------ questions

def ours_or_reference(row: Dict[str, Any]) -> bool:
    return row.get("family") in (PACKAGE_FAMILY, REFERENCE_FAMILY)


def forward_rows(rows):
    return [r for r in rows if r["pass"] == "fwd" and ours_or_reference(r) and fft_size(r) < LONG_FROM_FFT_SIZE]


def training_rows(rows):
    return [r for r in rows if r["pass"] == "fwd+bwd" and ours_or_reference(r) and r.get("train_step") == TRAINING_STEP]


def long_rows(rows):
    return [r for r in rows if r["pass"] == "fwd" and ours_or_reference(r) and fft_size(r) >= LONG_FROM_FFT_SIZE]


def peer_rows(rows):
    return [r for r in rows if not ours_or_reference(r) and r.get("train_step") in (None, TRAINING_STEP)]


def forward_table(rows) -> List[str]:
    columns = ["B×C×L", "method", "backend", "b2b ms", "latency ms", "vs reference, b2b / latency",
               "rel. L2 error", "allclose"]
    return table(columns, [[shape(r), f"`{r['method']}`", r.get("backend") or NONE, *timing_cells(r),
                            error(r.get("rel_err")), "yes" if r.get("allclose") else "no"] for r in rows])


def training_table(rows) -> List[str]:
    columns = ["B×C×L", "method", "backend", "b2b ms", "latency ms", "vs reference, b2b / latency",
               "rel. L2 error y / du / dk"]
    return table(columns, [[shape(r), f"`{r['method']}`", r.get("backend") or NONE, *timing_cells(r),
                            " / ".join(error(r.get(k)) for k in ("rel_err", "grad_u_rel_err", "grad_k_rel_err"))]
                           for r in rows])


def long_table(rows) -> List[str]:
    columns = ["B×C×L", "N", "method", "backend", "b2b ms", "latency ms", "vs reference, b2b / latency",
               "rel. L2 error"]
    return table(columns, [[shape(r), str(fft_size(r)), f"`{r['method']}`", r.get("backend") or NONE,
                            *timing_cells(r), error(r.get("rel_err"))] for r in rows])


def peers_table(peers, rows) -> List[str]:
    def baseline(peer):
        return next((r for r in rows if r["shape"] == peer["shape"] and r["pass"] == peer["pass"]
                     and r["method"] == PEER_BASELINE and r.get("status") == "ok"), None)

    cells = []
    for peer in peers:
        ours = baseline(peer)
        faster = (peer["median_ms"] / ours["median_ms"]
                  if ours is not None and peer.get("status") == "ok" and trusted(peer) and trusted(ours) else None)
        cells.append([shape(peer), peer["pass"], f"`{peer['method']}`", peer.get("backend") or NONE,
                      timing_cells(peer)[0], ratio(peer.get("speedup_vs_reference")),
                      ms(ours["median_ms"]) if ours else NONE, ratio(faster)])
    columns = ["B×C×L", "pass", "method", "backend", "b2b ms", "vs reference, b2b",
               f"`{PEER_BASELINE}` b2b ms", f"`{PEER_BASELINE}` vs this, b2b"]
    return table(columns, cells)


CLOCKS = (("b2b", "median_ms"), ("latency", "latency_median_ms"))
DISTRUSTED = ("NOISY", "INVALID")  # the benchmark's verdicts that no ratio may rest on


def trusted(row) -> bool:
    return row.get("validity") not in DISTRUSTED


def slower_cells(rows) -> List[List[str]]:
    """Each (row of this package, clock, other method) where the package's row took longer: the
    other being the reference or a peer (cudnn, ...) of the same shape, pass and training step.
    A NOISY or INVALID row on either side says so: the benchmark trusts no ratio of it."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for r in rows:
        if r.get("status") == "ok":
            groups.setdefault((r["shape"], r["pass"], r.get("train_step")), []).append(r)
    cells = []
    for group in groups.values():
        others = [r for r in group if r.get("family") != PACKAGE_FAMILY]
        for ours in (r for r in group if r.get("family") == PACKAGE_FAMILY):
            for clock, field in CLOCKS:
                for other in others:
                    mine, theirs = ours.get(field), other.get(field)
                    if mine is None or theirs is None or mine <= theirs:
                        continue
                    notes = "; ".join(f"{verdict}: {', '.join(named)}" for verdict in DISTRUSTED
                                      if (named := [f"`{r['method']}`" for r in (ours, other)
                                                    if r.get("validity") == verdict]))
                    cells.append([shape(ours), ours["pass"], f"`{ours['method']}`", clock, ms(mine),
                                  f"`{other['method']}`", ms(theirs), ratio(mine / theirs), notes])
    return cells


def slower_table(rows) -> List[str]:
    cells = slower_cells(rows)
    if not cells:
        return ["None: every row of this package is at least as fast as the reference and each peer of "
                "its shape and pass, b2b and latency."]
    columns = ["B×C×L", "pass", "method", "clock", "ms", "slower than", "its ms", "ratio", "note"]
    return table(columns, cells)


QUESTIONS: List[tuple] = [
    # (heading, rows of the question, table)
    (f"Forward, L ≤ {LONG_FROM_FFT_SIZE // 4} (N ≤ {LONG_FROM_FFT_SIZE // 2})", forward_rows, forward_table),
    ("Training step: forward + backward (gradients for u and k by `torch.autograd.grad`)", training_rows,
     training_table),
    (f"Long sequences, forward: L > {LONG_FROM_FFT_SIZE // 4} (N ≥ {LONG_FROM_FFT_SIZE})", long_rows, long_table),
]


def run_dates(run: List[RunFile]) -> str:
    """The days the run's files were written, as the tables' heading and the figure's title say them."""
    return " – ".join(sorted({str(f.meta.get("timestamp_utc", ""))[:10] or "date not recorded" for f in run}))


# ------------------------------------------------------------------------------------ the figure

# The methods of the figure: what a user compares (the reference, NVIDIA's peer, this package's
# default and its bf16 call, whatever kernel each ran), a bar each where the run has its row.
FIGURE_METHODS = ("reference", "cudnn", "monarch[fp32]", "monarch[bf16]")


def figure_panels(rows) -> List[tuple]:
    """[(heading, rows)]: the forward and the training step (the tables' autograd.grad step), each
    with the run's rows of FIGURE_METHODS; a pass the run lacks has no panel."""
    def of(pass_name, steps):
        return [r for r in rows if r["pass"] == pass_name and r["method"] in FIGURE_METHODS
                and r.get("train_step") in steps]
    panels = [("forward", of("fwd", (None, TRAINING_STEP))),
              ("training step: forward + backward (torch.autograd.grad)", of("fwd+bwd", (TRAINING_STEP,)))]
    return [(heading, selected) for heading, selected in panels if selected]


def write_figure(run: List[RunFile], path: Path) -> Dict[str, Dict[tuple, float]]:
    """The figure of the run's FIGURE_METHODS rows (PNG at path); what it drew, by panel."""
    from fftconv_bench.plots import plot_method_bars  # matplotlib: imported only for the figure
    panels = figure_panels([row for f in run for row in f.rows])
    if not panels:
        raise TablesError(f"no rows of {', '.join(FIGURE_METHODS)} in this run: no figure to draw")
    return plot_method_bars(str(path), panels, FIGURE_METHODS, run[0].meta,
                            f"Time per call, one run ({run_dates(run)}; benchmarks/readme_tables.py --figure)")


# ------------------------------------------------------------------------------------ the block

def device_line(meta: Dict[str, Any]) -> str:
    if meta.get("device") == "cuda":
        return (f"{meta.get('gpu_name')} ({meta.get('gpu_sm_count')} SMs, {meta.get('gpu_memory_gib')} GiB, "
                f"sm_{meta.get('gpu_capability')}), torch {meta.get('torch_version')}, CUDA {meta.get('cuda_version')}")
    return f"CPU ({meta.get('cpu')}, {meta.get('threads')} threads), torch {meta.get('torch_version')}"


def skipped_lines(run: List[RunFile]) -> List[str]:
    """The methods the run's files skipped and why, each once, as a markdown list."""
    lines: List[str] = []
    for f in run:
        for skip in f.meta.get("skipped", []):
            where = f" at {skip['shape']}" if skip.get("shape") else ""
            line = f"- `{skip['method']}`{where}: {skip['reason']}"
            if line not in lines:
                lines.append(line)
    return lines


def render(run: List[RunFile], figure_link: Optional[str] = None) -> str:
    """The block that goes between the markers, markers included; with figure_link (the figure's
    path relative to the file), the figure above the tables."""
    first = run[0].meta
    rows = [row for f in run for row in f.rows]
    device = "GPU" if first.get("device") == "cuda" else "CPU"
    out = [BEGIN,
           "<!-- Written by benchmarks/readme_tables.py from one run's JSON: rerun it, do not edit here. -->",
           f"### Benchmark tables: one run, {run_dates(run)}, {first.get('gpu_name') or 'CPU'}", ""]
    if device == "CPU":
        out += [f"**{first.get('note') or 'CPU figures, not GPU ones.'}**", ""]
    out += [f"Device: {device_line(first)}. Sources digest {first.get('source_digest')}, "
            f"git {first.get('git_commit') or 'not recorded'}. The run's commands (one JSON each):", ""]
    for f in run:
        out.append(f"- `{command(f.meta.get('args', {}))}` ({f.meta.get('pass')}, {f.meta.get('reps')} reps, "
                   f"{f.meta.get('timestamp_utc') or 'time not recorded'})")
    out += ["",
            "Medians of the reps, in ms: b2b, calls enqueued back to back; latency, one call at a time "
            "with the device idle before it. vs reference: the `reference` row's median over this row's, "
            "same shape and pass. Errors: relative L2 against float64 torch.fft on the same inputs; "
            "allclose(atol=1e-2, rtol=1e-2). `reference` is the plain torch.fft model, `monarch[p]` "
            "`fftconv(u, k, precision=p)`, `monarch-module` `FFTConv` with its cached filter spectrum, "
            "`monarch-tc[p]` the tensor-core kernel itself through the op, `cudnn` cuDNN's FFT causal "
            "convolution (`cudnn.ops.fft_causal_conv1d`, or its C API where the frontend cannot run: the "
            "row's entry says which); the backend column says what ran."]
    if figure_link is not None:
        # The alt text without brackets: monarch[fp32] inside it would end the link text early.
        alt = ", ".join(m.replace("[", " ").rstrip("]") for m in FIGURE_METHODS)
        out += ["", f"![Time per call of {alt}: forward and training step, "
                f"{first.get('gpu_name') or 'CPU'}]({figure_link})", "",
                f"The figure: the b2b medians of the tables below for {', '.join(f'`{m}`' for m in FIGURE_METHODS)} "
                "(whatever kernel each call took), a log axis; a hatched bar is NOISY."]
    for heading, select, make in QUESTIONS:
        selected = select(rows)
        out += ["", f"#### {heading}", ""]
        out += make(selected) if selected else ["Not measured in this run."]
    peers = peer_rows(rows)
    out += ["", "#### Peers: other implementations beside the reference", ""]
    out += peers_table(peers, rows) if peers else ["None in this run."]
    out += ["", "#### Where this package is slower: a row of it against the reference or a peer, same shape and "
            "pass", ""]
    out += slower_table(rows)
    skipped = skipped_lines(run)
    if skipped:
        out += ["", "Skipped, not measured:", ""] + skipped
    out.append(END)
    return "\n".join(out)


def replace_block(text: str, block: str, name: str) -> str:
    """`text` with the markers' span replaced by `block` (which holds the markers)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise TablesError(f"{name}: needs exactly one {BEGIN} ... {END} pair, in that order")
    return text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="*", type=Path, default=[DEFAULT_RUN],
                        help=f"results.json files or directories of one run (default: {DEFAULT_RUN})")
    parser.add_argument("--files", nargs="*", type=Path, default=list(DEFAULT_FILES),
                        help="the markdown files whose marked block is replaced (default: README.md "
                             "docs/performance.md; none with --files alone: the figure only)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file differs from what the JSON gives")
    parser.add_argument("--figure", type=Path, default=None,
                        help="also draw the run (PNG at this path; not with --check) and show it above "
                             f"the tables: the forward and the training step, b2b ms of {', '.join(FIGURE_METHODS)} "
                             "at each shape")
    args = parser.parse_args(argv)
    try:
        run = load_run(args.run)
        if args.figure is not None and not args.check:
            write_figure(run, args.figure)
            print(f"figure written: {args.figure}")

        def block(path: Path) -> str:
            link = None if args.figure is None else os.path.relpath(args.figure.resolve(), path.resolve().parent)
            return render(run, link)
        updated = {path: replace_block(path.read_text(), block(path), str(path)) for path in args.files}
    except (TablesError, OSError, ValueError, KeyError) as e:
        print(f"readme_tables.py: {e}", file=sys.stderr)
        return 2
    differ = [path for path, text in updated.items() if text != path.read_text()]
    if args.check:
        for path in differ:
            diff = difflib.unified_diff(path.read_text().splitlines(), updated[path].splitlines(),
                                        str(path), "from the JSON", lineterm="", n=0)
            print("\n".join(list(diff)[:40]))
        print(f"{len(differ)} of {len(updated)} files differ from the run's tables" if differ
              else "the tables match the run")
        return 1 if differ else 0
    for path in differ:
        path.write_text(updated[path])
    print(f"tables written into {len(differ)} of {len(updated)} files"
          + (f" ({', '.join(map(str, differ))})" if differ else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

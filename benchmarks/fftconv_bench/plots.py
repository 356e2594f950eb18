"""PNG plots of a run's rows (matplotlib, Agg backend): time vs L, speedup over the reference,
error per method and precision.

Each computation is drawn once: a row that runs the same code as an earlier row of its shape
(same_computation_as; on the CPU every monarch precision runs the same torch.fft code) is left
out, and the earlier row's label names it. NOISY rows are drawn hollow in the time plot and
have no speedup to draw; each figure says which were left out."""
from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import Any, Dict, List, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402


def _title(meta: Dict[str, Any], what: str, pass_name: str) -> str:
    if meta.get("device") == "cuda":
        where = f"{meta.get('gpu_name')}, torch {meta.get('torch_version')}, CUDA {meta.get('cuda_version')}"
    else:
        where = (f"CPU FIGURES, NOT GPU: {meta.get('cpu')}, torch {meta.get('torch_version')}, "
                 f"torch.fft = {meta.get('fft_library')}")
    return f"{what} [{pass_name}]\n{where}"


def _ok(r: Dict[str, Any]) -> bool:
    return r.get("status") == "ok" and r.get("median_ms") is not None


def _repeat(r: Dict[str, Any]) -> bool:
    """Whether the row runs the same code as an earlier row of its shape."""
    return bool(r.get("same_computation_as"))


def _drawn(r: Dict[str, Any]) -> bool:
    return _ok(r) and not _repeat(r)


def _has_speedup(r: Dict[str, Any]) -> bool:
    """Drawn and trusted: INVALID, NOISY and error rows have no speedup."""
    return _drawn(r) and r.get("speedup_vs_reference") is not None


def _noisy(r: Dict[str, Any]) -> bool:
    return r.get("validity") == "NOISY"


def _footnote(fig, rows: Sequence[Dict[str, Any]], meta: Dict[str, Any]) -> float:
    """Under the figure, what it leaves out or marks, and why; returns the height (a fraction
    of the figure's) the notes take."""
    notes = []
    repeats = _unique_in_order(r["method"] for r in rows if _ok(r) and _repeat(r))
    if repeats:
        notes.append(f"not drawn, as they run the same code as a drawn row: {', '.join(repeats)}")
    noisy = _unique_in_order(r["method"] for r in rows if _drawn(r) and _noisy(r))
    if noisy:
        notes.append(_noisy_note(meta, noisy, "hollow, no speedup"))
    if notes:
        fig.text(0.01, 0.005, "\n".join(notes), fontsize=7, va="bottom", ha="left")
    return 0.035 * len(notes)


def _noisy_note(meta: Dict[str, Any], methods: Sequence[str], drawn_as: str) -> str:
    """The footnote naming the NOISY methods, and how the figure draws them."""
    return (f"NOISY (spread > {meta.get('max_spread', float('nan')):.0%} of the median, or cores taken by "
            f"other processes; {drawn_as}): {', '.join(methods)}")


def _unique_in_order(values) -> list:
    seen: list = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def _method_order(rows):
    return _unique_in_order(r["method"] for r in rows)


def _label(rows, method):
    """The method, the methods whose rows repeat its computation, and its backends."""
    backends = sorted({str(r.get("backend")) for r in rows if r["method"] == method
                       and r.get("backend") and r.get("status") == "ok"})
    repeats = _unique_in_order(r["method"] for r in rows if r.get("same_computation_as") == method)
    label = method + (f" = {' = '.join(repeats)}" if repeats else "")
    return f"{label} ({', '.join(backends)})" if backends else label


def _panels(rows: Sequence[Dict[str, Any]]):
    """For each pass: (pass name, figure, [(axes, B, C, rows of that B and C)]), one panel per
    (B, C) of the sweep, L along each panel's x axis."""
    by_pass: Dict[str, Dict[tuple, List[Dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_pass[r["pass"]][(r["B"], r["C"])].append(r)
    for pass_name, by_bc in by_pass.items():
        fig, axes = plt.subplots(1, len(by_bc), figsize=(max(7.0, 6.5 * len(by_bc)), 5.2),
                                 squeeze=False)
        yield pass_name, fig, [(ax, B, C, grp) for ax, ((B, C), grp)
                               in zip(axes[0], sorted(by_bc.items()))]


ACCUMULATE_SUFFIX = ".backward"


def _series(grp: Sequence[Dict[str, Any]], keep) -> List[tuple]:
    """[(method, line style, its rows that `keep` accepts, by increasing L)] for the methods
    that have any. A `<method>.backward` training step is drawn dashed in its method's colour."""
    bases = _unique_in_order(m.removesuffix(ACCUMULATE_SUFFIX) for m in _method_order(grp))
    series = []
    for m in _method_order(grp):
        points = sorted((r for r in grp if r["method"] == m and keep(r)), key=lambda r: r["L"])
        style = {"color": f"C{bases.index(m.removesuffix(ACCUMULATE_SUFFIX)) % 10}",
                 "ls": "--" if m.endswith(ACCUMULATE_SUFFIX) else "-"}
        if points:
            series.append((m, style, points))
    return series


def plot_time_vs_L(out_dir, rows, meta) -> List[str]:
    paths = []
    for pass_name, fig, panels in _panels(rows):
        for ax, B, C, grp in panels:
            for m, style, pts in _series(grp, _drawn):
                ys = [r["median_ms"] for r in pts]
                below = [max(0.0, r["median_ms"] - r["q1_ms"]) for r in pts]
                above = [max(0.0, r["q3_ms"] - r["median_ms"]) for r in pts]
                ax.errorbar([r["L"] for r in pts], ys, yerr=[below, above], marker="o", ms=4,
                            capsize=2, label=_label(grp, m), **style)
                noisy = [r for r in pts if _noisy(r)]
                if noisy:   # hollow over the filled marker: untrusted
                    ax.scatter([r["L"] for r in noisy], [r["median_ms"] for r in noisy], s=60,
                               facecolors="white", edgecolors=style["color"], zorder=4)
                bad = [r for r in pts if r.get("validity") == "INVALID"]
                if bad:
                    ax.scatter([r["L"] for r in bad], [r["median_ms"] for r in bad], marker="x",
                               s=80, color="red", zorder=5,
                               label=f"{m}: INVALID (under floor)")
            floor = sorted({(r["L"], r["floor_ms"]) for r in grp if r.get("floor_ms")})
            if floor:
                ax.plot([f[0] for f in floor], [f[1] for f in floor], "k--", lw=1, marker="_", ms=12,
                        label="memory floor (copy bandwidth)")
            ax.set_yscale("log")
            _finish_axes(ax, B, C, "median time per call [ms] (IQR bars)")
        paths.append(_save(fig, meta, "Time vs sequence length", out_dir, "time_vs_L", pass_name,
                           [r for _, _, _, grp in panels for r in grp]))
    return paths


def _finish_axes(ax, B: int, C: int, ylabel: str) -> None:
    """The shared dressing of the per-(B, C) panels of the plots over L."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length L")
    ax.set_ylabel(ylabel)
    ax.set_title(f"B={B}, C={C}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.margins(y=0.35)  # headroom, where loc="best" puts the legend clear of the points
        ax.legend(fontsize=7, loc="best")
    else:   # e.g. every row NOISY: no speedup to draw
        ax.text(0.5, 0.5, "no trusted rows to draw", transform=ax.transAxes, ha="center")


def _write_png(fig, out_dir: str, stem: str, pass_name: str, rows: Sequence[Dict[str, Any]],
               meta: Dict[str, Any]) -> str:
    fig.tight_layout(rect=(0, _footnote(fig, rows, meta), 1, 1))
    path = os.path.join(out_dir, f"{stem}_{pass_name.replace('+', '_')}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _save(fig, meta, title: str, out_dir: str, stem: str, pass_name: str,
          rows: Sequence[Dict[str, Any]]) -> str:
    fig.suptitle(_title(meta, title, pass_name), fontsize=10)
    return _write_png(fig, out_dir, stem, pass_name, rows, meta)


def plot_speedup(out_dir, rows, meta) -> List[str]:
    paths = []
    for pass_name, fig, panels in _panels(rows):
        for ax, B, C, grp in panels:
            for m, style, pts in _series(grp, _has_speedup):
                ax.plot([r["L"] for r in pts], [r["speedup_vs_reference"] for r in pts],
                        marker="o", ms=4, label=_label(grp, m), **style)
                for r in pts:  # the value itself: a narrow range leaves the log axis one tick
                    ax.annotate(f"{r['speedup_vs_reference']:.2f}x", (r["L"], r["speedup_vs_reference"]),
                                textcoords="offset points", xytext=(4, 3), fontsize=7,
                                color=style.get("color"))
            ax.axhline(1.0, color="k", lw=1, ls="--")
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
            _finish_axes(ax, B, C, "speedup over reference (x, higher is better)")
        paths.append(_save(fig, meta, "Speedup over the torch.fft reference", out_dir, "speedup", pass_name,
                           [r for _, _, _, grp in panels for r in grp]))
    return paths


def _finite_error(row) -> float:
    """rel_err of an ok row, NaN when there is none to draw."""
    err = row.get("rel_err") if row and row.get("status") == "ok" else None
    return err if isinstance(err, (int, float)) and math.isfinite(err) else float("nan")


def plot_error(out_dir, rows, meta) -> List[str]:
    paths = []
    by_pass: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_pass[r["pass"]].append(r)
    for pass_name, grp in by_pass.items():
        methods = _method_order([r for r in grp if not _repeat(r)])
        shapes = _unique_in_order(r["shape"] for r in grp)
        fig, ax = plt.subplots(figsize=(min(14.0, max(7.0, 1.2 * len(methods) + 2)), 5))
        width = 0.8 / max(1, len(shapes))
        smallest_bar = 1e-17
        for j, shape in enumerate(shapes):
            errs = [_finite_error(next((r for r in grp if r["method"] == m and r["shape"] == shape
                                        and not _repeat(r)), None)) for m in methods]
            xs = [i + (j - (len(shapes) - 1) / 2) * width for i in range(len(methods))]
            ax.bar(xs, [max(e, smallest_bar) if e == e else 0 for e in errs], width, label=shape)
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels([_label(grp, m) for m in methods], rotation=25, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.axhline(1e-2, color="r", ls="--", lw=1, label="1e-2 (allclose tolerance scale)")
        ax.set_ylabel("relative L2 error of y vs float64 torch.fft")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, title="shape (BxCxL)", title_fontsize=7)
        ax.set_title(_title(meta, "Error per method / precision", pass_name), fontsize=10)
        paths.append(_write_png(fig, out_dir, "error", pass_name, grp, meta))
    return paths


def make_plots(out_dir: str, rows: Sequence[Dict[str, Any]], meta: Dict[str, Any]) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    rows = list(rows)
    if not rows:
        return []
    return plot_time_vs_L(out_dir, rows, meta) + plot_speedup(out_dir, rows, meta) + \
        plot_error(out_dir, rows, meta)


def plot_method_bars(path: str, panels: Sequence[tuple], methods: Sequence[str], meta: Dict[str, Any],
                     title: str) -> Dict[str, Dict[tuple, float]]:
    """One figure of grouped bars, a panel per (heading, rows): along x each shape of the panel's
    rows (by L, then B·C), a bar per method of `methods` that has an ok row there (its b2b median,
    ms, written on it; a NOISY one hatched), on a log axis. Returns what it drew, {panel heading:
    {(shape, method): ms}}, so that a caller (and a test) can hold the bars to the rows."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.8), squeeze=False)
    drawn: Dict[str, Dict[tuple, float]] = {}
    all_rows = [r for _, rows in panels for r in rows]
    for ax, (heading, rows) in zip(axes[0], panels):
        ok = {(r["shape"], r["method"]): r for r in rows if _ok(r)}
        order = {r["shape"]: (r["L"], r["B"] * r["C"]) for r in rows}
        shapes = sorted(order, key=order.get)
        present = [m for m in methods if any(method == m for _, method in ok)]
        width = 0.8 / max(1, len(present))
        drawn[heading] = {}
        for j, method in enumerate(present):
            xs, heights, noisy = [], [], []
            for i, shape in enumerate(shapes):
                row = ok.get((shape, method))
                if row is None:
                    continue
                xs.append(i + (j - (len(present) - 1) / 2) * width)
                heights.append(row["median_ms"])
                noisy.append(_noisy(row))
                drawn[heading][(shape, method)] = row["median_ms"]
            color = f"C{methods.index(method) % 10}"   # a method's colour the same in every panel
            bars = ax.bar(xs, heights, width, color=color, label=method)
            for bar, value, is_noisy in zip(bars, heights, noisy):
                if is_noisy:
                    bar.set_hatch("//")
                    bar.set_facecolor("white")
                    bar.set_edgecolor(color)
                ax.annotate(f"{value:.3g}", (bar.get_x() + bar.get_width() / 2, value), ha="center",
                            va="bottom", fontsize=6, rotation=90, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([s.replace("x", "×") for s in shapes], fontsize=8)
        ax.set_yscale("log")
        ax.margins(y=0.25)
        ax.set_xlabel("B×C×L")
        ax.set_ylabel("median time per call, b2b [ms] (lower is better)")
        ax.set_title(heading, fontsize=10)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(_title(meta, title, "fwd and fwd+bwd"), fontsize=10)
    noisy = _unique_in_order(r["method"] for r in all_rows if r["method"] in methods and _ok(r) and _noisy(r))
    if noisy:
        fig.text(0.01, 0.005, _noisy_note(meta, noisy, "hatched, untrusted"), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.035 if noisy else 0, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn

"""PNG plots of a run's rows (matplotlib, Agg backend): time vs L, speedup over the reference,
error per method and precision."""
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
        where = "CPU FIGURES, NOT GPU (portable path vs torch.fft on the host)"
    return f"{what} [{pass_name}]\n{where}"


def _ok(r: Dict[str, Any]) -> bool:
    return r.get("status") == "ok" and r.get("median_ms") is not None


def _groups(rows: Sequence[Dict[str, Any]]):
    """{pass: {(B, C): [rows]}}"""
    g: Dict[str, Dict[tuple, List[Dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        g[r["pass"]][(r["B"], r["C"])].append(r)
    return g


def _method_order(rows):
    seen = []
    for r in rows:
        if r["method"] not in seen:
            seen.append(r["method"])
    return seen


def _label(rows, method):
    backends = sorted({str(r.get("backend")) for r in rows if r["method"] == method
                       and r.get("backend") and r.get("status") == "ok"})
    return f"{method} ({', '.join(backends)})" if backends else method


def _subplots(n):
    fig, axes = plt.subplots(1, n, figsize=(max(7.0, 6.5 * n), 5.2), squeeze=False)
    return fig, axes[0]


def plot_time_vs_L(out_dir, rows, meta) -> List[str]:
    paths = []
    for pass_name, by_bc in _groups(rows).items():
        fig, axes = _subplots(len(by_bc))
        for ax, ((B, C), grp) in zip(axes, sorted(by_bc.items())):
            for m in _method_order(grp):
                pts = sorted((r for r in grp if r["method"] == m and _ok(r)), key=lambda r: r["L"])
                if not pts:
                    continue
                xs = [r["L"] for r in pts]
                ys = [r["median_ms"] for r in pts]
                lo = [max(0.0, r["median_ms"] - r["q1_ms"]) for r in pts]
                hi = [max(0.0, r["q3_ms"] - r["median_ms"]) for r in pts]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", ms=4, capsize=2, label=_label(grp, m))
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
        paths.append(_save(fig, meta, "Time vs sequence length", out_dir, "time_vs_L", pass_name))
    return paths


def _finish_axes(ax, B: int, C: int, ylabel: str) -> None:
    """The shared dressing of the per-(B, C) panels of the plots over L."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length L")
    ax.set_ylabel(ylabel)
    ax.set_title(f"B={B}, C={C}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _save(fig, meta, title: str, out_dir: str, stem: str, pass_name: str) -> str:
    fig.suptitle(_title(meta, title, pass_name), fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, f"{stem}_{pass_name.replace('+', '_')}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speedup(out_dir, rows, meta) -> List[str]:
    paths = []
    for pass_name, by_bc in _groups(rows).items():
        fig, axes = _subplots(len(by_bc))
        for ax, ((B, C), grp) in zip(axes, sorted(by_bc.items())):
            for m in _method_order(grp):
                # Only valid timings carry a speedup (INVALID / error rows have None).
                pts = sorted((r for r in grp if r["method"] == m
                              and r.get("speedup_vs_reference") is not None), key=lambda r: r["L"])
                if pts:
                    ax.plot([r["L"] for r in pts], [r["speedup_vs_reference"] for r in pts],
                            marker="o", ms=4, label=_label(grp, m))
            ax.axhline(1.0, color="k", lw=1, ls="--")
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
            _finish_axes(ax, B, C, "speedup over reference (x, higher is better)")
        paths.append(_save(fig, meta, "Speedup over the torch.fft reference", out_dir, "speedup", pass_name))
    return paths


def plot_error(out_dir, rows, meta) -> List[str]:
    paths = []
    by_pass: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_pass[r["pass"]].append(r)
    for pass_name, grp in by_pass.items():
        methods = _method_order(grp)
        shapes = []
        for r in grp:
            if r["shape"] not in shapes:
                shapes.append(r["shape"])
        fig, ax = plt.subplots(figsize=(min(14.0, max(7.0, 1.2 * len(methods) + 2)), 5))
        width = 0.8 / max(1, len(shapes))
        floor_val = 1e-17
        for j, s in enumerate(shapes):
            vals = []
            for m in methods:
                r = next((r for r in grp if r["method"] == m and r["shape"] == s), None)
                e = r.get("rel_err") if r and r.get("status") == "ok" else None
                vals.append(e if isinstance(e, (int, float)) and math.isfinite(e) else float("nan"))
            xs = [i + (j - (len(shapes) - 1) / 2) * width for i in range(len(methods))]
            ax.bar(xs, [max(v, floor_val) if v == v else 0 for v in vals], width, label=s)
        ax.set_xticks(range(len(methods)))
        ax.set_xticklabels([_label(grp, m) for m in methods], rotation=25, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.axhline(1e-2, color="r", ls="--", lw=1, label="1e-2 (allclose tolerance scale)")
        ax.set_ylabel("relative L2 error of y vs float64 torch.fft")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=7, title="shape (BxCxL)", title_fontsize=7)
        ax.set_title(_title(meta, "Error per method / precision", pass_name), fontsize=10)
        fig.tight_layout()
        p = os.path.join(out_dir, f"error_{pass_name.replace('+', '_')}.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def make_plots(out_dir: str, rows: Sequence[Dict[str, Any]], meta: Dict[str, Any]) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    rows = list(rows)
    if not rows:
        return []
    return plot_time_vs_L(out_dir, rows, meta) + plot_speedup(out_dir, rows, meta) + \
        plot_error(out_dir, rows, meta)

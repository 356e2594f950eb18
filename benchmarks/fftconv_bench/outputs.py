"""What the run leaves behind: environment metadata (with a digest of the sources measured),
results.json (meta + rows), results.csv (one line per shape x method), and the PNG plots.

While the run goes on, RowLog appends each finished row to results.jsonl (one JSON object per
line, flushed at once) and rewrites results.csv, so that an interrupted run leaves every row it
finished; results.json, written at the end, is the complete record."""
from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Sequence

import torch

from fftconv_bench import REPO_ROOT
from fftconv_bench.timing import cache_bytes

CPU_NOTE = ("CPU FIGURES, NOT GPU ONES: no CUDA device was used, so this run times "
            "monarch_fftconv's CPU path (the backend column says which) against torch.fft on the "
            "host (time.perf_counter medians). These numbers say nothing about GPU performance.")

CSV_FIELDS = ["shape", "B", "C", "L", "pass", "io_dtype", "operator", "device", "method", "family", "entry", "train_step",
              "backend", "kernel", "same_computation_as", "requested_precision", "precision",
              "status", "warmup_calls", "warmup_s", "warmup_settled", "first_call_s",
              "median_ms", "q1_ms", "q3_ms", "iqr_ms", "min_ms", "max_ms",
              "latency_median_ms", "latency_q1_ms", "latency_q3_ms", "latency_iqr_ms",
              "latency_min_ms", "latency_max_ms", "reps", "n_buffers", "l2_flush",
              "cache_resident_inputs", "floor_ms", "spread", "other_cores", "validity",
              "noisy_because", "speedup_vs_reference",
              "latency_speedup_vs_reference", "min_bytes", "gbps", "flops", "tflops",
              "rel_err", "max_abs_err", "allclose", "error_budget", "within_error_budget",
              "grad_u_rel_err", "grad_u_allclose", "grad_k_rel_err", "grad_k_allclose",
              "grad_D_rel_err", "grad_D_allclose", "grad_pregate_rel_err", "grad_pregate_allclose",
              "grad_postgate_rel_err", "grad_postgate_allclose",
              "peak_extra_mb", "kernel_launches", "memops",
              "energy_mj", "fft_size", "factors", "reason", "error"]


def source_digest(repo: Path = REPO_ROOT) -> str:
    """sha256 (12 hex digits) of the package and kernel sources this run imports and builds.
    Ties results to code even where the checkout's git metadata is stale or absent (a copied
    working tree on a device machine reports its copy's HEAD, not the code it carries)."""
    digest = hashlib.sha256()
    # csrc/ is a tree (common/, fp32/, fourstep/, tc/): every file at any depth, named by its
    # path from csrc/ (a move changes the digest too)
    for sub, files in (("monarch_fftconv", "*.py"), ("monarch_fftconv/csrc", "**/*")):
        base = Path(repo) / sub
        for path in sorted(base.glob(files)):
            if path.is_file():
                digest.update(path.relative_to(base).as_posix().encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _git_commit() -> Any:
    """HEAD's short hash, with "+changes" where tracked files differ from it: a copied tree (the
    GPU machine's) can carry an older .git than its files (session 23's tables read "git 3a7bc7e"
    for 0bc4308's sources); the sources digest says which files ran."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        if not head:
            return None
        return f"{head}+changes" if git("status", "--porcelain", "--untracked-files=no") else head
    except Exception:  # noqa: BLE001
        return None


def _gpu_environment() -> Dict[str, Any]:
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    return dict(gpu_name=torch.cuda.get_device_name(idx),
                gpu_memory_gib=round(props.total_memory / 2**30, 1),
                gpu_sm_count=props.multi_processor_count,
                gpu_capability=f"{props.major}.{props.minor}",
                l2_cache_bytes=cache_bytes("cuda"),
                cuda_matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                timer="cuda-events (one pair per rep)")


def cpu_name() -> str:
    """The host CPU's model (Linux: /proc/cpuinfo), else what platform can tell."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str) -> Dict[str, Any]:
    """Software, machine and source versions of this run (a CUDA version only when the run
    used CUDA: a CUDA build of torch on a CPU run says nothing about the figures)."""
    env = {"device": device, "torch_version": torch.__version__,
           "cuda_version": torch.version.cuda if device == "cuda" else None,
           "python": platform.python_version(),
           "platform": platform.platform(), "hostname": platform.node(),
           "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if device == "cuda":
        env.update(_gpu_environment())
    else:
        env.update(gpu_name=None, cpu=cpu_name(),
                   threads=torch.get_num_threads(), cores=len(os.sched_getaffinity(0)),
                   timer="time.perf_counter", note=CPU_NOTE)
    env["git_commit"] = _git_commit()
    env["source_digest"] = source_digest()
    return env


def json_safe(x: Any) -> Any:
    """Plain JSON: non-finite floats as None / 'inf' / '-inf', tensors as numbers, else str."""
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    return str(x)


def write_csv(path: str, rows: Sequence[Dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


class RowLog:
    """Partial results: each finished row appended to results.jsonl, results.csv rewritten."""

    def __init__(self, out_dir: str):
        os.makedirs(out_dir, exist_ok=True)
        self.jsonl_path = os.path.join(out_dir, "results.jsonl")
        self.csv_path = os.path.join(out_dir, "results.csv")
        self.rows: List[Dict[str, Any]] = []
        open(self.jsonl_path, "w").close()   # a fresh log: no rows of an earlier run

    def add(self, row: Dict[str, Any]) -> None:
        self.rows.append(row)
        with open(self.jsonl_path, "a") as f:
            f.write(json.dumps(json_safe(row), allow_nan=False) + "\n")
        write_csv(self.csv_path, self.rows)


def write_outputs(out_dir: str, meta: Dict[str, Any],
                  rows: Sequence[Dict[str, Any]]) -> Dict[str, str]:
    """results.json (meta + rows) and results.csv (one row per method x shape x pass)."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "results.json")
    csv_path = os.path.join(out_dir, "results.csv")
    with open(json_path, "w") as f:
        json.dump(json_safe({**meta, "results": list(rows)}), f, indent=2, allow_nan=False)
    write_csv(csv_path, rows)
    return {"json": json_path, "csv": csv_path}


def plot(out_dir: str, rows: Sequence[Dict[str, Any]], meta: Dict[str, Any]) -> List[str]:
    """PNG plots: time vs L (log), speedup over the reference, error per precision."""
    from fftconv_bench import plots   # matplotlib: imported only when plotting
    return plots.make_plots(out_dir, rows, meta)

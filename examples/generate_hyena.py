"""Generate token by token from a small Hyena language model, three ways, and time each token.

The model (random weights: the timing and the agreement of the methods do not depend on
training): token embedding, blocks of [LayerNorm -> `HyenaOperator` -> residual], a final
LayerNorm and a linear head. Greedy decoding from a random prompt, by

- `prefill/step`: this package's `HyenaOperator.prefill` / `step` (docs/design.md,
  "Generation: prefill and step"): exact, amortised O(log² L) work per token per channel;
- `recompute`: the model's forward over the whole prefix for every token (FFT convolutions of
  the prefix, O(t log t) per token);
- `naive`: a per-token step like the package's, its long convolutions a dot product of the
  filter with the whole history of their inputs (O(t) per token), as standard inference does.

`prefill/step` picks the tokens; the other two are fed the same tokens (teacher forcing: the
same work per token) and their logits compared with its. Each token is timed on its own
(synchronised on a GPU); printed: median and p99 per-token latency, the total and tokens/s.

`--layer` times the `FFTConv` layer alone, (B, C, L) random inputs, from an empty prompt:
`prefill/step` against the naive dot product over the history and the full `fftconv` of
the prefix per token. `--baseline-stride k` times those two at every k-th position only
(their tokens are independent given the inputs); their total is then the mean over the
timed positions times the number of tokens, and the table says so; each baseline runs once
untimed first, so that a one-off cost (a BLAS handle, an FFT plan) is not counted once per
stride. In layer mode the naive
and prefill/step loops also run once more with every token's call enqueued back to back and
one synchronisation at the end ("streamed total"): a serving loop's own time (each y_t kept,
not stacked: since session 25 the stack for the comparison is outside the time), where the
per-token total above adds a synchronisation (and the GPU's idle launch latency) per token.
The streamed outputs must equal the per-token run's bit for bit. `--plot PNG` draws each
method's per-token time against the position: naive's grows with t, prefill/step's stays flat
but for the fold levels' spikes.

    python examples/generate_hyena.py                              # CPU, seconds
    python examples/generate_hyena.py --device cuda --width 256 --seq-len 8192
    python examples/generate_hyena.py --layer --channels 256 --seq-len 4096
    python examples/generate_hyena.py --layer --seq-len 4096 --baseline-stride 16 --plot tokens.png

Python's cyclic garbage collector is paused for the run (`gc.collect`, `gc.freeze`, `gc.disable`;
`--python-gc` leaves it on): with every token's output held, a full collection (generation 2,
every tracked object scanned) lands inside one step now and then, and at L = 65536 it took 117 ms
on the H100's host and 160 ms on a CPU run (session 35), one token's max 7,000x its median. That
is the interpreter's pause, not the step's; a serving loop that wants flat latency pauses it
the same way (or calls `gc.freeze()` after its prefill).

On Linux, long CPU runs of the baselines grow the process's memory (8 GB at L = 4096): the
prefix of a new length every token allocates temporaries of a new size, and glibc's heap keeps
the freed pieces. No tensor leaks; `MALLOC_MMAP_THRESHOLD_=65536` in the environment keeps it
at a few hundred MB (docs/performance.md's runs set it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor, nn

try:
    import monarch_fftconv as mf
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import monarch_fftconv as mf
from monarch_fftconv import generation  # noqa: E402
from monarch_fftconv.nn import HyenaOperator  # noqa: E402

METHODS = ("naive", "recompute", "prefill/step")
T = TypeVar("T")


# ---------------------------------------------------------------- the model

class HyenaLM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, seq_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.mixers = nn.ModuleList(HyenaOperator(width, seq_len, filter_order=32) for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, L) -> logits (B, L, vocab)."""
        x = self.embed(tokens)
        for norm, mixer in zip(self.norms, self.mixers):
            x = x + mixer(norm(x))
        return self.head(self.final_norm(x))

    def prefill(self, tokens: Tensor, max_len: int, cuda_graph: bool = False) -> tuple[Tensor, list]:
        """The prompt's logits (B, P, vocab), and one generation state per block."""
        x, states = self.embed(tokens), []
        for norm, mixer in zip(self.norms, self.mixers):
            y, state = mixer.prefill(norm(x), max_len, cuda_graph=cuda_graph)
            x = x + y
            states.append(state)
        return self.head(self.final_norm(x)), states

    def step(self, token: Tensor, states: list, mix: Callable | None = None) -> Tensor:
        """token (B,) -> logits (B, vocab) at the next position; `mix(mixer, x_t, state)` the
        Hyena step (default: the package's)."""
        x = self.embed(token)
        for norm, mixer, state in zip(self.norms, self.mixers, states):
            x = x + (mix or _package_step)(mixer, norm(x), state)
        return self.head(self.final_norm(x))


def _package_step(mixer: HyenaOperator, x_t: Tensor, state) -> Tensor:
    return mixer.step(x_t, state)[0]


# ---------------------------------------------------------------- the naive step

class NaiveHyenaCache:
    """A HyenaOperator's caches for the naive step: the projected inputs (for the short
    filter) and each long convolution's inputs, whole histories, with the filters reversed so
    that the output at t is one dot product with the history."""

    def __init__(self, op: HyenaOperator, batch: int, max_len: int, like: Tensor):
        width, taps = op.short_filter.weight.shape[0], op.short_filter.weight.shape[-1]
        self.projected = like.new_zeros(batch, width, max_len + taps - 1)  # taps - 1 zeros before position 0
        self.inputs = like.new_zeros(op.order - 1, batch, op.d_model, max_len)
        k, bias = op.long_filters(max_len)  # (order-1, G, L)
        per_channel = k.repeat_interleave(op.d_model // op.filter_groups, dim=1)
        self.reversed_filters = per_channel.flip(-1).to(like.dtype)  # [..., L-1-j] = k[j]
        self.skips = bias
        self.position, self.max_len = 0, max_len


def history_dot(history: Tensor, reversed_filter: Tensor) -> Tensor:
    """(B, C, t) · (C, t) over t -> (B, C): one batched BLAS call per token (a product tensor
    of the history's size per token would cost more than the dot product itself)."""
    return torch.bmm(history.transpose(0, 1), reversed_filter.unsqueeze(-1)).squeeze(-1).T


def naive_step(op: HyenaOperator, x_t: Tensor, cache: NaiveHyenaCache) -> Tensor:
    t, taps = cache.position, op.short_filter.weight.shape[-1]
    cache.projected[..., t + taps - 1] = op.in_proj(x_t)
    projected = (cache.projected[..., t: t + taps] * op.short_filter.weight[:, 0]).sum(-1) + op.short_filter.bias
    *gates, v = projected.split(op.d_model, dim=1)
    for o, gate in enumerate(reversed(gates[1:])):
        u = v * gate
        cache.inputs[o, ..., t] = u
        v = history_dot(cache.inputs[o, ..., : t + 1], cache.reversed_filters[o, :, cache.max_len - 1 - t:])
        if cache.skips is not None:
            v = v + cache.skips[o] * u
    cache.position += 1
    return op.out_proj(v * gates[0])


# ---------------------------------------------------------------- timing

@contextlib.contextmanager
def python_gc_paused(paused: bool):
    """Python's cyclic collector off for the block (the objects alive at its start frozen out of
    later collections), so that no full collection lands inside a timed step; as it was after."""
    if not paused:
        yield
        return
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


# UNTIMED_FIRST: the baselines timed at every k-th position (--baseline-stride) run there once
# untimed before they are timed, so each timing is that position's steady per-token cost. A
# one-off cost paid at a timed position (a kernel loaded on its first use, an FFT plan, a BLAS
# heuristic for a new shape) would count k times in the estimated total: on an H100 (session 34,
# B=1, C=256, L=8192, k=64) the naive method's first six timed positions took up to 23 ms against
# 0.04 ms after them, and its estimated total came to 5.0 s against 0.26 s for the same calls
# streamed after them.
def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def summary(latencies: list[float], tokens: int) -> dict:
    """Per-token median and p99 (ms), and the total: measured, or the timed mean times the
    tokens when only some positions were timed."""
    ordered = sorted(latencies)
    total = sum(latencies) if len(latencies) == tokens else statistics.fmean(latencies) * tokens
    return {"timed": len(latencies), "tokens": tokens, "median_ms": 1e3 * ordered[len(ordered) // 2],
            "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "max_ms": 1e3 * ordered[-1], "total_s": total, "tokens_per_s": tokens / total}


def generate_lm(config: dict) -> dict:
    device = torch.device(config["device"])
    torch.manual_seed(config["seed"])
    model = HyenaLM(config["vocab"], config["width"], config["layers"], config["seq_len"]).to(device).eval()
    batch, prompt_len, max_len = config["batch"], config["prompt"], config["seq_len"]
    tokens = torch.randint(config["vocab"], (batch, max_len), device=device)
    logits, latencies = {}, {}
    with torch.inference_mode():
        _, states = model.prefill(tokens[:, :prompt_len], max_len, config["cuda_graph"])
        steps, times = [], []
        for t in range(prompt_len, max_len):
            out, seconds = timed(lambda: model.step(tokens[:, t], states), device)
            if t + 1 < max_len:
                tokens[:, t + 1] = out.argmax(-1)  # greedy: the next input is this output's token
            steps.append(out)
            times.append(seconds)
        logits["prefill/step"], latencies["prefill/step"] = torch.stack(steps, 1), times
        state_bytes = sum(s.nbytes for s in states)

        caches = [NaiveHyenaCache(op, batch, max_len, tokens.new_zeros((), dtype=torch.float32)) for op in model.mixers]
        # One untimed call of each baseline first (a throwaway cache for the naive step): their
        # one-off costs (BLAS handles, FFT plans) are not the per-token cost being estimated.
        scratch = [NaiveHyenaCache(op, batch, max_len, tokens.new_zeros((), dtype=torch.float32)) for op in model.mixers]
        model.step(tokens[:, 0], scratch, naive_step)
        model(tokens[:, :1])
        del scratch
        steps, times = [], []
        for t in range(max_len):
            out, seconds = timed(lambda: model.step(tokens[:, t], caches, naive_step), device)
            if t >= prompt_len:  # the prompt goes through the same steps, untimed
                steps.append(out)
                times.append(seconds)
        logits["naive"], latencies["naive"] = torch.stack(steps, 1), times

        positions = range(prompt_len, max_len, config["baseline_stride"])
        for t in positions:  # untimed first (UNTIMED_FIRST)
            model(tokens[:, : t + 1])
        steps, times = [], []
        for t in positions:
            out, seconds = timed(lambda: model(tokens[:, : t + 1])[:, -1].clone(), device)  # not a view: frees the rest
            steps.append(out)
            times.append(seconds)
        logits["recompute"], latencies["recompute"] = torch.stack(steps, 1), times
    generated = range(prompt_len, max_len)  # the positions each method timed: naive's prompt is untimed
    timed_at = {"prefill/step": generated, "naive": generated, "recompute": positions}
    reference = logits["prefill/step"]
    strided = reference[:, :: config["baseline_stride"]]
    scale = reference.abs().max().item()
    results = {}
    for method in METHODS:
        compared = strided if method == "recompute" else reference
        results[method] = summary(latencies[method], max_len - prompt_len)
        results[method]["max_logit_diff"] = (logits[method] - compared).abs().max().item() / scale
        results[method]["per_token"] = (list(timed_at[method]), latencies[method])
    return {"config": config, "methods": results, "state_bytes": state_bytes}


def generate_layer(config: dict) -> dict:
    """The FFTConv layer alone: (B, C, L) random inputs, every position generated."""
    device = torch.device(config["device"])
    torch.manual_seed(config["seed"])
    batch, channels, max_len, prompt_len = config["batch"], config["channels"], config["seq_len"], config["prompt"]
    layer = mf.FFTConv(channels, max_len, device=device)
    x = torch.randn(batch, channels, max_len, device=device)
    outputs, latencies = {}, {}
    with torch.inference_mode():
        filt = layer.filter
        reversed_filter = filt.flip(-1)
        _, state = layer.prefill(x[..., :prompt_len], max_len, cuda_graph=config["cuda_graph"])
        steps = []
        for t in range(prompt_len, max_len):
            steps.append(timed(lambda: layer.step(x[..., t], state)[0], device))
        outputs["prefill/step"] = torch.stack([s for s, _ in steps], -1)
        latencies["prefill/step"] = [seconds for _, seconds in steps]
        positions = list(range(prompt_len, max_len, config["baseline_stride"]))
        # Each baseline at every timed position once, untimed, first (UNTIMED_FIRST).
        # prefill/step pays its own one-off costs once, in its measured total.
        for t in positions:
            history_dot(x[..., : t + 1], reversed_filter[:, max_len - 1 - t:])
            mf.fftconv(x[..., : t + 1], filt[:, : t + 1])
        naive = [timed(lambda: history_dot(x[..., : t + 1], reversed_filter[:, max_len - 1 - t:]), device)
                 for t in positions]
        recompute = [timed(lambda: mf.fftconv(x[..., : t + 1], filt[:, : t + 1])[..., -1].clone(), device)
                     for t in positions]  # clone: a view would keep every prefix's output alive
        for name, runs in (("naive", naive), ("recompute", recompute)):
            outputs[name] = torch.stack([s for s, _ in runs], -1)
            latencies[name] = [seconds for _, seconds in runs]
        # The same loops back to back, one synchronisation (a fresh state: the first run moved it).
        # The first state goes first: two at once would double the peak (tens of GB at L = 65536).
        del steps, state
        _, state = layer.prefill(x[..., :prompt_len], max_len, cuda_graph=config["cuda_graph"])
        # Each loop keeps its y_t as a serving loop would; stacking them for the comparison is
        # not generation and is left out of the time (at L = 65536, one torch.stack of 65,536
        # (B, C) tensors: 4 GiB and a host pass over every input).
        streamed_steps, streamed_step_s = timed(
            lambda: [layer.step(x[..., t], state)[0] for t in range(prompt_len, max_len)], device)
        streamed_naive, streamed_naive_s = timed(
            lambda: [history_dot(x[..., : t + 1], reversed_filter[:, max_len - 1 - t:]) for t in positions], device)
        streamed_steps, streamed_naive = torch.stack(streamed_steps, -1), torch.stack(streamed_naive, -1)
    reference = outputs["prefill/step"]
    strided = reference[..., :: config["baseline_stride"]]
    results = {}
    for method in METHODS:
        compared = reference if method == "prefill/step" else strided
        results[method] = summary(latencies[method], max_len - prompt_len)
        results[method]["max_rel_diff"] = ((outputs[method] - compared).norm() / compared.norm()).item()
        timed_at = range(prompt_len, max_len) if method == "prefill/step" else positions
        results[method]["per_token"] = (list(timed_at), latencies[method])
    tokens = max_len - prompt_len
    results["prefill/step"]["by_level"] = by_level(latencies["prefill/step"], tokens)
    results["prefill/step"]["streamed_total_s"] = streamed_step_s
    results["naive"]["streamed_total_s"] = streamed_naive_s * tokens / len(positions)
    results["prefill/step"]["streamed_equal"] = torch.equal(streamed_steps, reference)
    results["naive"]["streamed_equal"] = torch.equal(streamed_naive, outputs["naive"])
    return {"config": config, "methods": results, "state_bytes": state.nbytes}


def by_level(seconds: list[float], tokens: int) -> dict[str, list[float]]:
    """Each fold level's (token count, median ms) over the generated tokens: which level a slow
    percentile comes from (level q folds after one token in 2^(q+1); "last" folds nothing)."""
    grouped: dict[str, list[float]] = {}
    for i, s in enumerate(seconds):
        q = generation._fold_level(i, tokens)
        grouped.setdefault("last" if q is None else f"q{q}", []).append(s)
    return {name: [len(v), statistics.median(v) * 1e3] for name, v in grouped.items()}


def plot_per_token(results: dict, title: str, path: str) -> bool:
    """Each method's per-token latency against the token's position (ms, log axis): every timed
    token a dot, its running median a line; False (and a note) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no per-token plot", file=sys.stderr)
        return False
    figure, axes = plt.subplots(figsize=(8, 4.8))
    for i, (method, r) in enumerate(results["methods"].items()):
        positions, seconds = r["per_token"]
        ms = [1e3 * s for s in seconds]
        window = max(1, len(ms) // 64)   # the running median over ~1/64 of the timed tokens
        running = [statistics.median(ms[max(0, j - window): j + window + 1]) for j in range(len(ms))]
        axes.scatter(positions, ms, s=2, alpha=0.25, color=f"C{i}")
        axes.plot(positions, running, color=f"C{i}", lw=1.5,
                  label=f"{method}: median {r['median_ms']:.3g} ms, p99 {r['p99_ms']:.3g} ms")
    axes.set_yscale("log")
    axes.set_xlabel("token position t")
    axes.set_ylabel("time to generate token t [ms] (log)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def table(results: dict) -> str:
    config, stride = results["config"], results["config"]["baseline_stride"]
    diff = "max_rel_diff" if config["layer"] else "max_logit_diff"
    lines = ["| method | tokens (timed) | median ms | p99 ms | max ms | total s | tokens/s | streamed total s | "
             "diff vs prefill/step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, r in results["methods"].items():
        estimated = " (est.)" if r["timed"] < r["tokens"] else ""
        streamed = "—"
        if "streamed_total_s" in r:
            streamed = f"{r['streamed_total_s']:.3f}{estimated}" + ("" if r["streamed_equal"] else " (OUTPUTS DIFFER)")
        lines.append(f"| {method} | {r['tokens']} ({r['timed']}) | {r['median_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{r['max_ms']:.3f} | {r['total_s']:.3f}{estimated} | {r['tokens_per_s']:.1f} | {streamed} | "
                     f"{r[diff]:.1e} |")
    levels = results["methods"].get("prefill/step", {}).get("by_level")
    if levels:
        lines.append("prefill/step median ms by fold level (tokens): " + ", ".join(
            f"{name} {ms:.3f} ({count})" for name, (count, ms) in levels.items()))
    note = f"state: {results['state_bytes'] / 2**20:.2f} MiB"
    if stride > 1:
        note += f"; naive and recompute timed at every {stride}th position, totals (est.) = mean × tokens"
    return "\n".join(lines + [note])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--layer", action="store_true", help="time the FFTConv layer alone")
    p.add_argument("--seq-len", type=int, default=256, help="max_len: positions in all")
    p.add_argument("--prompt", type=int, default=None, help="prompt length (default 16; 0 with --layer)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--width", type=int, default=32, help="the LM's width")
    p.add_argument("--layers", type=int, default=2, help="the LM's Hyena blocks")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--channels", type=int, default=256, help="C, with --layer")
    p.add_argument("--baseline-stride", type=int, default=1, help="time naive/recompute at every k-th position")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads for the run (one: per-token work is small, and more threads only "
                        "add synchronisation, ruinous on a shared host)")
    p.add_argument("--python-gc", action="store_true",
                   help="leave Python's cyclic garbage collector on during the run (default: paused, so that a "
                        "full collection does not land inside a timed token)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw each method's per-token latency against the position (needs matplotlib)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="prefill/step with each long convolution's steps as CUDA graphs (prefill(cuda_graph=True))")
    p.add_argument("--fused-step", action=argparse.BooleanOptionalAction, default=None,
                   help="with --cuda-graph: each graph's per-token part as one kernel, or (--no-fused-step) as "
                        "PyTorch ops (default: generation.FUSED_STEP, on)")
    p.add_argument("--mid-levels-in-kernel", action=argparse.BooleanOptionalAction, default=None,
                   help="with --cuda-graph: the middle fold levels (n = 16 .. 256) as one direct-product kernel, "
                        "or as two FFTs and PyTorch ops (default: generation.MID_LEVELS_IN_KERNEL, on)")
    p.add_argument("--direct-step", action=argparse.BooleanOptionalAction, default=None,
                   help="with --cuda-graph: the tokens whose fold the step kernel does alone as one direct launch "
                        "of it, or as a copy and a graph replay (default: generation.DIRECT_STEP, on)")
    p.add_argument("--direct-stepper", action=argparse.BooleanOptionalAction, default=None,
                   help="with --cuda-graph: an FFTConv's direct steps through the extension's C++ stepper, or "
                        "(--no-direct-stepper) through the Python step and the conv_step_at op (default: "
                        "generation.DIRECT_STEPPER)")
    args = p.parse_args(argv)
    if args.prompt is None:
        args.prompt = 0 if args.layer else 16
    if not 0 <= args.prompt < args.seq_len or args.baseline_stride < 1:
        p.error("need 0 <= --prompt < --seq-len and --baseline-stride >= 1")
    if args.cuda_graph and not args.device.startswith("cuda"):
        p.error("--cuda-graph needs --device cuda")
    if args.fused_step is not None and not args.cuda_graph:
        p.error("--fused-step needs --cuda-graph")
    if args.mid_levels_in_kernel is not None and not args.cuda_graph:
        p.error("--mid-levels-in-kernel needs --cuda-graph")
    if args.direct_step is not None and not args.cuda_graph:
        p.error("--direct-step needs --cuda-graph")
    if args.direct_stepper is not None and not args.cuda_graph:
        p.error("--direct-stepper needs --cuda-graph")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    config = vars(args)
    threads = torch.get_num_threads()
    switches = {"FUSED_STEP": args.fused_step, "MID_LEVELS_IN_KERNEL": args.mid_levels_in_kernel,
                "DIRECT_STEP": args.direct_step,
                "DIRECT_STEPPER": args.direct_stepper}  # generation's switches; None: as they are
    saved = {name: getattr(generation, name) for name in switches}
    chosen = {name: saved[name] if value is None else value for name, value in switches.items()}
    torch.set_num_threads(args.threads)
    for name, value in chosen.items():
        setattr(generation, name, value)
    try:
        with python_gc_paused(not args.python_gc):
            results = generate_layer(config) if args.layer else generate_lm(config)
    finally:
        torch.set_num_threads(threads)
        for name, value in saved.items():
            setattr(generation, name, value)
    what = (f"FFTConv B={args.batch} C={args.channels}" if args.layer
            else f"Hyena LM width={args.width} layers={args.layers} B={args.batch}")
    parts = [what for what, on in (("per-token part fused", chosen["FUSED_STEP"]),
                                   ("middle levels in a kernel", chosen["MID_LEVELS_IN_KERNEL"]),
                                   ("direct steps", chosen["DIRECT_STEP"]),
                                   ("the C++ stepper", chosen["DIRECT_STEP"] and chosen["DIRECT_STEPPER"])) if on]
    graphs = (", steps as CUDA graphs" + (f" ({', '.join(parts)})" if parts else "")) if args.cuda_graph else ""
    heading = (f"{what}, L={args.seq_len}, prompt {args.prompt}, {args.device}{graphs}, {args.threads} CPU thread(s), "
               f"Python's GC {'on' if args.python_gc else 'paused'}")
    print(heading)
    print(table(results))
    if args.plot:
        device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
        if plot_per_token(results, f"{heading}\n{device}; per-token time, each token synchronised", args.plot):
            print(f"per-token plot: {args.plot}")
    return results


if __name__ == "__main__":
    main()

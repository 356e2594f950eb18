"""Train a small Hyena-style model on associative recall, once per long-convolution
implementation, and compare the runs.

The model: token embedding, then blocks of [LayerNorm -> Hyena operator -> residual,
LayerNorm -> MLP -> residual], then a linear head read at the last position. The Hyena
operator is the package's `monarch_fftconv.nn.HyenaOperator` (safari's operator, order 2):
it projects to three streams, runs a short depthwise causal conv (kernel 3) over them,
gates the third by the second, convolves it with an implicit long filter (a small MLP with
sine activations over positional features, times an exponential decay window, recomputed
every step) plus a skip D, and gates the result by the first. Only that long convolution
differs between runs:

- `torch.fft`: irfft(rfft(x, n=2L) * rfft(h, n=2L), n=2L)[..., :L] + D*x, with the gates
  around it, in plain torch (`TorchFFTHyenaOperator` below);
- `fp32`, `tf32`, `bf16`, `fp16`: `monarch_fftconv.fftconv(v, h, D=D, pregate=, postgate=,
  precision=...)`, the operator's own call.

The task: each sequence holds `--pairs` (key, value) token pairs at its start, blank
filler, and at its last position one of the keys again; the model must predict that key's
value, which lies about L tokens back. Every run starts from the same initialisation
and sees the same batches (both derive from `--seed`). Recall of 8 pairs is slow to learn:
the loss falls from log(32) to log(16) (the answer is a value), towards log(8) (which
values occur), then below as recall sets in; `--pairs 2` learns sooner.

On a GPU (defaults: L=4096, 2000 steps, batch 32):
    python examples/train_hyena.py --seq-len 4096 --steps 2000
On a CPU, a tiny configuration (seconds; one pair, so that it learns in 150 steps):
    python examples/train_hyena.py --device cpu --seq-len 64 --steps 150 --batch 16 \\
        --width 32 --layers 2 --pairs 1 --lr 3e-3 --impls torch.fft,fp32
(On a CPU the package runs every precision through torch.fft, so all curves coincide;
the summary's backend column, from `monarch_fftconv.explain`, says which path each took.)

Outputs in `--out`: `results.json` (configuration, per-step loss and accuracy curves,
final held-out loss and accuracy, seconds per step, the backend each run took) and
`loss.png` (the loss curves of all runs). A summary table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:
    import monarch_fftconv as mf
except ImportError:  # run from a checkout that is not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import monarch_fftconv as mf
from monarch_fftconv.nn import HyenaOperator  # noqa: E402

TORCH_FFT = "torch.fft"
IMPLS = (TORCH_FFT, *mf.PRECISIONS)
BLANK = 0  # the filler token; keys and values take the rest of the vocabulary
GPU_DEFAULTS = {"seq_len": 4096, "steps": 2000, "batch": 32}
CPU_DEFAULTS = {"seq_len": 256, "steps": 300, "batch": 16}
# The implicit filter of safari's associative-recall runs (positional features of 5 dims, sine
# frequency 10, an MLP of width 64), with one inner layer instead of two and slower decay windows
# (at t = L the slowest channel keeps 63%, the fastest 1%, not 5% and 2e-7): the answer lies L
# tokens back, and with safari's filter the tiny CPU run did not learn it in 150 steps.
FILTER_ARGS = {"filter_order": 64, "emb_dim": 5, "w": 10.0, "num_inner_mlps": 1,
               "fast_decay_pct": 1.0, "slow_decay_pct": 10.0}


# ---------------------------------------------------------------- the model

class TorchFFTHyenaOperator(HyenaOperator):
    """The same operator, its long convolution in plain torch.fft: the baseline runs."""

    def long_conv(self, v: Tensor, k: Tensor, D: Tensor | None, pregate: Tensor, postgate: Tensor | None) -> Tensor:
        x = v * pregate
        length = x.shape[-1]
        spectrum = torch.fft.rfft(x, n=2 * length) * torch.fft.rfft(k, n=2 * length)
        y = torch.fft.irfft(spectrum, n=2 * length)[..., :length]
        if D is not None:
            y = y + D.unsqueeze(-1) * x
        return y if postgate is None else y * postgate


def hyena_operator(impl: str, width: int, seq_len: int) -> HyenaOperator:
    """Order 2, a filter per channel; `impl` picks the long convolution (the same parameters)."""
    if impl == TORCH_FFT:
        return TorchFFTHyenaOperator(width, seq_len, **FILTER_ARGS)
    return HyenaOperator(width, seq_len, precision=impl, **FILTER_ARGS)


class HyenaBlock(nn.Module):
    def __init__(self, width: int, seq_len: int, impl: str):
        super().__init__()
        self.mixer_norm, self.mlp_norm = nn.LayerNorm(width), nn.LayerNorm(width)
        self.mixer = hyena_operator(impl, width, seq_len)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class HyenaModel(nn.Module):
    """tokens (B, L) -> logits (B, vocab) at the last position."""

    def __init__(self, vocab: int, width: int, layers: int, seq_len: int, impl: str):
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(HyenaBlock(width, seq_len, impl) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, -1]))


# ---------------------------------------------------------------- the task

def recall_batch(config: dict, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(tokens (B, L), targets (B,)): per row, `pairs` pairs of a distinct key and a random
    value, blank filler, and one of the keys at the last position; the target is its value.
    Keys are 1..num_keys, values the tokens above them."""
    batch, seq_len, pairs, vocab = config["batch"], config["seq_len"], config["pairs"], config["vocab"]
    device, num_keys = config["device"], (config["vocab"] - 1) // 2
    draws = torch.rand(batch, num_keys, generator=generator, device=device)
    keys = draws.argsort(dim=-1)[:, :pairs] + 1
    values = torch.randint(num_keys + 1, vocab, (batch, pairs), generator=generator, device=device)
    asked = torch.randint(0, pairs, (batch, 1), generator=generator, device=device)
    tokens = torch.full((batch, seq_len), BLANK, dtype=torch.long, device=device)
    tokens[:, 0:2 * pairs:2], tokens[:, 1:2 * pairs:2] = keys, values
    tokens[:, -1] = keys.gather(1, asked).squeeze(1)
    return tokens, values.gather(1, asked).squeeze(1)


def seeded_generator(device: str, seed: int) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


# ---------------------------------------------------------------- training

class Progress:
    """A tqdm bar when tqdm is importable, else a counter printed to stderr: every step up to
    20 steps, every total/20 beyond."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done = total, label, 0
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=label, file=sys.stderr)
        except ImportError:
            self.bar = None
        self.every = max(1, total // 20)

    def update(self, **figures: str) -> None:
        """One step done; `figures` (name: formatted value, e.g. loss="2.310") beside the count."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(figures, refresh=False)
        elif self.done % self.every == 0 or self.done == self.total:
            shown = "".join(f" {name} {value}" for name, value in figures.items())
            print(f"{self.label}: step {self.done}/{self.total}{shown}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: Tensor,
               targets: Tensor) -> tuple[Tensor, Tensor]:
    logits = model(tokens)
    loss = F.cross_entropy(logits, targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.detach(), (logits.argmax(-1) == targets).float().mean()


@torch.no_grad()
def evaluate(model: nn.Module, config: dict) -> tuple[float, float]:
    """Mean loss and accuracy over `eval_batches` held-out batches (their own seed)."""
    generator = seeded_generator(config["device"], config["seed"] + 1)
    losses, accuracies = [], []
    for _ in range(config["eval_batches"]):
        tokens, targets = recall_batch(config, generator)
        logits = model(tokens)
        losses.append(F.cross_entropy(logits, targets).item())
        accuracies.append((logits.argmax(-1) == targets).float().mean().item())
    return statistics.fmean(losses), statistics.fmean(accuracies)


def build_model(config: dict, impl: str) -> HyenaModel:
    """The same initialisation for every impl: the operators differ only in how they convolve."""
    torch.manual_seed(config["seed"])
    model = HyenaModel(config["vocab"], config["width"], config["layers"], config["seq_len"], impl)
    return model.to(config["device"])


def backend_of(impl: str, config: dict) -> str:
    """Which backend the package takes for this run's long convolutions (mf.explain)."""
    if impl == TORCH_FFT:
        return TORCH_FFT
    u = torch.empty(1, config["width"], config["seq_len"], device=config["device"])
    return mf.explain(u, u[0], D=u[0, :, 0], pregate=u, postgate=u, precision=impl)["backend"]


def train(impl: str, config: dict) -> dict:
    """Train one impl from the seed; returns its curves, final metrics and timing."""
    model = build_model(config, impl)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.0)
    generator = seeded_generator(config["device"], config["seed"])
    losses, accuracies, step_seconds = [], [], []
    progress = Progress(config["steps"], impl)
    for _ in range(config["steps"]):
        tokens, targets = recall_batch(config, generator)
        start = time.perf_counter()
        loss, accuracy = train_step(model, optimizer, tokens, targets)
        synchronize(config["device"])
        step_seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
        accuracies.append(accuracy.item())
        progress.update(loss=f"{losses[-1]:.4f}", acc=f"{accuracies[-1]:.3f}")
    progress.close()
    final_loss, final_accuracy = evaluate(model, config)
    return {"loss": losses, "accuracy": accuracies, "final_loss": final_loss,
            "final_accuracy": final_accuracy, "seconds_per_step": statistics.median(step_seconds),
            "backend": backend_of(impl, config)}


# ---------------------------------------------------------------- outputs

def plot_losses(runs: dict, path: str) -> bool:
    """All runs' loss curves in one PNG; False (and a note) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no loss plot", file=sys.stderr)
        return False
    figure, axes = plt.subplots(figsize=(8, 5))
    for impl, run in runs.items():
        axes.plot(range(1, len(run["loss"]) + 1), run["loss"], label=impl, linewidth=1, alpha=0.8)
    axes.set(xlabel="step", ylabel="training loss (cross-entropy)",
             title="Hyena on associative recall: loss per long-conv implementation")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def summary_table(runs: dict) -> str:
    lines = [f"{'impl':<10} {'backend':<17} {'final loss':>10} {'final acc':>9} {'ms/step (median)':>16}"]
    for impl, run in runs.items():
        lines.append(f"{impl:<10} {run['backend']:<17} {run['final_loss']:>10.4f} "
                     f"{run['final_accuracy']:>9.3f} {1e3 * run['seconds_per_step']:>16.2f}")
    return "\n".join(lines)


def write_outputs(results: dict, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    results["json"] = os.path.join(out_dir, "results.json")
    results["png"] = os.path.join(out_dir, "loss.png")
    if not plot_losses(results["runs"], results["png"]):
        results["png"] = None
    with open(results["json"], "w") as f:
        json.dump(results, f, indent=1)


# ---------------------------------------------------------------- command line

def impl_list(text: str) -> list[str]:
    impls = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in impls if name not in IMPLS]
    if unknown or not impls:
        raise argparse.ArgumentTypeError(f"unknown impl(s) {unknown}; choose from {', '.join(IMPLS)}")
    return list(dict.fromkeys(impls))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--seq-len", type=int, help=f"L (default {GPU_DEFAULTS['seq_len']} on GPU, "
                   f"{CPU_DEFAULTS['seq_len']} on CPU)")
    p.add_argument("--steps", type=int, help="training steps per impl (default 2000 GPU, 300 CPU)")
    p.add_argument("--batch", type=int, help="sequences per step (default 32 GPU, 16 CPU)")
    p.add_argument("--width", type=int, default=64, help="model width, channels (default %(default)s)")
    p.add_argument("--layers", type=int, default=2, help="Hyena blocks (default %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="initialisation and data (default %(default)s)")
    p.add_argument("--impls", type=impl_list, default=impl_list("torch.fft,fp32,bf16"),
                   help=f"comma-separated runs, from: {', '.join(IMPLS)} (default torch.fft,fp32,bf16)")
    p.add_argument("--pairs", type=int, default=8, help="key-value pairs per sequence (default %(default)s)")
    p.add_argument("--vocab", type=int, default=32, help="vocabulary: blank, keys, values (default %(default)s)")
    p.add_argument("--eval-batches", type=int, default=4, help="held-out batches for the final numbers (default %(default)s)")
    p.add_argument("--out", default="train_hyena_out", help="directory for results.json and loss.png (default %(default)s)")
    return p.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> dict:
    """The run's settings: the device resolved, size defaults filled in for it, checked."""
    config = vars(args).copy()
    if config["device"] == "auto":
        config["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    defaults = GPU_DEFAULTS if config["device"].startswith("cuda") else CPU_DEFAULTS
    for name, value in defaults.items():
        if config[name] is None:
            config[name] = value
    for name in ("seq_len", "steps", "batch", "width", "layers", "eval_batches"):
        if config[name] < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    num_keys = (config["vocab"] - 1) // 2
    if not 1 <= config["pairs"] <= num_keys:
        raise SystemExit(f"--pairs must be 1..{num_keys} (distinct keys) with --vocab {config['vocab']}")
    if config["seq_len"] < 2 * config["pairs"] + 1:
        raise SystemExit(f"--seq-len must hold the pairs and the query: at least {2 * config['pairs'] + 1}")
    return config


def main(argv: Sequence[str] | None = None) -> dict:
    """Run every impl; returns {"config": ..., "runs": {impl: run}, "json": path, "png": path}."""
    config = resolve_config(parse_args(argv))
    runs = {impl: train(impl, config) for impl in config["impls"]}
    results = {"config": config, "runs": runs}
    write_outputs(results, config["out"])
    print(summary_table(runs))
    print(f"wrote {results['json']}" + (f" and {results['png']}" if results["png"] else ""))
    return results


if __name__ == "__main__":
    main()

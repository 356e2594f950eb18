"""Train the Hyena-style model of train_hyena.py on several GPUs through PyTorch's own
distributed engine, in two layouts, and check each against one process on the same batch.

--mode ddp       DistributedDataParallel: every rank holds the whole model and B/world of the
                 global batch; DDP averages the gradients (NCCL all-reduce) in the backward.
--mode channels  channel sharding (tensor parallel): every rank holds width/world channels of
                 each Hyena operator (its rows of in_proj and the short filter and its columns
                 of out_proj; the implicit filter and the skip term D, replicated, sliced to
                 its channels) and sees the whole batch. The
                 long convolution is independent per channel, so nothing is communicated
                 inside it; around the operator, the two collectives of a tensor-parallel
                 layer: identity forward / all-reduce backward at its input (and at the
                 implicit filter's output and D, replicated), all-reduce forward / identity
                 backward at its output.

Launch (NCCL on GPUs; `--device cpu` runs gloo on CPUs):
    torchrun --nproc_per_node=2 examples/train_ddp.py --mode ddp --check
    torchrun --nproc_per_node=2 examples/train_ddp.py --mode channels --check
    torchrun --nproc_per_node=1 examples/train_ddp.py --mode ddp      # the 1-GPU step time
The default sizes depend on the device: L=4096, batch 32, width 256 on GPUs; L=1024, batch 8,
width 64 on CPUs, where the larger ones took ~20 s a step (a run takes ~12 s there).

--check: after the first backward, rank 0 compares every gradient with one process running the
whole model on the whole global batch from the same initialisation (each sharded gradient
with its slice of the full one) and prints the largest relative difference; the run fails
above --tolerance. The two differ only in the order of fp32 sums (SUMMATION_ORDER), so the
difference grows with the sums: on 2 gloo ranks 1.9e-6 (ddp) and 5.1e-7 (channels) at the CPU
defaults, 8.6e-6 for ddp at the GPU sizes. Then --steps AdamW steps are timed (median, after --warmup), rank 0
reporting each step; no gradient clipping (a clipped tensor-parallel step would need the global
norm across ranks).
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1), as the
GPU machines of this project require.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_hyena  # noqa: E402  (the model, the task, the long convolutions; puts the package on the path)
from monarch_fftconv.nn import HyenaOperator  # noqa: E402
from train_hyena import Progress, build_model, recall_batch, seeded_generator  # noqa: E402

MODES = ("ddp", "channels")
GPU_DEFAULTS = {"seq_len": 4096, "batch": 32, "width": 256, "steps": 20, "warmup": 3}
CPU_DEFAULTS = {"seq_len": 1024, "batch": 8, "width": 64, "steps": 10, "warmup": 2}
# Why a layout's gradients differ from one process's at all: the same fp32 terms, summed in
# another order (float32's epsilon is 1.2e-7; the difference grows with the terms of each sum).
SUMMATION_ORDER = {
    "ddp": "each rank sums over its part of the batch, the all-reduce adds the parts",
    "channels": "each rank sums over its channels (out_proj, the filter's input), the all-reduce "
                "adds the ranks' sums",
}


# ---------------------------------------------------------------- the collectives of a sharded layer

class _CopyToShards(torch.autograd.Function):
    """Identity forward; backward, the sum of every rank's gradient (each rank's shards saw
    only their own channels' share of it)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class _SumShards(torch.autograd.Function):
    """The sum of every rank's partial output; backward, identity (the loss is the same on
    every rank)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


class ShardedHyenaOperator(nn.Module):
    """This rank's channels of a HyenaOperator (order 2, a filter per channel), copied from the
    full one (same numbers)."""

    def __init__(self, full: HyenaOperator, rank: int, world: int):
        super().__init__()
        width = full.d_model
        if full.order != 2 or full.filter_groups != width or full.bidirectional:
            raise ValueError("channel sharding covers order-2 operators with a causal filter per channel")
        if width % world:
            raise ValueError(f"width {width} does not split over {world} ranks")
        local = width // world
        self.channels = slice(rank * local, (rank + 1) * local)
        # the three streams' rows of this rank's channels, in in_proj and the short filter
        self.register_buffer("rows", torch.cat([torch.arange(width)[self.channels] + i * width for i in range(3)]),
                             persistent=False)
        self.in_proj = nn.Linear(width, 3 * local)
        self.short_filter = nn.Conv1d(3 * local, 3 * local, kernel_size=3, groups=3 * local, padding=2)
        self.filter_fn = full.filter_fn  # replicated: a small MLP and the skip term; their outputs are sliced
        self.out_proj_weight = nn.Parameter(full.out_proj.weight.detach()[:, self.channels].clone())
        self.out_proj_bias = nn.Parameter(full.out_proj.bias.detach().clone())  # added once, after the sum
        # the full operator's filters (from filter_fn, the module registered above) and its one
        # step of convolution (fftconv, or the torch.fft baseline)
        self.long_filters, self.long_conv = full.long_filters, full.long_conv
        with torch.no_grad():
            for mine, theirs in ((self.in_proj, full.in_proj), (self.short_filter, full.short_filter)):
                mine.weight.copy_(theirs.weight[self.rows.to(theirs.weight.device)])
                mine.bias.copy_(theirs.bias[self.rows.to(theirs.bias.device)])

    def forward(self, x: Tensor) -> Tensor:  # x: (B, L, width), the same on every rank
        length = x.shape[1]
        x = _CopyToShards.apply(x)
        projected = self.short_filter(self.in_proj(x).transpose(1, 2))[..., :length]
        postgate, pregate, value = projected.chunk(3, dim=1)
        filters, skip = self.long_filters(length)  # (1, width, L) and (1, width): order 2
        filters, skip = (_CopyToShards.apply(t[0])[self.channels] for t in (filters, skip))
        mixed = self.long_conv(value, filters, skip, pregate, postgate)  # this rank's channels only
        partial = F.linear(mixed.transpose(1, 2), self.out_proj_weight)
        return _SumShards.apply(partial) + self.out_proj_bias

    def full_slices(self) -> dict[str, tuple[str, int, Tensor | slice | None]]:
        """Local parameter name -> (the full operator's name, dim, index along it; None: all)."""
        rows = self.rows.cpu()
        slices = {"in_proj.weight": ("in_proj.weight", 0, rows), "in_proj.bias": ("in_proj.bias", 0, rows),
                  "short_filter.weight": ("short_filter.weight", 0, rows),
                  "short_filter.bias": ("short_filter.bias", 0, rows),
                  "out_proj_weight": ("out_proj.weight", 1, self.channels), "out_proj_bias": ("out_proj.bias", 0, None)}
        slices.update({f"filter_fn.{name}": (f"filter_fn.{name}", 0, None)
                       for name, _ in self.filter_fn.named_parameters()})
        return slices


def shard_channels(model: nn.Module, rank: int, world: int) -> nn.Module:
    """Every Hyena operator replaced by this rank's channels of it; the rest replicated."""
    for block in model.blocks:
        block.mixer = ShardedHyenaOperator(block.mixer, rank, world)
    return model


def expected_gradient(name: str, full_grads: dict[str, Tensor], model: nn.Module) -> Tensor:
    """The single-process gradient that the sharded parameter `name` must hold."""
    parts = name.split(".")
    if len(parts) > 3 and parts[0] == "blocks" and parts[2] == "mixer":
        mixer = model.blocks[int(parts[1])].mixer
        if isinstance(mixer, ShardedHyenaOperator):
            source, dim, index = mixer.full_slices()[".".join(parts[3:])]
            grad = full_grads[f"blocks.{parts[1]}.mixer.{source}"]
            if index is None:
                return grad
            return grad[index] if dim == 0 else grad[:, index]
    return full_grads[name]


# ---------------------------------------------------------------- one rank's run

def setup(device: str, backend: str | None = None, init_method: str | None = None,
          rank: int | None = None, world: int | None = None) -> tuple[int, int, str]:
    """The process group (NCCL on GPUs, gloo on CPUs) and this rank's device."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    explicit = {} if rank is None else {"init_method": init_method, "rank": rank, "world_size": world}
    dist.init_process_group(backend, **explicit)  # torchrun's environment, unless given
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return rank, world, device


def global_batch(config: dict) -> tuple[Tensor, Tensor]:
    return recall_batch(config, seeded_generator(config["device"], config["seed"]))


def build(config: dict, mode: str, rank: int, world: int) -> nn.Module:
    model = build_model(config, config["impl"])  # the same initialisation on every rank
    if mode == "channels":
        return shard_channels(model, rank, world)
    device_ids = [torch.device(config["device"]).index] if config["device"].startswith("cuda") else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def local_batch(config: dict, mode: str, rank: int, world: int) -> tuple[Tensor, Tensor]:
    tokens, targets = global_batch(config)
    if mode == "channels":
        return tokens, targets
    if config["batch"] % world:
        raise ValueError(f"the global batch {config['batch']} does not split over {world} ranks")
    shard = slice(rank * config["batch"] // world, (rank + 1) * config["batch"] // world)
    return tokens[shard], targets[shard]


def check_gradients(config: dict, mode: str, model: nn.Module, rank: int, world: int) -> float:
    """The largest relative difference (L2 per tensor) between this run's gradients after one
    backward and one process's on the global batch; computed on rank 0, sent to every rank."""
    if rank == 0:
        print(f"{mode}: checking the first backward's gradients against one process on the global batch",
              file=sys.stderr, flush=True)
    tokens, targets = local_batch(config, mode, rank, world)
    F.cross_entropy(model(tokens), targets).backward()
    worst = torch.zeros((), dtype=torch.float64, device=config["device"])
    if rank == 0:
        reference = build_model(config, config["impl"])
        all_tokens, all_targets = global_batch(config)
        F.cross_entropy(reference(all_tokens), all_targets).backward()
        full_grads = {name: p.grad for name, p in reference.named_parameters()}
        plain = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        for name, p in plain.named_parameters():
            want = expected_gradient(name, full_grads, plain)
            error = (p.grad.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)
            worst = torch.maximum(worst, error)
    dist.broadcast(worst, src=0)
    return worst.item()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def time_steps(config: dict, mode: str, model: nn.Module, rank: int, world: int) -> float:
    """Median seconds per AdamW step (forward, backward with its collectives, update); rank 0
    reports each step as it ends."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    tokens, targets = local_batch(config, mode, rank, world)
    total = config["warmup"] + config["steps"]
    label = f"{mode} ({config['warmup']} warm-up + {config['steps']} timed)"
    progress = Progress(total, label) if rank == 0 else None
    seconds = []
    for step in range(total):
        synchronize(config["device"])
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens), targets)
        loss.backward()
        optimizer.step()
        synchronize(config["device"])
        elapsed = time.perf_counter() - start
        if step >= config["warmup"]:
            seconds.append(elapsed)
        if progress is not None:
            progress.update(ms=f"{elapsed * 1e3:.1f}", loss=f"{loss.item():.4f}")
    if progress is not None:
        progress.close()
    return statistics.median(seconds) if seconds else float("nan")


def run(config: dict, mode: str, rank: int, world: int) -> dict:
    """One rank's work: build, optionally check, time. Returns rank 0's figures."""
    model = build(config, mode, rank, world)
    result = {"mode": mode, "world": world, "device": config["device"], "impl": config["impl"]}
    if config["check"]:
        result["max_rel_grad_diff"] = check_gradients(config, mode, model, rank, world)
        model = build(config, mode, rank, world)  # fresh gradients for the timing
    result["seconds_per_step"] = time_steps(config, mode, model, rank, world)
    return result


# ---------------------------------------------------------------- command line

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="ddp")
    p.add_argument("--device", default="auto", help="auto: cuda if available (NCCL), else cpu (gloo)")
    p.add_argument("--impl", default="fp32", choices=train_hyena.IMPLS, help="the long convolution (default fp32)")
    p.add_argument("--seq-len", type=int,
                   help=f"L (default {GPU_DEFAULTS['seq_len']} on GPU, {CPU_DEFAULTS['seq_len']} on CPU)")
    p.add_argument("--batch", type=int,
                   help=f"the global batch (default {GPU_DEFAULTS['batch']} on GPU, {CPU_DEFAULTS['batch']} on CPU)")
    p.add_argument("--width", type=int, help=f"channels; a multiple of the world size (default {GPU_DEFAULTS['width']} "
                   f"on GPU, {CPU_DEFAULTS['width']} on CPU)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, help=f"timed steps (default {GPU_DEFAULTS['steps']} on GPU, "
                   f"{CPU_DEFAULTS['steps']} on CPU)")
    p.add_argument("--warmup", type=int, help=f"untimed steps first (default {GPU_DEFAULTS['warmup']} on GPU, "
                   f"{CPU_DEFAULTS['warmup']} on CPU)")
    p.add_argument("--check", action="store_true", help="compare the first step's gradients with one process")
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="largest relative gradient difference --check accepts (default %(default)s)")
    return p.parse_args(argv)


def configure(args: argparse.Namespace, device: str) -> dict:
    """The run's settings on `device` (resolved: "cpu", "cuda:<i>"), the sizes it was not given
    filled in for it."""
    defaults = GPU_DEFAULTS if device.startswith("cuda") else CPU_DEFAULTS
    config = vars(args) | {"device": device}
    return config | {name: value for name, value in defaults.items() if config[name] is None}


def check_line(mode: str, difference: float, tolerance: float) -> str:
    """The check's verdict in words: the difference, the tolerance, and why there is one."""
    return (f"gradients vs one process: max rel diff {difference:.2e}, tolerance {tolerance:.0e} "
            f"(fp32 sums in another order: {SUMMATION_ORDER[mode]})")


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    rank, world, device = setup(args.device)
    config = configure(args, device)
    try:
        result = run(config, args.mode, rank, world)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        sizes = f"L={config['seq_len']}, batch {config['batch']}, width {config['width']}"
        line = (f"{args.mode} on {world} rank(s), {device}, {args.impl}, {sizes}: "
                f"{result['seconds_per_step'] * 1e3:.2f} ms/step")
        if args.check:
            line += "; " + check_line(args.mode, result["max_rel_grad_diff"], args.tolerance)
        print(line)
    if args.check and result["max_rel_grad_diff"] > args.tolerance:
        raise SystemExit("FAILED: " + check_line(args.mode, result["max_rel_grad_diff"], args.tolerance))
    return result


if __name__ == "__main__":
    main()

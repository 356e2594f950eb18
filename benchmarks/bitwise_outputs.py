#!/usr/bin/env python
"""Fixed-seed outputs of the public calls a kernel change may touch, saved in one build and
compared bit for bit in another (two builds of the extension cannot share a process):

    python benchmarks/bitwise_outputs.py --save /tmp/before.pt      # main's build
    python benchmarks/bitwise_outputs.py --compare /tmp/before.pt   # the branch's build

The calls: the forward with fp32 and bf16 I/O at L = 1000, 2048, 4096, 8191, 8192 (B·C = 15 or
4096, with D), bf16/fp16 at L = 8191 and 8192 (the engine at 8192), the fp32 training step's
du and dk, and the gated call (both gates and D) at L = 8191 and 8192, forward and training step.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the checkout's package, where none is installed

import monarch_fftconv as mf


def outputs() -> dict[str, torch.Tensor]:
    out = {}
    for io in (torch.float32, torch.bfloat16):
        for length in (2048, 4096, 8192, 1000, 8191):
            g = torch.Generator(device="cuda").manual_seed(length)
            b, c = (16, 256) if length % 2 == 0 else (3, 5)
            u = torch.randn(b, c, length, device="cuda", generator=g).to(io)
            k = (torch.randn(c, length, device="cuda", generator=g) / length**0.5).to(io)
            d = torch.randn(c, device="cuda", generator=g)
            out[f"forward {io} {b}x{c}x{length}"] = mf.fftconv(u, k, D=d)
            if io == torch.float32 and length in (8192, 8191):
                for precision in ("bf16", "fp16"):
                    out[f"{precision} {b}x{c}x{length}"] = mf.fftconv(u, k, D=d, precision=precision)
            if io == torch.float32:
                u.requires_grad_(True)
                k.requires_grad_(True)
                y = mf.fftconv(u, k, D=d)
                du, dk = torch.autograd.grad(y, (u, k), torch.randn(y.shape, device="cuda", generator=g))
                out[f"du {b}x{c}x{length}"], out[f"dk {b}x{c}x{length}"] = du, dk
            if io == torch.float32 and length in (8192, 8191):
                pregate, postgate = (torch.randn(b, c, length, device="cuda", generator=g).requires_grad_(True)
                                     for _ in range(2))
                y = mf.fftconv(u, k, D=d, pregate=pregate, postgate=postgate)
                out[f"gated {b}x{c}x{length}"] = y.detach()
                grads = torch.autograd.grad(y, (u, k, pregate, postgate),
                                            torch.randn(y.shape, device="cuda", generator=g))
                for name, grad in zip(("du", "dk", "dpregate", "dpostgate"), grads):
                    out[f"gated {name} {b}x{c}x{length}"] = grad
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", metavar="FILE")
    group.add_argument("--compare", metavar="FILE")
    args = p.parse_args()
    got = outputs()
    if args.save:
        torch.save(got, args.save)
        print(f"saved {len(got)} outputs to {args.save}")
        return
    want = torch.load(args.compare)
    differ = [name for name in want if name not in got or not torch.equal(want[name], got[name])]
    print(f"bit for bit against {args.compare}: {len(want) - len(differ)} of {len(want)} the same"
          + (f"; differ: {differ}" if differ else ""))
    raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()

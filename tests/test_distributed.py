"""Data-parallel training through PyTorch's own engine: 2 gloo ranks on CPU wrap a model
holding FFTConv in DistributedDataParallel; their gradients match one process on the global
batch. (Channels are independent, so a channel-sharded layout needs no communication inside
the op: docs/design.md.)"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import monarch_fftconv as mf

CHANNELS, LENGTH, GLOBAL_BATCH = 4, 300, 6


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights in every process
    return torch.nn.Sequential(mf.FFTConv(CHANNELS, LENGTH), torch.nn.GELU(), torch.nn.Conv1d(CHANNELS, CHANNELS, 1))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(GLOBAL_BATCH, CHANNELS, LENGTH, generator=g), torch.randn(GLOBAL_BATCH, CHANNELS, LENGTH, generator=g)


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _rank(rank: int, world: int, rendezvous: str, out: str) -> None:
    # A file rendezvous: no TCP port to pick (and lose to another process) between the ranks.
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        model = torch.nn.parallel.DistributedDataParallel(_model())
        x, target = _data()
        shard = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
        torch.nn.functional.mse_loss(model(x[shard]), target[shard]).backward()  # DDP averages
        if rank == 0:
            torch.save(_grads(model.module), out)
        dist.barrier()  # both ranks done before either tears gloo down
    finally:
        dist.destroy_process_group()
    # Skip interpreter teardown: now and then a worker thread left at exit aborts the spawned
    # process ("terminate called without an active exception") after the work is done.
    os._exit(0)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")
def test_ddp_gradients_match_one_process(tmp_path):
    out = str(tmp_path / "grads.pt")
    mp.spawn(_rank, args=(2, str(tmp_path / "rendezvous"), out), nprocs=2, join=True)
    model = _model()
    x, target = _data()
    torch.nn.functional.mse_loss(model(x), target).backward()
    for got, want in zip(torch.load(out), _grads(model)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- examples/train_ddp.py on 2 gloo ranks
_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
_TINY = {"impl": "fp32", "seq_len": 64, "batch": 4, "width": 8, "layers": 2, "pairs": 2, "vocab": 16, "lr": 1e-3,
         "seed": 0, "steps": 1, "warmup": 0, "check": True}


def _example_rank(rank: int, world: int, rendezvous: str, out: str, mode: str) -> None:
    import json
    import sys

    sys.path.insert(0, _EXAMPLES)
    import train_ddp

    rank, world, device = train_ddp.setup("cpu", "gloo", f"file://{rendezvous}", rank, world)
    try:
        result = train_ddp.run(_TINY | {"device": device}, mode, rank, world)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")
@pytest.mark.parametrize("mode", ["ddp", "channels"])
def test_train_ddp_example_matches_one_process(mode, tmp_path, monkeypatch):
    """The example's two layouts, DDP over the batch and channels sharded with the
    tensor-parallel collectives around each Hyena operator, give one process's gradients on
    the global batch (the package's ops run: the portable engine, as torch.fft would make
    the package's part trivial on CPU)."""
    import json

    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", "portable")
    out = str(tmp_path / "result.json")
    mp.spawn(_example_rank, args=(2, str(tmp_path / "rendezvous"), out, mode), nprocs=2, join=True)
    with open(out) as f:
        result = json.load(f)
    assert result["world"] == 2 and result["mode"] == mode
    assert result["max_rel_grad_diff"] < 1e-5
    assert result["seconds_per_step"] > 0

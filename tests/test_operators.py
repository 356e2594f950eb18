"""fftconv's operator options: the gates, the skip term D on the gated input, grouped and
bidirectional filters, against a float64 reference built from helpers.reference; their
gradients; explain()'s account of them; FFTConv's groups and bidirectional filters."""

import itertools

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import backends, functional
from monarch_fftconv.nn import HyenaOperator
from monarch_fftconv.planner import plan_for, real_fft_flops

from helpers import BUDGETS, GPU_WATCHDOG_S, randn, reference, rel_l2, requires_cuda, two_sided_circle

GATES = ["none", "pre", "post", "both"]


def reference_operator(u, k, D=None, pregate=None, postgate=None, bidirectional=False):
    """postgate ⊙ (conv(x, k) + D ⊙ x), x = pregate ⊙ u, in float64: the filters repeated over
    their groups, the anti-causal half as the causal convolution of the time-reversed x, reversed."""
    x = u.double() if pregate is None else u.double() * pregate.double()
    per_channel = k.double().repeat_interleave(u.shape[-2] // k.shape[0], dim=0)
    if bidirectional:
        y = reference(x, per_channel[:, 0]) + reference(x.flip(-1), per_channel[:, 1]).flip(-1)
    else:
        y = reference(x, per_channel)
    if D is not None:
        y = y + D.double().unsqueeze(-1) * x
    return y if postgate is None else y * postgate.double()


def odd_sizes(gen):
    """An odd L in [33, 301] and a filter length Lk < L."""
    length = 2 * int(torch.randint(16, 151, (), generator=gen)) + 1
    return length, int(torch.randint(1, length, (), generator=gen))


def operator_inputs(gen, batch, channels, groups, length, filter_len, gates, bidirectional, with_D,
                    dtype=torch.float32, gate_dtype=torch.float32):
    u = randn(gen, batch, channels, length, dtype=dtype)
    k = randn(gen, groups, *((2,) if bidirectional else ()), filter_len)
    pregate = randn(gen, batch, channels, length, dtype=gate_dtype) if gates in ("pre", "both") else None
    postgate = randn(gen, batch, channels, length, dtype=gate_dtype) if gates in ("post", "both") else None
    D = randn(gen, channels) if with_D else None
    return u, k, D, pregate, postgate


@pytest.mark.parametrize("engine", ["auto", "portable"])
@pytest.mark.parametrize("gates, group_share, bidirectional, with_D",
                         list(itertools.product(GATES, [1, 3], [False, True], [False, True])))
def test_every_option_matches_the_reference(engine, gates, group_share, bidirectional, with_D, monkeypatch, gen):
    """Every combination of gates, groups (G = C, G = C/3), bidirectional filters and D, odd
    B, C and L, Lk < L: y and the gradients of u, k, D and both gates within the fp32 budget."""
    monkeypatch.setenv(backends.BACKEND_ENV, engine)
    channels = 9 if group_share == 3 else 7
    length, filter_len = odd_sizes(gen)
    inputs = operator_inputs(gen, 3, channels, channels // group_share, length, filter_len, gates, bidirectional,
                             with_D)
    u, k, D, pregate, postgate = (None if t is None else t.requires_grad_() for t in inputs)
    y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate, bidirectional=bidirectional)
    want = reference_operator(u, k, D, pregate, postgate, bidirectional)
    assert y.dtype == u.dtype and y.shape == u.shape
    assert rel_l2(y, want) <= BUDGETS["fp32"]

    leaves = [t for t in (u, k, D, pregate, postgate) if t is not None]
    g = randn(gen, *y.shape)
    got = torch.autograd.grad(y, leaves, g)
    wanted = torch.autograd.grad(want, leaves, g.double())
    for leaf, grad, expected in zip(leaves, got, wanted):
        assert grad.dtype == leaf.dtype and grad.shape == leaf.shape
        assert rel_l2(grad, expected) <= 2 * BUDGETS["fp32"]

    info = mf.explain(u, k, D=D, pregate=pregate, postgate=postgate, bidirectional=bidirectional)
    expected_backend = "torch.fft" if engine == "auto" else "portable"  # bidirectional too: the causal call's
    assert info["backend"] == expected_backend


@pytest.mark.parametrize("u_dtype, gate_dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                                 (torch.bfloat16, torch.float32), (torch.float16, torch.float32)])
@pytest.mark.parametrize("engine", ["auto", "portable"])
def test_gates_in_another_dtype(u_dtype, gate_dtype, engine, monkeypatch, gen):
    """Half-precision gates with fp32 u, and the reverse: the convolution runs on pregate ⊙ u in
    the promoted dtype (fp32, so the fp32 budget), the result is in u's dtype (one rounding to
    it at the end), each gradient in its input's dtype."""
    monkeypatch.setenv(backends.BACKEND_ENV, engine)
    length, filter_len = odd_sizes(gen)
    u, k, D, pregate, postgate = operator_inputs(gen, 3, 6, 2, length, filter_len, "both", False, True,
                                                 dtype=u_dtype, gate_dtype=gate_dtype)
    for t in (u, pregate, postgate):
        t.requires_grad_()
    y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate)
    info = mf.explain(u, k, D=D, pregate=pregate, postgate=postgate)
    assert y.dtype == u_dtype and info["precision"] == "fp32"
    rounding = 0.0 if u_dtype == torch.float32 else 2.0**-8
    assert rel_l2(y, reference_operator(u, k, D, pregate, postgate)) <= BUDGETS["fp32"] + rounding
    y.float().square().sum().backward()
    assert (u.grad.dtype, pregate.grad.dtype, postgate.grad.dtype) == (u_dtype, gate_dtype, gate_dtype)


def test_half_precision_calls_take_their_precision(monkeypatch, gen):
    """bf16 activations with bf16 gates (what autocast gives) take the bf16 path: within its
    budget on the emulating engine, and not within fp32's."""
    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    u, k, D, pregate, postgate = operator_inputs(gen, 2, 6, 6, 1001, 1001, "both", False, True,
                                                 dtype=torch.bfloat16, gate_dtype=torch.bfloat16)
    y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate)
    assert mf.explain(u, k, D=D, pregate=pregate, postgate=postgate)["precision"] == "bf16"
    error = rel_l2(y, reference_operator(u, k, D, pregate, postgate))
    assert BUDGETS["fp32"] < error <= BUDGETS["bf16"] + 2.0**-7


@pytest.mark.parametrize("engine", ["auto", "portable"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_gradcheck(engine, bidirectional, monkeypatch, gen):
    """float64 gradcheck of u, k, D and both gates, grouped filters, Lk < L, odd sizes."""
    monkeypatch.setenv(backends.BACKEND_ENV, engine)
    u, k, D, pregate, postgate = operator_inputs(gen, 1, 6, 2, 13, 9, "both", bidirectional, True,
                                                 dtype=torch.float64, gate_dtype=torch.float64)
    k = k.double()
    D = D.double()
    inputs = tuple(t.requires_grad_() for t in (u, k, D, pregate, postgate))

    def call(u, k, D, pregate, postgate):
        return mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate, bidirectional=bidirectional)

    assert torch.autograd.gradcheck(call, inputs)


@pytest.mark.parametrize("position", ["first", "last"])
@pytest.mark.parametrize("length", [64, 63, 65])
def test_bidirectional_impulses_do_not_wrap_around(position, length, gen):
    """An impulse at either end of the sequence, with filters as long as the sequence: the
    output is the definition's sum, term by term. A circular convolution of fewer than 2L
    points would carry one half's taps round to the other end of the output."""
    k = randn(gen, 3, 2, length)
    u = torch.zeros(1, 3, length)
    at = 0 if position == "first" else length - 1
    u[..., at] = 1.0
    expected = torch.zeros(3, length, dtype=torch.float64)
    for s in range(length):
        if at + s < length:  # causal tap s: y[t] = k[:, 0, s]·u[t - s]
            expected[:, at + s] += k[:, 0, s].double()
        if at - s >= 0:  # anti-causal tap s: y[t] = k[:, 1, s]·u[t + s]
            expected[:, at - s] += k[:, 1, s].double()
    y = mf.fftconv(u, k, bidirectional=True)[0].double()
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


def test_grouped_filter_gradient_is_the_group_sum_and_deterministic(monkeypatch, gen):
    """dk of a shared filter is the sum of what each of its channels would give its own filter
    (fp32, in k's dtype), bitwise the same run to run, on both engines."""
    for engine in ("auto", "portable"):
        monkeypatch.setenv(backends.BACKEND_ENV, engine)
        u, k, D, pregate, _ = operator_inputs(gen, 2, 9, 3, 301, 200, "pre", False, True)
        g = randn(gen, 2, 9, 301)
        shared = k.clone().requires_grad_()
        mf.fftconv(u, shared, D=D, pregate=pregate).backward(g)
        again = k.clone().requires_grad_()
        mf.fftconv(u, again, D=D, pregate=pregate).backward(g)
        own = k.repeat_interleave(3, dim=0).requires_grad_()
        mf.fftconv(u, own, D=D, pregate=pregate).backward(g)
        assert shared.grad.dtype == torch.float32 and torch.equal(shared.grad, again.grad)
        assert rel_l2(shared.grad, own.grad.unflatten(0, (3, 3)).sum(1)) <= BUDGETS["fp32"]


def test_unbatched_and_broadcast_gates(gen):
    """(C, L) and (..., C, L) inputs; gates with leading dims of 1 or none broadcast over u's."""
    u, k, D = randn(gen, 2, 2, 6, 101), randn(gen, 3, 80), randn(gen, 6)
    pregate, postgate = randn(gen, 6, 101), randn(gen, 1, 2, 6, 101)
    y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate)
    assert y.shape == u.shape
    assert rel_l2(y, reference_operator(u, k, D, pregate.expand_as(u), postgate.expand_as(u))) <= BUDGETS["fp32"]
    single = mf.fftconv(u[0, 0], k, pregate=pregate)
    assert rel_l2(single, reference_operator(u[0, 0], k, pregate=pregate)) <= BUDGETS["fp32"]


def test_empty_batch_gives_zero_gradients_to_the_gates(gen):
    u = torch.zeros(0, 6, 50, requires_grad=True)
    k, pregate = randn(gen, 2, 40).requires_grad_(), randn(gen, 1, 6, 50).requires_grad_()
    postgate = torch.zeros(0, 6, 50, requires_grad=True)
    y = mf.fftconv(u, k, pregate=pregate, postgate=postgate)
    assert y.shape == u.shape
    y.sum().backward()
    assert torch.equal(pregate.grad, torch.zeros_like(pregate)) and torch.equal(k.grad, torch.zeros_like(k))


# --------------------------------------------------------------------------- explain()

@pytest.mark.parametrize("engine", ["auto", "portable"])
def test_explain_names_the_terms_groups_and_direction(engine, monkeypatch, gen):
    monkeypatch.setenv(backends.BACKEND_ENV, engine)
    u, k, D, pregate, postgate = operator_inputs(gen, 3, 9, 3, 301, 100, "both", False, True)
    plain = mf.explain(u, k)
    info = mf.explain(u, k, D=D, pregate=pregate, postgate=postgate)
    assert (plain["groups"], plain["group_size"], plain["bidirectional"], plain["terms"]) == (3, 3, False, {})
    assert list(info["terms"]) == ["pregate", "D", "postgate"]  # the order they apply in
    assert "elementwise op" in info["terms"]["pregate"] and "elementwise op" in info["terms"]["postgate"]
    assert "fused" not in info["terms"]["pregate"] + info["terms"]["postgate"]  # no CPU backend fuses gates
    where_D = "inside the convolution op" if engine == "portable" else "after the inverse FFT"
    assert where_D in info["terms"]["D"]
    assert info["flops"] == plain["flops"] + 4 * u.numel()  # a multiply per gate, D's multiply-add
    assert mf.explain(u, k, postgate=postgate)["terms"].keys() == {"postgate"}

    bidirectional = mf.explain(u, randn(gen, 9, 2, 100), bidirectional=True)
    assert bidirectional["backend"] == plain["backend"] and bidirectional["bidirectional"]
    assert (bidirectional["groups"], bidirectional["group_size"]) == (9, 1)
    assert "bidirectional" in bidirectional["reason"]
    if engine == "portable":  # the Monarch ops on the folded spectrum, one more filter FFT per channel
        assert "folded spectrum" in bidirectional["kernel"]
        causal = mf.explain(u, randn(gen, 9, 100))
        assert bidirectional["flops"] - causal["flops"] == plan_for(301).flops_per_sequence() // 2 * 9
    if engine == "auto":  # torch.fft transforms each filter row once: G rows, 2G bidirectional
        one_filter = real_fft_flops(info["fft_size"])
        per_channel = mf.explain(u, k.repeat(3, 1))["flops"]
        assert per_channel - plain["flops"] == 6 * one_filter and bidirectional["flops"] - per_channel == 9 * one_filter


@pytest.mark.parametrize("causal_kind", ["FusedFP32", "FusedTensorCore", "Portable"])
def test_explain_bidirectional_spectrum_launches(causal_kind):
    """On the CUDA radix kernels a bidirectional filter's spectrum is one launch over its
    two-sided circle: the causal call's stages and flops, the spectrum reading both halves. The
    composed spectrum (CPU ops, four-step) adds the anti-causal half's FFT and the fold."""
    causal = getattr(backends, causal_kind)("name", "kernel", "test")
    bidirectional = backends.BidirectionalOps.on(causal)
    plan = plan_for(8192)
    plain, folded = causal.stages(plan, 4, 6, 4), bidirectional.stages(plan, 4, 6, 4)
    if causal_kind == "Portable":
        assert plain is None and folded is None  # the CPU ops list no launches
        assert bidirectional.flops(plan, 4, 6) - causal.flops(plan, 4, 6) == plan.flops_per_sequence() // 2 * 6
        return
    assert folded[0]["stage"] == "two-sided filter spectrum (one kernel)" and folded[1:] == plain[1:]
    assert folded[0]["reads"] == 2 * plain[0]["reads"] and folded[0]["writes"] == plain[0]["writes"]
    assert bidirectional.flops(plan, 4, 6) == causal.flops(plan, 4, 6)


def test_explain_stages_put_the_gates_around_the_kernel(monkeypatch, gen):
    """On a fused backend (the fp32 kernel's stage list, asked for on CPU tensors here) the
    gates are launches of their own, moving the bytes a fused kernel would save; grouped filters
    transform their G rows, and where the kernel does not read them by shift (C/G = 3 here) the
    op repeats the spectrum rows; a gate that widens the dtype adds the cast back to u's."""
    fused = backends.FusedFP32("cuda-fp32", "fused fp32 radix FFT conv", "test")
    monkeypatch.setattr(functional, "select_backend", lambda *args, **kwargs: fused)
    u, k, _, pregate, postgate = operator_inputs(gen, 2, 6, 2, 256, 256, "both", False, False,
                                                 dtype=torch.bfloat16, gate_dtype=torch.bfloat16)
    conv_only = mf.explain(u, k.repeat(3, 1))["stages"]
    assert [s["stage"] for s in conv_only] == [s["stage"] for s in fused.stages(plan_for(256), 2, 6, 2)]
    stages = mf.explain(u, k, pregate=pregate, postgate=postgate)["stages"]
    names = [s["stage"].split(":")[0] for s in stages]
    assert names == ["pregate", conv_only[0]["stage"], "repeat the 2 spectrum rows over their groups (in the op)",
                     *[s["stage"].split(":")[0] for s in conv_only[1:]], "postgate"]  # the call's order
    assert stages[1]["writes"] * 3 == conv_only[0]["writes"] == stages[2]["writes"]  # 2 rows, repeated to 6
    assert stages[2]["reads"] == stages[1]["writes"]
    elements = u.numel()
    assert stages[0]["reads"] == 2 * 2 * elements and stages[0]["writes"] == 2 * elements
    assert stages[-1]["reads"] == 2 * 2 * elements and stages[-1]["writes"] == 2 * elements
    widened = mf.explain(u, k, pregate=pregate.float())["stages"]
    assert widened[0]["reads"] == (2 + 4) * elements and widened[0]["writes"] == 4 * elements
    assert widened[-1]["stage"].startswith("cast to bfloat16")


@pytest.mark.parametrize("channels, filters, length, repeat", [(8, 2, 256, None), (12, 4, 300, "op"),
                                                              (8, 2, 40000, "op")])
@pytest.mark.parametrize("in_kernels", [True, False])
def test_explain_stages_of_a_grouped_bank(channels, filters, length, repeat, in_kernels, monkeypatch, gen):
    """Grouped filters on the fused fp32 backend: with the groups in the kernels the spectrum
    has G rows, repeated in the op only where the kernel does not read rows by shift (C/G not a
    power of two, or the four-step sizes); off, the filters are repeated before the op."""
    fused = backends.FourStep("cuda-fourstep", "four-step", "test") if length > 32768 else \
        backends.FusedFP32("cuda-fp32", "fused fp32 radix FFT conv", "test")
    monkeypatch.setattr(functional, "select_backend", lambda *args, **kwargs: fused)
    monkeypatch.setattr(backends, "GROUPS_IN_KERNELS", in_kernels)
    u, k = randn(gen, 2, channels, length), randn(gen, filters, length)
    stages = mf.explain(u, k)["stages"]
    names = [s["stage"] for s in stages]
    spectrum = [s for s in stages if s["stage"].startswith("filter spectrum")]
    per_channel = mf.explain(u, k.repeat_interleave(channels // filters, 0))["stages"]
    if not in_kernels:
        assert names[0] == f"repeat the {filters} filters over their groups (ATen copy)"
        assert stages[1:] == per_channel
        return
    (per_channel_spectrum,) = [s for s in per_channel if s["stage"] == spectrum[-1]["stage"]]
    assert spectrum[-1]["writes"] * (channels // filters) == per_channel_spectrum["writes"]
    repeats = [n for n in names if n.startswith("repeat")]
    if repeat is None:
        assert repeats == [] and len(stages) == len(per_channel)
    else:
        assert repeats == [f"repeat the {filters} spectrum rows over their groups (in the op)"]
        assert names.index(repeats[0]) == len(spectrum)  # after the spectrum, before the conv


# --------------------------------------------------------------------------- groups in the ops

@pytest.mark.parametrize("gates, bidirectional, with_D, length", [("none", False, True, None), ("both", False, True, None),
                                                                   ("pre", True, True, None), ("none", False, True, 40000),
                                                                   ("post", True, False, 40001)])
@pytest.mark.parametrize("in_kernels", [True, False])
def test_groups_given_to_the_ops_as_their_rows(gates, bidirectional, with_D, length, in_kernels, monkeypatch, gen):
    """With backends.GROUPS_IN_KERNELS on (the default), the ops get the G filter rows (not C)
    and return a G-row filter gradient; off, the rows repeated to C. y and every gradient against
    float64, at odd sizes and at the four-step plan (L = 40000), gates, D and bidirectional
    filters included."""
    from monarch_fftconv import ops

    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    assert backends.GROUPS_IN_KERNELS  # the default
    monkeypatch.setattr(backends, "GROUPS_IN_KERNELS", in_kernels)
    rows_seen = []
    real = ops.fftconv_op
    monkeypatch.setattr(ops, "fftconv_op", lambda u, k, *rest: rows_seen.append(k.shape[0]) or real(u, k, *rest))
    channels, groups = 9, 3
    if length is None:
        length, filter_len = odd_sizes(gen)
    else:
        filter_len = 300
    inputs = operator_inputs(gen, 2, channels, groups, length, filter_len, gates, bidirectional, with_D)
    u, k, D, pregate, postgate = (None if t is None else t.double().requires_grad_() for t in inputs)
    y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate, bidirectional=bidirectional)
    want = reference_operator(u, k, D, pregate, postgate, bidirectional=bidirectional)
    assert rel_l2(y, want) <= 1e-10
    if not bidirectional:
        assert rows_seen == [groups if in_kernels else channels]
    leaves = [t for t in (u, k, D, pregate, postgate) if t is not None]
    g = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    for got, expected in zip(torch.autograd.grad(y, leaves, g), torch.autograd.grad(want, leaves, g)):
        assert got.shape == expected.shape and rel_l2(got, expected) <= 1e-10


def test_grouped_filter_gradient_on_the_ops_is_the_group_sum(monkeypatch, gen):
    """The backward op with a G-row spectrum: dk's row g is the sum of its channels' rows as the
    per-channel spectrum gives them (two-sided too); du and dD the same."""
    from monarch_fftconv import ops

    u, grad = randn(gen, 3, 8, 301), randn(gen, 3, 8, 301)
    k, D = randn(gen, 2, 120), randn(gen, 8)
    grouped = ops.filter_spectrum_op(k, 301, "fp32")
    per_channel = grouped.repeat_interleave(4, dim=0)
    for backward in (ops.fftconv_backward_op, ops.fftconv_backward_two_sided_op):
        du, dk, dskip = backward(grad, u, grouped, D, 120, "fp32")
        du_c, dk_c, dskip_c = backward(grad, u, per_channel, D, 120, "fp32")
        assert dk.shape[0] == 2 and torch.equal(du, du_c) and torch.equal(dskip, dskip_c)
        assert torch.allclose(dk, dk_c.unflatten(0, (2, 4)).sum(1), rtol=0, atol=1e-5)
    y = ops.conv_forward_op(u, grouped, D, "fp32")
    assert torch.equal(y, ops.conv_forward_op(u, per_channel, D, "fp32"))


# --------------------------------------------------------------------------- fused gates (inference)

@pytest.fixture
def gates_fused_on_the_ops(monkeypatch):
    """backends.FUSED_GATES on, and the portable engine taken for a backend whose kernel takes
    the gates: the routing to gated_conv_forward runs on the CPU op (the gates around its conv).
    Yields the list of gated_conv_forward calls made."""
    from monarch_fftconv import ops

    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    monkeypatch.setattr(backends, "FUSED_GATES", True)
    monkeypatch.setattr(backends.Portable, "fuses_gates", True)
    calls = []
    real = ops.gated_conv_forward_op

    def spy(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(ops, "gated_conv_forward_op", spy)
    return calls


@pytest.mark.parametrize("gates, group_share, with_D, leading", [("both", 1, True, (3,)), ("pre", 3, False, (2, 2)),
                                                                  ("post", 3, True, ())])
def test_gated_inference_goes_to_the_gated_op(gates, group_share, with_D, leading, gates_fused_on_the_ops, gen):
    """Without autograd, gates of u's shape and dtype go to gated_conv_forward (leading batch
    dims flattened, grouped spectra repeated, D cast), within the fp32 budget of float64."""
    channels, (length, filter_len) = 9, odd_sizes(gen)
    batch = 1
    for size in leading:
        batch *= size
    u, k, D, pregate, postgate = operator_inputs(gen, batch, channels, channels // group_share, length, filter_len,
                                                 gates, False, with_D)
    u, pregate, postgate = (None if t is None else t.reshape(*leading, channels, length) for t in (u, pregate, postgate))
    with torch.no_grad():
        y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate)
    assert len(gates_fused_on_the_ops) == 1 and y.shape == u.shape
    assert rel_l2(y, reference_operator(u, k, D, pregate, postgate)) <= BUDGETS["fp32"]
    info = mf.explain(u, k, D=D, pregate=pregate, postgate=postgate)
    assert all("fused into the fp32 kernel's" in info["terms"][name] for name in info["terms"] if name != "D")


def test_gates_stay_outside_when_autograd_records_or_the_gate_differs(gates_fused_on_the_ops, gen):
    """A training call, a broadcast gate and a gate of another dtype keep the elementwise ops
    (their gradients and promotion are autograd's); the results are the same either way."""
    u, k, D, pregate, postgate = operator_inputs(gen, 2, 4, 4, 101, 60, "both", False, True)
    leaves = [t.clone().requires_grad_() for t in (u, pregate)]
    y = mf.fftconv(leaves[0], k, D=D, pregate=leaves[1], postgate=postgate)
    torch.autograd.grad(y.sum(), leaves)
    with torch.no_grad():
        broadcast = mf.fftconv(u, k, D=D, pregate=pregate[:1], postgate=postgate)
        widened = mf.fftconv(u, k, D=D, pregate=pregate.double(), postgate=postgate)
    assert gates_fused_on_the_ops == []
    assert rel_l2(y, reference_operator(u, k, D, pregate, postgate)) <= BUDGETS["fp32"]
    assert rel_l2(broadcast, reference_operator(u, k, D, pregate[:1].expand_as(u), postgate)) <= BUDGETS["fp32"]
    assert widened.dtype == torch.float32 and rel_l2(widened, reference_operator(u, k, D, pregate, postgate)) <= 1e-6


def test_half_precision_io_keeps_the_aten_gates(gates_fused_on_the_ops, gen):
    """bf16 and fp16 I/O are not in backends.FUSED_GATE_IO_DTYPES (the fused kernel measured
    slower there): their gated inference calls keep the elementwise ops, and say so."""
    for dtype in (torch.bfloat16, torch.float16):
        u, k, D, pregate, postgate = operator_inputs(gen, 2, 4, 4, 101, 60, "both", False, True)
        u, pregate, postgate = (t.to(dtype) for t in (u, pregate, postgate))
        with torch.no_grad():
            y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate)
        assert y.dtype == dtype
        assert rel_l2(y, reference_operator(u, k, D, pregate, postgate)) <= BUDGETS["bf16"]
        info = mf.explain(u, k, D=D, pregate=pregate, postgate=postgate)
        assert "elementwise op" in info["terms"]["pregate"] and "fused" not in info["terms"]["postgate"]
    assert gates_fused_on_the_ops == []


def test_half_precision_gated_calls_take_the_fp32_kernel(monkeypatch):
    """backends.GATED_CALLS_ON_FP32: with gates the fp32 kernel fuses, a bf16/fp16 call on a
    split the tensor cores cover runs on the fp32 kernel (asked for in fp32, saying why); without
    them, or with a tensor-core kernel named in the environment, the tensor-core route stays."""
    from monarch_fftconv import _extension

    plan = plan_for(8192)
    coverage = _extension.Coverage(frozenset({(plan.n1, plan.row_size)}), frozenset(), frozenset({torch.float32}))
    monkeypatch.setattr(_extension, "coverage", lambda build=True: coverage)
    monkeypatch.delenv(backends.TC_KERNEL_ENV, raising=False)
    cuda = torch.device("cuda", 0)

    def decide(precision, gates, requested="auto"):
        return backends._decide(cuda, torch.float32, precision, plan, False, True, requested, gates_to_fp32=gates)

    for precision in ("bf16", "fp16"):
        plain, gated = decide(precision, False), decide(precision, True)
        assert plain.name == "cuda-tensor-core" and not plain.fuses_gates
        assert gated.name == "cuda-fp32" and gated.fuses_gates and gated.runs_as == "fp32"
        assert "GATED_CALLS_ON_FP32" in gated.reason and precision in gated.reason
    assert decide("fp32", True).name == "cuda-fp32" and decide("fp32", True).runs_as is None
    assert decide("bf16", True, "portable").name == "portable"
    monkeypatch.setenv(backends.TC_KERNEL_ENV, "mma")  # a kernel named by the user keeps its route
    assert decide("bf16", True).name == "cuda-tensor-core"


def test_gated_calls_tell_the_backend_choice_whether_the_fp32_kernel_fuses_their_gates(monkeypatch, gen):
    """conv() and explain() pass select_backend whether the fp32 kernel would take the call's gates
    (gates of u's shape and dtype, causal, fp32 I/O, both fusion flags and GATED_CALLS_ON_FP32
    on); flipping a flag between two identical calls is seen by the second (the call's remembered
    decision keys on the flags), and every call stays within its budget against float64."""
    seen = []
    real = functional.select_backend

    def spy(*args, **kwargs):
        seen.append(kwargs.get("fp32_fuses_gates"))
        return real(*args, **kwargs)

    monkeypatch.setattr(functional, "select_backend", spy)
    functional._decided.clear()
    u, k, D, pregate, postgate = operator_inputs(gen, 2, 5, 5, 301, 77, "both", False, True)
    want = reference_operator(u, k, D, pregate, postgate)

    def call(**changes):
        seen.clear()
        y = mf.fftconv(changes.get("u", u), k, D=D, precision="bf16", pregate=changes.get("pregate", pregate),
                       postgate=changes.get("postgate", postgate))
        return y, seen[-1] if seen else "remembered"

    y, fused = call()
    assert fused is True and rel_l2(y, want) <= BUDGETS["bf16"]
    assert call()[1] == "remembered"  # the same call again: decided once
    assert call(postgate=postgate[:1])[1] is False  # a broadcast gate stays an elementwise op
    assert call(pregate=pregate.double())[1] is False  # a promoting gate too
    for flag in ("FUSED_GATES", "FUSED_GATED_TRAINING"):
        with monkeypatch.context() as m:
            m.setattr(backends, flag, False)
            assert call()[1] is False, flag
    y, fused = call(pregate=None)
    assert fused is True and rel_l2(y, reference_operator(u, k, D, None, postgate)) <= BUDGETS["bf16"]
    seen.clear()
    assert mf.explain(u, k, D=D, pregate=pregate, postgate=postgate, precision="fp16") and seen == [True]
    seen.clear()
    k_two = randn(gen, 5, 2, 77)
    mf.explain(u, k_two, pregate=pregate, postgate=postgate, precision="fp16", bidirectional=True)
    assert seen == [False]  # bidirectional calls keep their gates outside


@pytest.mark.watchdog(GPU_WATCHDOG_S)
def test_half_precision_gated_call_on_cuda_runs_the_fused_fp32_kernel(monkeypatch, gen):
    """What the route buys on a GPU: explain() names the fp32 kernel for a bf16 gated call, and
    its result has the fp32 kernel's accuracy (well inside bf16's budget)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    u, k, D, pregate, postgate = (None if t is None else t.cuda()
                                  for t in operator_inputs(gen, 3, 64, 64, 8000, 8000, "both", False, True))
    # the call first: it loads the extension, which explain() never does (before it, explain()
    # says "pending": test_explain_before_the_extension_loads_leaves_the_gates_open)
    y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate, precision="bf16")
    info = mf.explain(u, k, D=D, pregate=pregate, postgate=postgate, precision="bf16")
    assert info["backend"] == "cuda-fp32" and "GATED_CALLS_ON_FP32" in info["reason"]
    want = reference_operator(u, k, D, pregate, postgate)
    assert rel_l2(y, want) <= BUDGETS["fp32"]
    leaves = [t.clone().requires_grad_() for t in (u, k, pregate, postgate)]
    y = mf.fftconv(leaves[0], leaves[1], D=D, pregate=leaves[2], postgate=leaves[3], precision="bf16")
    assert rel_l2(y.detach(), want) <= BUDGETS["fp32"]
    dy = torch.randn(y.shape, generator=torch.Generator(device="cuda").manual_seed(7), device="cuda")
    grads = torch.autograd.grad(y, leaves, dy)
    exact = [t.double().requires_grad_() for t in (u, k, pregate, postgate)]
    want_grads = torch.autograd.grad(reference_operator(exact[0], exact[1], D, exact[2], exact[3]), exact, dy.double())
    for name, got, expected in zip(("u", "k", "pregate", "postgate"), grads, want_grads):
        assert rel_l2(got, expected) <= 2 * BUDGETS["fp32"], name


def test_explain_before_the_extension_loads_leaves_the_gates_open(monkeypatch, gen):
    """Before the CUDA extension is loaded, explain() cannot know whether the kernel will take
    the gates: it says so, as it does for D, instead of naming a route the call may not take."""
    from monarch_fftconv import functional

    pending = backends.Pending("pending", "decided by the first CUDA call", "the extension is not loaded yet")
    monkeypatch.setattr(functional, "select_backend", lambda *args, **kwargs: pending)
    u, k, D, pregate, postgate = operator_inputs(gen, 2, 4, 4, 101, 60, "both", False, True)
    terms = mf.explain(u, k, D=D, pregate=pregate, postgate=postgate)["terms"]
    assert all(terms[name].endswith("decided by the first CUDA call") for name in ("pregate", "D", "postgate"))


def test_gated_op_refuses_gates_unlike_u(gen):
    from monarch_fftconv import ops

    u, k = randn(gen, 2, 3, 50), randn(gen, 3, 50)
    spectrum = ops.filter_spectrum(k, 50, "fp32")
    with pytest.raises(ValueError, match=r"pregate must have u's shape \(2, 3, 50\) and dtype torch.float32"):
        ops.gated_conv_forward_op(u, spectrum, None, randn(gen, 1, 3, 50), None, "fp32")
    with pytest.raises(ValueError, match="postgate must have u's shape"):
        ops.gated_conv_forward_op(u, spectrum, None, None, u.double(), "fp32")


@requires_cuda
@pytest.mark.parametrize("length, io_dtype, precision", [(8192, torch.float32, "fp32"), (1000, torch.float32, "fp32"),
                                                         (12345, torch.float32, "fp32"), (4096, torch.bfloat16, "fp32"),
                                                         (777, torch.float16, "bf16"), (40000, torch.float32, "fp32")])
def test_gates_fused_into_the_cuda_kernel(length, io_dtype, precision, monkeypatch, gen):
    """The gated op on the GPU: the fp32 kernel with the gates in its load and store (N up to
    32768), the tensor-core and four-step kernels with the gates around them (a small bf16 call,
    N = 131072), against float64; a channel-strided u; every output written (NaN-poisoned)."""
    from monarch_fftconv import _extension

    assert not isinstance(_extension.coverage(True), str)
    monkeypatch.setattr(backends, "FUSED_GATES", True)
    monkeypatch.setattr(backends, "FUSED_GATE_IO_DTYPES", frozenset({io_dtype}))  # the kernel's 2-byte instances too
    base = randn(gen, 3, 10, length, device="cuda", dtype=io_dtype)
    u = base[:, ::2]  # channel stride 2
    k, D = randn(gen, 5, length, device="cuda") / length**0.5, randn(gen, 5, device="cuda")
    pregate, postgate = (randn(gen, 3, 5, length, device="cuda", dtype=io_dtype) for _ in range(2))
    torch.empty(3 * 5 * length, device="cuda", dtype=io_dtype).fill_(float("nan"))
    with torch.inference_mode():
        y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate, precision=precision)
    info = mf.explain(u, k, D=D, pregate=pregate, postgate=postgate, precision=precision)
    rounding = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[io_dtype]
    assert torch.isfinite(y).all() and y.dtype == io_dtype
    assert rel_l2(y, reference_operator(u, k, D, pregate, postgate)) <= BUDGETS[precision] + 3 * rounding
    if info["backend"] == "cuda-fp32":
        assert "fused into the fp32 kernel's load" in info["terms"]["pregate"]


# --------------------------------------------------------------------------- FFTConv

@pytest.mark.parametrize("engine", ["auto", "portable"])
@pytest.mark.parametrize("groups, bidirectional", [(3, False), (3, True), (None, True)])
def test_fftconv_module_groups_and_bidirectional(engine, groups, bidirectional, monkeypatch, gen):
    """FFTConv(groups=G) holds (G, L) filters, bidirectional=True (G, 2, L); shorter inputs
    use the filters' first taps; an inference_cache() block gives the same results."""
    monkeypatch.setenv(backends.BACKEND_ENV, engine)
    layer = mf.FFTConv(6, 301, groups=groups, bidirectional=bidirectional)
    assert layer.filter.shape == ((groups or 6), *((2,) if bidirectional else ()), 301)
    x = randn(gen, 3, 6, 255)
    want = reference_operator(x, layer.filter[..., :255].detach(), bidirectional=bidirectional)
    y = layer(x)
    assert rel_l2(y, want) <= BUDGETS["fp32"]
    y.square().sum().backward()
    assert layer.filter.grad.shape == layer.filter.shape
    with torch.no_grad(), mf.inference_cache(layer):
        assert rel_l2(layer(x), want) <= BUDGETS["fp32"]
    with pytest.raises(ValueError, match="groups must be a positive divisor of channels=6"):
        mf.FFTConv(6, 301, groups=4)


# ----------------------------------------------------------------------------- the two conventions


def direct_bidirectional(u, k, shift):
    """y[t] = Σ_s k[c, 0, s]·u[t-s] + Σ_s k[c, 1, s]·u[t+s+shift] in float64, by the definition
    (no FFT): shift 0 is "fftconv_ref", 1 is "m2"."""
    u, k = u.double(), k.double()
    length, taps = u.shape[-1], k.shape[-1]
    y = torch.zeros_like(u)
    for s in range(taps):
        y[..., s:] += k[:, 0, s, None] * u[..., :length - s]
        lag = s + shift
        if lag < length:
            y[..., :length - lag] += k[:, 1, s, None] * u[..., lag:]
    return y


@pytest.mark.parametrize("name, shift", [("fftconv_ref", 0), (True, 0), ("m2", 1)])
@pytest.mark.parametrize("length, taps", [(37, 37), (50, 23), (129, 128), (5, 1)])
def test_each_convention_is_its_definition(name, shift, length, taps, gen):
    """fftconv, FFTConv and explain() name and compute each convention as defined, with filters
    as long as the sequence (M2's last tap falls off the end) and shorter, odd sizes; the
    gradients are the definition's too."""
    u = randn(gen, 3, 4, length, dtype=torch.float64).requires_grad_()
    k = randn(gen, 4, 2, taps, dtype=torch.float64).requires_grad_()
    y = mf.fftconv(u, k, bidirectional=name)
    want = direct_bidirectional(u, k, shift)
    assert rel_l2(y, want) <= 1e-12
    g = randn(gen, *y.shape, dtype=torch.float64)
    got = torch.autograd.grad(y, (u, k), g)
    expected = torch.autograd.grad(want, (u, k), g)
    assert all(rel_l2(a, b) <= 1e-12 for a, b in zip(got, expected))
    convention = "fftconv_ref" if name is True else name
    assert mf.explain(u, k, bidirectional=name)["bidirectional"] == convention
    layer = mf.FFTConv(4, length, bidirectional=name).double()
    assert layer.bidirectional == convention and f"bidirectional={convention!r}" in repr(layer)
    with torch.no_grad():
        layer.filter.zero_()
        layer.filter[..., :taps] = k
        assert rel_l2(layer(u), want) <= 1e-12


def test_hyena_operator_names_the_conventions(gen):
    """HyenaOperator(bidirectional=True) is M2's convention, as it has been; the names give
    each convention, the same as fftconv's."""
    for given, convention in ((True, "m2"), ("m2", "m2"), ("fftconv_ref", "fftconv_ref"), (False, False)):
        assert HyenaOperator(8, 32, bidirectional=given).bidirectional == convention
    op = HyenaOperator(8, 32, bidirectional="fftconv_ref").double()
    x = randn(gen, 2, 31, 8, dtype=torch.float64)
    m2 = HyenaOperator(8, 32, bidirectional="m2").double()
    m2.load_state_dict(op.state_dict())
    assert rel_l2(op(x), m2(x)) > 1e-3  # the same filters, another placement: another result
    with pytest.raises(ValueError, match=r"bidirectional must be False, True \(= 'fftconv_ref'\), 'fftconv_ref' "
                                         r"or 'm2', got 'M2'"):
        mf.fftconv(randn(gen, 2, 3, 10), randn(gen, 3, 2, 10), bidirectional="M2")


# ----------------------------------------------------------------------------- bidirectional on the ops

def check_bidirectional_on_the_ops(u, k, D, convention, precision, budget):
    """y and the gradients of u, k, D of a bidirectional call against the float64 definition
    (`direct_bidirectional`), where `explain()` says the call runs on the folded spectrum."""
    shift = {"fftconv_ref": 0, "m2": 1}[convention]
    info = mf.explain(u, k, D=D, bidirectional=convention, precision=precision)
    assert "folded spectrum" in info["kernel"], info
    leaves = [t.requires_grad_() for t in (u, k, D)]
    y = mf.fftconv(u, k, D=D, bidirectional=convention, precision=precision)
    per_channel = k.detach().double().repeat_interleave(u.shape[-2] // k.shape[0], dim=0).requires_grad_()
    Dd, ud = D.detach().double().requires_grad_(), u.detach().double().requires_grad_()
    want = direct_bidirectional(ud, per_channel, shift) + Dd.unsqueeze(-1) * ud
    assert rel_l2(y, want) <= budget
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, leaves, g)
    du, dk_per_channel, dD = torch.autograd.grad(want, (ud, per_channel, Dd), g.double())
    dk = dk_per_channel.unflatten(0, (k.shape[0], -1)).sum(1)  # the rows' gradient: summed over the group
    for name, a, b in zip(("du", "dk", "dD"), got, (du, dk, dD)):
        assert a.shape == b.shape and rel_l2(a, b) <= 2 * budget, name


@pytest.mark.parametrize("convention", ["fftconv_ref", "m2"])
@pytest.mark.parametrize("length, groups", [(301, 5), (1000, 1), (40000, 5)])  # radix and four-step plans
def test_bidirectional_runs_on_the_portable_ops(convention, length, groups, monkeypatch, gen):
    """The portable engine (the kernels' executable spec) computes bidirectional calls on the
    folded spectrum K_fwd + conj(K_rev), forward and backward, in both conventions, with D,
    grouped filters shorter than the sequence and odd sizes."""
    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    u = randn(gen, 3, 5, length)
    k = randn(gen, groups, 2, 97 if length > 1000 else length - 2)  # the definition's loop is one step a tap
    check_bidirectional_on_the_ops(u, k, randn(gen, 5), convention, "fp32", BUDGETS["fp32"])


def test_folded_spectrum_is_the_whole_circles(gen):
    """The two-sided spectrum op (K_fwd + conj(K_rev)) holds, in the radix layout, the DFT of the
    whole circular filter (causal taps at bins s, anti-causal ones at bins N - s) at each entry's
    frequency: what the causal ops multiply by. (The four-step layout: through the calls above;
    the CUDA kernel: tests/test_cuda.py.)"""
    from monarch_fftconv import ops
    from monarch_fftconv.planner import spectrum_frequencies
    for length, taps in ((1000, 1000), (8191, 77), (300, 1)):
        plan = plan_for(length)
        n = plan.fft_size
        k = randn(gen, 3, 2, taps, dtype=torch.float64)
        folded = torch.view_as_complex(ops.filter_spectrum_two_sided_op(k, length, "fp32"))
        want = (torch.fft.fft(two_sided_circle(k, n), n=n) / n)[:, spectrum_frequencies(plan)]
        assert folded.shape == want.shape and rel_l2(folded, want) <= 1e-12


@requires_cuda
@pytest.mark.parametrize("convention", ["fftconv_ref", "m2"])
@pytest.mark.parametrize("length, precision", [(8191, "fp32"), (8192, "bf16"), (40000, "fp32"), (1000, "fp16")])
def test_bidirectional_runs_on_the_cuda_kernels(convention, length, precision, gen):
    """The CUDA kernels (radix, tensor-core, four-step) on the folded spectrum, forward and both
    backward calls, against the float64 definition within the precision's budget."""
    from monarch_fftconv import _extension

    assert not isinstance(_extension.coverage(True), str)  # loaded: explain() reports the kernels, not "pending"
    u = randn(gen, 2, 6, length, device="cuda")
    k = randn(gen, 3, 2, 97, device="cuda")
    check_bidirectional_on_the_ops(u, k, randn(gen, 6, device="cuda"), convention, precision, BUDGETS[precision])


def test_bidirectional_on_the_ops_compiles_whole(monkeypatch, gen):
    """torch.compile(fullgraph=True) of a bidirectional training step on the ops (the autograd
    Function over the custom ops traces without a graph break): the eager gradients, bit for bit."""
    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    u, k = randn(gen, 2, 3, 301).requires_grad_(), randn(gen, 3, 2, 50).requires_grad_()

    def loss(u, k):
        return mf.fftconv(u, k, bidirectional="m2").square().sum()

    compiled = torch.autograd.grad(torch.compile(loss, fullgraph=True)(u, k), (u, k))
    eager = torch.autograd.grad(loss(u, k), (u, k))
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager))

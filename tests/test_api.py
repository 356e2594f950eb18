"""The public API: input errors, the precision policy, explain()."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import policy

from helpers import BUDGETS, randn, reference, rel_l2


def test_public_api_is_small():
    assert set(mf.__all__) == {"FFTConv", "PRECISIONS", "explain", "fftconv", "inference_cache", "precision"}
    assert mf.PRECISIONS == ("fp32", "tf32", "bf16", "fp16")


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("u_shape, k_shape, exc, match", [
    ((100,), (1, 100), ValueError, r"u must have shape \(\.\.\., C, L\)"),
    ((2, 4, 100), (4, 100, 1), ValueError, r"k must have shape \(C, Lk\)"),
    ((2, 4, 100), (3, 100), ValueError, "channel mismatch"),
    ((2, 4, 100), (4, 101), ValueError, "k longer than the sequence"),
    ((2, 0, 100), (0, 10), ValueError, "empty dimension"),
    ((2, 4, 100), (4, 0), ValueError, "empty dimension"),
])
def test_bad_shapes(u_shape, k_shape, exc, match):
    with pytest.raises(exc, match=match):
        mf.fftconv(torch.randn(u_shape), torch.randn(k_shape))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.complex64, torch.bool])
def test_bad_dtypes(dtype):
    good = torch.randn(2, 3, 10)
    bad = torch.ones(2, 3, 10).to(dtype)
    with pytest.raises(TypeError, match="u must be a real floating-point"):
        mf.fftconv(bad, torch.randn(3, 10))
    with pytest.raises(TypeError, match="k must be a real floating-point"):
        mf.fftconv(good, bad[0])


def test_bad_precision_and_types():
    u, k = torch.randn(2, 3, 10), torch.randn(3, 10)
    with pytest.raises(ValueError, match="precision must be one of"):
        mf.fftconv(u, k, precision="fp8")
    with pytest.raises(TypeError, match="u must be a torch.Tensor"):
        mf.fftconv(u.tolist(), k)
    with pytest.raises(ValueError, match=r"D must have shape \(3,\)"):
        mf.fftconv(u, k, D=torch.randn(4))
    with pytest.raises(ValueError):
        mf.precision("int8").__enter__()


def test_different_devices():
    u, k = torch.randn(2, 3, 10), torch.randn(3, 10, device="meta")
    with pytest.raises(ValueError, match="different devices"):
        mf.fftconv(u, k)


@pytest.mark.parametrize("k_shape, bidirectional, match", [
    ((4, 100), False, r"channel mismatch: u has 6 channels, k has 4; .*C % G == 0"),
    ((12, 100), False, r"channel mismatch: u has 6 channels, k has 12"),
    ((6, 100), True, r"k must have shape \(C, 2, Lk\) or \(G, 2, Lk\) with bidirectional=True"),
    ((6, 3, 100), True, r"k must have shape \(C, 2, Lk\)"),
    ((6, 2, 100), False, r"k must have shape \(C, Lk\) or \(G, Lk\), .*needs bidirectional=True"),
    ((4, 2, 100), True, r"channel mismatch: u has 6 channels, k has 4"),
    ((3, 2, 101), True, r"k longer than the sequence: Lk=101 > L=100"),
])
def test_bad_filter_banks(k_shape, bidirectional, match):
    u = torch.randn(2, 6, 100)
    for call in (mf.fftconv, mf.explain):
        with pytest.raises(ValueError, match=match):
            call(u, torch.randn(k_shape), bidirectional=bidirectional)


def test_bidirectional_must_be_a_bool():
    with pytest.raises(TypeError, match=r"bidirectional must be a bool or a convention's name \('fftconv_ref', 'm2'\), got int"):
        mf.fftconv(torch.randn(2, 6, 100), torch.randn(6, 2, 100), bidirectional=1)


@pytest.mark.parametrize("name", ["pregate", "postgate"])
@pytest.mark.parametrize("gate, exc, match", [
    (torch.randn(2, 6, 99), ValueError, r"{name} must have u's shape \(2, 6, 100\) \(leading dims may be 1 or absent\)"),
    (torch.randn(2, 3, 100), ValueError, r"{name} must have u's shape"),
    (torch.randn(3, 6, 100), ValueError, r"{name} must have u's shape"),
    (torch.randn(1, 2, 6, 100), ValueError, r"{name} must have u's shape"),
    (torch.randn(600), ValueError, r"{name} must have u's shape"),
    (torch.ones(2, 6, 100, dtype=torch.int32), TypeError, "{name} must be a real floating-point tensor"),
    (torch.ones(2, 6, 100, dtype=torch.complex64), TypeError, "{name} must be a real floating-point tensor"),
    ([[0.0] * 100] * 6, TypeError, "{name} must be a torch.Tensor or None, got list"),
    (torch.randn(2, 6, 100, device="meta"), ValueError, "u and {name} are on different devices: cpu and meta"),
])
def test_bad_gates(name, gate, exc, match):
    u, k = torch.randn(2, 6, 100), torch.randn(6, 100)
    for call in (mf.fftconv, mf.explain):
        with pytest.raises(exc, match=match.format(name=name)):
            call(u, k, **{name: gate})


def test_gates_may_broadcast_over_leading_dims():
    u, k = torch.randn(2, 6, 100), torch.randn(3, 100)
    for gate in (torch.randn(6, 100), torch.randn(1, 6, 100), torch.randn(2, 6, 100)):
        assert mf.fftconv(u, k, pregate=gate, postgate=gate).shape == u.shape


def test_bad_skip_dtype():
    with pytest.raises(TypeError, match="D must be a real floating-point tensor"):
        mf.fftconv(torch.randn(2, 6, 100), torch.randn(6, 100), D=torch.ones(6, dtype=torch.int64))


def _hyena():
    from monarch_fftconv.nn import HyenaOperator

    return HyenaOperator(8, 32)


# The other public entries: (what, the call, exception, the message: the argument, the expected
# and the given shape or dtype).
BAD_ENTRY_INPUTS = [
    ("FFTConv: a multiple of its channels", lambda: mf.FFTConv(4, 100)(torch.randn(2, 8, 100)), ValueError,
     r"^the input must have shape \(B, 4, L\) or \(\.\.\., 4, L\) with L <= 100 \(FFTConv channels=4\), got \(2, 8, 100\)$"),
    ("FFTConv: (B, L, C)", lambda: mf.FFTConv(4, 100)(torch.randn(2, 100, 4)), ValueError,
     r"\(B, 4, L\) .*got \(2, 100, 4\); it looks like \(B, L, C\): the module takes \(B, C, L\)"),
    ("FFTConv: 1-D", lambda: mf.FFTConv(4, 100)(torch.randn(100)), ValueError, r"\(B, 4, L\) .*got \(100,\)$"),
    ("FFTConv: too long", lambda: mf.FFTConv(4, 100)(torch.randn(2, 4, 101)), ValueError,
     r"input length 101 exceeds the module's seq_len 100: .*\(\.\.\., 4, L\) with L <= 100, got \(2, 4, 101\)"),
    ("FFTConv: not a tensor", lambda: mf.FFTConv(4, 100)([[0.0] * 100] * 4), TypeError,
     "the input must be a torch.Tensor, got list"),
    ("FFTConv: int input", lambda: mf.FFTConv(4, 100)(torch.ones(2, 4, 100, dtype=torch.int64)), TypeError,
     r"the input must be a real floating-point tensor \(float16/bfloat16/float32/float64\), got torch.int64"),
    ("FFTConv(channels=0)", lambda: mf.FFTConv(0, 100), ValueError, "channels must be a positive int, got 0"),
    ("FFTConv(seq_len=2.5)", lambda: mf.FFTConv(4, 2.5), ValueError, "seq_len must be a positive int, got 2.5"),
    ("FFTConv(groups=3)", lambda: mf.FFTConv(4, 100, groups=3), ValueError,
     "groups must be a positive divisor of channels=4, got 3"),
    ("FFTConv(bidirectional=1)", lambda: mf.FFTConv(4, 100, bidirectional=1), TypeError,
     r"bidirectional must be a bool or a convention's name \('fftconv_ref', 'm2'\), got int"),
    ("FFTConv(precision='fp8')", lambda: mf.FFTConv(4, 100, precision="fp8"), ValueError,
     "precision must be one of 'fp32', 'tf32', 'bf16', 'fp16' or None, got 'fp8'"),
    ("HyenaOperator: (L, d_model)", lambda: _hyena()(torch.randn(20, 8)), ValueError,
     r"x must have shape \(B, L, d_model\) = \(B, L, 8\), got \(20, 8\); .* x.unsqueeze\(0\)"),
    ("HyenaOperator: (B, d_model, L)", lambda: _hyena()(torch.randn(2, 8, 20)), ValueError,
     r"\(B, L, 8\), got \(2, 8, 20\); it looks like \(B, d_model, L\): .* x.transpose\(1, 2\)"),
    ("HyenaOperator: another width", lambda: _hyena()(torch.randn(2, 20, 6)), ValueError,
     r"x must have shape \(B, L, d_model\) = \(B, L, 8\), got \(2, 20, 6\)$"),
    ("HyenaOperator: 4-D", lambda: _hyena()(torch.randn(1, 2, 20, 8)), ValueError, r"\(B, L, 8\), got \(1, 2, 20, 8\)$"),
    ("HyenaOperator: empty L", lambda: _hyena()(torch.randn(2, 0, 8)), ValueError,
     r"x must have shape \(B, L, 8\) with 1 <= L <= 32, got \(2, 0, 8\)"),
    ("HyenaOperator: too long", lambda: _hyena()(torch.randn(1, 33, 8)), ValueError,
     r"input length 33 exceeds the operator's l_max 32: .*1 <= L <= 32, got \(1, 33, 8\)"),
    ("HyenaOperator: float64 x, float32 parameters", lambda: _hyena()(torch.randn(2, 20, 8, dtype=torch.float64)),
     TypeError, r"x must be floating point in the parameters' dtype torch.float32 .*got torch.float64"),
    ("HyenaOperator: int x", lambda: _hyena()(torch.ones(2, 20, 8, dtype=torch.int64)), TypeError,
     r"x must be floating point .*got torch.int64"),
    ("HyenaOperator: not a tensor", lambda: _hyena()([[0.0] * 8] * 20), TypeError,
     r"x must be a torch.Tensor of shape \(B, L, d_model\), got list"),
    ("inference_cache: not a Module", lambda: mf.inference_cache([mf.FFTConv(4, 100)]).__enter__(), TypeError,
     r"inference_cache\(model\): model must be a torch.nn.Module, got list"),
    ("precision(None)", lambda: mf.precision(None).__enter__(), ValueError,
     r"monarch_fftconv.precision\(name\): name must be one of 'fp32', 'tf32', 'bf16', 'fp16', got None$"),
    ("precision('int8')", lambda: mf.precision("int8").__enter__(), ValueError, r"name must be one of .*got 'int8'$"),
    ("fftconv(precision=3)", lambda: mf.fftconv(torch.randn(2, 3, 10), torch.randn(3, 10), precision=3), ValueError,
     "precision must be one of 'fp32', 'tf32', 'bf16', 'fp16' or None, got 3"),
    ("explain(k on another device)", lambda: mf.explain(torch.randn(2, 3, 10), torch.randn(3, 10, device="meta")),
     ValueError, "u and k are on different devices: cpu and meta"),
]


@pytest.mark.parametrize("call, exc, match", [row[1:] for row in BAD_ENTRY_INPUTS],
                         ids=[row[0] for row in BAD_ENTRY_INPUTS])
def test_bad_inputs_of_every_entry(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_functional_grouping_is_inferred_and_explained(gen):
    """fftconv keeps its rule: G filter rows with C % G == 0 serve C // G channels each, as
    explain() reports."""
    u, k = randn(gen, 3, 12, 77), randn(gen, 4, 50)
    assert rel_l2(mf.fftconv(u, k), reference(u, k.repeat_interleave(3, 0))) <= BUDGETS["fp32"]
    info = mf.explain(u, k)
    assert (info["groups"], info["group_size"]) == (4, 3)


# --------------------------------------------------------------------------- remembered decisions

def test_remembered_decisions_follow_everything_they_read(monkeypatch, gen):
    """Each call's checks and backend decision are remembered per call key; every input of a
    decision changes the next call of the same shapes: the precision argument, a precision()
    block (this thread's only), the module attribute, both environment variables, and bad
    inputs of the same shapes still raise."""
    import threading

    from monarch_fftconv.backends import BACKEND_ENV

    monkeypatch.delenv(policy.ENV_VAR, raising=False)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    u, k = randn(gen, 2, 3, 301), randn(gen, 3, 301)
    ref = reference(u, k)

    def error(**kwargs):
        return rel_l2(mf.fftconv(u, k, **kwargs), ref)

    exact, fp32 = error(), BUDGETS["fp32"]
    assert exact <= fp32 and error(precision="bf16") == exact  # torch.fft: fp32 whatever is asked
    monkeypatch.setenv(BACKEND_ENV, "portable")  # the engine: bf16 emulated from here on
    assert error() <= fp32 < error(precision="bf16") <= BUDGETS["bf16"]
    with mf.precision("bf16"):
        assert fp32 < error() <= BUDGETS["bf16"]
        elsewhere: list[float] = []
        thread = threading.Thread(target=lambda: elsewhere.append(error()))
        thread.start()
        thread.join()
        assert elsewhere[0] <= fp32  # the block is this thread's
    assert error() <= fp32
    monkeypatch.setenv(policy.ENV_VAR, "bf16")
    assert fp32 < error() <= BUDGETS["bf16"]
    monkeypatch.setenv(policy.ENV_VAR, "fp8")
    with pytest.raises(ValueError, match=policy.ENV_VAR):
        error()
    monkeypatch.delenv(policy.ENV_VAR)
    layer = mf.FFTConv(3, 301, precision="bf16")
    with torch.no_grad():
        layer.filter.copy_(k)
        assert fp32 < rel_l2(layer(u), ref) <= BUDGETS["bf16"]
        layer.precision = "fp32"
        assert rel_l2(layer(u), ref) <= fp32
        layer.precision = "bf17"
        with pytest.raises(ValueError, match="FFTConv.precision must be one of"):
            layer(u)
    monkeypatch.setenv(BACKEND_ENV, "cudnn")
    with pytest.raises(ValueError, match=BACKEND_ENV):
        error()
    monkeypatch.delenv(BACKEND_ENV)
    assert error() == exact
    both = torch.stack([k, k.flip(-1)], dim=1)
    mf.fftconv(u, both, bidirectional=True)
    with pytest.raises(TypeError, match=r"bidirectional must be a bool or a convention's name \('fftconv_ref', 'm2'\), got int"):
        mf.fftconv(u, both, bidirectional=1)  # 1 == True: the flag's type is part of the key
    with pytest.raises(TypeError, match="u must be a real floating-point tensor"):
        mf.fftconv(u.to(torch.int32), k)
    with pytest.raises(TypeError, match="u must be a torch.Tensor"):
        mf.fftconv(u.tolist(), k)
    with pytest.raises(ValueError, match="different devices"):
        mf.fftconv(u, k.to("meta"))
    with pytest.raises(ValueError, match=r"D must have shape \(3,\), got \(4,\)"):
        mf.fftconv(u, k, D=randn(gen, 4))
    with pytest.raises(ValueError, match="pregate must have u's shape"):
        mf.fftconv(u, k, pregate=randn(gen, 2, 3, 300))


def test_cpu_calls_and_their_gradients_are_exact(gen):
    """On CPU the output, under autograd and without, and the gradients, computed by the
    package's own backward, are within the fp32 budget of float64 torch.fft autograd: a filter
    shorter than L, odd sizes, grouped filters, with and without the other input requiring a
    gradient. A double backward is refused."""
    length, taps = 173, 61
    for groups in (5, 1):
        u = randn(gen, 3, 5, length).requires_grad_()
        k = randn(gen, groups, taps).requires_grad_()
        per_channel = k.repeat_interleave(5 // groups, 0)
        want_y = reference(u, per_channel)
        assert rel_l2(mf.fftconv(u, k), want_y) <= BUDGETS["fp32"]
        with torch.no_grad():
            assert rel_l2(mf.fftconv(u, k), want_y) <= BUDGETS["fp32"]
        g = randn(gen, 3, 5, length)
        want = torch.autograd.grad(reference(u, per_channel), (u, k), g.double())
        for inputs in ((u, k), (u,), (k,)):
            got = torch.autograd.grad(mf.fftconv(u, k), inputs, g)
            for have, wanted in zip(got, [want[0] if t is u else want[1] for t in inputs]):
                assert rel_l2(have, wanted) <= BUDGETS["fp32"]
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(mf.fftconv(u, k).square().sum(), (u,), create_graph=True)


# --------------------------------------------------------------------------- precision policy

def test_policy_resolution_order(monkeypatch):
    f32, bf16 = torch.float32, torch.bfloat16
    monkeypatch.delenv(policy.ENV_VAR, raising=False)
    assert policy.resolve(None, f32)[0] == "fp32"
    assert policy.resolve(None, bf16)[0] == "bf16"
    assert policy.resolve(None, torch.float16)[0] == "fp16"
    monkeypatch.setenv(policy.ENV_VAR, "tf32")
    assert policy.resolve(None, f32) == ("tf32", f"the {policy.ENV_VAR} environment variable")
    assert policy.resolve(None, f32, "fp16")[0] == "fp16"  # module attribute beats the env var
    with mf.precision("bf16"):
        assert policy.resolve(None, f32, "fp16")[0] == "bf16"  # context beats the module
        with mf.precision("fp32"):
            assert policy.resolve(None, f32)[0] == "fp32"  # innermost wins
        assert policy.resolve("tf32", f32)[0] == "tf32"  # the call argument beats everything
    assert policy.resolve(None, f32)[0] == "tf32"  # context restored
    monkeypatch.setenv(policy.ENV_VAR, "fp64")
    with pytest.raises(ValueError, match=policy.ENV_VAR):
        policy.resolve(None, f32)


def test_precision_flag_changes_the_result(portable_engine, gen):
    u, k = randn(gen, 2, 3, 1000), randn(gen, 3, 1000)
    ref = reference(u, k)
    exact = rel_l2(mf.fftconv(u, k), ref)
    with mf.precision("bf16"):
        coarse = rel_l2(mf.fftconv(u, k), ref)
    assert exact < 1e-5 < 1e-4 < coarse < BUDGETS["bf16"]


def test_explain_says_where_and_why(monkeypatch):
    monkeypatch.delenv(policy.ENV_VAR, raising=False)
    u, k = torch.randn(2, 3, 8192), torch.randn(3, 8192)
    info = mf.explain(u, k)
    assert info["backend"] == "torch.fft" and info["precision"] == "fp32"
    assert info["fft_size"] == 16384 and info["factors"] == (128, 128)
    assert "default" in info["precision_source"] and "cpu" in info["reason"]
    assert info["flops"] > 0
    with mf.precision("bf16"):
        assert mf.explain(u, k)["precision_source"].startswith("the monarch_fftconv.precision")
    assert mf.explain(u.bfloat16(), k)["precision"] == "bf16"
    with pytest.raises(ValueError):
        mf.explain(u, k, precision="nope")


def test_explain_names_the_arithmetic_beside_the_flag(monkeypatch):
    """float64 input under the default "fp32" flag computes in fp64 on torch.fft: explain()
    says both, and the portable engine names its emulated operands."""
    from monarch_fftconv.backends import BACKEND_ENV

    monkeypatch.delenv(policy.ENV_VAR, raising=False)
    u, k = torch.randn(2, 3, 500, dtype=torch.float64), torch.randn(3, 500, dtype=torch.float64)
    info = mf.explain(u, k)
    assert (info["precision"], info["arithmetic"]) == ("fp32", "fp64") and "fp64" in info["kernel"]
    assert mf.explain(u.float(), k.float(), precision="bf16")["arithmetic"] == "fp32"
    monkeypatch.setenv(BACKEND_ENV, "portable")
    assert mf.explain(u.float(), k.float(), precision="bf16")["arithmetic"] == "bf16 operands emulated, fp32 accumulation"
    assert mf.explain(u, k)["arithmetic"] == "fp64"


def test_cpu_calls_take_torch_fft_and_the_engine_on_request(monkeypatch, gen):
    """CPU calls run torch.fft (the plain model's FFTs: tests/test_docs.py), whatever the
    precision: it is at least as accurate. MONARCH_FFTCONV_BACKEND=portable runs the
    emulating engine instead, read at call time."""
    from monarch_fftconv.backends import BACKEND_ENV

    u, k = randn(gen, 2, 3, 3000), randn(gen, 3, 3000)
    ref = reference(u, k)
    for precision in mf.PRECISIONS:
        assert mf.explain(u, k, precision=precision)["backend"] == "torch.fft"
        assert rel_l2(mf.fftconv(u, k, precision=precision), ref) <= BUDGETS["fp32"]
    monkeypatch.setenv(BACKEND_ENV, "portable")
    info = mf.explain(u, k, precision="bf16")
    assert info["backend"] == "portable" and BACKEND_ENV in info["reason"]
    assert BUDGETS["fp32"] < rel_l2(mf.fftconv(u, k, precision="bf16"), ref) <= BUDGETS["bf16"]
    monkeypatch.setenv(BACKEND_ENV, "cudnn")
    with pytest.raises(ValueError, match=BACKEND_ENV):
        mf.fftconv(u, k)


def test_portable_on_cuda_loads_the_extension(monkeypatch):
    """MONARCH_FFTCONV_BACKEND=portable on a CUDA tensor runs the ops' CUDA implementations,
    which exist only once the extension is loaded: the decision loads it (explain() never
    does), and says why when it can't, instead of the dispatcher's NotImplementedError."""
    from monarch_fftconv import _extension, backends
    from monarch_fftconv.planner import plan_for

    
    asked: list[bool] = []
    answer: object = "no CUDA device"

    def coverage(build: bool = True):
        asked.append(build)
        return answer

    monkeypatch.setattr(_extension, "coverage", coverage)
    cuda, plan = torch.device("cuda", 0), plan_for(4096)
    with pytest.raises(RuntimeError, match="portable.*unavailable: no CUDA device"):
        backends._decide(cuda, torch.float32, "bf16", plan, False, True, "portable")
    assert asked == [True]
    answer = object()  # a loaded extension's coverage
    assert backends._decide(cuda, torch.float32, "bf16", plan, False, True, "portable").name == "portable"
    assert backends._decide(cuda, torch.float32, "bf16", plan, False, False, "portable").name == "portable"
    assert backends._decide(torch.device("cpu"), torch.float32, "bf16", plan, False, True, "portable").name == "portable"
    assert asked == [True, True]  # neither explain() (build=False) nor a CPU call loads it


def test_precision_context_is_thread_local(monkeypatch):
    """A precision() block in one thread does not change calls in another, as PyTorch's own
    modes (autocast, no_grad) are thread-local."""
    import threading

    monkeypatch.delenv(policy.ENV_VAR, raising=False)
    inside, entered, leave = [], threading.Event(), threading.Event()

    def holder():
        with mf.precision("bf16"):
            inside.append(policy.resolve(None, torch.float32)[0])
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert entered.wait(10)
        assert policy.resolve(None, torch.float32)[0] == "fp32"  # this thread: untouched
        with mf.precision("tf32"):
            assert policy.resolve(None, torch.float32)[0] == "tf32"
    finally:
        leave.set()
        thread.join()
    assert inside == ["bf16"]


@pytest.mark.parametrize("shape", [(3, 500), (2, 2, 3, 500), (1, 3, 500)])
def test_unbatched_and_extra_leading_dims(shape, gen):
    """(C, L) and (..., C, L) inputs, as the plain torch.fft model accepts them."""
    u, k, D = randn(gen, *shape), randn(gen, 3, 400), randn(gen, 3)
    y = mf.fftconv(u, k, D=D)
    assert y.shape == u.shape
    flat = u.reshape(-1, 3, 500)
    assert rel_l2(y.reshape(-1, 3, 500), reference(flat, k, D)) <= BUDGETS["fp32"]


def test_empty_batch_gives_an_empty_result(gen):
    """A batch of zero sequences returns an empty y of u's shape and dtype, and zero
    gradients for k and D."""
    u = torch.zeros(0, 3, 100, dtype=torch.bfloat16, requires_grad=True)
    k, D = randn(gen, 3, 50).requires_grad_(), randn(gen, 3).requires_grad_()
    y = mf.fftconv(u, k, D=D)
    assert y.shape == u.shape and y.dtype == u.dtype
    y.sum().backward()
    assert u.grad.shape == u.shape and torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(D.grad, torch.zeros_like(D))
    assert mf.fftconv(torch.zeros(2, 0, 3, 100), k).shape == (2, 0, 3, 100)


@pytest.mark.parametrize("engine", ["auto", "portable"])
def test_nan_in_the_filter_stays_in_its_channel(engine, monkeypatch, gen):
    """A NaN or Inf in one channel's filter makes that channel's outputs non-finite (the FFT
    spreads it over the channel) and leaves every other channel bitwise unchanged."""
    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", engine)
    u, k = randn(gen, 2, 4, 300), randn(gen, 4, 300)
    clean = mf.fftconv(u, k)
    k[1, 5], k[3, 0] = float("nan"), float("inf")
    dirty = mf.fftconv(u, k)
    assert not torch.isfinite(dirty[:, 1]).any() and not torch.isfinite(dirty[:, 3]).any()
    assert torch.equal(dirty[:, [0, 2]], clean[:, [0, 2]])


@pytest.mark.parametrize("engine", ["auto", "portable"])
@pytest.mark.parametrize("filter_dtype", [torch.float32, torch.bfloat16])
def test_float64_input_computes_in_float64_whatever_the_filter(engine, filter_dtype, monkeypatch, gen):
    """float64 u (or a float64 pregate) with a narrower filter: the convolution, its spectrum
    included, runs in float64 (it ran in the filter's float32 and was 1e-7 off); k's gradient
    keeps k's dtype."""
    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", engine)
    u = randn(gen, 2, 3, 301, dtype=torch.float64)
    k = randn(gen, 3, 157).to(filter_dtype).requires_grad_()
    y = mf.fftconv(u, k)
    assert y.dtype == torch.float64
    assert rel_l2(y, reference(u, k.detach())) < 1e-12
    y.sum().backward()
    assert k.grad.dtype == filter_dtype
    layer = mf.FFTConv(3, 301).to(filter_dtype)
    with torch.no_grad():
        assert rel_l2(layer(u), reference(u, layer.filter)) < 1e-12
        with mf.inference_cache(layer):
            assert rel_l2(layer(u), reference(u, layer.filter)) < 1e-12
    gate = randn(gen, 2, 3, 301, dtype=torch.float64)
    x = u.float()
    y = mf.fftconv(x, k.detach(), pregate=gate)  # x·gate is float64: so is the convolution; y is x's float32
    assert rel_l2(y, reference(x.double() * gate, k.detach())) < 1e-7


@pytest.mark.parametrize("argument", [{"precision": ["fp32"]}, {"bidirectional": [True]}, {"precision": {"bf16": 1}}])
def test_an_unhashable_flag_gets_the_checks_message(argument, gen):
    """The decisions' memo hashes the call's flags: an unhashable one is named by the checks,
    as explain() names it, not a TypeError from the memo."""
    u, k = randn(gen, 2, 3, 40), randn(gen, 3, 40)
    for call in (mf.fftconv, mf.explain):
        with pytest.raises((ValueError, TypeError), match="(precision|bidirectional) must be"):
            call(u, k, **argument)


@pytest.mark.parametrize("engine", ["auto", "portable"])
@pytest.mark.parametrize("bidirectional", [False, "fftconv_ref"])
def test_forward_mode_ad_and_torch_func_transforms(engine, bidirectional, monkeypatch, gen):
    """torch.func.jvp and autograd's forward_ad give the exact tangent (the convolution is
    bilinear: conv(du, k) + conv(u, dk), plus the D and gate terms), vmap over the filters and
    torch.func.grad give what a loop and autograd give. The package's ops define a backward
    alone, and PyTorch dropped the tangent through them without a word (a zero JVP)."""
    from torch.autograd import forward_ad

    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", engine)
    B, C, L, Lk = 2, 3, 45, 29
    u, gate = randn(gen, B, C, L, dtype=torch.float64), randn(gen, B, C, L, dtype=torch.float64)
    D = randn(gen, C, dtype=torch.float64)
    k = randn(gen, C, 2, Lk, dtype=torch.float64) if bidirectional else randn(gen, C, Lk, dtype=torch.float64)
    du, dk, dD = torch.randn_like(u), torch.randn_like(k), torch.randn_like(D)

    def ref(u, k, D):  # float64 torch.fft: causal taps at lag s, reverse taps at lag -s
        n = 2 * L
        circle = torch.zeros(C, n, dtype=torch.float64)
        causal = k[:, 0] if bidirectional else k
        circle[:, :Lk] += causal
        if bidirectional:
            circle[:, 0] += k[:, 1, 0]
            circle[:, n - Lk + 1:] += k[:, 1, 1:].flip(-1)
        y = torch.fft.irfft(torch.fft.rfft(u * gate, n=n) * torch.fft.rfft(circle, n=n), n=n)[..., :L]
        return (y + D.unsqueeze(-1) * u * gate) * gate

    def call(u, k, D):
        return mf.fftconv(u, k, D=D, pregate=gate, postgate=gate, bidirectional=bidirectional)

    want = ref(du, k, D) + ref(u, dk, 0 * D) + ref(u, 0 * k, dD)  # bilinear in (u, k) and in (u, D)
    _, tangent = torch.func.jvp(call, (u, k, D), (du, dk, dD))
    assert rel_l2(tangent, want) < 1e-12
    with forward_ad.dual_level():
        dual = call(forward_ad.make_dual(u, du), forward_ad.make_dual(k.clone().requires_grad_(), dk),
                    forward_ad.make_dual(D, dD))
        assert rel_l2(forward_ad.unpack_dual(dual).tangent, want) < 1e-12
    filters = torch.stack([k, dk])
    batched = torch.func.vmap(lambda kk: call(u, kk, D))(filters)
    assert rel_l2(batched, torch.stack([ref(u, k, D), ref(u, dk, D)])) < 1e-12
    weights = torch.randn_like(u)
    grad = torch.func.grad(lambda kk: (call(u, kk, D) * weights).sum())(k)
    leaf = k.clone().requires_grad_()
    (call(u, leaf, D) * weights).sum().backward()
    assert rel_l2(grad, leaf.grad) < 1e-12

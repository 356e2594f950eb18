"""Generation by prefill and step (monarch_fftconv/generation.py, issue #38) against the
whole-sequence convolution: helpers.reference (float64 torch.fft, no package code) for the
functional form and FFTConv, HyenaOperator.forward for the operator."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import generation
from monarch_fftconv.nn import HyenaOperator
from monarch_fftconv.policy import ERROR_BUDGETS

from helpers import randn, reference, rel_l2, run_python

FP64_TOLERANCE = 1e-10  # relative L2 of the generated positions; measured ~5e-16


def per_channel(k: torch.Tensor, channels: int) -> torch.Tensor:
    """G filters repeated over their groups of C // G channels."""
    return k.repeat_interleave(channels // k.shape[0], dim=0)


def generate(x: torch.Tensor, k: torch.Tensor, prompt_len: int, max_len: int | None = None):
    """The prompt's outputs from prefill, then one step per remaining position of x."""
    y, state = generation.prefill(x[..., :prompt_len], k, max_len or x.shape[-1])
    steps = [generation.step(x[..., t], state)[0] for t in range(prompt_len, x.shape[-1])]
    return torch.cat([y, *(s.unsqueeze(-1) for s in steps)], dim=-1), state


def reference_full(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The whole-sequence causal convolution, the filter zero-padded to the sequence."""
    padded = torch.nn.functional.pad(k.double(), (0, x.shape[-1] - k.shape[-1]))
    return reference(x, per_channel(padded, x.shape[-2]))


@pytest.mark.parametrize("batch, channels, groups, length, prompt_len", [
    (2, 3, 3, 97, 0), (1, 4, 2, 130, 1), (3, 5, 5, 301, 37), (2, 6, 1, 64, 63), (1, 2, 2, 50, 50), (2, 4, 4, 1, 0),
])
def test_steps_match_the_whole_sequence_fp64(gen, batch, channels, groups, length, prompt_len):
    x, k = randn(gen, batch, channels, length, dtype=torch.float64), randn(gen, groups, length, dtype=torch.float64)
    out, _ = generate(x, k, prompt_len)
    ref = reference_full(x, k)
    assert out.shape == ref.shape and out.dtype == torch.float64
    assert rel_l2(out[..., prompt_len:], ref[..., prompt_len:]) < FP64_TOLERANCE or prompt_len == length
    assert rel_l2(out, ref) < FP64_TOLERANCE


def test_all_the_way_at_4096_and_every_position_exact(gen):
    """From an empty prompt through every level of blocks (up to 2048), each position on its own."""
    length = 4096
    x, k = randn(gen, 2, 3, length, dtype=torch.float64), randn(gen, 3, length, dtype=torch.float64)
    out, state = generate(x, k, 0)
    ref = reference_full(x, k)
    error = (out - ref).abs().amax(dim=(0, 1)) / ref.abs().amax(dim=(0, 1))
    assert error.max() < FP64_TOLERANCE
    assert state.position == length


def test_long_prompt_then_the_tail_at_2_pow_16(gen):
    length, prompt_len = 1 << 16, (1 << 16) - 777
    x, k = randn(gen, 1, 2, length, dtype=torch.float64), randn(gen, 2, length, dtype=torch.float64)
    out, _ = generate(x, k, prompt_len)
    ref = reference_full(x, k)
    assert rel_l2(out[..., prompt_len:], ref[..., prompt_len:]) < FP64_TOLERANCE


@pytest.mark.parametrize("filter_len", [1, 10, 129])
@pytest.mark.parametrize("prompt_len", [0, 1, 33])
def test_filters_shorter_than_the_sequence(gen, filter_len, prompt_len):
    x, k = randn(gen, 2, 4, 300, dtype=torch.float64), randn(gen, 2, filter_len, dtype=torch.float64)
    out, _ = generate(x, k, prompt_len)
    assert rel_l2(out, reference_full(x, k)) < FP64_TOLERANCE


def test_max_len_beyond_the_steps_taken(gen):
    """A stream prefilled for 1000 positions, stepped to 600: the outputs so far are exact."""
    x, k = randn(gen, 1, 3, 600, dtype=torch.float64), randn(gen, 3, 1000, dtype=torch.float64)
    out, state = generate(x, k, 17, max_len=1000)
    assert rel_l2(out, reference_full(x, k[:, :600])) < FP64_TOLERANCE
    assert state.position == 600


def test_float32_within_the_fp32_budget(gen):
    x, k = randn(gen, 2, 8, 2049), randn(gen, 8, 2049)
    out, _ = generate(x, k, 100)
    assert out.dtype == torch.float32
    assert rel_l2(out, reference_full(x, k)) < ERROR_BUDGETS["fp32"]


def test_two_runs_are_bitwise_identical(gen):
    x, k = randn(gen, 2, 5, 700), randn(gen, 5, 700)
    first, _ = generate(x, k, 3)
    second, _ = generate(x.clone(), k.clone(), 3)
    assert torch.equal(first, second)


@pytest.mark.parametrize("groups", [1, 3, 6])
def test_fftconv_layer_with_grouped_filters(gen, groups):
    layer = mf.FFTConv(6, 200, groups=groups, dtype=torch.float64)
    x = randn(gen, 2, 6, 150, dtype=torch.float64)
    y, state = layer.prefill(x[..., :41], max_len=150)
    assert torch.equal(y, layer(x[..., :41]))  # the ordinary call
    steps = [layer.step(x[..., t], state)[0] for t in range(41, 150)]
    out = torch.cat([y, torch.stack(steps, dim=-1)], dim=-1)
    with torch.no_grad():
        assert rel_l2(out, reference_full(x, layer.filter[:, :150])) < FP64_TOLERANCE


def test_inference_mode_gives_the_same_outputs(gen):
    layer = mf.FFTConv(4, 256)
    x = randn(gen, 3, 4, 256)
    with torch.no_grad():
        y, state = layer.prefill(x[..., :10], 256)
        expected = [layer.step(x[..., t], state)[0] for t in range(10, 256)]
    with torch.inference_mode():
        y_inf, state = layer.prefill(x[..., :10], 256)
        got = [layer.step(x[..., t], state)[0] for t in range(10, 255)]
    with pytest.raises(RuntimeError, match="inference_mode"):
        layer.step(x[..., 255], state)  # stepped outside: refused before it touches the state
    with torch.inference_mode():
        got.append(layer.step(x[..., 255], state)[0])
    assert torch.equal(y, y_inf) and all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_state_grows_with_the_tokens_to_generate_not_the_prompt(gen):
    k = randn(gen, 4, 4096)
    short_prompt = generation.prefill(randn(gen, 1, 4, 96), k, 4096)[1]
    long_prompt = generation.prefill(randn(gen, 1, 4, 4000), k, 4096)[1]
    assert long_prompt.nbytes * 20 < short_prompt.nbytes
    assert short_prompt.nbytes < 4 * (3 * 4000 + 4 * 4000 + 100) * 4  # B·C·3T + G·(4T + 85) fp32 numbers


def test_errors(gen):
    layer = mf.FFTConv(3, 64)
    x = randn(gen, 2, 3, 64)
    _, state = layer.prefill(x[..., :62], max_len=64)
    with pytest.raises(ValueError, match="shape"):
        layer.step(x[0, :, 0], state)
    with pytest.raises(ValueError, match="float32"):
        layer.step(x[..., 62].double(), state)
    with pytest.raises(ValueError, match="cpu"):
        layer.step(x[..., 62].to("meta"), state)
    layer.step(x[..., 62], state)
    layer.step(x[..., 63], state)
    with pytest.raises(RuntimeError, match="max_len=64"):
        layer.step(x[..., 63], state)
    with pytest.raises(ValueError, match="longer than max_len"):
        layer.prefill(x, max_len=32)
    with pytest.raises(ValueError, match="seq_len|longest"):
        layer.prefill(x, max_len=65)
    with pytest.raises(ValueError, match="channels"):
        layer.prefill(x[:, :2], max_len=64)
    with pytest.raises(ValueError, match="cannot be generated causally"):
        mf.FFTConv(3, 64, bidirectional=True).prefill(x, max_len=64)
    with pytest.raises(ValueError, match="cannot be generated causally"):
        generation.prefill(x, randn(gen, 3, 2, 64), 64)
    with pytest.raises(ValueError, match="cannot be generated causally"):
        HyenaOperator(4, 32, bidirectional=True).prefill(randn(gen, 1, 3, 4), max_len=32)


def test_a_filter_change_after_prefill_is_refused(gen):
    layer = mf.FFTConv(3, 64)
    x = randn(gen, 1, 3, 64)
    _, state = layer.prefill(x[..., :5], max_len=64)
    layer.step(x[..., 5], state)
    with torch.no_grad():
        layer.filter.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        layer.step(x[..., 6], state)
    _, state = layer.prefill(x[..., :5], max_len=64)
    layer.filter = torch.nn.Parameter(layer.filter.detach().clone())
    with pytest.raises(RuntimeError, match="replaced"):
        layer.step(x[..., 5], state)


def _swap_in_a_new_filter(layer):
    torch.utils.swap_tensors(layer.filter, torch.nn.Parameter(torch.randn_like(layer.filter)))


@pytest.mark.parametrize("change", [
    lambda layer: layer.double(),           # `.data` assigned a converted copy: same tensor object
    lambda layer: layer.half(),
    lambda layer: setattr(layer.filter, "data", layer.filter.detach().clone()),
    _swap_in_a_new_filter,                  # the same Python object, another tensor behind it
])
def test_a_filter_moved_without_a_version_bump_is_refused(gen, change):
    """Changes that keep the Parameter object and bump no version counter still move the values
    (their address, dtype): the watch sees them, where it saw identity and version only."""
    layer = mf.FFTConv(3, 64)
    x = randn(gen, 1, 3, 64)
    _, state = layer.prefill(x[..., :5], max_len=64)
    layer.step(x[..., 5], state)
    change(layer)
    with pytest.raises(RuntimeError, match="replaced"):
        layer.step(x[..., 6].to(layer.filter.dtype), state)


def test_steps_after_an_unseen_write_keep_the_prefill_filter(gen):
    """An in-place write through `.data` bumps no version counter and moves nothing: the watch
    cannot see it, and step goes on with the filter as it was at prefill (the state holds its
    blocks, not the live filter): the positions are the prefill filter's convolution."""
    layer = mf.FFTConv(3, 64).double()
    x = randn(gen, 2, 3, 64, dtype=torch.float64)
    before = layer.filter.detach().clone()
    with torch.no_grad():
        _, state = layer.prefill(x[..., :7], max_len=64)
        layer.filter.data.mul_(-2)
        steps = torch.stack([layer.step(x[..., t], state)[0] for t in range(7, 64)], dim=-1)
    assert rel_l2(steps, reference(x, before)[..., 7:]) < FP64_TOLERANCE


@pytest.mark.parametrize("make", [
    lambda params: torch.optim.SGD(params, lr=0.5, fused=True),
    lambda params: torch.optim.Adam(params, fused=True),
    lambda params: torch.optim.AdamW(params, foreach=False),
])
def test_an_optimizer_step_after_prefill_is_refused(gen, make):
    """torch's fused optimizer steps bump no version counter: a step hook marks the states
    whose parameters an optimizer stepped (those with a gradient), for FFTConv and for a
    HyenaOperator; an optimizer over other parameters, or over these without gradients, is
    no change."""
    layer, other = mf.FFTConv(3, 64), mf.FFTConv(3, 64)
    x = randn(gen, 1, 3, 64)
    _, state = layer.prefill(x[..., :5], max_len=64)
    optimizer = make([*layer.parameters(), *other.parameters()])
    other.filter.grad = torch.randn_like(other.filter)
    optimizer.step()  # layer.filter has no gradient: not stepped
    layer.step(x[..., 5], state)
    layer.filter.grad = torch.randn_like(layer.filter)
    optimizer.step()
    with pytest.raises(RuntimeError, match="an optimizer stepped"):
        layer.step(x[..., 6], state)
    op = HyenaOperator(4, 32, filter_order=8)
    xh = randn(gen, 2, 32, 4)
    with torch.no_grad():
        _, hstate = op.prefill(xh[:, :10], max_len=32)
    for p in op.parameters():
        p.grad = torch.randn_like(p)
    make(list(op.out_proj.parameters())).step()
    with pytest.raises(RuntimeError, match="an optimizer stepped"):
        op.step(xh[:, 10], hstate)


def test_a_parametrized_filter_steps_and_its_change_is_refused(gen):
    """Under torch.nn.utils.parametrize each read of `filter` computes a new tensor: the watch
    follows the originals it is computed from (it refused every step before)."""
    layer = mf.FFTConv(3, 64).double()
    torch.nn.utils.parametrize.register_parametrization(layer, "filter", _Scaled())
    x = randn(gen, 2, 3, 64, dtype=torch.float64)
    with torch.no_grad():
        ref = layer(x)
        y, state = layer.prefill(x[..., :9], max_len=64)
        steps = [layer.step(x[..., t], state)[0] for t in range(9, 40)]
        assert rel_l2(torch.stack(steps, -1), ref[..., 9:40]) < FP64_TOLERANCE
        layer.parametrizations["filter"].original.mul_(3)
        with pytest.raises(RuntimeError, match="modified in place"):
            layer.step(x[..., 40], state)


class _Scaled(torch.nn.Module):
    def forward(self, k):
        return 0.5 * k


# --------------------------------------------------------------------------- HyenaOperator

class Stack(torch.nn.Module):
    """Residual Hyena blocks, as a language model stacks them."""

    def __init__(self, width, length, depth, **options):
        super().__init__()
        self.blocks = torch.nn.ModuleList(HyenaOperator(width, length, **options) for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x

    def prefill(self, x, max_len):
        states = []
        for block in self.blocks:
            y, state = block.prefill(x, max_len)
            x = x + y
            states.append(state)
        return x, states

    def step(self, x_t, states):
        for block, state in zip(self.blocks, states):
            x_t = x_t + block.step(x_t, state)[0]
        return x_t


@pytest.mark.parametrize("order, groups, prompt_len, short", [(2, None, 0, 3), (3, 2, 1, 3), (2, 4, 23, 4), (4, None, 9, 1)])
def test_hyena_stack_generates_its_forward(gen, order, groups, prompt_len, short):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    length = 70
    stack = Stack(8, 80, 2, order=order, filter_groups=groups, filter_order=16, short_filter_order=short).double()
    x = randn(gen, 2, length, 8, dtype=torch.float64)
    with torch.no_grad():
        ref = stack(x)
        y, states = stack.prefill(x[:, :prompt_len], max_len=length)
        if prompt_len:
            assert torch.equal(y, stack(x[:, :prompt_len]))  # the prompt: forward's own computation
        steps = [stack.step(x[:, t], states) for t in range(prompt_len, length)]
    out = torch.cat([y, torch.stack(steps, dim=1)], dim=1)
    assert rel_l2(out, ref) < FP64_TOLERANCE


def test_hyena_float32_and_inference_mode(gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    op = HyenaOperator(16, 300, order=2)
    x = randn(gen, 3, 257, 16)
    with torch.inference_mode():
        ref = op(x)
        y, state = op.prefill(x[:, :100], max_len=257)
        steps = [op.step(x[:, t], state)[0] for t in range(100, 257)]
    out = torch.cat([y, torch.stack(steps, dim=1)], dim=1)
    assert rel_l2(out, ref) < ERROR_BUDGETS["fp32"]
    assert state.nbytes > 0


def test_hyena_errors_and_parameter_changes(gen):
    op = HyenaOperator(4, 32)
    x = randn(gen, 2, 32, 4)
    with pytest.raises(ValueError, match="l_max|longest"):
        op.prefill(x, max_len=33)
    with pytest.raises(ValueError, match="longer than max_len"):
        op.prefill(x, max_len=16)
    _, state = op.prefill(x[:, :30], max_len=32)
    with pytest.raises(ValueError, match="shape"):
        op.step(x[:, 30, :3], state)
    with pytest.raises(ValueError, match="float32"):
        op.step(x[:, 30].double(), state)
    op.step(x[:, 30], state)
    with torch.no_grad():
        op.filter_fn.implicit_filter[0].weight.add_(1)
    with pytest.raises(RuntimeError, match="modified in place"):
        op.step(x[:, 31], state)
    _, state = op.prefill(x[:, :30], max_len=32)
    op.step(x[:, 30], state)
    op.step(x[:, 31], state)
    with pytest.raises(RuntimeError, match="max_len=32"):
        op.step(x[:, 31], state)


@pytest.mark.parametrize("change, message", [
    (lambda op: setattr(op.filter_fn.modulation, "shift", op.filter_fn.modulation.shift + 0.5), "plain attribute"),
    (lambda op: setattr(op.filter_fn.modulation, "modulate", not op.filter_fn.modulation.modulate), "plain attribute"),
    (lambda op: setattr(op.filter_fn, "use_bias", not op.filter_fn.use_bias), "plain attribute"),
    (lambda op: op.half(), "replaced"),
])
def test_hyena_changes_no_version_counter_sees_are_refused(gen, change, message):
    """A setting that shapes the long filters (a plain attribute) or a dtype conversion (same
    objects, values moved) after prefill: step refuses, where it went on with a stale filter."""
    op = HyenaOperator(4, 32, filter_order=8)
    x = randn(gen, 2, 32, 4)
    with torch.no_grad():
        _, state = op.prefill(x[:, :10], max_len=32)
        op.step(x[:, 10], state)
        change(op)
        with pytest.raises(RuntimeError, match=message):
            op.step(x[:, 11].to(op.in_proj.weight.dtype), state)
        op.train(not op.training)  # train/eval is no setting of the step's: it steps on after a new prefill
        _, state = op.prefill(x[:, :10].to(op.in_proj.weight.dtype), max_len=32)
        op.eval()
        op.step(x[:, 10].to(op.in_proj.weight.dtype), state)


# --------------------------------------------------------------------------- the indexed (CUDA-graph) step

def step_indexed(x_t: torch.Tensor, state: generation.ConvState, indexed) -> torch.Tensor:
    """What a graph replay does, run eagerly: x_t into the static input, the indexed step of
    this position's level, y_t from the output history."""
    i = state.position - state.prompt_len
    indexed.x.copy_(x_t)
    indexed.indexed_step(state, generation._fold_level(i, state.inputs.shape[-1]))
    state.position += 1
    return indexed.outputs[i]


@pytest.mark.parametrize("groups, length, prompt_len, dtype", [(3, 97, 0, torch.float64), (1, 300, 37, torch.float64),
                                                               (2, 2049, 1, torch.float32), (4, 64, 63, torch.float32)])
def test_the_indexed_step_is_the_eager_step_bit_for_bit(gen, middle_levels_on_ffts, groups, length, prompt_len, dtype):
    """The graphs' step, every offset a device index and one code path per level, run eagerly
    on the CPU: the same outputs and the same state as `step`, bit for bit, through Toeplitz
    and FFT levels; each position's y_t a row of the history that later steps leave alone."""
    x, k = randn(gen, 2, 12, length, dtype=dtype), randn(gen, groups, length, dtype=dtype)
    _, eager = generation.prefill(x[..., :prompt_len], k, length)
    _, indexed_state = generation.prefill(x[..., :prompt_len], k, length)
    indexed = generation._GraphedSteps.indexed(indexed_state)
    firsts = []
    for t in range(prompt_len, length):
        want = generation.step(x[..., t], eager)[0]
        got = step_indexed(x[..., t], indexed_state, indexed)
        assert torch.equal(got, want), t
        firsts.append((got, want.clone()))
    assert all(torch.equal(got, want) for got, want in firsts)  # views of the history: not overwritten
    assert int(indexed.index) == length - prompt_len
    for name in ("inputs", "pending"):
        assert torch.equal(getattr(indexed_state, name), getattr(eager, name)), name


@pytest.mark.parametrize("batch, budget_rows", [(5, 1), (7, 3)])
def test_large_levels_run_in_batch_chunks_with_the_same_outputs(gen, monkeypatch, middle_levels_on_ffts, batch, budget_rows):
    """With BLOCK_CHUNK_BYTES holding budget_rows batch rows of the largest level's spectrum, the
    FFT levels' blocks run in chunks of rows (the last one shorter: odd batches), eager and
    indexed steps alike, and generate what one block of every row gives, against the float64
    whole sequence; the Toeplitz levels stay whole."""
    channels, length, prompt_len = 6, 600, 9
    x, k = randn(gen, batch, channels, length, dtype=torch.float64), randn(gen, 2, length, dtype=torch.float64)
    whole, _ = generate(x, k, prompt_len)
    largest = (length - prompt_len - 1).bit_length() - 1
    row_bytes = channels * ((1 << largest) + 1) * 2 * 8
    monkeypatch.setattr(generation, "BLOCK_CHUNK_BYTES", budget_rows * row_bytes)
    blocks = []
    contribution = generation._block_contribution
    monkeypatch.setattr(generation, "_block_contribution",
                        lambda state, q, block: (blocks.append((q, block.shape[0])), contribution(state, q, block))[1])
    chunked, state = generate(x, k, prompt_len)
    assert rel_l2(chunked, reference_full(x, k)) < FP64_TOLERANCE
    assert torch.allclose(chunked, whole, rtol=0, atol=1e-12 * whole.abs().max().item())
    fft_levels = {q for q, _ in blocks if q >= len(state.toeplitz)}
    assert largest in fft_levels
    assert {rows for q, rows in blocks if q == largest} == {budget_rows, batch % budget_rows or budget_rows}
    assert {rows for q, rows in blocks if q < len(state.toeplitz)} == {batch}
    # the graphs' indexed step, run eagerly, chunks the same way and stays the eager step bit for bit
    _, eager = generation.prefill(x[..., :prompt_len], k, length)
    _, indexed_state = generation.prefill(x[..., :prompt_len], k, length)
    indexed = generation._GraphedSteps.indexed(indexed_state)
    blocks.clear()
    for t in range(prompt_len, length):
        assert torch.equal(step_indexed(x[..., t], indexed_state, indexed), generation.step(x[..., t], eager)[0]), t
    assert {rows for q, rows in blocks if q == largest} == {budget_rows, batch % budget_rows or budget_rows}


def test_graphed_step_replays_the_level_of_each_position(gen, simulated_graphs, middle_levels_on_ffts):
    """`step` on a graphed state (simulated graphs, the fixture): each position replays its own
    level's graph (a wrong choice changes the sums), y_t is cast back to a 2-byte x_t's dtype,
    and the results are the eager steps', bit for bit."""
    length, prompt_len = 300, 5
    x, k = randn(gen, 2, 6, length).to(torch.bfloat16), randn(gen, 3, length)
    _, eager = generation.prefill(x[..., :prompt_len], k, length)
    _, state = generation.prefill(x[..., :prompt_len], k, length, cuda_graph=True)
    for t in range(prompt_len, length):
        want = generation.step(x[..., t], eager)[0]
        got = generation.step(x[..., t], state)[0]
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), t
    assert state.nbytes > eager.nbytes
    with pytest.raises(RuntimeError, match="the stream is full"):
        generation.step(x[..., -1], state)


@pytest.mark.parametrize("order, groups, prompt_len, short", [(2, None, 0, 3), (3, 2, 7, 4)])
def test_graphed_hyena_step_is_the_eager_step(gen, simulated_graphs, middle_levels_on_ffts, order, groups, prompt_len, short):
    """`HyenaOperator.step` on a graphed state (simulated graphs, the fixture): the graph of each
    level runs the projections, the short filter's ring slot from the device index, gates,
    every long convolution's indexed step and D; the eager steps' outputs and states, bit for
    bit. A parameter's storage swapped under the graphs is refused."""
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    length = 150
    op = HyenaOperator(8, 160, order=order, filter_groups=groups, filter_order=16, short_filter_order=short)
    x = randn(gen, 2, length, 8)
    with torch.no_grad():
        _, eager = op.prefill(x[:, :prompt_len], max_len=length)
        _, state = op.prefill(x[:, :prompt_len], max_len=length, cuda_graph=True)
        for t in range(prompt_len, length):
            want, _ = op.step(x[:, t], eager)
            got, _ = op.step(x[:, t], state)
            assert torch.equal(got, want), t
    assert state.position == eager.position == length and all(c.position == length for c in state.convs)
    assert torch.equal(state.window, eager.window)
    assert all(torch.equal(a.pending, b.pending) for a, b in zip(state.convs, eager.convs))
    state.position -= 1  # room for one more step: a parameter's storage swapped under the graphs is refused
    op.out_proj.weight.data = op.out_proj.weight.data.clone()
    with pytest.raises(RuntimeError, match="replaced since prefill"):
        op.step(x[:, -1], state)


@pytest.fixture
def middle_levels_on_ffts(monkeypatch):
    """The graphs' middle levels (n = 16 .. 256) on two FFTs, as the eager steps fold them: the
    graphed and eager steps are then the same ops, which the bit-for-bit tests compare. With
    MID_LEVELS_IN_KERNEL (the default) the graphs sum those blocks directly, within round-off of
    the FFTs: test_graphed_steps_with_middle_levels_as_blocks and, on a GPU,
    test_cuda_graph_steps_with_middle_levels_in_the_kernel."""
    monkeypatch.setattr(generation, "MID_LEVELS_IN_KERNEL", False)


@pytest.fixture
def simulated_graphs(monkeypatch):
    """torch.cuda's graph machinery stood in for on the CPU: a capture records the indexed steps
    it is given (nothing runs) and a replay runs them, so prefill(cuda_graph=True) runs its
    real warm-up, capture order, clearing and prompt sums, and step its real level choice."""
    import contextlib

    capturing = []

    class Graph:
        def __init__(self):
            self.calls = []

        def replay(self):
            for method, args in self.calls:
                method(*args)

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, capture_error_mode=None):
        capturing.append(g)
        try:
            yield
        finally:
            capturing.pop()

    def recorded(method):
        def wrapper(*args):
            if capturing:
                capturing[-1].calls.append((method, args))
                return None
            return method(*args)
        return wrapper

    class Stream:
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, other):
            pass

    class Plans:
        max_size, size = 4096, 1

    for cls in (generation._GraphedSteps, generation._GraphedHyena):
        monkeypatch.setattr(cls, "indexed_step", recorded(cls.indexed_step))
    for name, value in (("device", lambda device: contextlib.nullcontext()), ("Stream", Stream),
                        ("stream", lambda s: contextlib.nullcontext()), ("current_stream", lambda device=None: Stream()),
                        ("graph_pool_handle", lambda: None), ("memory_reserved", lambda device=None: 0),
                        ("CUDAGraph", Graph), ("graph", graph)):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(torch.backends.cuda, "cufft_plan_cache", {None: Plans()})
    monkeypatch.setattr(generation, "_check_cuda_graph", lambda cuda_graph, x: None)


@pytest.mark.parametrize("prompt_len", [0, 1, 37])
def test_prefill_with_graphs_captures_then_fills(gen, simulated_graphs, middle_levels_on_ffts, prompt_len):
    """prefill(cuda_graph=True) with simulated graphs (the fixture): the warm-up's writes are
    cleared before the prompt's sums and the short filter's ring go in, and every replayed step
    is the eager step's, bit for bit: a functional state and a HyenaOperator's."""
    length = 200
    x, k = randn(gen, 2, 6, length), randn(gen, 3, length)
    with torch.no_grad():
        _, eager = generation.prefill(x[..., :prompt_len], k, length)
        _, graphed = generation.prefill(x[..., :prompt_len], k, length, cuda_graph=True)
        assert torch.equal(graphed.pending, eager.pending) and set(graphed.graphed.graphs) == {
            *generation._levels(length - prompt_len), None}
        for t in range(prompt_len, length):
            assert torch.equal(generation.step(x[..., t], graphed)[0], generation.step(x[..., t], eager)[0]), t

        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        op = HyenaOperator(8, length, order=3, filter_groups=2, filter_order=16)
        u = randn(gen, 2, length, 8)
        _, hyena_eager = op.prefill(u[:, :prompt_len], max_len=length)
        _, hyena_graphed = op.prefill(u[:, :prompt_len], max_len=length, cuda_graph=True)
        assert torch.equal(hyena_graphed.window, hyena_eager.window)
        for t in range(prompt_len, length):
            assert torch.equal(op.step(u[:, t], hyena_graphed)[0], op.step(u[:, t], hyena_eager)[0]), t


@pytest.mark.parametrize("change", ["cleared", "full"])
def test_graphed_step_refuses_once_the_plans_may_be_freed(gen, simulated_graphs, change):
    """The graphs replay cuFFT plans the cache owns: a step that replays a graph after the cache
    was cleared (its size below the capture's) or filled up (where it evicts) raises, for a
    functional state and a HyenaOperator's; a direct step (DIRECT_STEP: no graph, no plan) before
    it runs; with the cache as it was, the refused step runs. Each read asks the cache again."""
    length = 100  # levels up to 2^5: FFT levels beside the Toeplitz ones
    x, k = randn(gen, 1, 4, length), randn(gen, 2, length)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    op = HyenaOperator(8, length, order=2, filter_order=16)
    plans = torch.backends.cuda.cufft_plan_cache[None]
    with torch.no_grad():
        _, state = generation.prefill(x[..., :3], k, length, cuda_graph=True)
        _, hyena = op.prefill(randn(gen, 1, 3, 8), max_len=length, cuda_graph=True)
        generation.step(x[..., 3], state)
        op.step(randn(gen, 1, 8), hyena)
        at_capture = plans.size
        plans.size = at_capture - 1 if change == "cleared" else plans.max_size
        refused = None
        for t in range(4, length):
            try:
                generation.step(x[..., t], state)
            except RuntimeError as error:
                assert "cuFFT plan cache was cleared or filled up" in str(error)
                refused = t
                break
        assert refused is not None
        q = generation._fold_level(refused - 3, length - 3)  # the generated index of position t: t - P
        assert not (generation.DIRECT_STEP and (q is None or q < len(state.toeplitz)))  # a replayed level
        assert state.position == refused  # refused before any write
        with pytest.raises(RuntimeError, match="cuFFT plan cache was cleared or filled up"):
            op.step(randn(gen, 1, 8), hyena)
        plans.size = at_capture
        generation.step(x[..., refused], state)


def test_cuda_graph_needs_a_cuda_prompt(gen):
    x, k = randn(gen, 1, 2, 10), randn(gen, 2, 10)
    with pytest.raises(ValueError, match="cuda_graph=True captures CUDA graphs: the prompt is on cpu"):
        generation.prefill(x, k, 20, cuda_graph=True)
    with pytest.raises(TypeError, match="cuda_graph must be a bool"):
        generation.prefill(x, k, 20, cuda_graph="yes")
    with pytest.raises(ValueError, match="cuda_graph=True"):
        mf.FFTConv(2, 20).prefill(x, 20, cuda_graph=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_fused_step_is_captured_when_no_call_loaded_the_extension():
    """FUSED_STEP on, in a fresh process whose prefill makes no CUDA call before the capture (an
    empty prompt): the graphs capture the conv_step kernel, not the PyTorch ops (session 20's
    example runs took the ops: the extension was not loaded yet)."""
    code = (
        "import torch, monarch_fftconv as mf\n"
        "from monarch_fftconv import generation, ops\n"
        "calls = []\n"
        "kernel = ops.conv_step_op\n"
        "ops.conv_step_op = lambda *a, **kw: calls.append(1) or kernel(*a, **kw)\n"
        "generation.FUSED_STEP = True\n"
        "layer = mf.FFTConv(4, 64, device='cuda')\n"
        "with torch.inference_mode():\n"
        "    _, state = layer.prefill(torch.zeros(2, 4, 0, device='cuda'), 64, cuda_graph=True)\n"
        "print('conv_step calls', len(calls))\n"
    )
    run = run_python(code, timeout=600)  # a kernel not yet run on a GPU: a hang is killed, not waited on
    assert run.returncode == 0, run.output[-2000:]
    counts = [int(line.split()[-1]) for line in run.output.splitlines() if line.startswith("conv_step calls ")]
    assert len(counts) == 1 and counts[0] > 0, "the graphs captured the PyTorch ops"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.watchdog(300)
@pytest.mark.parametrize("groups, length, prompt_len", [(4, 700, 0), (2, 4096, 333), (1, 100, 99)])
@pytest.mark.parametrize("fused", [False, True])
def test_cuda_graph_steps_replay_the_eager_steps(gen, monkeypatch, groups, length, prompt_len, fused):
    """prefill(..., cuda_graph=True): every step a replay of its level's graph, with outputs
    equal to the eager steps' (same kernels; not asserted bitwise), y_t kept as later steps run,
    an FFTConv and a HyenaOperator stack too, under inference_mode; with the per-token part as
    PyTorch ops and as the one conv_step kernel (FUSED_STEP)."""
    from monarch_fftconv import _extension
    assert not isinstance(_extension.coverage(True), str)  # loaded: the conv_step kernel is registered
    monkeypatch.setattr(generation, "FUSED_STEP", fused)
    assert generation._fused_step(torch.device("cuda")) == fused
    x = randn(gen, 3, 8, length, device="cuda")
    k = randn(gen, groups, length, device="cuda") / length**0.5
    with torch.inference_mode():
        _, eager = generation.prefill(x[..., :prompt_len], k, length)
        _, graphed = generation.prefill(x[..., :prompt_len], k, length, cuda_graph=True)
        assert graphed.graphed is not None and graphed.nbytes > eager.nbytes
        ys = []
        for t in range(prompt_len, length):
            want = generation.step(x[..., t], eager)[0]
            got = generation.step(x[..., t], graphed)[0]
            assert rel_l2(got, want) <= 1e-5, t  # the same ops; cuFFT may plan a strided and a packed block apart
            ys.append((got, got.clone(), want.clone()))
        assert all(torch.equal(got, then) for got, then, _ in ys)  # views of the history: never overwritten
        ref = reference_full(x, k)[..., prompt_len:]
        for outputs in ([g for g, _, _ in ys], [w for _, _, w in ys]):
            assert rel_l2(torch.stack(outputs, -1), ref) < ERROR_BUDGETS["fp32"]
        with pytest.raises(RuntimeError, match="the stream is full"):
            generation.step(x[..., -1], graphed)
        op = HyenaOperator(d_model=16, l_max=256, order=3).cuda()
        u = randn(gen, 2, 256, 16, device="cuda")
        _, hyena_eager = op.prefill(u[:, :40], 256)
        _, hyena_graphed = op.prefill(u[:, :40], 256, cuda_graph=True)
        for t in range(40, 256):
            want, _ = op.step(u[:, t], hyena_eager)
            got, _ = op.step(u[:, t], hyena_graphed)
            assert rel_l2(got, want) <= 1e-5, t


def conv_step_case(gen, device, dtype, to_generate=37, batch=3, channels=5):
    """Random step buffers (the ops.conv_step arguments but index and fold)."""
    def r(*shape):
        return randn(gen, *shape, dtype=dtype).to(device)
    return dict(x=r(batch, channels), inputs=r(batch, channels, to_generate), pending=r(batch, channels, to_generate + 9),
                outputs=r(to_generate, batch, channels), first_tap=r(channels), second_tap=r(channels))


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("keep_outputs", [False, True])
def test_conv_step_op_is_one_step(gen, fold, keep_outputs):
    """ops.conv_step (the graphed steps' per-token part) at an odd index: x into inputs[:, :, i],
    y = pending[:, :, i] + k0·x (into outputs[i] when kept), with fold k1·x added to
    pending[:, :, i + 1], and nothing else written."""
    from monarch_fftconv import ops
    case = conv_step_case(gen, "cpu", torch.float64)
    if not keep_outputs:
        case["outputs"] = None
    before = {name: None if t is None else t.clone() for name, t in case.items()}
    i = 11
    y = ops.conv_step_op(**case, index=torch.tensor(i), fold=fold)
    x, k0, k1 = before["x"], before["first_tap"], before["second_tap"]
    want_y = before["pending"][:, :, i] + k0 * x
    # addcmul's rounding (one, or two) against this sum's: within an ulp of the terms' size
    assert torch.allclose(y, want_y, rtol=0, atol=1e-14)
    inputs, pending = before["inputs"].clone(), before["pending"].clone()
    inputs[:, :, i] = x
    if fold:
        pending[:, :, i + 1] += k1 * x
    assert torch.equal(case["inputs"], inputs) and torch.allclose(case["pending"], pending, rtol=0, atol=1e-14)
    if keep_outputs:
        outputs = before["outputs"].clone()
        outputs[i] = y
        assert torch.equal(case["outputs"], outputs)


@pytest.mark.parametrize("n, groups", [(2, 1), (4, 5), (8, 1), (1, 5)])
def test_conv_step_op_adds_a_small_levels_block(gen, n, groups):
    """block_taps (G, n, n), a Toeplitz level's block: after the step's own writes,
    pending[:, c, i+1+m] += Σ_j inputs[:, c, i+1-n+j]·K[c // (C/G), j, m] for m < n (the newest
    input is x), summed here one term at a time; y and every other entry as without it."""
    from monarch_fftconv import ops
    case = conv_step_case(gen, "cpu", torch.float64)
    taps = randn(gen, groups, n, n, dtype=torch.float64)
    before = {name: t.clone() for name, t in case.items()}
    i = 15  # i + 1 = 16: a fold of every n here
    y = ops.conv_step_op(**case, index=torch.tensor(i), fold=False, block_taps=taps)
    inputs, pending = before["inputs"].clone(), before["pending"].clone()
    inputs[:, :, i] = before["x"]
    channels = inputs.shape[1]
    for c in range(channels):
        g = c // (channels // groups)
        for m in range(n):
            for j in range(n):
                pending[:, c, i + 1 + m] += inputs[:, c, i + 1 - n + j] * taps[g, j, m]
    assert torch.equal(y, torch.addcmul(before["pending"][:, :, i], before["first_tap"], before["x"]))
    assert torch.equal(case["inputs"], inputs)
    assert torch.allclose(case["pending"], pending, rtol=0, atol=1e-13)
    untouched = torch.ones(pending.shape[-1], dtype=torch.bool)
    untouched[i + 1: i + 1 + n] = False
    assert torch.equal(case["pending"][..., untouched], before["pending"][..., untouched])


def test_the_kernels_largest_block_is_generations():
    """generation sends its Toeplitz levels (n <= DIRECT_MAX_BLOCK) to the conv_step kernel,
    which takes n up to kConvStepMaxBlock (fftconv.h): one number in two languages."""
    import re
    from monarch_fftconv import _extension
    header = (_extension.CSRC / "fftconv.h").read_text()
    assert re.findall(r"constexpr int kConvStepMaxBlock = (\d+);", header) == [str(generation.DIRECT_MAX_BLOCK)]


def conv_block_case(gen, device, dtype, n, groups, batch=3, channels=6, to_generate=600):
    """Random buffers for ops.conv_block: inputs, pending (with a tail past T), the taps (G, 2n + 3:
    wider than the block needs, as generation's taps are for its smaller levels)."""
    inputs = randn(gen, batch, channels, to_generate, dtype=dtype)
    pending = randn(gen, batch, channels, to_generate + n, dtype=dtype)
    taps = randn(gen, groups, 2 * n + 3, dtype=dtype)
    return {name: t.to(device) for name, t in (("inputs", inputs), ("pending", pending), ("taps", taps))}


@pytest.mark.parametrize("n, groups", [(16, 1), (32, 3), (64, 6), (256, 2)])
def test_conv_block_op_adds_a_middle_levels_block(gen, n, groups):
    """ops.conv_block (a middle level's block as a direct product): pending[:, c, i+1+m] +=
    Σ_j inputs[:, c, i+1-n+j]·taps[g, n+m-j] for m < n, summed here by its own loop over lags
    in float64; inputs, taps and every other pending entry untouched."""
    from monarch_fftconv import ops
    case = conv_block_case(gen, "cpu", torch.float64, n, groups)
    before = {name: t.clone() for name, t in case.items()}
    i = 511  # i + 1 = 512: a fold of every n here
    ops.conv_block_op(**case, index=torch.tensor(i), n=n)
    want = before["pending"].clone()
    channels = want.shape[1]
    for c in range(channels):
        g = c // (channels // groups)
        for m in range(n):
            lags = torch.arange(m + 1, m + n + 1)  # t - s for s = i+1-n+j, t = i+1+m: n+m-j
            sources = i + 1 + m - lags
            want[:, c, i + 1 + m] += (before["inputs"][:, c, sources] * before["taps"][g, lags]).sum(-1)
    assert torch.allclose(case["pending"], want, rtol=0, atol=1e-12)
    assert torch.equal(case["inputs"], before["inputs"]) and torch.equal(case["taps"], before["taps"])
    untouched = torch.ones(want.shape[-1], dtype=torch.bool)
    untouched[i + 1: i + 1 + n] = False
    assert torch.equal(case["pending"][..., untouched], before["pending"][..., untouched])


def test_the_block_kernels_range_is_generations():
    """generation's middle levels (DIRECT_MAX_BLOCK < n <= KERNEL_MAX_BLOCK) are what the
    conv_block kernel takes (kConvBlockMinBlock .. kConvBlockMaxBlock, fftconv.h)."""
    import re
    from monarch_fftconv import _extension
    header = (_extension.CSRC / "fftconv.h").read_text()
    assert re.findall(r"constexpr int kConvBlockMinBlock = (\d+);", header) == [str(2 * generation.DIRECT_MAX_BLOCK)]
    assert re.findall(r"constexpr int kConvBlockMaxBlock = (\d+);", header) == [str(generation.KERNEL_MAX_BLOCK)]
    assert generation._middle_levels(2000) == [4, 5, 6, 7, 8] and generation._middle_levels(16) == []


@pytest.mark.parametrize("groups, length, prompt_len", [(3, 700, 0), (1, 300, 45), (3, 40, 3)])
def test_graphed_steps_with_middle_levels_as_blocks(gen, simulated_graphs, monkeypatch, groups, length, prompt_len):
    """MID_LEVELS_IN_KERNEL: the graphed steps fold their middle levels (n = 16 .. 256) by
    ops.conv_block (here its PyTorch form, the stand-in graphs running eagerly on the CPU), the
    other levels as before: every output within float64 round-off of the whole-sequence
    convolution and of the eager steps (two FFTs there: not bitwise)."""
    monkeypatch.setattr(generation, "MID_LEVELS_IN_KERNEL", True)
    blocks = []
    reference_block = generation.ops.conv_block_reference
    monkeypatch.setattr(generation.ops, "conv_block_reference", lambda *a: blocks.append(a[-1]) or reference_block(*a))
    x = randn(gen, 2, 6, length, dtype=torch.float64)
    k = randn(gen, groups, length, dtype=torch.float64) / length**0.5
    with torch.no_grad():
        y, graphed = generation.prefill(x[..., :prompt_len], k, length, cuda_graph=True)
        _, eager = generation.prefill(x[..., :prompt_len], k, length)
        blocks.clear()  # the capture's warm-up and capture runs
        outs = []
        for t in range(prompt_len, length):
            got, want = generation.step(x[..., t], graphed)[0], generation.step(x[..., t], eager)[0]
            assert torch.allclose(got, want, rtol=0, atol=1e-11), t
            outs.append(got)
    middle = generation._middle_levels(length - prompt_len)
    assert sorted(set(blocks)) == [1 << q for q in middle]  # each middle level, by the op
    assert len(blocks) == sum((length - prompt_len - 1) // (1 << q) - (length - prompt_len - 1) // (2 << q)
                              for q in middle)  # once a fold of its level, no more
    full = torch.cat([y, torch.stack(outs, -1)], -1) if prompt_len else torch.stack(outs, -1)
    assert rel_l2(full, reference_full(x, k)) < 1e-12
    # a HyenaOperator's graphed step: its long convolutions' middle levels by the op too
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    op = HyenaOperator(8, length, order=3, filter_groups=2, filter_order=16)
    u = randn(gen, 2, length, 8)
    with torch.no_grad():
        _, hyena_eager = op.prefill(u[:, :prompt_len], max_len=length)
        _, hyena_graphed = op.prefill(u[:, :prompt_len], max_len=length, cuda_graph=True)
        blocks.clear()
        for t in range(prompt_len, length):
            got, want = op.step(u[:, t], hyena_graphed)[0], op.step(u[:, t], hyena_eager)[0]
            assert rel_l2(got, want) < 1e-5, t
    assert sorted(set(blocks)) == [1 << q for q in middle]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the conv_block kernel needs a CUDA device")
@pytest.mark.watchdog(120)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, groups", [(16, 1), (32, 7), (64, 1), (128, 7), (256, 1)])
def test_conv_block_kernel_is_the_reference_block(gen, dtype, n, groups):
    """The CUDA conv_block kernel against ops.conv_block_reference (PyTorch ops) on the same
    buffers at an index read from device memory (odd B·C, more streams than one launch's grid
    holds at once): the same sums (fma chains against the GEMM's order: within n ulps of the
    terms' scale) in the same entries; an index past the room writes nothing; clear errors."""
    from monarch_fftconv import _extension, ops
    assert not isinstance(_extension.coverage(True), str)
    case = conv_block_case(gen, "cuda", dtype, n, groups, batch=7, channels=301 if groups == 7 else 300,
                           to_generate=1024)
    theirs = {name: t.clone() for name, t in case.items()}
    index = torch.tensor(767, device="cuda")  # 768 = 3·256: a fold of every n
    ops.conv_block_op(**case, index=index, n=n)
    ops.conv_block_reference(**theirs, index=index.clone(), n=n)
    atol = 8 * n * torch.finfo(dtype).eps * 4  # terms O(1), n of them: the sums' rounding, two orders
    assert torch.allclose(case["pending"], theirs["pending"], rtol=0, atol=atol)
    assert torch.equal(case["inputs"], theirs["inputs"])
    unchanged = case["pending"].clone()
    ops.conv_block_op(**case, index=torch.tensor(1024 + n, device="cuda"), n=n)  # no room: nothing written
    torch.cuda.synchronize()
    assert torch.equal(case["pending"], unchanged)
    with pytest.raises(ValueError, match="conv_block's n"):
        ops.conv_block_op(**case, index=index, n=24)
    with pytest.raises(ValueError, match="conv_block takes"):
        ops.conv_block_op(**{**case, "taps": case["taps"][:, : 2 * n - 1].contiguous()}, index=index, n=n)
    with pytest.raises(ValueError, match="conv_block's tensors"):
        ops.conv_block_op(**{**case, "taps": case["taps"].to(torch.float64 if dtype == torch.float32 else torch.float32)},
                          index=index, n=n)


def shared_load(values, offset, count, width):
    """count values of a warp's shared array from offset, as the kernel's loads of width values:
    each load inside the array and aligned to its width (the arrays start 16-byte aligned)."""
    assert 0 <= offset and offset + count <= len(values) and offset % width == 0 and count % width == 0, \
        (offset, count, width)
    return [value for at in range(offset, offset + count, width) for value in values[at: at + width]]


def shared_store(values, offset, stored, width):
    """The kernel's stores of width values into a warp's shared array: inside it, aligned."""
    assert 0 <= offset and offset + len(stored) <= len(values) and offset % width == 0 and len(stored) % width == 0, \
        (offset, len(stored), width)
    values[offset: offset + len(stored)] = stored


def conv_block_rows_emulated(inputs, pending, taps, i, n, rows_per_warp, warps, grid, value_bytes):
    """conv_block_kernel's data flow (generation/conv_step.cu) on the CPU, loop for loop, its T
    value_bytes wide (the widths of its shared loads) and the sums in float64 (a product and an
    add, not one fma): warps of a grid-stride loop over items w (channel w mod C, batch rows
    ⌊w/C⌋·ROWS onward, the last group partial), each with its shared taps and ROWS rows of inputs
    (NaN until written and stale across items, so that a row past the batch reaching pending would
    show); each lane's K = max(n/32, 1) consecutive outputs (lanes past n/K repeating the first
    ones, storing nothing), its window of K taps, a step of max(K, 4) j's loading the taps below
    the window and every row's next inputs, and the sums over j ascending; then the sums through
    the shared rows into pending, every lane at m = lane, lane + 32, ... Returns the streams each
    item wrote."""
    batch, channels, _ = inputs.shape
    group_size = channels // taps.shape[0]
    per_lane = max(n // 32, 1)  # K
    lanes_with_outputs, step = n // per_lane, max(per_lane, 4)
    vector = 16 // value_bytes  # values a 16-byte load
    tap_vector = min(per_lane, vector)
    chunks = (batch + rows_per_warp - 1) // rows_per_warp
    items, written = chunks * channels, []
    inputs_, taps_, pending_ = inputs.tolist(), taps.tolist(), pending.tolist()
    for block_idx in range(grid):
        for warp in range(warps):
            shared_taps, shared_rows = [float("nan")] * (2 * n), [float("nan")] * (rows_per_warp * n)
            for w in range(block_idx * warps + warp, items, grid * warps):
                c, b0 = w % channels, w // channels * rows_per_warp
                rows = min(rows_per_warp, batch - b0)
                shared_taps[:] = taps_[c // group_size][: 2 * n]
                for r in range(rows):
                    shared_rows[r * n: (r + 1) * n] = inputs_[b0 + r][c][i + 1 - n: i + 1]
                sums = []
                for lane in range(32):
                    first = lane % lanes_with_outputs * per_lane
                    acc = [[0.0] * per_lane for _ in range(rows_per_warp)]
                    window = shared_load(shared_taps, n + first, per_lane, tap_vector)
                    for j in range(0, n, step):
                        x = [shared_load(shared_rows, r * n + j, step, vector) for r in range(rows_per_warp)]
                        entering = shared_load(shared_taps, n + first - j - step, step, tap_vector)
                        for d in range(step):
                            for q in range(per_lane):
                                tap = window[q - d] if q >= d else entering[step + q - d]
                                for r in range(rows_per_warp):
                                    acc[r][q] = acc[r][q] + x[r][d] * tap
                        window = entering[:per_lane]
                    sums.append(acc)
                for lane in range(lanes_with_outputs):
                    for r in range(rows):
                        shared_store(shared_rows, r * n + lane * per_lane, sums[lane][r], tap_vector)
                for r in range(rows):
                    for lane in range(32):
                        for m in range(lane, n, 32):
                            pending_[b0 + r][c][i + 1 + m] += shared_rows[r * n + m]
                    written.append((b0 + r, c))
    pending.copy_(torch.tensor(pending_, dtype=pending.dtype))
    return written


# ROWS 4 only in fp32 (value_bytes 4); n = 16 .. 256: K = 1, 1, 2, 4, 8 (a step of 8 j's)
@pytest.mark.parametrize("rows_per_warp, batch, channels, groups, grid, n, value_bytes", [
    (1, 3, 6, 3, 2, 16, 8), (4, 7, 6, 2, 3, 16, 4), (4, 4, 5, 5, 1, 16, 4), (2, 5, 3, 1, 4, 16, 8),
    (2, 3, 4, 2, 1, 32, 4), (4, 6, 2, 2, 1, 64, 4), (2, 3, 2, 1, 1, 64, 8),
    (4, 5, 2, 1, 1, 128, 4), (2, 3, 2, 2, 1, 128, 8), (4, 2, 1, 1, 1, 256, 4), (1, 1, 2, 2, 1, 256, 8)])
def test_conv_block_row_groups_dataflow_fp64(gen, rows_per_warp, batch, channels, groups, grid, n, value_bytes):
    """conv_block's indexing emulated on the CPU in float64: by batch rows (a warp ROWS rows of one
    channel), with a grid smaller than the items (the grid-stride loop) and partial row groups; by
    lanes (K consecutive outputs a lane, the taps in a register window that moves down a step of
    j's at a time, the shared loads aligned to their widths) for K = 1 .. 8: every stream written
    exactly once, the sums those of ops.conv_block_reference."""
    from monarch_fftconv import ops
    to_generate, i = 2 * n + 8, 2 * n - 1  # i + 1 = 2n: a fold of the level
    case = conv_block_case(gen, "cpu", torch.float64, n, groups, batch=batch, channels=channels,
                           to_generate=to_generate)
    want = case["pending"].clone()
    ops.conv_block_reference(case["inputs"], want, case["taps"], torch.tensor(i), n)
    got = case["pending"].clone()
    written = conv_block_rows_emulated(case["inputs"], got, case["taps"], i, n, rows_per_warp, warps=4, grid=grid,
                                       value_bytes=value_bytes)
    assert sorted(written) == [(b, c) for b in range(batch) for c in range(channels)]
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the conv_block kernel needs a CUDA device")
@pytest.mark.watchdog(120)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, groups, batch", [(16, 1, 7), (64, 7, 5), (128, 1, 3), (256, 7, 6), (32, 3, 2)])
def test_conv_block_batch_rows_give_the_same_bits(gen, dtype, n, groups, batch):
    """conv_block takes up to 4 (fp32) or 2 (fp64) batch rows of a channel a warp, as many as the
    batch has: the same fma chain per stream whatever the rows, so a batch's call gives each row's
    own call (one row a warp) bit for bit, with batches that leave a partial last group of rows."""
    from monarch_fftconv import _extension, ops
    assert not isinstance(_extension.coverage(True), str)
    case = conv_block_case(gen, "cuda", dtype, n, groups, batch=batch, channels=301 if groups == 7 else 300,
                           to_generate=1024)
    index = torch.tensor(767, device="cuda")
    together = {name: t.clone() for name, t in case.items()}
    ops.conv_block_op(**together, index=index, n=n)
    assert not torch.equal(together["pending"], case["pending"])  # it wrote
    for b in range(batch):
        alone = {"inputs": case["inputs"][b:b + 1].clone(), "pending": case["pending"][b:b + 1].clone(),
                 "taps": case["taps"]}
        ops.conv_block_op(**alone, index=index, n=n)
        assert torch.equal(alone["pending"][0], together["pending"][b]), b


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.watchdog(300)
def test_cuda_graph_steps_with_middle_levels_in_the_kernel(gen, monkeypatch):
    """MID_LEVELS_IN_KERNEL on a GPU: the graphs capture conv_block for n = 16 .. 256 and the
    generated outputs stay within fp32's budget of the whole-sequence convolution and within
    round-off of the eager steps (FFT levels there)."""
    from monarch_fftconv import _extension
    assert not isinstance(_extension.coverage(True), str)
    monkeypatch.setattr(generation, "MID_LEVELS_IN_KERNEL", True)
    length, prompt_len = 2000, 13
    x = randn(gen, 3, 8, length, device="cuda")
    k = randn(gen, 2, length, device="cuda") / length**0.5
    with torch.inference_mode():
        _, eager = generation.prefill(x[..., :prompt_len], k, length)
        _, graphed = generation.prefill(x[..., :prompt_len], k, length, cuda_graph=True)
        outs = []
        for t in range(prompt_len, length):
            want = generation.step(x[..., t], eager)[0]
            got = generation.step(x[..., t], graphed)[0]
            assert rel_l2(got, want) <= 1e-5, t
            outs.append(got)
        assert rel_l2(torch.stack(outs, -1), reference_full(x, k)[..., prompt_len:]) < ERROR_BUDGETS["fp32"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the conv_step kernel needs a CUDA device")
@pytest.mark.watchdog(120)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fold, keep_outputs, block", [(False, False, None), (True, True, None), (True, False, None),
                                                       (False, True, (4, 1)), (False, False, (8, 7))])
def test_conv_step_kernel_is_the_reference_step(gen, dtype, fold, keep_outputs, block):
    """The CUDA conv_step kernel against ops.conv_step_reference (PyTorch ops) on the same
    buffers, at an index read from device memory: the same values (fma against addcmul's
    rounding: within an ulp), the same entries written, with a small level's block (n, G) too;
    and clear errors on bad buffers."""
    from monarch_fftconv import _extension, ops
    assert not isinstance(_extension.coverage(True), str)
    case = conv_step_case(gen, "cuda", dtype, to_generate=1001, batch=7, channels=301)
    if not keep_outputs:
        case["outputs"] = None
    if block is not None:
        n, groups = block
        case["block_taps"] = randn(gen, groups, n, n, dtype=dtype).to("cuda")
    theirs = {name: None if t is None else t.clone() for name, t in case.items()}
    index = torch.tensor(997 if block is None else 991, device="cuda")  # 992 = 8·124: a fold of n = 4, 8
    y = ops.conv_step_op(**case, index=index, fold=fold)
    want = ops.conv_step_reference(**theirs, index=index.clone(), fold=fold)
    ulp = 16 * torch.finfo(dtype).eps  # the terms are O(1): fma against addcmul's rounding, within an ulp or two
    if block is not None:
        ulp *= 4 * block[0]  # a block's n products summed in another order than the GEMM's
    assert torch.allclose(y, want, rtol=0, atol=ulp)
    for name in ("inputs", "pending", "outputs"):
        if case[name] is not None:
            assert torch.allclose(case[name], theirs[name], rtol=0, atol=ulp), name
    with pytest.raises(ValueError, match="conv_step"):
        ops.conv_step_op(**{**case, "first_tap": case["first_tap"][:-1]}, index=index, fold=fold)
    with pytest.raises(ValueError, match="conv_step"):
        ops.conv_step_op(**{**case, "x": case["x"].float() if dtype == torch.float64 else case["x"].double()},
                         index=index, fold=fold)
    if block is not None:
        with pytest.raises(ValueError, match="block_taps"):
            ops.conv_step_op(**{**case, "block_taps": case["block_taps"][..., :-1]}, index=index, fold=fold)


# --------------------------------------------------------------------------- direct steps (DIRECT_STEP)

@pytest.mark.parametrize("groups, length, prompt_len, io_dtype", [(3, 300, 0, torch.float32), (1, 97, 13, torch.float64),
                                                                  (2, 150, 5, torch.bfloat16)])
def test_direct_steps_are_the_replayed_steps(gen, simulated_graphs, middle_levels_on_ffts, monkeypatch, groups, length,
                                             prompt_len, io_dtype):
    """DIRECT_STEP on a graphed state (simulated graphs, the fixture): a token whose fold the step
    kernel does alone (no fold, level 0, the Toeplitz levels) runs ops.conv_step_at at the host's
    position with x_t where it lies (a strided view), the other levels replay their graphs, which
    read the device index the direct steps leave; the outputs and state are the eager steps', bit
    for bit. A 2-byte x_t (not the compute dtype) replays every level (its copy casts)."""
    monkeypatch.setattr(generation, "DIRECT_STEP", True)
    direct = []
    op = generation.ops.conv_step_at_op
    monkeypatch.setattr(generation.ops, "conv_step_at_op", lambda *a: direct.append(a[7]) or op(*a))
    x = randn(gen, 2, 6, length, dtype=torch.float64).to(io_dtype)
    k = randn(gen, groups, length, dtype=torch.float64).to(torch.float32 if io_dtype == torch.bfloat16 else io_dtype)
    with torch.no_grad():
        _, eager = generation.prefill(x[..., :prompt_len], k, length)
        _, graphed = generation.prefill(x[..., :prompt_len], k, length, cuda_graph=True)
        for t in range(prompt_len, length):
            assert torch.equal(generation.step(x[..., t], graphed)[0], generation.step(x[..., t], eager)[0]), t
    assert torch.equal(graphed.pending, eager.pending) and torch.equal(graphed.inputs, eager.inputs)
    to_generate = length - prompt_len
    alone = [i for i in range(to_generate)
             if (q := generation._fold_level(i, to_generate)) is None or q < len(graphed.toeplitz)]
    assert direct == ([] if io_dtype == torch.bfloat16 else alone)
    assert int(graphed.graphed.index) == to_generate  # as the graphs' increments leave it


@pytest.mark.parametrize("grad_mode", ["enable_grad", "no_grad", "inference_mode"])
def test_direct_steps_in_every_grad_mode(gen, simulated_graphs, middle_levels_on_ffts, monkeypatch, grad_mode):
    """DIRECT_STEP outside no_grad (the step enters it itself) and inside it or inference_mode
    (called as it is): the eager steps' outputs bit for bit, and no autograd history, with
    inputs and a filter that require grad (the op has no autograd kernel of its own)."""
    monkeypatch.setattr(generation, "DIRECT_STEP", True)
    length, prompt_len = 70, 5
    x = randn(gen, 2, 3, length)
    steps = [x[..., t].clone().requires_grad_() for t in range(length)]
    layer = mf.FFTConv(3, length)
    with torch.no_grad():
        layer.filter.copy_(randn(gen, 3, length))
    mode = getattr(torch, grad_mode)
    with mode():
        _, eager = layer.prefill(x[..., :prompt_len], max_len=length)
        _, graphed = layer.prefill(x[..., :prompt_len], max_len=length, cuda_graph=True)
        for t in range(prompt_len, length):
            y, _ = layer.step(steps[t], graphed)
            assert not y.requires_grad and torch.equal(y, layer.step(steps[t], eager)[0]), t
    assert not any(buffer.requires_grad for buffer in (graphed.inputs, graphed.pending, graphed.graphed.outputs))


def test_conv_step_at_op_is_the_step_at_a_host_position(gen):
    """ops.conv_step_at: ops.conv_step at the host's position, x of any strides, the device index
    left at position + 1; a position outside [0, T) is refused."""
    from monarch_fftconv import ops
    case = conv_step_case(gen, "cpu", torch.float64)
    strided = randn(gen, 5, 3, dtype=torch.float64).t()  # (B, C) = (3, 5), not contiguous
    theirs = {name: t.clone() for name, t in case.items()}
    index = torch.tensor(-7)
    y = ops.conv_step_at_op(strided, case["inputs"], case["pending"], case["outputs"], case["first_tap"],
                            case["second_tap"], index, 21, True, None)
    want = ops.conv_step_op(strided.contiguous(), theirs["inputs"], theirs["pending"], theirs["outputs"],
                            theirs["first_tap"], theirs["second_tap"], torch.tensor(21), True, None)
    assert torch.equal(y, want) and int(index) == 22
    assert all(torch.equal(case[name], theirs[name]) for name in ("inputs", "pending", "outputs"))
    with pytest.raises(ValueError, match="position must be in"):
        ops.conv_step_at_op(strided, case["inputs"], case["pending"], None, case["first_tap"], case["second_tap"],
                            index, case["inputs"].shape[-1], False, None)
    # the schema's mutations, the fake kernel and the CPU kernel agree
    assert set(torch.library.opcheck(ops.conv_step_at_op, (strided, *(case[n] for n in (
        "inputs", "pending", "outputs", "first_tap", "second_tap")), torch.tensor(0), 4, True, None)).values()) == {"SUCCESS"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the conv_step kernel needs a CUDA device")
@pytest.mark.watchdog(300)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_direct_steps_are_the_replayed_steps(gen, monkeypatch, dtype):
    """DIRECT_STEP on a GPU: the same kernel at the host's position, reading x_t strided, gives the
    replayed steps' outputs bit for bit, through every level (the graphs of the middle and FFT
    levels read the index the direct steps leave); conv_step_at's errors are clear."""
    from monarch_fftconv import _extension, ops
    assert not isinstance(_extension.coverage(True), str)
    length, prompt_len = 1500, 7
    x = randn(gen, 3, 37, length, dtype=dtype, device="cuda")
    k = randn(gen, 37, length, dtype=dtype, device="cuda") / length**0.5
    outs, states, direct_steps = {}, {}, []
    op = ops.conv_step_at_op
    monkeypatch.setattr(ops, "conv_step_at_op", lambda *a: direct_steps.append(a[7]) or op(*a))
    for direct in (False, True):
        monkeypatch.setattr(generation, "DIRECT_STEP", direct)
        with torch.inference_mode():
            _, state = generation.prefill(x[..., :prompt_len], k, length, cuda_graph=True)
            assert state.graphed.step_kernel
            outs[direct] = torch.stack([generation.step(x[..., t], state)[0].clone() for t in range(prompt_len, length)])
            states[direct] = state
    to_generate = length - prompt_len
    assert len(direct_steps) == sum(1 for i in range(to_generate) if (q := generation._fold_level(i, to_generate)) is None
                                    or q < len(states[True].toeplitz))
    assert torch.equal(outs[True], outs[False])
    assert torch.equal(states[True].pending, states[False].pending) and torch.equal(states[True].inputs, states[False].inputs)
    assert int(states[True].graphed.index) == int(states[False].graphed.index) == to_generate
    budget = ERROR_BUDGETS["fp32"] if dtype == torch.float32 else FP64_TOLERANCE
    assert rel_l2(outs[True], reference(x, k)[..., prompt_len:].permute(2, 0, 1)) < budget
    case = conv_step_case(gen, "cuda", dtype)
    index = torch.tensor(0, device="cuda")
    with pytest.raises(ValueError, match="conv_step_at's position"):
        ops.conv_step_at_op(case["x"], case["inputs"], case["pending"], None, case["first_tap"], case["second_tap"],
                            index, case["inputs"].shape[-1], False, None)
    with pytest.raises(ValueError, match="conv_step_at"):
        ops.conv_step_at_op(case["x"], case["inputs"], case["pending"], None, case["first_tap"], case["second_tap"],
                            index.float(), 3, False, None)


# --------------------------------------------------------------------------- the DirectStepper (DIRECT_STEPPER)

class _CountingStepper:
    """A state's stepper wrapped to count the tokens it took (returned y_t) and those it left."""

    def __init__(self, inner):
        self.inner, self.taken, self.left = inner, [], []

    def step(self, x_t, position, filt):
        y = self.inner.step(x_t, position, filt)
        (self.left if y is None else self.taken).append(position)
        return y


def test_step_fftconv_takes_the_steppers_y_and_falls_back_on_none(gen, simulated_graphs, middle_levels_on_ffts):
    """The glue, on the CPU: FFTConv.step takes a token's y_t from the state's stepper where it
    answers (and advances the position once), and runs its own path where it answers None, with
    the same outputs as a state without one; the stepper sees the layer's filter."""
    length, prompt_len = 70, 5
    layer = mf.FFTConv(6, length, groups=3)
    x = randn(gen, 2, 6, length)
    outs = {}
    for with_stepper in (False, True):
        _, state = layer.prefill(x[..., :prompt_len], length, cuda_graph=True)
        assert state.direct is None  # a CPU state has none of its own
        seen = []
        if with_stepper:
            class StandIn:  # the Python path's own step for odd positions, None otherwise
                def step(self, x_t, position, filt):
                    seen.append(filt is layer.filter)
                    if position % 2:
                        return None
                    before = state.position
                    state.direct = None
                    try:
                        return generation.step_fftconv(layer, x_t, state)[0]
                    finally:
                        state.direct = self
                        state.position = before
            state.direct = StandIn()
        outs[with_stepper] = torch.stack([layer.step(x[..., t], state)[0] for t in range(prompt_len, length)], -1)
        assert state.position == length
        assert seen == ([True] * (length - prompt_len) if with_stepper else [])
    assert torch.equal(outs[True], outs[False])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the DirectStepper needs a CUDA device")
@pytest.mark.watchdog(300)
@pytest.mark.parametrize("dtype, groups, prompt_len, inference", [(torch.float32, 4, 0, True),
                                                                   (torch.float32, 1, 37, False),
                                                                   (torch.float64, 2, 5, True)])
def test_cuda_direct_stepper_is_the_python_direct_step(gen, monkeypatch, dtype, groups, prompt_len, inference):
    """DIRECT_STEPPER on a GPU: FFTConv.step's direct tokens and middle levels (their two kernels
    launched directly) through the C++ stepper give the Python path's outputs and state (whose
    middle levels are graph replays) bit for bit through every level (x_t strided, y_t views of
    the history that later steps leave alone); it takes exactly those; every refusal (dtype,
    shape, the stream full, the filter written or replaced, an inference state outside inference
    mode, not a tensor) raises the Python path's error."""
    import contextlib
    from monarch_fftconv import _extension
    assert not isinstance(_extension.coverage(True), str)
    length, channels = 1300, 12
    layer = mf.FFTConv(channels, length, groups=groups, device="cuda", dtype=dtype)
    x = randn(gen, 3, channels, length, dtype=dtype, device="cuda")
    mode = torch.inference_mode if inference else contextlib.nullcontext
    outs, states, kept = {}, {}, {}
    for on in (False, True):
        monkeypatch.setattr(generation, "DIRECT_STEPPER", on)
        with mode():
            _, state = layer.prefill(x[..., :prompt_len], length, cuda_graph=True)
            assert (state.direct is not None) == on
            if on:
                state.direct = _CountingStepper(state.direct)
            ys = [layer.step(x[..., t], state)[0] for t in range(prompt_len, length)]
        kept[on] = [y.clone() for y in ys]
        outs[on], states[on] = torch.stack(ys), state
    to_generate = length - prompt_len
    # the stepper's: the direct tokens and the middle levels'
    middle = states[True].graphed.kernel_levels
    assert middle == {4, 5, 6, 7, 8}
    direct = [prompt_len + i for i in range(to_generate) if (q := generation._fold_level(i, to_generate)) is None
              or q < len(states[True].toeplitz) or q in middle]
    assert states[True].direct.taken == direct
    assert len(states[True].direct.left) == to_generate - len(direct)
    assert torch.equal(outs[True], outs[False]) and all(torch.equal(a, b) for a, b in zip(kept[True], outs[True]))
    assert torch.equal(states[True].pending, states[False].pending)
    assert int(states[True].graphed.index) == int(states[False].graphed.index) == to_generate
    budget = ERROR_BUDGETS["fp32"] if dtype == torch.float32 else 1e-10
    assert rel_l2(outs[True], reference_full(x, layer.filter.detach())[..., prompt_len:].permute(2, 0, 1)) < budget

    monkeypatch.setattr(generation, "DIRECT_STEPPER", True)
    with mode():
        _, state = layer.prefill(x[..., :prompt_len], length, cuda_graph=True)
        x_t = x[..., prompt_len]
        with pytest.raises(ValueError, match="x_t must be"):
            layer.step(x_t.float() if dtype == torch.float64 else x_t.double(), state)
        with pytest.raises(ValueError, match="shape"):
            layer.step(x_t[:2], state)
        with pytest.raises(TypeError, match="x_t must be a torch.Tensor"):
            layer.step(x_t.tolist(), state)
        assert state.position == prompt_len  # nothing taken
        layer.step(x_t, state)
        state.position = length
        with pytest.raises(RuntimeError, match="the stream is full"):
            layer.step(x_t, state)
    if inference:
        state.position = prompt_len + 1  # room left: the full stream's error comes first
        with pytest.raises(RuntimeError, match="inference_mode"):
            layer.step(x_t, state)
    else:
        _, state = layer.prefill(x[..., :prompt_len], length, cuda_graph=True)
        with torch.no_grad():
            layer.filter.mul_(1.0)
        with pytest.raises(RuntimeError, match="modified in place"):
            layer.step(x_t, state)
        _, state = layer.prefill(x[..., :prompt_len], length, cuda_graph=True)
        layer.filter = torch.nn.Parameter(layer.filter.detach().clone())
        with pytest.raises(RuntimeError, match="replaced"):
            layer.step(x_t, state)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the DirectStepper needs a CUDA device")
@pytest.mark.watchdog(300)
def test_cuda_direct_stepper_leaves_unusual_inputs_to_python(gen, monkeypatch):
    """What the stepper must not read raw goes to the Python path, with the same outputs as plain
    inputs: x_t with a lazy negation bit (a plain float tensor whose memory holds -x), x_t under a
    TorchDispatchMode (which then sees the ops); x_t that requires grad gives the same outputs
    (and no history); and a state of a single token (no Toeplitz block) steps."""
    from torch.utils._python_dispatch import TorchDispatchMode
    length, prompt_len, channels = 70, 3, 6
    layer = mf.FFTConv(channels, length, groups=2, device="cuda")
    x = randn(gen, 2, channels, length, device="cuda")
    imag = randn(gen, 2, channels, length, device="cuda")

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    outs = {}
    for how in ("plain", "negated", "mode", "grad"):
        with torch.no_grad():
            _, state = layer.prefill(x[..., :prompt_len], length, cuda_graph=True)
        assert state.direct is not None
        ys = []
        for t in range(prompt_len, length):
            x_t = x[..., t]
            if how == "negated":
                x_t = torch.complex(imag[..., t], -x_t).conj().imag  # lazily negated: -(-x_t)
                assert x_t.is_neg()
            if how == "mode":
                with Seen() as seen:
                    ys.append(layer.step(x_t, state)[0].clone())
                assert seen.ops > 0
                continue
            if how == "grad":
                x_t = x_t.clone().requires_grad_()
            ys.append(layer.step(x_t, state)[0].detach().clone())
        assert not state.graphed.x.requires_grad
        outs[how] = torch.stack(ys)
    for how in ("negated", "mode", "grad"):
        assert torch.equal(outs[how], outs["plain"]), how
    with torch.no_grad():
        y0, state = layer.prefill(x[..., :length - 1], length, cuda_graph=True)
        assert state.direct is not None and state.toeplitz == []
        y_last = layer.step(x[..., length - 1], state)[0]
    want = reference_full(x, layer.filter.detach())[..., length - 1]
    assert rel_l2(y_last, want) < ERROR_BUDGETS["fp32"]


def test_hyena_generates_under_autocast(gen):
    """prefill and step under torch.autocast (bf16) as a mixed-precision model serves: the
    state takes float32 x_t as the prompt was, its buffers autocast's dtype; the positions
    are forward's under the same autocast within bf16's budget (step refused every token)."""
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    op = HyenaOperator(8, 70, filter_order=8, short_filter_order=3)
    x = randn(gen, 2, 61, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = op(x)
        y, state = op.prefill(x[:, :11], max_len=61)
        steps = [op.step(x[:, t], state)[0] for t in range(11, 61)]
    out = torch.cat([y, torch.stack(steps, dim=1)], dim=1)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert rel_l2(out.float(), ref.float()) < ERROR_BUDGETS["bf16"]
    with torch.no_grad():
        assert rel_l2(out.float(), op(x)) < 2 * ERROR_BUDGETS["bf16"]


def test_prefill_checks_what_an_empty_prompt_never_calls(gen):
    """An empty prompt runs no convolution: its precision and dtype are checked all the same."""
    x, k = randn(gen, 1, 3, 0), randn(gen, 3, 16)
    with pytest.raises(ValueError, match="precision must be one of"):
        generation.prefill(x, k, 16, precision="nonsense")
    op = HyenaOperator(4, 16, filter_order=8)
    with pytest.raises(TypeError, match="parameters' dtype"):
        op.prefill(randn(gen, 2, 5, 4, dtype=torch.float64), max_len=16)
    with pytest.raises(ValueError, match="shape"):
        op.prefill(randn(gen, 2, 4, 5), max_len=16)
    y, state = op.prefill(randn(gen, 2, 0, 4), max_len=16)
    assert y.shape == (2, 0, 4) and state.position == 0

import math

import pytest
import torch

from monarch_fftconv import ops
from monarch_fftconv.planner import factorize, plan_for, row_frequency_order, spectrum_frequencies, tables_for


@pytest.mark.parametrize("length, fft_size, factors", [
    (1, 4, (2, 2)), (3, 8, (4, 2)), (100, 256, (16, 16)), (1000, 2048, (64, 32)),
    (5000, 16384, (128, 128)), (8192, 16384, (128, 128)), (8193, 32768, (32, 32, 32)),
])
def test_plan_factorisation(length, fft_size, factors):
    plan = plan_for(length)
    assert (plan.fft_size, plan.factors) == (fft_size, factors)
    assert math.prod(plan.factors) == plan.fft_size >= 2 * length
    assert all(2 <= f <= 128 for f in plan.factors)
    assert plan.live_rows <= plan.n1 // 2  # the zero padding occupies the lower half of the rows


@pytest.mark.parametrize("bad", [0, 3, 12, 2**20 + 1])
def test_factorize_rejects_non_powers_of_two(bad):
    with pytest.raises(ValueError):
        factorize(bad)


@pytest.mark.parametrize("factors", [(8,), (4, 2), (2, 4, 8)])
def test_row_frequency_order_is_a_permutation(factors):
    order = row_frequency_order(factors)
    assert sorted(order) == list(range(math.prod(factors)))


@pytest.mark.parametrize("length", [3, 100, 8192, 9000])
def test_spectrum_layout_matches_fft(length, gen):
    """The stored entry (k1, pos) holds frequency k1 + n1·g(pos), and every rfft bin is reachable."""
    plan = plan_for(length)
    x = torch.randn(2, length, generator=gen, dtype=torch.float64)
    full = torch.fft.fft(x, n=plan.fft_size)
    expected = full[:, spectrum_frequencies(plan)]
    # (the CUDA kernel's layout is checked against this op on the GPU: test_filter_spectrum_kernel)
    stored = torch.view_as_complex(ops.filter_spectrum(x, length, "fp32")) * plan.fft_size
    torch.testing.assert_close(stored, expected, rtol=1e-12, atol=1e-9)
    # every rfft bin is stored, as itself or as its conjugate partner N - f
    n = plan.fft_size
    assert set(range(n // 2 + 1)) <= {min(f, n - f) for f in spectrum_frequencies(plan).flatten().tolist()}


def test_tables_are_cached_per_size_dtype_device():
    plan = plan_for(1000)
    a = tables_for(plan.fft_size, plan.factors, torch.float32, torch.device("cpu"))
    assert tables_for(plan.fft_size, plan.factors, torch.float32, torch.device("cpu")) is a
    assert tables_for(plan.fft_size, plan.factors, torch.float64, torch.device("cpu")) is not a
    assert a.stage1.shape == (plan.half_rows, plan.n1 // 2)

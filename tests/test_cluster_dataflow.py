"""The thread-block-cluster design for long sequences (docs/design.md, "Long sequences on a
thread-block cluster"; designed in session 27, no CUDA yet): its data flow emulated in float64
on the CPU, so that the index algebra the kernel will follow is checked before any of it runs.

One sequence of N = 2·Q·S real points is one cluster of Q CTAs. The real input is packed two
reals a complex value, z[t] = u[2t] + i·u[2t+1], M = N/2 = Q·S points, t = s + S·q. CTA r owns
the frequencies k = r + Q·k2 (k2 < S):

  a_r[s]        = W_M^(s·r) · Σ_{q < Q/2} z[s + S·q] · W_Q^(q·r)    every CTA reads the sequence's
                                                                    nonzero half (L2), no exchange
  Z[r + Q·k2]   = FFT_S(a_r)[k2]                                    the on-chip radix passes of S
  U[k]          = split(Z[k], Z[M-k])                               the partner CTA (Q - r) mod Q
  Y[k]          = U[k]·K[k]                                         K stored in the cluster layout
  W[k]          = merge(Y[k], Y[M-k])                               the partner again
  b_r[s]        = W_M^(-s·r) · IFFT_S(W_r)[s]                        the radix passes' inverse
  w[s + S·q]    = (1/Q) Σ_r W_Q^(-q·r) · b_r[s],  q < Q/2            the gather: CTA r takes the
                                                                    s in its Q-th of S, reading
                                                                    every CTA's b (DSMEM)
  y[2t] + i·y[2t+1] = w[t], the first L samples.
"""

import math

import pytest
import torch

from helpers import randn, reference, rel_l2


def w(n: int, e: torch.Tensor) -> torch.Tensor:
    """W_n^e = exp(-2πi·e/n), the exponent reduced mod n in integers first (as the kernels will)."""
    return torch.polar(torch.ones(e.shape, dtype=torch.float64), (e % n).double() * (-2 * math.pi / n))


def partner(r: int, k2: torch.Tensor, Q: int, S: int) -> tuple[int, torch.Tensor]:
    """The CTA and local index holding frequency M - k for k = r + Q·k2 (M - 0 is 0)."""
    if r == 0:
        return 0, (S - k2) % S
    return Q - r, S - 1 - k2


def cluster_spectrum(x: torch.Tensor, Q: int, S: int, stats: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The first half of x's real spectrum over N = 2·Q·S in the cluster layout, U[r][k2] =
    rfft(x)[r + Q·k2], and U[M] (real), through the forward steps; each step checked against
    torch.fft on the way."""
    M, N, L = Q * S, 2 * Q * S, x.shape[-1]
    assert L <= N // 2 and Q % 2 == 0
    padded = torch.zeros(2 * M, dtype=torch.float64)
    padded[:L] = x
    z = torch.complex(padded[0::2], padded[1::2])  # M points; t >= M/2 are the zero padding
    chunks = z.reshape(Q, S)  # chunks[q][s] = z[s + S·q]
    assert not chunks[Q // 2:].any()
    s = torch.arange(S)
    scale = 1e-9 * (1 + padded.abs().sum().item())

    # Every CTA r from the nonzero chunks (read from global memory, L2: no exchange)
    Z = torch.empty(Q, S, dtype=torch.complex128)  # Z[r][k2] = FFT_M(z)[r + Q·k2]
    for r in range(Q):
        a = sum(chunks[q] * w(Q, torch.tensor(q * r)) for q in range(Q // 2)) * w(M, s * r)
        Z[r] = torch.fft.fft(a)
    natural = torch.empty(M, dtype=torch.complex128)
    for r in range(Q):
        natural[r::Q] = Z[r]
    assert torch.allclose(natural, torch.fft.fft(z), rtol=0, atol=scale)

    # Split: U[k], k < M, from Z[k] and conj(Z[M-k]); U[M] from Z[0]
    U = torch.empty(Q, S, dtype=torch.complex128)
    k2 = torch.arange(S)
    for r in range(Q):
        pr, pk = partner(r, k2, Q, S)
        if pr != r:
            stats["split"] = stats.get("split", 0) + S
        zk, zm = Z[r], Z[pr][pk].conj()
        U[r] = (zk + zm) / 2 - 0.5j * w(N, r + Q * k2) * (zk - zm)
    nyquist = (Z[0][0].real - Z[0][0].imag).to(torch.complex128)
    full = torch.fft.rfft(padded, n=N)
    for r in range(Q):
        assert torch.allclose(U[r], full[r:M:Q], rtol=0, atol=scale)
    assert abs(nyquist - full[M]) < scale
    return U, nyquist


def cluster_inverse(Y: torch.Tensor, y_nyquist: torch.Tensor, Q: int, S: int, length: int, stats: dict) -> torch.Tensor:
    """The first `length` (<= N/2) samples of the real signal whose rfft is Y (cluster layout) and
    Y[M]: the merge with the partner, each CTA's inverse and twiddles, the gather."""
    M, N = Q * S, 2 * Q * S
    s, k2 = torch.arange(S), torch.arange(S)
    # Merge: the packed output's spectrum W[k] = Y_e[k] + i·Y_o[k] from Y[k] and conj(Y[M-k])
    Wk = torch.empty(Q, S, dtype=torch.complex128)
    for r in range(Q):
        pr, pk = partner(r, k2, Q, S)
        if pr != r:
            stats["merge"] = stats.get("merge", 0) + S
        yk, ym = Y[r], Y[pr][pk].conj()
        if r == 0:  # M - 0 is the Nyquist bin, not bin 0
            ym = ym.clone()
            ym[0] = y_nyquist.conj()
        Wk[r] = (yk + ym) / 2 + 0.5j * (yk - ym) * w(N, -(r + Q * k2))
    # Each CTA's local inverse with its twiddles, then the gather over the CTAs
    b = torch.stack([torch.fft.ifft(Wk[r]) * w(M, -s * r) for r in range(Q)])  # ifft: 1/S
    out = torch.empty(Q // 2, S, dtype=torch.complex128)
    share = S // Q  # CTA g gathers s in [g·share, (g+1)·share) for every q < Q/2
    for g in range(Q):
        rows = slice(g * share, (g + 1) * share)
        for q in range(Q // 2):
            out[q, rows] = sum(b[r, rows] * w(Q, torch.tensor(-q * r)) for r in range(Q)) / Q
        stats["gather"] = stats.get("gather", 0) + (Q - 1) * share * (Q // 2)
    packed = out.reshape(-1)  # w[t], t < M/2
    return torch.stack([packed.real, packed.imag], -1).reshape(-1)[:length]


def cluster_layout(K: torch.Tensor, Q: int, S: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A filter's rfft (M + 1 values) as the cluster kernels would store it: [r][k2] = K[r + Q·k2], and K[M]."""
    M = Q * S
    return torch.stack([K[r:M:Q] for r in range(Q)]), K[M]


SHAPES = [(4, 16, 64, 64), (4, 32, 101, 77), (8, 16, 128, 128), (8, 8, 61, 13), (2, 64, 128, 5)]


@pytest.mark.parametrize("Q, S, L, Lk", SHAPES)
def test_cluster_forward_is_the_causal_convolution(gen, Q, S, L, Lk):
    """The cluster's forward, step by step (each step's intermediate checked against torch.fft on
    the way), gives the causal convolution; and the exchanges are what the design counts: the split
    and the merge read S values from the partner CTA in the Q - 2 CTAs not paired with themselves,
    the gather (Q - 1)/Q of the causal half's b values."""
    N = 2 * Q * S
    u, k = randn(gen, L, dtype=torch.float64), randn(gen, Lk, dtype=torch.float64)
    K, K_nyquist = cluster_layout(torch.fft.rfft(k, n=N), Q, S)
    stats: dict = {}
    U, U_nyquist = cluster_spectrum(u, Q, S, stats)
    y = cluster_inverse(U * K, U_nyquist * K_nyquist, Q, S, L, stats)
    want = reference(u.reshape(1, 1, -1), k.reshape(1, -1))[0, 0]
    assert rel_l2(y, want) < 1e-12
    assert stats.get("split", 0) == stats.get("merge", 0) == (Q - 2) * S
    assert stats["gather"] == (Q - 1) * S * Q // 2


@pytest.mark.parametrize("Q, S, L, Lk", SHAPES)
def test_cluster_backward_gives_the_gradients(gen, Q, S, L, Lk):
    """The backward on the same steps: du = the forward's pipeline on dy with conj K (the
    correlation), dk = the first Lk samples of the inverse of Σ_b conj(U_b)·DY_b, accumulated
    in the cluster layout (each CTA its own r: no exchange for the sum), against float64 autograd
    of the plain convolution, for a batch of three sequences of one channel."""
    N, batch = 2 * Q * S, 3
    u = randn(gen, batch, 1, L, dtype=torch.float64).requires_grad_()
    k = randn(gen, 1, Lk, dtype=torch.float64).requires_grad_()
    dy = randn(gen, batch, 1, L, dtype=torch.float64)
    want_du, want_dk = torch.autograd.grad(reference(u, k), (u, k), dy)
    K, K_nyquist = cluster_layout(torch.fft.rfft(k.detach()[0], n=N), Q, S)
    stats: dict = {}
    acc = torch.zeros(Q, S, dtype=torch.complex128)
    acc_nyquist = torch.zeros((), dtype=torch.complex128)
    for b in range(batch):
        U, U_nyquist = cluster_spectrum(u.detach()[b, 0], Q, S, stats)
        DY, DY_nyquist = cluster_spectrum(dy[b, 0], Q, S, stats)
        du = cluster_inverse(DY * K.conj(), DY_nyquist * K_nyquist.conj(), Q, S, L, stats)
        assert rel_l2(du, want_du[b, 0]) < 1e-12
        acc += U.conj() * DY
        acc_nyquist += U_nyquist.conj() * DY_nyquist
    dk = cluster_inverse(acc, acc_nyquist, Q, S, Lk, stats)
    assert rel_l2(dk, want_dk[0]) < 1e-12

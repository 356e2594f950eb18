"""fftconv_bench: monarch_fftconv against torch.fft (cuFFT on a GPU, MKL or pocketfft on the
host), honest, complete, pictured.

Methods, side by side in one run (all take u (B,C,L) and k (C,L), or the operator's filter, in
the I/O dtype, --io-dtype, float32 by default, and return y in it; the inputs are drawn in
float32 and cast to it):
  reference          torch.fft exactly as commonly written: F.pad to 2L, rfft of u AND of k every
                     call, irfft, slice [..., :L]. torch.fft transforms no bfloat16 (float16 only
                     at powers of two on a GPU), so with half-precision I/O every torch.fft
                     method computes as users write it: inputs cast to float32, y cast back.
  cufft-tuned        rfft(u, n=2L) with the filter spectrum rfft(k, n=2L) computed once outside
                     the timed call (forward). With --backward the filter spectrum must be
                     recomputed every call (it needs a gradient), so it is. Named for the library
                     torch.fft runs: mkl-tuned or pocketfft-tuned on a CPU.
  compile-reference  torch.compile of `reference` (--compile); compile time is not timed.
  monarch[<p>]       monarch_fftconv.fftconv(u, k, precision=p) for each p in
                     monarch_fftconv.PRECISIONS, labelled with the backend explain() reports;
                     half-precision tensors go in as they are (the package takes them natively).
  monarch-module     monarch_fftconv.FFTConv (package-default precision) inside an
                     inference_cache() block, which computes the filter spectrum once: the
                     like-for-like rival of cufft-tuned.
  cudnn              the production peer (issue #32): cuDNN's FFT causal convolution,
                     cudnn.ops.fft_causal_conv1d(u, k) of nvidia-cudnn-frontend (cuDNN >= 9.26,
                     CUDA only, differentiable), the tensors in the I/O dtype as they are. Where
                     the frontend cannot run it (torch bundling an older cuDNN), its C API
                     (cudnnFFTCausalConv1d*, cudnnLongFFTCausalConv1d*; cudnn_capi) of the kit
                     folder MONARCH_FFTCONV_CUDNN_KIT names: lib/libcudnn_ext.so.9 and include/,
                     as ../shared/tools/cudnn_kit.sh builds (benchmarks/gpu_setup.sh sets it
                     from a carried .cudnn_kit/). Its first call per shape JIT-compiles
                     (8-42 s): made before the warm-up, timed apart (first_call_s), left out of
                     the medians. Where neither route can run (no module, too old a cuDNN and
                     no kit, a CPU run) the run prints one line saying why and lists it in the
                     JSON's `skipped`; a shape it refuses is skipped the same way.

What every method computes is the run's operator (--operator, issue #30; operators.py):
  plain          y = conv(u, k), k (C, L): the default.
  gated          y = postgate ⊙ (conv(x, k) + D ⊙ x), x = pregate ⊙ u; D ~ N(0,1) (C,), the gates
                 ~ N(0,1) of u's shape.
  grouped        G = C/16 filters (G, L), each shared by 16 channels.
  bidirectional  (C, 2, L) filters, causal and anti-causal halves.
The reference writes each in torch.fft as users do today (grouped: the filter repeated per
channel with repeat_interleave; bidirectional: irfft(rfft(x, n=2L) · (rfft(k_fwd, n=2L) +
conj(rfft(k_rev, n=2L))), n=2L)[..., :L]); the tuned torch.fft method caches the operator's filter
spectrum; monarch[p] passes D, the gates and bidirectional=True to fftconv; monarch-module takes
grouped and bidirectional filters (FFTConv(groups=, bidirectional=)) but no gates; monarch-tc
and cudnn have the plain form only. A method without the run's operator is skipped with a
one-line reason. With --backward the grads of every differentiable input (u, k, and for gated
D and both gates) are checked. Preset `flashfftconv`, 64x768x8192 (FFT size 16K), is
FlashFFTConv's published gated fp16 shape: --operator gated --io-dtype float16 times each
precision there.

Rows that run the same code (entry point, backend and kernel: on a CPU every monarch[<p>]
runs the same torch.fft code) are marked `same_computation_as` the first, get no speedup of
their own in the table, and are drawn once in the plots.
With --backward every method is a training step, timed two ways: `<method>` takes the grads with
torch.autograd.grad(y, (u, k and, gated, D and the gates), g); `<method>.backward` calls
y.backward(g), accumulating into the .grad of leaf tensors that keep their grads across reps, as
an optimizer loop does.

Timing: two figures per method, each the median and IQR of --reps reps (default 50) after a
warm-up that lasts until the times settle (at least --warmup calls, then until two windows of
calls agree to 10%), each rep the whole call as a user makes it (Python dispatch and launches
included).
Back-to-back (throughput): calls enqueued one after another, a CUDA event pair around each.
Per-call latency: one call at a time on an idle GPU (synchronized before each), host overhead
on the critical path; at small sizes it can far exceed the back-to-back time (see timing.py).
Inputs rotate among enough buffer sets that their total exceeds twice the L2 cache; if that would
need too many buffers (tiny shapes), a 256 MB buffer is written between reps instead, outside the
timed region. On a CPU-only machine both figures come from the host timer time.perf_counter and
the results say plainly that they are CPU figures.

Validity, measured in the same run: relative L2 error of every method against float64 torch.fft
on the same inputs (the values cast to the I/O dtype, so each method's error is its own
arithmetic's; the operators written apart from the methods' forms, guard.float64_operator),
allclose(atol=1e-2, rtol=1e-2), and for monarch methods the error budget of their precision
(monarch_fftconv.policy.ERROR_BUDGETS) plus, with half-precision I/O, y's own rounding (2^-8
bfloat16, 2^-11 float16); the device copy bandwidth, and from it each shape's memory floor
(compulsory bytes at the I/O element size, the operator's filters, gates and D counted); a time
under the floor is printed INVALID and gets no speedup. A row whose IQR exceeds --max-spread
(0.25) of its median on either clock is NOISY: untrusted in the table, the JSON and the plots,
and it gets no speedup either.

Modules: cli (arguments, run configuration, main), operators (what is computed), methods (what
is timed), timing (the clocks), probes (peak memory, kernel launches, energy), guard (error
check and memory floor), runner (one run: shapes x methods -> rows), report (progress and the
printed tables), outputs (environment, results.json, results.csv, and results.jsonl written row
by row as the run goes), plots (PNGs).
"""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

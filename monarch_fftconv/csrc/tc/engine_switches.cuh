// monarch_fftconv: the tensor-core engine's build-time switches written in session 35 without a
// GPU, each off by default until benchmarks/ab_builds.sh has measured it (docs/design.md, "The
// next tensor-core engine"; docs/performance.md, "After session 35"). Set by
// MONARCH_FFTCONV_NVCC_DEFINES. Their own header so that dispatch.cu reads them without CuTe.
//
// CUDA headers only: never include torch here.
#pragma once

// How the producer reads u (load_plane, engine_producer.cuh). 0 (the default, every measured
// run): a thread loads 8 consecutive samples as two 16-byte loads, so each load instruction of a
// warp spans 1 KB and uses half of every 32-byte sector it fetches (the no-allocate loads do not
// keep it in L1 for the second): ncu's 4,194,304 excess sectors at 16x256x8192, exactly u's count
// (session 35). 1: each load instruction of a warp reads 512 consecutive bytes (a thread's load n
// is quad pt + 128 n of 4 samples), stored as 8-byte halves of the ring's 16-byte chunks. The same
// values in the same places: the same bits. Written in session 35 without a GPU; measure with
// benchmarks/ab_builds.sh before making it the default.
#ifndef MONARCH_FFTCONV_ENGINE_COALESCED_LOADS
#define MONARCH_FFTCONV_ENGINE_COALESCED_LOADS 0
#endif

// Where the resident filter comes from. 0 (the default, every measured run): the producer reads
// the channel's fp32 spectrum twice at each channel change (filter_peak, then filter_store after
// filter_free), 17 dependent rounds of loads each on its 40 registers; the consumers waited for
// it 10.8% of their time at 16x256x8192 (ncu, session 35). 1: a kernel before the engine writes
// each channel's resident image (the same words, the same XOR-swizzled order) and its two
// unscales to a workspace (conv_forward_tensor_core_workspace_bytes), and the producer's thread 0
// copies the image into shared memory with one bulk copy (cp.async.bulk, completing filter_full's
// transaction count): no registers, one round trip. The same bits. Written in session 35 without
// a GPU; measure with benchmarks/ab_builds.sh before making it the default.
#ifndef MONARCH_FFTCONV_ENGINE_FILTER_IMAGE
#define MONARCH_FFTCONV_ENGINE_FILTER_IMAGE 0
#endif

// How the epilogues find column c = 0 (the real columns 0 and n2/2 of filter_to_operand and
// handoff_store). 0 (the default, every measured run): `c == 0` with c = 8j + 2q + e, and q is
// opaque to the compiler (Lane::opaque), so every unrolled (h, j) of handoff_store kept a branch
// around its c = 0 code (a sincospif with it): 16 branch-and-reconverge blocks, 558
// no-instruction samples at their BSYNCs (ncu, session 35). 1: the same test spelt j == 0 (and
// e == 0) and q == 0, true for the same lanes (q = lane % 4 < 4), so the unrolled j > 0 have no
// branch: 14 blocks fewer a kernel, 1,192 SASS instructions fewer in the two instances (5.7%),
// the same registers and spills, the same bits. Written in session 35 without a GPU.
#ifndef MONARCH_FFTCONV_ENGINE_CORNER_BY_INDEX
#define MONARCH_FFTCONV_ENGINE_CORNER_BY_INDEX 0
#endif

// Which I/O types the engine takes. 0 (the default, every measured run): fp32 u and y only
// (engine::pick refuses 2-byte I/O, which takes the fp32 or mma.sync kernel). 1: bf16 and fp16 u
// and y too, for calls that name the engine (MONARCH_FFTCONV_TC_KERNEL=engine; not the route,
// whose tables in backends.py know fp32 I/O only): the producer reads 8 samples with one 16-byte
// load (a warp's loads contiguous) and stores them into the ring as they are where the I/O type
// is the operand type, and y is rounded to the I/O type in store_y. Half the input bytes and
// half the producer's loads: #36's "bf16 I/O faster than fp32 I/O" where the engine runs. Written
// in session 35 without a GPU; measure with benchmarks/ab_builds.sh before it joins the route.
#ifndef MONARCH_FFTCONV_ENGINE_HALF_IO
#define MONARCH_FFTCONV_ENGINE_HALF_IO 0
#endif

/* A TEST DOUBLE of cuDNN's FFT causal convolution C API (cudnn_subquadratic_ops.h), never the
 * real library: tests/test_cudnn_capi.py compiles it into a fake kit, as lib/libcudnn_ext.so.9 and,
 * with -DERROR_STRINGS_ONLY, lib/libcudnn.so.9 (where the real cudnnGetErrorString lives).
 *
 * It checks each call's arguments as the header states them (powers of two, L % K, L == K on the
 * long path, 16-byte alignment, buffers at least the sizes it reports), computes the convolution
 * directly on host memory (the tests pass CPU tensors), records one line per call
 * (double_call(i)), and returns the status set by double_fail_next(status) once.
 * dweight is added to, so a caller that does not zero it gets wrong gradients. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { SUCCESS = 0, BAD_PARAM = 2000, NOT_SUPPORTED = 3000 };

const char *cudnnGetErrorString(int status) {
    switch (status) {
        case SUCCESS: return "CUDNN_STATUS_SUCCESS";
        case BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
        case NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
        default: return "CUDNN_STATUS_UNKNOWN (test double)";
    }
}

#ifndef ERROR_STRINGS_ONLY
enum { DATA_FLOAT = 0, DATA_DOUBLE = 1, DATA_BFLOAT16 = 9 };
enum { MAX_CALLS = 64, LINE = 512 };

static char calls[MAX_CALLS][LINE];
static int n_calls;
static int fail_next;

int double_call_count(void) { return n_calls; }
const char *double_call(int i) { return i >= 0 && i < n_calls ? calls[i] : ""; }
void double_fail_next(int status) { fail_next = status; }
void double_reset(void) { n_calls = 0; fail_next = 0; }

#define RECORD(...) \
    do { if (n_calls < MAX_CALLS) snprintf(calls[n_calls++], LINE, __VA_ARGS__); } while (0)

static int take_failure(void) {
    int status = fail_next;
    fail_next = 0;
    return status;
}

static double load(const void *p, long i, int dtype) {
    if (dtype == DATA_FLOAT) return ((const float *)p)[i];
    if (dtype == DATA_DOUBLE) return ((const double *)p)[i];
    uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void store(void *p, long i, int dtype, double v) {
    if (dtype == DATA_FLOAT) { ((float *)p)[i] = (float)v; return; }
    if (dtype == DATA_DOUBLE) { ((double *)p)[i] = v; return; }
    float f = (float)v;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits += 0x7fff + ((bits >> 16) & 1);   /* round to nearest even */
    ((uint16_t *)p)[i] = (uint16_t)(bits >> 16);
}

static int is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }
static int aligned(const void *p) { return p != NULL && ((uintptr_t)p & 15) == 0; }
static int known_dtype(int dtype) {
    return dtype == DATA_FLOAT || dtype == DATA_DOUBLE || dtype == DATA_BFLOAT16;
}
/* Every entry's first checks, in the library's order: an injected failure, then the dtype. */
static int entry_status(int dtype) {
    int status = take_failure();
    if (status) return status;
    return known_dtype(dtype) ? SUCCESS : NOT_SUPPORTED;
}

static int medium_ok(int B, int D, int L, int K) {
    return B > 0 && D > 0 && is_pow2(K) && K >= 128 && K <= 16384 && L >= K && L % K == 0;
}
static int long_ok(int B, int D, int L, int K) {
    return B > 0 && D > 0 && L == K && is_pow2(K) && K >= 4096 && K <= (1 << 24);
}

/* y[b, d, t] = sum_{j < K, j <= t} w[d, j] x[b, d, t - j] */
static void conv(const void *x, int x_dtype, const void *w, int w_dtype, void *y, int dtype,
                 int B, int D, int L, int K) {
    for (long b = 0; b < B; b++)
        for (long d = 0; d < D; d++)
            for (long t = 0; t < L; t++) {
                double acc = 0;
                for (long j = 0; j < K && j <= t; j++)
                    acc += load(w, d * K + j, w_dtype) * load(x, (b * D + d) * L + t - j, x_dtype);
                store(y, (b * D + d) * L + t, dtype, acc);
            }
}

/* dx[t] = sum_j w[j] dy[t + j];  dw[j] += sum_b sum_t dy[t] x[t - j] */
static void conv_backward(const void *x, int x_dtype, const void *w, int w_dtype, const void *dy,
                          void *dx, void *dw, int dtype, int B, int D, int L, int K) {
    for (long b = 0; b < B; b++)
        for (long d = 0; d < D; d++)
            for (long t = 0; t < L; t++) {
                double acc = 0;
                for (long j = 0; j < K && t + j < L; j++)
                    acc += load(w, d * K + j, w_dtype) * load(dy, (b * D + d) * L + t + j, dtype);
                store(dx, (b * D + d) * L + t, dtype, acc);
            }
    for (long d = 0; d < D; d++)
        for (long j = 0; j < K; j++) {
            double acc = load(dw, d * K + j, dtype);
            for (long b = 0; b < B; b++)
                for (long t = j; t < L; t++)
                    acc += load(dy, (b * D + d) * L + t, dtype) * load(x, (b * D + d) * L + t - j, x_dtype);
            store(dw, d * K + j, dtype, acc);
        }
}

int cudnnFFTCausalConv1dForward(void *stream, const void *x, const void *w, void *y,
                                int B, int D, int L, int K, int dtype) {
    RECORD("cudnnFFTCausalConv1dForward stream=%p x=%p w=%p y=%p B=%d D=%d L=%d K=%d dtype=%d",
           stream, x, w, y, B, D, L, K, dtype);
    int status = entry_status(dtype);
    if (status) return status;
    if (!medium_ok(B, D, L, K) || !aligned(x) || !aligned(w) || !aligned(y)) return BAD_PARAM;
    conv(x, dtype, w, dtype, y, dtype, B, D, L, K);
    return SUCCESS;
}

int cudnnFFTCausalConv1dBackward(void *stream, const void *x, const void *w, const void *dy,
                                 void *dx, void *dw, int B, int D, int L, int K, int dtype) {
    RECORD("cudnnFFTCausalConv1dBackward stream=%p x=%p w=%p dy=%p dx=%p dw=%p B=%d D=%d L=%d K=%d "
           "dtype=%d", stream, x, w, dy, dx, dw, B, D, L, K, dtype);
    int status = entry_status(dtype);
    if (status) return status;
    if (!medium_ok(B, D, L, K) || !aligned(x) || !aligned(w) || !aligned(dy) || !aligned(dx) ||
        !aligned(dw))
        return BAD_PARAM;
    conv_backward(x, dtype, w, dtype, dy, dx, dw, dtype, B, D, L, K);
    return SUCCESS;
}

/* The long path's reserve keeps x and w in double, as the real one keeps their spectra. */
static size_t workspace_size(int B, int D, int L) { return (size_t)B * D * L * 2 + 64; }
static size_t reserve_size(int B, int D, int L) { return ((size_t)B * D * L + (size_t)D * L) * 8; }

int cudnnLongFFTCausalConv1dGetBufferSizes(int B, int D, int L, int K, int dtype,
                                           size_t *workspace, size_t *reserve) {
    RECORD("cudnnLongFFTCausalConv1dGetBufferSizes B=%d D=%d L=%d K=%d dtype=%d", B, D, L, K, dtype);
    int status = entry_status(dtype);
    if (status) return status;
    if (!long_ok(B, D, L, K) || !workspace || !reserve) return BAD_PARAM;
    *workspace = workspace_size(B, D, L);
    *reserve = reserve_size(B, D, L);
    return SUCCESS;
}

/* The long forward's and backward's checks: entry_status's, then the shape, the three data
   pointers' alignment and the buffers the sizes call asked for. */
static int long_call_status(int dtype, int B, int D, int L, int K, const void *a, const void *b,
                            const void *c, const void *ws, size_t ws_bytes, const void *rs,
                            size_t rs_bytes) {
    int status = entry_status(dtype);
    if (status) return status;
    int ok = long_ok(B, D, L, K) && aligned(a) && aligned(b) && aligned(c) && aligned(ws) &&
             aligned(rs) && ws_bytes >= workspace_size(B, D, L) && rs_bytes >= reserve_size(B, D, L);
    return ok ? SUCCESS : BAD_PARAM;
}

int cudnnLongFFTCausalConv1dForward(void *stream, const void *x, const void *w, void *y,
                                    int B, int D, int L, int K, int dtype, void *ws,
                                    size_t ws_bytes, void *rs, size_t rs_bytes) {
    RECORD("cudnnLongFFTCausalConv1dForward stream=%p x=%p w=%p y=%p B=%d D=%d L=%d K=%d dtype=%d "
           "workspace=%p workspace_bytes=%zu reserve=%p reserve_bytes=%zu",
           stream, x, w, y, B, D, L, K, dtype, ws, ws_bytes, rs, rs_bytes);
    int status = long_call_status(dtype, B, D, L, K, x, w, y, ws, ws_bytes, rs, rs_bytes);
    if (status) return status;
    memset(ws, 0xA5, ws_bytes);   /* scratch: the caller must not rely on it */
    long n_x = (long)B * D * L;
    for (long i = 0; i < n_x; i++) store(rs, i, DATA_DOUBLE, load(x, i, dtype));
    for (long i = 0; i < (long)D * K; i++) store(rs, n_x + i, DATA_DOUBLE, load(w, i, dtype));
    conv(x, dtype, w, dtype, y, dtype, B, D, L, K);
    return SUCCESS;
}

int cudnnLongFFTCausalConv1dBackward(void *stream, const void *dy, void *dx, void *dw,
                                     int B, int D, int L, int K, int dtype, void *ws,
                                     size_t ws_bytes, void *rs, size_t rs_bytes) {
    RECORD("cudnnLongFFTCausalConv1dBackward stream=%p dy=%p dx=%p dw=%p B=%d D=%d L=%d K=%d "
           "dtype=%d workspace=%p workspace_bytes=%zu reserve=%p reserve_bytes=%zu",
           stream, dy, dx, dw, B, D, L, K, dtype, ws, ws_bytes, rs, rs_bytes);
    int status = long_call_status(dtype, B, D, L, K, dy, dx, dw, ws, ws_bytes, rs, rs_bytes);
    if (status) return status;
    memset(ws, 0x5A, ws_bytes);
    const double *saved = rs;   /* x, then w, as the forward left them */
    conv_backward(saved, DATA_DOUBLE, saved + (long)B * D * L, DATA_DOUBLE, dy, dx, dw, dtype,
                  B, D, L, K);
    return SUCCESS;
}
#endif

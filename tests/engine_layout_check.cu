// Host checks of the tensor-core engine's integer index maps (tc/engine_traits.cuh), no GPU:
// the swizzled shared-memory layouts, the wgmma fragment maps and the chaining of one GEMM's
// accumulator into the next one's register A operand, the mirrored columns' quad exchange, the
// resident filter's mirrored rows, the hand-off and y coverage, and the persistent schedule.
// The PTX ISA's layouts are written here independently of the traits. Each checker also runs
// on a deliberately wrong map and must reject it, so that the checks are known to be able to fail.
//
// Built by tests/test_engine_layout.py: nvcc -x cu (host code only runs), then run.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <vector>

#include "tc/engine_traits.cuh"
#include "tc/engine_producer.cuh"
#include "host_check.cuh"

using namespace monarch_fftconv;
using namespace monarch_fftconv::engine;
using Cfg = EngineTraits<Precision::kBF16, IOType::kFloat32>;
constexpr int kN1 = Cfg::kN1, kN2 = Cfg::kN2;


// ---------------------------------------------------------------------------
// The PTX ISA, written independently of the traits.
// ---------------------------------------------------------------------------
// wgmma .m64nNk16 accumulator D (fp32): thread t of the warpgroup, register i.
int ptx_d_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
int ptx_d_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }
// wgmma .m64nNk16 register A (.f16/.bf16), one k step: element i (register i / 2, half i % 2).
int ptx_a_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
int ptx_a_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }
// The 128-byte swizzle: within each 1024-byte block, 16-byte chunk c of 128-byte row r moves to c ^ r.
uint32_t ptx_sw128(uint32_t byte) { return byte ^ (((byte >> 7) & 7) << 4); }
// Canonical SW128 layouts of 16-bit elements, as element offsets, with 1024-byte atoms in the
// order the descriptors step through them (the first mode's atoms first):
//   K-major (rows, cols): an atom is 8 rows of 64 contiguous K elements;
//   MN-major (mn, k): an atom is 8 k of 64 contiguous MN elements.
uint32_t sw128_k_major(int row, int k, int rows) {
  const uint32_t atom = row / 8 + (rows / 8) * (k / 64);
  return ptx_sw128(atom * 1024 + (row % 8) * 128 + (k % 64) * 2) / 2;
}
uint32_t sw128_mn_major(int mn, int k, int mns) {
  const uint32_t atom = mn / 64 + (mns / 64) * (k / 8);
  return ptx_sw128(atom * 1024 + (k % 8) * 128 + (mn % 64) * 2) / 2;
}

// ---------------------------------------------------------------------------
// Layouts
// ---------------------------------------------------------------------------
using Offset = std::function<uint32_t(int, int)>;

// A layout of (m, n) elements: a bijection onto [0, m·n), equal to the reference.
bool check_layout(const char* name, int m, int n, const Offset& got, const Offset& want) {
  std::vector<int> hits(size_t(m) * n, 0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const uint32_t o = got(i, j);
      EXPECT(o < uint32_t(m * n), "%s (%d, %d) -> %u: outside the buffer", name, i, j, o);
      EXPECT(hits[o]++ == 0, "%s (%d, %d) -> %u: taken twice", name, i, j, o);
      EXPECT(o == want(i, j), "%s (%d, %d) -> %u, the PTX layout says %u", name, i, j, o, want(i, j));
    }
  return true;
}

// A 1024-byte aligned host buffer as large as the largest layout: the swizzle acts on address bits.
cute::bfloat16_t* aligned_buffer() {
  alignas(1024) static cute::bfloat16_t buffer[Cfg::kHandoffElems];
  return buffer;
}

// CuTe's smem tensor over a 1024-byte aligned host buffer: the element offset its address
// arithmetic (the descriptors' view) gives to (i, j).
template <class Layout>
Offset cute_offsets(Layout layout) {
  cute::bfloat16_t* buffer = aligned_buffer();
  return [layout, buffer](int i, int j) {
    auto t = make_tensor(make_smem_ptr(buffer), layout);
    return uint32_t(&t(i, j) - buffer);
  };
}

bool check_layouts(bool wrong) {
  const int kR = Cfg::kTileRows;
  Offset f1 = cute_offsets(Cfg::LayoutF1{}), f1t = cute_offsets(Cfg::LayoutF1T{});
  Offset f2 = cute_offsets(Cfg::LayoutF2{}), ring = cute_offsets(Cfg::LayoutRing{});
  Offset handoff = cute_offsets(Cfg::LayoutHandoff{});
  Offset ring_traits = [](int s, int r) { return Cfg::ring_offset(s, r); };
  Offset handoff_traits = [](int s, int k1) { return Cfg::handoff_offset(s, k1); };
  if (wrong) ring_traits = [](int s, int r) { return uint32_t(Cfg::LayoutRing{}.layout_b()(s, r)); };  // unswizzled
  auto k_major = [](int rows) { return [rows](int i, int j) { return sw128_k_major(i, j, rows); }; };
  auto mn_major = [](int mns) { return [mns](int i, int j) { return sw128_mn_major(i, j, mns); }; };
  bool ok = check_layout("F1 (k1, r)", kN1, kR, f1, k_major(kN1)) &&
            check_layout("F1T (r, k1)", kR, kN1, f1t, mn_major(kR)) &&
            check_layout("F2 (j, s)", Cfg::kHalfCols, kN2, f2, k_major(Cfg::kHalfCols)) &&
            check_layout("ring (s, r)", kN2, kR, ring, mn_major(kN2)) &&
            check_layout("ring_offset (s, r)", kN2, kR, ring_traits, mn_major(kN2)) &&
            check_layout("hand-off (s, k1)", kN2, kN1, handoff, mn_major(kN2)) &&
            check_layout("handoff_offset (s, k1)", kN2, kN1, handoff_traits, mn_major(kN2));
  if (!ok) return false;
  // Inverse 1 reads F1's bytes transposed.
  for (int r = 0; r < kR; ++r)
    for (int k1 = 0; k1 < kN1; ++k1) EXPECT(f1t(r, k1) == f1(k1, r), "F1T (%d, %d) is not F1 (%d, %d)", r, k1, k1, r);
  // The producer's 16-byte stores: 8 consecutive s from a multiple of 8 are one aligned chunk.
  for (int r = 0; r < kR; ++r)
    for (int s0 = 0; s0 < kN2; s0 += Cfg::kU8PerThread) {
      EXPECT(ring_traits(s0, r) % 8 == 0, "ring chunk (%d, %d) not 16-byte aligned", s0, r);
      for (int i = 1; i < Cfg::kU8PerThread; ++i)
        EXPECT(ring_traits(s0 + i, r) == ring_traits(s0, r) + i, "ring chunk (%d, %d) not contiguous", s0, r);
    }
  // The hand-off's 4-byte pair stores: s = c, c + 1 adjacent for even c.
  for (int k1 = 0; k1 < kN1; ++k1)
    for (int c = 0; c < kN2; c += 2) EXPECT(handoff_traits(c + 1, k1) == handoff_traits(c, k1) + 1, "hand-off pair (%d, %d)", c, k1);
  return true;
}

// The filter images' workspace (filter_image_kernel writes it): channel c's image at a
// 16-byte aligned offset, kImageBytes long (the filter's words, then its unscales, as Smem holds
// them), the images disjoint and inside `bytes`, the size the binding allocates.
using ImagesBytes = std::function<size_t(int64_t)>;
bool check_filter_images(const ImagesBytes& bytes) {
  EXPECT(Cfg::kImageBytes == Cfg::kFilterWords * 4 + 16 && Cfg::kFilterWords == Cfg::kFilterRows * kN2,
         "an image is the resident buffer's words and 16 bytes of unscales");
  EXPECT(offsetof(Cfg::Smem, handoff_unscale) == offsetof(Cfg::Smem, filter) + Cfg::kFilterBytes,
         "the unscales follow the filter in shared memory, as in the image");
  for (const int64_t channels : {int64_t(1), int64_t(3), int64_t(256), int64_t(70001)}) {
    for (int64_t c = 0; c < channels; ++c) {
      const size_t at = FilterImages<Cfg>::offset(c);
      EXPECT(at % 16 == 0, "channel %lld's image at byte %zu: not 16-byte aligned", (long long)c, at);
      EXPECT(c == 0 || at == FilterImages<Cfg>::offset(c - 1) + Cfg::kImageBytes, "channel %lld's image overlaps", (long long)c);
      EXPECT(at + Cfg::kImageBytes <= bytes(channels), "channel %lld's image past the workspace", (long long)c);
    }
  }
  return true;
}

// The tiles the consumers' descriptors start from: a warpgroup's F1 rows and hand-off column half.
bool check_tiles() {
  cute::bfloat16_t* buffer = aligned_buffer();
  auto f1 = make_tensor(make_smem_ptr(buffer), Cfg::LayoutF1{});
  auto h = make_tensor(make_smem_ptr(buffer), Cfg::LayoutHandoff{});
  for (int wg = 0; wg < Cfg::kConsumers; ++wg) {
    auto rows = local_tile(f1, Shape<Cfg::TileRows, Cfg::TileRows>{}, make_coord(wg, 0));
    auto half = local_tile(h, Shape<Cfg::HalfCols, Cfg::N1>{}, make_coord(wg, 0));
    for (int i = 0; i < Cfg::kTileRows; ++i)
      for (int j = 0; j < Cfg::kInputRows; ++j)
        EXPECT(&rows(i, j) == &f1(Cfg::kTileRows * wg + i, j), "F1 rows of warpgroup %d at (%d, %d)", wg, i, j);
    for (int s = 0; s < Cfg::kHalfCols; ++s)
      for (int k1 = 0; k1 < kN1; ++k1)
        EXPECT(&half(s, k1) == &h(Cfg::kHalfCols * wg + s, k1), "hand-off half of warpgroup %d at (%d, %d)", wg, s, k1);
  }
  return true;
}

// ---------------------------------------------------------------------------
// Fragments
// ---------------------------------------------------------------------------
struct Maps {
  int (*value)(int, int, int) = acc_value;
  int (*row)(int, int) = acc_row;
  int (*col)(int, int, int) = acc_col;
  int (*reg)(int, int) = operand_register;
  int (*lane)(int, int) = mirror_lane;
  int (*group)(int) = mirror_group<kN2>;
  int (*own_group)(int) = mirror_own_group<kN2>;
  int (*mirror)(int) = mirror_column<kN2>;
};

// The traits' accumulator map is the PTX D layout, for m64 n128 (stage 1) and n64.
bool check_accumulator(const Maps& mp, int n) {
  for (int t = 0; t < 128; ++t) {
    std::set<int> values;
    for (int j = 0; j < n / 8; ++j)
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) {
          const int v = mp.value(j, h, e);
          EXPECT(v >= 0 && v < n / 2 && values.insert(v).second, "n%d thread %d: value %d out of range or repeated", n, t, v);
          EXPECT(mp.row(t, h) == ptx_d_row(t, v) && mp.col(t % 4, j, e) == ptx_d_col(t, v),
                 "n%d thread %d value %d: (%d, %d), PTX D says (%d, %d)", n, t, v, mp.row(t, h), mp.col(t % 4, j, e),
                 ptx_d_row(t, v), ptx_d_col(t, v));
        }
  }
  return true;
}

// Chaining: the packed pair of values (j, h, 0..1) as register operand_register(j, h) is the
// element the PTX A layout puts at the same (row, column), column counted over all k steps.
bool check_chaining(const Maps& mp, int n) {
  for (int t = 0; t < 128; ++t)
    for (int j = 0; j < n / 8; ++j)
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) {
          const int reg = mp.reg(j, h), step = reg / 4, i = 2 * (reg % 4) + e;
          EXPECT(reg >= 0 && reg < n / 4, "register %d out of range", reg);
          EXPECT(ptx_a_row(t, i) == mp.row(t, h) && 16 * step + ptx_a_col(t, i) == mp.col(t % 4, j, e),
                 "thread %d (j %d, h %d, e %d) -> register %d: A has (%d, %d), the accumulator (%d, %d)", t, j, h, e, reg,
                 ptx_a_row(t, i), 16 * step + ptx_a_col(t, i), mp.row(t, h), mp.col(t % 4, j, e));
        }
  return true;
}

// The mirrored half of inverse 2's A operand: register operand_register(m, h), m >= n2/16, of
// thread t must receive the column the PTX A layout puts there, and the kernel takes it from
// lane mirror_lane (or its own lane) of the quad, which made it as the mirror of one of its
// stage-2 columns. Every operand column of every row is then filled exactly once.
bool check_mirror_exchange(const Maps& mp) {
  std::vector<std::set<int>> quad_cols(2 * 128 / 4);  // operand columns of a quad's row h
  for (int t = 0; t < 128; ++t) {
    const int q = t % 4;
    std::set<int>* cols = &quad_cols[2 * (t / 4)];
    for (int j = 0; j < kN2 / 16; ++j)  // the direct half
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) EXPECT(cols[h].insert(mp.col(q, j, e)).second, "thread %d: direct column twice", t);
    for (int m = kN2 / 16; m < kN2 / 8; ++m)
      for (int h = 0; h < 2; ++h)
        for (int e = 0; e < 2; ++e) {
          const int reg = mp.reg(m, h), i = 2 * (reg % 4) + e;
          const int want = 16 * (reg / 4) + ptx_a_col(t, i);
          const bool own = q == 0 && e == 0;
          const int src_q = own ? q : mp.lane(q, e), g = own ? mp.own_group(m) : mp.group(m);
          const int src_t = (t & ~3) | src_q;
          EXPECT(g >= 0 && g < kN2 / 16 && src_q >= 0 && src_q < 4, "thread %d m %d e %d: source out of range", t, m, e);
          EXPECT(mp.row(src_t, h) == ptx_a_row(t, i), "thread %d: the source lane holds another row", t);
          const int made = mp.mirror(mp.col(src_q, g, e));
          EXPECT(made == want, "thread %d m %d h %d e %d: lane %d group %d made column %d, A wants %d", t, m, h, e, src_q, g,
                 made, want);
          EXPECT(cols[h].insert(want).second, "thread %d row %d: column %d twice", t, h, want);
        }
  }
  for (size_t i = 0; i < quad_cols.size(); ++i)
    EXPECT(int(quad_cols[i].size()) == kN2, "quad %zu row %zu: %zu of %d columns", i / 2, i % 2, quad_cols[i].size(), kN2);
  return true;
}

// Inverse 2's hand-off stores (both warpgroups) write every (s, k1) exactly once; inverse 1's
// y stores cover t < N/2 exactly once.
bool check_handoff_and_y(const Maps& mp) {
  std::vector<int> handoff(size_t(kN2) * kN1, 0), y(size_t(kN1 / 2) * kN2, 0);
  for (int wg = 0; wg < Cfg::kConsumers; ++wg)
    for (int t = 0; t < 128; ++t)
      for (int h = 0; h < 2; ++h) {
        const int k1 = Cfg::kTileRows * wg + mp.row(t, h);
        for (int j = 0; j < kN2 / 16; ++j)
          for (int e = 0; e < 2; ++e) {
            const int c = mp.col(t % 4, j, 0);
            for (int s : {c + e, e == 0 ? mp.mirror(c) : kN2 - c - e}) ++handoff[Cfg::handoff_offset(s, k1)];
            ++y[size_t(mp.row(t, h)) * kN2 + Cfg::kHalfCols * wg + mp.col(t % 4, j, e)];
          }
      }
  for (size_t i = 0; i < handoff.size(); ++i) EXPECT(handoff[i] == 1, "hand-off element %zu written %d times", i, handoff[i]);
  for (size_t i = 0; i < y.size(); ++i) EXPECT(y[i] == 1, "y[%zu] stored %d times", i, y[i]);
  return true;
}

// handoff_store's addresses (Cfg::HandoffAddresses: a per-thread base XOR a per-column constant)
// are the plane's base plus 2·handoff_offset, for every column each thread of either warpgroup
// stores (the pair c, c + 1 as one word; the mirrors n2 - c - e, column 0's at n2/2), on any
// plane base that is a multiple of 1024 bytes (128 would do: the XORs stay in bits 1-6; 64
// does not). at(plane, q, k1, j, e): e < 0 is the pair.
using StoreAddress = std::function<uint32_t(uint32_t, int, int, int, int)>;

bool check_handoff_addresses(const StoreAddress& at, const std::vector<uint32_t>& planes) {
  for (uint32_t plane : planes)
    for (int wg = 0; wg < Cfg::kConsumers; ++wg)
      for (int t = 0; t < 128; ++t)
        for (int h = 0; h < 2; ++h) {
          const int q = t % 4, k1 = Cfg::kTileRows * wg + acc_row(t, h);
          for (int j = 0; j < kN2 / 16; ++j) {
            const int c = acc_col(q, j, 0);
            const uint32_t pair = plane + 2 * Cfg::handoff_offset(c, k1);
            EXPECT(at(plane, q, k1, j, -1) == pair, "plane %#x k1 %d q %d j %d: pair at %#x, handoff_offset says %#x", plane,
                   k1, q, j, at(plane, q, k1, j, -1), pair);
            for (int e = 0; e < 2; ++e) {
              const int s = e == 0 ? mirror_column<kN2>(c) : kN2 - c - e;
              const uint32_t want = plane + 2 * Cfg::handoff_offset(s, k1);
              EXPECT(at(plane, q, k1, j, e) == want, "plane %#x k1 %d q %d j %d e %d: column %d at %#x, handoff_offset says %#x",
                     plane, k1, q, j, e, s, at(plane, q, k1, j, e), want);
            }
          }
        }
  return true;
}

const StoreAddress handoff_addresses = [](uint32_t plane, int q, int k1, int j, int e) {
  const Cfg::HandoffAddresses to(plane, q, k1);
  return e < 0 ? to.column_pair(j) : to.mirror(j, e);
};
// Every 1024-byte aligned base of a hand-off plane the shared window can hold, and the two the kernel uses.
std::vector<uint32_t> handoff_planes() {
  std::vector<uint32_t> planes;
  for (uint32_t base = 0; base + Cfg::kHandoffPlaneBytes <= 256u * 1024u; base += 1024) planes.push_back(base);
  const uint32_t handoff = uint32_t(offsetof(Cfg::Smem, handoff));
  planes.push_back(handoff);
  planes.push_back(handoff + Cfg::kHandoffPlaneBytes);
  return planes;
}

// ---------------------------------------------------------------------------
// The resident filter
// ---------------------------------------------------------------------------
using Word = std::function<int(int, int)>;

// Row k1 of all n1, column k2 reads the word of frequency f = k1 + n1·k2 if k1 <= n1/2, else the
// conjugate of frequency N - f's (a stored half row); filter_word is a bijection on the half rows.
bool check_filter(const Word& read_word) {
  std::vector<int> hits(size_t(Cfg::kFilterRows) * kN2, 0);
  for (int k1 = 0; k1 < Cfg::kFilterRows; ++k1)
    for (int k2 = 0; k2 < kN2; ++k2) {
      const int w = filter_word<kN2>(k1, k2);
      EXPECT(w >= 0 && w < int(hits.size()) && hits[w]++ == 0, "filter_word (%d, %d) = %d", k1, k2, w);
    }
  for (int k1 = 0; k1 < kN1; ++k1)
    for (int k2 = 0; k2 < kN2; ++k2) {
      const int f = k1 + kN1 * k2, g = k1 <= kN1 / 2 ? f : Cfg::kN - f;
      const int want = filter_word<kN2>(g % kN1, g / kN1);
      EXPECT(g % kN1 <= kN1 / 2, "frequency %d: mirror row %d not stored", f, g % kN1);
      EXPECT(read_word(k1, k2) == want, "row %d column %d reads word %d, frequency %d is at %d", k1, k2, read_word(k1, k2), g, want);
      EXPECT(filter_mirrored<kN1>(k1) == (g != f), "row %d: conjugation", k1);
    }
  // A warp's reads of one (j, e) in filter_to_operand (rows 8a + lane/4, columns
  // 8j + 2q + e and their mirrors) hit 32 different banks. Not the rows n1/2 .. n1/2 + 7, whose
  // first row is stored and the others mirrored: a few 2-way conflicts in one warp of eight.
  for (int row0 = 0; row0 < kN1; row0 += 8)
    if (row0 != kN1 / 2)
    for (int j = 0; j < kN2 / 16; ++j)
      for (int e = 0; e < 2; ++e)
        for (int mirrored = 0; mirrored < 2; ++mirrored) {
          std::set<int> banks;
          for (int lane = 0; lane < 32; ++lane) {
            const int c = acc_col(lane % 4, j, e), col = mirrored ? mirror_column<kN2>(c) : c;
            banks.insert(read_word(row0 + lane / 4, col) % 32);
          }
          EXPECT(banks.size() == 32, "filter reads of rows %d.., j %d, e %d%s: %zu banks", row0, j, e,
                 mirrored ? " (mirrors)" : "", banks.size());
        }
  return true;
}

// ---------------------------------------------------------------------------
// The persistent schedule
// ---------------------------------------------------------------------------
using Begin = std::function<int64_t(int64_t, int64_t, int64_t)>;

bool check_schedule(const Begin& begin, int64_t batch, int64_t channels, int64_t sms) {
  const int64_t pairs = jobs_per_channel(batch), jobs = channels * pairs;
  const int64_t ctas = jobs < sms ? jobs : sms;
  std::vector<int> seen(size_t(batch * channels), 0);
  int64_t lo = jobs, hi = 0, next = 0;
  for (int64_t cta = 0; cta < ctas; ++cta) {
    const int64_t b = begin(jobs, cta, ctas), e = begin(jobs, cta + 1, ctas);
    EXPECT(b == next && e > b, "B %lld C %lld: CTA %lld has [%lld, %lld), expected to start at %lld", (long long)batch,
           (long long)channels, (long long)cta, (long long)b, (long long)e, (long long)next);
    next = e;
    lo = std::min(lo, e - b);
    hi = std::max(hi, e - b);
    std::set<int> touched;
    for (int64_t job = b; job < e; ++job) {
      const Item it = job_item(int(job), int(batch));
      EXPECT(it.channel >= 0 && it.channel < channels && it.flags == kItemChecked, "job %lld: channel %d", (long long)job, it.channel);
      touched.insert(it.channel);
      for (int seq : {it.seq_re, it.seq_im}) {
        if (seq < 0) continue;
        EXPECT(seq < batch, "job %lld: sequence %d", (long long)job, seq);
        ++seen[size_t(seq) * channels + it.channel];
      }
      EXPECT(it.seq_im >= 0 || (batch % 2 == 1 && it.seq_re == batch - 1), "job %lld: a missing partner", (long long)job);
    }
    EXPECT(int64_t(touched.size()) <= (e - b + pairs - 1) / pairs + 1, "CTA %lld: %zu channels for %lld jobs", (long long)cta,
           touched.size(), (long long)(e - b));
  }
  EXPECT(next == jobs, "B %lld C %lld: the ranges end at %lld of %lld", (long long)batch, (long long)channels,
         (long long)next, (long long)jobs);
  EXPECT(hi - lo <= 1, "B %lld C %lld: ranges of %lld to %lld jobs", (long long)batch, (long long)channels, (long long)lo,
         (long long)hi);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT(seen[i] == 1, "sequence (b %zu, c %zu) run %d times", i / channels, i % channels, seen[i]);
  return true;
}

bool check_schedules(const Begin& begin) {
  const int64_t shapes[][3] = {{16, 256, 132}, {1, 7, 132}, {3, 5, 132}, {64, 1, 132}, {5, 3, 2},
                               {7, 13, 4},    {2, 1, 132}, {33, 9, 132}, {1, 1, 1},   {9, 300, 114}};
  for (const auto& s : shapes)
    if (!check_schedule(begin, s[0], s[1], s[2])) return false;
  // 64-bit products: the largest call the dispatch takes (batch·channels < 2^31).
  const int64_t jobs = (int64_t(1) << 30) - 1;
  for (int64_t cta = 0; cta < 132; ++cta) EXPECT(begin(jobs, cta, 132) <= begin(jobs, cta + 1, 132), "large call: CTA %lld", (long long)cta);
  EXPECT(begin(jobs, 132, 132) == jobs, "large call: the last range ends at %lld", (long long)begin(jobs, 132, 132));
  return true;
}

// ---------------------------------------------------------------------------
int main() {
  host_check::Tally tally;
  const Maps maps;
  tally.must_pass("layouts: bijective, PTX SW128, CuTe's", check_layouts(false));
  tally.must_pass("tiles: F1 rows, hand-off halves", check_tiles());
  tally.must_pass("filter images: aligned, disjoint, inside the workspace", check_filter_images(FilterImages<Cfg>::bytes));
  tally.must_pass("accumulator m64n128 = PTX D", check_accumulator(maps, 128));
  tally.must_pass("accumulator m64n64 = PTX D", check_accumulator(maps, 64));
  tally.must_pass("chaining n128 -> register A", check_chaining(maps, 128));
  tally.must_pass("chaining n64 -> register A", check_chaining(maps, 64));
  tally.must_pass("mirrored columns: quad exchange", check_mirror_exchange(maps));
  tally.must_pass("hand-off and y coverage", check_handoff_and_y(maps));
  tally.must_pass("hand-off store addresses = handoff_offset", check_handoff_addresses(handoff_addresses, handoff_planes()));
  const Word filter_read = [](int k1, int k2) {
    return filter_stored_row<kN1>(k1) * kN2 + (k2 ^ filter_read_mask<kN1, kN2>(k1));
  };
  tally.must_pass("resident filter: mirrored rows, banks", check_filter(filter_read));
  const Begin begin = [](int64_t j, int64_t c, int64_t g) { return job_begin(j, c, g); };
  tally.must_pass("schedule: every job once, balanced", check_schedules(begin));

  // The same checks on deliberately wrong maps.
  tally.must_reject("wrong: ring stores unswizzled", [] { return check_layouts(true); });
  tally.must_reject("wrong: a workspace without the unscales", [] {
    return check_filter_images([](int64_t channels) { return size_t(channels) * Cfg::kFilterBytes; });
  });
  Maps m = maps;
  m.col = [](int q, int j, int e) { return 8 * j + 2 * e + q; };
  tally.must_reject("wrong: accumulator columns", [&] { return check_accumulator(m, 64); });
  m = maps;
  m.reg = [](int j, int h) { return 2 * h + j; };
  tally.must_reject("wrong: chained register order", [&] { return check_chaining(m, 64); });
  m = maps;
  m.lane = [](int q, int e) { return (4 - q) & 3; };
  tally.must_reject("wrong: odd mirror from lane (4 - q) % 4", [&] { return check_mirror_exchange(m); });
  m = maps;
  m.own_group = [](int mm) { return (kN2 / 8 - 1 - mm); };
  tally.must_reject("wrong: column n2/2 not from column 0", [&] { return check_mirror_exchange(m); });
  m = maps;
  m.mirror = [](int c) { return kN2 - c; };
  tally.must_reject("wrong: hand-off mirror of column 0", [&] { return check_handoff_and_y(m); });
  tally.must_reject("wrong: hand-off plane base 64 bytes off", [] { return check_handoff_addresses(handoff_addresses, {64}); });
  tally.must_reject("wrong: hand-off mirror n2 - c as an XOR for lane 0 too", [] {
    return check_handoff_addresses(
        [](uint32_t plane, int q, int k1, int j, int e) {
          const Cfg::HandoffAddresses to(plane, q, k1);
          if (e != 0) return e < 0 ? to.column_pair(j) : to.mirror(j, e);
          return (plane + 2 * Cfg::handoff_offset(kN2 - 2 * q, k1 % kN1)) ^ (j * Cfg::kChunkBytes);
        },
        {0, 1024});
  });
  tally.must_reject("wrong: mirrored rows at n2 - k2", [] {
    return check_filter([](int k1, int k2) {
      return filter_mirrored<kN1>(k1) ? filter_word<kN2>(kN1 - k1, (kN2 - k2) % kN2) : filter_word<kN2>(k1, k2);
    });
  });
  tally.must_reject("wrong: 32-bit schedule products", [] {
    return check_schedules([](int64_t j, int64_t c, int64_t g) { return int64_t(uint32_t(j) * uint32_t(c) / uint32_t(g)); });
  });
  tally.must_reject("wrong: schedule shifted by one", [] {
    return check_schedules([](int64_t j, int64_t c, int64_t g) { return j * c / g + (c == 1 ? 1 : 0); });
  });

  return tally.finish("engine layout checks");
}

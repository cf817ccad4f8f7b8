// Sparse MLA attention for sm_80/sm_86: decode from 584-byte V4 records (prefill over bf16
// rows: see Prefill below). One CTA per (query token, 16 heads, split of the token's
// selected rows), 8 warps, each warp owning one 64-dim scale group of the 512 dims
// (groups 0-6: e4m3 NoPE bytes with one UE8M0 scale each; group 7: the 64 bf16 RoPE
// values). With 8 heads per rank or fewer, attention_cta_narrow at the end of this file
// runs instead (its own header says how it differs).
//
// Why this shape: a record is decoded once per CTA, and every warp touches only its own
// 64 dims. The prologue resolves the split's rows once (record addresses, a bit mask of
// the real rows, every row's scale bytes and folded factors into shared memory). Per
// 16-row tile, warp w
//   1. loads and decodes its 64 bytes of each row into a warp-private bf16 slice in
//      shared memory (no CTA barrier: only this warp reads it), with loads laid out for
//      the L1 pipe, the kernel's busiest unit (see TileBytes),
//   2. computes the partial logits  S_w = Q[:, group w] . K[:, group w]^T  (8 MMAs),
//   3. after one barrier, sums the 8 partials of 2 head rows in a fixed order (so every
//      run gives the same bits), runs the online softmax of those rows and publishes P
//      (a warp whose rows are both padded heads skips this),
//   4. after a second barrier, accumulates O[:, group w] += P . K[:, group w]  (8 MMAs),
//      rescaling O first unless every alpha of the tile is exactly 1.
// The query slice (16 heads x 64 dims) and the accumulator (16 x 64 fp32) of a warp stay
// in registers for the whole split: 16 + 32 registers per thread.
//
// Scales folded out of the decode (NoPE warps). A group's 64 values share one UE8M0 scale
// 2^(s - 127), so it factors out of the group's partial logit and, per row, into P:
//   - the tile holds "raw" bf16: sign | e4m3 magnitude << 4, which is the e4m3 value times
//     2^-120 exactly (e4m3 subnormals become bf16 subnormals): 7 integer ops per 4 bytes,
//     against 22 for a full decode;
//   - the query slice is held as q * 2^64 (exact), so raw products stay far from fp32's
//     subnormal range;
//   - a partial logit is multiplied by 2^(s - 71), and P by the same power per row
//     (exact: powers of two), which leaves the accumulator at out * 2^-64; the epilogue
//     multiplies the 2^64 back. The prologue tabulates these factors per row and group
//     (the RoPE group's are 1, so all 8 warps run the same QK and PV code).
// Both factors are exponent fields s + 56, valid for s <= 198 (|k| < 448 * 2^71). A row
// with a larger scale byte is decoded in full instead, at scale byte s - 64, so it holds
// k * 2^-64 and both its factors are 1: the logit is q * k exactly and the accumulator
// stays at out * 2^-64 (scale byte 255, infinity, is kept as is and stays loud). vLLM's
// quantizer never writes e4m3 NaN codes (it stores NaN as 448) nor scale bytes in
// 248..254 (its input is bf16); a raw NaN code would read as +-480.
// The raw decode yields dims (4i, 4i+2) and (4i+1, 4i+3) of every 4 as bf16 pairs; the
// tile keeps that order, the query slice is loaded in it, and the epilogue swaps pairs
// back between neighbour lanes.
//
// Maths and outputs are those of sparse_mla_fwd_kernel in triton_kernel.py, not its bits
// (the same split count per token, ceil(rows / ROWS_PER_SPLIT) with arch.py's
// ROWS_PER_SPLIT for this kernel, but the rows dealt evenly over the splits and summed in
// another order; the same partials layout, merged in the kernel with the Triton
// reduction kernel's fold, see last_split_to_arrive):
//   out = sum_j exp(s_j) k_j / (sum_j exp(s_j) + exp(sink)),  lse = log(sum_j exp(s_j)),
// in base 2 internally. Rows that are -1, outside their cache or past the token's
// length are skipped and never read; a token without rows gets 0 (lse -inf).
//
// Prefill (kBf16Rows): the same kernels (wide, and narrow for 8 heads or fewer) over the
// bf16 gather workspace that vLLM builds (rows of 512 bf16, 1024 bytes, no scales), one
// split per token. Every warp then takes the RoPE warp's path: its 64 dims are copied into
// its slice as they are, with no query bias and every factor 1. They also write the max
// logit, which FlashMLA's prefill returns.
//
// Compiled through TileLang (tilelang_kernels.py imports this file with T.import_source
// and calls deepinfer_mla::attention_cta from a T.Kernel): the per-warp MMAs on warp-private
// tiles are below what T.gemm's CTA-wide warp policies express.
#include <cuda_bf16.h>
#include <stdint.h>

namespace deepinfer_mla {

constexpr int kWarps = 8;
constexpr int kHeads = 16;       // heads per CTA
constexpr int kRows = 16;        // selected rows per tile
constexpr int kKsStride = 72;    // bf16 per K-slice row: 64 + 8 pad, conflict-free ldmatrix
constexpr int kPsStride = 24;    // bf16 per P row: 16 + 8 pad, conflict-free ldmatrix
constexpr int kRecordBytes = 576;
constexpr float kNegBig = -1.0e30f;  // finite "minus infinity": exp2(m_old - m_new) stays finite
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kNopeWarps = 7;          // warps 0-6: e4m3 groups; warp 7: bf16 RoPE
constexpr uint32_t kFieldOffset = 56;  // exponent field of the folded factor: s + 56
constexpr uint32_t kFastMaxScale = 198;  // s + 56 <= 254
constexpr uint32_t kUnitField = 127;     // 1.0: the factor of a row decoded in full
constexpr uint32_t kFullDecodeShift = 64;  // a row decoded in full holds k * 2^-64
constexpr uint32_t kQBiasBf16x2 = 0x5F805F80u;  // bf16x2 of 2^64
constexpr float kAccUnbias = 18446744073709551616.0f;  // 2^64

// kTableRows: rows of the scale and factor tables, 1 for bf16 rows (prefill), which have
// neither.
template <int kRowsPerSplit, int kTableRows>
struct Smem {
  uint16_t ks[kWarps][kRows][kKsStride];  // each warp's decoded 16 x 64 bf16 slice
  float sp[kWarps][kHeads][kRows];        // each warp's partial logits, see sp_col
  uint16_t ps[kHeads][kPsStride];         // P (bf16) of the tile
  float alpha[kHeads];                    // rescale of the tile; the final factor at the end
  const uint8_t* rec[kRowsPerSplit];      // the split's record addresses (nullptr = skip)
  uint8_t scale[kNopeWarps][kTableRows];  // their scale bytes, by group (0 for a skipped row)
  // Their folded factors as bf16 bits (group 7: 1): powers of two, exact in bf16, and
  // half the size of fp32 bits, so one split's tables of 640 rows fit 48 KB.
  alignas(8) uint16_t fold[kWarps][kTableRows];
  uint32_t valid[(kRowsPerSplit + 31) / 32];  // bit i: row i of the split is real
};

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x by the SFU (ex2.approx: 2 ulp; results below 2^-126 flush to 0, which no softmax
// weight next to the row maximum's 1 can notice).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// The 8 x 8 b16 matrix whose row i / 4, columns 2 (i % 4) and + 1 lane i holds in x,
// transposed across the warp (lane i gets row i / 4 of the transpose). No shared memory.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(x));
  return d;
}

// 16 bytes global -> shared, asynchronously (L2 only: the rows are read once).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Four e4m3 bytes and four copies of their UE8M0 scale byte -> four bf16 (two bf16x2),
// bit-identical to bf16(e4m3 * 2^(s - 127)): the same packed decode as
// ops/fp8/triton_fp8.py (_E4M3X4_UE8M0_TO_BF16_PTX), which is tested against torch for all
// 256 bytes x 256 scales. sign | magnitude << 4 read as bf16 is the e4m3 value times
// 2^-120 (subnormals included); NaN codes get an all-ones exponent; two bf16x2 FMAs apply
// 2^120 and the scale.
__device__ __forceinline__ void e4m3x4_to_bf16x4(uint32_t data, uint32_t scale4, uint32_t& lo,
                                                 uint32_t& hi) {
  asm("{\n"
      ".reg .b32 v0, v1, t0, t1, n, m0, m1, sc, k, z;\n"
      "prmt.b32 v0, %2, 0, 0x1404;\n"
      "prmt.b32 v1, %2, 0, 0x3424;\n"
      "and.b32 n, %2, 0x7F7F7F7F;\n"
      "add.u32 n, n, 0x01010101;\n"
      "prmt.b32 m0, n, 0, 0x9988;\n"
      "prmt.b32 m1, n, 0, 0xBBAA;\n"
      "shr.b32 t0, v0, 4;\n"
      "shr.b32 t1, v1, 4;\n"
      "and.b32 v0, v0, 0x80008000;\n"
      "and.b32 v1, v1, 0x80008000;\n"
      "lop3.b32 t0, t0, 0x07F007F0, v0, 0xEA;\n"
      "lop3.b32 t1, t1, 0x07F007F0, v1, 0xEA;\n"
      "lop3.b32 t0, m0, 0x7F807F80, t0, 0xEA;\n"
      "lop3.b32 t1, m1, 0x7F807F80, t1, 0xEA;\n"
      "prmt.b32 sc, %3, 0, 0x1404;\n"
      "shr.b32 sc, sc, 1;\n"
      "mov.b32 k, 0x7B807B80;\n"
      "mov.b32 z, 0x80008000;\n"
      "fma.rn.bf16x2 t0, t0, k, z;\n"
      "fma.rn.bf16x2 t1, t1, k, z;\n"
      "fma.rn.bf16x2 %0, t0, sc, z;\n"
      "fma.rn.bf16x2 %1, t1, sc, z;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(data), "r"(scale4));
}

// Four e4m3 bytes b0..b3 -> raw bf16 pairs (b0, b2) and (b1, b3): sign | magnitude << 4,
// each the e4m3 value times 2^-120 (see the header). No scale, no NaN handling.
__device__ __forceinline__ void e4m3x4_to_raw_bf16(uint32_t x, uint32_t& even, uint32_t& odd) {
  odd = (x & 0x80008000u) | ((x & 0x7F007F00u) >> 4);
  const uint32_t y = x << 8;
  even = (y & 0x80008000u) | ((y & 0x7F007F00u) >> 4);
}

// a * b per bf16 half (exact when b is a power of two and nothing over- or underflows).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}

// One lane's share of a tile's bytes, laid out so that each load instruction of a warp
// touches as few 128-byte lines as possible (the L1 pipe, not DRAM, was the busiest unit):
//   NoPE warp w: v[i] = 16-byte chunk (lane % 4) of the warp's 64 bytes of tile row
//     (lane / 4 + 8 i), i = 0, 1 -- 8 rows, so 8 lines, per instruction;
//   RoPE warp: v[i] = 16-byte chunk (lane % 8) of the 128 RoPE bytes of tile row
//     (lane / 8 + 4 i), i = 0..3.
// Scale bytes are not loaded here: the prologue put every row's scale bytes in shared
// memory (one 8-byte load per row, instead of one 1-byte load per row per warp).
struct TileBytes {
  uint4 v[4];
};

// Loads the lane's share of tile rows i0 .. i0 + 15 of the split into b. A skipped row
// (rec == nullptr) keeps b's previous bytes -- zeros, or a real row's bytes from an
// earlier tile -- and has scale byte 0, so its raw decode is finite (below 2^-111) and
// its P of exactly 0 leaves it out; rewriting the registers per skipped row would cost
// every tile as many moves.
template <bool kBf16Rows>
__device__ __forceinline__ void load_tile(TileBytes& b, const uint8_t* const* rec, int i0,
                                          int warp, int lane) {
  if (!kBf16Rows && warp < kNopeWarps) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* r = rec[i0 + (lane >> 2) + 8 * i];
      if (r != nullptr) b.v[i] = __ldg(reinterpret_cast<const uint4*>(r + 64 * warp + 16 * (lane & 3)));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint8_t* r = rec[i0 + (lane >> 3) + 4 * i];
      // bf16 rows: warp w's 64 dims are bytes 128 w .. 128 w + 127 (the RoPE part at 896)
      const int at = (kBf16Rows ? 128 * warp : 448) + 16 * (lane & 7);
      if (r != nullptr) b.v[i] = __ldg(reinterpret_cast<const uint4*>(r + at));
    }
  }
}

// 16 e4m3 bytes -> 16 raw bf16 (see the header) as two 16-byte halves lo (bytes 0-7)
// and hi (8-15), in the (4i, 4i+2), (4i+1, 4i+3) pair order. No branch: a tile whose
// scale bytes are all in the fold's range decodes all its chunks this way, interleaved.
__device__ __forceinline__ void raw_chunk(const uint4& v, uint4& lo, uint4& hi) {
  e4m3x4_to_raw_bf16(v.x, lo.x, lo.y);
  e4m3x4_to_raw_bf16(v.y, lo.z, lo.w);
  e4m3x4_to_raw_bf16(v.z, hi.x, hi.y);
  e4m3x4_to_raw_bf16(v.w, hi.z, hi.w);
}

// True when all four scale bytes of s4 are in the fold's range (<= kFastMaxScale).
__device__ __forceinline__ bool all_fold(uint32_t s4) {
  return __vcmpleu4(s4, kFastMaxScale * 0x01010101u) == 0xFFFFFFFFu;
}

// 16 e4m3 bytes -> 16 bf16 as two 16-byte halves lo (bytes 0-7) and hi (8-15): raw, or
// for a scale byte past the fold's range decoded in full at scale byte s - 64, both in the
// (4i, 4i+2), (4i+1, 4i+3) pair order.
__device__ __forceinline__ void decode_chunk(const uint4& v, uint32_t s, uint4& lo, uint4& hi) {
  if (s <= kFastMaxScale) {
    raw_chunk(v, lo, hi);
    return;
  }
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  const uint32_t s4 = (s == 255u ? 255u : s - kFullDecodeShift) * 0x01010101u;
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t l, h;
    e4m3x4_to_bf16x4(words[i], s4, l, h);
    o[2 * i] = __byte_perm(l, h, 0x5410);
    o[2 * i + 1] = __byte_perm(l, h, 0x7632);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// decode_chunk's 16 bf16 to dst (two adjacent 16-byte stores).
__device__ __forceinline__ void store_chunk(uint16_t* dst, const uint4& v, uint32_t s) {
  uint4* d = reinterpret_cast<uint4*>(dst);
  decode_chunk(v, s, d[0], d[1]);
}

// The lane's share of the tile into the warp's bf16 slice ks (16 rows of kKsStride).
// scale: this warp's scale bytes of the tile's rows (NoPE warps).
template <bool kBf16Rows>
__device__ __forceinline__ void store_tile(uint16_t* ks, const TileBytes& b, const uint8_t* scale,
                                           int warp, int lane) {
  if (!kBf16Rows && warp < kNopeWarps) {
    const uint32_t s0 = scale[lane >> 2], s1 = scale[(lane >> 2) + 8];
    // One warp-wide choice per tile: the per-chunk branch would keep ptxas from
    // interleaving the chunks' decodes.
    if (__all_sync(0xffffffffu, max(s0, s1) <= kFastMaxScale)) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint4* d = reinterpret_cast<uint4*>(ks + ((lane >> 2) + 8 * i) * kKsStride + 16 * (lane & 3));
        raw_chunk(b.v[i], d[0], d[1]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = (lane >> 2) + 8 * i;
        store_chunk(ks + row * kKsStride + 16 * (lane & 3), b.v[i], i == 0 ? s0 : s1);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = (lane >> 3) + 4 * i;
      *reinterpret_cast<uint4*>(ks + row * kKsStride + 8 * (lane & 7)) = b.v[i];
    }
  }
}

// store_tile's NoPE path for kQkRegisters: the same decode and stores, with the lane's
// decoded chunks (rows lane / 4 + 8 i, chunk lane % 4) also left in dec[i] = {lo, hi},
// QK's B fragments up to the dim order the query slice is loaded in.
__device__ __forceinline__ void store_nope_tile_keeping(uint16_t* ks, const TileBytes& b,
                                                        const uint8_t* scale, int lane,
                                                        uint4 (&dec)[2][2]) {
  const uint32_t s0 = scale[lane >> 2], s1 = scale[(lane >> 2) + 8];
  if (__all_sync(0xffffffffu, max(s0, s1) <= kFastMaxScale)) {  // as store_tile chooses
#pragma unroll
    for (int i = 0; i < 2; ++i) raw_chunk(b.v[i], dec[i][0], dec[i][1]);
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) decode_chunk(b.v[i], i == 0 ? s0 : s1, dec[i][0], dec[i][1]);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint4* d = reinterpret_cast<uint4*>(ks + ((lane >> 2) + 8 * i) * kKsStride + 16 * (lane & 3));
    d[0] = dec[i][0];
    d[1] = dec[i][1];
  }
}

// Column of sp holding (row, col): the two 8-column halves swap on rows 2-3 mod 4, so the
// MMA fragments' float2 stores (rows g, 8 rows at a time) and the owners' row reads both
// spread over all 32 banks.
__device__ __forceinline__ int sp_col(int row, int col) { return col ^ (8 * ((row >> 1) & 1)); }

// fp32 <-> int32 keys with the same order (negative values have their magnitude bits
// flipped; the map is its own inverse), so an integer redux.sync can take a float maximum.
__device__ __forceinline__ int order_key(float x) {
  const int b = __float_as_int(x);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}
__device__ __forceinline__ float from_order_key(int k) {
  return __int_as_float(k ^ ((k >> 31) & 0x7FFFFFFF));
}

// A token's selected rows: main_len of the main cache (its index row first), then the
// extra cache's; lengths are kept within the index widths, as token_rows in
// triton_kernel.py does. Returns the total.
template <int kMainWidth, int kExtraWidth, bool kHasExtra, bool kHasLen>
__device__ __forceinline__ int token_rows(int64_t t, int64_t main_len_addr, int64_t extra_len_addr,
                                          int& main_len) {
  main_len = kMainWidth;
  if (kHasLen) {
    main_len = reinterpret_cast<const int*>(main_len_addr)[t];
    main_len = min(max(main_len, 0), kMainWidth);
  }
  int extra_len = 0;
  if (kHasExtra) {
    extra_len = reinterpret_cast<const int*>(extra_len_addr)[t];
    extra_len = min(max(extra_len, 0), kExtraWidth);
  }
  return main_len + extra_len;
}

// Rows per split when a token's `total` rows make n_splits splits: dealt evenly in whole
// 16-row steps (at most ROWS_PER_SPLIT, since n_splits * ROWS_PER_SPLIT >= total). 640
// rows are 4 x 160, not 3 x 192 + 64, so the longest CTA of a token -- its latency at
// small batches -- has 10 steps, not 12, and the waves of a large batch are even. Still a
// function of the token's own rows only.
__device__ __forceinline__ int split_size(int total, int n_splits) {
  return ((total + n_splits - 1) / n_splits + kRows - 1) / kRows * kRows;
}

// Row r of token t (main cache rows first, then the extra cache's): its record's address,
// or nullptr when its index is -1 or outside the cache (a skipped row, scale_bytes left
// as they are), and its 8 scale bytes (not with kScales false: bf16 rows have none). Both
// kernels' prologues call it; the branches are written per cache on purpose (a version
// choosing a cache struct by reference measured 2-7% slower,
// NVIDIA_H200.decode_tilelang_narrow_kernel.log section 11).
template <bool kScales = true>
__device__ __forceinline__ const uint8_t* resolve_row(
    int64_t t, int r, int main_len, int64_t main_addr, int64_t main_stride, int main_rows,
    int main_bs, int64_t main_idx_addr, int64_t main_idx_stride, int64_t extra_addr,
    int64_t extra_stride, int extra_rows, int extra_bs, int64_t extra_idx_addr,
    int64_t extra_idx_stride, uint2& scale_bytes) {
  int slot;
  const uint8_t* base;
  int64_t stride;
  int bs, rows;
  if (r < main_len) {
    slot = reinterpret_cast<const int*>(main_idx_addr)[t * main_idx_stride + r];
    base = reinterpret_cast<const uint8_t*>(main_addr);
    stride = main_stride;
    bs = main_bs;
    rows = main_rows;
  } else {
    slot = reinterpret_cast<const int*>(extra_idx_addr)[t * extra_idx_stride + (r - main_len)];
    base = reinterpret_cast<const uint8_t*>(extra_addr);
    stride = extra_stride;
    bs = extra_bs;
    rows = extra_rows;
  }
  if (slot < 0 || slot >= rows) return nullptr;
  const uint8_t* page = base + static_cast<int64_t>(slot / bs) * stride;
  const int within = slot % bs;
  if (kScales)
    scale_bytes = __ldg(reinterpret_cast<const uint2*>(
        page + static_cast<int64_t>(bs) * kRecordBytes + within * 8));
  return page + static_cast<int64_t>(within) * kRecordBytes;
}

// The folded factor's exponent field for scale byte s.
__device__ __forceinline__ uint32_t factor_field(uint32_t s) {
  return s <= kFastMaxScale ? s + kFieldOffset : kUnitField;
}

// ---------------------------------------------------------------------------------------
// Merging a token's splits inside the decode kernel (both kernels).
//
// Every CTA of a split token writes its partials, as for a separate reduction kernel,
// then arrives on the counter of its (token, head block). The CTA that arrives last folds
// all the splits' partials in split order (a fixed order, so the bits do not depend on
// which CTA came last; in the A/B runs they were the Triton reduction's bits) and writes
// the output and lse. No reduction kernel runs after the decode: 2-11% faster at every
// shape that splits with a cold L2; under CUDA-graph replay 2-8% with 8 heads, 3-4% at
// T=256, and within 2.3% either way for 32 or 64 heads at T <= 64
// (NVIDIA_H200.decode_tilelang_split_merge_in_kernel.log). The arrival is
// one atomic with acquire-release semantics at GPU scope by one thread after a CTA
// barrier; a fence in every thread before it measured 2-4% slower.
//
// The counters live in a buffer the host keeps per device (tilelang_kernels.py). They are
// zero before a launch, and the last CTA puts its counter back to zero, so the next
// launch on the stream finds them zero with no memset in between. Two decode launches
// running at the same time on one device must not share the buffer (as with a cuBLAS
// workspace); vLLM runs a model's layers one after another on one stream.
// ---------------------------------------------------------------------------------------

// Called by every thread of the CTA after its partials are stored. True in the CTA that
// arrives last among the token's n_splits CTAs of this head block; then every split's
// partials are visible to all its threads. `flag` is a shared-memory word (the kernels
// pass sm.alpha[0], which nothing reads after the tile loop's last barrier).
__device__ __forceinline__ bool last_split_to_arrive(int* counter, int n_splits, float* flag) {
  __syncthreads();  // every thread's partials are stored
  if (threadIdx.x == 0) {
    int before;
    // acq_rel at GPU scope: releases the CTA's stores (ordered before by the barrier),
    // and for the last arrival acquires the other CTAs' released stores.
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
                 : "=r"(before) : "l"(counter) : "memory");
    const bool last = before == n_splits - 1;
    if (last) *counter = 0;  // every split has arrived: leave it zero for the next launch
    *flag = last ? 1.f : 0.f;
  }
  __syncthreads();
  return *flag != 0.f;
}

// One warp folds head h's split partials (the first n_splits of kMaxSplits are real)
// and writes its output row (bf16) and lse. Lane l owns dims 128 k + 4 l, k < 4. The fold
// is the Triton reduction's (sparse_mla_reduce_kernel): four splits per step, the running
// maximum, then the four terms summed in pairs.
template <int kMaxSplits, bool kHasSink>
__device__ __forceinline__ void merge_head_splits(int64_t t, int64_t h, int n_splits,
                                                  const float* part_acc, const float* part_ml,
                                                  int64_t out_addr, int64_t out_stride_t,
                                                  int64_t out_stride_h, float* lse_ptr,
                                                  int64_t lse_stride_t, int64_t sink_addr,
                                                  int num_heads, int lane) {
  const int64_t row0 = (t * num_heads + h) * kMaxSplits;
  float b_m = kNegBig;
  float b_l = 0.f;
  float acc[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) acc[e] = 0.f;
#pragma unroll
  for (int s0 = 0; s0 < kMaxSplits; s0 += 4) {
    if (s0 >= n_splits) break;
    float m[4], l[4], a[4][16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int s = s0 + i;
      m[i] = kNegBig;
      l[i] = 0.f;
#pragma unroll
      for (int e = 0; e < 16; ++e) a[i][e] = 0.f;
      if (s < kMaxSplits && s < n_splits) {
        // L2 only (ld.global.cg): other CTAs wrote these.
        const float2 ml = __ldcg(reinterpret_cast<const float2*>(part_ml + (row0 + s) * 2));
        m[i] = ml.x;
        l[i] = ml.y;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float* p = part_acc + (row0 + s) * 512 + 128 * k + 4 * lane;
          const float4 v = __ldcg(reinterpret_cast<const float4*>(p));
          a[i][4 * k] = v.x, a[i][4 * k + 1] = v.y, a[i][4 * k + 2] = v.z, a[i][4 * k + 3] = v.w;
        }
      }
    }
    const float m_new = fmaxf(fmaxf(b_m, fmaxf(m[0], m[1])), fmaxf(m[2], m[3]));
    const float a_old = fast_exp2(b_m - m_new);
    float w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = fast_exp2(m[i] - m_new);
    b_l = b_l * a_old + ((l[0] * w[0] + l[1] * w[1]) + (l[2] * w[2] + l[3] * w[3]));
#pragma unroll
    for (int e = 0; e < 16; ++e)
      acc[e] = acc[e] * a_old +
               ((a[0][e] * w[0] + a[1][e] * w[1]) + (a[2][e] * w[2] + a[3][e] * w[3]));
    b_m = m_new;
  }

  // Normalization as in the kernels' one-split epilogue: the sink in the denominator only.
  const bool has_rows = b_l > 0.f;
  float alpha = 1.f;
  float den = b_l;
  if (kHasSink) {
    const float sink = reinterpret_cast<const float*>(sink_addr)[h] * kLog2e;
    const float m_f = fmaxf(b_m, sink);
    alpha = exp2f(b_m - m_f);
    den = b_l * alpha + exp2f(sink - m_f);
  }
  if (!(den > 0.f)) den = 1.f;  // no rows and no sink: output 0
  const float f = alpha / den;
  if (lane == 0)
    lse_ptr[t * lse_stride_t + h] = has_rows ? (b_m + log2f(b_l)) / kLog2e : -INFINITY;
  __nv_bfloat16* out =
      reinterpret_cast<__nv_bfloat16*>(out_addr) + t * out_stride_t + h * out_stride_h;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(acc[4 * k] * f, acc[4 * k + 1] * f);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(acc[4 * k + 2] * f, acc[4 * k + 3] * f);
    *reinterpret_cast<uint2*>(out + 128 * k + 4 * lane) = make_uint2(
        *reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

// A CTA's place in its launch grid: token, head block, split, and the grid's head-block
// count (ceil(num_heads / heads per CTA) in both orders). Two orders
// (tilelang_kernels.AttentionVariant.splits_fastest):
//   default: grid (tokens, head blocks, kMaxSplits). CUDA issues blockIdx.x fastest, so a
//     token's splits start tokens x head blocks CTAs apart;
//   kSplitsFastest: a 1-D grid, CTA i = split + kMaxSplits * (head block + head blocks *
//     token), so a token's splits are issued back to back and the last to arrive merges
//     partials the others have just written. Tokens stay in x (2^31 - 1 CTAs), never in
//     y or z (65535 at most).
// The merge's counter of (token, head block) is t * head_blocks + head_block in both.
// The kSplitsFastest decode gives the default's bits on an H100
// (benchmarks/sparse_mla_ab_grid_order.py; tests/ops/test_sparse_mla.py checks it on a GPU).
struct CtaPlace {
  int64_t t;
  unsigned head_block;
  unsigned head_blocks;
  int split;
};

template <bool kSplitsFastest, int kMaxSplits, int kCtaHeads>
__device__ __forceinline__ CtaPlace cta_place(int num_heads) {
  if constexpr (kSplitsFastest) {
    const unsigned head_blocks = (num_heads + kCtaHeads - 1) / kCtaHeads;
    const unsigned rest = blockIdx.x / kMaxSplits;  // head block + head blocks * token
    return {rest / head_blocks, rest % head_blocks, head_blocks,
            static_cast<int>(blockIdx.x % kMaxSplits)};
  } else {
    return {blockIdx.x, blockIdx.y, gridDim.y, static_cast<int>(blockIdx.z)};
  }
}

// Both kernels' last step for a split token, after every thread has stored its
// partials: arrive, and in the CTA that arrives last merge the heads of its head block,
// head0 .. head0 + kCtaHeads - 1 (warp w: heads w, w + 8, ...). No-op without counters
// (counters_addr 0: the caller launches the reduction kernel instead).
template <int kMaxSplits, bool kHasSink, int kCtaHeads>
__device__ __forceinline__ void merge_splits_if_last(
    int64_t counters_addr, const CtaPlace& at, int n_splits, int64_t part_acc_addr,
    int64_t part_ml_addr, int64_t out_addr, int64_t out_stride_t, int64_t out_stride_h,
    float* lse_ptr, int64_t lse_stride_t, int64_t sink_addr, int num_heads, float* flag) {
  if (counters_addr == 0) return;
  const int64_t t = at.t;
  const int head0 = at.head_block * kCtaHeads;
  int* counter = reinterpret_cast<int*>(counters_addr) + t * at.head_blocks + at.head_block;
  if (!last_split_to_arrive(counter, n_splits, flag)) return;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int hh = warp; hh < kCtaHeads; hh += kWarps) {
    if (head0 + hh < num_heads)
      merge_head_splits<kMaxSplits, kHasSink>(
          t, head0 + hh, n_splits, reinterpret_cast<const float*>(part_acc_addr),
          reinterpret_cast<const float*>(part_ml_addr), out_addr, out_stride_t, out_stride_h,
          lse_ptr, lse_stride_t, sink_addr, num_heads, threadIdx.x & 31);
  }
}

template <int kMainWidth, int kExtraWidth, bool kHasExtra, bool kHasLen, bool kHasSink,
          int kRowsPerSplit, int kMaxSplits, int kPrefetch, int kSmemBytes, bool kBf16Rows,
          bool kSplitsFastest = false, bool kQkRegisters = false>
__device__ __forceinline__ void attention_cta(
    int64_t q_addr, int64_t q_stride_t, int64_t q_stride_h, int64_t out_addr,
    int64_t out_stride_t, int64_t out_stride_h, float* lse_ptr, int64_t lse_stride_t,
    int64_t max_logits_addr, int64_t part_acc_addr, int64_t part_ml_addr,
    int64_t counters_addr, int64_t main_addr, int64_t main_stride, int main_rows, int main_bs,
    int64_t main_idx_addr, int64_t main_idx_stride, int64_t main_len_addr, int64_t extra_addr,
    int64_t extra_stride, int extra_rows, int extra_bs, int64_t extra_idx_addr,
    int64_t extra_idx_stride,
    int64_t extra_len_addr, int64_t sink_addr, float scale_log2, int num_heads,
    uint8_t* smem_raw) {
  static_assert(kRowsPerSplit % kRows == 0, "splits must hold whole tiles");
  // The buffer TileLang allocates is tilelang_kernels.py's smem_bytes(): it must hold this.
  using S = Smem<kRowsPerSplit, kBf16Rows ? 1 : kRowsPerSplit>;
  static_assert(sizeof(S) <= kSmemBytes, "smem_bytes() is smaller than Smem");
  auto& sm = *reinterpret_cast<S*>(smem_raw);
  const CtaPlace at = cta_place<kSplitsFastest, kMaxSplits, kHeads>(num_heads);
  const int64_t t = at.t;
  const int head0 = at.head_block * kHeads;
  const int split = at.split;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;  // MMA fragment row group
  const int c = lane & 3;   // MMA fragment column pair

  // Loaded before the lengths are known (the loads overlap): this warp's query slice as
  // MMA A fragments: 4 k-steps of 16 dims, heads g and g + 8.
  // NoPE warps: in the tile's pair order (lane c holds dims b + (c & 1) and b + 2 + (c & 1)
  // of the 4-dim block b = 16 kk + 4 (c >> 1)) and times 2^64. The raw words are loaded
  // here and rearranged after the index loads below, so both loads are in flight at once.
  // With kQkRegisters, QK's B fragments are the lane's own decoded registers (chunk c of
  // rows g and g + 8, store_nope_tile_keeping), so the k order is theirs: at k-step kk,
  // fragment columns 2c, 2c + 1 are dims 16c + 4kk + {0, 2} and columns 2c + 8, 2c + 9
  // dims 16c + 4kk + {1, 3}; the lane loads dims 16c + 4kk .. + 3 and splits them so.
  const bool nope = !kBf16Rows && warp < kNopeWarps;
  const bool qk_regs = kQkRegisters && nope;
  uint32_t qw[4][4][2];
  {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(q_addr) + t * q_stride_t + 64 * warp;
    const bool lo_ok = head0 + g < num_heads;
    const bool hi_ok = head0 + g + 8 < num_heads;
    const uint16_t* q_lo = q + static_cast<int64_t>(head0 + g) * q_stride_h;
    const uint16_t* q_hi = q + static_cast<int64_t>(head0 + g + 8) * q_stride_h;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int f = 0; f < 4; ++f) {  // A fragment f: head g (f even) or g + 8, dims + 8 (f >= 2)
        const bool ok = (f & 1) ? hi_ok : lo_ok;
        const uint16_t* head = (f & 1) ? q_hi : q_lo;
        const uint16_t* p = qk_regs ? head + 16 * c + 4 * kk
                                    : head + 16 * kk + (f >= 2 ? 8 : 0) + (nope ? 4 * (c >> 1) : 2 * c);
        qw[kk][f][0] = ok ? *reinterpret_cast<const uint32_t*>(p) : 0u;
        qw[kk][f][1] = (ok && nope) ? *reinterpret_cast<const uint32_t*>(p + 2) : 0u;
      }
    }
  }

  int main_len;
  const int total = token_rows<kMainWidth, kExtraWidth, kHasExtra, kHasLen>(
      t, main_len_addr, extra_len_addr, main_len);
  const int n_splits = max((total + kRowsPerSplit - 1) / kRowsPerSplit, 1);
  if (split >= n_splits) return;
  const int split_rows = split_size(total, n_splits);
  const int r_begin = split * split_rows;
  const int r_end = min(r_begin + split_rows, total);

  // Resolve the split's rows once: record addresses (nullptr for a skipped row), a bit
  // mask of the real rows, and each row's 8 scale bytes -- loaded here, stored to shared
  // memory (with the folded factors made from them) only after the first tiles' loads
  // are issued, so the two loads overlap.
  constexpr int kResolveRounds = (kRowsPerSplit + kWarps * 32 - 1) / (kWarps * 32);
  uint2 scale_bytes[kResolveRounds];
#pragma unroll
  for (int k = 0; k < kResolveRounds; ++k) {
    const int i = k * kWarps * 32 + threadIdx.x;  // whole warps per round: the ballot below
    const int r = r_begin + i;
    const uint8_t* rec = nullptr;
    scale_bytes[k] = make_uint2(0u, 0u);
    if (i < kRowsPerSplit && r < r_end) {
      rec = resolve_row<!kBf16Rows>(t, r, main_len, main_addr, main_stride, main_rows, main_bs,
                                    main_idx_addr, main_idx_stride, extra_addr, extra_stride,
                                    extra_rows, extra_bs, extra_idx_addr, extra_idx_stride,
                                    scale_bytes[k]);
    }
    if (i < kRowsPerSplit) sm.rec[i] = rec;
    const uint32_t real = __ballot_sync(0xffffffffu, rec != nullptr);
    if (lane == 0 && i < kRowsPerSplit) sm.valid[i >> 5] = real;
  }

  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  // Softmax state of the head row this lane owns (warp w owns rows 2w and 2w + 1); l_run
  // is this lane's share of the row's denominator until the tile loop ends.
  const int own_row = 2 * warp + (lane >> 4);
  const int own_col = lane & 15;
  float m_run = kNegBig;
  float l_run = 0.f;
  // A warp whose two head rows are both padding (heads past num_heads, e.g. 8 of the 16
  // with 8 heads per rank) skips the owner work: its rows keep P = 0 and alpha = 1, set
  // here once, so they never trigger the rescale below; their accumulator rows (MMA rows
  // are independent of each other) are never stored.
  const bool owns_real_heads = head0 + 2 * warp < num_heads;
  if (!owns_real_heads) {
    sm.ps[own_row][own_col] = 0;
    if (own_col == 0) sm.alpha[own_row] = 1.f;
  }

  __syncthreads();  // sm.rec / sm.valid are complete

  uint32_t qa[4][4];
  {
    const uint32_t pick = (c & 1) ? 0x7632u : 0x5410u;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        // qk_regs: the even dims of the lane's 4 for fragments 0, 1, the odd for 2, 3
        const uint32_t pick_f = qk_regs ? (f >= 2 ? 0x7632u : 0x5410u) : pick;
        qa[kk][f] = nope ? mul_bf16x2(__byte_perm(qw[kk][f][0], qw[kk][f][1], pick_f), kQBiasBf16x2)
                         : qw[kk][f][0];
      }
    }
  }

  uint16_t* ks = &sm.ks[warp][0][0];
  // Software pipeline in registers: kPrefetch buffers, each refilled with the tile
  // kPrefetch ahead as soon as its own tile is decoded, so kPrefetch tiles' loads are in
  // flight during a tile's math. The tile loop is unrolled by kPrefetch so every buffer has
  // a fixed register home: a register copy of a buffer whose load is still in flight would
  // wait for that load.
  static_assert(kPrefetch == 1 || kPrefetch == 2, "kPrefetch is 1 or 2");
  TileBytes buf[kPrefetch];
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    buf[k].v[0] = buf[k].v[1] = buf[k].v[2] = buf[k].v[3] = make_uint4(0u, 0u, 0u, 0u);
    if (r_begin + k * kRows < r_end) load_tile<kBf16Rows>(buf[k], sm.rec, k * kRows, warp, lane);
  }
#pragma unroll
  for (int k = 0; k < kResolveRounds; ++k) {
    const int i = k * kWarps * 32 + threadIdx.x;
    if (!kBf16Rows && i < kRowsPerSplit) {
#pragma unroll
      for (int grp = 0; grp < kNopeWarps; ++grp) {
        const uint32_t word = grp < 4 ? scale_bytes[k].x : scale_bytes[k].y;
        const uint32_t byte = (word >> (8 * (grp & 3))) & 0xFFu;
        sm.scale[grp][i] = static_cast<uint8_t>(byte);
        sm.fold[grp][i] = static_cast<uint16_t>(factor_field(byte) << 7);
      }
      sm.fold[kNopeWarps][i] = static_cast<uint16_t>(kUnitField << 7);  // RoPE: not scaled
    }
  }
  __syncthreads();  // sm.scale and sm.fold are complete

  auto tile_step = [&](const int r0, TileBytes& cur) {
    const int i0 = r0 - r_begin;
    // Which of the tile's 16 rows are real (bit j = row r0 + j).
    const uint32_t valid = (sm.valid[i0 >> 5] >> (i0 & 31)) & 0xffffu;
    const uint8_t* tile_scale = kBf16Rows ? nullptr : &sm.scale[nope ? warp : 0][i0];

    // The tile's folded factors (bf16x2: row 2c in the low half) for the rows 2c, 2c+1
    // (f01) and 8+2c, 9+2c (f89) of this lane's fragments; 1 for the RoPE warp, so every
    // warp runs one path. bf16 rows have no scales: every factor is 1.
    constexpr uint32_t kOne = (kUnitField << 7) * 0x10001u;
    uint32_t f01 = kOne, f89 = kOne;
    if constexpr (!kBf16Rows) {  // a bf16-row table has 1 row: never read
      f01 = *reinterpret_cast<const uint32_t*>(&sm.fold[warp][i0 + 2 * c]);
      f89 = *reinterpret_cast<const uint32_t*>(&sm.fold[warp][i0 + 8 + 2 * c]);
    }

    uint4 dec[2][2];  // kQkRegisters: a NoPE lane's decoded chunks
    if (qk_regs) {
      store_nope_tile_keeping(ks, cur, tile_scale, lane, dec);
    } else {
      store_tile<kBf16Rows>(ks, cur, tile_scale, warp, lane);
    }
    // The bytes are decoded: refill the buffer with the tile kPrefetch ahead.
    if (r0 + kPrefetch * kRows < r_end) load_tile<kBf16Rows>(cur, sm.rec, i0 + kPrefetch * kRows, warp, lane);
    __syncwarp();

    // Partial logits of this warp's 64 dims: 16 heads x 16 rows, two n-tiles of 8 rows,
    // each a chain of 4 MMAs. All four ldmatrix first, then the two chains interleaved,
    // then the stores: with a store between the n-tiles, ptxas could not hoist the second
    // n-tile's ldmatrix and ran the chains back to back, a NOP-padded chain of 8 dependent
    // MMAs (Nsight Compute, H200). Four chains of 2, with the adds to merge them, measured
    // no faster.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    // kQkRegisters: a NoPE warp's B fragments are its decoded registers, no ldmatrix (a
    // quarter of its shared-memory wavefronts per tile; PV still reads the slice).
    if (qk_regs) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint4& w = dec[j][kk >> 1];  // k-step kk: word kk of the chunk, even, odd
          mma_bf16(s[j], qa[kk], (kk & 1) ? w.z : w.x, (kk & 1) ? w.w : w.y);
        }
      }
    } else {
      uint32_t kb[2][2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ldsm_x4(kb[j][h], ks + (8 * j + (lane & 7)) * kKsStride + 32 * h + 8 * (lane >> 3));
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            mma_bf16(s[j], qa[2 * h + half], kb[j][h][2 * half], kb[j][h][2 * half + 1]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      // a bf16's fp32 is its bits << 16
      const float f_a = __uint_as_float((j == 0 ? f01 : f89) << 16);
      const float f_b = __uint_as_float((j == 0 ? f01 : f89) & 0xFFFF0000u);
      s[j][0] *= f_a;
      s[j][1] *= f_b;
      s[j][2] *= f_a;
      s[j][3] *= f_b;
      *reinterpret_cast<float2*>(&sm.sp[warp][g][sp_col(g, 8 * j + 2 * c)]) =
          make_float2(s[j][0], s[j][1]);
      *reinterpret_cast<float2*>(&sm.sp[warp][g + 8][sp_col(g + 8, 8 * j + 2 * c)]) =
          make_float2(s[j][2], s[j][3]);
    }
    __syncthreads();

    // Owner: full logits of (own_row, own_col), summed over the 8 groups as a fixed tree
    // (deterministic, and 3 dependent adds instead of 8). Each lane keeps its own share of
    // the row's denominator; the 16 shares are summed once, after the last tile.
    if (owns_real_heads) {
      float part[kWarps];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) part[w] = sm.sp[w][own_row][sp_col(own_row, own_col)];
      float x = ((part[0] + part[1]) + (part[2] + part[3])) +
                ((part[4] + part[5]) + (part[6] + part[7]));
      x = ((valid >> own_col) & 1u) ? x * scale_log2 : -INFINITY;
      // The row maximum over its 16 lanes (each half-warp is one row): two independent
      // whole-warp redux.sync on order-preserving integer keys, each blind to the other
      // row, instead of a chain of 4 shuffles and maxima. (Per-half masks would make
      // the compiler take a slow path for a non-uniform mask.) A NaN logit, which only an
      // infinite key or query can make, becomes the row maximum here where fmaxf would skip
      // it; the output is NaN either way, through that row's p.
      const int key = order_key(x);
      const bool low_row = lane < 16;
      const int max_lo = __reduce_max_sync(0xffffffffu, low_row ? key : INT32_MIN);
      const int max_hi = __reduce_max_sync(0xffffffffu, low_row ? INT32_MIN : key);
      const float mx = from_order_key(low_row ? max_lo : max_hi);
      const float m_new = fmaxf(m_run, mx);
      const float alpha = fast_exp2(m_run - m_new);
      const float p = fast_exp2(x - m_new);
      l_run = l_run * alpha + p;
      m_run = m_new;
      const __nv_bfloat16 pb = __float2bfloat16_rn(p);
      sm.ps[own_row][own_col] = *reinterpret_cast<const uint16_t*>(&pb);
      if (own_col == 0) sm.alpha[own_row] = alpha;
    }
    __syncthreads();

    // O[:, group w] = O * alpha + P . K[:, group w]
    {
      const float a_lo = sm.alpha[g];
      const float a_hi = sm.alpha[g + 8];
      // A tile that raised none of the 16 maxima leaves every alpha at exactly 1 (exp2 of
      // 0): the rescale would change nothing, so the warp skips it.
      if (!__all_sync(0xffffffffu, a_lo == 1.f && a_hi == 1.f)) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[j][0] *= a_lo;
          acc[j][1] *= a_lo;
          acc[j][2] *= a_hi;
          acc[j][3] *= a_hi;
        }
      }
      uint32_t pa[4];
      ldsm_x4(pa, &sm.ps[(lane & 7) + 8 * ((lane >> 3) & 1)][8 * (lane >> 4)]);
      {  // P's columns 2c, 2c+1 (pa[0..1]) and 2c+8, 2c+9 (pa[2..3]) are rows
        pa[0] = mul_bf16x2(pa[0], f01);
        pa[1] = mul_bf16x2(pa[1], f01);
        pa[2] = mul_bf16x2(pa[2], f89);
        pa[3] = mul_bf16x2(pa[3], f89);
      }
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        uint32_t vb[4];
        ldsm_x4_trans(vb, ks + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kKsStride +
                              8 * (j + (lane >> 4)));
        mma_bf16(acc[j], pa, vb[0], vb[1]);
        mma_bf16(acc[j + 1], pa, vb[2], vb[3]);
      }
    }
    __syncwarp();  // this warp's ldmatrix reads of ks are done before the next tile's stores
  };

  for (int r0 = r_begin; r0 < r_end; r0 += kPrefetch * kRows) {
#pragma unroll
    for (int k = 0; k < kPrefetch; ++k) {
      if (r0 + k * kRows < r_end) tile_step(r0 + k * kRows, buf[k]);
    }
  }
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, off);

  // NoPE warps: back to natural dim order (pairs (d, d+1) at d = 8j + 2c, as for RoPE) and
  // out of the 2^-64 accumulator bias.
  if (nope) {
    const bool odd = c & 1;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int h = 0; h < 4; h += 2) {
        const float recv = __shfl_xor_sync(0xffffffffu, odd ? acc[j][h] : acc[j][h + 1], 1);
        if (odd) acc[j][h] = recv;
        else acc[j][h + 1] = recv;
        acc[j][h] *= kAccUnbias;
        acc[j][h + 1] *= kAccUnbias;
      }
    }
  }

  const int64_t h_lo = head0 + g;
  const int64_t h_hi = head0 + g + 8;
  if (n_splits == 1) {
    // Owner: normalization factor (sink in the denominator only) and lse, natural log.
    {
      const int64_t h = head0 + own_row;
      const bool has_rows = l_run > 0.f;
      const float lse = has_rows ? (m_run + log2f(l_run)) / kLog2e : -INFINITY;
      float alpha = 1.f;
      float den = l_run;
      if (kHasSink) {
        const float sink = h < num_heads ? reinterpret_cast<const float*>(sink_addr)[h] * kLog2e : 0.f;
        const float m_f = fmaxf(m_run, sink);
        alpha = exp2f(m_run - m_f);
        den = l_run * alpha + exp2f(sink - m_f);
      }
      if (!(den > 0.f)) den = 1.f;  // no rows and no sink: output 0
      __syncthreads();  // every warp has read the last tile's alpha
      if (own_col == 0) {
        sm.alpha[own_row] = alpha / den;
        if (h < num_heads) {
          lse_ptr[t * lse_stride_t + h] = lse;
          // Prefill's max logit (natural log units, lse's layout): FlashMLA returns it.
          if (max_logits_addr != 0)
            reinterpret_cast<float*>(max_logits_addr)[t * lse_stride_t + h] =
                has_rows ? m_run / kLog2e : -INFINITY;
        }
      }
      __syncthreads();
    }
    const float f_lo = sm.alpha[g];
    const float f_hi = sm.alpha[g + 8];
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(out_addr) + t * out_stride_t + 64 * warp;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = 8 * j + 2 * c;
      if (h_lo < num_heads)
        *reinterpret_cast<__nv_bfloat162*>(out + h_lo * out_stride_h + d) =
            __floats2bfloat162_rn(acc[j][0] * f_lo, acc[j][1] * f_lo);
      if (h_hi < num_heads)
        *reinterpret_cast<__nv_bfloat162*>(out + h_hi * out_stride_h + d) =
            __floats2bfloat162_rn(acc[j][2] * f_hi, acc[j][3] * f_hi);
    }
  } else {
    // Partials for the reduction kernel: unnormalized acc and (m, l), base 2.
    const int64_t h = head0 + own_row;
    if (own_col == 0 && h < num_heads) {
      float* ml = reinterpret_cast<float*>(part_ml_addr) + ((t * num_heads + h) * kMaxSplits + split) * 2;
      ml[0] = m_run;
      ml[1] = l_run;
    }
    float* part = reinterpret_cast<float*>(part_acc_addr);
    float* p_lo = part + ((t * num_heads + h_lo) * kMaxSplits + split) * 512 + 64 * warp;
    float* p_hi = part + ((t * num_heads + h_hi) * kMaxSplits + split) * 512 + 64 * warp;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = 8 * j + 2 * c;
      if (h_lo < num_heads) *reinterpret_cast<float2*>(p_lo + d) = make_float2(acc[j][0], acc[j][1]);
      if (h_hi < num_heads) *reinterpret_cast<float2*>(p_hi + d) = make_float2(acc[j][2], acc[j][3]);
    }
    merge_splits_if_last<kMaxSplits, kHasSink, kHeads>(
        counters_addr, at, n_splits, part_acc_addr, part_ml_addr, out_addr, out_stride_t,
        out_stride_h, lse_ptr, lse_stride_t, sink_addr, num_heads, &sm.alpha[0]);
  }
}

// ---------------------------------------------------------------------------------------
// The narrow kernel: at most 8 heads per CTA (8 heads per rank, TP8), 32-row tiles.
//
// With 8 heads the kernel above pads its 16-head MMA rows with zeros: half of every MMA
// and of the softmax is wasted. Here the MMAs run transposed, rows x heads:
//   S^T[32 rows, 8 heads] = K[rows, dims] . Q^T   (A = the K slice, B = the query slice)
//   O^T[64 dims, 8 heads] += V^T[dims, rows] . P^T
// so m16n8k16's n = 8 is exactly the 8 heads. A warp's query slice is then 8 registers and
// its accumulator 16 (instead of 16 and 32), which buys 32-row tiles -- half the barriers
// per row -- within 128 registers. Per tile, warp w (still the owner of scale group w)
//   1. decodes its 64 dims of the 32 rows into its bf16 slice (16-byte chunks XOR-swizzled
//      by row, so ldmatrix and the stores are conflict-free without padding: the 32 KB of
//      slices must leave room under 48 KB),
//   2. computes S^T over its dims (two 16-row m-tiles, chains of 4 MMAs) and stores it;
//      NoPE warps take QK's A fragments from their decoded registers, because a lane's
//      load layout (16 bytes of rows g + 8i) is the fragment layout up to a permutation
//      of the 64 dims, which the query slice gets too,
//   3. after one barrier, owns head w: lane l sums the 8 partials of row l in the same
//      fixed tree, takes the row maximum with one redux.sync and writes P^T's column,
//   4. after a second barrier, accumulates O^T over the tile's 32 rows (8 MMAs).
// The split policy, the folded scales, the slow path for large scale bytes, the skipped
// rows and the partials layout are the wide kernel's; the epilogue stages the output
// through shared memory so that it is written with 16-byte (8-byte bf16) stores. Over bf16
// rows (prefill, kBf16Rows) every warp takes the RoPE warp's path, as in the wide kernel.
//
// Long splits (kRegisterPV, tilelang_kernels.AttentionVariant.register_pv): one split of 640
// rows needs 14.8 KB of row tables, which do not fit beside the 32 KB of slices within
// 48 KB. The NoPE warps then keep their decoded rows in registers until PV and build
// V^T's A fragments from them with movmatrix (an 8 x 8 transpose across the warp: QK's
// fragment blocks, transposed, are PV's), and only the RoPE warp keeps slices, two, filled
// by cp.async one tile ahead. The union with the 16.5 KB output stage then takes 16.5 KB
// instead of 32: 29.8 KB at 192 rows, 40.2 KB at 640. 128 registers, the cap for two
// CTAs per SM: no spills at 192 and 640 rows (the shipped size) on sm_80/86, 4 bytes at
// 336. On the H200 it took the same time as the slices path at 640 rows and 6-13% more
// at 192 (NVIDIA_H200.decode_tilelang_one_split_per_token.log), so short splits keep the
// slices.
//
// Head tiles (kHeadTiles > 1, decode on the register path only): one CTA serves
// 8 x kHeadTiles heads as kHeadTiles n-tiles of the same MMAs. A tile's rows are loaded
// and decoded once for all of them, and PV's movmatrix'd A fragments feed kHeadTiles MMAs
// each, where the wide kernel's head blocks each load and decode the rows again. The
// partial logits (8 x 32 rows x 8 kHeadTiles fp32: 32 KB at 32 heads) and the register
// budget (accumulator 16 kHeadTiles, query slice 8 kHeadTiles) take the kernel past 48 KB
// and 128 registers: one CTA per SM, shared memory by opt-in (the arch's per-block
// limit, tilelang_kernels.AttentionVariant.smem_limit_bytes). Warp w owns heads w + 8j,
// the epilogue stages one n-tile of 8 heads at a time.
// ---------------------------------------------------------------------------------------
constexpr int kNarrowHeads = 8;  // heads per n-tile
constexpr int kNarrowRows = 32;
constexpr int kStageStride = 516;  // fp32 per head of the output stage: 512 + 4, see below

// kTableRows: rows of the scale and field tables, 1 for bf16 rows (prefill).
// kSlices: 32 x 64 bf16 slices, one per warp for bf16 rows (prefill); for records
// (decode) only the RoPE warp has slices, two (its cp.async double buffer): the NoPE
// warps keep their decoded rows in registers for both MMAs.
template <int kRowsPerSplit, int kTableRows, int kSlices, int kHeadTiles = 1>
struct SmemNarrow {
  static constexpr int kPadded = (kRowsPerSplit + kNarrowRows - 1) / kNarrowRows * kNarrowRows;
  static constexpr int kCtaHeads = kNarrowHeads * kHeadTiles;
  union {
    uint16_t ks[kSlices][kNarrowRows][64];  // bf16 slices, see ks_at
    float stage[kNarrowHeads][kStageStride];  // epilogue: one n-tile's output, natural dim order
  } u;
  float sp[kWarps][kNarrowRows][kCtaHeads];  // partial logits S^T, see sp_swizzle
  uint16_t ps[kCtaHeads][kNarrowRows + 8];   // P (bf16) as [head][row], 8 pad: ldmatrix
  float alpha[kCtaHeads];                    // rescale per head; the final factor at the end
  const uint8_t* rec[kPadded];                  // record addresses (nullptr = skip)
  // Per group and row, in lane order (see lane_order): the scale byte (0 for a skipped
  // row) and the folded factor's exponent field (127 for the RoPE group).
  uint8_t scale[kNopeWarps][kTableRows];
  uint8_t field[kWarps][kTableRows];
  uint32_t valid[kPadded / 32];  // bit i: row i of the split is real
};

// Where row i of a split sits in the scale and field tables: within each 32-row tile,
// row 8 k + r at 4 r + k. A lane's rows g, g + 8, g + 16, g + 24 (its decode and QK rows)
// are then one 32-bit word at 4 g, and the PV rows 2c + 8 k and 2c + 1 + 8 k two words at
// 8 c.
__device__ __forceinline__ int lane_order(int i) { return (i & ~31) | ((i & 7) << 2) | ((i >> 3) & 3); }

// Element offset of (row, 16-byte chunk) in a warp's 32 x 64 slice: chunk ^ (row % 8), so
// the 8 rows of an ldmatrix matrix and a quarter-warp's stores hit 8 different bank groups.
__device__ __forceinline__ int ks_at(int row, int chunk) { return row * 64 + 8 * (chunk ^ (row & 7)); }

// Column of sp holding head h of row r: h ^ sp_swizzle(r), so that the owner warp's lanes
// (one row each, one head) read 32 different banks: with 8 heads a row is 8 floats and the
// swizzle (r / 4) % 8; with 16, (r / 2) % 16; with 32, r % 32.
template <int kCtaHeads>
__device__ __forceinline__ int sp_swizzle(int row) {
  static_assert(kCtaHeads == 8 || kCtaHeads == 16 || kCtaHeads == 32, "8, 16 or 32 heads per CTA");
  constexpr int kShift = kCtaHeads == 8 ? 2 : kCtaHeads == 16 ? 1 : 0;
  return (row >> kShift) & (kCtaHeads - 1);
}

// Byte k of two exponent-field words (rows 2c + 8k and 2c + 1 + 8k) as the bf16x2 of
// their factors: a power of two's bf16 is its exponent field << 7.
__device__ __forceinline__ uint32_t factor_pair_bf16(uint2 fields, int k) {
  return (__byte_perm(fields.x, fields.y, 0x7470 + 0x0101 * k) & 0x00FF00FFu) << 7;
}

template <int kMainWidth, int kExtraWidth, bool kHasExtra, bool kHasLen, bool kHasSink,
          int kRowsPerSplit, int kMaxSplits, int kPrefetch, int kSmemBytes, bool kBf16Rows,
          bool kRegisterPV, bool kSplitsFastest = false, int kHeadTiles = 1>
__device__ __forceinline__ void attention_cta_narrow(
    int64_t q_addr, int64_t q_stride_t, int64_t q_stride_h, int64_t out_addr,
    int64_t out_stride_t, int64_t out_stride_h, float* lse_ptr, int64_t lse_stride_t,
    int64_t max_logits_addr, int64_t part_acc_addr, int64_t part_ml_addr,
    int64_t counters_addr, int64_t main_addr, int64_t main_stride, int main_rows, int main_bs,
    int64_t main_idx_addr, int64_t main_idx_stride, int64_t main_len_addr, int64_t extra_addr,
    int64_t extra_stride, int extra_rows, int extra_bs, int64_t extra_idx_addr,
    int64_t extra_idx_stride,
    int64_t extra_len_addr, int64_t sink_addr, float scale_log2, int num_heads,
    uint8_t* smem_raw) {
  static_assert(kRowsPerSplit % kRows == 0, "splits must hold whole 16-row steps");
  static_assert(kPrefetch == 1, "the narrow kernel keeps one tile in flight");
  constexpr int kPaddedRows = (kRowsPerSplit + kNarrowRows - 1) / kNarrowRows * kNarrowRows;
  // kRegisterPV (records only): the NoPE warps' PV takes V^T from their decoded registers
  // through movmatrix instead of their slices, and the RoPE warp's rows reach its two
  // slices by cp.async. That frees 16 KB (the slices' union with the output stage) for
  // long splits' row tables (see the header of this kernel); with short splits the
  // slices path is the faster one.
  static_assert(!(kRegisterPV && kBf16Rows), "bf16 rows (prefill) keep the slices path");
  static_assert(kHeadTiles == 1 || kRegisterPV, "head tiles: decode on the register path only");
  constexpr int kCtaHeads = kNarrowHeads * kHeadTiles;
  using S = SmemNarrow<kRowsPerSplit, kBf16Rows ? 1 : kPaddedRows, kRegisterPV ? 2 : kWarps,
                       kHeadTiles>;
  static_assert(sizeof(S) <= kSmemBytes, "smem_bytes() is smaller than SmemNarrow");
  auto& sm = *reinterpret_cast<S*>(smem_raw);
  const CtaPlace at = cta_place<kSplitsFastest, kMaxSplits, kCtaHeads>(num_heads);
  const int64_t t = at.t;
  const int head0 = at.head_block * kCtaHeads;
  const int split = at.split;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int c = lane & 3;
  // bf16 rows (prefill): every warp takes the RoPE warp's path, as in the wide kernel.
  const bool nope = !kBf16Rows && warp < kNopeWarps;

  // Loaded before the lengths are known (the loads overlap): the query slice as B
  // fragments (k = 16, n = 8 heads: lane holds head g and the k-step's k indices 2c, 2c + 1
  // in qb[kk][0], 8 + 2c, 9 + 2c in qb[kk][1]).
  //   NoPE warps feed QK's A fragments straight from the decoded registers (see the tile
  //   loop), so their k order is the lane's own: k-step kk of lane c is dims
  //   16c + 4kk + {0, 2} (qb[kk][0]) and {1, 3} (qb[kk][1]), times 2^64.
  //   The RoPE warp reads K with ldmatrix: dims 16kk + 2c, +1 and 16kk + 8 + 2c, +1.
  // n-tile nt holds heads head0 + 8 nt + g.
  uint32_t qw[kHeadTiles][4][2];
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
    const bool ok = head0 + 8 * nt + g < num_heads;
    const uint16_t* q = reinterpret_cast<const uint16_t*>(q_addr) + t * q_stride_t + 64 * warp +
                        static_cast<int64_t>(head0 + 8 * nt + g) * q_stride_h;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint16_t* p0 = q + (nope ? 16 * c + 4 * kk : 16 * kk + 2 * c);
      const uint16_t* p1 = p0 + (nope ? 2 : 8);
      qw[nt][kk][0] = ok ? *reinterpret_cast<const uint32_t*>(p0) : 0u;
      qw[nt][kk][1] = ok ? *reinterpret_cast<const uint32_t*>(p1) : 0u;
    }
  }

  int main_len;
  const int total = token_rows<kMainWidth, kExtraWidth, kHasExtra, kHasLen>(
      t, main_len_addr, extra_len_addr, main_len);
  const int n_splits = max((total + kRowsPerSplit - 1) / kRowsPerSplit, 1);
  if (split >= n_splits) return;
  // The wide kernel's split (16-row steps): a split may end inside a 32-row tile, whose
  // rows past it are masked out like skipped rows.
  const int split_rows = split_size(total, n_splits);
  const int r_begin = split * split_rows;
  const int r_end = min(r_begin + split_rows, total);

  // Resolve the split's rows once, as the wide kernel does (rows past the split or the
  // token are skipped rows here too, up to the last tile's end).
  constexpr int kResolveRounds = (S::kPadded + kWarps * 32 - 1) / (kWarps * 32);
  uint2 scale_bytes[kResolveRounds];
#pragma unroll
  for (int k = 0; k < kResolveRounds; ++k) {
    const int i = k * kWarps * 32 + threadIdx.x;
    const int r = r_begin + i;
    const uint8_t* rec = nullptr;
    scale_bytes[k] = make_uint2(0u, 0u);
    if (i < S::kPadded && r < r_end) {
      rec = resolve_row<!kBf16Rows>(t, r, main_len, main_addr, main_stride, main_rows, main_bs,
                                    main_idx_addr, main_idx_stride, extra_addr, extra_stride,
                                    extra_rows, extra_bs, extra_idx_addr, extra_idx_stride,
                                    scale_bytes[k]);
    }
    if (i < S::kPadded) sm.rec[i] = rec;
    const uint32_t real = __ballot_sync(0xffffffffu, rec != nullptr);
    if (lane == 0 && i < S::kPadded) sm.valid[i >> 5] = real;
  }

  // O^T: acc[nt][mt] holds dims 16 mt + g (+ 8), heads 8 nt + 2c, 8 nt + 2c + 1.
  float acc[kHeadTiles][4][4];
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[nt][j][0] = acc[nt][j][1] = acc[nt][j][2] = acc[nt][j][3] = 0.f;
  // Owner state: warp w owns heads w + 8 j (j < kHeadTiles), lane l row l of each tile;
  // l_run is the lane's share of the denominator until the loop ends.
  float m_run[kHeadTiles];
  float l_run[kHeadTiles];
  bool owns_real_head[kHeadTiles];
#pragma unroll
  for (int j = 0; j < kHeadTiles; ++j) {
    m_run[j] = kNegBig;
    l_run[j] = 0.f;
    owns_real_head[j] = head0 + warp + 8 * j < num_heads;
    if (!owns_real_head[j]) {  // a padded head: P 0, never rescaled
      sm.ps[warp + 8 * j][lane] = 0;
      if (lane == 0) sm.alpha[warp + 8 * j] = 1.f;
    }
  }

  __syncthreads();  // sm.rec / sm.valid are complete

  uint32_t qb[kHeadTiles][4][2];
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t w0 = qw[nt][kk][0], w1 = qw[nt][kk][1];
      if (nope) {  // qw = dims (0, 1), (2, 3) of the 4-dim block: pair (0, 2) and (1, 3)
        qb[nt][kk][0] = mul_bf16x2(__byte_perm(w0, w1, 0x5410), kQBiasBf16x2);
        qb[nt][kk][1] = mul_bf16x2(__byte_perm(w0, w1, 0x7632), kQBiasBf16x2);
      } else {
        qb[nt][kk][0] = w0;
        qb[nt][kk][1] = w1;
      }
    }
  }

  // This warp's slice (bf16 rows); the RoPE warp's first buffer (records).
  uint16_t* ks = &sm.u.ks[kRegisterPV ? 0 : warp][0][0];
  // The next tile's bytes, in flight during a tile's math. NoPE lane: 16-byte chunk
  // lane % 4 of rows lane / 4 + 8 i (i < 4); RoPE lane: chunk lane % 8 of rows
  // lane / 8 + 4 i (i < 8), as in the wide kernel's TileBytes (records: by cp.async into
  // the slice buffer `dst`, no registers).
  constexpr int kBufChunks = kRegisterPV ? 4 : 8;
  uint4 buf[kBufChunks];
#pragma unroll
  for (int i = 0; i < kBufChunks; ++i) buf[i] = make_uint4(0u, 0u, 0u, 0u);
  if (kRegisterPV && !nope) {
    // Both buffers start as zeros: a skipped row keeps what its slot held (zeros or a
    // real row's values), finite, with P exactly 0.
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        *reinterpret_cast<uint4*>(&sm.u.ks[b][0][0] + ks_at((lane >> 3) + 4 * i, lane & 7)) =
            make_uint4(0u, 0u, 0u, 0u);
  }
  auto load = [&](int i0, uint16_t* dst) {
    if (nope) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t* r = sm.rec[i0 + (lane >> 2) + 8 * i];
        if (r != nullptr) buf[i] = __ldg(reinterpret_cast<const uint4*>(r + 64 * warp + 16 * (lane & 3)));
      }
    } else if constexpr (kRegisterPV) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = (lane >> 3) + 4 * i;
        const uint8_t* r = sm.rec[i0 + row];
        if (r != nullptr) cp_async_16(dst + ks_at(row, lane & 7), r + 448 + 16 * (lane & 7));
      }
      cp_async_commit();
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint8_t* r = sm.rec[i0 + (lane >> 3) + 4 * i];
        const int at = (kBf16Rows ? 128 * warp : 448) + 16 * (lane & 7);
        if (r != nullptr) buf[i] = __ldg(reinterpret_cast<const uint4*>(r + at));
      }
    }
  };
  load(0, ks);
#pragma unroll
  for (int k = 0; k < kResolveRounds; ++k) {
    const int i = k * kWarps * 32 + threadIdx.x;
    if (!kBf16Rows && i < S::kPadded) {
      const int at = lane_order(i);
#pragma unroll
      for (int grp = 0; grp < kNopeWarps; ++grp) {
        const uint32_t word = grp < 4 ? scale_bytes[k].x : scale_bytes[k].y;
        const uint32_t byte = (word >> (8 * (grp & 3))) & 0xFFu;
        sm.scale[grp][at] = static_cast<uint8_t>(byte);
        sm.field[grp][at] = static_cast<uint8_t>(factor_field(byte));
      }
      sm.field[kNopeWarps][at] = static_cast<uint8_t>(kUnitField);
    }
  }
  __syncthreads();  // sm.scale and sm.field are complete

  for (int r0 = r_begin; r0 < r_end; r0 += kNarrowRows) {
    const int i0 = r0 - r_begin;  // a multiple of 32: whole words of sm.valid
    const uint32_t valid = sm.valid[i0 >> 5];

    // This lane's scale bytes and exponent fields: rows g + 8i (byte i; decode and QK)
    // and, for PV, rows 2c + 8k (fields.x byte k) and 2c + 1 + 8k (fields.y byte k).
    const uint32_t scales = nope ? *reinterpret_cast<const uint32_t*>(&sm.scale[warp][i0 + 4 * g]) : 0u;
    constexpr uint32_t kUnit4 = 0x01010101u * kUnitField;  // bf16 rows: every factor 1
    const uint32_t qk_fields =
        kBf16Rows ? kUnit4 : *reinterpret_cast<const uint32_t*>(&sm.field[warp][i0 + 4 * g]);
    const uint2 pv_fields = kBf16Rows ? make_uint2(kUnit4, kUnit4)
                                      : *reinterpret_cast<const uint2*>(&sm.field[warp][i0 + 8 * c]);

    // 1. Decode into the slice and 2. S^T over this warp's 64 dims (m-tiles of rows 0-15
    // and 16-31, 4 k-steps each).
    float s[kHeadTiles][2][4];
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) s[nt][mt][0] = s[nt][mt][1] = s[nt][mt][2] = s[nt][mt][3] = 0.f;
    // The lane's decoded rows g + 8i (NoPE warps), kept for PV when kRegisterPV.
    uint32_t kw[4][8];
    if (nope) {
      // The lane's decoded rows g + 8i stay in kw: m-tile mt's rows g and g + 8 are rows
      // 2mt and 2mt + 1, and k-step kk is their words 2kk (k = 2c, 2c + 1) and 2kk + 1
      // (k = 8 + 2c, 9 + 2c), so QK's A fragments need no shared-memory round trip.
      // One warp-wide choice per tile between the branch-free raw decode and the
      // per-chunk one (a branch per chunk would keep ptxas from interleaving them).
      const bool fold = __all_sync(0xffffffffu, all_fold(scales));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * i;
        uint4 lo, hi;
        if (fold) {
          raw_chunk(buf[i], lo, hi);
        } else {
          decode_chunk(buf[i], (scales >> (8 * i)) & 0xFFu, lo, hi);
        }
        if (!kRegisterPV) {
          *reinterpret_cast<uint4*>(ks + ks_at(row, 2 * c)) = lo;
          *reinterpret_cast<uint4*>(ks + ks_at(row, 2 * c + 1)) = hi;
        }
        kw[i][0] = lo.x, kw[i][1] = lo.y, kw[i][2] = lo.z, kw[i][3] = lo.w;
        kw[i][4] = hi.x, kw[i][5] = hi.y, kw[i][6] = hi.z, kw[i][7] = hi.w;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const uint32_t a[4] = {kw[2 * mt][2 * kk], kw[2 * mt + 1][2 * kk],
                                 kw[2 * mt][2 * kk + 1], kw[2 * mt + 1][2 * kk + 1]};
#pragma unroll
          for (int nt = 0; nt < kHeadTiles; ++nt)
            mma_bf16(s[nt][mt], a, qb[nt][kk][0], qb[nt][kk][1]);
        }
      }
    } else {
      // The RoPE warp's lanes hold whole 128-byte rows per 8 lanes: through shared
      // memory and ldmatrix, all eight first, then the two chains interleaved.
      if constexpr (kRegisterPV) {
        cp_async_wait_all();  // this tile's rows are in ks (issued a tile ago)
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int row = (lane >> 3) + 4 * i;
          *reinterpret_cast<uint4*>(ks + ks_at(row, lane & 7)) = buf[i];
        }
      }
      __syncwarp();
      uint32_t ka[2][4][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          ldsm_x4(ka[mt][kk],
                  ks + ks_at(16 * mt + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * kk + (lane >> 4)));
        }
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < kHeadTiles; ++nt)
            mma_bf16(s[nt][mt], ka[mt][kk], qb[nt][kk][0], qb[nt][kk][1]);
      }
    }
    // The tile's bytes are used up: refill the buffer with the next tile (after QK, so
    // that the buffer and QK's 32 fragment registers are not live at once).
    uint16_t* const ks_next = kRegisterPV ? &sm.u.ks[((i0 / kNarrowRows) + 1) & 1][0][0] : ks;
    if (r0 + kNarrowRows < r_end) load(i0 + kNarrowRows, ks_next);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // rows 16 mt + g (+ 8), heads 8 nt + 2c (+ 1)
        const int row = 16 * mt + g + 8 * half;
        const uint32_t field = (qk_fields >> (8 * (2 * mt + half))) & 0xFFu;
        const float f = __uint_as_float(field << 23);
        const int sw = sp_swizzle<kCtaHeads>(row);
#pragma unroll
        for (int nt = 0; nt < kHeadTiles; ++nt) {
          const float v0 = s[nt][mt][2 * half] * f;
          const float v1 = s[nt][mt][2 * half + 1] * f;
          // head h = 8 nt + 2c lands at column h ^ sw: the pair stays in one aligned
          // float2, swapped when sw is odd
          *reinterpret_cast<float2*>(&sm.sp[warp][row][(8 * nt + 2 * c) ^ (sw & ~1)]) =
              (sw & 1) ? make_float2(v1, v0) : make_float2(v0, v1);
        }
      }
    }
    __syncthreads();

    // 3. Owner of heads `warp` + 8 j: row `lane`'s full logit, the running maximum, P^T.
#pragma unroll
    for (int j = 0; j < kHeadTiles; ++j) {
      if (!owns_real_head[j]) continue;
      const int hh = warp + 8 * j;
      const int col = hh ^ sp_swizzle<kCtaHeads>(lane);
      float part[kWarps];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) part[w] = sm.sp[w][lane][col];
      float x = ((part[0] + part[1]) + (part[2] + part[3])) +
                ((part[4] + part[5]) + (part[6] + part[7]));
      x = ((valid >> lane) & 1u) ? x * scale_log2 : -INFINITY;
      const float mx = from_order_key(__reduce_max_sync(0xffffffffu, order_key(x)));
      const float m_new = fmaxf(m_run[j], mx);
      const float alpha = fast_exp2(m_run[j] - m_new);
      const float p = fast_exp2(x - m_new);
      l_run[j] = l_run[j] * alpha + p;
      m_run[j] = m_new;
      const __nv_bfloat16 pb = __float2bfloat16_rn(p);
      sm.ps[hh][lane] = *reinterpret_cast<const uint16_t*>(&pb);
      if (lane == 0) sm.alpha[hh] = alpha;
    }
    __syncthreads();

    // 4. O^T = O^T * alpha + V^T . P^T over the tile's two 16-row k-steps.
    {
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
        const float2 a = *reinterpret_cast<const float2*>(&sm.alpha[8 * nt + 2 * c]);
        if (!__all_sync(0xffffffffu, a.x == 1.f && a.y == 1.f)) {
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            acc[nt][mt][0] *= a.x;
            acc[nt][mt][1] *= a.y;
            acc[nt][mt][2] *= a.x;
            acc[nt][mt][3] *= a.y;
          }
        }
      }
      // B fragments of both k-steps: P[head 8 nt + g][rows 2c, 2c+1 | 8+2c, 9+2c | 16+.. |
      // 24+..], each pair times its rows' folded factors.
      uint32_t pb[kHeadTiles][4];
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
        ldsm_x4(pb[nt], &sm.ps[8 * nt + (lane & 7)][8 * (lane >> 3)]);
#pragma unroll
        for (int j = 0; j < 4; ++j) pb[nt][j] = mul_bf16x2(pb[nt][j], factor_pair_bf16(pv_fields, j));
      }
      if (kRegisterPV && nope) {
        // V^T's A fragments are QK's transposed 8 x 8 blocks: movmatrix of kw[i][w]
        // gives lane (g, c) dim 16 (g / 2) + 4 (w / 2) + 2 (g % 2) + w % 2 (the raw
        // decode's pair order) at rows 8 i + 2c, 2c + 1. m-tile mt is the dims of words
        // 2mt (rows m = g) and 2mt + 1 (m = g + 8), k-step k rows 16 k .. 16 k + 15.
#pragma unroll
        for (int k = 0; k < 2; ++k) {
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            const uint32_t va[4] = {movmatrix_trans(kw[2 * k][2 * mt]),
                                    movmatrix_trans(kw[2 * k][2 * mt + 1]),
                                    movmatrix_trans(kw[2 * k + 1][2 * mt]),
                                    movmatrix_trans(kw[2 * k + 1][2 * mt + 1])};
#pragma unroll
            for (int nt = 0; nt < kHeadTiles; ++nt)
              mma_bf16(acc[nt][mt], va, pb[nt][2 * k], pb[nt][2 * k + 1]);
          }
        }
      } else {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
#pragma unroll
          for (int mt = 0; mt < 4; ++mt) {
            uint32_t va[4];
            ldsm_x4_trans(va, ks + ks_at(16 * k + (lane & 7) + 8 * (lane >> 4),
                                         2 * mt + ((lane >> 3) & 1)));
#pragma unroll
            for (int nt = 0; nt < kHeadTiles; ++nt)
              mma_bf16(acc[nt][mt], va, pb[nt][2 * k], pb[nt][2 * k + 1]);
          }
        }
      }
    }
    __syncwarp();  // this warp's reads of its slice are done before the next tile's stores
    if (kRegisterPV && !nope) ks = ks_next;
  }
#pragma unroll
  for (int j = 0; j < kHeadTiles; ++j)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], off);

  // One n-tile of 8 heads at a time through the stage; warp w writes head 8 nt + w, whose
  // owner it is.
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
    // Every slice read and the last tile's alpha (nt 0), or the previous n-tile's stage
    // reads, are done.
    __syncthreads();
    // acc[nt][mt][0..3] = O^T at slice column 16 mt + g (+ 8 for [2], [3]), heads 2c, 2c + 1
    // of the n-tile. A NoPE column j holds dim (j & ~3) | (j & 1) << 1 | (j >> 1) & 1 (the
    // raw decode's pair order) and is out x 2^-64; on the register path NoPE m-row g (+ 8)
    // of m-tile mt holds dim 16 (g / 2) + 4 mt + 2 (g % 2) (+ 1), see PV. Head rows 2c of
    // the stage are 2 x 516 floats apart: the 32 lanes' stores hit 32 banks (the register
    // path's NoPE stores: 8 banks, 4-way, 16 stores a lane; about 0.04 us a CTA on the H200).
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 16 * mt + g + 8 * half;
        const int nope_col = kRegisterPV ? 16 * (g >> 1) + 4 * mt + 2 * (g & 1) + half
                                         : (j & ~3) | ((j & 1) << 1) | ((j >> 1) & 1);
        const int d = 64 * warp + (nope ? nope_col : j);
        const float unbias = nope ? kAccUnbias : 1.f;
        sm.u.stage[2 * c][d] = acc[nt][mt][2 * half] * unbias;
        sm.u.stage[2 * c + 1][d] = acc[nt][mt][2 * half + 1] * unbias;
      }
    }
    const int hh = 8 * nt + warp;  // the owner warp's head in the CTA
    const int64_t h = head0 + hh;  // and in the layer
    const bool real = h < num_heads;
    if (n_splits == 1) {
      // Owner: normalization (sink in the denominator only) and lse, natural log.
      if (lane == 0) {
        const bool has_rows = l_run[nt] > 0.f;
        const float lse = has_rows ? (m_run[nt] + log2f(l_run[nt])) / kLog2e : -INFINITY;
        float alpha = 1.f;
        float den = l_run[nt];
        if (kHasSink) {
          const float sink = real ? reinterpret_cast<const float*>(sink_addr)[h] * kLog2e : 0.f;
          const float m_f = fmaxf(m_run[nt], sink);
          alpha = exp2f(m_run[nt] - m_f);
          den = l_run[nt] * alpha + exp2f(sink - m_f);
        }
        if (!(den > 0.f)) den = 1.f;  // no rows and no sink: output 0
        sm.alpha[hh] = alpha / den;
        if (real) {
          lse_ptr[t * lse_stride_t + h] = lse;
          if (max_logits_addr != 0)  // prefill, as in the wide kernel
            reinterpret_cast<float*>(max_logits_addr)[t * lse_stride_t + h] =
                has_rows ? m_run[nt] / kLog2e : -INFINITY;
        }
      }
      __syncthreads();
      if (real) {
        const float f = sm.alpha[hh];
        __nv_bfloat16* out =
            reinterpret_cast<__nv_bfloat16*>(out_addr) + t * out_stride_t + h * out_stride_h;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int d = 128 * k + 4 * lane;
          const float4 v = *reinterpret_cast<const float4*>(&sm.u.stage[warp][d]);
          const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x * f, v.y * f);
          const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z * f, v.w * f);
          *reinterpret_cast<uint2*>(out + d) = make_uint2(
              *reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
        }
      }
    } else {
      if (lane == 0 && real) {
        float* ml = reinterpret_cast<float*>(part_ml_addr) + ((t * num_heads + h) * kMaxSplits + split) * 2;
        ml[0] = m_run[nt];
        ml[1] = l_run[nt];
      }
      __syncthreads();
      if (real) {
        float* part = reinterpret_cast<float*>(part_acc_addr) + ((t * num_heads + h) * kMaxSplits + split) * 512;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int d = 128 * k + 4 * lane;
          *reinterpret_cast<float4*>(part + d) = *reinterpret_cast<const float4*>(&sm.u.stage[warp][d]);
        }
      }
      if (nt == kHeadTiles - 1)  // every head's partials are stored
        merge_splits_if_last<kMaxSplits, kHasSink, kCtaHeads>(
            counters_addr, at, n_splits, part_acc_addr, part_ml_addr, out_addr, out_stride_t,
            out_stride_h, lse_ptr, lse_stride_t, sink_addr, num_heads, &sm.alpha[0]);
    }
  }
}

}  // namespace deepinfer_mla

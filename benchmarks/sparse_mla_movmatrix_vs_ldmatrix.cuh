// Two ways to build P.V's A fragment (16 x 16 bf16, 4 registers a lane) for the next
// mma.sync.m16n8k16, each feeding one MMA per fragment:
//   kMovmatrix: four movmatrix.trans of values already in registers (the sparse-MLA narrow
//               kernel's register path, kRegisterPV in attention_sm80.cuh);
//   kLdmatrix:  one ldmatrix.x4.trans from the warp's own 16 x 16 tile in shared memory
//               (the path through shared memory the wide kernel takes);
//   kMmaOnly:   the same MMAs on fixed fragments, the floor both are measured against.
// kChains independent accumulator chains a warp. Uses deepinfer_mla's helpers
// (movmatrix_trans, ldsm_x4_trans, mma_bf16), so the instructions are the kernel's.
// Used by benchmarks/sparse_mla_movmatrix_vs_ldmatrix.py.

namespace movmatrix_vs_ldmatrix {

constexpr int kMmaOnly = 0, kMovmatrix = 1, kLdmatrix = 2;
// One fragment's 16 x 16 bf16 in shared memory, rows padded to 24 (48 B) as the kernel
// pads P: the 8 rows an ldmatrix phase reads then hit 8 different bank quads.
constexpr int kRowHalves = 24;
constexpr int kTileHalves = 16 * kRowHalves;

template <int kMode, int kChains, int kSteps>
__device__ __forceinline__ void run(float* out, uint32_t seed, uint8_t* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint16_t* tiles = reinterpret_cast<uint16_t*>(smem) + warp * kChains * kTileHalves;
  if constexpr (kMode == kLdmatrix) {
    for (int i = lane; i < kChains * kTileHalves; i += 32) tiles[i] = uint16_t(seed + i);
    __syncwarp();
  }
  // Operands from a runtime seed, so nothing folds at compile time.
  uint32_t x[kChains][4];
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) x[c][i] = seed * (4u * c + i + 1u) ^ 0x3f803c00u;
  const uint32_t b0 = seed * 3u, b1 = seed * 5u;
  float d[kChains][4];
#pragma unroll
  for (int c = 0; c < kChains; ++c) d[c][0] = d[c][1] = d[c][2] = d[c][3] = 0.f;
  // ldmatrix.x4: lane l gives the address of row l % 16 of the tile, column half l / 16.
  const int ld_offset = (lane % 16) * kRowHalves + (lane / 16) * 8;
#pragma unroll 1
  for (int step = 0; step < kSteps; ++step) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      uint32_t a[4];
      if constexpr (kMode == kMovmatrix) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = deepinfer_mla::movmatrix_trans(x[c][i]);
      } else if constexpr (kMode == kLdmatrix) {
        deepinfer_mla::ldsm_x4_trans(a, tiles + c * kTileHalves + ld_offset);
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = x[c][i];
      }
      deepinfer_mla::mma_bf16(d[c], a, b0, b1);
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) sum += (d[c][0] + d[c][1]) + (d[c][2] + d[c][3]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;  // keeps every chain live
}

}  // namespace movmatrix_vs_ldmatrix

// The device's rate for Ampere's Tensor Core instruction, mma.sync.m16n8k16 with bf16
// inputs and fp32 accumulators (what ops/sparse_mla/attention_sm80.cuh issues), with
// kChains independent accumulator chains per warp and no memory traffic: a ceiling for
// any kernel built on it at that occupancy. Used by benchmarks/sparse_mla_mma_sync_peak.py.
#include <cstdint>

namespace mma_sync_peak {

template <int kChains, int kSteps>
__device__ __forceinline__ void run(float* out, uint32_t seed) {
  // Operands derived from a runtime seed, so nothing folds at compile time.
  const uint32_t a[4] = {seed, seed ^ 0x3f803f80u, seed + 1u, seed ^ 0x3c003c00u};
  const uint32_t b0 = seed * 3u, b1 = seed * 5u;
  float d[kChains][4];
#pragma unroll
  for (int c = 0; c < kChains; ++c) d[c][0] = d[c][1] = d[c][2] = d[c][3] = 0.f;
#pragma unroll 1
  for (int step = 0; step < kSteps; ++step) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
          "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) sum += (d[c][0] + d[c][1]) + (d[c][2] + d[c][3]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;  // keeps every chain live
}

}  // namespace mma_sync_peak

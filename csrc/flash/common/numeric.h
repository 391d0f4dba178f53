// Element-type helpers shared by all kernels: packing fp32 pairs into 16-bit pairs for the
// tensor cores and the matching MMA for each element type.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../ptx/mma.h"
#include "int_math.h"

namespace flashattn_cu {

template <typename Element>
struct ElementOps;

template <>
struct ElementOps<__half> {
  // (1.0, 1.0) as one register: a ones column for mma's B operand (row sums of an A fragment).
  static constexpr uint32_t kOnePair = 0x3c003c00u;
  // Two floats -> one 32-bit register holding (lo, hi) as fp16, round to nearest.
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t r) {
    return __half22float2(*reinterpret_cast<__half2*>(&r));
  }
  static __device__ __forceinline__ float2 unpack_bits(uint32_t r) { return unpack(r); }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    ptx::mma_m16n8k16_f16_f32(d, a, b0, b1);
  }
};

template <>
struct ElementOps<__nv_bfloat16> {
  static constexpr uint32_t kOnePair = 0x3f803f80u;  // (1.0, 1.0)
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t r) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&r));
  }
  // The same values as unpack (bf16 -> fp32 is exact: the 16 bits become the float's top half),
  // written as the shift and the mask it is: in the sm90 backward ptxas moved unpack's halves
  // through two PRMTs a word first. (The sm80 backward keeps unpack: there the other form moved
  // its register allocation, with more spills in some variants and fewer in others.)
  static __device__ __forceinline__ float2 unpack_bits(uint32_t r) {
    return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xFFFF0000u));
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    ptx::mma_m16n8k16_bf16_f32(d, a, b0, b1);
  }
};

// Butterfly reductions over the 4 lanes (a "quad") that share one accumulator row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashattn_cu

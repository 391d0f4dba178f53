// Special-function instructions used by the softmax and the score modifiers.
#pragma once

#include <cstdint>

#include "arch.h"

namespace flashattn_cu::ptx {

// 2^x on the SFU (MUFU.EX2). ex2.approx(-inf) = +0, which the online softmax relies on.
FLASHATTN_CU_DEVICE float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// log2(x) on the SFU (MUFU.LG2): log2(+0) = -inf.
FLASHATTN_CU_DEVICE float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh(x) on the SFU (MUFU.TANH, sm_75 and newer): relative error at most 2^-10.987 (PTX ISA),
// the instruction flash_attn's softcap uses too; saturates to +-1.
FLASHATTN_CU_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// IEEE fp32 multiply / add / subtract, rounded to nearest even, denormals kept (no .ftz, whatever
// -ftz / --use_fast_math say) and never contracted into an FMA: the rounding of each step of
// torch's eager elementwise ops, so a kernel can reproduce their bits (problem/kv_append.h: the
// rotary embedding).
FLASHATTN_CU_DEVICE float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
FLASHATTN_CU_DEVICE float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
FLASHATTN_CU_DEVICE float sub_rn(float a, float b) {
  float r;
  asm("sub.rn.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Two floats to two e4m3 bytes (cvt.rn.satfinite.e4m3x2.f32, sm_89 and newer): `a` in the upper
// byte of the low 16 bits, `b` in the lower (the PTX ISA's order), round to nearest, saturated to
// +-448.
FLASHATTN_CU_DEVICE uint32_t cvt_e4m3x2(float a, float b) {
#if FLASHATTN_CU_SM90_OR_NEWER
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(d) : "f"(a), "f"(b));
  return d;
#else
  unsupported_arch();
  return 0;
#endif
}

// Two e4m3 bytes (the low 16 bits of x) to two fp16 (cvt.rn.f16x2.e4m3x2): the upper byte to
// the upper half, exactly (every e4m3 value is an fp16 value).
FLASHATTN_CU_DEVICE uint32_t cvt_f16x2_from_e4m3x2(uint32_t x) {
#if FLASHATTN_CU_SM90_OR_NEWER
  uint32_t d;
  const uint16_t a = static_cast<uint16_t>(x);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(a));
  return d;
#else
  unsupported_arch();
  return 0;
#endif
}

}  // namespace flashattn_cu::ptx

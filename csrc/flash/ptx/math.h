// Special-function instructions used by the softmax.
#pragma once

#include "arch.h"

namespace flashattn_cu::ptx {

// 2^x on the SFU (MUFU.EX2). ex2.approx(-inf) = +0, which the online softmax relies on.
FLASHATTN_CU_DEVICE float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashattn_cu::ptx

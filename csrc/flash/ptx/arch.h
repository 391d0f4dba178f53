// Arch guards for the PTX wrappers. Each wrapper compiles to its instruction on the archs that
// have it and to a trap elsewhere, so a wrong dispatch fails loudly instead of computing garbage.
#pragma once

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define FLASHATTN_CU_SM80_OR_NEWER 1
#else
#define FLASHATTN_CU_SM80_OR_NEWER 0
#endif

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define FLASHATTN_CU_SM90_OR_NEWER 1
#else
#define FLASHATTN_CU_SM90_OR_NEWER 0
#endif

// sm_90a: the arch-specific Hopper features (wgmma, setmaxnreg) exist only in code compiled for
// compute_90a, never in plain sm_90 or in PTX JIT-compiled for a later GPU.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_CU_SM90A 1
#else
#define FLASHATTN_CU_SM90A 0
#endif

#define FLASHATTN_CU_DEVICE __device__ __forceinline__

namespace flashattn_cu::ptx {

FLASHATTN_CU_DEVICE void unsupported_arch() {
#if defined(__CUDA_ARCH__)
  __trap();
#endif
}

}  // namespace flashattn_cu::ptx

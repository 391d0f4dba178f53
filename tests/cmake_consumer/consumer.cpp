// Links the installed flashattn_cu and checks, without a GPU, that its C++ API answers: the
// built head dims and archs are listed, and a call with an invalid argument returns
// kInvalidArgument instead of touching a device.
#include <cstdio>

#include "flashattn_cu/flashattn_cu.h"

int main() {
  int dims[16], archs[16];
  const int n_dims = flashattn_cu::built_head_dims(dims, 16);
  const int n_archs = flashattn_cu::built_archs(archs, 16);
  flashattn_cu::FwdParams p;  // batch 0 heads 0: invalid
  const flashattn_cu::Status st = flashattn_cu::fwd(p, nullptr);
  std::printf("consumer: %d head dims, %d archs, fwd(invalid) = %s\n", n_dims, n_archs,
              flashattn_cu::status_string(st));
  return n_dims > 0 && n_archs > 0 && st == flashattn_cu::Status::kInvalidArgument ? 0 : 1;
}

#include "../decode_launch.h"

namespace flashattn_cu::sm90 {
template Status run_decode<__half, 64>(const FwdKvcacheKernelParams&, int, bool,
                                       cudaStream_t);
}

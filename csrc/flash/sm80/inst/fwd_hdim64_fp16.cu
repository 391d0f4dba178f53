#include "../fwd_launch.h"

namespace flashattn_cu::sm80 {
template Status run_fwd<__half, 64>(const FwdParams&, bool, cudaStream_t);
template Status run_fwd_kvcache<__half, 64>(const FwdKvcacheKernelParams&, bool,
                                           cudaStream_t);
}

#include "../fwd_launch.h"

namespace flashattn_cu::sm80 {
template Status run_fwd<__nv_bfloat16, 224>(const FwdParams&, bool, cudaStream_t);
template Status run_fwd_kvcache<__nv_bfloat16, 224>(const FwdKvcacheKernelParams&, bool,
                                           cudaStream_t);
}

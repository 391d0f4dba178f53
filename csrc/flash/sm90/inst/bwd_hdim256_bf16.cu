#include "../bwd_launch.h"

namespace flashattn_cu::sm90 {
template Status run_bwd<__nv_bfloat16, 256>(const BwdParams&, cudaStream_t);
}

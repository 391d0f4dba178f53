#include "../bwd_launch.h"

namespace flashattn_cu::sm90 {
template Status run_bwd<__nv_bfloat16, 64>(const BwdParams&, cudaStream_t);
}

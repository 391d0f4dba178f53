#include "../fwd_launch.h"

namespace flashattn_cu::sm90 {
template Status run_fwd<__half, 256>(const FwdParams&, cudaStream_t);
}

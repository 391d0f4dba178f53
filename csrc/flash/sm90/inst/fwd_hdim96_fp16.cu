#include "../fwd_launch.h"

namespace flashattn_cu::sm90 {
template Status run_fwd<__half, 96>(const FwdParams&, cudaStream_t);
}

#include "../bwd_launch.h"

namespace flashattn_cu::sm80 {
template Status run_bwd<__half, 160>(const BwdParams&, bool, cudaStream_t);
}

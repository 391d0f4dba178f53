// The append + rotary of a kvcache call as its own kernel, ahead of the sm90a decode kernel
// (sm90/decode_kernel.h reads the cache through TMA and has no fused append; the sm80 kvcache
// kernel fuses it: problem/kv_append.h). One block per (entry, head of the packed call):
//  * the first query head of each kv head's group (under GQA packing every block's head is a kv
//    head) writes all seqlen_new new rows of (entry, kv head) to the cache, k rotated at its
//    position, v as is: write_appended_rows with the whole share, so every row once and the bytes
//    the sm80 path writes (rotated_chunk, torch's fp32 arithmetic);
//  * with rotary, every block writes its q rows rotated (at cache_seqlens, + the query's index
//    with causal or a window) to q_out, laid out like q (GqaPack offsets, q_out's strides), which
//    the decode kernel then reads in place of q.
// The decode kernel runs after this one on the stream, so it reads the appended rows from the
// cache like any other.
#pragma once

#include <cstdint>

#include "../problem/kv_append.h"
#include "../problem/kv_cache.h"
#include "../problem/params.h"
#include "../problem/seqlen.h"
#include "../ptx/sync.h"

namespace flashattn_cu::forward {

constexpr int kAppendThreads = 128;

// q_out strides (elements) of the q copy; q_out null: no rotary, q is read as is.
struct RotatedQ {
  void* q_out;
  int64_t batch_stride, row_stride, head_stride;
};

template <typename Element>
__global__ void __launch_bounds__(kAppendThreads)
    kvcache_append_kernel(const __grid_constant__ FwdKvcacheKernelParams kp, RotatedQ rq) {
  // Launched programmatically (fwd/combine.cu): nothing is read before the previous kernel (the
  // key counts, or the caller's) has finished; the decode kernel after it may be scheduled at
  // once and waits for this grid's completion before it reads the cache.
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const FwdParams& p = kp.p;
  const KvcacheKernelFields& kv = kp.kv;
  const int batch = blockIdx.x / p.num_heads, head = blockIdx.x % p.num_heads;
  const int tid = threadIdx.x;
  const int head_k = head / (p.num_heads / p.num_heads_k);
  const int cache_row0 = kv.cache_leftpad != nullptr ? max(kv.cache_leftpad[batch], 0) : 0;
  const int new_key0 = kv.cache_seqlens[batch] - cache_row0;
  const RotaryTable rot = rotary_of(kv);

  if (head % (p.num_heads / p.num_heads_k) == 0) {
    Element* k_cache = const_cast<Element*>(static_cast<const Element*>(p.k)) +
                       head_k * p.k_head_stride;
    Element* v_cache = const_cast<Element*>(static_cast<const Element*>(p.v)) +
                       head_k * p.v_head_stride;
    PagedKv pages{};
    if (kv.block_table != nullptr) {
      pages = PagedKv{kv.block_table + batch * kv.block_table_batch_stride, kv.page_size,
                      kv.num_pages};
    } else {
      int entry = batch;
      if (kv.cache_batch_idx != nullptr) {  // clamped: flashattn_cu.h, KvcacheParams
        entry = min(max(kv.cache_batch_idx[batch], 0), kv.batch_cache - 1);
      }
      k_cache += entry * p.k_batch_stride;
      v_cache += entry * p.v_batch_stride;
    }
    auto cache_row = [&](int row, bool is_v) -> Element* {
      Element* const base = is_v ? v_cache : k_cache;
      if (kv.block_table != nullptr) {
        return base + (is_v ? pages.row_offset(row, p.v_batch_stride, p.v_row_stride)
                            : pages.row_offset(row, p.k_batch_stride, p.k_row_stride));
      }
      return base + static_cast<int64_t>(row) * (is_v ? p.v_row_stride : p.k_row_stride);
    };
    write_appended_rows<kAppendThreads>(
        appended_rows_of<Element>(p, kv, batch, head, new_key0, cache_row0),
        AppendShare{0, kv.seqlen_new}, p.seqlen_k, p.head_dim, rot, cache_row, tid);
  }

  if (rq.q_out == nullptr) return;
  // This block's packed rows (problem/kv_cache.h: GqaPack; the call's queries of this entry).
  const GqaPack pack{kv.pack_group};
  const SeqInfo seq = packed_seq_info(p, batch, pack.group);
  const Element* q = static_cast<const Element*>(p.q) +
                     seq.q_offset(p.q_batch_stride, p.q_row_stride) +
                     static_cast<int64_t>(head) * pack.group * p.q_head_stride;
  Element* out = static_cast<Element*>(rq.q_out) + seq.q_offset(rq.batch_stride, rq.row_stride) +
                 static_cast<int64_t>(head) * pack.group * rq.head_stride;
  const int chunks = p.head_dim / 8;
  const int pos0 = new_key0 + cache_row0;  // cache_seqlens: the first new row's position
#pragma unroll 1
  for (int idx = tid; idx < seq.seqlen_q * chunks; idx += kAppendThreads) {
    const int r = idx / chunks, c = idx % chunks;
    const int query = pack.query(r);
    const uint4 val = rotated_chunk(q + pack.offset(r, p.q_row_stride, p.q_head_stride), c, rot,
                                    rot.clamp(pos0 + (kv.rotary_q_per_row ? query : 0)));
    *reinterpret_cast<uint4*>(out + pack.offset(r, rq.row_stride, rq.head_stride) + c * 8) = val;
  }
}

}  // namespace flashattn_cu::forward

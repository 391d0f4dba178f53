// The backward's dQ postprocess alone (bwd/preprocess.h bwd_convert_kernel), torch-free: the fp32
// dQ accumulator of the sm90 main kernel (bwd/params.h dq_frag_offset's 64-row blocks) converted
// to bf16 dq (batch, seqlen, heads, d) by 16-byte chunks (BwdConvertJob frag_blocks = false:
// each thread reads 32 bytes at 2 KB strides) against a block at a time through shared memory
// (frag_blocks = true: convert_frag_blocks, reads in memory order), and the chunk path on a plain
// row-major accumulator (reads in memory order, no staging) as the rate the traffic allows.
//
//   nvcc -std=c++17 -O3 --use_fast_math -arch=sm_90a -Icsrc/include -Icsrc/flash \
//       benchmarks/tune/convert_rate.cu -o /tmp/convert_rate && /tmp/convert_rate
//
// Each line: the shape, the three times (median of 30 calls after a 256 MB read of the L2, the
// variants interleaved over 5 rounds), the GB/s of the blocked path (fp32 read + bf16 written),
// and whether the blocked output equals the chunk path's (both scale the same floats once).
#include <cstdio>
#include <vector>

#include "bwd/preprocess.h"
#include "harness.h"

namespace bw = flashattn_cu::backward;

namespace {

__global__ void fill_floats(float* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    x[i] = (h & 0xffff) / 32768.f - 1.f;
  }
}

struct Shape {
  int batch, seqlen, heads, d;
};

float launch_ms(const bw::BwdConvertParams& cp, int reps) {
  const int64_t want = (cp.max_chunks + bw::kConvertThreads - 1) / bw::kConvertThreads;
  const unsigned blocks = static_cast<unsigned>(want < 65536 ? want : 65536);
  return median_ms(
      [&] {
        bw::bwd_convert_kernel<__nv_bfloat16, false>
            <<<dim3(blocks, 1), bw::kConvertThreads>>>(cp);
        CHECK(cudaGetLastError());
      },
      reps, size_t(256) << 20);
}

}  // namespace

int main() {
  g_flush_by_read = true;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# dQ postprocess, %s: chunks (frag layout) / blocks through smem (frag layout) / "
              "chunks (plain layout)\n", prop.name);
  const std::vector<Shape> shapes = {{1, 16384, 16, 128}, {1, 16384, 32, 64}, {16, 1024, 16, 128},
                                     {4, 4096, 16, 128},  {16, 1024, 32, 64}, {2, 3000, 12, 128},
                                     {1, 8192, 16, 96},   {2, 8192, 8, 256}};
  for (const Shape& s : shapes) {
    const int rows = (s.seqlen + 127) / 128 * 128;  // kBwdRowPad
    const size_t acc_n = size_t(s.batch) * s.heads * rows * s.d;
    const size_t out_n = size_t(s.batch) * s.seqlen * s.heads * s.d;
    float* acc;
    __nv_bfloat16 *out_a, *out_b, *out_c;
    CHECK(cudaMalloc(&acc, acc_n * 4));
    CHECK(cudaMalloc(&out_a, out_n * 2));
    CHECK(cudaMalloc(&out_b, out_n * 2));
    CHECK(cudaMalloc(&out_c, out_n * 2));
    fill_floats<<<1024, 256>>>(acc, acc_n, 7);
    bw::BwdConvertJob job;
    job.src = acc;
    job.bh_stride = int64_t(rows) * s.d;
    job.row_stride = s.d;
    job.heads = s.heads;
    job.rows = s.seqlen;
    job.dst_batch_stride = int64_t(s.seqlen) * s.heads * s.d;
    job.dst_row_stride = int64_t(s.heads) * s.d;
    job.dst_head_stride = s.d;
    job.scale = 0.0883883f;
    job.frag_d = s.d;
    bw::BwdConvertParams cp;
    cp.batch = s.batch;
    cp.head_dim = s.d;
    cp.num_jobs = 1;
    bw::BwdConvertParams chunks_cp = cp, blocks_cp = cp;
    chunks_cp.jobs[0] = job;
    chunks_cp.jobs[0].dst = out_a;
    chunks_cp.max_chunks = int64_t(s.batch) * s.heads * s.seqlen * (s.d / 8);
    blocks_cp.jobs[0] = job;
    blocks_cp.jobs[0].dst = out_b;
    // As make_bwd_convert_params decides (the staging's swizzle wants d a multiple of 64; the
    // d 96 shape then times the chunk path twice).
    blocks_cp.jobs[0].frag_blocks = s.d % 64 == 0;
    blocks_cp.max_chunks =
        int64_t(s.batch) * s.heads * bw::dq_block_num_m(job) * bw::kConvertThreads;
    bw::BwdConvertParams plain_cp = chunks_cp;
    plain_cp.jobs[0].dst = out_c;
    plain_cp.jobs[0].frag_d = 0;
    std::vector<float> ta, tb, tc;
    for (int round = 0; round < 5; ++round) {
      ta.push_back(launch_ms(chunks_cp, 30));
      tb.push_back(launch_ms(blocks_cp, 30));
      tc.push_back(launch_ms(plain_cp, 30));
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> a(out_n), b(out_n);
    CHECK(cudaMemcpy(a.data(), out_a, out_n * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(b.data(), out_b, out_n * 2, cudaMemcpyDeviceToHost));
    size_t diff = 0;
    for (size_t i = 0; i < out_n; ++i) {
      diff += __bfloat162float(a[i]) != __bfloat162float(b[i]);
    }
    const float a_ms = median_of(ta), b_ms = median_of(tb), c_ms = median_of(tc);
    const double bytes = double(s.batch) * s.heads * s.seqlen * s.d * (4 + 2);
    std::printf("RESULT b=%d s=%d h=%d d=%d: chunks %.1f us, blocks %.1f us (%.0f GB/s, %.3fx), "
                "plain chunks %.1f us; blocks == chunks: %s (%zu differ)\n",
                s.batch, s.seqlen, s.heads, s.d, a_ms * 1e3, b_ms * 1e3, bytes / b_ms * 1e-6,
                a_ms / b_ms, c_ms * 1e3, diff == 0 ? "yes" : "NO", diff);
    CHECK(cudaFree(acc));
    CHECK(cudaFree(out_a));
    CHECK(cudaFree(out_b));
    CHECK(cudaFree(out_c));
  }
  return 0;
}

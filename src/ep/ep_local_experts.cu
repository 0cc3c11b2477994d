// Scalar reference expert compute of an expert-parallel rank (see
// ep_local_experts.hpp). Compiled WITHOUT fast-math: silu uses expf.
#include <cuda_bf16.h>

#include "cuda/backend/expert_gemm.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/combine.hpp"
#include "cuda/kernels/shared_expert.hpp"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/kernels/staging.hpp"
#include "cuda/kernels/swiglu.cuh"
#include "cuda/layout/grouped_gemm_plan.hpp"
#include "cuda/layout/operand_order.hpp"
#include "ep/ep_local_experts.hpp"
#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::ep {

namespace {

using namespace nvfp4moe::fmt;

constexpr int kThreads = 128;
constexpr int kExpandThreads = 256;  // ep_expand_operand_kernel: H / 16 blocks of a row, then H / 8 stores

// sum_k a[k] * value(w_k) * s(w block), the weight row given as packed codes
// and linear scales; a is the staged row (shared memory).
__device__ __forceinline__ float dot_nvfp4_row(const float* a, const uint8_t* codes, const uint8_t* scales,
                                               int64_t k) {
  float acc = 0.0f;
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float s = e4m3_value(scales[b]);
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlock / 2; ++i) {
      const uint8_t byte = codes[b * 8 + i];
      part += a[b * kBlock + 2 * i] * e2m1_value(byte & 15) + a[b * kBlock + 2 * i + 1] * e2m1_value(byte >> 4);
    }
    acc += part * s;
  }
  return acc;
}

// grid (capacity, ceil(I / kThreads)); dynamic smem: H floats.
// h[p, i] = swiglu(g_x g_w1 (a . W1_e[i]), g_x g_w3 (a . W3_e[i])).
__global__ void ep_l1_ref_kernel(EpComputeArgs a, const uint8_t* w13_codes, const uint8_t* w13_scales,
                                 const float* w13_global, int64_t H, int64_t I, bool has_limit, float limit,
                                 float* h) {
  extern __shared__ float row[];
  const int32_t p = blockIdx.x;
  if (p >= *a.total) return;
  const int32_t e = a.expert[p];
  for (int64_t k = threadIdx.x; k < H; k += blockDim.x) {
    const uint8_t byte = a.codes[int64_t(p) * (H / 2) + k / 2];
    row[k] = e2m1_value((k & 1) ? (byte >> 4) : (byte & 15)) * e4m3_value(a.scales[int64_t(p) * (H / 16) + k / 16]);
  }
  __syncthreads();
  const int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= I) return;
  const int64_t gate_row = int64_t(e) * 2 * I + i, up_row = gate_row + I;
  const float gate = dot_nvfp4_row(row, w13_codes + gate_row * (H / 2), w13_scales + gate_row * (H / 16), H) *
                     (a.g[p] * w13_global[2 * e]);
  const float up = dot_nvfp4_row(row, w13_codes + up_row * (H / 2), w13_scales + up_row * (H / 16), H) *
                   (a.g[p] * w13_global[2 * e + 1]);
  h[int64_t(p) * I + i] = cuda::swiglu_limited(gate, up, has_limit, limit);
}

// grid (capacity, ceil(H / kThreads)); dynamic smem: I floats.
// out[p, n] = w_p * g_h g_w2 (QDQ(h) . W2_e[n]).
__global__ void ep_l2_ref_kernel(EpComputeArgs a, const __nv_bfloat16* h_deq, int64_t ld_h_deq, const float* h_g,
                                 const uint8_t* w2_codes, const uint8_t* w2_scales, const float* w2_global,
                                 int64_t H, int64_t I) {
  extern __shared__ float row[];
  const int32_t p = blockIdx.x;
  if (p >= *a.total) return;
  const int32_t e = a.expert[p];
  for (int64_t k = threadIdx.x; k < I; k += blockDim.x) row[k] = __bfloat162float(h_deq[int64_t(p) * ld_h_deq + k]);
  __syncthreads();
  const int64_t n = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (n >= H) return;
  const int64_t wrow = int64_t(e) * H + n;
  const float o = dot_nvfp4_row(row, w2_codes + wrow * (I / 2), w2_scales + wrow * (I / 16), I) *
                  (h_g[p] * w2_global[e]);
  a.out[int64_t(p) * H + n] = a.weight[p] * o;
}

// grid (capacity); dynamic smem: H / 2 words. The GEMM operand of received
// row p, value(q) * f32(s) as BF16 (exact, spec 2), zero past H up to ld.
// A thread takes whole 16-value blocks (8 code bytes and their scale, one
// round trip) and leaves their 8 BF16 pairs in shared memory; after one
// barrier the row is written as 16-byte units, gathered from shared memory
// in the order asked for (k-slot: unit (chunk, s, h) = pair 2 s + h of the
// chunk's 4 blocks). Scalar 2-byte stores made this kernel ~25x slower than
// its bytes at 64 tokens (bench/NOTES.md, session 9).
__global__ void ep_expand_operand_kernel(EpComputeArgs a, int32_t H, int32_t ld, __nv_bfloat16* act,
                                         cuda::OperandOrder order) {
  extern __shared__ uint32_t pairs[];  // [H / 2] BF16 pairs of the row, logical order
  const int32_t p = blockIdx.x;
  if (p >= *a.total) return;
  const uint32_t blocks = uint32_t(H) / 16u;
  for (uint32_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    const uint2 codes = reinterpret_cast<const uint2*>(a.codes + int64_t(p) * (H / 2))[b];
    const float s = e4m3_value(a.scales[int64_t(p) * (H / 16) + b]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t byte = ((j < 4 ? codes.x : codes.y) >> (8 * (j % 4))) & 0xFFu;
      const __nv_bfloat162 v = __floats2bfloat162_rn(e2m1_value(uint8_t(byte & 15u)) * s, e2m1_value(uint8_t(byte >> 4)) * s);
      pairs[8 * b + j] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
  __syncthreads();
  const bool kslot = order.kslot();
  uint4* row = reinterpret_cast<uint4*>(act + int64_t(p) * ld);
  // Units of 4 pairs; pairs of blocks past H are the zero padding (a partial
  // last 64-column chunk spreads them over all of its k-slot units).
  auto pair_of_block = [&](uint32_t b, uint32_t j) { return b < blocks ? pairs[8u * b + j] : 0u; };
  for (uint32_t u = threadIdx.x; u < uint32_t(ld) / 8u; u += blockDim.x) {
    uint4 v;
    if (kslot) {  // unit 8 c + 2 s + h <- pair 2 s + h of blocks 4 c + t, t = 0..3
      const uint32_t b0 = 4u * (u / 8u), j = u % 8u;
      v = make_uint4(pair_of_block(b0, j), pair_of_block(b0 + 1u, j), pair_of_block(b0 + 2u, j),
                     pair_of_block(b0 + 3u, j));
    } else {  // unit u <- pairs 4 u .. 4 u + 3, i.e. pairs 4 (u % 2) .. of block u / 2
      const uint32_t b = u / 2u, j = 4u * (u % 2u);
      v = make_uint4(pair_of_block(b, j), pair_of_block(b, j + 1u), pair_of_block(b, j + 2u), pair_of_block(b, j + 3u));
    }
    row[u] = v;
  }
}

__global__ void ep_iota_kernel(int32_t* v, int32_t n) {
  for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v[i] = i;
}

template <typename XT>
__device__ __forceinline__ float to_f32(XT v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

// grid (tokens, ceil(Is / kThreads)); smem: H floats of x. w13: gate rows
// [0, Is), up rows [Is, 2 Is).
template <typename XT>
__global__ void ep_shared_l1_ref_kernel(const XT* x, const __nv_bfloat16* w13, int64_t H, int64_t Is,
                                        bool has_limit, float limit, float* h) {
  extern __shared__ float row[];
  const int64_t t = blockIdx.x;
  for (int64_t k = threadIdx.x; k < H; k += blockDim.x) row[k] = to_f32(x[t * H + k]);
  __syncthreads();
  const int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= Is) return;
  float gate = 0.0f, up = 0.0f;
  for (int64_t k = 0; k < H; ++k) {
    gate += row[k] * __bfloat162float(w13[i * H + k]);
    up += row[k] * __bfloat162float(w13[(Is + i) * H + k]);
  }
  h[t * Is + i] = cuda::swiglu_limited(gate, up, has_limit, limit);
}

// grid (tokens, ceil(H / kThreads)); smem: Is floats of h.
__global__ void ep_shared_l2_ref_kernel(const float* h, const __nv_bfloat16* w2, int64_t H, int64_t Is, float* out) {
  extern __shared__ float row[];
  const int64_t t = blockIdx.x;
  for (int64_t k = threadIdx.x; k < Is; k += blockDim.x) row[k] = h[t * Is + k];
  __syncthreads();
  const int64_t n = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (n >= H) return;
  float acc = 0.0f;
  for (int64_t k = 0; k < Is; ++k) acc += row[k] * __bfloat162float(w2[n * Is + k]);
  out[t * H + n] = acc;
}

template <typename T, typename Src>
cuda::DeviceBuffer<T> upload(const std::vector<Src>& v, const std::vector<Src>& more = {}) {
  static_assert(sizeof(T) == sizeof(Src), "upload reinterprets bit patterns, never converts");
  cuda::DeviceBuffer<T> d(v.size() + more.size());
  if (!v.empty())
    NVFP4_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  if (!more.empty())
    NVFP4_CUDA_CHECK(cudaMemcpy(d.get() + v.size(), more.data(), more.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}


}  // namespace

EpLocalExperts::EpLocalExperts(const ExpertWeights& w, const MoeConfig& cfg, int32_t capacity)
    : count_(w.count), hidden_(w.hidden), inter_(w.intermediate), capacity_(capacity), limit_(cfg.swiglu_limit) {
  NVFP4_CHECK(w.hidden == cfg.hidden && w.intermediate == cfg.intermediate, "EpLocalExperts: weights H=", w.hidden,
              " I=", w.intermediate, " do not match the config H=", cfg.hidden, " I=", cfg.intermediate);
  NVFP4_CHECK(capacity > 0, "EpLocalExperts: receive capacity must be > 0, got ", capacity);
  w13_codes_ = upload<uint8_t>(w.w13_codes);
  w13_scales_ = upload<uint8_t>(w.w13_scales);
  w2_codes_ = upload<uint8_t>(w.w2_codes);
  w2_scales_ = upload<uint8_t>(w.w2_scales);
  w13_global_ = upload<float>(w.w13_global);
  w2_global_ = upload<float>(w.w2_global);
  if (cfg.l2_input == InputScaleMode::Static) {
    NVFP4_CHECK(int64_t(w.w2_input_scale.size()) == w.count,
                "EpLocalExperts: static L2 input scales requested but w2_input_scale has ", w.w2_input_scale.size(),
                " values for ", w.count, " experts");
    w2_static_g_ = upload<float>(w.w2_input_scale);
  }
  // The grouped GEMMs' weights, one copy: the fragment layout where the shape
  // has it (the wgmma kernel), else the tile layout (the simple kernel).
  const cuda::PackedGeometry g13 = cuda::packed_geometry(cuda::Projection::GateUp, hidden_, inter_);
  const cuda::PackedGeometry g2 = cuda::packed_geometry(cuda::Projection::Down, hidden_, inter_);
  if (cuda::fragment_layout_fits(hidden_, inter_)) {
    w13_frag_ = cuda::upload_fragment_weights(cuda::Projection::GateUp, w.w13_codes, w.w13_scales, count_, hidden_, inter_);
    w2_frag_ = cuda::upload_fragment_weights(cuda::Projection::Down, w.w2_codes, w.w2_scales, count_, hidden_, inter_);
  } else {
    std::vector<uint8_t> t13(size_t(g13.bytes_per_expert()) * count_), t2(size_t(g2.bytes_per_expert()) * count_);
    for (int64_t e = 0; e < count_; ++e) {
      cuda::pack_expert_weights(cuda::Projection::GateUp, w.w13_codes.data() + e * 2 * inter_ * hidden_ / 2,
                                w.w13_scales.data() + e * 2 * inter_ * hidden_ / 16, hidden_, inter_,
                                t13.data() + e * g13.bytes_per_expert());
      cuda::pack_expert_weights(cuda::Projection::Down, w.w2_codes.data() + e * hidden_ * inter_ / 2,
                                w.w2_scales.data() + e * hidden_ * inter_ / 16, hidden_, inter_,
                                t2.data() + e * g2.bytes_per_expert());
    }
    w13_tiles_ = upload<uint8_t>(t13);
    w2_tiles_ = upload<uint8_t>(t2);
  }
  ld_act_ = g13.k_steps * cuda::kTileK;
  ld_h_deq_ = g2.k_steps * cuda::kTileK;
  act_ = cuda::DeviceBuffer<__nv_bfloat16>(size_t(capacity) * ld_act_);
  identity_ = cuda::DeviceBuffer<int32_t>(size_t(capacity));
  ep_iota_kernel<<<unsigned(cuda::ceil_div(capacity, 256)), 256>>>(identity_.get(), capacity);
  NVFP4_CUDA_CHECK_LAUNCH("ep_iota_kernel");
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  tiles_ = cuda::DeviceBuffer<uint8_t>(size_t(cuda::max_gemm_tiles(capacity, count_, cuda::kGemmTileTokens)) *
                                       sizeof(cuda::GemmTile));
  num_tiles_ = cuda::DeviceBuffer<int32_t>(1);
  h_ = cuda::DeviceBuffer<float>(size_t(capacity) * inter_);
  h_g_ = cuda::DeviceBuffer<float>(size_t(capacity));
  h_deq_ = cuda::DeviceBuffer<__nv_bfloat16>(size_t(capacity) * ld_h_deq_);
  // Attributes are set here, not per launch: a forward stays graph-capturable.
  cuda::allow_smem_at_least(ep_expand_operand_kernel, size_t(hidden_) * 2);
  cuda::allow_smem_at_least(ep_l1_ref_kernel, size_t(hidden_) * 4);
  cuda::allow_smem_at_least(ep_l2_ref_kernel, size_t(inter_) * 4);
  cuda::prepare_expert_gemm(count_);
}

void EpLocalExperts::check_capacity(const EpComputeArgs& a) const {
  NVFP4_CHECK(a.capacity >= 1 && a.capacity <= capacity_, "EpLocalExperts: this forward's capacity ", a.capacity,
              " is outside [1, ", capacity_, "] (the capacity it was built for)");
}

void EpLocalExperts::run_ref(const EpComputeArgs& a, cudaStream_t stream) {
  check_capacity(a);
  const size_t smem1 = size_t(hidden_) * 4, smem2 = size_t(inter_) * 4;
  dim3 g1(unsigned(a.capacity), unsigned(cuda::ceil_div(inter_, kThreads)));
  ep_l1_ref_kernel<<<g1, kThreads, smem1, stream>>>(a, w13_codes_.get(), w13_scales_.get(), w13_global_.get(),
                                                     hidden_, inter_, limit_.has_value(), limit_.value_or(0.0f),
                                                     h_.get());
  NVFP4_CUDA_CHECK_LAUNCH("ep_l1_ref_kernel");

  requantize_h(a, ld_h_deq_, cuda::OperandOrder{}, stream);  // the reference kernels read logical order
  dim3 g2(unsigned(a.capacity), unsigned(cuda::ceil_div(hidden_, kThreads)));
  ep_l2_ref_kernel<<<g2, kThreads, smem2, stream>>>(a, h_deq_.get(), ld_h_deq_, h_g_.get(), w2_codes_.get(),
                                                     w2_scales_.get(), w2_global_.get(), hidden_, inter_);
  NVFP4_CUDA_CHECK_LAUNCH("ep_l2_ref_kernel");
}

// QDQ(h) per row (spec 2): dynamic g per row, or the expert's static g.
void EpLocalExperts::requantize_h(const EpComputeArgs& a, int64_t deq_ld, cuda::OperandOrder order,
                                  cudaStream_t stream) {
  cuda::RequantRowsArgs rq;
  rq.h = h_.get();
  rq.ld_h = inter_;
  rq.cols = inter_;
  rq.rows_max = a.capacity;
  rq.num_rows = a.total;
  rq.static_g_per_expert = w2_static_g_.size() ? w2_static_g_.get() : nullptr;
  rq.row_expert = a.expert;
  rq.g_out = h_g_.get();
  rq.deq = h_deq_.get();
  rq.deq_ld = deq_ld;
  rq.deq_order = order;
  cuda::stage_requantized_rows(rq, stream);
}

void EpLocalExperts::run(const EpComputeArgs& a, cudaStream_t stream) {
  check_capacity(a);
  auto* tiles = reinterpret_cast<cuda::GemmTile*>(tiles_.get());
  const cuda::FragmentWeights f13 = w13_frag_.view(), f2 = w2_frag_.view();
  const cuda::FragmentWeights* frag13 = f13.codes ? &f13 : nullptr;
  const cuda::FragmentWeights* frag2 = f2.codes ? &f2 : nullptr;
  const cuda::ExpertGemmChoice gemm = cuda::expert_gemm_choice(count_, a.capacity, frag13, frag2);
  const cuda::OperandOrder order = gemm.operand_order(a.offsets + count_);
  ep_expand_operand_kernel<<<unsigned(a.capacity), kExpandThreads, size_t(hidden_) * 2, stream>>>(
      a, int32_t(hidden_), int32_t(ld_act_), act_.get(), order);
  NVFP4_CUDA_CHECK_LAUNCH("ep_expand_operand_kernel");

  cuda::GroupedGemmPlan l1;
  l1.projection = cuda::Projection::GateUp;
  l1.weights = w13_tiles_.get();
  l1.geometry = cuda::packed_geometry(cuda::Projection::GateUp, hidden_, inter_);
  l1.n_valid = inter_;
  l1.w_global = w13_global_.get();
  l1.act = act_.get();
  l1.ld_act = ld_act_;
  l1.act_rows = capacity_;
  l1.pair_of_pos = identity_.get();  // receive row = position = "token"
  l1.top_k = 1;
  l1.act_g = a.g;
  l1.tiles = tiles;
  l1.num_tiles = num_tiles_.get();
  l1.max_tiles = cuda::max_gemm_tiles(a.capacity, count_, cuda::kGemmTileTokens);  // within tiles_: capacity checked above
  l1.offsets = a.offsets;
  l1.local_experts = count_;
  l1.h_out = h_.get();
  l1.ld_h = inter_;
  l1.has_limit = limit_.has_value();
  l1.limit = limit_.value_or(0.0f);
  cuda::run_expert_gemm(l1, frag13, gemm, stream);

  requantize_h(a, ld_h_deq_, order, stream);

  cuda::GroupedGemmPlan l2 = l1;  // same positions, work list and scheduling
  l2.projection = cuda::Projection::Down;
  l2.weights = w2_tiles_.get();
  l2.geometry = cuda::packed_geometry(cuda::Projection::Down, hidden_, inter_);
  l2.n_valid = hidden_;
  l2.w_global = w2_global_.get();
  l2.act = h_deq_.get();
  l2.ld_act = ld_h_deq_;
  l2.act_rows = capacity_;
  l2.act_g = h_g_.get();
  l2.h_out = nullptr;
  l2.y_pair = a.out;
  l2.topk_weights = a.weight;
  cuda::run_expert_gemm(l2, frag2, gemm, stream);
}

EpSharedExpert::EpSharedExpert(const SharedExpertWeights& w, const MoeConfig& cfg, int32_t max_tokens)
    : hidden_(cfg.hidden), inter_(cfg.shared_experts ? cfg.shared_inter() : 0), limit_(cfg.swiglu_limit) {
  if (!inter_) return;
  const size_t n = size_t(inter_) * hidden_;
  NVFP4_CHECK(w.w1.size() == n && w.w3.size() == n && w.w2.size() == n, "EpSharedExpert: shared expert weights have ",
              w.w1.size(), "/", w.w3.size(), "/", w.w2.size(), " elements (w1/w3/w2), expected ", n, " each (Is=",
              inter_, " H=", hidden_, ")");
  w13_ = upload<__nv_bfloat16>(w.w1, w.w3);
  w2_ = upload<__nv_bfloat16>(w.w2);
  h_ = cuda::DeviceBuffer<float>(size_t(max_tokens) * inter_);
  xb_ = cuda::DeviceBuffer<__nv_bfloat16>(size_t(max_tokens) * hidden_);
  hb_ = cuda::DeviceBuffer<__nv_bfloat16>(size_t(max_tokens) * inter_);
  gate_up_ = cuda::DeviceBuffer<float>(size_t(max_tokens) * 2 * inter_);
  cublas_ = std::make_unique<cuda::CublasHandle>();
  cublas_ws_ = cuda::DeviceBuffer<uint8_t>(size_t(32) << 20);  // fixed workspace: graph-capturable
  NVFP4_CUBLAS_CHECK(cublasSetWorkspace(cublas_->get(), cublas_ws_.get(), cublas_ws_.bytes()));
  cuda::allow_smem_at_least(ep_shared_l1_ref_kernel<__nv_bfloat16>, size_t(hidden_) * 4);
  cuda::allow_smem_at_least(ep_shared_l1_ref_kernel<float>, size_t(hidden_) * 4);
  cuda::allow_smem_at_least(ep_shared_l2_ref_kernel, size_t(inter_) * 4);
}

void EpSharedExpert::run(const void* x, bool x_is_bf16, int32_t tokens, float* out, cudaStream_t stream) {
  if (!inter_ || tokens == 0) return;
  const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);
  if (!x_is_bf16) {
    cuda::f32_to_bf16(static_cast<const float*>(x), int64_t(tokens) * hidden_, xb_.get(), stream);
    xb = xb_.get();
  }
  cuda::SharedExpertArgs a;
  a.x = xb;
  a.tokens = tokens;
  a.hidden = hidden_;
  a.inter = inter_;
  a.w13 = w13_.get();
  a.w2 = w2_.get();
  a.has_limit = limit_.has_value();
  a.limit = limit_.value_or(0.0f);
  a.gate_up = gate_up_.get();
  a.h = hb_.get();
  a.out = out;
  cuda::shared_expert_forward(cublas_->get(), a, stream);
}

void EpSharedExpert::run_ref(const void* x, bool x_is_bf16, int32_t tokens, float* out, cudaStream_t stream) {
  if (!inter_ || tokens == 0) return;
  const size_t smem1 = size_t(hidden_) * 4, smem2 = size_t(inter_) * 4;
  dim3 g1(tokens, unsigned(cuda::ceil_div(inter_, kThreads)));
  if (x_is_bf16) {
    ep_shared_l1_ref_kernel<<<g1, kThreads, smem1, stream>>>(static_cast<const __nv_bfloat16*>(x), w13_.get(),
                                                              hidden_, inter_, limit_.has_value(),
                                                              limit_.value_or(0.0f), h_.get());
  } else {
    ep_shared_l1_ref_kernel<<<g1, kThreads, smem1, stream>>>(static_cast<const float*>(x), w13_.get(), hidden_,
                                                              inter_, limit_.has_value(), limit_.value_or(0.0f),
                                                              h_.get());
  }
  NVFP4_CUDA_CHECK_LAUNCH("ep_shared_l1_ref_kernel");
  dim3 g2(tokens, unsigned(cuda::ceil_div(hidden_, kThreads)));
  ep_shared_l2_ref_kernel<<<g2, kThreads, smem2, stream>>>(h_.get(), w2_.get(), hidden_, inter_, out);
  NVFP4_CUDA_CHECK_LAUNCH("ep_shared_l2_ref_kernel");
}

}  // namespace nvfp4moe::ep

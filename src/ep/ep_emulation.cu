// EpCudaEmulation: R logical expert-parallel ranks on one GPU. Their segments
// are R slices of one plain device allocation with the symmetric window's
// layout; the phases run for every rank in turn on one stream, so stream
// order plays the part of the LSA barriers. Same kernels, same indexing as
// the NCCL path (ep_rank.cuh, ep_kernels.cuh, ep_index.hpp).
#include <cuda_bf16.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "ep/ep_rank.cuh"

namespace nvfp4moe {

int64_t ep_token_begin(int64_t tokens, int ranks, int rank) { return ep::token_chunk_begin(tokens, ranks, rank); }

struct EpCudaEmulation::Impl {
  MoeConfig config;
  int device = 0;
  EpCudaOptions options;
  int ranks = 0;
  ep::SegmentLayout layout;
  cuda::DeviceBuffer<char> segments;  // [ranks, layout.bytes]
  std::vector<std::unique_ptr<ep::EpRank>> rank;

  ep::EmulatedPeers peers() const { return ep::EmulatedPeers{segments.get(), layout.bytes}; }
  char* own(int r) const { return segments.get() + uint64_t(r) * layout.bytes; }
};

EpCudaEmulation::EpCudaEmulation(const MoeWeights& w, int ranks, const EpCudaOptions& o)
    : impl_(std::make_unique<Impl>()) {
  w.config.validate();
  w.experts.validate();
  NVFP4_CHECK(w.experts.first_expert == 0 && w.experts.count == w.config.experts,
              "EpCudaEmulation: needs the full layer (experts [0, E=", w.config.experts, ")), got [",
              w.experts.first_expert, ", ", w.experts.first_expert + w.experts.count, ")");
  Impl& m = *impl_;
  m.config = w.config;
  m.options = o;
  m.ranks = ranks;
  NVFP4_CUDA_CHECK(cudaGetDevice(&m.device));
  m.layout = ep::ep_layout(w.config, ranks, o);
  const float l1_g = ep::ep_l1_static_scale(w, o);
  m.segments = cuda::DeviceBuffer<char>(size_t(m.layout.bytes) * ranks);
  NVFP4_CUDA_CHECK(cudaMemset(m.segments.get(), 0, m.segments.bytes()));
  for (int r = 0; r < ranks; ++r) {
    MoeWeights slice;
    slice.config = w.config;
    slice.experts = w.experts.slice(int64_t(r) * m.layout.local_experts, m.layout.local_experts);
    slice.shared = w.shared;  // every rank runs the shared expert on its own tokens
    slice.router = w.router;  // and the router on its own tokens
    m.rank.push_back(std::make_unique<ep::EpRank>(
        slice, m.layout, r, l1_g, o.reference_compute ? cuda::RoutedKernels::Reference : cuda::RoutedKernels::Fast));
  }
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
}

EpCudaEmulation::~EpCudaEmulation() = default;
EpCudaEmulation::EpCudaEmulation(EpCudaEmulation&&) noexcept = default;
EpCudaEmulation& EpCudaEmulation::operator=(EpCudaEmulation&&) noexcept = default;

int EpCudaEmulation::ranks() const { return impl_->ranks; }
uint64_t EpCudaEmulation::segment_bytes() const { return impl_->layout.bytes; }
const MoeConfig& EpCudaEmulation::config() const { return impl_->config; }
int EpCudaEmulation::device_index() const { return impl_->device; }

void EpCudaEmulation::forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
                              const ForwardOptions& options) {
  Impl& m = *impl_;
  const int64_t T = x.ndim == 2 ? x.shape[0] : 0;
  // Checks the whole batch once (every chunk is then within its rank's capacity).
  const ep::EpRankIo all =
      ep::ep_check_io(m.config, x, routing, out, m.device, int64_t(m.layout.max_tokens) * m.ranks, "EpCudaEmulation");
  int64_t bound = 1;  // the largest chunk: this forward's token bound (ep_rank.cuh), exact here
  for (int r = 0; r < m.ranks; ++r) {
    const int64_t n = ep::token_chunk_begin(T, m.ranks, r + 1) - ep::token_chunk_begin(T, m.ranks, r);
    NVFP4_CHECK(n <= m.layout.max_tokens, "EpCudaEmulation::forward: rank ", r, " gets ", n,
                " tokens, above max_tokens_per_rank=", m.layout.max_tokens);
    bound = std::max(bound, n);
  }
  auto s = static_cast<cudaStream_t>(options.stream);
  // Rank r's views: its contiguous chunk of every per-token tensor.
  std::vector<ep::EpRankIo> io(m.ranks, all);
  const int64_t k = m.layout.top_k, H = m.layout.hidden;
  auto at = [](const void* p, int64_t elems, size_t elem_bytes) -> const void* {
    return p ? static_cast<const char*>(p) + elems * int64_t(elem_bytes) : nullptr;
  };
  for (int r = 0; r < m.ranks; ++r) {
    const int64_t b = ep::token_chunk_begin(T, m.ranks, r), e = ep::token_chunk_begin(T, m.ranks, r + 1);
    io[r].x = at(all.x, b * H, all.x_is_bf16 ? 2 : 4);
    io[r].ids = at(all.ids, b * k, all.ids_i64 ? 8 : 4);
    io[r].weights = all.weights ? all.weights + b * k : nullptr;
    io[r].token_ids = at(all.token_ids, b, all.token_ids_i64 ? 8 : 4);
    io[r].y = all.y + b * H;
    io[r].ids_out = all.ids_out ? all.ids_out + b * k : nullptr;
    io[r].weights_out = all.weights_out ? all.weights_out + b * k : nullptr;
    io[r].tokens = int32_t(e - b);
    io[r].tokens_bound = int32_t(bound);
  }
  // Each phase for every rank before the next: stream order = the barriers.
  for (int r = 0; r < m.ranks; ++r) m.rank[r]->stage(m.peers(), m.own(r), io[r], s);
  for (int r = 0; r < m.ranks; ++r) m.rank[r]->dispatch(m.peers(), s);
  for (int r = 0; r < m.ranks; ++r) m.rank[r]->compute(m.own(r), s);
  for (int r = 0; r < m.ranks; ++r) m.rank[r]->combine(m.peers(), io[r], s);
  if (m.options.checked) sync_errors();
}

void EpCudaEmulation::sync_errors() {
  Impl& m = *impl_;
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  std::string msg;
  for (int r = 0; r < m.ranks; ++r) {
    uint32_t word = 0;
    uint32_t* dev = ep::area<uint32_t>(m.own(r), m.layout.error_word);
    NVFP4_CUDA_CHECK(cudaMemcpy(&word, dev, 4, cudaMemcpyDeviceToHost));
    if (!word) continue;
    NVFP4_CUDA_CHECK(cudaMemset(dev, 0, 4));
    msg += "rank " + std::to_string(r) + ": " + ep::ep_error_text(word, m.layout);
  }
  NVFP4_CHECK(msg.empty(), "expert parallel (emulated, R=", m.ranks, "): device reported: ", msg);
}

}  // namespace nvfp4moe

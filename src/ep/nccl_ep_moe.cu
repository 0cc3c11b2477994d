// NcclEpMoe: one expert-parallel rank per process and GPU over the NCCL 2.28
// device API. Peers' segments are reached through LSA pointers of one
// symmetric window (SymmBuffer); phases are separated by LSA barriers:
//
//   stage -> [LSA barrier] -> dispatch (pull) -> experts (push) -> [LSA barrier] -> combine
//
// Two barriers a forward suffice: a rank touches a peer's segment only
// between them (reads its send area, writes its combine area), and a rank
// rewrites its own send area / clears its flags only after the second one.
// Everything is queued on the caller's stream with no host synchronisation;
// the kernel arguments do not change between calls with the same T, so a
// forward can be captured into a CUDA graph.
#include "nvfp4moe/ep_cuda.hpp"

#if defined(NVFP4MOE_HAS_NCCL)

#include <cuda/atomic>
#include <iterator>

#include "ep/ep_rank.cuh"
#include "ep/symm_buffer.hpp"

namespace nvfp4moe {

namespace ep {

// Peers of an NCCL rank: segment r is the window at offset 0 through rank r's
// LSA mapping (one NVLink domain: LSA rank == world rank, checked at setup).
struct LsaPeers {
  ncclWindow_t window;
  __device__ __forceinline__ char* segment(int32_t rank) const {
    return static_cast<char*>(ncclGetLsaPointer(window, 0, rank));
  }
};

// One CTA: a full barrier of all ranks with release/acquire at system scope,
// so every write before it (this GPU's stores to peers included) is visible
// to every peer's work after it.
__global__ void ep_lsa_barrier_kernel(ncclDevComm comm) {
  __threadfence_system();
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), comm, ncclTeamTagLsa(), 0);
  bar.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);
  __threadfence_system();
}

}  // namespace ep

bool nccl_ep_available() { return true; }

struct NcclEpMoe::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, ranks = 0, device = 0;
  MoeConfig config;
  EpCudaOptions options;
  ep::SegmentLayout layout;
  std::unique_ptr<ep::SymmBuffer> symm;
  std::unique_ptr<ep::EpRank> me;
  std::unique_ptr<ep::EpPhaseEvents> timing;  // set_phase_timing(true)

  ep::LsaPeers peers() const { return ep::LsaPeers{symm->window()}; }
  void barrier(cudaStream_t s) {
    ep::ep_lsa_barrier_kernel<<<1, 32, 0, s>>>(symm->dev_comm());
    NVFP4_CUDA_CHECK_LAUNCH("ep_lsa_barrier_kernel");
  }
};

NcclEpMoe::NcclEpMoe(ncclComm* comm, const MoeWeights& w, const EpCudaOptions& o) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  NVFP4_CHECK(comm != nullptr, "NcclEpMoe: null NCCL communicator");
  m.comm = comm;
  NVFP4_NCCL_CHECK(ncclCommUserRank(comm, &m.rank));
  NVFP4_NCCL_CHECK(ncclCommCount(comm, &m.ranks));
  w.config.validate();
  w.experts.validate();
  NVFP4_CUDA_CHECK(cudaGetDevice(&m.device));
  m.config = w.config;
  m.options = o;
  m.layout = ep::ep_layout(w.config, m.ranks, o);
  const int64_t epr = m.layout.local_experts, first = int64_t(m.rank) * epr;
  MoeWeights slice;
  slice.config = w.config;
  slice.shared = w.shared;
  slice.router = w.router;
  if (w.experts.first_expert == 0 && w.experts.count == w.config.experts) {
    slice.experts = w.experts.slice(first, epr);
  } else {
    NVFP4_CHECK(w.experts.first_expert == first && w.experts.count == epr, "NcclEpMoe rank ", m.rank, " of ",
                m.ranks, ": weights hold experts [", w.experts.first_expert, ", ",
                w.experts.first_expert + w.experts.count, "); expected the full layer or exactly [", first, ", ",
                first + epr, ")");
    slice.experts = w.experts;
  }
  NVFP4_CHECK(w.config.l1_input != InputScaleMode::Static || o.l1_static_scale > 0.0f ||
                  w.experts.count == w.config.experts,
              "NcclEpMoe: static L1 input scales with a slice of the experts need EpCudaOptions::l1_static_scale "
              "(the max over ALL experts)");
  const float l1_g = ep::ep_l1_static_scale(w, o);
  m.symm = std::make_unique<ep::SymmBuffer>(comm, m.layout.bytes, /*lsa_barriers=*/1);
  m.me = std::make_unique<ep::EpRank>(slice, m.layout, m.rank, l1_g,
                                      o.reference_compute ? cuda::RoutedKernels::Reference : cuda::RoutedKernels::Fast);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
}

NcclEpMoe::~NcclEpMoe() {
  if (impl_) cudaDeviceSynchronize();  // no kernel may use the window when it is deregistered
}
NcclEpMoe::NcclEpMoe(NcclEpMoe&&) noexcept = default;
NcclEpMoe& NcclEpMoe::operator=(NcclEpMoe&&) noexcept = default;

int NcclEpMoe::rank() const { return impl_->rank; }
int NcclEpMoe::ranks() const { return impl_->ranks; }
uint64_t NcclEpMoe::symm_bytes() const { return impl_->layout.bytes; }
const MoeConfig& NcclEpMoe::config() const { return impl_->config; }
int NcclEpMoe::device_index() const { return impl_->device; }

void NcclEpMoe::forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
                        const ForwardOptions& options) {
  Impl& m = *impl_;
  const int64_t max_tokens_any_rank = options.max_tokens_any_rank;
  ep::EpRankIo io = ep::ep_check_io(m.config, x, routing, out, m.device, m.layout.max_tokens, "NcclEpMoe");
  NVFP4_CHECK(max_tokens_any_rank >= 0 && max_tokens_any_rank <= m.layout.max_tokens,
              "NcclEpMoe::forward: max_tokens_any_rank=", max_tokens_any_rank, " must be in [0, max_tokens_per_rank=",
              m.layout.max_tokens, "] (0: max_tokens_per_rank)");
  NVFP4_CHECK(max_tokens_any_rank == 0 || io.tokens <= max_tokens_any_rank, "NcclEpMoe::forward: rank ", m.rank,
              " has T=", io.tokens, " tokens, above max_tokens_any_rank=", max_tokens_any_rank);
  io.tokens_bound = max_tokens_any_rank > 0 ? int32_t(max_tokens_any_rank) : m.layout.max_tokens;
  auto s = static_cast<cudaStream_t>(options.stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (m.timing) NVFP4_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
  ep::EpPhaseEvents* const timing = capture == cudaStreamCaptureStatusNone ? m.timing.get() : nullptr;
  int marks = 0;
  auto mark = [&] {
    if (timing) NVFP4_CUDA_CHECK(cudaEventRecord(timing->mark[marks++].get(), s));
  };
  mark();
  m.me->stage(m.peers(), m.symm->local(), io, s, timing);
  mark();
  m.barrier(s);
  mark();
  m.me->dispatch(m.peers(), s);
  mark();
  m.me->compute(m.symm->local(), s);
  mark();
  m.barrier(s);
  mark();
  m.me->combine(m.peers(), io, s);
  mark();
  if (timing) timing->recorded = true;
  if (m.options.checked) sync_errors();
}

void NcclEpMoe::set_phase_timing(bool on) {
  Impl& m = *impl_;
  if (!on) {
    if (m.timing) NVFP4_CUDA_CHECK(cudaDeviceSynchronize());  // no forward still records into the events
    m.timing.reset();
  } else if (!m.timing) {
    m.timing = std::make_unique<ep::EpPhaseEvents>();
  }
}

EpPhaseTimes NcclEpMoe::phase_times() const {
  const Impl& m = *impl_;
  NVFP4_CHECK(m.timing && m.timing->recorded, "NcclEpMoe::phase_times: no forward was timed (set_phase_timing(true), "
              "then an eager forward)");
  const ep::EpPhaseEvents& e = *m.timing;
  NVFP4_CUDA_CHECK(cudaEventSynchronize(e.mark[ep::EpPhaseEvents::kMarks - 1].get()));
  auto ms = [](const cuda::CudaEvent& a, const cuda::CudaEvent& b) {
    float v = 0.0f;
    NVFP4_CUDA_CHECK(cudaEventElapsedTime(&v, a.get(), b.get()));
    return v;
  };
  EpPhaseTimes t;
  static_assert(std::size(kEpPhases) == ep::EpPhaseEvents::kMarks - 1, "an event between each two phases");
  for (size_t i = 0; i < std::size(kEpPhases); ++i) t.*kEpPhases[i] = ms(e.mark[i], e.mark[i + 1]);
  t.total = ms(e.mark[0], e.mark[ep::EpPhaseEvents::kMarks - 1]);
  if (e.shared) t.shared_expert = ms(e.shared_begin, e.shared_end);
  return t;
}

void NcclEpMoe::sync_errors() {
  Impl& m = *impl_;
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t word = 0;
  uint32_t* dev = ep::area<uint32_t>(m.symm->local(), m.layout.error_word);
  NVFP4_CUDA_CHECK(cudaMemcpy(&word, dev, 4, cudaMemcpyDeviceToHost));
  if (!word) return;
  NVFP4_CUDA_CHECK(cudaMemset(dev, 0, 4));
  NVFP4_FAIL("expert parallel rank ", m.rank, " of ", m.ranks, ": device reported: ", ep::ep_error_text(word, m.layout));
}

}  // namespace nvfp4moe

#else  // !NVFP4MOE_HAS_NCCL

#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

bool nccl_ep_available() { return false; }

struct NcclEpMoe::Impl {};
NcclEpMoe::NcclEpMoe(ncclComm*, const MoeWeights&, const EpCudaOptions&) {
  NVFP4_FAIL("NcclEpMoe: this build of nvfp4moe has no NCCL (configure with -DNCCL_ROOT=<dir with include/ and lib/>)");
}
NcclEpMoe::~NcclEpMoe() = default;
NcclEpMoe::NcclEpMoe(NcclEpMoe&&) noexcept = default;
NcclEpMoe& NcclEpMoe::operator=(NcclEpMoe&&) noexcept = default;
int NcclEpMoe::rank() const { return 0; }
int NcclEpMoe::ranks() const { return 0; }
uint64_t NcclEpMoe::symm_bytes() const { return 0; }
const MoeConfig& NcclEpMoe::config() const { NVFP4_FAIL("NcclEpMoe: this build of nvfp4moe has no NCCL"); }
int NcclEpMoe::device_index() const { return 0; }
void NcclEpMoe::forward(const TensorView&, const RoutingArgs&, const ForwardOutputs&, const ForwardOptions&) {}
void NcclEpMoe::sync_errors() {}
void NcclEpMoe::set_phase_timing(bool) {}
EpPhaseTimes NcclEpMoe::phase_times() const { NVFP4_FAIL("NcclEpMoe: this build of nvfp4moe has no NCCL"); }

}  // namespace nvfp4moe

#endif  // NVFP4MOE_HAS_NCCL

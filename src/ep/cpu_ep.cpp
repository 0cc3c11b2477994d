// Expert parallelism on the CPU: R logical ranks in one process, each with
// its slice of the experts, exchanging pairs through per-rank buffers laid
// out as a real all-to-all would (ep.hpp states the semantics).
//
// Phases of one forward, each a loop over ranks (the "network" is memcpy):
//   1. route     router on each rank's token chunk (or the caller's ids)
//   2. plan      counts, offsets, capacity (cpu_ep_plan.cpp)
//   3. dispatch  src rank copies (x row, slot, weight, LOCAL id) into the
//                owner's receive buffer at recv_offset[src][dst]
//   4. compute   owner: QDQ x, grouped NVFP4 GEMMs on LOCAL ids, w_j * o_e
//   5. return    owner copies each weighted row into the token rank's
//                combine buffer at row token*k + slot
//   6. combine   token rank: sum of slots in slot order + shared expert
#include "nvfp4moe/ep.hpp"

#include <cmath>
#include <cstring>

#include "cpu/cpu_moe.hpp"
#include "cpu/tensor_values.hpp"
#include "ep/cpu_ep_plan.hpp"
#include "ep/ep_index.hpp"
#include "moe/forward_checks.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

struct CpuEpMoe::Impl {
  MoeConfig config;
  RouterWeights router;          // replicated on every rank
  SharedExpertWeights shared;    // replicated on every rank
  std::vector<ExpertWeights> rank_experts;  // [R]: slice r, LOCAL ids
  CpuEpOptions options;
  float l1_static_g = 0.0f;      // static L1 g: the max over ALL experts
  CpuEpStats stats;

  int ranks() const { return int(rank_experts.size()); }
};

CpuEpMoe::CpuEpMoe(const MoeWeights& w, int ranks, const CpuEpOptions& options) : impl_(std::make_unique<Impl>()) {
  const MoeConfig& c = w.config;
  c.validate();
  w.experts.validate();
  NVFP4_CHECK(ranks >= 1, "expert parallelism: R must be >= 1, got ", ranks);
  NVFP4_CHECK(c.experts % ranks == 0, "expert parallelism: E=", c.experts, " experts are not divisible by R=", ranks,
              " ranks");
  NVFP4_CHECK(w.experts.count == c.experts && w.experts.first_expert == 0, "expert parallelism: needs all E=",
              c.experts, " experts to slice, got count=", w.experts.count, " first_expert=", w.experts.first_expert);
  validate_router(c, w.router);
  Impl& m = *impl_;
  m.config = c;
  m.router = w.router;
  m.shared = w.shared;
  m.options = options;
  m.l1_static_g = static_l1_input_scale(c, w.experts);  // the max over ALL experts, as each rank reads it
  const int64_t per = c.experts / ranks;
  for (int r = 0; r < ranks; ++r) m.rank_experts.push_back(w.experts.slice(r * per, per));
}

CpuEpMoe::~CpuEpMoe() = default;
CpuEpMoe::CpuEpMoe(CpuEpMoe&&) noexcept = default;
CpuEpMoe& CpuEpMoe::operator=(CpuEpMoe&&) noexcept = default;

int CpuEpMoe::ranks() const { return impl_->ranks(); }
const MoeConfig& CpuEpMoe::config() const { return impl_->config; }
const CpuEpStats& CpuEpMoe::last_stats() const { return impl_->stats; }
const ExpertWeights& CpuEpMoe::rank_experts(int rank) const {
  NVFP4_CHECK(rank >= 0 && rank < ranks(), "rank ", rank, " outside [0, R=", ranks(), ")");
  return impl_->rank_experts[size_t(rank)];
}

namespace {

// What travels with each dispatched pair (besides the activation row).
struct RecvEntry {
  int32_t src_rank;
  int32_t token;        // token index on its rank
  int32_t slot;
  int32_t local_expert;
  float weight;
};

// One rank's receive buffers: activation rows [n, H] and what came with them.
struct RecvBuffer {
  std::vector<float> x;
  std::vector<RecvEntry> entries;
};

// One rank's combine buffers: the weighted rows w_j * o_e of its own tokens'
// slots [tokens * k, H], and which rows arrived ([tokens * k]: row or -1).
struct CombineBuffer {
  std::vector<float> rows;
  std::vector<int64_t> index;
};

// 3. dispatch: every slot with a GLOBAL id goes to its owner's receive buffer,
// with its activation row, slot, weight and LOCAL id.
std::vector<RecvBuffer> dispatch(const ep::CpuDispatchPlan& plan, const cpu::Routing& routing, const float* x,
                                 int64_t k, int64_t E, int64_t H, int R) {
  const int32_t per = plan.experts_per_rank;
  std::vector<RecvBuffer> recv(static_cast<size_t>(R));
  for (int d = 0; d < R; ++d) {
    recv[size_t(d)].x.resize(size_t(plan.recv_count[size_t(d)] * H));
    recv[size_t(d)].entries.resize(size_t(plan.recv_count[size_t(d)]));
  }
  for (int s = 0; s < R; ++s) {
    std::vector<int64_t> cursor(static_cast<size_t>(R));
    for (int d = 0; d < R; ++d) cursor[size_t(d)] = plan.recv_offset[size_t(s * R + d)];
    for (int64_t t = plan.token_begin[size_t(s)]; t < plan.token_begin[size_t(s + 1)]; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = routing.ids[size_t(t * k + j)];
        const int32_t d = ep::slot_owner(id, int32_t(E), per);
        if (d < 0) continue;
        const int64_t row = cursor[size_t(d)]++;
        std::memcpy(recv[size_t(d)].x.data() + row * H, x + t * H, size_t(H) * sizeof(float));
        recv[size_t(d)].entries[size_t(row)] = {s, int32_t(t - plan.token_begin[size_t(s)]), int32_t(j),
                                                ep::local_expert(id, d, per), routing.weights[size_t(t * k + j)]};
      }
  }
  return recv;
}

// 4. compute on the owner with LOCAL ids: QDQ of x, the grouped NVFP4 GEMMs,
// w_j * o_e; 5. return each weighted row to its token's rank.
void compute_and_return(const MoeConfig& c, const ExpertWeights& ew, const RecvBuffer& recv, const float* l1_static_g,
                        int threads, std::vector<CombineBuffer>& combine) {
  const int64_t n = int64_t(recv.entries.size()), H = c.hidden, k = c.top_k;
  if (n == 0) return;
  std::vector<float> a_values(size_t(n * H)), a_g(static_cast<size_t>(n)), o(size_t(n * H)), w(static_cast<size_t>(n));
  cpu::stage_activation_rows(c.activation, recv.x.data(), n, H, l1_static_g, 0, a_values.data(), a_g.data());
  std::vector<cpu::ExpertPair> pairs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    pairs[size_t(i)] = {int32_t(i), recv.entries[size_t(i)].local_expert};
    w[size_t(i)] = recv.entries[size_t(i)].weight;
  }
  cpu::run_routed_experts(c, ew, a_values.data(), a_g.data(), pairs.data(), n,
                          c.l2_input == InputScaleMode::Static ? ew.w2_input_scale.data() : nullptr, o.data(), threads);
  cpu::weight_rows(o.data(), w.data(), n, H);
  for (int64_t i = 0; i < n; ++i) {
    const RecvEntry& e = recv.entries[size_t(i)];
    const int64_t row = ep::combine_row(e.token, e.slot, int32_t(k));
    CombineBuffer& dst = combine[size_t(e.src_rank)];
    std::memcpy(dst.rows.data() + row * H, o.data() + i * H, size_t(H) * sizeof(float));
    dst.index[size_t(row)] = row;
  }
}

CpuEpStats dispatch_stats(const ep::CpuDispatchPlan& plan, int R) {
  CpuEpStats st;
  st.tokens.assign(size_t(R), 0);
  st.received = plan.recv_count;
  st.sent.assign(size_t(R), 0);
  for (int s = 0; s < R; ++s) {
    st.tokens[size_t(s)] = plan.token_begin[size_t(s + 1)] - plan.token_begin[size_t(s)];
    for (int d = 0; d < R; ++d) st.sent[size_t(s)] += plan.send_count[size_t(s * R + d)];
  }
  return st;
}

}  // namespace

void CpuEpMoe::forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
                       const ForwardOptions&) {
  Impl& m = *impl_;
  const MoeConfig& c = m.config;
  const CheckedForward a = check_forward_args(c, x, routing, out, ForwardSite{.who = "CpuEpMoe"});
  const int64_t T = a.tokens, H = c.hidden, k = c.top_k;
  const int R = m.ranks();
  const int threads = m.options.threads;

  // 1. route: the caller's GLOBAL ids (checked), or the router on each rank's chunk.
  const std::vector<float> xf = cpu::values_f32(x);
  std::vector<int64_t> chunks(size_t(R + 1));
  for (int r = 0; r <= R; ++r) chunks[size_t(r)] = ep::token_chunk_begin(T, R, r);
  const cpu::Routing route = cpu::forward_routing(c, m.router, routing, a.caller_routing, xf.data(), chunks, threads);
  // 2. plan (throws on capacity overflow before any expert work).
  const ep::CpuDispatchPlan plan =
      ep::plan_cpu_dispatch(route.ids.data(), T, int32_t(k), int32_t(c.experts), R, m.options.recv_capacity);
  // 3. dispatch into each owner's receive buffers.
  const std::vector<RecvBuffer> recv = dispatch(plan, route, xf.data(), k, c.experts, H, R);
  // 4. compute on each owner; 5. return w_j * o_e to the token's rank.
  std::vector<CombineBuffer> combine(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    const int64_t n = plan.token_begin[size_t(r + 1)] - plan.token_begin[size_t(r)];
    combine[size_t(r)].rows.resize(size_t(n * k * H));
    combine[size_t(r)].index.assign(size_t(n * k), -1);
  }
  const float* l1_static_g = c.l1_input == InputScaleMode::Static ? &m.l1_static_g : nullptr;
  for (int d = 0; d < R; ++d)
    compute_and_return(c, m.rank_experts[size_t(d)], recv[size_t(d)], l1_static_g, threads, combine);
  // 6. combine on each token's rank: slots in order + shared expert, BF16 once.
  Bf16* y = out.y.ptr<Bf16>();
  for (int r = 0; r < R; ++r) {
    const int64_t b = plan.token_begin[size_t(r)], n = plan.token_begin[size_t(r + 1)] - b;
    if (n == 0) continue;
    std::vector<float> shared;
    if (c.shared_experts > 0) {
      shared.resize(size_t(n * H));
      cpu::run_shared_expert(c, m.shared, xf.data() + b * H, n, shared.data(), threads);
    }
    cpu::combine_tokens(combine[size_t(r)].rows.data(), combine[size_t(r)].index.data(), n, k, H,
                        shared.empty() ? nullptr : shared.data(), y + b * H, threads);
  }
  if (a.want_ids) std::copy(route.ids.begin(), route.ids.end(), out.topk_ids.ptr<int32_t>());
  if (a.want_weights) std::copy(route.weights.begin(), route.weights.end(), out.topk_weights.ptr<float>());
  m.stats = dispatch_stats(plan, R);
}

}  // namespace nvfp4moe

// The expert-parallel data movement kernels, templated on how a rank reaches
// a peer's segment (`Peers`):
//   * LsaPeers (nccl_ep_moe.cu): ncclGetLsaPointer on the symmetric window;
//   * EmulatedPeers (ep_emulation.cu): R segments of one device allocation.
// Everything else — offsets, owners, local ids, capacity — comes from
// ep_index.hpp, so both paths run the same indexing code.
//
// Phases of one forward on rank r (B = a barrier across ranks):
//   stage       own tokens -> own send area (codes, scales, g, GLOBAL ids, w);
//               clears own combine flags and receive counters
//   B
//   count       PULL: every peer's ids, count pairs per local expert
//   place       prefix over local experts; capacity check
//   gather      PULL: copy each pair's token (codes, scales, g) into the
//               receive area, grouped by LOCAL expert
//   (local expert compute writes w_j * o_e per receive row, FP32)
//   push        PUSH: each receive row to its token's rank's combine area
//   B
//   combine     own tokens: sum of slots in slot order (+ shared expert)
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ep/ep_index.hpp"
#include "nvfp4moe/moe.hpp"  // ErrorBits

namespace nvfp4moe::ep {

// R segments of `stride` bytes in one allocation: the one-GPU emulation.
struct EmulatedPeers {
  char* base = nullptr;
  uint64_t stride = 0;
  __device__ __forceinline__ char* segment(int32_t rank) const { return base + uint64_t(rank) * stride; }
};

__device__ __forceinline__ void record_error(char* own, const SegmentLayout& L, uint32_t bits) {
  atomicOr(area<uint32_t>(own, L.error_word), bits);
}

// ---- stage (after the activation quantizer wrote codes/scales/g) -------------------

// One thread per (token, slot): GLOBAL ids as int32 (int64 ids that do not fit
// become out of range), weights, cleared combine flags; block 0 also resets
// the receive counters of this rank for the coming dispatch.
template <typename Peers, typename IdT>
__global__ void ep_stage_routing_kernel(Peers peers, SegmentLayout L, int32_t rank, const IdT* ids,
                                        const float* weights, int32_t tokens) {
  char* own = peers.segment(rank);
  const int64_t n = int64_t(tokens) * L.top_k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const IdT raw = ids[i];
    const int32_t id = (raw >= IdT(-1) && raw < IdT(L.experts)) ? int32_t(raw) : int32_t(-2);
    if (!expert_id_in_range(id, L.experts)) record_error(own, L, kErrExpertIdOutOfRange);
    area<int32_t>(own, L.send_ids)[i] = id;
    area<float>(own, L.send_weights)[i] = weights[i];
    area<int32_t>(own, L.combine_flags)[i] = 0;
  }
  if (blockIdx.x == 0) {
    for (int e = threadIdx.x; e < L.local_experts; e += blockDim.x) {
      area<int32_t>(own, L.expert_count)[e] = 0;
      area<int32_t>(own, L.expert_cursor)[e] = 0;
    }
    if (threadIdx.x == 0) {
      *area<int32_t>(own, L.send_count) = tokens;
      *area<int32_t>(own, L.recv_total) = 0;
    }
  }
}

// ---- dispatch ----------------------------------------------------------------------------

// grid (chunks, R): block (x, s) counts the pairs of peer s that this rank owns.
template <typename Peers>
__global__ void ep_dispatch_count_kernel(Peers peers, SegmentLayout L, int32_t rank) {
  const int32_t src = blockIdx.y;
  char* own = peers.segment(rank);
  const char* peer = peers.segment(src);
  const int32_t epr = L.local_experts;
  const int64_t n = int64_t(*area<const int32_t>(const_cast<char*>(peer), L.send_count)) * L.top_k;
  const int32_t* ids = area<const int32_t>(const_cast<char*>(peer), L.send_ids);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[i];
    if (slot_owner(id, L.experts, epr) == rank) atomicAdd(area<int32_t>(own, L.expert_count) + local_expert(id, rank, epr), 1);
  }
}

// One thread: local experts are few (E/R <= a few hundred). Writes the
// unclipped first row of each expert (placement) and the clipped offsets the
// expert compute reads; records kErrCapacity when the pairs do not fit.
template <typename Peers>
__global__ void ep_dispatch_place_kernel(Peers peers, SegmentLayout L, int32_t rank) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  char* own = peers.segment(rank);
  const int32_t* count = area<int32_t>(own, L.expert_count);
  int32_t* first = area<int32_t>(own, L.expert_first);
  int32_t* offset = area<int32_t>(own, L.expert_offset);
  int64_t at = 0;
  for (int e = 0; e < L.local_experts; ++e) {
    first[e] = int32_t(at);
    offset[e] = int32_t(at < L.recv_capacity ? at : L.recv_capacity);
    at += count[e];
  }
  offset[L.local_experts] = int32_t(at < L.recv_capacity ? at : L.recv_capacity);
  *area<int32_t>(own, L.recv_total) = offset[L.local_experts];
  if (at > L.recv_capacity) record_error(own, L, kErrCapacity);
}

// grid (max_tokens, R), one block per token of peer s: copies the token into
// a receive row for every slot this rank owns. The row within an expert's
// range depends on arrival order; the values computed for it do not.
template <typename Peers>
__global__ void ep_dispatch_gather_kernel(Peers peers, SegmentLayout L, int32_t rank) {
  const int32_t src = blockIdx.y;
  const int32_t t = blockIdx.x;
  char* own = peers.segment(rank);
  char* peer = peers.segment(src);
  if (t >= *area<int32_t>(peer, L.send_count)) return;
  const int32_t epr = L.local_experts;
  __shared__ int32_t row_of_slot;
  for (int32_t j = 0; j < L.top_k; ++j) {
    const int32_t id = area<int32_t>(peer, L.send_ids)[combine_row(t, j, L.top_k)];
    if (slot_owner(id, L.experts, epr) != rank) continue;  // uniform across the block
    const int32_t e = local_expert(id, rank, epr);
    if (threadIdx.x == 0) {
      const int32_t n = atomicAdd(area<int32_t>(own, L.expert_cursor) + e, 1);
      const int32_t row = recv_row_or_drop(area<int32_t>(own, L.expert_first)[e], n, L.recv_capacity);
      if (row < 0) {
        record_error(own, L, kErrCapacity);
      } else {
        area<int32_t>(own, L.recv_src_rank)[row] = src;
        area<int32_t>(own, L.recv_token)[row] = t;
        area<int32_t>(own, L.recv_slot)[row] = j;
        area<int32_t>(own, L.recv_expert)[row] = e;
        area<float>(own, L.recv_weight)[row] = area<float>(peer, L.send_weights)[combine_row(t, j, L.top_k)];
        area<float>(own, L.recv_g)[row] = area<float>(peer, L.send_g)[t];
      }
      row_of_slot = row;
    }
    __syncthreads();
    const int32_t row = row_of_slot;
    __syncthreads();
    if (row < 0) continue;
    // codes: H/2 bytes = H/16 8-byte words; scales: H/16 bytes
    const int64_t words = L.hidden / 16;
    const uint2* cs = area<const uint2>(peer, L.send_codes) + int64_t(t) * words;
    uint2* cd = area<uint2>(own, L.recv_codes) + int64_t(row) * words;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) cd[w] = cs[w];
    const uint8_t* ss = area<const uint8_t>(peer, L.send_scales) + int64_t(t) * L.scales_per_token();
    uint8_t* sd = area<uint8_t>(own, L.recv_scales) + int64_t(row) * L.scales_per_token();
    for (int64_t b = threadIdx.x; b < L.scales_per_token(); b += blockDim.x) sd[b] = ss[b];
  }
}

// ---- combine ---------------------------------------------------------------------------

// grid (recv_capacity): receive row p's result (w_j * o_e, FP32, from the
// expert compute) goes to its token's rank's combine area — as FP32, or
// rounded to BF16 when the layout says so — then its flag.
template <typename Peers>
__global__ void ep_combine_push_kernel(Peers peers, SegmentLayout L, int32_t rank, const float* pair_out) {
  const int32_t p = blockIdx.x;
  char* own = peers.segment(rank);
  if (p >= *area<int32_t>(own, L.recv_total)) return;
  const int32_t src = area<int32_t>(own, L.recv_src_rank)[p];
  const int64_t crow = combine_row(area<int32_t>(own, L.recv_token)[p], area<int32_t>(own, L.recv_slot)[p], L.top_k);
  char* home = peers.segment(src);
  const float4* from = reinterpret_cast<const float4*>(pair_out + int64_t(p) * L.hidden);
  if (L.combine_bytes == 4) {  // H floats = H/4 16-byte vectors (H is a multiple of 16)
    float4* to = reinterpret_cast<float4*>(area<float>(home, L.combine_rows) + crow * L.hidden);
    for (int64_t v = threadIdx.x; v < L.hidden / 4; v += blockDim.x) to[v] = from[v];
  } else {  // 8 floats -> 8 BF16 = one 16-byte store
    uint4* to = reinterpret_cast<uint4*>(area<__nv_bfloat16>(home, L.combine_rows) + crow * L.hidden);
    for (int64_t v = threadIdx.x; v < L.hidden / 8; v += blockDim.x) {
      const float4 a = from[2 * v], b = from[2 * v + 1];
      const __nv_bfloat162 h0 = __floats2bfloat162_rn(a.x, a.y), h1 = __floats2bfloat162_rn(a.z, a.w),
                           h2 = __floats2bfloat162_rn(b.x, b.y), h3 = __floats2bfloat162_rn(b.z, b.w);
      uint4 out;
      out.x = *reinterpret_cast<const uint32_t*>(&h0);
      out.y = *reinterpret_cast<const uint32_t*>(&h1);
      out.z = *reinterpret_cast<const uint32_t*>(&h2);
      out.w = *reinterpret_cast<const uint32_t*>(&h3);
      to[v] = out;
    }
  }
  if (threadIdx.x == 0) area<int32_t>(home, L.combine_flags)[crow] = 1;
}

// grid (tokens): y_t = sum over slots in slot order of the combine rows
// (+ shared expert output, FP32), rounded once to BF16 — the same sum in the
// same order as the single-GPU combine (src/cuda/combine.cu). A slot routed to an
// expert whose row never arrived (dropped for capacity) contributes nothing
// and is recorded; -1 and out-of-range slots contribute nothing.
template <typename Peers>
__global__ void ep_combine_kernel(Peers peers, SegmentLayout L, int32_t rank, const float* shared_out,
                                  __nv_bfloat16* y) {
  constexpr int kMaxTopK = 32;
  const int32_t t = blockIdx.x;
  char* own = peers.segment(rank);
  __shared__ bool use[kMaxTopK];
  if (threadIdx.x < L.top_k) {
    const int32_t j = threadIdx.x;
    const int64_t crow = combine_row(t, j, L.top_k);
    const bool routed = slot_owner(area<int32_t>(own, L.send_ids)[crow], L.experts, L.local_experts) >= 0;
    const bool arrived = area<int32_t>(own, L.combine_flags)[crow] == 1;
    use[j] = routed && arrived;
    if (routed && !arrived) record_error(own, L, kErrCapacity);
  }
  __syncthreads();
  const int64_t first = combine_row(t, 0, L.top_k) * L.hidden;
  const float* rows = area<float>(own, L.combine_rows) + first;
  const __nv_bfloat16* rows_bf16 = area<__nv_bfloat16>(own, L.combine_rows) + first;
  const bool bf16 = L.combine_bytes == 2;
  for (int64_t n = threadIdx.x; n < L.hidden; n += blockDim.x) {
    float acc = 0.0f;
    for (int32_t j = 0; j < L.top_k; ++j)
      if (use[j]) acc += bf16 ? __bfloat162float(rows_bf16[int64_t(j) * L.hidden + n]) : rows[int64_t(j) * L.hidden + n];
    if (shared_out) acc += shared_out[int64_t(t) * L.hidden + n];
    y[int64_t(t) * L.hidden + n] = __float2bfloat16_rn(acc);
  }
}

}  // namespace nvfp4moe::ep

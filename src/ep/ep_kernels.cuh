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
//   count       PULL: every peer's ids, count pairs per local expert; the
//               last count block then places: prefix over local experts,
//               capacity check, the expert GEMMs' tile list
//   gather      PULL: copy each pair's token (codes, scales, g) into the
//               receive area, grouped by LOCAL expert; note where its result
//               goes (its row in the token's rank's combine area) and set
//               that row's flag there
//   experts     the local experts; the down GEMM's epilogue PUSHES w_j * o_e
//               of each receive row straight into that combine row
//   B
//   combine     own tokens: sum of slots in slot order (+ shared expert)
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/grouping_slots.cuh"
#include "cuda/kernels/warp_scan.cuh"
#include "cuda/layout/grouped_gemm_plan.hpp"
#include "ep/ep_index.hpp"
#include "nvfp4moe/moe.hpp"  // ErrorBits

namespace nvfp4moe::ep {

// Where the dispatch's placement writes the expert GEMMs' work list (tiles
// of at most kGemmTileTokens receive rows of one expert) and its length;
// null tiles: no list (nothing reads one).
struct EpTileSink {
  cuda::GemmTile* tiles = nullptr;
  int32_t* num_tiles = nullptr;
};

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
      *area<uint32_t>(own, L.dispatch_done) = 0u;  // also reset by its last user: belt and braces after an aborted forward
    }
  }
}

// ---- dispatch ----------------------------------------------------------------------------

// One warp, 32 local experts at a time (a warp scan of their counts, not one
// thread walking them all). Writes the unclipped first row of each expert
// (placement) and the clipped offsets the expert compute reads; records
// kErrCapacity when the pairs do not fit. With a sink, the same round also
// writes the expert GEMMs' work list from each expert's clipped rows: tiles
// of at most kGemmTileTokens consecutive receive rows (a second warp scan,
// of the tile counts).
__device__ __forceinline__ void place_pairs(char* own, const SegmentLayout& L, EpTileSink sink, int lane) {
  const int32_t* count = area<int32_t>(own, L.expert_count);
  int32_t* first = area<int32_t>(own, L.expert_first);
  int32_t* offset = area<int32_t>(own, L.expert_offset);
  const int64_t cap = L.recv_capacity;
  int64_t base = 0;   // pairs of the experts before this round
  int32_t tiles = 0;  // tiles of the experts before this round
  for (int32_t e0 = 0; e0 < L.local_experts; e0 += 32) {
    const int32_t e = e0 + lane;
    const int64_t c = e < L.local_experts ? __ldcg(count + e) : 0;  // other blocks' atomics: read at L2
    const int64_t inc = cuda::warp_inclusive_sum(c);
    const int64_t at = base + inc - c;
    const int32_t begin = int32_t(at < cap ? at : cap), end = int32_t(at + c < cap ? at + c : cap);
    if (e < L.local_experts) {
      first[e] = int32_t(at);
      offset[e] = begin;
    }
    if (sink.tiles) {
      const int32_t mine = (end - begin + cuda::kGemmTileTokens - 1) / cuda::kGemmTileTokens;  // 0 past the experts
      const int32_t tinc = cuda::warp_inclusive_sum(mine);
      cuda::write_expert_tiles(e, begin, end - begin, cuda::kGemmTileTokens, sink.tiles + tiles + tinc - mine);
      tiles += __shfl_sync(0xffffffffu, tinc, 31);
    }
    base += __shfl_sync(0xffffffffu, inc, 31);
  }
  if (lane == 0) {
    offset[L.local_experts] = int32_t(base < cap ? base : cap);
    *area<int32_t>(own, L.recv_total) = offset[L.local_experts];
    if (base > cap) record_error(own, L, kErrCapacity);
    if (sink.tiles) *sink.num_tiles = tiles;
  }
}

// grid (chunks, R): block (x, s) counts the pairs of peer s that this rank
// owns. The last block to finish (its ticket in dispatch_done) then places
// them and writes the tile list — one launch where there were three, each a
// few microseconds of a one-token forward (T=1 graph 125.6 -> 122.4 us).
template <typename Peers>
__global__ void ep_dispatch_count_kernel(Peers peers, SegmentLayout L, int32_t rank, EpTileSink sink) {
  const int32_t src = blockIdx.y;
  char* own = peers.segment(rank);
  const char* peer = peers.segment(src);
  const int32_t epr = L.local_experts;
  // L is this forward's layout (forward_layout): a peer that staged more
  // tokens than its bound (it was given a larger one) has the excess dropped
  // here — counted, gathered and pushed by no one — and recorded; its own
  // combine then finds those slots never arrived.
  const int32_t staged = *area<const int32_t>(const_cast<char*>(peer), L.send_count);
  if (staged > L.max_tokens && blockIdx.x == 0 && threadIdx.x == 0) record_error(own, L, kErrCapacity);
  const int64_t n = int64_t(staged < L.max_tokens ? staged : L.max_tokens) * L.top_k;
  const int32_t* ids = area<const int32_t>(const_cast<char*>(peer), L.send_ids);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t id = ids[i];
    if (slot_owner(id, L.experts, epr) == rank) atomicAdd(area<int32_t>(own, L.expert_count) + local_expert(id, rank, epr), 1);
  }
  __shared__ bool last;
  __syncthreads();  // every count of this block issued
  if (threadIdx.x == 0) {
    __threadfence();  // ... and visible before the ticket
    last = atomicAdd(area<uint32_t>(own, L.dispatch_done), 1u) == gridDim.x * gridDim.y - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x >= 32) return;
  __threadfence();  // the other blocks' counts, visible before their tickets
  place_pairs(own, L, sink, int(threadIdx.x));
  if (threadIdx.x == 0) *area<uint32_t>(own, L.dispatch_done) = 0u;  // ready for the next forward (and graph replay)
}

// Copies a thread makes per round in the dispatch and combine phases: their
// loads are all issued before the first store (or sum), so a thread waits on
// one round trip per round instead of one per vector (one token's chains
// of round trips were what a decode forward spent in these kernels).
constexpr int kCopyBatch = 8;
constexpr int kMaxTopK = 32;  // EpRank checks top_k <= 32

// src[0, n) to the rows dst + rows[j] * stride of the slots j with rows[j] >= 0.
template <typename T>
__device__ __forceinline__ void copy_to_rows(const T* src, int64_t n, T* dst, int64_t stride, const int32_t* rows,
                                             int32_t slots) {
  for (int64_t v0 = threadIdx.x; v0 < n; v0 += int64_t(kCopyBatch) * blockDim.x) {
    T a[kCopyBatch];
#pragma unroll
    for (int i = 0; i < kCopyBatch; ++i)
      if (v0 + int64_t(i) * blockDim.x < n) a[i] = src[v0 + int64_t(i) * blockDim.x];
    for (int32_t j = 0; j < slots; ++j) {
      const int32_t row = rows[j];
      if (row < 0) continue;
#pragma unroll
      for (int i = 0; i < kCopyBatch; ++i)
        if (v0 + int64_t(i) * blockDim.x < n) dst[int64_t(row) * stride + v0 + int64_t(i) * blockDim.x] = a[i];
    }
  }
}

// grid (max_tokens, R) of this forward's layout (tokens past it were not
// counted), one block per token of peer s: copies the token into
// a receive row for every slot this rank owns. Thread j books slot j's row
// (all slots at once), then the block reads the token once and writes it to
// each booked row; a token with no slot here is not read at all (at R = 8
// and k = 6 that is ~45 % of a peer's tokens, each H/2 + H/16 bytes over
// NVLink). The row within an expert's range depends on arrival order; the
// values computed for it do not. out_rows[row] gets the address of the
// pair's combine row on the token's rank, where the down GEMM writes its
// result, and that row's flag is set now: the combine reads it only after
// the second barrier, which follows the GEMM.
template <typename Peers>
__global__ void ep_dispatch_gather_kernel(Peers peers, SegmentLayout L, int32_t rank, void** out_rows) {
  const int32_t src = blockIdx.y;
  const int32_t t = blockIdx.x;
  char* own = peers.segment(rank);
  char* peer = peers.segment(src);
  if (t >= *area<int32_t>(peer, L.send_count)) return;
  const int32_t epr = L.local_experts;
  __shared__ int32_t row_of_slot[kMaxTopK];
  if (threadIdx.x < L.top_k) {
    const int32_t j = threadIdx.x;
    const int64_t crow = combine_row(t, j, L.top_k);
    const int32_t id = area<int32_t>(peer, L.send_ids)[crow];
    int32_t row = -1;
    if (slot_owner(id, L.experts, epr) == rank) {
      const int32_t e = local_expert(id, rank, epr);
      const int32_t n = atomicAdd(area<int32_t>(own, L.expert_cursor) + e, 1);
      row = recv_row_or_drop(area<int32_t>(own, L.expert_first)[e], n, L.recv_capacity);
      if (row < 0) {
        record_error(own, L, kErrCapacity);
      } else {
        area<int32_t>(own, L.recv_expert)[row] = e;
        area<float>(own, L.recv_weight)[row] = area<float>(peer, L.send_weights)[crow];
        area<float>(own, L.recv_g)[row] = area<float>(peer, L.send_g)[t];
        out_rows[row] = peer + combine_row_offset(L, crow);
        area<int32_t>(peer, L.combine_flags)[crow] = 1;
      }
    }
    row_of_slot[j] = row;
  }
  __syncthreads();
  bool booked = false;  // the same for every thread of the block: no barrier follows
  for (int32_t j = 0; j < L.top_k; ++j) booked |= row_of_slot[j] >= 0;
  if (!booked) return;
  // codes: H/2 bytes = H/16 8-byte words; scales: H/16 bytes
  const int64_t words = L.hidden / 16;
  copy_to_rows(area<const uint2>(peer, L.send_codes) + int64_t(t) * words, words, area<uint2>(own, L.recv_codes), words,
               row_of_slot, L.top_k);
  copy_to_rows(area<const uint8_t>(peer, L.send_scales) + int64_t(t) * L.scales_per_token(), L.scales_per_token(),
               area<uint8_t>(own, L.recv_scales), L.scales_per_token(), row_of_slot, L.top_k);
}

// ---- combine ---------------------------------------------------------------------------

// Four consecutive values of combine row `row` (FP32 or BF16 as the layout says).
__device__ __forceinline__ float4 combine_row4(const char* own, const SegmentLayout& L, int64_t row, int64_t c4) {
  const char* at = own + combine_row_offset(L, row);
  if (L.combine_bytes == 2) {
    const uint2 u = reinterpret_cast<const uint2*>(at)[c4];
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  }
  return reinterpret_cast<const float4*>(at)[c4];
}

// grid (tokens, column splits): y_t = sum over slots in slot order of the
// combine rows (+ shared expert output, FP32), rounded once to BF16 — the
// same sum in the same order as the single-GPU combine (src/cuda/combine.cu),
// and like it, a few tokens split their columns over CTAs and each thread
// has the loads of kCopyBatch slots in flight at once. A slot routed to an
// expert whose row never arrived (dropped for capacity) contributes nothing
// and is recorded; -1 and out-of-range slots contribute nothing.
template <typename Peers>
__global__ void ep_combine_kernel(Peers peers, SegmentLayout L, int32_t rank, const float* shared_out,
                                  __nv_bfloat16* y) {
  const int32_t t = blockIdx.x;
  char* own = peers.segment(rank);
  __shared__ bool use[kMaxTopK];
  if (threadIdx.x < L.top_k) {
    const int32_t j = threadIdx.x;
    const int64_t crow = combine_row(t, j, L.top_k);
    const bool routed = slot_owner(area<int32_t>(own, L.send_ids)[crow], L.experts, L.local_experts) >= 0;
    const bool arrived = area<int32_t>(own, L.combine_flags)[crow] == 1;
    use[j] = routed && arrived;
    if (routed && !arrived && blockIdx.y == 0) record_error(own, L, kErrCapacity);
  }
  __syncthreads();
  const int64_t first = combine_row(t, 0, L.top_k);
  __nv_bfloat16* yt = y + int64_t(t) * L.hidden;
  if ((reinterpret_cast<uintptr_t>(yt) & 7u) != 0) {  // an output row not 8-byte aligned: one value per thread
    if (blockIdx.y != 0) return;
    for (int64_t n = threadIdx.x; n < L.hidden; n += blockDim.x) {
      float acc = 0.0f;
      for (int32_t j = 0; j < L.top_k; ++j)
        if (use[j]) {
          const char* row = own + combine_row_offset(L, first + j);
          acc += L.combine_bytes == 2 ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[n])
                                      : reinterpret_cast<const float*>(row)[n];
        }
      if (shared_out) acc += shared_out[int64_t(t) * L.hidden + n];
      yt[n] = __float2bfloat16_rn(acc);
    }
    return;
  }
  const int64_t cols4 = L.hidden / 4, step = int64_t(gridDim.y) * blockDim.x;
  for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < cols4; c += step) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int32_t j0 = 0; j0 < L.top_k; j0 += kCopyBatch) {
      float4 v[kCopyBatch];
#pragma unroll
      for (int i = 0; i < kCopyBatch; ++i)
        if (j0 + i < L.top_k && use[j0 + i]) v[i] = combine_row4(own, L, first + j0 + i, c);
#pragma unroll
      for (int i = 0; i < kCopyBatch; ++i)
        if (j0 + i < L.top_k && use[j0 + i]) {
          sum.x += v[i].x;
          sum.y += v[i].y;
          sum.z += v[i].z;
          sum.w += v[i].w;
        }
    }
    if (shared_out) {
      const float4 s = reinterpret_cast<const float4*>(shared_out + int64_t(t) * L.hidden)[c];
      sum.x += s.x;
      sum.y += s.y;
      sum.z += s.z;
      sum.w += s.w;
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x, sum.y), hi = __floats2bfloat162_rn(sum.z, sum.w);
    reinterpret_cast<uint2*>(yt)[c] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                                                 *reinterpret_cast<const uint32_t*>(&hi));
  }
}

}  // namespace nvfp4moe::ep

// Expert-parallel bookkeeping (docs/numerics.md §6), compiled by C++ and CUDA.
//
// ONE copy of the indexing that both GPU paths use: the NCCL path (ranks are
// processes, peers reached through LSA pointers of a symmetric window) and
// the one-GPU emulation (R logical ranks, plain device buffers laid out the
// same way). Only the "where is rank r's segment" accessor differs between
// them; every offset, owner, local id and capacity decision is made here.
//
// Conventions (docs/numerics.md §6):
//   * R ranks, E % R == 0, rank r owns GLOBAL experts [r*E/R, (r+1)*E/R) and
//     indexes its weights LOCALLY: local = global - r*E/R.
//   * topk ids are GLOBAL, -1 = "no expert" (contributes nothing); an id
//     outside [-1, E) is skipped with no memory access through it and
//     recorded in the error word (kErrExpertIdOutOfRange) by the token's rank.
//   * a pair (token t of rank s, slot j) whose owner's receive area is full is
//     dropped, kErrCapacity is recorded (by the owner and by the token's rank)
//     and the slot contributes nothing: reported, never garbage.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/nvfp4_codec.hpp"  // NVFP4_HD

namespace nvfp4moe::ep {

// ---- ranks and experts --------------------------------------------------------

NVFP4_HD int32_t experts_per_rank(int32_t experts, int32_t ranks) { return experts / ranks; }

// -1 and ids outside [-1, E) are not routed anywhere.
NVFP4_HD bool expert_id_routed(int32_t id, int32_t experts) { return id >= 0 && id < experts; }
NVFP4_HD bool expert_id_in_range(int32_t id, int32_t experts) { return id >= -1 && id < experts; }

// The rank that owns GLOBAL expert `id` (callers check expert_id_routed first).
NVFP4_HD int32_t owner_rank(int32_t id, int32_t experts_per_rank) { return id / experts_per_rank; }

// GLOBAL -> LOCAL id on its owner.
NVFP4_HD int32_t local_expert(int32_t id, int32_t rank, int32_t experts_per_rank) {
  return id - rank * experts_per_rank;
}

// The rank a slot goes to, or -1 when it goes nowhere (-1 or out of range).
NVFP4_HD int32_t slot_owner(int32_t id, int32_t experts, int32_t experts_per_rank) {
  return expert_id_routed(id, experts) ? owner_rank(id, experts_per_rank) : -1;
}

// Tokens of a batch split over ranks in contiguous chunks (as the CPU
// emulation does): rank r holds [chunk_begin(r), chunk_begin(r + 1)).
NVFP4_HD int64_t token_chunk_begin(int64_t tokens, int32_t ranks, int32_t rank) {
  int64_t per = tokens / ranks, extra = tokens % ranks;
  return rank * per + (rank < extra ? rank : extra);
}

// A (token, slot) pair's row in the token rank's combine area.
NVFP4_HD int64_t combine_row(int64_t token, int32_t slot, int32_t top_k) { return token * top_k + slot; }

// ---- the segment of one rank ------------------------------------------------------

// Byte offsets of every area inside one rank's segment of the symmetric
// buffer. All ranks use the same layout, so an offset computed here is valid
// in every peer's segment (that is what "symmetric" buys).
struct SegmentLayout {
  // geometry
  int32_t hidden = 0;            // H
  int32_t top_k = 0;             // k
  int32_t experts = 0;           // E (global)
  int32_t ranks = 0;             // R
  int32_t local_experts = 0;     // E / R
  int32_t max_tokens = 0;        // tokens a rank may stage per forward
  int32_t recv_capacity = 0;     // pairs a rank may receive per forward
  int32_t combine_bytes = 4;     // bytes per combine element: 4 (FP32) or 2 (BF16)

  // send area: this rank's tokens, read by the experts' owners (pull dispatch)
  uint64_t send_count = 0;       // int32: tokens staged this forward
  uint64_t send_codes = 0;       // u8 [max_tokens, H/2]
  uint64_t send_scales = 0;      // u8 [max_tokens, H/16] linear UE4M3
  uint64_t send_g = 0;           // f32 [max_tokens]: the token's global scale (L1 alpha factor)
  uint64_t send_ids = 0;         // i32 [max_tokens, k] GLOBAL ids
  uint64_t send_weights = 0;     // f32 [max_tokens, k]
  // combine area: w_j * o_e of this rank's pairs, written by the owners (push).
  // FP32 by default, like the single-GPU backend's pair buffer, so EP sums the
  // very same values in the same order; BF16 halves the traffic (docs/ep.md).
  uint64_t combine_rows = 0;     // f32 or bf16 [max_tokens * k, H]
  uint64_t combine_flags = 0;    // i32 [max_tokens * k]: 1 = row written this forward
  // receive area: pairs this rank computes, grouped by local expert
  uint64_t recv_codes = 0;       // u8 [capacity, H/2]
  uint64_t recv_scales = 0;      // u8 [capacity, H/16]
  uint64_t recv_g = 0;           // f32 [capacity]
  uint64_t recv_expert = 0;      // i32 [capacity]: LOCAL expert id
  uint64_t recv_weight = 0;      // f32 [capacity]: routing weight w_j
  uint64_t expert_count = 0;     // i32 [local_experts]: pairs per local expert (unclipped)
  uint64_t expert_first = 0;     // i32 [local_experts]: first row, unclipped (placement)
  uint64_t expert_offset = 0;    // i32 [local_experts + 1]: first row, clipped to capacity (compute)
  uint64_t expert_cursor = 0;    // i32 [local_experts]
  uint64_t recv_total = 0;       // i32: rows filled (clipped to capacity)
  uint64_t dispatch_done = 0;    // u32: count blocks done this forward (the last one places; it resets it)
  uint64_t error_word = 0;       // u32[4]: ErrorBits of this rank, then token/slot/value of the first router error
  uint64_t bytes = 0;            // size of one segment

  NVFP4_HD int64_t codes_per_token() const { return hidden / 2; }
  NVFP4_HD int64_t scales_per_token() const { return hidden / 16; }
};

// Computes every offset (256-byte aligned: vector copies and ncclMemAlloc
// granularity never split an area).
inline SegmentLayout make_segment_layout(int32_t hidden, int32_t top_k, int32_t experts, int32_t ranks,
                                         int32_t max_tokens, int32_t recv_capacity, bool combine_bf16 = false) {
  SegmentLayout s;
  s.hidden = hidden;
  s.top_k = top_k;
  s.experts = experts;
  s.ranks = ranks;
  s.local_experts = experts / ranks;
  s.max_tokens = max_tokens;
  s.recv_capacity = recv_capacity;
  s.combine_bytes = combine_bf16 ? 2 : 4;
  uint64_t at = 0;
  auto take = [&](uint64_t& field, uint64_t bytes) {
    field = at;
    at += (bytes + 255) / 256 * 256;
  };
  const uint64_t T = uint64_t(max_tokens), K = uint64_t(top_k), H = uint64_t(hidden), C = uint64_t(recv_capacity);
  const uint64_t L = uint64_t(s.local_experts);
  take(s.send_count, 4);
  take(s.send_codes, T * H / 2);
  take(s.send_scales, T * H / 16);
  take(s.send_g, T * 4);
  take(s.send_ids, T * K * 4);
  take(s.send_weights, T * K * 4);
  take(s.combine_rows, T * K * H * uint64_t(s.combine_bytes));
  take(s.combine_flags, T * K * 4);
  take(s.recv_codes, C * H / 2);
  take(s.recv_scales, C * H / 16);
  take(s.recv_g, C * 4);
  take(s.recv_expert, C * 4);
  take(s.recv_weight, C * 4);
  take(s.expert_count, L * 4);
  take(s.expert_first, L * 4);
  take(s.expert_offset, (L + 1) * 4);
  take(s.expert_cursor, L * 4);
  take(s.recv_total, 4);
  take(s.dispatch_done, 4);
  take(s.error_word, 16);
  s.bytes = at;
  return s;
}

// One forward's view of a layout: the same areas, with the token bound of
// the batch (the most tokens any rank stages in it, 1 .. max_tokens) and the
// receive capacity it implies (R * bound * k pairs at most arrive). Every
// launch of the forward is sized by it, and the expert GEMMs are chosen for
// it, instead of for the largest batch the segments were made for.
inline SegmentLayout forward_layout(const SegmentLayout& L, int32_t tokens_bound) {
  SegmentLayout f = L;
  f.max_tokens = tokens_bound;
  const int64_t arriving = int64_t(L.ranks) * tokens_bound * L.top_k;
  f.recv_capacity = int32_t(arriving < L.recv_capacity ? arriving : L.recv_capacity);
  return f;
}

// Typed access to an area of a segment.
template <typename T>
NVFP4_HD T* area(char* segment, uint64_t offset) {
  return reinterpret_cast<T*>(segment + offset);
}

// Byte offset in a segment of combine row `row` (combine_row): FP32 or BF16
// values, as the layout says. The owner's down GEMM writes the row there in
// the token's rank's segment; that rank's combine reads it.
NVFP4_HD uint64_t combine_row_offset(const SegmentLayout& L, int64_t row) {
  return L.combine_rows + uint64_t(row) * uint64_t(L.hidden) * uint64_t(L.combine_bytes);
}

// ---- capacity ------------------------------------------------------------------------

// Receive row of the n-th pair (0-based, in arrival order) of local expert e
// whose unclipped first row is `first`; -1 when it does not fit: the pair is
// dropped and kErrCapacity recorded.
NVFP4_HD int32_t recv_row_or_drop(int32_t first, int32_t n, int32_t capacity) {
  int64_t row = int64_t(first) + n;
  return row < capacity ? int32_t(row) : -1;
}

// ---- traffic between GPUs -------------------------------------------------------

// The bytes one forward moves between GPUs for the tokens of rank `home`
// (`ids`: its [tokens, k] GLOBAL ids as staged), as the kernels of
// ep_kernels.cuh move them; L gives the geometry (H, k, E, R, combine bytes).
//   dispatch (pulled by the owners from the home rank's send area): each
//     peer's count and its gather's booking read the token's k ids (2 x 4k
//     bytes a token and peer); a peer owning at least one slot of a token
//     reads its codes and scales once (H/2 + H/16 bytes), and per owned
//     slot its weight and g (8 bytes);
//   combine (pushed by the owners into the home rank's combine area): per
//     pair a peer owns, its row (H x combine bytes) and its flag (4 bytes).
// Slots the home rank owns itself stay on its GPU; -1 and out-of-range ids
// go nowhere. Counters of a few bytes a forward are left out.
struct EpTraffic {
  uint64_t dispatch_bytes = 0, combine_bytes = 0;
  int64_t remote_pairs = 0;  // pairs owned by another rank than their token's
};
inline EpTraffic ep_home_traffic(const SegmentLayout& L, int32_t home, const int32_t* ids, int64_t tokens) {
  EpTraffic t;
  const int32_t epr = experts_per_rank(L.experts, L.ranks);
  const uint64_t row_bytes = uint64_t(L.codes_per_token() + L.scales_per_token());
  t.dispatch_bytes = 2 * uint64_t(L.ranks - 1) * uint64_t(tokens) * uint64_t(L.top_k) * 4;
  auto owner_of = [&](int64_t tok, int32_t j) { return slot_owner(ids[combine_row(tok, j, L.top_k)], L.experts, epr); };
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int32_t j = 0; j < L.top_k; ++j) {
      const int32_t owner = owner_of(tok, j);
      if (owner < 0 || owner == home) continue;
      ++t.remote_pairs;
      bool first = true;  // the owner's first slot of this token: it reads the row then
      for (int32_t i = 0; i < j && first; ++i) first = owner_of(tok, i) != owner;
      if (first) t.dispatch_bytes += row_bytes;
    }
  t.dispatch_bytes += uint64_t(t.remote_pairs) * 8;
  t.combine_bytes = uint64_t(t.remote_pairs) * (uint64_t(L.hidden) * uint64_t(L.combine_bytes) + 4);
  return t;
}

}  // namespace nvfp4moe::ep

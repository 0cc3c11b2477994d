// The routed experts on the CPU: grouped NVFP4 or MXFP4 GEMMs with the
// dequantized weight tile reused across every token routed to the expert.
//
// Work is split into items (expert, tile of output rows) taken from a queue,
// so 6 active experts still keep every core busy in decode and an expert with
// many tokens does not leave the others idle. Per item: dequantize the tile's
// weight rows once (value(q) * f32(s), exact), then FP32 dot products with the
// QDQ'd activation of each token in the group, then the epilogue multiplies the
// sum by alpha = g_activation * g_weight (the GPU epilogue's alpha).
#include <algorithm>
#include <vector>

#include "cpu/cpu_kernels.hpp"
#include "cpu/cpu_moe.hpp"
#include "cpu/nvfp4_int_dot.hpp"
#include "cpu/work_queue.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

namespace {

// Output rows per work item: 16 rows x K=7168 FP32 is 458 KB of dequantized
// tile, which stays in L2 while every token of the group streams past it.
constexpr int64_t kTileRows = 16;

struct TileItem {
  int32_t expert;  // local expert
  int32_t row0;    // first output row of the tile
};

std::vector<TileItem> tile_items(const ExpertGroups& groups, int64_t experts, int64_t rows) {
  std::vector<TileItem> items;
  for (int64_t e = 0; e < experts; ++e) {
    if (groups.offsets[size_t(e + 1)] == groups.offsets[size_t(e)]) continue;
    for (int64_t r = 0; r < rows; r += kTileRows) items.push_back({int32_t(e), int32_t(r)});
  }
  return items;
}

// Tiles per take from the queue: a worker runs 8 consecutive tiles (128 rows,
// one contiguous run of weight bytes), so its prefetches run on into its own
// next tile rather than the other core's (measured: 4 and 16 no better).
constexpr int64_t kTilesPerTake = 8;
template <typename Fn>
void run_tiles(int64_t n, WorkerPool& pool, Fn&& fn) {
  run_items((n + kTilesPerTake - 1) / kTilesPerTake, pool, [&](int64_t take, int worker) {
    for (int64_t i = take * kTilesPerTake; i < std::min(n, (take + 1) * kTilesPerTake); ++i) fn(i, worker);
  });
}

// Per-worker scratch: one dequantized tile (allocated on first use: the
// integer path never needs it, and zero-filling 2 x 256 KiB cost ~0.13 ms of
// a decode forward) and one tile of dot results.
struct Scratch {
  std::vector<float> tile, dots;
  float* tile_of(int64_t floats) {
    if (tile.size() < size_t(floats)) tile.resize(size_t(floats));
    return tile.data();
  }
};

// One tile item of a grouped NVFP4 GEMM: weight rows `codes` / `scales`
// (n rows of K columns) times every position in [begin, end) of their
// expert's group, act(pos) giving a position's activation row and
// packed(pos) its integer form (nullptr: none); emit(pos, d) receives the
// position's n dot products.
//   NVFP4 activations (packed): exact integer dots, up to kIntDotTokens
//     tokens per pass over the tile's codes (nvfp4_int_dot.hpp).
//   Other activations, few positions: the fused dots (nvfp4_ /
//     mxfp4_dot_rows_tokens); more: rows dequantized once into the FP32
//     tile (exact values, no global scale) and reused by every pass.
// A token's result never depends on the other positions of its group.
template <typename Act, typename Packed, typename Emit>
void tile_item_dots(const E2m1PairTable& lut, ExpertFormat format, const uint8_t* codes, const uint8_t* scales,
                    int64_t n, int64_t K, int64_t begin, int64_t end, Scratch& s, Act&& act, Packed&& packed,
                    Emit&& emit) {
  const bool mx = format == ExpertFormat::Mxfp4;
  // Positions without a packed row (none on the NVFP4 path but rows that did
  // not pack) go through the FP32 path below, one by one.
  int64_t float_positions = end - begin;
  if (!mx) {
    float_positions = 0;
    IntActRow rows[kIntDotTokens];
    int64_t pos_of[kIntDotTokens];
    int m = 0;
    auto flush = [&] {
      if (m == 0) return;
      int_dot_rows_tokens(lut, rows, m, codes, scales, n, K, s.dots.data(), kTileRows);
      for (int t = 0; t < m; ++t) emit(pos_of[t], s.dots.data() + t * kTileRows);
      m = 0;
    };
    for (int64_t pos = begin; pos < end; ++pos) {
      const IntActRow* p = packed(pos);
      if (!p) {
        ++float_positions;
        continue;
      }
      rows[m] = *p;
      pos_of[m++] = pos;
      if (m == kIntDotTokens) flush();
    }
    flush();
    if (float_positions == 0) return;
  }
  const bool fused = float_positions <= kDotTokens;
  float* tile = s.tile_of(kTileRows * K);
  if (!fused) {
    if (mx)
      dequant_mxfp4_rows(lut, codes, scales, n, K, tile);
    else
      dequant_rows_noglobal(lut, codes, scales, n, K, tile);
  }
  const float* a[kDotTokens];
  int64_t pos_of[kDotTokens];
  int m = 0;
  auto flush = [&] {
    if (m == 0) return;
    if (fused && mx)
      mxfp4_dot_rows_tokens(lut, a, m, codes, scales, n, K, s.dots.data(), kTileRows, tile);
    else if (fused)
      nvfp4_dot_rows_tokens(lut, a, m, codes, scales, n, K, s.dots.data(), kTileRows, tile);
    else
      dot_rows_tokens(a, m, tile, n, K, s.dots.data(), kTileRows);
    for (int t = 0; t < m; ++t) emit(pos_of[t], s.dots.data() + t * kTileRows);
    m = 0;
  };
  for (int64_t pos = begin; pos < end; ++pos) {
    if (!mx && packed(pos)) continue;
    a[m] = act(pos);
    pos_of[m++] = pos;
    if (m == kDotTokens) flush();
  }
  flush();
}

}  // namespace

void run_routed_experts(const MoeConfig& cfg, const ExpertWeights& w, const float* a_values,
                        const float* a_g, const ExpertPair* pairs, int64_t n_pairs,
                        const float* l2_static_g, float* o, WorkerPool& pool) {
  const int64_t H = cfg.hidden, I = cfg.intermediate, E = w.count;
  NVFP4_CHECK(w.hidden == H && w.intermediate == I, "routed experts: weights are H=", w.hidden,
              " I=", w.intermediate, ", config H=", H, " I=", I);
  // MXFP4 has no global scale: the weight's factor in alpha is 1.
  const bool mx = w.format == ExpertFormat::Mxfp4;
  const int64_t B = w.scale_block();
  if (n_pairs == 0) return;
  const ExpertGroups groups = group_by_expert(pairs, n_pairs, E);
  const E2m1PairTable lut;
  const int workers = pool.size();
  std::vector<Scratch> scratch(static_cast<size_t>(workers));
  std::vector<IntActRow> rowbuf(static_cast<size_t>(workers));  // packed(pos)'s answer, per worker
  for (auto& s : scratch) s.dots.resize(size_t(kTileRows * std::max(kDotTokens, kIntDotTokens)));

  // NVFP4 activations with NVFP4 weights take the exact integer dots: the
  // activation rows are packed once (x per token, h per pair).
  const bool int_path = !mx && cfg.activation == ActivationMode::Nvfp4;
  IntActRows a_packed, h_packed;
  if (int_path) {
    int64_t rows = 0;
    for (int64_t p = 0; p < n_pairs; ++p) rows = std::max<int64_t>(rows, int64_t(pairs[p].row) + 1);
    a_packed.resize(rows, H);
    h_packed.resize(n_pairs, I);
    run_items(rows, pool, [&](int64_t r, int) { pack_int_act_row(a_values + r * H, H, a_packed, r); });
  }

  // 1. gate/up = a . W13^T, [pairs (sorted), 2I]: rows [0, I) gate, [I, 2I) up.
  std::vector<float> gateup(static_cast<size_t>(n_pairs * 2 * I));
  const std::vector<TileItem> l1_items = tile_items(groups, E, 2 * I);
  run_tiles(int64_t(l1_items.size()), pool, [&](int64_t item, int worker) {
    const TileItem it = l1_items[size_t(item)];
    const int64_t e = it.expert, n = std::min(kTileRows, 2 * I - it.row0);
    const uint8_t* codes = w.w13_codes.data() + (e * 2 * I + it.row0) * (H / 2);
    const uint8_t* scales = w.w13_scales.data() + (e * 2 * I + it.row0) * (H / B);
    const float g_gate = mx ? 1.0f : w.w13_global[size_t(2 * e)], g_up = mx ? 1.0f : w.w13_global[size_t(2 * e + 1)];
    tile_item_dots(
        lut, w.format, codes, scales, n, H, groups.offsets[size_t(e)], groups.offsets[size_t(e + 1)], scratch[size_t(worker)],
        [&](int64_t pos) { return a_values + int64_t(pairs[groups.pair[size_t(pos)]].row) * H; },
        [&](int64_t pos) -> const IntActRow* {
          const int64_t row = pairs[groups.pair[size_t(pos)]].row;
          if (!int_path || !a_packed.exact[size_t(row)]) return nullptr;
          rowbuf[worker] = a_packed.row(row);
          return &rowbuf[worker];
        },
        [&](int64_t pos, const float* d) {
          const int64_t row = pairs[groups.pair[size_t(pos)]].row;
          float* out = gateup.data() + pos * 2 * I + it.row0;
          for (int64_t r = 0; r < n; ++r) out[r] = d[r] * (a_g[row] * (it.row0 + r < I ? g_gate : g_up));
        });
  });

  // 2. h = swiglu(gate, up), then staged per the activation mode: NVFP4 QDQ
  //    per (token, expert) row (dynamic) or with the expert's static
  //    input_scale, BF16, or DeepSeek's FP8.
  const bool has_limit = cfg.swiglu_limit.has_value();
  const float limit = cfg.swiglu_limit.value_or(0.0f);
  std::vector<float> h_values(static_cast<size_t>(n_pairs * I)), h_g(static_cast<size_t>(n_pairs));
  // One item per 8 pairs, or per pair at decode (6 pairs: one item kept
  // both cores' share, ~0.25 ms of SwiGLU and QDQ, on one core).
  const int64_t chunk = n_pairs < 8 * pool.size() ? 1 : 8;
  run_items((n_pairs + chunk - 1) / chunk, pool, [&](int64_t c, int) {
    std::vector<float> h(static_cast<size_t>(I));
    for (int64_t pos = c * chunk; pos < std::min(n_pairs, (c + 1) * chunk); ++pos) {
      const float* gu = gateup.data() + pos * 2 * I;
      for (int64_t i = 0; i < I; ++i) h[size_t(i)] = swiglu(gu[i], gu[I + i], has_limit, limit);
      const int64_t e = pairs[groups.pair[size_t(pos)]].expert;
      stage_activation_rows(cfg.activation, h.data(), 1, I, l2_static_g ? l2_static_g + e : nullptr, 0,
                            h_values.data() + pos * I, h_g.data() + pos);
      if (int_path) pack_int_act_row(h_values.data() + pos * I, I, h_packed, pos);
    }
  });

  // 3. o = QDQ(h) . W2^T, [pairs, H], written at the ORIGINAL pair index.
  const std::vector<TileItem> l2_items = tile_items(groups, E, H);
  run_tiles(int64_t(l2_items.size()), pool, [&](int64_t item, int worker) {
    const TileItem it = l2_items[size_t(item)];
    const int64_t e = it.expert, n = std::min(kTileRows, H - it.row0);
    const uint8_t* codes = w.w2_codes.data() + (e * H + it.row0) * (I / 2);
    const uint8_t* scales = w.w2_scales.data() + (e * H + it.row0) * (I / B);
    const float g_w = mx ? 1.0f : w.w2_global[size_t(e)];
    tile_item_dots(
        lut, w.format, codes, scales, n, I, groups.offsets[size_t(e)], groups.offsets[size_t(e + 1)], scratch[size_t(worker)],
        [&](int64_t pos) { return h_values.data() + pos * I; },
        [&](int64_t pos) -> const IntActRow* {
          if (!int_path || !h_packed.exact[size_t(pos)]) return nullptr;
          rowbuf[worker] = h_packed.row(pos);
          return &rowbuf[worker];
        },
        [&](int64_t pos, const float* d) {
          float* out = o + int64_t(groups.pair[size_t(pos)]) * H + it.row0;
          for (int64_t r = 0; r < n; ++r) out[r] = d[r] * (h_g[size_t(pos)] * g_w);
        });
  });
}

void run_routed_experts(const MoeConfig& cfg, const ExpertWeights& w, const float* a_values,
                        const float* a_g, const ExpertPair* pairs, int64_t n_pairs,
                        const float* l2_static_g, float* o, int threads) {
  WorkerPool pool(threads);
  run_routed_experts(cfg, w, a_values, a_g, pairs, n_pairs, l2_static_g, o, pool);
}

}  // namespace nvfp4moe::cpu

// The expert compute of one expert-parallel rank: the pairs in its receive
// area (already-quantized tokens, LOCAL expert ids, routing weights) through
// its slice of the routed experts, and the shared expert on its own tokens.
//
// Input (receive area, see ep_index.hpp): per row the token's packed codes
// [H/2], linear UE4M3 scales [H/16] and global scale g (the L1 alpha factor),
// its LOCAL expert and weight w_j; the live row count is on the device.
// Output: w_j * o_e per row as FP32 [capacity, H], which the combine pushes
// to the token's rank.
//
// run(): the CUDA backend's grouped GEMMs (run_expert_gemm: decode or wgmma
// kernel, chosen on the device) behind their plan — the receive rows are its "tokens"
// (top_k 1, identity pair map), scheduled from this rank's expert offsets; the L2 input is
// requantized with the backend's stage_requantized_rows (spec 2 bytes, dynamic per
// row or static per expert).
// run_ref(): the scalar reference (`*_ref` in the house style): one thread
// per output element, FP32 sums, exact dequantization; tests compare both.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/layout/operand_order.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::ep {

struct EpComputeArgs {
  const uint8_t* codes = nullptr;   // [capacity, H/2]
  const uint8_t* scales = nullptr;  // [capacity, H/16] linear
  const float* g = nullptr;         // [capacity]
  const int32_t* expert = nullptr;  // [capacity] LOCAL ids
  const float* weight = nullptr;    // [capacity] w_j
  const int32_t* offsets = nullptr; // device [local_experts + 1]: rows of each expert (clipped)
  const int32_t* total = nullptr;   // device: live rows
  int32_t capacity = 0;             // rows this forward can have (its launches and GEMM choice), <= the built capacity
  float* out = nullptr;             // [capacity, H]
};

// Where the dispatch's placement writes the expert GEMMs' work list (tiles
// of at most kGemmTileTokens receive rows of one expert) and its length;
// null tiles: no list (nothing reads one).
struct EpTileSink {
  cuda::GemmTile* tiles = nullptr;
  int32_t* num_tiles = nullptr;
};

class EpLocalExperts {
 public:
  // `slice` holds this rank's experts, indexed locally.
  EpLocalExperts(const ExpertWeights& slice, const MoeConfig& config, int32_t capacity);
  // run() reads the work list that the dispatch wrote into tile_sink().
  void run(const EpComputeArgs& args, cudaStream_t stream);
  void run_ref(const EpComputeArgs& args, cudaStream_t stream);

  int64_t local_experts() const { return count_; }
  EpTileSink tile_sink() { return EpTileSink{reinterpret_cast<cuda::GemmTile*>(tiles_.get()), num_tiles_.get()}; }

 private:
  // A forward's capacity (its launches and GEMM choice) is within the one this was built for.
  void check_capacity(const EpComputeArgs& a) const;
  void requantize_h(const EpComputeArgs& a, int64_t deq_ld, cuda::OperandOrder order, cudaStream_t stream);

  int64_t count_ = 0, hidden_ = 0, inter_ = 0;
  int32_t capacity_ = 0;
  std::optional<float> limit_;
  // linear layout (reference path)
  cuda::DeviceBuffer<uint8_t> w13_codes_, w13_scales_, w2_codes_, w2_scales_;
  cuda::DeviceBuffer<float> w13_global_, w2_global_, w2_static_g_;
  // the grouped GEMM's tile layout and operands
  cuda::DeviceBuffer<uint8_t> w13_tiles_, w2_tiles_;  // tile layout, only where the fragment layout does not fit
  cuda::FragmentWeightsDevice w13_frag_, w2_frag_;          // fragment layout (decode and wgmma kernels)
  int64_t ld_act_ = 0, ld_h_deq_ = 0;
  cuda::DeviceBuffer<__nv_bfloat16> act_;       // [capacity, ld_act] value(q)*s of the received tokens
  cuda::DeviceBuffer<int32_t> identity_;        // [capacity] row -> row (the plan's pair map)
  cuda::DeviceBuffer<uint8_t> tiles_;           // GemmTile [max_tiles]
  cuda::DeviceBuffer<int32_t> num_tiles_;       // [1]
  cuda::DeviceBuffer<float> h_, h_g_;           // [capacity, I], [capacity]
  cuda::DeviceBuffer<__nv_bfloat16> h_deq_;     // [capacity, ld_h_deq] value(q)*s of QDQ(h)
};

// Shared expert on the token's own rank, on the unquantized x.
// run(): the CUDA backend's shared_expert_forward (cuBLAS BF16 GEMMs, FP32
// accumulation; x rounded to BF16 first as the backend does).
// run_ref(): scalar FP32 reference.
class EpSharedExpert {
 public:
  EpSharedExpert(const SharedExpertWeights& w, const MoeConfig& config, int32_t max_tokens);
  bool present() const { return inter_ > 0; }
  // x [tokens, H] (bf16 or f32, device) -> out [tokens, H] f32.
  void run(const void* x, bool x_is_bf16, int32_t tokens, float* out, cudaStream_t stream);
  void run_ref(const void* x, bool x_is_bf16, int32_t tokens, float* out, cudaStream_t stream);

 private:
  int64_t hidden_ = 0, inter_ = 0;
  std::optional<float> limit_;
  cuda::DeviceBuffer<__nv_bfloat16> w13_, w2_;  // [2*Is, H] gate rows then up rows; [H, Is]
  cuda::DeviceBuffer<float> h_;                 // [max_tokens, Is] (reference)
  std::unique_ptr<cuda::CublasHandle> cublas_;
  cuda::DeviceBuffer<uint8_t> cublas_ws_;
  cuda::DeviceBuffer<__nv_bfloat16> xb_, hb_;   // [max_tokens, H], [max_tokens, Is]
  cuda::DeviceBuffer<float> gate_up_;           // [max_tokens, 2*Is]
};

}  // namespace nvfp4moe::ep

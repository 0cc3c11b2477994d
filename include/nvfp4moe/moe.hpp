// nvfp4moe — the DeepSeek-V4 NVFP4 MoE layer (docs/numerics.md §5): configuration,
// weights in the project's own layout, the forward contract every front end
// implements (MoeLayer), and Moe, whose backend (cpu, cuda) is chosen at run time.
//
// Expert ids are GLOBAL (0..E-1) in every routing tensor; a Moe built for an
// expert-parallel rank holds only experts [first_expert, first_expert + count)
// and indexes its weights LOCALLY (global - first_expert).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "nvfp4moe/types.hpp"

namespace nvfp4moe {

enum class Scoring : uint8_t { SqrtSoftplus, Sigmoid, Softmax };
enum class InputScaleMode : uint8_t { Dynamic, Static };
enum class Backend : uint8_t { Cpu, Cuda };

// The routed experts' weight format (docs/numerics.md §7): ModelOpt's NVFP4
// (UE4M3 scales per 16, a global scale per projection), or DeepSeek's MXFP4
// (UE8M0 scales per 32, no global scale).
enum class ExpertFormat : uint8_t { Nvfp4, Mxfp4 };
// How the routed experts' inputs x (L1) and h (L2) enter their GEMMs
// (docs/numerics.md §7): Nvfp4 QDQ per §2; Bf16 rounded to BF16, otherwise
// unquantized (W4A16, as Marlin); Fp8 rounded to BF16, then E4M3 with one
// power-of-two scale per 128 values, as DeepSeek's inference code quantizes
// them for its FP4 experts (act_quant, scale_fmt "ue8m0").
enum class ActivationMode : uint8_t { Nvfp4, Bf16, Fp8 };
const char* expert_format_name(ExpertFormat f);      // "NVFP4" | "MXFP4"
const char* activation_mode_name(ActivationMode m);  // "nvfp4" | "bf16" | "fp8"
ActivationMode parse_activation_mode(const std::string& s);  // the names above; throws otherwise

const char* backend_name(Backend b);
Backend parse_backend(const std::string& s);  // "cpu" | "cuda"; throws otherwise
bool cuda_available();                        // built with CUDA and a device present

struct MoeConfig {
  int64_t hidden = 0;           // H
  int64_t intermediate = 0;     // I, per routed expert
  int64_t experts = 0;          // E, routed experts (global count)
  int64_t top_k = 0;            // k
  int64_t shared_experts = 0;   // n_s: 0 or 1
  int64_t shared_intermediate = 0;  // 0 -> intermediate * shared_experts
  float routed_scaling_factor = 1.0f;  // rho, from the model config
  std::optional<float> swiglu_limit;   // L; none -> no clamp
  bool hash_routed = false;            // this layer routes by tid2eid[token_id]
  Scoring scoring = Scoring::SqrtSoftplus;
  bool norm_topk_prob = true;          // w_j = rho * s_j / sum s (docs/numerics.md §5); false: rho * s_j
  InputScaleMode l1_input = InputScaleMode::Dynamic;  // x: per token, or static input_scale
  InputScaleMode l2_input = InputScaleMode::Dynamic;  // h: per (token, expert) row, or static
  ActivationMode activation = ActivationMode::Nvfp4;  // routed experts' x and h; static scales need Nvfp4

  int64_t shared_inter() const { return shared_intermediate ? shared_intermediate : intermediate * shared_experts; }
  // Throws naming the field and value (H, I multiples of 16; 1 <= k <= E; a
  // static input scale with an activation mode other than nvfp4; ...).
  void validate() const;
};

// Published geometries (rho must still come from the model's config; these
// carry 1.5, the published value, for synthetic models only).
MoeConfig dsv4_pro_config();
MoeConfig dsv4_flash_config();
MoeConfig small_demo_config();  // a small DeepSeek-V4-shaped layer for the CPU demo

// Routed experts in the project's layout (that of vLLM's ModelOptNvFp4FusedMoE):
// experts [first_expert, first_expert + count), indexed locally. B, the
// scale block, is 16 for NVFP4 and 32 for MXFP4.
struct ExpertWeights {
  ExpertFormat format = ExpertFormat::Nvfp4;
  int64_t count = 0;          // local experts held
  int64_t first_expert = 0;   // global id of local expert 0
  int64_t hidden = 0, intermediate = 0;
  std::vector<uint8_t> w13_codes;   // [count, 2I, H/2]: rows 0..I-1 gate (W1), I..2I-1 up (W3)
  std::vector<uint8_t> w13_scales;  // [count, 2I, H/B] linear: UE4M3 (NVFP4) or UE8M0 (MXFP4) bit patterns
  std::vector<float> w13_global;    // NVFP4 [count, 2]: g of gate, g of up (weight_scale_2); MXFP4 empty
  std::vector<uint8_t> w2_codes;    // [count, H, I/2] (down, W2)
  std::vector<uint8_t> w2_scales;   // [count, H, I/B]
  std::vector<float> w2_global;     // NVFP4 [count]; MXFP4 empty
  std::vector<float> w13_input_scale;  // NVFP4: [count] static g of x (checkpoint input_scale), or empty
  std::vector<float> w2_input_scale;   // NVFP4: [count] static g of h, or empty

  int64_t scale_block() const { return format == ExpertFormat::Mxfp4 ? 32 : 16; }
  // Throws naming the tensor and expert if a size is off, a global scale is
  // NaN/Inf/non-positive, (NVFP4) a block-scale byte is not UE4M3 (0x7F/0xFF
  // NaN, or its sign bit set; one pass over the scales), or (MXFP4) global or
  // input scales are present or a UE8M0 byte is NaN or overflows
  // (check_mxfp4_scales).
  void validate() const;
  // A rank's slice: experts [first, first + n) as a new ExpertWeights.
  ExpertWeights slice(int64_t first, int64_t n) const;
};

struct RouterWeights {
  std::vector<float> gate;         // [E, H] router weight (FP32 copy)
  std::vector<float> bias;         // [E] e_score_correction_bias; empty = zeros
  std::vector<int32_t> tid2eid;    // [vocab, k] for hash-routed layers; else empty
  int64_t vocab = 0;
};

// How the shared expert's weights are held: unquantized BF16, or FP8 E4M3
// with one FP32 dequantization factor per 128x128 tile (DeepSeek's block-scaled
// FP8: the checkpoint's F8_E8M0 `scale` byte b as 2^(b - 127), or its F32
// `weight_scale_inv`). Either way x enters unquantized and the math is FP32.
enum class SharedExpertFormat : uint8_t { Bf16, Fp8Block };

struct SharedExpertWeights {  // empty when n_s == 0
  static constexpr int64_t kFp8Tile = 128;  // rows and columns of one FP8 scale tile
  SharedExpertFormat format = SharedExpertFormat::Bf16;  // which fields below hold the weights
  std::vector<Bf16> w1, w3;   // Bf16: [Is, H] gate, up
  std::vector<Bf16> w2;       // Bf16: [H, Is] down
  std::vector<uint8_t> w1_fp8, w3_fp8;    // Fp8Block: [Is, H] gate, up, float8_e4m3fn bit patterns
  std::vector<uint8_t> w2_fp8;            // Fp8Block: [H, Is] down
  std::vector<float> w1_scale, w3_scale;  // Fp8Block: [ceil(Is/128), ceil(H/128)] row-major; element
                                          //   (n, k) is e4m3(w[n, k]) * scale[n / 128, k / 128] in FP32
  std::vector<float> w2_scale;            // Fp8Block: [ceil(H/128), ceil(Is/128)]

  // Throws naming the field and the sizes when the fields of `format` do not
  // hold [Is, H] / [H, Is] weights (and their tile scales), or a tile scale is
  // not finite and > 0.
  void validate(int64_t hidden, int64_t shared_inter) const;
};

struct MoeWeights {
  MoeConfig config;
  ExpertWeights experts;
  RouterWeights router;
  SharedExpertWeights shared;
};

// A synthetic DeepSeek-V4-structured layer: deterministic random weights from
// `seed`, quantized to NVFP4 (per-tensor global scales), router and shared
// expert included. `unquantized_out`, if given, receives the FP32 weights
// before quantization as another MoeWeights-shaped set (for error reports).
//
// Every tensor is generated from (seed, tensor, expert, row) alone, so one
// expert's dense weights can be regenerated without the others
// (synthetic_expert_dense) and generation is multithreaded yet deterministic.
// Values are ~N(0, 1/fan_in) with rare x8 outliers; the router gate is
// ~N(0, 1/H), the correction bias uniform in [-0.05, 0.05); w13/w2 input
// scales are set for activations of amax ~6 / ~10. Hash-routed configs get a
// tid2eid of kSyntheticVocab rows of k distinct experts. Memory stays bounded
// to one expert's dense weights per generation step (DeepSeek-V4-Pro: 14 GB of
// NVFP4 experts, never all dense at once) unless `dense` asks for all of them.
struct SyntheticDense {
  std::vector<float> w1, w3, w2;   // [E, I, H], [E, I, H], [E, H, I]
};
MoeWeights make_synthetic_moe(const MoeConfig& cfg, uint64_t seed, SyntheticDense* dense = nullptr);

// The same layer with its routed experts generated and quantized on the
// current CUDA device, one expert at a time (DeepSeek-V4-Pro in seconds
// rather than minutes on the host): the generator's values are the same
// bits, and the GPU quantizer is the host's formula (docs/numerics.md §2), so
// the result equals make_synthetic_moe's. Throws in a build without CUDA.
MoeWeights make_synthetic_moe_cuda(const MoeConfig& cfg, uint64_t seed);

constexpr int64_t kSyntheticVocab = 4096;

// The FP32 weights of expert `e` before quantization (w1, w3 [I, H]; w2 [H, I]).
struct SyntheticExpertDense {
  std::vector<float> w1, w3, w2;
};
SyntheticExpertDense synthetic_expert_dense(const MoeConfig& cfg, uint64_t seed, int64_t expert);

// Deterministic hidden states [T, H] ~N(0, 1) with rare x8 outliers (demo input).
std::vector<float> synthetic_hidden_states(const MoeConfig& cfg, uint64_t seed, int64_t tokens);

// Caller-supplied routing (skips the router) and router inputs.
struct RoutingArgs {
  TensorView topk_ids;      // [T, k] int32 or int64, GLOBAL ids or -1; ndim 0 = run the router
  TensorView topk_weights;  // [T, k] f32 (with topk_ids)
  TensorView token_ids;     // [T] int32 or int64, for hash-routed layers
};

struct ForwardOutputs {
  TensorView y;             // [T, H] bf16, required
  TensorView topk_ids;      // [T, k] int32, optional (ndim 0 = not wanted)
  TensorView topk_weights;  // [T, k] f32, optional
};

struct MoeOptions {
  Backend backend = Backend::Cpu;
  int threads = 0;              // cpu: 0 = all cores
  int device = 0;               // cuda: device ordinal
  int64_t max_tokens = 8192;    // cuda: capacity of the forward's buffers
  bool checked = false;         // cuda: synchronise after each forward and report the error word
  // cuda: run the routed experts' prefill GEMM on FP8 tensor cores where the
  // activation mode is fp8 and every expert's weight rows are E4M3 values
  // times a power of two (docs/numerics.md §8). Off by default: on the H200
  // that form measures slower than the BF16 one today (docs/performance.md).
  bool fp8_mma = false;
};

// Errors the device records without a host synchronisation (docs/numerics.md
// §6), read by sync_errors().
enum ErrorBits : uint32_t {
  kErrExpertIdOutOfRange = 1u << 0,
  kErrCapacity = 1u << 1,
};

// The options of one forward, the same for every front end.
struct ForwardOptions {
  // cuda: the cudaStream_t the forward is queued on (nullptr: the default
  // stream); no host synchronisation unless the layer was built `checked`.
  void* stream = nullptr;
  // Expert parallelism over NCCL: the most tokens any rank passes in THIS
  // forward, the same value on every rank (in vLLM, the max of
  // num_tokens_across_dp); launches and the expert GEMMs' choice are sized by
  // it instead of by the largest batch the layer was built for. 0: that
  // largest batch. Other front ends take 0 or any value >= T (no effect).
  int64_t max_tokens_any_rank = 0;
};

// A batch on the host for forward_host. Routing left empty (nullopt) runs
// the layer's router; token_ids feed a hash-routed layer's router.
struct HostBatch {
  std::span<const float> x;                              // [tokens, H] row-major
  int64_t tokens = 0;
  std::optional<std::span<const int32_t>> topk_ids;      // [tokens, k] GLOBAL ids, or -1
  std::optional<std::span<const float>> topk_weights;    // [tokens, k], with topk_ids
  std::optional<std::span<const int32_t>> token_ids;     // [tokens]
};
struct HostResult {
  std::vector<float> y;               // [tokens, H]: the values of the BF16 output
  std::vector<int32_t> topk_ids;      // [tokens, k]: the routing used (GLOBAL ids, -1)
  std::vector<float> topk_weights;    // [tokens, k]
};

// The forward contract of every MoE front end: Moe (one device, cpu or
// cuda), CpuEpMoe (expert parallelism on the CPU), EpCudaEmulation and
// NcclEpMoe (expert parallelism on GPUs; ep.hpp, ep_cuda.hpp).
//
//   forward(x, routing, out, options): y = MoE(x). x: [T, H] bf16 or f32;
//     routing: the caller's topk ids/weights, or none (the layer's router,
//     with token_ids for a hash-routed layer); out.y [T, H] bf16 and,
//     optionally, the routing used. Every tensor on the layer's device().
//     Bad shapes, dtypes, devices or capacities throw before any work; on
//     a GPU, bad expert ids are skipped and recorded for sync_errors().
//   sync_errors(): synchronises and throws naming what the device recorded
//     since the last call (e.g. an expert id outside [-1, E)), clearing it.
//   forward_host(batch): the host convenience of all of them: copies the
//     batch to the layer's device, runs forward, copies back, synchronises
//     and reports errors.
class MoeLayer {
 public:
  virtual ~MoeLayer() = default;
  virtual const MoeConfig& config() const = 0;
  virtual DeviceKind device() const = 0;
  virtual int device_index() const { return 0; }
  virtual void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
                       const ForwardOptions& options = {}) = 0;
  virtual void sync_errors() = 0;
  HostResult forward_host(const HostBatch& batch);
};

class MoeBackendImpl;  // src/: one per backend

// One MoE layer on one device, its backend (cpu, cuda) chosen at run time.
class Moe final : public MoeLayer {
 public:
  Moe(MoeWeights weights, const MoeOptions& options);
  ~Moe() override;
  Moe(Moe&&) noexcept;
  Moe& operator=(Moe&&) noexcept;

  const MoeConfig& config() const override;
  Backend backend() const;
  // The tensor-core form of the routed experts' prefill GEMM, chosen at
  // load: "fp8", "bf16", "bf16 (<why not fp8>)" (fp8 activations whose
  // weights do not allow it), or "none" (the CPU backend).
  std::string prefill_mma() const;
  DeviceKind device() const override;
  int device_index() const override;
  void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
               const ForwardOptions& options = {}) override;
  void sync_errors() override;

 private:
  std::unique_ptr<MoeBackendImpl> impl_;
};

}  // namespace nvfp4moe

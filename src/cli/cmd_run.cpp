// `nvfp4moe run`: one MoE layer of a model directory on inputs from a
// safetensors file; writes the output (temp name + rename, so a failed run
// leaves an earlier output file intact).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/ep.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cli {

namespace {

void print_usage() {
  std::printf(
      "usage: nvfp4moe run --model DIR --layer L --input X.safetensors --output Y.safetensors\n"
      "                    [--device cpu|cuda] [--ep R] [--threads N] [--static-input-scales] [--mtp]\n"
      "DIR: either checkpoint layout (DeepSeek's layers.L.ffn.* or Hugging Face's model.layers.L.mlp.*);\n"
      "--mtp: L is an MTP block (mtp.L.ffn.*). Layers whose routed experts are not NVFP4 are refused.\n"
      "X: hidden_states [T, H] bf16|f32; optional token_ids [T] int32|int64 (required for hash-routed\n"
      "layers unless routing is given); optional topk_ids [T, k] int32|int64 + topk_weights [T, k] f32\n"
      "(GLOBAL ids or -1; the router is skipped). Y: output [T, H] bf16, topk_ids [T, k] int32,\n"
      "topk_weights [T, k] f32. --ep R runs R expert-parallel ranks emulated on the CPU, or with\n"
      "--device cuda R processes, one per GPU, over NCCL symmetric memory (docs/ep.md).\n");
}

// A tensor of the input file copied into an aligned, owned buffer (the
// mapped data need not be aligned for its dtype).
struct OwnedTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint64_t> storage;  // 8-byte aligned
  TensorView view() {
    TensorView v;
    v.data = storage.data();
    v.dtype = dtype;
    v.ndim = int(shape.size());
    int64_t stride = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[size_t(d)] = shape[size_t(d)];
      v.strides[size_t(d)] = stride;
      stride *= shape[size_t(d)];
    }
    return v;
  }
};

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// Reads `name` from the input file, checking dtype and rank; absent and not
// required -> nullopt-like (empty shape).
OwnedTensor read_input(const SafetensorsFile& f, const std::string& name, std::initializer_list<DType> dtypes,
                       size_t rank, bool required) {
  OwnedTensor t;
  const TensorInfo* info = f.find(name);
  if (!info) {
    NVFP4_CHECK(!required, f.path(), ": missing tensor \"", name, "\"");
    return t;
  }
  bool ok = false;
  std::string want;
  for (DType d : dtypes) {
    ok |= info->dtype == d;
    want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  NVFP4_CHECK(ok, f.path(), ": tensor \"", name, "\" has dtype ", dtype_name(info->dtype), ", expected ", want);
  NVFP4_CHECK(info->shape.size() == rank, f.path(), ": tensor \"", name, "\" has shape ", shape_text(info->shape),
              ", expected rank ", rank);
  t.dtype = info->dtype;
  t.shape = info->shape;
  t.storage.resize((info->nbytes + 7) / 8);
  if (info->nbytes) std::memcpy(t.storage.data(), info->data, info->nbytes);
  return t;
}

}  // namespace

int cmd_run(int argc, char** argv) {
  Args args(argc, argv, {"help", "static-input-scales", "mtp"});
  if (args.has("help")) {
    print_usage();
    return 0;
  }
  args.allow_only(
      {"help", "model", "layer", "input", "output", "device", "ep", "threads", "static-input-scales", "mtp"});
  const std::string model = args.require("model"), input = args.require("input"), output = args.require("output");
  const int layer = int(args.get_int("layer", -1));
  NVFP4_CHECK(args.has("layer") && layer >= 0, "--layer: a layer index >= 0 is required");
  const Backend device = parse_backend(args.get("device", "cpu"));
  const int ranks = int(args.get_int("ep", 1));
  const int threads = int(args.get_int("threads", 0));
  NVFP4_CHECK(ranks >= 1, "--ep must be >= 1, got ", ranks);
  // --ep with --device cuda: R GPU processes over NCCL (cmd_ep_cuda.cpp, docs/ep.md).
  if (args.has("ep") && device == Backend::Cuda) return cmd_run_ep_cuda(argc, argv);

  const ModelDir dir(model);
  LoadOptions lo;
  lo.static_l1_input = lo.static_l2_input = args.has("static-input-scales");
  lo.mtp = args.has("mtp");
  MoeWeights weights = load_moe_layer(dir, layer, lo);
  const MoeConfig cfg = weights.config;

  const SafetensorsFile in(input);
  OwnedTensor x = read_input(in, "hidden_states", {DType::BF16, DType::F32}, 2, true);
  NVFP4_CHECK(x.shape[1] == cfg.hidden, input, ": hidden_states has shape ", shape_text(x.shape),
              ", the layer has H=", cfg.hidden);
  const int64_t T = x.shape[0], k = cfg.top_k;
  OwnedTensor token_ids = read_input(in, "token_ids", {DType::I32, DType::I64}, 1, false);
  OwnedTensor topk_ids = read_input(in, "topk_ids", {DType::I32, DType::I64}, 2, false);
  OwnedTensor topk_weights = read_input(in, "topk_weights", {DType::F32}, 2, false);
  NVFP4_CHECK(topk_ids.shape.empty() == topk_weights.shape.empty(), input,
              ": topk_ids and topk_weights must be given together");
  NVFP4_CHECK(!cfg.hash_routed || !token_ids.shape.empty() || !topk_ids.shape.empty(), input, ": layer ", layer,
              " is hash-routed: tensor \"token_ids\" [T] is required (or topk_ids + topk_weights)");

  RoutingArgs routing;
  if (!token_ids.shape.empty()) routing.token_ids = token_ids.view();
  if (!topk_ids.shape.empty()) {
    routing.topk_ids = topk_ids.view();
    routing.topk_weights = topk_weights.view();
  }
  std::vector<uint8_t> y(static_cast<size_t>(T * cfg.hidden * 2));
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(static_cast<size_t>(T * k));
  ForwardOutputs out;
  out.y = make_view(y.data(), DType::BF16, {T, cfg.hidden});
  out.topk_ids = make_view(ids.data(), DType::I32, {T, k});
  out.topk_weights = make_view(wts.data(), DType::F32, {T, k});

  const auto t0 = std::chrono::steady_clock::now();
  if (ranks > 1) {
    CpuEpOptions eo;
    eo.threads = threads;
    CpuEpMoe ep(weights, ranks, eo);
    ep.forward(x.view(), routing, out);
  } else if (device == Backend::Cpu) {
    MoeOptions mo;
    mo.threads = threads;
    Moe moe(std::move(weights), mo);
    moe.forward(x.view(), routing, out);
  } else {
    // The CUDA backend takes device tensors; forward_host copies for us.
    MoeOptions mo;
    mo.backend = Backend::Cuda;
    mo.max_tokens = std::max<int64_t>(mo.max_tokens, T);
    Moe moe(std::move(weights), mo);
    std::vector<float> xf(static_cast<size_t>(T * cfg.hidden));
    const TensorView xv = x.view();
    for (size_t i = 0; i < xf.size(); ++i)
      xf[i] = xv.dtype == DType::F32 ? xv.ptr<float>()[i] : bf16_to_float(xv.ptr<Bf16>()[i]);
    std::vector<int32_t> tid, cids;
    std::vector<float> cw;
    auto as_i32 = [](const TensorView& v) {
      std::vector<int32_t> r(static_cast<size_t>(v.numel()));
      for (size_t i = 0; i < r.size(); ++i) r[i] = v.dtype == DType::I32 ? v.ptr<int32_t>()[i] : int32_t(v.ptr<int64_t>()[i]);
      return r;
    };
    if (routing.token_ids.ndim) tid = as_i32(routing.token_ids);
    if (routing.topk_ids.ndim) {
      cids = as_i32(routing.topk_ids);
      cw.assign(routing.topk_weights.ptr<float>(), routing.topk_weights.ptr<float>() + T * k);
    }
    HostBatch b{.x = xf, .tokens = T};
    if (!cids.empty()) {
      b.topk_ids = cids;
      b.topk_weights = cw;
    }
    if (!tid.empty()) b.token_ids = tid;
    HostResult r = moe.forward_host(b);
    Bf16* yb = reinterpret_cast<Bf16*>(y.data());
    for (size_t i = 0; i < r.y.size(); ++i) yb[i] = bf16_from_float(r.y[i]);  // exact: r.y holds BF16 values
    ids = std::move(r.topk_ids);
    wts = std::move(r.topk_weights);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  SafetensorsWriter w;
  w.add("output", DType::BF16, {T, cfg.hidden}, y.data());
  w.add("topk_ids", DType::I32, {T, k}, ids.data());
  w.add("topk_weights", DType::F32, {T, k}, wts.data());
  w.set_metadata("layer", std::to_string(layer));
  w.write(output);
  std::printf("layer %d: %lld tokens on %s%s in %.3f s -> %s\n", layer, (long long)T, backend_name(device),
              ranks > 1 ? (" (" + std::to_string(ranks) + " expert-parallel ranks)").c_str() : "", secs,
              output.c_str());
  return 0;
}

}  // namespace nvfp4moe::cli

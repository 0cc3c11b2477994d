// read_run_inputs (see run_inputs.hpp).
#include "cli/run_inputs.hpp"

#include <cstring>
#include <limits>

#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cli {

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// `name` checked for one of `dtypes` and `shape` (-1: any extent); null when
// absent and not required.
const TensorInfo* find_input(const SafetensorsFile& f, const std::string& name, std::initializer_list<DType> dtypes,
                             std::initializer_list<int64_t> shape, bool required) {
  const TensorInfo* info = f.find(name);
  if (!info) {
    NVFP4_CHECK(!required, f.path(), ": missing tensor \"", name, "\"");
    return nullptr;
  }
  bool ok = false;
  std::string want;
  for (DType d : dtypes) {
    ok |= info->dtype == d;
    want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  NVFP4_CHECK(ok, f.path(), ": tensor \"", name, "\" has dtype ", dtype_name(info->dtype), ", expected ", want);
  bool fits = info->shape.size() == shape.size();
  size_t i = 0;
  for (int64_t s : shape) {
    fits = fits && (s < 0 || info->shape[i] == s);
    ++i;
  }
  std::string expected = "[";
  for (int64_t s : shape) expected += (expected.size() > 1 ? ", " : "") + (s < 0 ? std::string("*") : std::to_string(s));
  NVFP4_CHECK(fits, f.path(), ": ", name, " has shape ", shape_text(info->shape), ", expected ", expected,
              "] (the layer's T x H, T x k)");
  return info;
}

std::vector<int32_t> int32_values(const TensorInfo& t, const std::string& file) {
  std::vector<int32_t> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::I32) {
      std::memcpy(&v[i], t.data + 4 * i, 4);
      continue;
    }
    int64_t x;
    std::memcpy(&x, t.data + 8 * i, 8);
    NVFP4_CHECK(x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max(), file,
                ": tensor \"", t.name, "\" element ", i, " is ", x, ", outside the int32 range");
    v[i] = int32_t(x);
  }
  return v;
}

template <typename T>
std::vector<T> rows_of(const std::vector<T>& v, int64_t begin, int64_t end, int64_t width) {
  if (v.empty()) return {};
  return std::vector<T>(v.begin() + begin * width, v.begin() + end * width);
}

}  // namespace

RunInputs read_run_inputs(const std::string& path, const MoeConfig& cfg, int layer) {
  const SafetensorsFile f(path);
  const int64_t H = cfg.hidden, k = cfg.top_k;
  const TensorInfo* x = find_input(f, "hidden_states", {DType::BF16, DType::F32}, {-1, H}, true);
  RunInputs in;
  in.tokens = x->shape[0];
  in.x = x->to_f32();
  const int64_t T = in.tokens;
  const TensorInfo* tok = find_input(f, "token_ids", {DType::I32, DType::I64}, {T}, false);
  const TensorInfo* ids = find_input(f, "topk_ids", {DType::I32, DType::I64}, {T, k}, false);
  const TensorInfo* wts = find_input(f, "topk_weights", {DType::F32}, {T, k}, false);
  NVFP4_CHECK(!ids == !wts, path, ": topk_ids and topk_weights must be given together");
  NVFP4_CHECK(!cfg.hash_routed || tok || ids, path, ": layer ", layer,
              " is hash-routed: tensor \"token_ids\" [T] is required (or topk_ids + topk_weights)");
  in.has_token_ids = tok != nullptr;
  in.caller_routing = ids != nullptr;
  if (tok) in.token_ids = int32_values(*tok, path);
  if (ids) {
    in.topk_ids = int32_values(*ids, path);
    in.topk_weights = wts->to_f32();
  }
  return in;
}

RunInputs RunInputs::rows(int64_t begin, int64_t end, int64_t hidden, int64_t k) const {
  RunInputs r;
  r.tokens = end - begin;
  r.has_token_ids = has_token_ids;
  r.caller_routing = caller_routing;
  r.x = rows_of(x, begin, end, hidden);
  r.token_ids = rows_of(token_ids, begin, end, 1);
  r.topk_ids = rows_of(topk_ids, begin, end, k);
  r.topk_weights = rows_of(topk_weights, begin, end, k);
  return r;
}

HostBatch RunInputs::batch() const {
  HostBatch b{.x = x, .tokens = tokens};
  if (caller_routing) {
    b.topk_ids = topk_ids;
    b.topk_weights = topk_weights;
  }
  if (has_token_ids) b.token_ids = token_ids;
  return b;
}

}  // namespace nvfp4moe::cli

// DeviceQuantizer (see device_quantizer.hpp).
#include "cuda/backend/device_quantizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/kernels/mxfp4_decode.hpp"
#include "cuda/kernels/staging.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

template <typename T>
void grow(DeviceBuffer<T>& b, size_t n) {
  if (b.size() < n) b = DeviceBuffer<T>(n);
}

// Checked before any member touches the driver.
int usable_device(int device) {
  NVFP4_CHECK(cuda_available(), "--device cuda: no CUDA device is available");
  return device;
}

}  // namespace

// The buffers of one group in flight. Each tensor's bytes start at a
// multiple of kAlign in the staging, the device copy and the outputs, so
// one copy moves a whole group and every row stays 16-byte aligned.
struct DeviceQuantizer::Slot {
  std::vector<GroupTensor> tensors;
  std::vector<size_t> x_at, codes_at, scales_at;
  size_t x_bytes = 0, codes_bytes = 0, scales_bytes = 0;
  PinnedBuffer x_host;    // the inputs
  PinnedBuffer out_host;  // codes [0, codes_bytes), then scales
  PinnedBuffer amax_host;
  DeviceBuffer<uint8_t> x, codes, scales;
  DeviceBuffer<unsigned> amax;
  CudaEvent uploaded{cudaEventDisableTiming}, amaxed{cudaEventDisableTiming},
      quantized{cudaEventDisableTiming}, downloaded{cudaEventDisableTiming};
};

namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Grows a pinned buffer to at least n bytes, to `hint` when that is more
// (the largest staging of any slot: the slots' groups alternate in size, a
// gate/up pair and a down projection, and pinning memory twice costs more
// than keeping it).
void grow_pinned(PinnedBuffer& b, size_t n, size_t hint) {
  if (b.size() < n) b = PinnedBuffer(std::max(n, hint));
}

}  // namespace

DeviceQuantizer::DeviceQuantizer(int device) : device_(usable_device(device)) {}

// A call answered from the cache may return with an upload still reading
// staging_: it must not be freed under the DMA (errors ignored, as in every
// owner's destructor).
DeviceQuantizer::~DeviceQuantizer() {
  for (const CudaEvent& e : half_done_) cudaEventSynchronize(e.get());
}

template <typename F>
void DeviceQuantizer::timed(Span what, cudaStream_t stream, F&& f) {
  if (!timing_) {
    f();
    return;
  }
  Timed& t = spans_.emplace_back(Timed{what, CudaEvent(), CudaEvent()});
  NVFP4_CUDA_CHECK(cudaEventRecord(t.begin.get(), stream));
  f();
  NVFP4_CUDA_CHECK(cudaEventRecord(t.end.get(), stream));
}

void DeviceQuantizer::enable_timing() {
  timing_ = true;
  times_ = {};
}

DeviceQuantizerTimes DeviceQuantizer::times() {
  DeviceGuard guard(device_);
  for (const CudaStream* s : {&upload_stream_, &stream_, &download_stream_})
    NVFP4_CUDA_CHECK(cudaStreamSynchronize(s->get()));
  for (const Timed& t : spans_) {
    float ms = 0.0f;
    NVFP4_CUDA_CHECK(cudaEventElapsedTime(&ms, t.begin.get(), t.end.get()));
    (t.what == Span::Upload ? times_.upload_ms : t.what == Span::Kernels ? times_.kernel_ms : times_.download_ms) += ms;
  }
  spans_.clear();
  return times_;
}

uint8_t* DeviceQuantizer::staging_half(size_t i) {
  if (staging_.size() == 0) staging_ = PinnedBuffer(2 * kStagingChunk);
  return staging_.get() + (i % 2) * kStagingChunk;
}

void DeviceQuantizer::wait_half(size_t i) {
  NVFP4_CUDA_CHECK(cudaEventSynchronize(half_done_[i % 2].get()));  // at once if never recorded
}

// On the quantizer's stream: the stream is non-blocking, so a copy on the
// legacy default stream would not be ordered before its kernels. Before
// the host writes chunk i into its half, that half's last copy (chunk
// i - 2's DMA, which ran while the host filled chunk i - 1, or an earlier
// call's) must have completed.
void DeviceQuantizer::upload_staged(const std::vector<ToDevice>& pieces) {
  size_t i = 0;
  for (const ToDevice& p : pieces)
    for (size_t at = 0; at < p.bytes; at += kStagingChunk, ++i) {
      const size_t n = std::min(kStagingChunk, p.bytes - at);
      uint8_t* half = staging_half(i);
      wait_half(i);
      std::memcpy(half, p.from + at, n);
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(p.to + at, half, n, cudaMemcpyHostToDevice, stream_.get()));
      NVFP4_CUDA_CHECK(cudaEventRecord(half_done_[i % 2].get(), stream_.get()));
    }
}

// One chunk's DMA ahead of the host: chunk i + 1 is queued into the other
// half before the host waits for chunk i. Queuing a DMA into a half needs
// no wait: an upload from it is earlier on the same stream, and a download
// into it (chunk i - 1) has been appended already.
void DeviceQuantizer::download_staged(const std::vector<ToHost>& pieces) {
  std::vector<ToHost> chunks;
  for (const ToHost& p : pieces)
    for (size_t at = 0; at < p.bytes; at += kStagingChunk)
      chunks.push_back({p.from + at, p.to, std::min(kStagingChunk, p.bytes - at)});
  const auto queue = [&](size_t i) {
    NVFP4_CUDA_CHECK(
        cudaMemcpyAsync(staging_half(i), chunks[i].from, chunks[i].bytes, cudaMemcpyDeviceToHost, stream_.get()));
    NVFP4_CUDA_CHECK(cudaEventRecord(half_done_[i % 2].get(), stream_.get()));
  };
  if (!chunks.empty()) queue(0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i + 1 < chunks.size()) queue(i + 1);
    wait_half(i);
    const uint8_t* half = staging_half(i);
    chunks[i].to->insert(chunks[i].to->end(), half, half + chunks[i].bytes);
  }
}

void DeviceQuantizer::upload(const TensorInfo& t) {
  if (t.name == x_name_ && t.data == x_src_) return;
  const int64_t n = t.numel();
  DeviceGuard guard(device_);
  x_bf16_ = t.dtype == DType::BF16;
  std::vector<float> f;  // F16 exactly, F64 rounded (beyond F32's range: Inf, refused)
  if (!x_bf16_) f = t.to_f32();
  const size_t bytes = size_t(n) * (x_bf16_ ? 2 : 4);
  grow(x_, bytes);
  const uint8_t* from = x_bf16_ ? t.data : reinterpret_cast<const uint8_t*>(f.data());
  timed(Span::Upload, stream_.get(), [&] { upload_staged({{from, x_.get(), bytes}}); });  // f may go then
  ++times_.uploads;
  times_.upload_bytes += bytes;
  x_name_ = t.name;
  x_src_ = t.data;
  x_amax_.reset();
}

void DeviceQuantizer::upload(const Mxfp4WeightView& w, bool decode) {
  const std::string& name = w.weight->name;
  const int64_t N = w.rows, K = w.cols;
  const bool scales = name != mx_scales_name_ || w.scales() != mx_scales_src_;
  const bool values = decode && !(name == x_name_ && w.codes() == x_src_);  // x_ holding w: so do mx_codes_
  const bool codes = values && (name != mx_codes_name_ || w.codes() != mx_codes_src_);
  DeviceGuard guard(device_);
  // Scale bytes and codes in one staged upload: the chunks of both pipelined.
  std::vector<ToDevice> pieces;
  if (scales) {
    grow(mx_scales_, size_t(N * K / 32));
    pieces.push_back({w.scales(), mx_scales_.get(), size_t(N * K / 32)});
  }
  if (codes) {
    grow(mx_codes_, size_t(N * K / 2));
    pieces.push_back({w.codes(), mx_codes_.get(), size_t(N * K / 2)});
  }
  if (!pieces.empty()) timed(Span::Upload, stream_.get(), [&] { upload_staged(pieces); });
  for (const ToDevice& p : pieces) times_.upload_bytes += p.bytes;
  if (scales) {
    mx_scales_name_ = name;
    mx_scales_src_ = w.scales();
  }
  if (codes) {
    ++times_.uploads;
    mx_codes_name_ = name;
    mx_codes_src_ = w.codes();
  }
  if (!values) return;
  grow(x_, size_t(N * K) * 2);
  timed(Span::Kernels, stream_.get(), [&] {
    mxfp4_decode_bf16(mx_codes_.get(), mx_scales_.get(), N, K, reinterpret_cast<__nv_bfloat16*>(x_.get()),
                      stream_.get());
  });
  x_bf16_ = true;
  x_name_ = name;
  x_src_ = w.codes();
  x_amax_.reset();
}

float DeviceQuantizer::uploaded_amax(const std::string& name, int64_t numel) {
  if (x_amax_) return *x_amax_;  // the plan asks first, quantize then checks the same tensor
  DeviceGuard guard(device_);
  timed(Span::Kernels, stream_.get(), [&] { tensor_abs_max(x_.get(), x_bf16_, numel, amax_.get(), stream_.get()); });
  unsigned bits = 0;
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(&bits, amax_.get(), sizeof bits, cudaMemcpyDeviceToHost, stream_.get()));
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  const float a = fmt::bits_to_float(bits);
  NVFP4_CHECK(fmt::is_finite(a), "tensor \"", name, "\" holds NaN or Inf; NVFP4 weights must be finite");
  x_amax_ = a;
  return a;
}

void DeviceQuantizer::queue_quantization(const uint8_t* x, bool bf16, int64_t N, int64_t K, float g, uint8_t* codes,
                                         uint8_t* scales) {
  QuantizeActArgs q;
  q.x = x;
  q.x_is_bf16 = bf16;
  q.rows = N;
  q.cols = K;
  q.scope = ActScope::Static;
  q.static_g = g;
  q.g_out = g_rows_.get();
  q.codes = codes;
  q.scales_linear = scales;
  stage_activations(q, stream_.get());
}

void DeviceQuantizer::quantize_uploaded(int64_t N, int64_t K, float g) {
  DeviceGuard guard(device_);
  grow(codes_, size_t(N * K / 2));
  grow(scales_, size_t(N * K / 16));
  grow(g_rows_, size_t(N));
  timed(Span::Kernels, stream_.get(),
        [&] { queue_quantization(x_.get(), x_bf16_, N, K, g, codes_.get(), scales_.get()); });
}

void DeviceQuantizer::download(std::vector<uint8_t>& codes, std::vector<uint8_t>& scales, int64_t N, int64_t K) {
  DeviceGuard guard(device_);
  const size_t n_codes = size_t(N * K / 2), n_scales = size_t(N * K / 16);
  NVFP4_CHECK(n_codes <= codes_.size() && n_scales <= scales_.size(), "DeviceQuantizer: download of [", N, ", ", K,
              "] beyond its buffers");
  // Reserved, not resized: the chunks are appended, so no byte is written twice.
  codes.clear();
  codes.reserve(n_codes);
  scales.clear();
  scales.reserve(n_scales);
  timed(Span::Download, stream_.get(),
        [&] { download_staged({{codes_.get(), &codes, n_codes}, {scales_.get(), &scales, n_scales}}); });
  times_.download_bytes += n_codes + n_scales;
}

float DeviceQuantizer::amax(const TensorInfo& t) {
  NVFP4_CHECK(t.shape.size() == 2, "tensor \"", t.name, "\": quantize takes 2-D tensors, got ", t.shape.size(), "-D");
  upload(t);
  return uploaded_amax(t.name, t.numel());
}

float DeviceQuantizer::amax(const Mxfp4WeightView& w) {
  upload(w, true);
  return uploaded_amax(w.weight->name, w.rows * w.cols);
}

int DeviceQuantizer::kmax(const Mxfp4WeightView& w) {
  upload(w, false);
  DeviceGuard guard(device_);
  timed(Span::Kernels, stream_.get(),
        [&] { mxfp4_max_scale_byte(mx_scales_.get(), w.rows * w.cols / 32, max_byte_.get(), stream_.get()); });
  unsigned b = 0;
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(&b, max_byte_.get(), sizeof b, cudaMemcpyDeviceToHost, stream_.get()));
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return b == 0 ? 0 : int(b) - 127;  // no non-zero byte: k_max 0, as the host's mxfp4_kmax
}

Nvfp4Tensor DeviceQuantizer::requantize(const Mxfp4WeightView& w, float g) {
  upload(w, true);  // no NaN to look for: read_mxfp4_weight refused the NaN scale byte
  Nvfp4Tensor t;
  t.g = g;
  t.blocks = w.rows * w.cols / 16;
  quantize_uploaded(w.rows, w.cols, g);
  download(t.codes, t.scales, w.rows, w.cols);
  return t;
}

Nvfp4Tensor DeviceQuantizer::cast_lossless(const Mxfp4WeightView& w, int m) {
  upload(w, true);
  Nvfp4Tensor t;
  t.g = std::ldexp(1.0f, m);  // as the host's cast: 2^m, subnormal for m < -126
  t.blocks = w.rows * w.cols / 16;
  // Every block by §2 under g (what the blocks out of E4M3's range get),
  // then the blocks within it take back their codes and the scale 2^delta.
  quantize_uploaded(w.rows, w.cols, t.g);
  DeviceGuard guard(device_);
  timed(Span::Kernels, stream_.get(), [&] {
    mxfp4_keep_exact_blocks(mx_codes_.get(), mx_scales_.get(), w.rows, w.cols, m, codes_.get(), scales_.get(),
                            exact_.get(), stream_.get());
  });
  unsigned long long exact = 0;
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(&exact, exact_.get(), sizeof exact, cudaMemcpyDeviceToHost, stream_.get()));
  download(t.codes, t.scales, w.rows, w.cols);
  t.exact_blocks = int64_t(exact);
  return t;
}

void DeviceQuantizer::set_slots(int slots) {
  NVFP4_CHECK(slots >= 1, "DeviceQuantizer: slots must be >= 1, got ", slots);
  slots_.clear();
  for (int i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>());
}

std::vector<uint8_t*> DeviceQuantizer::stage_group(int slot, const std::vector<GroupTensor>& group) {
  NVFP4_CHECK(slot >= 0 && size_t(slot) < slots_.size(), "DeviceQuantizer: slot ", slot, " of ", slots_.size());
  Slot& s = *slots_[size_t(slot)];
  s.tensors = group;
  s.x_at.clear();
  s.codes_at.clear();
  s.scales_at.clear();
  s.x_bytes = s.codes_bytes = s.scales_bytes = 0;
  for (const GroupTensor& t : group) {
    NVFP4_CHECK(t.rows >= 0 && t.cols >= 0 && t.cols % 16 == 0, "tensor \"", t.name, "\": quantize needs [N, K] with "
                "K a multiple of 16, got [", t.rows, ", ", t.cols, "]");
    const size_t n = size_t(t.rows * t.cols);
    s.x_at.push_back(s.x_bytes);
    s.codes_at.push_back(s.codes_bytes);
    s.scales_at.push_back(s.scales_bytes);
    s.x_bytes += aligned(n * (t.bf16 ? 2 : 4));
    s.codes_bytes += aligned(n / 2);
    s.scales_bytes += aligned(n / 16);
  }
  size_t hint = 0, out_hint = 0;
  for (const auto& o : slots_) {
    hint = std::max(hint, o->x_host.size());
    out_hint = std::max(out_hint, o->out_host.size());
  }
  DeviceGuard guard(device_);
  grow_pinned(s.x_host, s.x_bytes, hint);
  grow_pinned(s.out_host, s.codes_bytes + s.scales_bytes, out_hint);
  grow_pinned(s.amax_host, group.size() * sizeof(unsigned), 0);
  std::vector<uint8_t*> at;
  for (size_t j = 0; j < group.size(); ++j) at.push_back(s.x_host.get() + s.x_at[j]);
  return at;
}

std::vector<float> DeviceQuantizer::group_amaxes(int slot) {
  Slot& s = *slots_.at(size_t(slot));
  DeviceGuard guard(device_);
  grow(s.x, s.x_bytes);
  grow(s.amax, s.tensors.size());
  timed(Span::Upload, upload_stream_.get(), [&] { s.x.upload(s.x_host.get(), s.x_bytes, upload_stream_.get()); });
  NVFP4_CUDA_CHECK(cudaEventRecord(s.uploaded.get(), upload_stream_.get()));
  times_.uploads += int64_t(s.tensors.size());
  times_.upload_bytes += s.x_bytes;
  NVFP4_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), s.uploaded.get(), 0));
  timed(Span::Kernels, stream_.get(), [&] {
    for (size_t j = 0; j < s.tensors.size(); ++j)
      tensor_abs_max(s.x.get() + s.x_at[j], s.tensors[j].bf16, s.tensors[j].rows * s.tensors[j].cols,
                     s.amax.get() + j, stream_.get());
  });
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(s.amax_host.get(), s.amax.get(), s.tensors.size() * sizeof(unsigned),
                                   cudaMemcpyDeviceToHost, stream_.get()));
  NVFP4_CUDA_CHECK(cudaEventRecord(s.amaxed.get(), stream_.get()));
  NVFP4_CUDA_CHECK(cudaEventSynchronize(s.amaxed.get()));
  std::vector<float> a;
  for (size_t j = 0; j < s.tensors.size(); ++j) {
    unsigned bits = 0;
    std::memcpy(&bits, s.amax_host.get() + j * sizeof bits, sizeof bits);
    a.push_back(fmt::bits_to_float(bits));
    NVFP4_CHECK(fmt::is_finite(a.back()), "tensor \"", s.tensors[j].name,
                "\" holds NaN or Inf; NVFP4 weights must be finite");
  }
  return a;
}

void DeviceQuantizer::quantize_group(int slot, float g) {
  Slot& s = *slots_.at(size_t(slot));
  DeviceGuard guard(device_);
  grow(s.codes, s.codes_bytes);
  grow(s.scales, s.scales_bytes);
  int64_t rows = 0;
  for (const GroupTensor& t : s.tensors) rows = std::max(rows, t.rows);
  grow(g_rows_, size_t(rows));  // on stream_ like every kernel that writes it
  timed(Span::Kernels, stream_.get(), [&] {
    for (size_t j = 0; j < s.tensors.size(); ++j)
      queue_quantization(s.x.get() + s.x_at[j], s.tensors[j].bf16, s.tensors[j].rows, s.tensors[j].cols, g,
                         s.codes.get() + s.codes_at[j], s.scales.get() + s.scales_at[j]);
  });
  NVFP4_CUDA_CHECK(cudaEventRecord(s.quantized.get(), stream_.get()));
  NVFP4_CUDA_CHECK(cudaStreamWaitEvent(download_stream_.get(), s.quantized.get(), 0));
  timed(Span::Download, download_stream_.get(), [&] {
    s.codes.download(s.out_host.get(), s.codes_bytes, download_stream_.get());
    s.scales.download(s.out_host.get() + s.codes_bytes, s.scales_bytes, download_stream_.get());
  });
  times_.download_bytes += s.codes_bytes + s.scales_bytes;
  NVFP4_CUDA_CHECK(cudaEventRecord(s.downloaded.get(), download_stream_.get()));
}

DeviceQuantizer::GroupResult DeviceQuantizer::group_result(int slot, size_t j) {
  Slot& s = *slots_.at(size_t(slot));
  NVFP4_CHECK(j < s.tensors.size(), "DeviceQuantizer: tensor ", j, " of a group of ", s.tensors.size());
  DeviceGuard guard(device_);
  NVFP4_CUDA_CHECK(cudaEventSynchronize(s.downloaded.get()));
  return {s.out_host.get() + s.codes_at[j], s.out_host.get() + s.codes_bytes + s.scales_at[j]};
}

ConvertNumerics device_convert_numerics(std::shared_ptr<DeviceQuantizer> q) {
  return {[q](const Mxfp4WeightView& w) { return q->amax(w); }, [q](const Mxfp4WeightView& w) { return q->kmax(w); },
          [q](const Mxfp4WeightView& w, float g) { return q->requantize(w, g); },
          [q](const Mxfp4WeightView& w, int m) { return q->cast_lossless(w, m); }};
}

}  // namespace nvfp4moe::cuda

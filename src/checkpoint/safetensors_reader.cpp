// Reading safetensors: header validation (exposed for the fuzzer) and the
// memory-mapped, zero-copy file.
//
// Layout: u64 little-endian header length N, N bytes of JSON, then the data
// section. Every tensor's data_offsets [begin, end) are relative to the data
// section; like the reference implementation we require the tensors, sorted by
// begin, to tile the data section exactly (no gap, no overlap, nothing left
// over), so a corrupted offset cannot go unnoticed.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "checkpoint/dtypes.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

// Headers above this size are refused before parsing (the reference
// implementation's limit is 100 MB; real headers are well under 10 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> TensorInfo::to_f32() const {
  NVFP4_CHECK(dtypes::is_float_readable(dtype), "tensor ", name, ": dtype ", dtype_name(dtype),
              " cannot be read as floats (F32 F64 F16 BF16 F8_E4M3 F8_E5M2 F8_E8M0 F8_E4M3FNUZ F8_E5M2FNUZ only)");
  const int64_t n = numel();
  std::vector<float> out(static_cast<size_t>(n));
  if (dtype == DType::F32) {
    if (n) std::memcpy(out.data(), data, size_t(n) * 4);
    return out;
  }
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = dtypes::element_value(dtype, data, i);
  return out;
}

SafetensorsHeader parse_safetensors_header(const char* text, size_t len, uint64_t data_size,
                                           const std::string& file) {
  const std::string src = file + " header";
  json::Value root = json::parse(std::string_view(text, len), src);
  NVFP4_CHECK(root.is_object(), src, ": the header must be a JSON object, got ", json::kind_name(root.kind()));
  SafetensorsHeader h;
  for (const auto& [name, v] : root.members()) {
    if (name == "__metadata__") {
      for (const auto& [k, mv] : v.members(src + ": __metadata__"))
        h.metadata[k] = mv.as_string(src + ": __metadata__ value of \"" + k + "\"");
      continue;
    }
    const std::string what = src + ": tensor \"" + name + "\"";
    NVFP4_CHECK(v.is_object(), what, ": entry must be an object, got ", json::kind_name(v.kind()));
    const json::Value* dt = v.find("dtype");
    const json::Value* shape = v.find("shape");
    const json::Value* offs = v.find("data_offsets");
    NVFP4_CHECK(dt && shape && offs, what, ": entry needs dtype, shape and data_offsets");
    SafetensorsHeader::Entry e;
    e.name = name;
    try {
      e.dtype = parse_safetensors_dtype(dt->as_string(what + " dtype"));
    } catch (const Error& err) {
      NVFP4_FAIL(what, ": ", err.what());
    }
    for (const auto& d : shape->items(what + " shape")) e.shape.push_back(d.as_int(what + " shape entry"));
    const uint64_t bytes = dtypes::tensor_bytes(e.dtype, e.shape, what);
    const auto& o = offs->items(what + " data_offsets");
    NVFP4_CHECK(o.size() == 2, what, ": data_offsets must hold 2 numbers, got ", o.size());
    int64_t b = o[0].as_int(what + " data_offsets[0]"), en = o[1].as_int(what + " data_offsets[1]");
    NVFP4_CHECK(b >= 0 && en >= b, what, ": bad data_offsets [", b, ", ", en, ")");
    e.begin = uint64_t(b);
    e.end = uint64_t(en);
    NVFP4_CHECK(e.end <= data_size, what, ": data_offsets [", e.begin, ", ", e.end,
                ") lie outside the data section of ", data_size, " bytes");
    NVFP4_CHECK(e.end - e.begin == bytes, what, ": shape and dtype ", dtype_name(e.dtype), " need ", bytes,
                " bytes but data_offsets [", e.begin, ", ", e.end, ") hold ", e.end - e.begin);
    h.entries.push_back(std::move(e));
  }
  // The tensors must tile the data section.
  std::vector<const SafetensorsHeader::Entry*> order;
  for (const auto& e : h.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const SafetensorsHeader::Entry* prev = nullptr;
  for (const auto* e : order) {
    NVFP4_CHECK(e->begin >= at, src, ": tensor \"", e->name, "\" [", e->begin, ", ", e->end,
                ") overlaps tensor \"", prev ? prev->name : "", "\" [", prev ? prev->begin : 0, ", ",
                prev ? prev->end : 0, ")");
    NVFP4_CHECK(e->begin == at, src, ": bytes [", at, ", ", e->begin,
                ") of the data section belong to no tensor (gap before \"", e->name, "\")");
    at = e->end;
    prev = e;
  }
  NVFP4_CHECK(at == data_size, src, ": the data section has ", data_size, " bytes but the tensors cover only ",
              at);
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  NVFP4_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    NVFP4_FAIL(path, ": not a regular file");
  }
  size_ = uint64_t(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    NVFP4_FAIL(path, ": truncated safetensors file: ", size_, " bytes, the header length alone needs 8");
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    NVFP4_FAIL(path, ": mmap of ", size_, " bytes failed: ", std::strerror(map_errno));
  }
  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
    NVFP4_CHECK(header_len <= size_ - 8, path, ": truncated safetensors file: header length ", header_len,
                " runs beyond the file of ", size_, " bytes");
    NVFP4_CHECK(header_len <= kMaxHeaderBytes, path, ": header length ", header_len, " exceeds the limit of ",
                kMaxHeaderBytes, " bytes");
    const uint8_t* data = bytes + 8 + header_len;
    SafetensorsHeader h = parse_safetensors_header(reinterpret_cast<const char*>(bytes + 8), size_t(header_len),
                                                   size_ - 8 - header_len, path);
    metadata_ = std::move(h.metadata);
    tensors_.reserve(h.entries.size());
    for (auto& e : h.entries) {
      TensorInfo t;
      t.name = std::move(e.name);
      t.dtype = e.dtype;
      t.shape = std::move(e.shape);
      t.data = data + e.begin;
      t.nbytes = e.end - e.begin;
      index_[t.name] = tensors_.size();
      tensors_.push_back(std::move(t));
    }
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

uint64_t SafetensorsFile::file_offset(const TensorInfo& t) const {
  const auto* base = static_cast<const uint8_t*>(map_);
  NVFP4_CHECK(t.data >= base && t.data + t.nbytes <= base + size_, path_, ": tensor \"", t.name,
              "\" is not one of this file's");
  return uint64_t(t.data - base);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  NVFP4_CHECK(t, path_, ": missing tensor \"", name, "\"");
  return *t;
}

}  // namespace nvfp4moe

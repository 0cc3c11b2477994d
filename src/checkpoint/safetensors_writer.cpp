// Writing safetensors: tensors are laid out largest element size first, so
// every tensor starts at a multiple of its element size without gaps (the
// reader, like the reference implementation, refuses gaps; sub-byte dtypes
// come last, each tensor a whole number of bytes); the JSON header is padded
// with spaces to a multiple of 8 so the data section is 8-aligned. Every
// size is known from the shapes before any data exists, so the header goes
// first and each tensor is written at its offset (pwrite) whenever its bytes
// are ready: the tensors added with their bytes in layout order, the
// deferred ones by the filler. The file is a fileio::AtomicFile: a temporary
// renamed when complete (special files refused, symlinks followed).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "checkpoint/dtypes.hpp"
#include "checkpoint/file_util.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

uint64_t byte_count(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  return dtypes::tensor_bytes(dtype, shape, "SafetensorsWriter: tensor \"" + name + "\"");
}

// Writeback is started for pieces of at least this size (a syscall per
// 4-byte global scale would cost more than it saves).
constexpr uint64_t kWritebackBytes = 1ull << 20;
// The largest single pwrite (Linux moves at most ~2 GiB per call).
constexpr uint64_t kMaxWriteBytes = 1ull << 30;

}  // namespace

SafetensorsStream::SafetensorsStream(int fd, const std::string& path, std::vector<uint64_t> offsets,
                                     std::vector<uint64_t> sizes)
    : fd_(fd),
      path_(path),
      offsets_(std::move(offsets)),
      sizes_(std::move(sizes)),
      written_(new std::atomic<uint64_t>[sizes_.size()]()) {}

void SafetensorsStream::write_at(uint64_t file_offset, const void* data, uint64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (uint64_t done = 0; done < n;) {
    const ssize_t w = ::pwrite(fd_, p + done, size_t(std::min(n - done, kMaxWriteBytes)), off_t(file_offset + done));
    if (w < 0 && errno == EINTR) continue;
    NVFP4_CHECK(w > 0, path_, ": write failed: ", w < 0 ? std::strerror(errno) : "no progress");
    done += uint64_t(w);
  }
#ifdef SYNC_FILE_RANGE_WRITE
  if (n >= kWritebackBytes) ::sync_file_range(fd_, off_t(file_offset), off_t(n), SYNC_FILE_RANGE_WRITE);
#endif
}

void SafetensorsStream::write(size_t index, const void* data, uint64_t n, uint64_t at) {
  NVFP4_CHECK(index < sizes_.size(), path_, ": tensor index ", index, " of ", sizes_.size());
  NVFP4_CHECK(at <= sizes_[index] && n <= sizes_[index] - at, path_, ": bytes [", at, ", ", at + n,
              ") of tensor ", index, " lie outside its ", sizes_[index], " bytes");
  if (n == 0) return;
  write_at(offsets_[index] + at, data, n);
  written_[index].fetch_add(n, std::memory_order_relaxed);
}

const std::string* SafetensorsStream::first_incomplete(const std::vector<std::string>& names) const {
  for (size_t i = 0; i < sizes_.size(); ++i)
    if (written_[i].load() != sizes_[i]) return &names[i];
  return nullptr;
}

SafetensorsWriter::Item& SafetensorsWriter::push(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                                 const void* data, bool deferred) {
  NVFP4_CHECK(name != "__metadata__", "SafetensorsWriter: \"__metadata__\" is reserved, not a tensor name");
  NVFP4_CHECK(!names_.count(name), "SafetensorsWriter: duplicate tensor \"", name, "\"");
  const uint64_t n = byte_count(name, dtype, shape);  // validates the shape first
  NVFP4_CHECK(deferred || data || n == 0, "SafetensorsWriter: tensor \"", name, "\" has no data");
  names_.insert(name);
  return items_.emplace_back(Item{name, dtype, std::move(shape), data, nullptr, deferred});
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
  push(name, dtype, std::move(shape), data, false);
}

void SafetensorsWriter::add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                  std::vector<uint8_t> bytes) {
  const uint64_t want = byte_count(name, dtype, shape);
  NVFP4_CHECK(bytes.size() == want, "SafetensorsWriter: tensor \"", name, "\" of dtype ", dtype_name(dtype),
              " needs ", want, " bytes, got ", bytes.size());
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  add(name, dtype, std::move(shape), owned->data());
  items_.back().owned = std::move(owned);
}

size_t SafetensorsWriter::add_deferred(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  push(name, dtype, std::move(shape), nullptr, true);
  return items_.size() - 1;
}

void SafetensorsWriter::set_filler(std::function<void(SafetensorsStream&)> fill) { fill_ = std::move(fill); }

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::write(const std::string& path) const {
  // Largest element first (stable: equal sizes keep the order of add()).
  std::vector<size_t> order(items_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_bits(items_[a].dtype) > dtype_bits(items_[b].dtype);
  });

  json::Value header = json::Value::object();
  if (!metadata_.empty()) {
    json::Value md = json::Value::object();
    for (const auto& [k, v] : metadata_) md.set(k, json::Value::string(v));
    header.set("__metadata__", std::move(md));
  }
  std::vector<uint64_t> offsets(items_.size()), sizes(items_.size());
  uint64_t offset = 0;
  for (size_t i : order) {
    const Item& it = items_[i];
    const uint64_t n = byte_count(it.name, it.dtype, it.shape);
    json::Value shape = json::Value::array();
    for (int64_t d : it.shape) shape.push(json::Value::integer(d));
    json::Value entry = json::Value::object();
    entry.set("dtype", json::Value::string(dtype_name(it.dtype)));
    entry.set("shape", std::move(shape));
    entry.set("data_offsets", json::Value::array({json::Value::integer(int64_t(offset)),
                                                  json::Value::integer(int64_t(offset + n))}));
    header.set(it.name, std::move(entry));
    offsets[i] = offset;
    sizes[i] = n;
    offset += n;
  }
  std::string text = json::dump(header);
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[size_t(i)] = char(uint8_t(uint64_t(text.size()) >> (8 * i)));
  head += text;
  for (uint64_t& o : offsets) o += head.size();

  fileio::AtomicFile file(path);
  NVFP4_CHECK(::ftruncate(file.fd(), off_t(head.size() + offset)) == 0, path, ": write failed: ",
              std::strerror(errno));
  SafetensorsStream stream(file.fd(), path, std::move(offsets), std::move(sizes));
  stream.write_at(0, head.data(), head.size());
  for (size_t i : order)
    if (!items_[i].deferred) stream.write(i, items_[i].data, stream.bytes(i));
  if (fill_) fill_(stream);
  std::vector<std::string> names;
  for (const Item& it : items_) names.push_back(it.name);
  const std::string* missing = stream.first_incomplete(names);
  NVFP4_CHECK(!missing, path, ": tensor \"", missing ? *missing : "", "\" was declared but its bytes were not all "
              "written");
  file.commit();
}

}  // namespace nvfp4moe

// Writing safetensors: tensors are laid out largest element size first, so
// every tensor starts at a multiple of its element size without gaps (the
// reader, like the reference implementation, refuses gaps; sub-byte dtypes
// come last, each tensor a whole number of bytes); the JSON header is padded
// with spaces to a multiple of 8 so the data section is 8-aligned. The file is
// streamed to a temporary name and renamed when complete, with the output
// rules of fileio::write_atomic (special files refused, symlinks followed).
#include <algorithm>
#include <cstdio>
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

}  // namespace

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
  NVFP4_CHECK(name != "__metadata__", "SafetensorsWriter: \"__metadata__\" is reserved, not a tensor name");
  NVFP4_CHECK(!names_.count(name), "SafetensorsWriter: duplicate tensor \"", name, "\"");
  const uint64_t n = byte_count(name, dtype, shape);  // validates the shape first
  NVFP4_CHECK(data || n == 0, "SafetensorsWriter: tensor \"", name, "\" has no data");
  items_.push_back(Item{name, dtype, std::move(shape), data, nullptr});
  names_.insert(name);
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

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::write(const std::string& path) const {
  // Largest element first (stable: equal sizes keep the order of add()).
  std::vector<const Item*> order;
  for (const auto& it : items_) order.push_back(&it);
  std::stable_sort(order.begin(), order.end(),
                   [](const Item* a, const Item* b) { return dtype_bits(a->dtype) > dtype_bits(b->dtype); });

  json::Value header = json::Value::object();
  if (!metadata_.empty()) {
    json::Value md = json::Value::object();
    for (const auto& [k, v] : metadata_) md.set(k, json::Value::string(v));
    header.set("__metadata__", std::move(md));
  }
  uint64_t offset = 0;
  for (const Item* it : order) {
    const uint64_t n = byte_count(it->name, it->dtype, it->shape);
    json::Value shape = json::Value::array();
    for (int64_t d : it->shape) shape.push(json::Value::integer(d));
    json::Value entry = json::Value::object();
    entry.set("dtype", json::Value::string(dtype_name(it->dtype)));
    entry.set("shape", std::move(shape));
    entry.set("data_offsets", json::Value::array({json::Value::integer(int64_t(offset)),
                                                  json::Value::integer(int64_t(offset + n))}));
    header.set(it->name, std::move(entry));
    offset += n;
  }
  std::string text = json::dump(header);
  text.append((8 - text.size() % 8) % 8, ' ');

  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  fileio::write_atomic(path, [&](std::FILE* f) {
    if (std::fwrite(len_bytes, 1, 8, f) != 8 || std::fwrite(text.data(), 1, text.size(), f) != text.size())
      return false;
    for (const Item* it : order) {
      const uint64_t n = byte_count(it->name, it->dtype, it->shape);
      if (n != 0 && std::fwrite(it->data, 1, n, f) != n) return false;
    }
    return true;
  });
}

}  // namespace nvfp4moe

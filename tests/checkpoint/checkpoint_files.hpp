// Test helpers for checkpoint files: scratch directories, raw bytes in and
// out, and hand-assembled safetensors files (for the malformed ones the
// library's writer would never produce).
#pragma once

#include "support/test_util.hpp"  // EXPECT_ERROR_CONTAINS

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

namespace nvfp4moe::test {

// What a path is, symlinks not followed (is_fifo, is_link) or followed (is_char_device).
inline bool is_fifo(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}
inline bool is_link(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}
inline bool is_char_device(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

// A fresh directory under the test temp dir, removed at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "nvfp4moe_ckpt_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
    if (path_.empty()) ADD_FAILURE() << "mkdtemp failed for " << tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

inline void write_text(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary);
  f << s;
}

// 8-byte little-endian length, the header text as given, then the data.
inline std::vector<uint8_t> safetensors_bytes(const std::string& header, const std::vector<uint8_t>& data,
                                              uint64_t declared_len = UINT64_MAX) {
  const uint64_t len = declared_len == UINT64_MAX ? header.size() : declared_len;
  std::vector<uint8_t> out(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(len >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + std::ptrdiff_t(header.size()));
  return out;
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace nvfp4moe::test

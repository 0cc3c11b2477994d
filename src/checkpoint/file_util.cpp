#include "checkpoint/file_util.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::fileio {

std::string read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  NVFP4_CHECK(f, path, ": cannot open: ", std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  bool bad = std::ferror(f);
  std::fclose(f);
  NVFP4_CHECK(!bad, path, ": read error");
  return out;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  NVFP4_CHECK(!ec && is_directory(path), path, ": cannot create directory: ", ec.message());
}

std::string temp_name(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

void rename_or_throw(const std::string& from, const std::string& to) {
  NVFP4_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ",
              std::strerror(errno));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = temp_name(path);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  NVFP4_CHECK(f, tmp, ": cannot create: ", std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    NVFP4_FAIL(path, ": write failed (", bytes.size(), " bytes): ", std::strerror(errno));
  }
  try {
    rename_or_throw(tmp, path);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

void remove_all_quiet(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

}  // namespace nvfp4moe::fileio

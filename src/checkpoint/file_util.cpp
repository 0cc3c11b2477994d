#include "checkpoint/file_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::fileio {

namespace {

constexpr int kMaxLinkHops = 40;  // as the kernel's ELOOP limit

const char* kind_of_mode(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "a special file";
}

std::string parent_of(const std::string& p) {
  const size_t s = p.find_last_of('/');
  if (s == std::string::npos) return ".";
  return s == 0 ? "/" : p.substr(0, s);
}

// `path` with its final component's symlinks followed (to a target that
// need not exist).
std::string resolve_links(const std::string& path) {
  std::string p = path;
  for (int hop = 0; hop <= kMaxLinkHops; ++hop) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(p, ec).string();
    NVFP4_CHECK(!ec, path, ": cannot read the symlink ", p, ": ", ec.message());
    p = !target.empty() && target[0] == '/' ? target : join(parent_of(p), target);
  }
  NVFP4_FAIL(path, ": too many levels of symbolic links (more than ", kMaxLinkHops, ")");
}

std::string via(const std::string& path, const std::string& target) {
  return target == path ? path : path + " (a symlink to " + target + ")";
}

bool ends_with_safetensors(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const std::string suffix = ".safetensors";
  return p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

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

std::string file_kind(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? kind_of_mode(st.st_mode) : "";
}

std::string output_file_target(const std::string& path) {
  const std::string target = resolve_links(path);
  struct stat st;
  if (::stat(target.c_str(), &st) != 0) return target;  // absent: created there
  NVFP4_CHECK(S_ISREG(st.st_mode), via(path, target), " is ", kind_of_mode(st.st_mode),
              ", not a regular file; outputs are written to regular files only");
  return target;
}

std::string output_directory_target(const std::string& path) {
  NVFP4_CHECK(!ends_with_safetensors(path), path,
              ": a model directory is written here, but the name ends in .safetensors; give a directory name");
  const std::string target = resolve_links(path);
  const std::string kind = file_kind(target);
  NVFP4_CHECK(kind.empty() || kind == "a directory", via(path, target), " is ", kind,
              ", not a directory; a model directory is written here");
  return target;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

void check_not_input(const std::string& out, const std::string& out_what, const std::string& in,
                     const std::string& in_what) {
  NVFP4_CHECK(!same_file(out, in), out_what, " ", out, " is the same file as ", in_what, " ", in,
              "; write to a new path");
  if (!is_directory(in) || !exists(out)) return;
  // A model directory's files and one level below (inference/config.json);
  // no model keeps files deeper, and a mistaken --model / must not be walked.
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(in, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it.depth() >= 1) it.disable_recursion_pending();
    NVFP4_CHECK(!same_file(out, it->path().string()), out_what, " ", out, " is the file ", it->path().string(),
                " of ", in_what, " ", in, "; write to a new path");
  }
}

void rename_or_throw(const std::string& from, const std::string& to) {
  NVFP4_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ",
              std::strerror(errno));
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), target_(output_file_target(path)) {
  tmp_ = temp_name(target_);
  struct stat st;
  if (::lstat(tmp_.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) ::unlink(tmp_.c_str());  // stale, same pid
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  NVFP4_CHECK(fd_ >= 0, path, ": cannot create the temporary ", tmp_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::commit() {
  int err = ::fsync(fd_) == 0 ? 0 : errno;
  if (::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  if (err != 0) {
    ::unlink(tmp_.c_str());
    NVFP4_FAIL(path_, ": write failed: ", std::strerror(err));
  }
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    err = errno;
    ::unlink(tmp_.c_str());
    NVFP4_FAIL("cannot rename ", tmp_, " to ", via(path_, target_), ": ", std::strerror(err));
  }
}

void write_atomic(const std::string& path, const std::function<bool(std::FILE*)>& fill) {
  AtomicFile file(path);
  // The stream owns a duplicate: closing it leaves the temporary open for
  // commit()'s fsync.
  const int fd = ::dup(file.fd());
  FILE* f = fd >= 0 ? ::fdopen(fd, "wb") : nullptr;
  if (!f) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    NVFP4_FAIL(path, ": cannot open the temporary ", file.temp_path(), ": ", std::strerror(err));
  }
  int err = 0;
  auto step = [&](bool ok) {
    if (!ok && err == 0) err = errno ? errno : EIO;
  };
  try {
    step(fill(f));
  } catch (...) {
    std::fclose(f);
    throw;
  }
  step(std::fflush(f) == 0);
  step(std::fclose(f) == 0);
  NVFP4_CHECK(err == 0, path, ": write failed: ", std::strerror(err));
  file.commit();
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_atomic(path, [&](std::FILE* f) { return std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size(); });
}

void install_file(const std::string& from, const std::string& to) {
  const std::string target = output_file_target(to);
  if (::rename(from.c_str(), target.c_str()) == 0) return;
  const int err = errno;
  NVFP4_CHECK(err == EXDEV, "cannot rename ", from, " to ", via(to, target), ": ", std::strerror(err));
  // A symlink out of the output directory onto another filesystem: copy
  // into the target's directory, then rename there.
  FILE* src = std::fopen(from.c_str(), "rb");
  NVFP4_CHECK(src, from, ": cannot open: ", std::strerror(errno));
  try {
    write_atomic(target, [&](std::FILE* f) {
      char buf[1 << 16];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, src)) > 0)
        if (std::fwrite(buf, 1, n, f) != n) return false;
      return !std::ferror(src);
    });
  } catch (...) {
    std::fclose(src);
    throw;
  }
  std::fclose(src);
  std::remove(from.c_str());
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

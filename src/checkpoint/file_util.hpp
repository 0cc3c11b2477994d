// Small file helpers of the checkpoint code and the CLI: whole-file reads,
// writes that go to a temporary name and are renamed when complete
// (docs/numerics.md §6: a failed write leaves the earlier file intact), the
// checks every output path passes, directories.
//
// Output paths: the temporary-and-rename scheme is right for regular files
// only. A path that names a FIFO, a device, a socket or a directory is
// refused (renaming over /dev/null would replace the device with a regular
// file); a symlink is followed to its target, which is then written
// atomically in its own directory, so the link keeps pointing at new bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace nvfp4moe::fileio {

// The whole file as bytes; throws naming the path and errno text.
std::string read_file(const std::string& path);
bool exists(const std::string& path);
bool is_directory(const std::string& path);
// mkdir -p; throws naming the path.
void make_directories(const std::string& path);
// "<path>.tmp.<pid>" — the temporary name a write goes to before its rename.
std::string temp_name(const std::string& path);

// "a FIFO", "a character device", "a directory", ... of an existing path
// (symlinks followed), "" when nothing is there.
std::string file_kind(const std::string& path);
// The file a write to `path` must replace: `path` itself, or for a symlink
// (a chain of them, relative ones resolved against the link's directory) its
// final target, which need not exist yet. Throws naming `path` when the
// target exists and is not a regular file, or the chain loops.
std::string output_file_target(const std::string& path);
// An output directory: refuses a path that exists and is not a directory,
// or whose name ends in ".safetensors" (a file name given where a directory
// is written). Returns the directory to write into (symlinks followed).
std::string output_directory_target(const std::string& path);
// Whether `a` and `b` are one file or directory (device and inode, symlinks
// followed); false when either does not exist.
bool same_file(const std::string& a, const std::string& b);
// Throws when the output `out` would replace the input `in` or, for a
// directory `in`, any file in it or in its subdirectories (one level, as a
// model directory's inference/config.json): "--output y is the same file
// as --input x" (`out_what`, `in_what` name the options).
void check_not_input(const std::string& out, const std::string& out_what, const std::string& in,
                     const std::string& in_what);

// The temporary through which output_file_target(path) is written: created
// exclusively in the target's directory (a stale temporary is removed
// first, and never followed); commit() fsyncs it and renames it over the
// target. Destroyed uncommitted (a failure), the temporary is removed and
// the target is left as it was. Errors name `path`.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  void commit();

 private:
  std::string path_, target_, tmp_;
  int fd_ = -1;
};

// An AtomicFile filled through a stdio stream by `fill` (false: a write
// failed), flushed and committed.
void write_atomic(const std::string& path, const std::function<bool(std::FILE*)>& fill);
void write_file_atomic(const std::string& path, std::string_view bytes);
// Moves a complete file `from` (a staging copy) to `to` with the output rules
// above: `to` a regular file, absent, or a symlink (then its target is
// replaced, copied across filesystems if it must be).
void install_file(const std::string& from, const std::string& to);
// rename(2) with an error naming both paths.
void rename_or_throw(const std::string& from, const std::string& to);
// Removes a file or a directory tree; errors ignored (cleanup on failure paths).
void remove_all_quiet(const std::string& path);
std::string join(const std::string& dir, const std::string& name);

}  // namespace nvfp4moe::fileio

// Small file helpers of the checkpoint code and the CLI: whole-file reads,
// writes that go to a temporary name and are renamed when complete
// (docs/numerics.md §6: a failed write leaves the earlier file intact),
// directories.
#pragma once

#include <cstdint>
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
// Writes `bytes` to temp_name(path), flushes, renames over `path`; on any
// failure removes the temporary and throws, leaving `path` as it was.
void write_file_atomic(const std::string& path, std::string_view bytes);
// rename(2) with an error naming both paths.
void rename_or_throw(const std::string& from, const std::string& to);
// Removes a file or a directory tree; errors ignored (cleanup on failure paths).
void remove_all_quiet(const std::string& path);
std::string join(const std::string& dir, const std::string& name);

}  // namespace nvfp4moe::fileio

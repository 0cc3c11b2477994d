// rewrite_checkpoint: the file/directory plumbing of `nvfp4moe quantize` and
// `dequantize` — one output shard per input shard, the index rewritten for the
// new tensor names, config.json edited, and nothing in `out` touched until
// every file has been written completely. The output is checked before any
// work: the right kind of path for the input, not the input itself (by
// device and inode, so a symlink or hard link to it is caught too).
#include <filesystem>

#include "checkpoint/file_util.hpp"
#include "checkpoint/model_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

bool is_safetensors_name(const std::string& p) {
  return p.size() > 12 && p.compare(p.size() - 12, 12, ".safetensors") == 0;
}

}  // namespace

void rewrite_checkpoint(const std::string& in, const std::string& out, const RewriteSpec& spec) {
  if (!fileio::is_directory(in)) {
    NVFP4_CHECK(fileio::exists(in), in, ": no such file or directory");
    NVFP4_CHECK(!fileio::is_directory(out), "--out ", out, " is a directory but --in ", in,
                " is a file; give a .safetensors file name");
    fileio::check_not_input(out, "--out", in, "--in");
    fileio::output_file_target(out);  // a FIFO, device, ...: refused before the work
    SafetensorsFile src(in);
    SafetensorsWriter w;
    for (const auto& [k, v] : src.metadata()) w.set_metadata(k, v);
    spec.transform(src, w);
    w.write(out);  // temporary name + rename: `out` keeps its bytes on failure
    return;
  }
  NVFP4_CHECK(!fileio::exists(out) || fileio::is_directory(out), "--out ", out, " is ", fileio::file_kind(out),
              " but --in ", in, " is a model directory; give a directory");
  const std::string out_dir = fileio::output_directory_target(out);
  NVFP4_CHECK(!fileio::same_file(in, out_dir), "--in and --out are the same directory ", in, "; write to a new one");
  const std::vector<std::string> shards = model_shard_files(in);
  const std::string stage = fileio::temp_name(out_dir);
  fileio::remove_all_quiet(stage);
  try {
    fileio::make_directories(stage);
    // The index's entries gathered as a list and made an object once: set()
    // looks a key up first, which over a release's ~280,000 tensors would be
    // quadratic (a tensor name is in one shard only: ModelDir refuses others).
    std::vector<json::Value::Member> weight_map;
    uint64_t total = 0;
    for (const auto& shard : shards) {
      SafetensorsFile src(fileio::join(in, shard));
      SafetensorsWriter w;
      for (const auto& [k, v] : src.metadata()) w.set_metadata(k, v);
      spec.transform(src, w);
      const std::string dst = fileio::join(stage, shard);
      w.write(dst);
      SafetensorsFile written(dst);  // re-read: names for the index, and a check of what we wrote
      for (const auto& t : written.tensors()) {
        weight_map.emplace_back(t.name, json::Value::string(shard));
        total += t.nbytes;
      }
    }
    const std::string index_path = fileio::join(in, "model.safetensors.index.json");
    if (fileio::exists(index_path)) {
      json::Value index = json::parse(fileio::read_file(index_path), index_path);
      json::Value md = index.find("metadata") ? *index.find("metadata") : json::Value::object();
      if (md.is_object()) md.set("total_size", json::Value::integer(int64_t(total)));
      json::Value out_index = json::Value::object({{"metadata", std::move(md)}, {"weight_map", json::Value::object(std::move(weight_map))}});
      fileio::write_file_atomic(fileio::join(stage, "model.safetensors.index.json"), json::dump(out_index, 2) + "\n");
    }
    const std::string cfg = fileio::join(in, "config.json");
    std::string cfg_text = fileio::exists(cfg) ? fileio::read_file(cfg) : "";
    if (spec.config_edit) cfg_text = spec.config_edit(cfg_text);
    if (!cfg_text.empty()) fileio::write_file_atomic(fileio::join(stage, "config.json"), cfg_text);
    for (const auto& [name, content] : spec.extra_files) fileio::write_file_atomic(fileio::join(stage, name), content);

    // Carry over the other small files (tokenizer, generation config, ...).
    for (const auto& entry : std::filesystem::directory_iterator(in)) {
      const std::string name = entry.path().filename().string();
      if (spec.copy_directories && entry.is_directory() && name != "__pycache__" && name != ".cache") {
        std::error_code ec;
        std::filesystem::copy(entry.path(), fileio::join(stage, name), std::filesystem::copy_options::recursive, ec);
        NVFP4_CHECK(!ec, "cannot copy ", entry.path().string(), " to ", stage, ": ", ec.message());
        continue;
      }
      if (!entry.is_regular_file() || is_safetensors_name(name) || name == "config.json" ||
          name == "model.safetensors.index.json" || fileio::exists(fileio::join(stage, name)))
        continue;
      bool dropped = false;
      for (const auto& d : spec.drop_files) dropped = dropped || d == name;
      if (dropped) continue;
      std::error_code ec;
      std::filesystem::copy_file(entry.path(), fileio::join(stage, name), ec);
      NVFP4_CHECK(!ec, "cannot copy ", entry.path().string(), " to ", stage, ": ", ec.message());
    }

    // Everything is complete. Every destination is checked before the first
    // move (a special file or an input under one of the names would leave
    // `out` half replaced), then the files move into `out`.
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(stage))
      names.push_back(entry.path().filename().string());
    for (const std::string& name : names)
      fileio::check_not_input(fileio::output_file_target(fileio::join(out_dir, name)), "--out", in, "--in");
    fileio::make_directories(out_dir);
    for (const std::string& name : names) fileio::install_file(fileio::join(stage, name), fileio::join(out_dir, name));
    fileio::remove_all_quiet(stage);
  } catch (...) {
    fileio::remove_all_quiet(stage);
    throw;
  }
}

}  // namespace nvfp4moe

// Rank processes and the NCCL communicator (see nccl_launcher.hpp).
#include "ep/nccl_launcher.hpp"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <utility>

#include "common/parse_int.hpp"
#include "nvfp4moe/error.hpp"

#if defined(NVFP4MOE_HAS_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include "cuda/cuda_check.hpp"
#endif

namespace nvfp4moe::ep {

std::optional<RankEnv> rank_env() {
  const char* r = std::getenv(kEnvRank);
  const char* w = std::getenv(kEnvWorld);
  const char* f = std::getenv(kEnvIdFile);
  if (!r || !w || !f) return std::nullopt;
  RankEnv e;
  e.rank = int(parse_int(r, 0, 65535, kEnvRank));
  e.world = int(parse_int(w, 1, 65536, kEnvWorld));
  e.id_file = f;
  NVFP4_CHECK(e.world >= 1 && e.rank >= 0 && e.rank < e.world, "rank environment: ", kEnvRank, "=", r, " ",
              kEnvWorld, "=", w, " is not a rank of the world");
  return e;
}

int launch_ranks(int world, const std::vector<std::string>& args) {
  NVFP4_CHECK(world >= 1, "launch_ranks: world size must be >= 1, got ", world);
  NVFP4_CHECK(!args.empty(), "launch_ranks: no arguments");
  char tmpl[] = "/tmp/nvfp4moe-ep-XXXXXX";
  NVFP4_CHECK(mkdtemp(tmpl) != nullptr, "launch_ranks: cannot create a directory for the NCCL unique id in /tmp");
  const std::string dir = tmpl, id_file = dir + "/nccl-unique-id";
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    NVFP4_CHECK(pid >= 0, "launch_ranks: fork of rank ", r, " failed");
    if (pid == 0) {
      setenv(kEnvRank, std::to_string(r).c_str(), 1);
      setenv(kEnvWorld, std::to_string(world).c_str(), 1);
      setenv(kEnvIdFile, id_file.c_str(), 1);
      setenv("NCCL_NVLS_ENABLE", "0", 1);  // no NVLink multicast (docs/ep.md)
      execv("/proc/self/exe", argv.data());
      std::perror("nvfp4moe: execv of a rank process");
      _exit(127);
    }
    pids.push_back(pid);
  }
  // Collect the ranks as they exit. A failed rank leaves its peers waiting in
  // a collective forever: stop them (only the processes started here).
  int first_bad = 0, left = world;
  std::vector<bool> done(size_t(world), false);
  while (left > 0) {
    int status = 0, r = 0;
    pid_t pid = 0;
    for (r = 0; r < world; ++r) {  // only our own children, never waitpid(-1)
      if (done[size_t(r)]) continue;
      pid = waitpid(pids[size_t(r)], &status, WNOHANG);
      if (pid != 0) break;
    }
    if (r == world) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (pid < 0) status = 127 << 8;  // lost: count it as a failure
    done[size_t(r)] = true;
    --left;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (code != 0 && !first_bad) {
      first_bad = code;
      std::fprintf(stderr, "nvfp4moe: expert-parallel rank %d of %d exited with status %d; stopping the others\n", r,
                   world, code);
      for (int o = 0; o < world; ++o)
        if (!done[size_t(o)]) kill(pids[size_t(o)], SIGTERM);
    }
  }
  std::remove(id_file.c_str());
  rmdir(dir.c_str());
  return first_bad;
}

#if defined(NVFP4MOE_HAS_NCCL)

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  NVFP4_CHECK(r == ncclSuccess, "NCCL error ", int(r), " (", ncclGetErrorString(r), ") in ", what);
}

// Rank 0 publishes the id; the others wait for the complete file.
ncclUniqueId share_unique_id(const RankEnv& env) {
  ncclUniqueId id{};
  if (env.rank == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string tmp = env.id_file + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(id.internal, sizeof(id.internal));
      NVFP4_CHECK(f.good(), "cannot write the NCCL unique id to ", tmp);
    }
    NVFP4_CHECK(std::rename(tmp.c_str(), env.id_file.c_str()) == 0, "cannot rename ", tmp, " to ", env.id_file);
    return id;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (true) {
    std::ifstream f(env.id_file, std::ios::binary);
    if (f && f.read(id.internal, sizeof(id.internal)) && f.gcount() == sizeof(id.internal)) return id;
    NVFP4_CHECK(std::chrono::steady_clock::now() < deadline, "rank ", env.rank, ": no NCCL unique id in ",
                env.id_file, " after 120 s (did rank 0 start?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

NcclComm::NcclComm(const RankEnv& env) : rank_(env.rank), world_(env.world) {
  int devices = 0;
  NVFP4_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0, "rank ", env.rank, ": no CUDA device");
  NVFP4_CHECK(env.world <= devices, "expert parallelism over ", env.world, " ranks needs ", env.world,
              " GPUs (one per rank, NCCL refuses two ranks on one GPU); this machine has ", devices);
  NVFP4_CHECK(cudaSetDevice(env.rank) == cudaSuccess, "rank ", env.rank, ": cudaSetDevice failed");
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  const ncclUniqueId id = share_unique_id(env);
  ncclComm_t c = nullptr;
  nccl_check(ncclCommInitRank(&c, env.world, id, env.rank), "ncclCommInitRank");
  comm_ = c;
}

NcclComm NcclComm::single_rank() {
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  ncclUniqueId id{};
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t c = nullptr;
  nccl_check(ncclCommInitRank(&c, 1, id, 0), "ncclCommInitRank (1 rank)");
  NcclComm out;
  out.comm_ = c;
  return out;
}

NcclComm::~NcclComm() {
  if (!comm_) return;
  ncclCommFinalize(comm_);
  ncclCommDestroy(comm_);
}

void host_allreduce(const NcclComm& comm, std::vector<double>& values, HostReduce op) {
  if (values.empty()) return;
  cuda::DeviceBuffer<double> dev(values.size());
  dev.upload(values.data(), values.size());
  nccl_check(ncclAllReduce(dev.get(), dev.get(), values.size(), ncclFloat64, op == HostReduce::Max ? ncclMax : ncclSum,
                           comm.get(), nullptr),
             "ncclAllReduce");
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  dev.download(values.data(), values.size());
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

#else  // !NVFP4MOE_HAS_NCCL

NcclComm::NcclComm(const RankEnv&) {
  NVFP4_FAIL("expert parallelism across GPUs needs NCCL: this build has none (configure with -DNCCL_ROOT=<dir>)");
}
NcclComm NcclComm::single_rank() {
  NVFP4_FAIL("expert parallelism across GPUs needs NCCL: this build has none (configure with -DNCCL_ROOT=<dir>)");
}
NcclComm::~NcclComm() = default;
void host_allreduce(const NcclComm&, std::vector<double>&, HostReduce) {
  NVFP4_FAIL("expert parallelism across GPUs needs NCCL: this build has none (configure with -DNCCL_ROOT=<dir>)");
}

#endif  // NVFP4MOE_HAS_NCCL

NcclComm::NcclComm(NcclComm&& o) noexcept
    : comm_(std::exchange(o.comm_, nullptr)), rank_(o.rank_), world_(o.world_) {}

}  // namespace nvfp4moe::ep

// Starting R expert-parallel ranks, one process per GPU, and joining them to
// one NCCL communicator.
//
// launch_ranks(R, args) re-executes this program (/proc/self/exe) R times
// with NVFP4MOE_EP_RANK / NVFP4MOE_EP_WORLD / NVFP4MOE_EP_ID_FILE set and
// NCCL_NVLS_ENABLE=0 (no NVLink multicast), waits for all of them and returns
// 0 only if every rank exited 0. Exec rather than a bare fork: the parent may
// already hold a CUDA context, which a forked child cannot use.
//
// In a rank process, NcclComm(rank_env()) selects GPU `rank`, and the ranks
// share the NCCL unique id through the file: rank 0 writes it (temporary
// name, then rename, so nobody reads half an id), the others wait for it.
#pragma once

#include <optional>
#include <string>
#include <vector>

struct ncclComm;

namespace nvfp4moe::ep {

inline constexpr const char* kEnvRank = "NVFP4MOE_EP_RANK";
inline constexpr const char* kEnvWorld = "NVFP4MOE_EP_WORLD";
inline constexpr const char* kEnvIdFile = "NVFP4MOE_EP_ID_FILE";

struct RankEnv {
  int rank = 0, world = 1;
  std::string id_file;
};

// The rank environment when this process was started by launch_ranks.
std::optional<RankEnv> rank_env();

// Runs `args` (args[0] is the program name shown; the binary is this one) as
// `world` rank processes; returns the first non-zero exit status (and names
// the rank on stderr), 0 when all succeeded. Throws if a process cannot start.
int launch_ranks(int world, const std::vector<std::string>& args);

// An initialised NCCL communicator (RAII: finalised and destroyed on exit).
class NcclComm {
 public:
  explicit NcclComm(const RankEnv& env);  // collective over the launched ranks
  static NcclComm single_rank();          // R = 1 in this process, current device
  ~NcclComm();
  NcclComm(NcclComm&& o) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm* get() const { return comm_; }
  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  NcclComm() = default;
  ncclComm* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
};

// Element-wise max or sum of `values` over the communicator's ranks, every
// rank's vector the same length: collective, synchronising (a device copy
// and one ncclAllReduce), for reports, not for a forward.
enum class HostReduce { Max, Sum };
void host_allreduce(const NcclComm& comm, std::vector<double>& values, HostReduce op);

}  // namespace nvfp4moe::ep

// Several processes training one model (data parallelism, one process per GPU): who this process
// is among them, how they find each other, and how `lrnn train --gpus N` starts them on one host.
//
// A process learns its place from the environment, in the conventions of the usual launchers:
//   torchrun / lrnn --gpus:  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//   Slurm (srun):            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (MASTER_ADDR/PORT still needed)
//   Open MPI (mpirun):       OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
// (the first set found wins). Without any of them the process is alone (rank 0 of 1).
//
// The rendezvous is a TCP exchange at MASTER_ADDR:MASTER_PORT: rank 0 listens there and hands
// every other rank the same few bytes (NCCL's unique id); the others connect, retrying while rank
// 0 is still starting. No MPI and no shared file system are needed.
#pragma once
#include <string>
#include <vector>

namespace lrnn::dist {

struct World {
  int rank = 0, size = 1, local_rank = 0;
  std::string master_addr;  // rank 0's host (name or address)
  int master_port = 0;
  std::string source;       // which convention it came from ("RANK/WORLD_SIZE", "SLURM_*", ...), for messages
  bool distributed() const { return size > 1; }
  bool leader() const { return rank == 0; }
};

// This process's world, read from the environment once (UserError for inconsistent values:
// a rank outside [0, size), a size without an address, a port out of range).
const World& world();
// The same from an explicit environment (name -> value; tests).
World world_from(const std::vector<std::pair<std::string, std::string>>& env);

// Seconds a rank waits for the others before it gives up (LRNN_DIST_TIMEOUT, default 1800: longer
// than the longest evaluation rank 0 runs while the others wait).
double timeout_seconds();

// Rank 0 sends `payload` to every other rank; every rank returns it. UserError when the others do
// not all arrive (or rank 0 cannot be reached) within timeout_s.
std::string exchange(const World& w, const std::string& payload, double timeout_s);

// `lrnn train --gpus N` on one host: starts N copies of `program` (lrnn: /proc/self/exe) with
// `args` (argv without --gpus) and RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set (a free loopback port), in a
// process group of their own. SIGINT/SIGTERM to the launcher go to every rank once (they stop
// together at their next log step and save a checkpoint). When a rank fails (non-zero exit or a
// signal), the others are killed at once and its status is returned; otherwise 0.
int launch_local(int n, const std::string& program, const std::vector<std::string>& args);

}  // namespace lrnn::dist

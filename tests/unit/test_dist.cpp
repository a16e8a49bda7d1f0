// The multi-process plumbing of data parallelism that runs without GPUs: the rank environment of
// the usual launchers, the TCP rendezvous, the one-host launcher, each rank's rows of a batch.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include "core/check.h"
#include "dist/shards.h"
#include "dist/world.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "tasks/task.h"

using namespace lrnn;
using namespace lrnn::dist;
namespace fs = std::filesystem;

namespace {

// An IPv4 socket bound to a port the kernel picks (on `addr`); its port in *port.
int bound_socket(uint32_t addr, int* port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return s;
}

int free_port() {
  int port = 0;
  ::close(bound_socket(INADDR_LOOPBACK, &port));
  return port;
}

World rank_of(int rank, int size, int port) {
  World w;
  w.rank = rank;
  w.size = size;
  w.master_addr = "127.0.0.1";
  w.master_port = port;
  return w;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

}  // namespace

TEST(DistWorld, AloneWithoutALauncher) {
  World w = world_from({});
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.rank, 0);
  EXPECT_FALSE(w.distributed());
  // One rank of one needs no address.
  EXPECT_EQ(world_from({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).size, 1);
}

TEST(DistWorld, ReadsTorchrunSlurmAndOpenMpiConventions) {
  World t = world_from({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node7"},
                        {"MASTER_PORT", "29500"}});
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.size, 8);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.master_addr, "node7");
  EXPECT_EQ(t.master_port, 29500);
  World s = world_from({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "5"}, {"MASTER_ADDR", "n1"},
                        {"MASTER_PORT", "1234"}});
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.size, 16);
  EXPECT_EQ(s.local_rank, 5);
  World o = world_from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "9"}});
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.size, 2);
  // torchrun's variables win over the scheduler's (torchrun under srun sets both).
  World both = world_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"RANK", "2"}, {"WORLD_SIZE", "4"},
                           {"MASTER_ADDR", "h"}, {"MASTER_PORT", "9"}});
  EXPECT_EQ(both.rank, 2);
  EXPECT_EQ(both.size, 4);
}

TEST(DistWorld, InconsistentEnvironmentsAreErrorsThatNameTheVariable) {
  EXPECT_NE(message_of([] { world_from({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}); })
                .find("RANK='4'"),
            std::string::npos);
  EXPECT_NE(message_of([] { world_from({{"RANK", "x"}, {"WORLD_SIZE", "2"}}); }).find("RANK='x'"), std::string::npos);
  EXPECT_NE(message_of([] { world_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}}); }).find("MASTER_ADDR"), std::string::npos);
  EXPECT_NE(message_of([] { world_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}); })
                .find("MASTER_PORT"),
            std::string::npos);
}

TEST(DistRendezvous, EveryRankGetsRankZerosBytesWhoeverStartsFirst) {
  const int port = free_port(), n = 4;
  std::string id(128, '\0');
  for (int i = 0; i < 128; ++i) id[size_t(i)] = char(i * 37 + 1);  // zero bytes included
  std::vector<std::future<std::string>> got;
  for (int r = 1; r < n; ++r)
    got.push_back(std::async(std::launch::async, [=] { return exchange(rank_of(r, n, port), "", 20); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others retry until rank 0 listens
  EXPECT_EQ(exchange(rank_of(0, n, port), id, 20), id);
  for (auto& f : got) EXPECT_EQ(f.get(), id);
}

TEST(DistRendezvous, AMissingRankEndsTheWaitWithItsNumber) {
  const int port = free_port();
  auto one = std::async(std::launch::async, [=] { return exchange(rank_of(1, 3, port), "", 5); });
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = message_of([=] { exchange(rank_of(0, 3, port), "id", 1.0); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("ranks 2 (of 3)"), std::string::npos) << msg;
  EXPECT_LT(waited, 4.0);
  EXPECT_EQ(one.get(), "id");  // rank 1 had its answer before rank 0 gave up
  // And a rank whose rank 0 never comes: a clear error too.
  const std::string lone = message_of([] { exchange(rank_of(1, 2, free_port()), "", 0.5); });
  EXPECT_NE(lone.find("could not reach rank 0"), std::string::npos) << lone;
}

TEST(DistRendezvous, ARankOfAnotherJobSizeIsRefused) {
  const int port = free_port();
  auto stray = std::async(std::launch::async, [=] {
    try {
      exchange(rank_of(1, 3, port), "", 1.5);
    } catch (const UserError&) {
    }
  });
  const std::string msg = message_of([=] { exchange(rank_of(0, 2, port), "id", 3); });
  EXPECT_NE(msg.find("rank 1 of 3"), std::string::npos) << msg;
  stray.get();
}

TEST(DistRendezvous, ATakenPortIsAnErrorNamingIt) {
  // Another program listens on MASTER_PORT (IPv4, every address, as a second job's rank 0 would).
  int port = 0;
  const int other = bound_socket(INADDR_ANY, &port);
  ASSERT_EQ(::listen(other, 4), 0);
  const std::string msg = message_of([=] { exchange(rank_of(0, 2, port), "id", 1); });
  EXPECT_NE(msg.find("cannot listen on port " + std::to_string(port)), std::string::npos) << msg;
  ::close(other);
}

TEST(DistLaunch, StartsEachRankWithItsEnvironment) {
  const fs::path dir = fs::temp_directory_path() / ("lrnn_launch_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string script = "echo $RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT $NCCL_NVLS_ENABLE > " +
                             dir.string() + "/rank$RANK";
  EXPECT_EQ(launch_local(3, "/bin/sh", {"sh", "-c", script}), 0);
  std::string port;
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r)));
    std::string rank, size, local, addr, p, nvls;
    in >> rank >> size >> local >> addr >> p >> nvls;
    EXPECT_EQ(rank, std::to_string(r));
    EXPECT_EQ(size, "3");
    EXPECT_EQ(local, std::to_string(r));
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_EQ(nvls, "0");  // NVLink multicast off
    if (r == 0) port = p;
    EXPECT_EQ(p, port);  // one rendezvous port for all
  }
  fs::remove_all(dir);
}

TEST(DistLaunch, AFailingRankStopsTheOthersAtOnceAndGivesItsStatus) {
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 fails after 0.2 s; the others would run for a minute.
  const int code = launch_local(3, "/bin/sh", {"sh", "-c", "if [ $RANK = 1 ]; then sleep 0.2; exit 7; fi; sleep 60"});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(code, 7);
  EXPECT_LT(took, 10.0);
  // A rank killed by a signal: 128 + the signal, as a shell reports it.
  EXPECT_EQ(launch_local(2, "/bin/sh", {"sh", "-c", "if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 60"}), 128 + 9);
}

TEST(DistBatch, RanksSplitTheGlobalBatchAndWeighTheirLabels) {
  TaskConfig tc;
  tc.name = "parity";
  tc.train_len = {3, 40};
  auto task = create_task(tc);
  const int B = 12;
  Batch all = task->train_batch(7, 5, B, tc.train_len);
  double weights = 0;
  for (int world : {1, 2, 3, 4}) {
    weights = 0;
    for (int r = 0; r < world; ++r) {
      double w = 0;
      Batch mine = task->train_batch_of_rank(7, 5, B, tc.train_len, r, world, &w);
      Batch want = all.rows(r * B / world, B / world);
      EXPECT_EQ(mine.T, all.T);  // padded as the whole batch
      EXPECT_EQ(mine.tokens, want.tokens);
      EXPECT_EQ(mine.labels, want.labels);
      const int own = ops::count_labels(want.labels.data(), want.B * want.T);
      const int total = ops::count_labels(all.labels.data(), all.B * all.T);
      EXPECT_DOUBLE_EQ(w, double(world) * own / total);
      weights += w;
    }
    // The weights average to 1: the mean of the ranks' weighted means is the batch's mean.
    EXPECT_NEAR(weights / world, 1.0, 1e-12) << world;
  }
}

TEST(DistShards, SlicesAreAlignedEqualAndCoverEveryParameterOnce) {
  EXPECT_EQ(Shards::of(1000, 1).per_rank, 1000u);  // one rank: everything, unpadded
  EXPECT_EQ(Shards::of(1000, 1).padded(), 1000u);
  for (size_t P : {size_t(1), size_t(63), size_t(64), size_t(1000), size_t(529856), size_t(340000001)})
    for (int N : {2, 3, 4, 7, 8}) {
      const Shards s = Shards::of(P, N);
      EXPECT_EQ(s.per_rank % 64, 0u) << P << " " << N;
      EXPECT_GE(s.padded(), P);
      EXPECT_LT(s.padded() - P, size_t(64) * N) << P << " " << N;  // at most one 64-block of padding per rank
      size_t covered = 0;
      for (int r = 0; r < N; ++r) {
        EXPECT_EQ(s.begin(r), std::min(P, r * s.per_rank));
        covered += s.end(r) - s.begin(r);
      }
      EXPECT_EQ(covered, P);
    }
  // The slices of a vector put back together in rank order are the vector, then zeros.
  std::vector<float> full(1000);
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(i + 1);
  const Shards s = Shards::of(full.size(), 3);
  std::vector<float> joined;
  for (int r = 0; r < 3; ++r) {
    auto part = s.slice(full, r);
    EXPECT_EQ(part.size(), s.per_rank);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  ASSERT_EQ(joined.size(), s.padded());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_EQ(joined[i], i < full.size() ? full[i] : 0.f) << i;
}

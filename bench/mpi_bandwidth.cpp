// The network between ranks as MPI sees it, without duet: what bench/dist_hosts.py sets duet's own
// all-reduce figures against, in the same run and over the same link. Rank 0 prints one JSON line
// per measurement:
//   ping-pong between rank 0 and the last rank (on another host when the ranks are spread over
//     hosts): half the round trip, and bytes over it (one direction's bandwidth);
//   MPI_Allreduce (sum of floats, in place) over every rank: time, algorithm bandwidth (bytes over
//     time) and bus bandwidth (x 2 (n - 1) / n, nccl-tests' definition, duet's profile's column).
// Each size: a warm-up, then `reps` timed repetitions (fewer for large sizes), the median taken.
//
//   mpirun -np 2 ... duet_mpi_bandwidth [--max-mb 64] [--seconds 1.0]
#include <mpi.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// How many repetitions fit about `seconds` at `one` seconds each (at least 3, at most 200).
int reps_for(double one, double seconds) { return std::clamp(static_cast<int>(seconds / std::max(one, 1e-7)), 3, 200); }
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double max_mb = 64, seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--max-mb")) max_mb = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
  }
  const size_t max_bytes = static_cast<size_t>(max_mb * 1e6);
  std::vector<char> buf(std::max<size_t>(max_bytes, 8));
  std::vector<float> data(buf.size() / sizeof(float) + 1, 1.0f);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::vector<char> hosts(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
  const int peer = size - 1;
  if (rank == 0)
    std::printf("{\"kind\": \"setup\", \"ranks\": %d, \"rank0_host\": \"%s\", \"peer_host\": \"%s\"}\n", size,
                hosts.data(), hosts.data() + static_cast<size_t>(peer) * MPI_MAX_PROCESSOR_NAME);
  // Ping-pong: 1 B to max_bytes, x4.
  for (size_t bytes = 1; bytes <= max_bytes && size > 1; bytes *= 4) {
    std::vector<double> t;
    int reps = 3;
    for (int r = -1; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (rank == peer) {
        MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
      }
      double dt = (MPI_Wtime() - t0) / 2;
      MPI_Bcast(&dt, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      if (r < 0) reps = reps_for(2 * dt, seconds);  // every rank learns the count from rank 0's warm-up
      else t.push_back(dt);
    }
    if (rank == 0)
      std::printf("{\"kind\": \"pingpong\", \"bytes\": %zu, \"seconds\": %.9g, \"gbs\": %.6g, \"reps\": %d}\n", bytes,
                  median(t), static_cast<double>(bytes) / median(t) / 1e9, reps);
  }
  // All-reduce: 4 KB to max_bytes, x4.
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const int count = static_cast<int>(bytes / sizeof(float));
    std::vector<double> t;
    int reps = 3;
    for (int r = -1; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double dt = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank's
      if (r < 0) reps = reps_for(dt, seconds);
      else t.push_back(dt);
    }
    const double s = median(t), alg = static_cast<double>(bytes) / s / 1e9;
    if (rank == 0)
      std::printf("{\"kind\": \"allreduce\", \"bytes\": %zu, \"seconds\": %.9g, \"alg_gbs\": %.6g, \"bus_gbs\": %.6g, "
                  "\"reps\": %d}\n",
                  bytes, s, alg, alg * 2.0 * (size - 1) / size, reps);
  }
  MPI_Finalize();
  return 0;
}

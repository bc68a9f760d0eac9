// Data-parallel pieces that need no MPI: the gradient reducer against a scripted communicator
// (buckets, their order, overlap with backward, averaging, parameters without gradients) and
// the loader's sharding (every sample of an epoch exactly once).
#include <algorithm>
#include <map>
#include <tuple>
#include <atomic>
#include <numeric>
#include <set>
#include "train/data_parallel.h"
#include "datasets/loader.h"
#include "datasets/synthetic.h"
#include "distributed/grad_reducer.h"
#include "distributed/launcher.h"
#include "distributed/sync.h"
#include "engine/backend.h"
#include "engine/nn/layers.h"
#include "models/mlp.h"
#include "tests/test_support.h"

using namespace duet;

namespace {
// Rank 0 of `world` ranks that all hold the same values (so a sum is the value times world, exact
// for a power of two) except where `other` adds what the other ranks hold beyond that.
class ScriptedComm final : public dist::Communicator {
public:
  ScriptedComm(int world, bool threads, int local_rank = 0) : world_(world), threads_(threads), local_rank_(local_rank) {}
  int rank() const override { return 0; }
  int size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return 1; }
  bool thread_safe() const override { return threads_; }
  std::string describe() const override { return "scripted"; }
  void all_reduce_sum(float* d, size_t n) override { record(d, n); }
  void all_reduce_sum(double* d, size_t n) override { record(d, n); }
  void broadcast(void*, size_t, int) override { ++broadcasts; }
  std::vector<uint64_t> all_gather(uint64_t v) override { return std::vector<uint64_t>(static_cast<size_t>(world_), v); }
  void barrier() override {}
  std::vector<std::string> gather(const std::string& b, int) override { return std::vector<std::string>(static_cast<size_t>(world_), b); }
  [[noreturn]] void abort(const std::string& m, int) override { throw Error(m); }
  // GPU memory, when `gpu` is set: a sum is recorded and leaves the values as they are (as if the
  // other ranks held zeros), so the averages come out as one rank's gradient over the world size.
  bool sums_on(Device d) const override { return d.type == DeviceType::cpu || gpu; }
  void start_device_all_reduce_sum(void*, size_t n, DType, Device) override {
    sizes.push_back(n);
    during_backward.push_back(in_backward.load());
  }
  void wait_device(Device) override { ++device_waits; }

  bool gpu = false;
  int device_waits = 0;
  std::vector<size_t> sizes;             // of each all-reduce, in call order
  std::vector<bool> during_backward;     // whether backward was still running at each call
  std::atomic<bool> in_backward{false};
  int broadcasts = 0;

private:
  template <class T>
  void record(T* d, size_t n) {
    sizes.push_back(n);
    during_backward.push_back(in_backward.load());
    for (size_t i = 0; i < n; ++i) d[i] *= static_cast<T>(world_);
  }
  int world_;
  bool threads_;
  int local_rank_;
};

struct Step {
  std::vector<Tensor> grads_alone;  // one process's gradients
  std::vector<Tensor> grads_reduced;
};

// One backward of an MLP on fixed data, once without and once with the reducer.
Step run_step(ScriptedComm& comm, double bucket_mb, DType dtype, Device device = Device::cpu()) {
  const BackendGuard backend(DeviceType::cpu, dtype == DType::f64 ? Backend::reference : default_backend(DeviceType::cpu));
  manual_seed(3);
  auto model = models::mlp(12, 5, 16, 3);
  model->to(dtype);
  model->to(device);
  const Tensor x = Tensor::randn({8, 12}, TensorOptions(dtype)).to(device);
  const Tensor y = Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 0, 1, 2}, {8}).to(device);
  Step s;
  cross_entropy((*model)(x), y).backward();
  for (const Tensor& p : model->parameters()) s.grads_alone.push_back(p.grad().clone());
  model->zero_grad();
  dist::GradReducer reducer(comm, model->parameters(), {.bucket_mb = bucket_mb});
  {
    const LeafGradHookGuard hook = reducer.watch_backward();
    comm.in_backward = true;
    cross_entropy((*model)(x), y).backward();
    comm.in_backward = false;
  }
  reducer.finish();
  for (const Tensor& p : model->parameters()) s.grads_reduced.push_back(p.grad());
  return s;
}
}  // namespace

TEST(GradReducer, BucketsInOrderOverlapBackwardAndAverage) {
  for (const bool threads : {false, true}) {
    SCOPED_TRACE(threads ? "communication thread" : "inline");
    ScriptedComm comm(4, threads);
    // Parameters (reverse order): fc 16x5+5, hidden 16x16+16 twice, first 12x16+16, in f64 (8 bytes):
    // a 2 KB bucket limit splits them into several buckets.
    const Step s = run_step(comm, 0.002, DType::f64);
    ASSERT_GE(comm.sizes.size(), 3u);
    size_t total = 0;
    for (size_t n : comm.sizes) total += n;
    // Every gradient element once, plus one "had a gradient" flag per parameter.
    EXPECT_EQ(total, static_cast<size_t>(12 * 16 + 16 + 2 * (16 * 16 + 16) + 16 * 5 + 5) + 8);
    if (!threads) {
      // Inline, a bucket is all-reduced as soon as it is complete: all but the last (holding the
      // first layer, whose gradient is final last) while backward still runs.
      for (size_t i = 0; i + 1 < comm.during_backward.size(); ++i) EXPECT_TRUE(comm.during_backward[i]) << "bucket " << i;
    }
    ASSERT_EQ(s.grads_alone.size(), s.grads_reduced.size());
    for (size_t i = 0; i < s.grads_alone.size(); ++i)
      EXPECT_EQ(s.grads_alone[i].to_vector<double>(), s.grads_reduced[i].to_vector<double>()) << "parameter " << i;
  }
}

TEST(GradReducer, BucketSizeFollowsTheLimit) {
  ScriptedComm one(2, false), many(2, false);
  run_step(one, 25, DType::f32);
  run_step(many, 0.0001, DType::f32);  // 100 bytes: one parameter per bucket
  EXPECT_EQ(one.sizes.size(), 1u);
  EXPECT_EQ(many.sizes.size(), 8u);
  // Reverse registration order: the classifier's bias (5 values and its flag) goes first.
  EXPECT_EQ(many.sizes.front(), 6u);
}

TEST(GradReducer, ParameterWithoutGradientStaysWithoutOne) {
  ScriptedComm comm(2, false);
  manual_seed(1);
  auto model = models::mlp(6, 3, 8, 1);
  const std::vector<Tensor> params = model->parameters();
  dist::GradReducer reducer(comm, params, {.bucket_mb = 25});
  // A backward that reaches only the classifier's bias.
  {
    const LeafGradHookGuard hook = reducer.watch_backward();
    sum(params.back()).backward();
  }
  reducer.finish();
  for (size_t i = 0; i + 1 < params.size(); ++i) EXPECT_FALSE(params[i].grad().defined()) << "parameter " << i;
  EXPECT_EQ(params.back().grad().to_vector<float>(), std::vector<float>(3, 1.0f));
  // A second backward before finish() is refused: gradients of one step only.
  {
    const LeafGradHookGuard hook = reducer.watch_backward();
    sum(params.back()).backward();
    try {
      sum(params.back()).backward();
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gradient accumulation is not supported"), std::string::npos) << e.what();
    }
  }
}

TEST(DistSync, SettingsCheckPassesWhenEqual) {
  ScriptedComm comm(2, false);  // all_gather answers this rank's value for every rank
  EXPECT_NO_THROW(dist::check_same_on_all_ranks(comm, {{"--lr", "0.1"}, {"--batch", "8"}}));
}

// Sharded training batches: step s of rank r holds exactly the samples of one process's batch s
// of size W * b, every sample of the full global batches once; the remainder (< W * b) is
// dropped. Sharded evaluation (no drop_last) covers every sample exactly once.
TEST(DistLoader, ShardsCoverEverySampleOnce) {
  const datasets::SyntheticDataset data(103, 4, 1, 4, 4, 7);
  for (const int world : {2, 3}) {
    SCOPED_TRACE(world);
    const int64_t b = 5;
    datasets::LoaderOptions one;
    one.batch_size = b * world;
    one.seed = 11;
    one.num_workers = 0;
    const datasets::DataLoader single(data, one);
    const auto global = single.epoch_batches(2);
    std::vector<std::vector<std::vector<int64_t>>> ranks;
    std::vector<int64_t> eval_seen;
    for (int r = 0; r < world; ++r) {
      datasets::LoaderOptions o = one;
      o.batch_size = b;
      o.rank = r;
      o.world_size = world;
      o.drop_last = true;
      const datasets::DataLoader l(data, o);
      ranks.push_back(l.epoch_batches(2));
      EXPECT_EQ(l.batches_per_epoch(), 103 / (b * world));
      o.drop_last = false;
      o.shuffle = false;
      for (const auto& batch : datasets::DataLoader(data, o).epoch_batches(0))
        eval_seen.insert(eval_seen.end(), batch.begin(), batch.end());
    }
    const size_t steps = ranks[0].size();
    EXPECT_EQ(steps, static_cast<size_t>(103 / (b * world)));
    std::set<int64_t> trained;
    for (size_t s = 0; s < steps; ++s) {
      std::vector<int64_t> joined;
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(ranks[static_cast<size_t>(r)].size(), steps) << "rank " << r;
        const auto& part = ranks[static_cast<size_t>(r)][s];
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, global[s]) << "step " << s;
      trained.insert(joined.begin(), joined.end());
    }
    EXPECT_EQ(trained.size(), steps * static_cast<size_t>(b * world)) << "a sample was trained on twice";
    EXPECT_LT(103 - static_cast<int64_t>(trained.size()), b * world);
    std::sort(eval_seen.begin(), eval_seen.end());
    std::vector<int64_t> all(103);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(eval_seen, all);
  }
}

// --sync-bn's formulas: BatchNorm2d with the replica hook (here one replica: the identity)
// computes what the fused batch_norm op computes, forward, backward and running statistics.
TEST(SyncBatchNorm, OneReplicaEqualsTheFusedOp) {
  const BackendGuard backend(DeviceType::cpu, Backend::reference);
  for (const bool relu : {false, true}) {
    SCOPED_TRACE(relu ? "with relu" : "plain");
    std::vector<std::vector<double>> results;
    for (const bool synced : {false, true}) {
      nn::BatchNorm2d bn(3);
      bn.to(DType::f64);
      bn.weight.copy_(Tensor::from_vector<double>({0.5, 1.5, -2}, {3}));
      bn.bias.copy_(Tensor::from_vector<double>({0.1, -0.2, 0.3}, {3}));
      int calls = 0;
      if (synced) bn.sum_over_replicas = [&](const Tensor& t) {
        ++calls;
        return t;
      };
      Tensor x = duet::testing::random_tensor({4, 3, 2, 5}, 17).set_requires_grad(true);
      const Tensor r = duet::testing::random_tensor({4, 3, 2, 5}, 18);
      const Tensor y = relu ? bn.forward_act(x, Activation::relu) : bn.forward(x);
      sum(mul(y, r)).backward();
      if (synced) {
        EXPECT_EQ(calls, 2);
      }
      std::vector<double> all = y.to_vector<double>();
      for (const Tensor& t : {x.grad(), bn.weight.grad(), bn.bias.grad(), bn.running_mean, bn.running_var}) {
        const std::vector<double> v = t.to_vector<double>();
        all.insert(all.end(), v.begin(), v.end());
      }
      results.push_back(all);
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i) EXPECT_NEAR(results[0][i], results[1][i], 1e-12) << i;
  }
}

// GPU buckets (what NCCL sums), on one GPU with a scripted communicator: the gradients go into
// device buckets during backward, each bucket's sum is queued when it is complete, finish() makes
// the compute stream wait once, and the averages land in .grad on the GPU.
TEST(GradReducer, GpuBucketsQueueTheirSumsAndAverageOnTheDevice) {
  if (device_count(DeviceType::cuda) == 0) DUET_SKIP_WITHOUT_CUDA("GPU buckets need a CUDA device");
  ScriptedComm comm(2, true);
  comm.gpu = true;
  const Step s = run_step(comm, 0.002, DType::f32, Device::cuda(0));
  ASSERT_GE(comm.sizes.size(), 2u);
  for (size_t i = 0; i + 1 < comm.during_backward.size(); ++i) EXPECT_TRUE(comm.during_backward[i]) << "bucket " << i;
  EXPECT_EQ(comm.device_waits, 1);
  ASSERT_EQ(s.grads_alone.size(), s.grads_reduced.size());
  for (size_t i = 0; i < s.grads_alone.size(); ++i) {
    EXPECT_EQ(s.grads_reduced[i].device(), Device::cuda(0));
    const std::vector<float> alone = s.grads_alone[i].to(Device::cpu()).to_vector<float>();
    const std::vector<float> reduced = s.grads_reduced[i].to(Device::cpu()).to_vector<float>();
    ASSERT_EQ(alone.size(), reduced.size());
    for (size_t k = 0; k < alone.size(); ++k) EXPECT_EQ(reduced[k], alone[k] * 0.5f) << "parameter " << i << " element " << k;
  }
}

// Without NCCL, GPU parameters are refused when the reducer is made, naming what is missing.
TEST(GradReducer, GpuParametersNeedACommunicatorThatSumsGpuMemory) {
  dist::SingleProcess one;
  EXPECT_FALSE(one.sums_on(Device::cuda(0)));
  EXPECT_TRUE(one.sums_on(Device::cpu()));
  EXPECT_ERROR_HAS(one.start_device_all_reduce_sum(nullptr, 1, DType::f32, Device::cuda(0)), "need NCCL");
}

// Ranks on one machine split its cores, or their control group's CPU quota where smaller, and
// never take more threads than the cores the launcher bound them to.
TEST(DataParallelOptions, RanksShareTheCoresOrTheQuota) {
  EXPECT_EQ(app::rank_thread_share(16, 0, 16, 4), 4);
  EXPECT_EQ(app::rank_thread_share(16, 6, 16, 2), 3) << "a quota of 6 CPUs for two ranks";
  EXPECT_EQ(app::rank_thread_share(16, 32, 16, 2), 8) << "a quota above the machine changes nothing";
  EXPECT_EQ(app::rank_thread_share(16, 0, 1, 2), 1) << "bound to one core each";
  EXPECT_EQ(app::rank_thread_share(2, 0, 2, 4), 1) << "more ranks than cores still get a thread";
  EXPECT_EQ(app::rank_thread_share(64, 2, 64, 4), 1);
}

// Issue 44: what the launcher tells a rank, read the same way from srun (--mpi=pmix) as from
// mpirun: rank, size, local rank and count from Slurm's variables (tasks per node as Slurm writes
// them), and the CPUs per task, which cap a rank's threads.
TEST(LaunchEnv, SrunWithPmixAsSlurmSetsIt) {
  // Task 5 of `srun --mpi=pmix -N 3 --ntasks-per-node=2,2,1... --cpus-per-task=4` on the third node.
  const std::map<std::string, std::string> srun{
      {"SLURM_PROCID", "5"},          {"SLURM_LOCALID", "1"},           {"SLURM_NODEID", "2"},
      {"SLURM_NTASKS", "7"},          {"SLURM_STEP_NUM_TASKS", "7"},    {"SLURM_NNODES", "3"},
      {"SLURM_STEP_NUM_NODES", "3"},  {"SLURM_TASKS_PER_NODE", "2(x2),3"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x2),3"}, {"SLURM_CPUS_PER_TASK", "4"}, {"PMIX_RANK", "5"}};
  const auto lookup = [](const std::map<std::string, std::string>& env) {
    return [&env](const char* name) -> const char* {
      const auto it = env.find(name);
      return it == env.end() ? nullptr : it->second.c_str();
    };
  };
  const dist::LaunchEnv e = dist::launch_env(lookup(srun));
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_TRUE(e.mpi);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.size, 7);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_size, 3) << "node 2 of \"2(x2),3\" runs 3 tasks";
  EXPECT_EQ(e.node, 2);
  EXPECT_EQ(e.nodes, 3);
  EXPECT_EQ(e.cpus_per_task, 4);
  // srun without an MPI plug-in: Slurm's variables, no PMIx: not an MPI launch (world() refuses it).
  std::map<std::string, std::string> plain = srun;
  plain.erase("PMIX_RANK");
  EXPECT_FALSE(dist::launch_env(lookup(plain)).mpi);
  // mpirun (inside an allocation or not): Open MPI's variables win.
  const std::map<std::string, std::string> mpirun{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  const dist::LaunchEnv m = dist::launch_env(lookup(mpirun));
  EXPECT_EQ(m.launcher, "mpirun");
  EXPECT_EQ(std::make_tuple(m.rank, m.size, m.local_rank, m.local_size, m.cpus_per_task), std::make_tuple(3, 4, 1, 2, 0));
  EXPECT_EQ(dist::launch_env(lookup({})).launcher, "");
  EXPECT_EQ(dist::slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(dist::slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(dist::slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(dist::slurm_tasks_on_node("2(x3),1", 4), -1);
  EXPECT_EQ(dist::slurm_tasks_on_node("bad", 0), -1);
}

// Issue 41: the GPU of a local rank is its index modulo the devices the rank sees, so that a
// launcher that masks devices per rank (Slurm's --gpus-per-task=1: rank 1 sees one device, its
// own, as cuda:0) works as well as one that shows every rank all of them. Before, rank 1 asked
// for cuda:1 and failed under Slurm.
TEST(DataParallelOptions, EachRankTakesItsLocalRankModuloTheVisibleGpus) {
  EXPECT_EQ(app::rank_gpu(3, 4), 3) << "every GPU visible to every rank";
  EXPECT_EQ(app::rank_gpu(1, 1), 0) << "a launcher that shows each rank its own GPU";
  EXPECT_EQ(app::rank_gpu(0, 1), 0);
  EXPECT_EQ(app::rank_gpu(5, 4), 1) << "more ranks than GPUs share them round robin";
  EXPECT_ERROR_HAS(app::rank_gpu(1, 0), "local rank 1 sees no CUDA device");
}

// Under mpirun each rank on a machine takes the GPU of its local rank and its share of the cores,
// unless the command line chose; one process keeps what it was given.
TEST(DataParallelOptions, EachRankTakesTheGpuOfItsLocalRank) {
  ScriptedComm rank3(4, false, 3);
  app::GlobalOptions g;
  g.device = "cuda";
  if (const int gpus = device_count(DeviceType::cuda); gpus > 0)
    EXPECT_EQ(app::options_for_rank(rank3, g).device, fmt::format("cuda:{}", 3 % gpus));
  else
    EXPECT_ERROR_HAS(app::options_for_rank(rank3, g), "sees no CUDA device");
  g.device = "cpu";
  EXPECT_GE(app::options_for_rank(rank3, g).threads, 1);
  g.device = "cuda";
  g.device = "cuda:0";
  g.threads = 5;
  EXPECT_EQ(app::options_for_rank(rank3, g).device, "cuda:0") << "an explicit index is kept";
  EXPECT_EQ(app::options_for_rank(rank3, g).threads, 5);
  g.device = "cpu";
  EXPECT_EQ(app::options_for_rank(rank3, g).device, "cpu");
  ScriptedComm alone(1, false);
  g.device = "cuda";
  g.threads = 0;
  EXPECT_EQ(app::options_for_rank(alone, g).device, "cuda");
  EXPECT_EQ(app::options_for_rank(alone, g).threads, 0);
}

// Data-parallel training across processes, end to end under mpirun: N ranks with batch b per
// rank end with the parameters of one process with batch N * b (f64 on the reference backend to
// 1e-12, f32 on the cpu backend to 1e-5, through dist_worker and through `duet train`); sharded
// evaluation equals one process's bit for bit; mismatched options, an error on one rank and a
// killed rank end the job in bounded time; resuming needs the same number of ranks.
//
// Without mpirun or an MPI build the tests skip visibly; DUET_REQUIRE_MPI=1 (CI) makes that a
// failure. OMPI_ALLOW_RUN_AS_ROOT is set here, for the tests only: CI runs as root.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <fmt/format.h>
#include "train/checkpoint.h"
#include "engine/serialize.h"
#include "tests/dist_support.h"
#include "tests/test_support.h"

using namespace duet;
using namespace duet::testing;
namespace fs = std::filesystem;

namespace {
const std::string kMpirun = DUET_MPIEXEC;
const std::string kDuet = DUET_CLI_PATH;
const std::string kWorker = DUET_DIST_WORKER;

#define DUET_REQUIRE_MPI()                                                                                        \
  do {                                                                                                            \
    const char* why = !DUET_BUILT_WITH_MPI ? "this duet was built without MPI (apt-get install libopenmpi-dev)"   \
                      : kMpirun.empty()    ? "mpirun was not found (apt-get install openmpi-bin)"                 \
                                           : nullptr;                                                             \
    if (why) {                                                                                                    \
      if (std::getenv("DUET_REQUIRE_MPI")) FAIL() << "DUET_REQUIRE_MPI is set, but " << why;                     \
      GTEST_SKIP() << why;                                                                                        \
    }                                                                                                             \
  } while (0)

std::string mpi(int np, const std::string& args) { return fmt::format("{} --oversubscribe -np {} {}", kMpirun, np, args); }

// N ranks with batch b against one process with batch N * b (must match) and with batch b (must
// not: the comparison can tell the two apart). AdamW gets its own tolerance: it divides each
// gradient by its running magnitude, so where a gradient is rounding noise around zero (summed in
// another order by N ranks than by one process) its step keeps the full learning rate whatever
// the noise's sign.
void expect_equivalent_training(const std::string& backend, double sgd_tol, double adamw_tol) {
  const std::string dir = temp_dir("worker_" + backend);
  for (const int np : {2, 3}) {
    for (const std::string opt : {"sgd", "adamw"}) {
      SCOPED_TRACE(fmt::format("{} ranks, {}", np, opt));
      const double tol = opt == "adamw" ? adamw_tol : sgd_tol;
      const int64_t b = 4, steps = 7;  // 96 samples: 8 or 12 steps per epoch
      const std::string many = fmt::format("{}/{}_{}.safetensors", dir, opt, np);
      const std::string one = fmt::format("{}/{}_{}_one.safetensors", dir, opt, np);
      const std::string small = fmt::format("{}/{}_{}_small.safetensors", dir, opt, np);
      const Proc r = sh(mpi(np, fmt::format("{} train {} {} {} {} {}", kWorker, backend, opt, b, steps, many)));
      ASSERT_EQ(r.rc, 0) << r.out;
      const Proc s = sh(fmt::format("{} train {} {} {} {} {}", kWorker, backend, opt, b * np, steps, one));
      ASSERT_EQ(s.rc, 0) << s.out;
      const Proc t = sh(fmt::format("{} train {} {} {} {} {}", kWorker, backend, opt, b, steps, small));
      ASSERT_EQ(t.rc, 0) << t.out;
      const double d = max_relative_difference(load_safetensors(many), load_safetensors(one));
      EXPECT_LE(d, tol) << "parameters of " << np << " ranks vs one process with the global batch";
      const double other = max_relative_difference(load_safetensors(many), load_safetensors(small));
      EXPECT_GT(other, 100 * tol) << "one process with the per-rank batch should train differently";
      std::cout << fmt::format("[ measure  ] {} {} ranks {}: max relative difference {:.3g} (per-rank batch alone: {:.3g})\n",
                               backend, np, opt, d, other);
    }
  }
}
}  // namespace

TEST(Distributed, F64ReferenceTrainingEqualsOneProcess) {
  DUET_REQUIRE_MPI();
  expect_equivalent_training("reference", 1e-12, 1e-12);
}

TEST(Distributed, F32CpuTrainingEqualsOneProcess) {
  DUET_REQUIRE_MPI();
  // f32 sums: SGD within 2e-7 of one process, AdamW 1.8e-5 for 3 ranks on AMD Zen 3's kernels
  // (within 1e-5 on the AVX-512 CPUs), against 0.33 and more for a process that trains differently.
  expect_equivalent_training("cpu", 1e-5, 1e-4);
}

TEST(Distributed, ShardedEvaluationEqualsOneProcessExactly) {
  DUET_REQUIRE_MPI();
  const std::string dir = temp_dir("eval");
  const Proc s = sh(fmt::format("{} eval cpu 16 {}/one.txt", kWorker, dir));  // 70 images: 5 batches, the last of 6
  ASSERT_EQ(s.rc, 0) << s.out;
  const std::string one = read_text(dir + "/one.txt");
  ASSERT_TRUE(contains(one, "images 70")) << one;
  for (const int np : {2, 3}) {
    const Proc r = sh(mpi(np, fmt::format("{} eval cpu 16 {}/{}.txt", kWorker, dir, np)));
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(read_text(fmt::format("{}/{}.txt", dir, np)), one) << np << " ranks";
  }
}

// `duet eval` under mpirun: sharded, and rank 0 prints what one process prints.
TEST(Distributed, DuetEvalShardedPrintsWhatOneProcessPrints) {
  DUET_REQUIRE_MPI();
  const std::string dir = temp_dir("duet_eval");
  const Proc t = sh(fmt::format("{} train --model mlp --width-mult 0.25 --dataset synthetic --train-size 64 --test-size 70 "
                                "--batch 16 --epochs 1 --workers 0 --checkpoint {}/m.safetensors",
                                kDuet, dir));
  ASSERT_EQ(t.rc, 0) << t.out;
  // Without the timing and the rank count, the output is the same.
  const auto result = [](std::string out) {
    const size_t timing = out.find("  (");
    if (timing != std::string::npos) out.erase(timing, out.find(')', timing) + 1 - timing);
    const size_t ranks = out.find(" | sharded over");
    if (ranks != std::string::npos) out.erase(ranks, out.find('\n', ranks) - ranks);
    return out;
  };
  const std::string eval = fmt::format("{} eval {}/m.safetensors --batch 16 --workers 0 --threads 1", kDuet, dir);
  const Proc one = sh(eval);
  ASSERT_EQ(one.rc, 0) << one.out;
  ASSERT_TRUE(contains(one.out, "(70 images") || contains(one.out, "/70)")) << one.out;
  for (const int np : {2, 3}) {
    const Proc many = sh(mpi(np, eval));
    ASSERT_EQ(many.rc, 0) << many.out;
    EXPECT_TRUE(contains(many.out, fmt::format("sharded over {} ranks", np))) << many.out;
    EXPECT_EQ(result(many.out), result(one.out));
  }
}

// `duet train` itself: the trainer's sharding, broadcast, reducer, metrics and rank-0 output.
// SGD's parameters agree element by element to 1e-5 (relative to the tensor's largest). AdamW's
// agree as a whole (relative Euclidean norm) to 1e-5: an element whose gradient is a sum of
// nearly cancelling terms has an update of about +-lr whose sign follows the rounding of that sum,
// and the rounding differs between one GEMM over W * b samples and W GEMMs over b; a handful of
// such elements differ by up to about lr / 25 after a dozen steps, in one process's f32 as well
// when the batch is split differently.
TEST(Distributed, DuetTrainEqualsOneProcess) {
  DUET_REQUIRE_MPI();
  const std::string dir = temp_dir("train");
  for (const int np : {2, 3}) {
    for (const std::string opt : {"sgd --nesterov --schedule cosine", "adamw --schedule onecycle"}) {
      SCOPED_TRACE(fmt::format("{} ranks, {}", np, opt));
      const int64_t b = 10, train = np == 2 ? 200 : 180;  // whole global batches: no remainder to drop
      const std::string common = fmt::format(
          "train --model mlp --width-mult 0.25 --dataset synthetic --train-size {} --test-size 70 --epochs 2 "
          "--optimizer {} --workers 0 --threads 1 --log-every 3",
          train, opt);
      const std::string tag = fmt::format("{}_{}", np, opt.substr(0, opt.find(' ')));
      // The first run also profiles: communication is phase comm (exposed on the training thread).
      const bool profile = np == 2 && opt.starts_with("sgd");
      const Proc r = sh(mpi(np, fmt::format("{} {} --batch {} --checkpoint {}/n{}.safetensors --bucket-mb 0.01{}", kDuet,
                                            common, b, dir, tag, profile ? " --profile " + dir + "/p.json" : "")));
      ASSERT_EQ(r.rc, 0) << r.out;
      if (profile) {
        std::ifstream f(dir + "/p.json");
        const nlohmann::json p = nlohmann::json::parse(f);
        EXPECT_GT(p["phases"]["mean_wall_ns"]["comm"].get<double>(), 0) << p["phases"].dump();
        EXPECT_TRUE(contains(p["op_table"].dump(), "comm.all_reduce")) << p["op_table"].dump();
        EXPECT_TRUE(contains(p["op_table"].dump(), "comm.wait"));
      }
      const Proc s = sh(fmt::format("{} {} --batch {} --checkpoint {}/one{}.safetensors", kDuet, common, b * np, dir, tag));
      ASSERT_EQ(s.rc, 0) << s.out;
      EXPECT_TRUE(contains(r.out, fmt::format("global batch {} ({} per rank)", b * np, b))) << r.out;
      EXPECT_EQ(r.out.find("epoch 1/2  loss"), r.out.rfind("epoch 1/2  loss")) << "only rank 0 prints:\n" << r.out;
      EXPECT_TRUE(contains(r.out, "epoch 2/2 step 3/")) << "plain progress lines, no bar:\n" << r.out;
      const app::Checkpoint many = app::read_checkpoint(fmt::format("{}/n{}.safetensors", dir, tag));
      const app::Checkpoint one = app::read_checkpoint(fmt::format("{}/one{}.safetensors", dir, tag));
      const double elementwise = max_relative_difference(many.model, one.model);
      const double norm = relative_l2_difference(many.model, one.model);
      if (opt.starts_with("sgd")) {
        EXPECT_LE(elementwise, 1e-5);
      }
      EXPECT_LE(norm, 1e-5);
      std::cout << fmt::format("[ measure  ] duet train, {} ranks, {}: max relative difference {:.3g}, relative norm {:.3g}\n",
                               np, opt, elementwise, norm);
      EXPECT_EQ(many.state.step, one.state.step);
      EXPECT_EQ(many.state.config["world_size"], np);
      // The epoch's metrics are global: the same images counted, the same mean loss.
      const nlohmann::json m = many.state.metrics, o = one.state.metrics;
      EXPECT_NEAR(m["train_loss"].get<double>(), o["train_loss"].get<double>(), 1e-5);
      EXPECT_NEAR(m["train_acc"].get<double>(), o["train_acc"].get<double>(), 1.5 / static_cast<double>(train));
      EXPECT_NEAR(m["test_loss"].get<double>(), o["test_loss"].get<double>(), 1e-5);
      EXPECT_NEAR(m["test_acc"].get<double>(), o["test_acc"].get<double>(), 1.5 / 70);
    }
  }
}

// --amp fp16: the loss scaler sees the same averaged gradients on every rank, so all take and
// skip the same steps. Half-precision GEMMs round a W * b sum differently from W sums of b (as
// they round differently from f32: about 5% here, either way), so parameters agree to that level.
TEST(Distributed, DuetTrainWithLossScaling) {
  DUET_REQUIRE_MPI();
  const std::string dir = temp_dir("amp");
  const std::string common =
      "train --model mlp --width-mult 0.25 --dataset synthetic --train-size 200 --test-size 70 --epochs 2 --optimizer "
      "sgd --amp fp16 --workers 0 --threads 1";
  const Proc r = sh(mpi(2, fmt::format("{} {} --batch 10 --checkpoint {}/n.safetensors", kDuet, common, dir)));
  ASSERT_EQ(r.rc, 0) << r.out;
  const Proc s = sh(fmt::format("{} {} --batch 20 --checkpoint {}/one.safetensors", kDuet, common, dir));
  ASSERT_EQ(s.rc, 0) << s.out;
  const app::Checkpoint many = app::read_checkpoint(dir + "/n.safetensors");
  const app::Checkpoint one = app::read_checkpoint(dir + "/one.safetensors");
  EXPECT_EQ(many.state.grad_scaler, one.state.grad_scaler);
  const double norm = relative_l2_difference(many.model, one.model);
  EXPECT_LE(norm, 0.1);
  std::cout << fmt::format("[ measure  ] duet train --amp fp16, 2 ranks: relative norm of the difference {:.3g}\n", norm);
}

// --sync-bn: a model with batch norm (small_cnn) on N ranks matches one process with the global
// batch to 1e-5 (relative norm), running statistics included; without it, each rank normalises its own batch and the
// runs differ by far more. Three steps: a batch-norm network at lr 0.05 amplifies f32 rounding
// from step to step (after 20 steps even the synchronised run differs by 5e-3).
TEST(Distributed, SyncBatchNormMatchesOneProcess) {
  DUET_REQUIRE_MPI();
  const std::string dir = temp_dir("sync_bn");
  for (const int np : {2, 3}) {
    SCOPED_TRACE(fmt::format("{} ranks", np));
    const std::string common = fmt::format(
        "train --model small_cnn --dataset synthetic --train-size {} --test-size 40 --epochs 1 --optimizer sgd "
        "--workers 0 --threads 1",
        3 * 8 * np);
    const Proc synced = sh(mpi(np, fmt::format("{} {} --batch 8 --sync-bn --checkpoint {}/s{}.safetensors", kDuet, common, dir, np)));
    ASSERT_EQ(synced.rc, 0) << synced.out;
    EXPECT_TRUE(contains(synced.out, "sync-bn: 3 batch norm layers")) << synced.out;
    const Proc alone = sh(mpi(np, fmt::format("{} {} --batch 8 --checkpoint {}/a{}.safetensors", kDuet, common, dir, np)));
    ASSERT_EQ(alone.rc, 0) << alone.out;
    const Proc one = sh(fmt::format("{} {} --batch {} --checkpoint {}/o{}.safetensors", kDuet, common, 8 * np, dir, np));
    ASSERT_EQ(one.rc, 0) << one.out;
    const NamedTensors o = app::read_checkpoint(fmt::format("{}/o{}.safetensors", dir, np)).model;
    // By norm over all tensors: the batch norms' biases start at 0 and stay near it, so a tensor's
    // largest value is no scale for them.
    const NamedTensors s_ = app::read_checkpoint(fmt::format("{}/s{}.safetensors", dir, np)).model;
    const double d = relative_l2_difference(s_, o);
    const double unsynced = relative_l2_difference(app::read_checkpoint(fmt::format("{}/a{}.safetensors", dir, np)).model, o);
    EXPECT_LE(d, 1e-5);
    EXPECT_GT(unsynced, 100 * d);
    std::cout << fmt::format("[ measure  ] --sync-bn, {} ranks, 3 steps: relative norm of the difference {:.3g} (max "
                             "relative {:.3g}); without --sync-bn {:.3g}\n",
                             np, d, max_relative_difference(s_, o), unsynced);
  }
}

TEST(Distributed, ResumeRestoresEveryRankAndNeedsTheSameRankCount) {
  DUET_REQUIRE_MPI();
  const std::string dir = temp_dir("resume");
  const std::string common =
      "train --model mlp --width-mult 0.25 --dataset synthetic --train-size 120 --test-size 40 --batch 10 --optimizer "
      "sgd --workers 0 --threads 1";
  const Proc whole = sh(mpi(2, fmt::format("{} {} --epochs 2 --checkpoint {}/whole.safetensors", kDuet, common, dir)));
  ASSERT_EQ(whole.rc, 0) << whole.out;
  const Proc first = sh(mpi(2, fmt::format("{} {} --epochs 2 --stop-after-epochs 1 --checkpoint {}/part.safetensors",
                                          kDuet, common, dir)));
  ASSERT_EQ(first.rc, 0) << first.out;
  const Proc rest = sh(mpi(2, fmt::format("{} {} --epochs 2 --checkpoint {}/part.safetensors --resume {}/part.safetensors",
                                         kDuet, common, dir, dir)));
  ASSERT_EQ(rest.rc, 0) << rest.out;
  EXPECT_EQ(max_relative_difference(app::read_checkpoint(dir + "/part.safetensors").model,
                                    app::read_checkpoint(dir + "/whole.safetensors").model),
            0.0)
      << "a resumed 2-rank run should continue exactly";
  // Another number of ranks: refused, naming both counts.
  const Proc other = sh(mpi(3, fmt::format("{} {} --epochs 3 --resume {}/part.safetensors", kDuet, common, dir)), 60);
  EXPECT_NE(other.rc, 0);
  EXPECT_TRUE(contains(other.out, "written by a run on 2 ranks and this run has 3")) << other.out;
  const Proc alone = sh(fmt::format("{} {} --epochs 3 --resume {}/part.safetensors", kDuet, common, dir), 60);
  EXPECT_NE(alone.rc, 0);
  EXPECT_TRUE(contains(alone.out, "written by a run on 2 ranks and this run has 1")) << alone.out;
}

// srun without an MPI plug-in starts every task alone (Slurm's variables, no PMIx): duet refuses
// instead of letting each task train the whole job by itself.
TEST(Distributed, SrunWithoutAnMpiPluginIsRefused) {
  const Proc r = sh(fmt::format("env SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 {} train --model "
                                "mlp --dataset synthetic --train-size 16 --test-size 16 --epochs 1 --workers 0",
                                kDuet),
                    60);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "srun started this process as task 1 of 4 without an MPI plug-in")) << r.out;
  EXPECT_TRUE(contains(r.out, "srun --mpi=pmix")) << r.out;
}

TEST(Distributed, MismatchedOptionStopsEveryRankNamingIt) {
  DUET_REQUIRE_MPI();
  const std::string args = "train --model mlp --dataset synthetic --train-size 64 --test-size 16 --batch 8 --epochs 1 "
                           "--workers 0 --threads 1";
  const Proc r = sh(fmt::format("{} --oversubscribe -np 1 {} {} --lr 0.1 : -np 1 {} {} --lr 0.2", kMpirun, kDuet, args,
                               kDuet, args),
                   60);
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.out, "--lr differs (rank 0: 0.1, rank 1: 0.2)")) << r.out;
  EXPECT_LT(r.seconds, 50);
}

// An error only rank 1 hits (its data folder is missing, rank 0's is there) after the ranks have
// started talking: rank 0 would wait for it forever without MPI_Abort.
TEST(Distributed, ErrorOnOneRankEndsTheJob) {
  DUET_REQUIRE_MPI();
  DUET_REQUIRE_DATA_DIR();
  const std::string dir = temp_dir("one_rank_error");
  fs::create_directories(dir + "/r0");
  fs::create_directories(dir + "/r1");
  fs::create_directory_symlink(duet::testing::data_dir() + "/cifar10", dir + "/r0/cifar");
  const std::string args = "train --model mlp --dataset cifar10 --data cifar --batch 8 --epochs 1 --workers 0 --threads 1";
  const Proc r = sh(fmt::format("{} --oversubscribe -np 1 --wdir {}/r0 {} {} : -np 1 --wdir {}/r1 {} {}", kMpirun, dir,
                               kDuet, args, dir, kDuet, args),
                   60);
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.out, "error on rank 1 of 2")) << r.out;
  EXPECT_TRUE(contains(r.out, "cifar")) << "the message names what was missing:\n" << r.out;
  EXPECT_LT(r.seconds, 50);
}

// A 2-rank run that would take many minutes (`extra` added to its options): once the ranks train
// (the first epoch's log line), rank 1 gets `signal`. Returns mpirun's result and the seconds from
// the signal to mpirun's end.
namespace {
std::pair<Proc, double> signal_rank_one_of_a_long_run(int signal, const std::string& name, const std::string& extra) {
  const std::string dir = temp_dir(name);
  const std::string cmd = mpi(2, fmt::format("sh -c \"echo \\$\\$ > {}/pid.\\$OMPI_COMM_WORLD_RANK; exec {} train "
                                             "--model mlp --dataset synthetic --train-size 512 --test-size 16 --batch 8 "
                                             "--epochs 100000 --workers 0 --threads 1 --log {}/log.jsonl {}\"",
                                             dir, kDuet, dir, extra));
  Proc r;
  std::thread runner([&] { r = sh(cmd, 120); });
  const auto t0 = std::chrono::steady_clock::now();
  pid_t victim = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    std::ifstream pid(dir + "/pid.1");
    if (pid >> victim && fs::exists(dir + "/log.jsonl") && fs::file_size(dir + "/log.jsonl") > 0) break;
    victim = 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto signalled = std::chrono::steady_clock::now();
  if (victim > 0) ::kill(victim, signal);
  else ADD_FAILURE() << "the ranks did not start training";
  runner.join();
  if (signal == SIGSTOP && victim > 0) ::kill(victim, SIGKILL);  // mpirun has ended; never leave it stopped
  return {r, std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count()};
}
}  // namespace

TEST(Distributed, KilledRankEndsTheJobInBoundedTime) {
  DUET_REQUIRE_MPI();
  const auto [r, after] = signal_rank_one_of_a_long_run(SIGKILL, "killed", "");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.rc, 124) << "mpirun still ran at the timeout:\n" << r.out;
  EXPECT_LT(after, 60) << r.out;
  std::cout << fmt::format("[ measure  ] the job ended {:.2f} s after rank 1 was killed (exit {})\n", after, r.rc);
}

// SIGTERM to one rank only: the ranks agree to stop at the same step (the per-step all-reduce
// carries the flag), rank 0 writes the checkpoint, and resuming on 2 ranks ends exactly where an
// uninterrupted run does.
TEST(Distributed, SignalToOneRankStopsAllAtTheSameStepAndResumes) {
  DUET_REQUIRE_MPI();
  const std::string dir = temp_dir("signal");
  const std::string common = fmt::format(
      "train --model mlp --width-mult 0.25 --dataset synthetic --image-size 8 --train-size 4000 --test-size 16 --batch 8 "
      "--epochs 6 "
      "--workers 0 --threads 1 --checkpoint {}/ck.safetensors --log {}/log.jsonl",
      dir, dir);
  Proc r;
  std::thread runner([&] {
    r = sh(mpi(2, fmt::format("sh -c \"echo \\$\\$ > {}/pid.\\$OMPI_COMM_WORLD_RANK; exec {} {}\"", dir, kDuet, common)));
  });
  const auto t0 = std::chrono::steady_clock::now();
  pid_t rank1 = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    std::ifstream pid(dir + "/pid.1");
    if (pid >> rank1 && fs::exists(dir + "/log.jsonl") && fs::file_size(dir + "/log.jsonl") > 0) break;
    rank1 = 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(rank1, 0) << "the ranks did not start training";
  ::kill(rank1, SIGTERM);
  runner.join();
  EXPECT_EQ(r.rc, 128 + SIGTERM) << r.out;
  ASSERT_TRUE(contains(r.out, "SIGTERM: stopped after")) << r.out;
  const app::Checkpoint stopped = app::read_checkpoint(dir + "/ck.safetensors");
  EXPECT_LT(stopped.state.step, 6 * 250) << "the run finished before the signal";
  const Proc rest = sh(mpi(2, fmt::format("{} {} --resume {}/ck.safetensors", kDuet, common, dir)));
  ASSERT_EQ(rest.rc, 0) << rest.out;
  const Proc whole = sh(mpi(2, fmt::format("{} {}", kDuet,
                                           common.substr(0, common.find(" --checkpoint")) +
                                               fmt::format(" --checkpoint {}/whole.safetensors", dir))));
  ASSERT_EQ(whole.rc, 0) << whole.out;
  EXPECT_EQ(max_relative_difference(app::read_checkpoint(dir + "/ck.safetensors").model,
                                    app::read_checkpoint(dir + "/whole.safetensors").model),
            0.0);
}

// A rank that hangs (here: stopped with SIGSTOP, so the launcher sees nothing wrong) makes the
// others end the job once a collective has waited --comm-timeout seconds, naming the rank that
// waited and the collective.
TEST(Distributed, HungRankEndsTheJobAfterTheCommTimeout) {
  DUET_REQUIRE_MPI();
  const auto [r, after] = signal_rank_one_of_a_long_run(SIGSTOP, "hung", "--comm-timeout 3");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.rc, 124) << "mpirun still ran at the timeout:\n" << r.out;
  EXPECT_TRUE(contains(r.out, "rank 0 of 2 waited 3 s")) << r.out;
  EXPECT_TRUE(contains(r.out, "--comm-timeout")) << r.out;
  EXPECT_TRUE(contains(r.out, "no answer within 0.75 s from rank 1 on ")) << "the rank that did not answer, named:\n" << r.out;
  EXPECT_GE(after, 3.0) << r.out;
  EXPECT_LT(after, 60) << r.out;
  std::cout << fmt::format("[ measure  ] the job ended {:.2f} s after rank 1 was stopped (timeout 3 s, exit {})\n", after,
                           r.rc);
}

// `duet predict` over the cat/dog test folder sharded over 2 and 3 ranks writes the same file, in
// the same order, as one process (one thread everywhere, so each batch is computed the same way).
TEST(Distributed, ShardedPredictWritesWhatOneProcessWrites) {
  DUET_REQUIRE_MPI();
  DUET_REQUIRE_DATA_DIR();
  const std::string dir = temp_dir("predict");
  const std::string ck = dir + "/ck.safetensors";
  const std::string photos = duet::testing::data_dir() + "/cats_dogs/test";
  // Any checkpoint of a model trained on image files will do: one epoch on the training photos
  // at 16 px with a narrow small_cnn.
  const Proc t = sh(fmt::format("{} train --model small_cnn --width-mult 0.25 --dataset folder --data {}/cats_dogs "
                                "--image-size 16 --epochs 1 --batch 32 --threads 2 --checkpoint {}",
                                kDuet, duet::testing::data_dir(), ck),
                    300);
  ASSERT_EQ(t.rc, 0) << t.out;
  for (const std::string ext : {"csv", "jsonl"}) {
    const std::string one = fmt::format("{}/one.{}", dir, ext);
    const Proc p = sh(fmt::format("{} predict -c {} {} --batch 16 --top 2 --threads 1 --out {}", kDuet, ck, photos, one));
    ASSERT_EQ(p.rc, 0) << p.out;
    EXPECT_TRUE(contains(p.out, "300 images")) << p.out;
    const std::string text = read_text(one);
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), ext == "csv" ? 301 : 300);
    EXPECT_TRUE(contains(text, "cats_dogs/test/cat/")) << text.substr(0, 300);
    EXPECT_LT(text.find("/cat/"), text.find("/dog/")) << "input order: sorted paths";
    for (const int np : {2, 3}) {
      const std::string many = fmt::format("{}/ranks{}.{}", dir, np, ext);
      const Proc m = sh(mpi(np, fmt::format("{} predict -c {} {} --batch 16 --top 2 --threads 1 --out {}", kDuet, ck,
                                            photos, many)));
      ASSERT_EQ(m.rc, 0) << m.out;
      EXPECT_TRUE(contains(m.out, fmt::format("sharded over {} ranks", np))) << m.out;
      EXPECT_EQ(read_text(many), text) << np << " ranks, " << ext;
    }
  }
}

// A profiled 2-rank run: every rank's report (rank 0's at --profile, rank 1's beside it), one trace
// with a process track per rank, and `duet report` of the two naming the slowest rank.
TEST(Distributed, ProfiledRunWritesEveryRanksReportAndOneTraceWithATrackPerRank) {
  DUET_REQUIRE_MPI();
  const std::string dir = temp_dir("profile");
  const Proc r = sh(mpi(2, fmt::format("{} train --model mlp --dataset synthetic --train-size 256 --test-size 16 --batch 16 "
                                       "--epochs 1 --workers 0 --threads 1 --bucket-mb 0.1 --profile {}/run.json --trace "
                                       "{}/run.trace.json",
                                       kDuet, dir, dir)));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "rank reports: " + dir + "/run.json " + dir + "/run.rank1.json")) << r.out;
  for (const int rank : {0, 1}) {
    const nlohmann::json rep = nlohmann::json::parse(read_text(rank == 0 ? dir + "/run.json" : dir + "/run.rank1.json"));
    EXPECT_EQ(rep["run_config"]["rank"], rank);
    EXPECT_EQ(rep["run_config"]["world_size"], 2);
    EXPECT_EQ(rep["phases"]["steps"], 8) << "256 images, global batch 32";
    bool all_reduce = false;
    for (const auto& rec : rep["op_records"]) all_reduce = all_reduce || rec["name"] == "comm.all_reduce";
    EXPECT_TRUE(all_reduce) << "rank " << rank << " recorded its buckets' all-reduce";
  }
  EXPECT_TRUE(fs::exists(dir + "/run.rank1.ops.csv"));
  const nlohmann::json trace = nlohmann::json::parse(read_text(dir + "/run.trace.json"));
  EXPECT_EQ(trace["otherData"]["processes"], 2);
  std::set<std::string> processes;
  std::set<int> pids_with_ops;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"].get<std::string>().substr(0, 6));
    if (e["ph"] == "X" && e.value("cat", "") == "backward") pids_with_ops.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(processes, (std::set<std::string>{"rank 0", "rank 1"}));
  EXPECT_EQ(pids_with_ops, (std::set<int>{1, 2}));
  const Proc rep = sh(fmt::format("{} report {}/run.json {}/run.rank1.json", kDuet, dir, dir));
  ASSERT_EQ(rep.rc, 0) << rep.out;
  EXPECT_TRUE(contains(rep.out, "2 of 2 ranks")) << rep.out;
  EXPECT_TRUE(contains(rep.out, "slowest: rank ")) << rep.out;
  std::cout << rep.out;
  // A report of a one-process run is not a rank report.
  const Proc one = sh(fmt::format("{} train --model mlp --dataset synthetic --train-size 64 --test-size 16 --epochs 1 "
                                  "--workers 0 --profile {}/one.json",
                                  kDuet, dir));
  ASSERT_EQ(one.rc, 0) << one.out;
  const Proc bad = sh(fmt::format("{} report {}/run.json {}/one.json", kDuet, dir, dir));
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_TRUE(contains(bad.out, "one.json' is not a rank report")) << bad.out;
}

// `duet train` options and help.
#include "cli/commands.h"
#include "cli/global_options.h"
#include <cstdlib>
#include <iostream>
#include <memory>
#include <CLI/CLI.hpp>
#include "cli/option_checks.h"
#include "cli/run_options.h"
#include "train/train_run.h"

namespace duet::app {

namespace {
void add_optim_options(CLI::App& cmd, TrainConfig& c) {
  const std::string g = "Optimization";
  OptimConfig& o = c.optim;
  cmd.add_option("--epochs", c.epochs, "Passes over the training set")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}))
      ->group(g);
  cmd.add_option("--batch", c.batch, "Batch size (per rank under mpirun: the global batch is this times the ranks)")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1 << 20}))->group(g);
  cmd.add_option("--optimizer", o.optimizer, "sgd, adam or adamw")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->group(g);
  cmd.add_option("--lr", o.lr, "Learning rate; with --schedule onecycle the peak (default: 0.05 sgd, 0.002 adam/adamw)")
      ->check(finite_range(1e-12, 1e6))
      ->group(g);
  cmd.add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str()->check(finite_range(0.0, 0.9999))->group(g);
  cmd.add_flag("--nesterov", o.nesterov, "SGD with Nesterov momentum")->group(g);
  cmd.add_option("--weight-decay", o.weight_decay, "Weight decay (default: 5e-4 sgd, 0 adam, 0.01 adamw)")
      ->check(finite_range(0.0, 1.0))
      ->group(g);
  cmd.add_option("--amp", c.amp,
                 "Mixed precision: bf16 or fp16 convolutions and matmuls with f32 master weights; fp16 adds dynamic "
                 "loss scaling (steps whose gradients overflow are skipped)")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "bf16", "fp16"}))
      ->group(g);
  cmd.add_option("--label-smoothing", o.label_smoothing, "Label smoothing of the cross-entropy loss (0.1 is usual)")
      ->capture_default_str()
      ->check(finite_range(0.0, 0.99))
      ->group(g);

  const std::string s = "Learning-rate schedule (per step)";
  cmd.add_option("--schedule", o.schedule,
                 "constant, step (x gamma every --lr-step-epochs or at --lr-milestones), cosine (to --min-lr) or onecycle "
                 "(up from lr/div-factor to --lr, then down)")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "step", "cosine", "onecycle"}))
      ->group(s);
  cmd.add_option("--warmup-epochs", o.warmup_epochs, "Linear warm-up epochs before the schedule (fractions allowed)")
      ->check(finite_range(0.0, 1e6))
      ->group(s);
  cmd.add_option("--warmup-start", o.warmup_start_factor, "Warm-up starts at lr times this factor")
      ->capture_default_str()
      ->check(finite_range(0.0, 1.0))
      ->group(s);
  cmd.add_option("--lr-step-epochs", o.step_epochs, "step: epochs between decays")->check(finite_range(0.0, 1e6))->group(s);
  cmd.add_option("--lr-milestones", o.milestone_epochs, "step: epochs at which lr is multiplied by gamma, e.g. 30,60")
      ->delimiter(',')
      ->check(finite_range(0.0, 1e6))
      ->group(s);
  cmd.add_option("--lr-gamma", o.gamma, "step: decay factor")->capture_default_str()->check(finite_range(0.0, 1.0))->group(s);
  cmd.add_option("--min-lr", o.min_lr, "cosine: final learning rate")->capture_default_str()->check(finite_range(0.0, 1e6))->group(s);
  cmd.add_option("--pct-start", o.pct_start, "onecycle: fraction of the steps spent warming up")
      ->capture_default_str()
      ->check(finite_range(0.01, 0.99))
      ->group(s);
  cmd.add_option("--div-factor", o.div_factor, "onecycle: starting lr = lr / div-factor")
      ->capture_default_str()
      ->check(finite_range(1.0, 1e9))
      ->group(s);
  cmd.add_option("--final-div-factor", o.final_div_factor, "onecycle: final lr = starting lr / final-div-factor")
      ->capture_default_str()
      ->check(finite_range(1.0, 1e12))
      ->group(s);
}

void add_run_options(CLI::App& cmd, TrainConfig& c) {
  const std::string g = "Checkpoints and transfer learning";
  cmd.add_option("--checkpoint", c.checkpoint,
                 "Write a checkpoint (model, optimizer, step, RNG, config) to this .safetensors file after every epoch; "
                 "written to a temporary file and renamed, so a crash never leaves half a file")
      ->group(g);
  cmd.add_option("--resume", c.resume, "Continue the run of this checkpoint exactly where it stopped (same options)")
      ->check(CLI::ExistingFile)
      ->group(g);
  cmd.add_option("--init-from", c.init_from,
                 "Start from these weights (.safetensors: a torchvision export or a duet checkpoint); a new classifier "
                 "head when the class count differs")
      ->check(CLI::ExistingFile)
      ->group(g);
  cmd.add_flag("--freeze-backbone", c.freeze_backbone, "With --init-from: train only the classifier head")->group(g);
  cmd.add_option("--val-fraction", c.data.val_fraction,
                 "Hold out this fraction of the training set (stratified by class, drawn from --seed) for validation: "
                 "epochs are evaluated on it, the best one is kept (with --checkpoint FILE: in FILE.best), and the test "
                 "split is evaluated once, at the end, with the best epoch's weights")
      ->check(CLI::Validator(
          [](std::string& v) {
            const double f = std::strtod(v.c_str(), nullptr);
            return f > 0 && f < 1 ? std::string() : "must be a fraction strictly between 0 and 1 (0.1 holds out 10%), got " + v;
          },
          "FRACTION"))
      ->group(g);

  const std::string o = "Output";
  cmd.add_option("--log", c.log, "Write one JSON object per epoch to this file (JSONL; a resumed run appends)")->group(o);
  cmd.add_option("--tensorboard", c.tensorboard,
                 "Write TensorBoard event files to this folder (created when missing): loss, accuracy, lr, images/s, "
                 "step time and peak memory per step and epoch, weight and gradient histograms, with --profile the op "
                 "table; view with `tensorboard --logdir DIR`")
      ->type_name("DIR")
      ->group(o);
  cmd.add_option("--tensorboard-histograms", c.tensorboard_histograms,
                 "With --tensorboard: weight and gradient histograms every N steps and after each epoch (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->group(o);
  cmd.add_option("--log-every", c.log_every, "When stdout is not a terminal, a progress line every N steps")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->group(o);
  cmd.add_option("--profile", c.profile_path,
                 "Profile the training steps and print the per-op report at the end; with a FILE, also write the JSON "
                 "report there (and its op table as CSV beside it)")
      ->expected(0, 1)
      ->type_name("[FILE]")
      ->group(o);
  cmd.add_option("--trace", c.trace_path, "With --profile: also write a Chrome trace (open in ui.perfetto.dev)")->group(o);
  cmd.add_option("--profile-mode", c.profile_mode,
                 "per-op (every op timed; op times add up to the step) or throughput (steps and phases only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"per-op", "throughput"}))
      ->group(o);
  cmd.add_flag("--profile-sync", c.profile_sync,
               "With --profile on CUDA: synchronise around every op and time it on the host clock, instead of CUDA "
               "events resolved once per step")
      ->group(o);
  cmd.add_option("--stop-after-minutes", c.stop_after_minutes,
                 "Stop once this much training time has passed (the epoch is cut short and evaluated)")
      ->check(finite_range(0.0, 1e9))
      ->group(o);
  cmd.add_option("--stop-after-epochs", c.stop_after_epochs,
                 "Stop after this many epochs of this run, schedule unchanged (continue later with --resume)")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->group(o);

  const std::string d = "Data-parallel (started by mpirun; see docs/distributed.md)";
  cmd.add_option("--bucket-mb", c.bucket_mb,
                 "MB of gradients per all-reduce; a bucket is averaged across ranks as soon as backward has finished "
                 "its gradients, overlapping the rest of backward")
      ->capture_default_str()
      ->check(finite_range(0.001, 1e6))
      ->group(d);
  cmd.add_flag("--sync-bn", c.sync_bn,
               "Batch norm with the statistics of all ranks' batches together (as one process with the global batch); "
               "buckets are then averaged after backward, without overlap")
      ->group(d);
  cmd.add_option("--comm-timeout", c.comm_timeout_s,
                 "Seconds a collective may wait for the other ranks before the job is ended (a hung or stopped rank)")
      ->capture_default_str()
      ->check(finite_range(1, 1e7))
      ->group(d);
}

const char* kTrainFooter = R"(Examples:
  duet train --model small_cnn --dataset synthetic --profile
      a small CNN on generated data (no download), per-op profile at the end
  duet train --model resnet18_cifar --width-mult 0.5 --dataset cifar10 --data ../shared/data/cifar10 \
      --epochs 15 --batch 128 --lr 0.2 --nesterov --schedule onecycle --label-smoothing 0.1 \
      --checkpoint cifar.safetensors --log cifar.jsonl
  duet train ... --resume cifar.safetensors            continue a stopped run (same options)
  duet train ... --val-fraction 0.1 --checkpoint cifar.safetensors
      pick the best epoch on 10% of the training set (cifar.best.safetensors); test reported once
  duet train --model resnet18_cifar --dataset cifar10 --data ../shared/data/cifar10 --device cuda --amp bf16
      mixed precision (fp16: --amp fp16, with dynamic loss scaling)
  duet train --model resnet18 --dataset folder --data ../shared/data/cats_dogs --image-size 64 \
      --init-from resnet18.safetensors --freeze-backbone --epochs 3
  mpirun -np 2 duet train --model mlp --batch 64      data-parallel on 2 processes (global batch 128)
Global options (--device, --backend, --threads, --seed) may also come before `train`.
See docs/training.md for the recipes.)";
}  // namespace

Command add_train_command(CLI::App& app, GlobalOptions& g) {
  auto c = std::make_shared<TrainConfig>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model; prints loss, accuracy, images/s per epoch");
  add_model_options(*cmd, c->model);
  add_data_options(*cmd, c->data);
  add_optim_options(*cmd, *c);
  add_run_options(*cmd, *c);
  add_global_options(*cmd, g);
  cmd->footer(kTrainFooter);
  return {cmd, [c, cmd, &g](std::ostream& out) {
            TrainConfig cfg = *c;
            cfg.profile = cmd->count("--profile") > 0;
            DUET_CHECK(cfg.trace_path.empty() || cfg.profile, "--trace needs --profile");
            DUET_CHECK(!cfg.profile_sync || cfg.profile, "--profile-sync needs --profile");
            DUET_CHECK(cmd->count("--tensorboard-histograms") == 0 || !cfg.tensorboard.empty(),
                       "--tensorboard-histograms needs --tensorboard DIR");
            // 130 / 143 as a shell reports a process killed by SIGINT / SIGTERM, so scripts see the stop.
            const TrainResult r = run_training(cfg, g, out);
            return r.interrupted_by != 0 ? 128 + r.interrupted_by : 0;
          }};
}

}  // namespace duet::app

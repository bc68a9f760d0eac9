// The tiny training run the suites of train/ and cli/ start from: small_cnn of width 4 on 8x8 synthetic
// images, 4 classes, 4 steps per epoch, 2 epochs. Header-only, so only suites linking duet_train use it.
#pragma once
#include "train/train_config.h"

namespace duet::testing {

inline app::TrainConfig tiny_train_config() {
  app::TrainConfig c;
  c.model.name = "small_cnn";
  c.model.width_mult = 0.25;
  c.data.dataset = "synthetic";
  c.data.image_size = 8;
  c.data.train_size = 120;  // 4 batches of 32, the last one short
  c.data.test_size = 32;
  c.data.synthetic_classes = 4;
  c.data.workers = 1;
  c.data.memory_format = "auto";
  c.batch = 32;
  c.epochs = 2;
  c.seed = 7;
  c.optim.optimizer = "sgd";
  c.optim.lr = 0.1;
  c.optim.nesterov = true;
  c.optim.schedule = "onecycle";
  c.optim.label_smoothing = 0.1;
  return c;
}

}  // namespace duet::testing

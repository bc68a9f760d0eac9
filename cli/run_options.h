// Option groups that sub-commands share: the model's (--model, --classes, --width-mult, --dropout;
// train and profile) and the data's (--dataset, --data, augmentation, loader; train), bound to
// the configuration structs of train/.
#pragma once
#include "train/model_setup.h"
#include "train/train_data.h"

namespace CLI {
class App;
}

namespace duet::app {

void add_model_options(CLI::App& cmd, ModelConfig& m);
void add_data_options(CLI::App& cmd, DataOptions& o);

}  // namespace duet::app

// What ranks must agree on before data-parallel training starts: the same initial weights
// (rank 0's, broadcast) and the same run configuration (compared, so a rank started with other
// options stops with an error instead of training something else).
#pragma once
#include <string>
#include <utility>
#include <vector>
#include "distributed/communicator.h"
#include "engine/tensor.h"

namespace duet::dist {

// Overwrites every tensor with rank `root`'s values (in place: handles held elsewhere, such as
// the optimizer's, see the new values). All ranks pass tensors of the same shapes and dtypes.
void broadcast_tensors(Communicator& comm, const std::vector<Tensor>& tensors, int root = 0);

// (name, value) settings that must be equal on every rank. When they are not, throws duet::Error
// on every rank naming the first setting that differs and each rank's value of it.
using Settings = std::vector<std::pair<std::string, std::string>>;
void check_same_on_all_ranks(Communicator& comm, const Settings& settings);

}  // namespace duet::dist

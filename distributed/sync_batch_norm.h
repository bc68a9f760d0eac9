// SyncBatchNorm for data-parallel training (--sync-bn): every BatchNorm2d of a model normalises
// with the statistics of all ranks' batches together, as one process with the global batch
// does, through the engine's BatchNorm2d::sum_over_replicas hook.
#pragma once
#include "distributed/communicator.h"
#include "engine/nn/module.h"
#include "engine/tensor.h"

namespace duet::dist {

// The element-wise sum of `t` over all ranks, recorded for autograd: its backward is the same
// sum of the incoming gradient (each rank's loss depends on every rank's input through it).
// Blocking, on the calling thread; every rank must call it at the same point of its program.
Tensor all_reduce_sum(Communicator& comm, const Tensor& t);

// Sets the hook on every BatchNorm2d of `model` (comm must outlive the model's training).
// Returns how many there are.
int sync_batch_norm(nn::Module& model, Communicator& comm);

}  // namespace duet::dist

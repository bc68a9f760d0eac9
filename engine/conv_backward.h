// The two passes of one conv2d_backward (engine/ops.def) as profiled windows of their own inside the
// op's, named as profiles show them: conv2d.backward_data and conv2d.backward_weight, each with the
// FLOPs and bytes of its pass. So a profile keeps the data and the weight gradient apart, with the
// implementation (and the reason) of each, and whatever a backend does once for both (the cpu
// backend's shared reorder of dy) is conv2d.backward's own time. Every backend opens them around
// its passes.
#pragma once
#include "engine/profiler/events.h"
#include "engine/tensor.h"

namespace duet {

// dx from dy and w; opened by the backend before it computes dx.
profiler::OpScope data_gradient_window(Backend b, const Tensor& dy, const Tensor& w, const Tensor& dx);
// dw (and db, when defined) from x and dy.
profiler::OpScope weight_gradient_window(Backend b, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                         const Tensor& db);

}  // namespace duet

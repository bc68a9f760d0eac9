#include "engine/conv_backward.h"
#include "engine/op_cost.h"

namespace duet {

profiler::OpScope data_gradient_window(Backend b, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  return profiler::OpScope("conv2d.backward_data", b, {&dy, &w},
                           [&] { return cost::conv2d(dx.shape(), w.shape(), dy.shape(), cost::elem(dy), false); });
}

profiler::OpScope weight_gradient_window(Backend b, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                         const Tensor& db) {
  return profiler::OpScope("conv2d.backward_weight", b, {&x, &dy},
                           [&] { return cost::conv2d(x.shape(), dw.shape(), dy.shape(), cost::elem(x), db.defined()); });
}

}  // namespace duet

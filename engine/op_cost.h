// FLOP and minimum-bytes formulas of the ops, as functions of their shapes. A multiply-add counts
// as 2 FLOPs; bytes count each input read once and each output written once (the least traffic
// any implementation needs), so achieved GB/s against these is a lower bound on real traffic.
#pragma once
#include "engine/op_params.h"
#include "engine/profiler/events.h"
#include "engine/tensor.h"

namespace duet::cost {

double bytes_of(const Tensor& t);  // numel * element size; 0 for undefined
// The bytes of t's distinct elements: a broadcast view (stride 0 on a dim) is read once, so an
// input expanded for a binary op counts as the tensor it was expanded from.
double distinct_bytes_of(const Tensor& t);
inline size_t elem(const Tensor& t) { return dtype_size(t.dtype()); }
// Elementwise op: `flops_per_element` per output element; reads inputs (their distinct
// elements), writes outputs.
OpCost elementwise(std::initializer_list<const Tensor*> inputs, std::initializer_list<const Tensor*> outputs,
                   double flops_per_element);
OpCost matmul(int64_t batch, int64_t m, int64_t n, int64_t k, size_t elem, bool bias = false);
// Convolution with x [N,C,H,W], w [O,C/g,KH,KW], y [N,O,OH,OW]: 2*N*O*OH*OW*(C/g)*KH*KW FLOPs
// (+ N*O*OH*OW for a bias). The backward ops have the same FLOPs (dbias adds N*O*OH*OW).
OpCost conv2d(const Shape& x, const Shape& w, const Shape& y, size_t elem, bool bias, bool residual = false);
// Batch norm forward (training): ~ 8 FLOPs per element (two passes of statistics + affine).
OpCost batch_norm(const Shape& x, size_t elem, bool training, bool residual = false);
OpCost batch_norm_backward(const Shape& x, size_t elem);
OpCost layer_norm(const Shape& x, size_t elem);
OpCost layer_norm_backward(const Shape& x, size_t elem);
// Pooling: one compare or add per window element per output.
OpCost pool2d(const Shape& x, const Shape& y, int64_t kh, int64_t kw, size_t elem);
// Adaptive pooling from x [N,C,H,W] to y [N,C,OH,OW]: pool2d with its widest window, ceil(H/OH) x ceil(W/OW).
OpCost adaptive_pool2d(const Shape& x, const Shape& y, size_t elem);
OpCost softmax(const Shape& x, size_t elem);
// qkv [N, S, 3 * H * Dh]: two products per head forward (q k^T, probs v) and four backward, plus the
// softmax; bytes: qkv, out and probs (backward: those, dout and dqkv).
OpCost attention(const Shape& qkv, int64_t heads, size_t elem, bool backward);
OpCost cross_entropy(const Shape& logits, size_t elem);
OpCost reduce(const Shape& x, const Shape& out, size_t elem);

}  // namespace duet::cost

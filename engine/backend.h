// A backend is a table of kernels: one virtual method per line of engine/ops.def. The default of
// each throws "<op> is not implemented on backend '<name>'", so a new backend starts as a
// compiling checklist and a missing kernel is a clear run-time error, never a crash.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "engine/op_params.h"
#include "engine/tensor.h"

namespace duet {

enum class OpId : uint16_t {
#define DUET_OP(name, params, ...) name,
#include "engine/ops.def"
#undef DUET_OP
  count
};
constexpr int kNumOps = static_cast<int>(OpId::count);
const char* op_name(OpId op);

// How a backend meets an op in a dtype: it computes it, a host backend hands it to the reference
// loops, or it refuses (a device backend whose tensors the loops cannot reach). Declared by each
// backend in one place (BackendImpl::support), read by the dispatch (engine/ops/dispatch.h), which
// falls back or raises the error before any work, and by the op table (opcheck/), which skips a case
// a backend refuses instead of reporting its error.
enum class Coverage : uint8_t { native, reference_loops, refused };
struct DTypeSupport {
  Coverage coverage = Coverage::native;
  std::string why;  // for reference_loops and refused: the reason, shown in the profile or the error
};

class BackendImpl {
public:
  virtual ~BackendImpl() = default;
  virtual Backend kind() const = 0;
  const char* name() const { return backend_name(kind()); }
  // How this backend meets `op` when its first input (or the tensor it creates) has dtype `dt`.
  // Shape- or attribute-specific fallbacks (a pooling window too large for a kept argmax) are the
  // kernel's own, through the same reference loops and noted the same way.
  virtual DTypeSupport support(OpId op, DType dt) const;
  // Blocks until all queued work is done (no-op on synchronous backends).
  virtual void synchronize() {}
  // Whether max_pool2d_backward prefers the forward's argmax (ops.def: max_pool2d's indices) to
  // finding it again from x and y; then a training forward is given an indices tensor to fill, and
  // backward keeps that (a quarter of y's bytes) instead of x and y.
  virtual bool keeps_max_pool_indices() const { return false; }
  // Whether the kernels an activation meets between two matrix ops (batch norm, activations,
  // elementwise maths, pooling, softmax, concatenation) take the 16-bit dtype `low`: then autocast
  // leaves the outputs of conv2d, linear and matmul in `low`, as PyTorch does, and a network's
  // activations move half the bytes; otherwise it casts them back to f32 (engine/autocast.h).
  virtual bool keeps_low_precision_activations(DType /*low*/) const { return false; }
  // Whether the attention op (ops.def) runs here for dtype `dt`; otherwise the front-end composes it
  // from matmul and softmax, as every backend can.
  virtual bool fuses_attention(DType /*dt*/) const { return false; }
  // Whether batch_norm_backward (ops.def) takes a batch norm + activation (without residual) for
  // this x in one op, recomputing the activation's mask from x; otherwise the front-end masks the
  // gradient with the saved output first (relu.backward).
  virtual bool fuses_batch_norm_activation_backward(const Tensor& /*x*/) const { return false; }
  // Whether batch_norm with running statistics and no residual reads this x where it lies when x is
  // a slice of a channels-last tensor's channels (channel_row_stride(x) > its channel count: a
  // DenseNet layer's input, models/densenet.cpp); otherwise the front-end copies x channels-last.
  virtual bool reads_channel_slices_in_batch_norm(const Tensor& /*x*/) const { return false; }

#define DUET_OP(name, params, ...) virtual void name params;
#include "engine/ops.def"
#undef DUET_OP

protected:
  [[noreturn]] void not_implemented(OpId op) const;
};

// ---- the backend table ------------------------------------------------------------------------
// The engine owns this table and reaches every backend through it; each backend library is added
// at start-up by backends/registry.cpp, which the build links whole into every program. So the
// engine compiles and links without any backend, and names none.

// Adds a backend: `get` returns its object (made on first use).
void register_backend(Backend b, BackendImpl& (*get)());
// Adds a device type other than the host: its allocator per device index and its device count.
void register_device_type(DeviceType t, Allocator& (*allocator)(int index), int (*count)());

// The backend object for a kind; throws duet::Error when it was not built in.
BackendImpl& backend(Backend b);
bool backend_available(Backend b);
std::string available_backends_str();
// The allocator of a device (cpu: 64-byte aligned host memory; cuda: the caching allocator).
Allocator& device_allocator(Device d);
// Devices of a type this binary can use: 1 for the host, the GPUs the driver shows for cuda (0 when
// the cuda backend is not built in, or there is no driver or GPU).
int device_count(DeviceType t);


}  // namespace duet

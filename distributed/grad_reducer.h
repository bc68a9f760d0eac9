// Gradient averaging for data-parallel training, as PyTorch DDP's reducer does it: parameters
// are grouped into buckets of about `bucket_mb` megabytes in reverse registration order (the
// order backward finishes them), and a bucket's all-reduce starts as soon as the last gradient
// in it is final, on a communication thread, while backward goes on with earlier layers. The
// optimizer step waits for all of them (finish()).
//
//   GradReducer reducer(dist::world(), model.parameters(), {.bucket_mb = 25});
//   opt.zero_grad();
//   { auto hook = reducer.watch_backward(); loss.backward(); }
//   reducer.finish();  // every rank now holds the same averaged .grad
//   opt.step();
//
// Buckets are launched strictly in bucket order, so every rank issues the same collectives in
// the same order whatever order its hooks fire in. A parameter that got no gradient on a rank
// contributes zeros; it gets the average if any rank had a gradient for it, and stays without a
// gradient (skipped by the optimizer) if none had, as in one process. Gradients of one step only:
// accumulating several backward passes before finish() is not supported.
//
// Parameters on a GPU (with a communicator that sums GPU memory: NCCL) get GPU buckets: a bucket's
// sum is queued on the communicator's own stream when it is ready, and the overlap with backward
// happens on the GPU instead of on a thread; finish() makes the compute stream wait for the sums.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>
#include "distributed/communicator.h"
#include "engine/autograd.h"
#include "engine/tensor.h"

namespace duet::dist {

struct GradReducerOptions {
  double bucket_mb = 25.0;  // MB (10^6 bytes) of gradient per all-reduce
  // Communicate on a thread of its own while backward runs; false (or a communicator that is not
  // thread safe): each bucket is all-reduced on the calling thread when it is ready.
  bool overlap = true;
};

class GradReducer {
public:
  // `params`: the model's parameters; those that do not require grad are left alone. Gradients
  // must be f32 or f64.
  GradReducer(Communicator& comm, const std::vector<Tensor>& params, GradReducerOptions options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Watches the backward passes on this thread while the returned guard lives.
  LeafGradHookGuard watch_backward();
  // After backward: launches what is left, waits for every bucket and writes the averages into
  // the parameters' .grad. Rethrows an error of the communication thread.
  void finish();

  struct BucketInfo {
    size_t params = 0;
    int64_t bytes = 0;
  };
  std::vector<BucketInfo> buckets() const;
  bool overlapping() const { return thread_.joinable(); }

private:
  struct Slot {  // one parameter's place in its bucket
    Tensor param;
    size_t bucket = 0;
    int64_t offset = 0;  // in elements
    bool ready = false;
  };
  struct Bucket {
    DType dtype = DType::f32;
    std::vector<size_t> slots;
    int64_t elements = 0;  // gradients; one "had a gradient" flag per slot follows them
    Tensor buffer;         // 1-D, `dtype`, on device_: the gradients, then the flags
    size_t pending = 0;    // slots not yet ready this step
  };

  void on_leaf_ready(TensorImpl* leaf);
  void mark_ready(size_t slot);
  void launch_ready_buckets();  // in order, as far as they are complete
  void all_reduce(Bucket& b);
  void comm_loop();

  bool on_gpu() const { return device_.type != DeviceType::cpu; }

  Communicator& comm_;
  GradReducerOptions opt_;
  Device device_ = Device::cpu();  // the parameters' and the buckets' (CPU: host buckets, a thread)
  std::vector<Slot> slots_;
  std::unordered_map<TensorImpl*, size_t> slot_of_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;

  // Communication thread: bucket indices to all-reduce, in order.
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  size_t reduced_ = 0;  // buckets done this step
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace duet::dist

// GPU collectives through NCCL, with MPI for everything else: the host collectives (settings,
// metrics, evaluation sums) go to the MPI communicator it wraps, and MPI hands out NCCL's unique
// id, as PyTorch's and Horovod's MPI launchers do.
//
// Streams: a sum is queued on a communication stream of its own, behind an event recorded on the
// device's compute stream (so it sees the gradients copied into the bucket before it), and the
// compute stream goes on with the rest of backward; wait_device() makes the compute stream wait
// for the communication stream's last sum, on the GPU, before the optimizer step reads the
// averages. This is the overlap of PyTorch's DDP on CUDA.
//
// NCCL is initialised on the first GPU sum (ncclCommInitRank needs the device current), on the
// rank's device: one GPU per rank (NCCL refuses two ranks on one GPU). The communicator, stream and
// events are left to the process's end, like the CUDA backend's allocator: destroying them from a
// static destructor could run after the CUDA runtime has shut down.
//
// Written to run on machines with several GPUs; it compiles and links in every build with the CUDA
// backend and MPI, and has not yet run on a GPU (docs/distributed.md).
#include <nccl.h>
#include <cstdlib>
#include <memory>
#include <fmt/format.h>
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "distributed/communicator.h"
#include "engine/error.h"

namespace duet::dist {

namespace {

void nccl_check(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  throw Error(fmt::format("NCCL: {} failed: {} ({}){}", call, ncclGetErrorString(r), static_cast<int>(r),
                          r == ncclSystemError || r == ncclRemoteError
                              ? "; NCCL_DEBUG=WARN prints NCCL's own reason, NCCL_SOCKET_IFNAME picks the network"
                              : ""));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    default:
      throw Error(fmt::format("GPU all-reduce of dtype {}: expected f32, f64, f16 or bf16", dtype_name(t)));
  }
}

class MpiNccl final : public Communicator {
public:
  explicit MpiNccl(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  int local_rank() const override { return host_->local_rank(); }
  int local_size() const override { return host_->local_size(); }
  bool thread_safe() const override { return host_->thread_safe(); }
  const char* transport(Device d) const override { return d.type == DeviceType::cuda ? "nccl" : host_->transport(d); }
  std::string describe() const override {
    return fmt::format("{}; NCCL {}.{}.{} for GPU buffers", host_->describe(), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  }
  std::vector<std::string> hosts() const override { return host_->hosts(); }
  void all_reduce_sum(float* data, size_t count) override { host_->all_reduce_sum(data, count); }
  void all_reduce_sum(double* data, size_t count) override { host_->all_reduce_sum(data, count); }
  void broadcast(void* data, size_t bytes, int root) override { host_->broadcast(data, bytes, root); }
  std::vector<uint64_t> all_gather(uint64_t value) override { return host_->all_gather(value); }
  void barrier() override { host_->barrier(); }
  std::vector<std::string> gather(const std::string& bytes, int root) override { return host_->gather(bytes, root); }
  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    host_->abort(message, exit_code);
    std::abort();  // not reached: the host communicator's abort() ends the process
  }

  void set_timeout(double seconds) override {  // the host collectives are the MPI communicator's
    Communicator::set_timeout(seconds);
    host_->set_timeout(seconds);
  }

  bool sums_on(Device d) const override { return d.type == DeviceType::cpu || d.type == DeviceType::cuda; }

  void start_device_all_reduce_sum(void* data, size_t count, DType dtype, Device d) override {
    cuda::DeviceContext& ctx = device_context(d);
    DUET_CUDA_CHECK(cudaEventRecord(ready_, ctx.stream()), "comm.all_reduce");
    DUET_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0), "comm.all_reduce");
    nccl_check(ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, comm_, stream_), "ncclAllReduce");
    pending_ = true;
  }

  void wait_device(Device d) override {
    if (!pending_) return;
    cuda::DeviceContext& ctx = device_context(d);
    DUET_CUDA_CHECK(cudaEventRecord(done_, stream_), "comm.wait");
    DUET_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), done_, 0), "comm.wait");
    pending_ = false;
  }

private:
  // The device's context (made current); NCCL, the stream and the events on the first call.
  cuda::DeviceContext& device_context(Device d) {
    DUET_CHECK(d.type == DeviceType::cuda, "GPU all-reduce on {}: expected a CUDA device", d.str());
    cuda::DeviceContext& ctx = cuda::context(d.index, "comm.all_reduce");
    if (comm_ != nullptr) {
      DUET_CHECK(d.index == device_, "rank {}: GPU all-reduce on cuda:{} after NCCL was set up on cuda:{}; a rank uses "
                 "one GPU", rank(), d.index, device_);
      return ctx;
    }
    ncclUniqueId id{};
    if (rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host_->broadcast(&id, sizeof id, 0);
    DUET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "comm.all_reduce");
    DUET_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "comm.all_reduce");
    DUET_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "comm.all_reduce");
    nccl_check(ncclCommInitRank(&comm_, size(), id, rank()), "ncclCommInitRank");
    device_ = d.index;
    return ctx;
  }

  std::unique_ptr<Communicator> host_;
  ncclComm_t comm_ = nullptr;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool pending_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host) {
  return std::make_unique<MpiNccl>(std::move(host));
}

}  // namespace duet::dist

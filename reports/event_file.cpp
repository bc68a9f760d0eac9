// TensorBoard event files (see event_file.h): the record framing, the histogram, the writer.
#include "reports/event_file.h"
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <isa-l/crc.h>
#include <fmt/format.h>
#include "engine/error.h"
#include "reports/tensorboard_event.pb.h"

namespace duet::profiler {

namespace fs = std::filesystem;
namespace tb = duet::tensorboard;

uint32_t crc32c(std::string_view data) {
  // ISA-L's crc32_iscsi is the CRC32C polynomial without the customary inversions: start from all
  // ones and invert the result to get the standard CRC32C (0xe3069283 for "123456789").
  auto* bytes = reinterpret_cast<unsigned char*>(const_cast<char*>(data.data()));
  DUET_CHECK(data.size() <= 0x7fffffffu, "a TensorBoard record of {} bytes is too large (at most 2 GiB)", data.size());
  return crc32_iscsi(bytes, static_cast<int>(data.size()), 0xffffffffu) ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

namespace {
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
}  // namespace

std::string frame_record(std::string_view data) {
  std::string header;
  put_le(header, data.size(), 8);
  std::string out = header;
  put_le(out, masked_crc32c(header), 4);
  out.append(data);
  put_le(out, masked_crc32c(data), 4);
  return out;
}

Histogram make_histogram(std::span<const float> values, int buckets) {
  Histogram h;
  bool any = false;
  for (float f : values) {
    if (!std::isfinite(f)) {
      ++h.non_finite;
      continue;
    }
    const double v = f;
    h.min = any ? std::min(h.min, v) : v;
    h.max = any ? std::max(h.max, v) : v;
    any = true;
    h.num += 1;
    h.sum += v;
    h.sum_squares += v * v;
  }
  if (!any) return h;
  const int n = h.max > h.min ? std::max(buckets, 1) : 1;
  const double width = (h.max - h.min) / n;
  h.counts.assign(static_cast<size_t>(n), 0.0);
  for (int i = 0; i < n; ++i) h.limits.push_back(i + 1 == n ? h.max : h.min + width * (i + 1));
  for (float f : values) {
    if (!std::isfinite(f)) continue;
    // Bucket i holds (limit[i-1], limit[i]]; the minimum goes to bucket 0.
    const auto it = std::lower_bound(h.limits.begin(), h.limits.end(), static_cast<double>(f));
    h.counts[static_cast<size_t>(std::min<std::ptrdiff_t>(it - h.limits.begin(), n - 1))] += 1;
  }
  return h;
}

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0) return "localhost";
  std::string s(buf);
  std::replace(s.begin(), s.end(), '/', '_');
  return s;
}

void set_metadata(tb::Summary::Value& v, std::string_view description, const char* plugin) {
  tb::SummaryMetadata* m = v.mutable_metadata();
  if (!description.empty()) m->set_summary_description(std::string(description));
  m->mutable_plugin_data()->set_plugin_name(plugin);
}

// The serialized Event of one summary value at `step`.
std::string event_of(int64_t step, tb::Summary::Value& v) {
  tb::Event e;
  e.set_wall_time(wall_seconds());
  e.set_step(step);
  e.mutable_summary()->add_value()->Swap(&v);
  return e.SerializeAsString();
}

}  // namespace

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  DUET_CHECK(!dir.empty(), "the TensorBoard folder is empty; expected a folder name such as runs/exp1");
  fs::create_directories(dir, ec);
  DUET_CHECK(!ec && fs::is_directory(dir, ec), "cannot create the TensorBoard folder '{}': {}", dir,
             ec ? ec.message() : "a file of that name is in the way");
  static std::atomic<int> counter{0};
  const auto seconds = static_cast<int64_t>(wall_seconds());
  path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.{}", seconds, host_name(), ::getpid(),
                                       counter.fetch_add(1)))
              .string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  DUET_CHECK(fd_ >= 0, "cannot create the TensorBoard event file '{}': {}", path_, std::strerror(errno));
  tb::Event e;
  e.set_wall_time(wall_seconds());
  e.set_file_version("brain.Event:2");
  e.mutable_source_metadata()->set_writer("duet");
  write_record(e.SerializeAsString());
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) {
    ::fsync(fd_);
    ::close(fd_);
  }
}

void EventFileWriter::write_record(const std::string& data) {
  const std::string rec = frame_record(data);
  size_t done = 0;
  while (done < rec.size()) {
    const ssize_t n = ::write(fd_, rec.data() + done, rec.size() - done);
    if (n < 0 && errno == EINTR) continue;
    DUET_CHECK(n > 0, "writing the TensorBoard event file '{}' failed: {}", path_,
               n < 0 ? std::strerror(errno) : "no bytes written (disk full?)");
    done += static_cast<size_t>(n);
  }
}

void EventFileWriter::scalar(const std::string& tag, int64_t step, double value, std::string_view description) {
  tb::Summary::Value v;
  v.set_tag(tag);
  // The plugin is named with a tag's first value (TensorBoard remembers it for the tag).
  if (first_of(tag)) set_metadata(v, description, "scalars");
  v.set_simple_value(static_cast<float>(value));
  write_record(event_of(step, v));
}

void EventFileWriter::histogram(const std::string& tag, int64_t step, const Histogram& h, std::string_view description) {
  tb::Summary::Value v;
  v.set_tag(tag);
  if (first_of(tag)) set_metadata(v, description, "histograms");
  tb::HistogramProto* p = v.mutable_histo();
  p->set_min(h.min);
  p->set_max(h.max);
  p->set_num(h.num);
  p->set_sum(h.sum);
  p->set_sum_squares(h.sum_squares);
  for (double l : h.limits) p->add_bucket_limit(l);
  for (double c : h.counts) p->add_bucket(c);
  write_record(event_of(step, v));
}

void EventFileWriter::text(const std::string& tag, int64_t step, std::string_view markdown, std::string_view description) {
  tb::Summary::Value v;
  v.set_tag(tag);
  // Every text value names its plugin: TensorBoard files a tensor by its metadata.
  set_metadata(v, first_of(tag) ? description : std::string_view{}, "text");
  tb::TensorProto* t = v.mutable_tensor();
  t->set_dtype(tb::DT_STRING);
  t->mutable_tensor_shape();  // no dimensions: one string
  t->add_string_val(std::string(markdown));
  write_record(event_of(step, v));
}

void EventFileWriter::flush() {
  DUET_CHECK(::fsync(fd_) == 0, "writing the TensorBoard event file '{}' failed: {}", path_, std::strerror(errno));
}

}  // namespace duet::profiler

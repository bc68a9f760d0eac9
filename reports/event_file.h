// TensorBoard event files: what `duet train --tensorboard DIR` and `duet profile --tensorboard DIR`
// write, and what TensorBoard reads. A file is a sequence of records
//
//   uint64 length | uint32 masked CRC32C of the length | data | uint32 masked CRC32C of the data
//
// (little-endian; masked: the CRC rotated right by 15 bits plus 0xa282ead8), each record's data
// one Event protocol buffer (reports/tensorboard_event.proto). The first event carries the file
// version "brain.Event:2"; the others a step, a wall time and summary values: scalars, histograms
// and markdown text. The CRC32C is Intel ISA-L's (Debian's libisal-dev); the protocol buffers are
// compiled from the .proto by protoc.
#pragma once
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace duet::profiler {

// CRC32C (Castagnoli) of `data`, and TensorBoard's masked form of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);
// One record as it is stored: the framing around `data`.
std::string frame_record(std::string_view data);

// The histogram TensorBoard draws: `buckets` equal-width buckets from the smallest finite value to
// the largest (fewer when they are all equal), with count, sum and sum of squares. Non-finite
// values are left out and counted in `non_finite`.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> limits, counts;  // bucket i: (limits[i-1], limits[i]], the first from min
  int64_t non_finite = 0;
};
Histogram make_histogram(std::span<const float> values, int buckets = 30);

// One event file in a folder, appended to record by record. The constructor creates the folder
// (and missing parents) and a new file in it, named as TensorFlow names them
// (events.out.tfevents.<seconds>.<hostname>.<pid>.<n>), and writes the version record. Each
// record goes to the file in one write() of its whole framing; flush() asks the system to put
// them on disk. Throws duet::Error naming the file when the folder or the file cannot be written.
class EventFileWriter {
public:
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // `description` (markdown) goes with a tag's first value; TensorBoard shows it with the chart.
  void scalar(const std::string& tag, int64_t step, double value, std::string_view description = {});
  void histogram(const std::string& tag, int64_t step, const Histogram& h, std::string_view description = {});
  void text(const std::string& tag, int64_t step, std::string_view markdown, std::string_view description = {});
  void flush();

  const std::string& path() const { return path_; }

private:
  void write_record(const std::string& data);
  bool first_of(const std::string& tag) { return tags_.insert(tag).second; }

  std::string path_;
  int fd_ = -1;
  std::set<std::string> tags_;  // tags written so far (their metadata went with the first value)
};

}  // namespace duet::profiler

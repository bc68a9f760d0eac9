// Weights on disk: the safetensors format (Hugging Face; what scripts/export_torchvision.py
// writes), and loading a file into a module by name with every problem reported before anything
// is copied, plus the transfer-learning helpers (load a backbone without its head, freeze it).
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [64, 3, 7, 7], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string value>"}}
// (padded with spaces to a multiple of 8), then the raw little-endian data; offsets are relative
// to the end of the header. dtypes: F64, F32, F16, BF16, I64, I32, U8.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>
#include "engine/tensor.h"

namespace duet {

namespace nn {
class Module;
}

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using Metadata = std::map<std::string, std::string>;

// Writes atomically: a temporary file in the same folder, fsync, rename over `path`, so a crash
// leaves the old file or the new one, never half of one. Tensors on any device or layout.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // in header order, host tensors of the file's dtypes
  Metadata metadata;
};
// Validates the whole header (dtypes, shapes, offsets against sizes and the file length,
// overlaps) before reading data; any problem is a duet::Error naming the file and the tensor.
SafetensorsFile read_safetensors(const std::string& path);
NamedTensors load_safetensors(const std::string& path);

// A module's parameters then buffers, by dotted name (handles sharing the module's storage).
NamedTensors state_dict(const nn::Module& m);
void save_state_dict(const std::string& path, const nn::Module& m, const Metadata& metadata = {});

// A prefix names a module path: "fc" matches "fc.weight" and "fc" itself, not "fc2.weight".
bool has_prefix(const std::string& name, const std::string& prefix);

struct LoadOptions {
  bool strict = true;  // missing or unexpected names are errors (as torch's load_state_dict)
  // Names under these prefixes are skipped on both sides: the file's are not loaded and the
  // model's keep their values (a classifier head to be re-trained for new classes).
  std::vector<std::string> ignore_prefixes;
};

struct LoadReport {
  std::vector<std::string> loaded;
  std::vector<std::string> missing;     // in the model, not in the file (non-strict, or num_batches_tracked)
  std::vector<std::string> unexpected;  // in the file, not in the model (non-strict)
  std::vector<std::string> ignored;     // under ignore_prefixes, from either side (each name once)
  std::vector<std::string> converted;   // loaded with a dtype conversion, e.g. "fc.weight: F16 -> f32"
};

// Copies tensors into the module's parameters and buffers by name. Everything is validated
// first: missing and unexpected names (strict), shape mismatches and incompatible dtypes are
// collected into one duet::Error naming each tensor with both shapes or dtypes, and on error the
// module is unchanged. Floating-point tensors convert to the parameter's dtype (F16/BF16/F64
// weights load into f32 models); integer buffers accept integer tensors; float <-> integer is an
// error. A missing "<bn>.num_batches_tracked" is tolerated (older checkpoints lack it), as in torch.
LoadReport load_state_dict(nn::Module& m, const NamedTensors& tensors, const LoadOptions& options);
LoadReport load_state_dict(nn::Module& m, const NamedTensors& tensors, bool strict = true);

// Transfer learning: loads everything but the head (strict elsewhere), e.g.
// load_backbone(*resnet, "resnet18.safetensors", "fc") into a resnet18 built with 10 classes.
LoadReport load_backbone(nn::Module& m, const std::string& path, const std::string& head_prefix);
// requires_grad = false on every parameter outside head_prefix, true inside it. Returns the
// number of frozen parameter elements; duet::Error when no parameter lies under head_prefix.
// BatchNorm running statistics still update in train mode; call eval() on the backbone's
// modules to keep them fixed too.
int64_t freeze_backbone(nn::Module& m, const std::string& head_prefix);
// The same with several heads (a distilled DeiT's two).
int64_t freeze_backbone(nn::Module& m, const std::vector<std::string>& head_prefixes);

}  // namespace duet

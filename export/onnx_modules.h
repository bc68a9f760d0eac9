// The table of module translations (export/onnx_modules.cpp): one function per module type of
// engine/nn and models/ that writes the ONNX nodes of that module's eval-mode forward pass.
#pragma once
#include <string>
#include <vector>
#include "engine/nn/module.h"
#include "export/onnx_graph.h"

namespace duet::exporter {

// The nodes of `m` (whose dotted path in the model is `path`, "" for the model itself) applied to
// `x`. duet::Error naming the path and type when the table has no entry for m's exact type (a
// subclass may compute something else, so it is not taken for its base), or when the module's
// configuration has no ONNX form.
Value translate(OnnxGraph& g, const nn::Module& m, const std::string& path, const Value& x);

// The type names the table translates, sorted (for messages and docs).
std::vector<std::string> translatable_types();

}  // namespace duet::exporter

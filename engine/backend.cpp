#include "engine/backend.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"  // default bodies ignore their arguments

namespace duet {

namespace {
const char* const kOpNames[] = {
#define DUET_OP(name, params) #name,
#include "engine/ops.def"
#undef DUET_OP
};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == kNumOps, "every op in ops.def needs a name");
}  // namespace

const char* op_name(OpId op) { return kOpNames[static_cast<int>(op)]; }

void BackendImpl::not_implemented(OpId op) const {
  throw Error(fmt::format("{} is not implemented on backend '{}' (available backends: {})", op_name(op), name(),
                          available_backends_str()));
}

// Default bodies: every op throws until a backend overrides it.
#define DUET_OP(name, params) \
  void BackendImpl::name params { not_implemented(OpId::name); }
#include "engine/ops.def"
#undef DUET_OP

}  // namespace duet

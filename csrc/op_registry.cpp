#include <stdexcept>

#include "op.hpp"

namespace mgpu {
namespace {

std::vector<const OpDesc*>& registry() {
  static std::vector<const OpDesc*> ops;  // filled by static initialisers in csrc/ops/*.cu
  return ops;
}

}  // namespace

OpRegistrar::OpRegistrar(const OpDesc* desc) { registry().push_back(desc); }

const std::vector<const OpDesc*>& op_registry() { return registry(); }

const OpDesc& find_op(const std::string& name) {
  for (const OpDesc* d : registry()) {
    if (name == d->name) return *d;
  }
  throw std::invalid_argument("unknown op '" + name + "'");
}

}  // namespace mgpu

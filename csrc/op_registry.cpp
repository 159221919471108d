#include <stdexcept>

#include "op.hpp"

namespace mgpu {
namespace {

std::vector<const OpDesc*>& registry() {
  static std::vector<const OpDesc*> ops;  // filled by static initialisers in csrc/ops/*.cu
  return ops;
}

}  // namespace

OpCounts whole_buffer_counts(size_t bytes, size_t type_size, int /*nranks*/) {
  OpCounts c;
  c.count = c.send_count = c.recv_count = bytes / type_size;
  c.bytes = c.count * type_size;
  return c;
}

OpRegistrar::OpRegistrar(const OpDesc* desc) { registry().push_back(desc); }

const std::vector<const OpDesc*>& op_registry() { return registry(); }

const OpDesc& find_op(const std::string& name) {
  for (const OpDesc* d : registry()) {
    if (name == d->name) return *d;
  }
  throw std::invalid_argument("unknown op '" + name + "'");
}

}  // namespace mgpu

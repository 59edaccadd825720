// The UCX transport in a build without libucx: asking for it says how to get it.
#include "cortado/dist/error.h"
#include "cortado/dist/ucx_transport.h"

namespace cortado::dist {

bool HasUcxTransport() { return false; }

std::unique_ptr<Transport> CreateUcxTransport(const UcxTransportOptions&) {
  Fail(ErrorKind::kConfig,
       "CORTADO_TRANSPORT=ucx, but this build has no UCX transport (libucx-dev was not found "
       "when it was configured: install libucx-dev and reconfigure)");
}

}  // namespace cortado::dist

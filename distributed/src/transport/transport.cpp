// The Transport interface's defaults: Allocate as host memory plus Register, and no peer
// mapping (a transport without shared memory never exports a region); and the checks every
// transport makes (transport_internal.h).
#include "cortado/dist/transport.h"

#include <algorithm>
#include <cstdlib>

#include "cortado/dist/error.h"
#include "transport/transport_internal.h"

namespace cortado::dist {
namespace {

constexpr size_t kPage = 4096;

// Host memory that owns its bytes and the registration of them.
class OwnedRegion final : public MemoryRegion {
 public:
  OwnedRegion(char* data, size_t size, std::unique_ptr<MemoryRegion> registration)
      : MemoryRegion(data, size), registration_(std::move(registration)) {}
  ~OwnedRegion() override {
    registration_.reset();  // unregister before the memory goes
    std::free(data());
  }

 private:
  std::unique_ptr<MemoryRegion> registration_;
};

}  // namespace

namespace internal {

void CheckTransfer(const MemoryRegion& region, size_t offset, size_t bytes, int peer, int rank,
                   int size) {
  if (offset > region.size() || bytes > region.size() - offset) {
    Fail(ErrorKind::kInvalidArgument, "transfer of ", bytes, " bytes at offset ", offset,
         " exceeds the registered region of ", region.size(), " bytes");
  }
  if (peer < 0 || peer >= size || peer == rank) {
    Fail(ErrorKind::kInvalidArgument, "rank ", rank, ": no connection to rank ", peer);
  }
}

}  // namespace internal

std::unique_ptr<MemoryRegion> Transport::Allocate(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  char* p = static_cast<char*>(std::aligned_alloc(kPage, rounded));
  if (p == nullptr) Fail(ErrorKind::kSystem, "out of memory allocating ", bytes, " bytes");
  std::unique_ptr<MemoryRegion> registration;
  try {
    registration = Register(p, bytes);
  } catch (...) {
    std::free(p);
    throw;
  }
  return std::make_unique<OwnedRegion>(p, bytes, std::move(registration));
}

std::unique_ptr<PeerMemory> Transport::MapPeerRegion(int peer, const std::string&, uint64_t,
                                                     size_t) {
  Fail(ErrorKind::kSystem, "rank ", rank(), ": the ", name(), " transport cannot map rank ", peer,
       "'s memory (it shares no memory between ranks)");
}

}  // namespace cortado::dist

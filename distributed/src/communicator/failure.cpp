// What both backends do when an operation fails for good; see failure.h.
#include "communicator/failure.h"

#include "common/rank_list.h"
#include "cortado/dist/error.h"

namespace cortado::dist::internal {

void Breakage::ThrowIfBroken(const char* name) const {
  if (!broken) return;
  throw Error(ErrorKind::kPeerFailure,
              StrCat(name, ": the communicator is unusable after an earlier failure: ", what), rank,
              name);
}

LateRanks FindLateRanks(const std::vector<PeerStatus>& status, int self, uint64_t seq,
                        const char* silent) {
  LateRanks late;
  for (const PeerStatus& s : status) {
    if (s.rank == self) continue;
    const char* sep = late.detail.empty() ? "" : "; ";
    if (!s.responded) {
      late.ranks.push_back(s.rank);
      late.detail += StrCat(sep, "rank ", s.rank, " ", silent);
    } else if (s.ops_started < seq) {
      late.ranks.push_back(s.rank);
      late.detail += StrCat(sep, "rank ", s.rank, " is at operation #", s.ops_started,
                            s.ops_finished == s.ops_started ? " (finished)" : "");
    }
  }
  return late;
}

std::string LateRanksMessage(const std::string& prefix, double timeout_s, const LateRanks& late) {
  return StrCat(prefix, ": deadline of ", timeout_s, " s (CORTADO_TIMEOUT_S) passed; rank(s) ",
                RankList(late.ranks), " did not arrive (", late.detail, ")");
}

}  // namespace cortado::dist::internal

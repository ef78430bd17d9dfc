#include "domain/session_cursor.h"

#include "core/status_macros.h"

namespace qparams {

absl::StatusOr<const SessionInfo*> SessionCursor::Next() {
  if (next_ == page_.sessions.size()) {
    if (fetched_ && page_.next_page_token.empty()) return nullptr;
    QPARAMS_ASSIGN_OR_RETURN(page_,
                             engine_->ListSessions(tenant_, kPage, page_.next_page_token, prefix_));
    fetched_ = true;
    next_ = 0;
    if (page_.sessions.empty()) return nullptr;
  }
  return &page_.sessions[next_++];
}

}  // namespace qparams

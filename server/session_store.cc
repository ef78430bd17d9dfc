#include "server/session_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace qparams {
namespace {

constexpr size_t kMaxNameLength = 128;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-' || c == '/';
}

}  // namespace

absl::Status ValidateSessionName(absl::string_view name, absl::string_view field) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty; a session name is 1 to ",
                                                   kMaxNameLength, " characters"));
  }
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", name.size(),
                                                   " characters; the limit is ", kMaxNameLength));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " has a character outside [a-zA-Z0-9._-/] at position ", i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> SessionStore::Insert(std::unique_ptr<Session> session) {
  absl::MutexLock lock(&mu_);
  if (sessions_.contains(session->name())) {
    return absl::AlreadyExistsError(
        absl::StrCat("session \"", session->name(), "\" already exists; delete it first or pick "
                     "another name"));
  }
  if (static_cast<int64_t>(sessions_.size()) >= max_sessions_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the server holds ", sessions_.size(), " sessions, its limit "
                     "(--max_sessions); delete unused sessions first"));
  }
  std::shared_ptr<Session> shared(std::move(session));
  sessions_.emplace(shared->name(), shared);
  return shared;
}

absl::StatusOr<std::shared_ptr<Session>> SessionStore::Find(absl::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = sessions_.find(name);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session \"", name, "\" does not exist"));
  }
  return it->second;
}

absl::Status SessionStore::Erase(absl::string_view name) {
  std::shared_ptr<Session> erased;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(name);
    if (it == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat("session \"", name, "\" does not exist"));
    }
    erased = std::move(it->second);
    sessions_.erase(it);
  }
  erased->MarkDeleted();
  return absl::OkStatus();
}

SessionStore::Page SessionStore::List(absl::string_view prefix, absl::string_view after,
                                      int limit) const {
  Page page;
  absl::ReaderMutexLock lock(&mu_);
  auto it = after.empty() || after < prefix ? sessions_.lower_bound(prefix)
                                            : sessions_.upper_bound(after);
  for (; it != sessions_.end() && absl::StartsWith(it->first, prefix); ++it) {
    if (static_cast<int>(page.sessions.size()) == limit) {
      page.more = true;
      break;
    }
    page.sessions.push_back(it->second);
  }
  return page;
}

int64_t SessionStore::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace qparams

#include "common/dedupe_window.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace qparams {
namespace {

bool IsClientIdChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

absl::Status ValidateClientId(const std::string& id) {
  if (id.empty() || id.size() > static_cast<size_t>(kMaxClientIdLength) ||
      !std::all_of(id.begin(), id.end(), IsClientIdChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_id \"", id.substr(0, kMaxClientIdLength + 1), "\" must be 1 to ",
                     kMaxClientIdLength, " characters of A-Z a-z 0-9 . _ -"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateObserveKey(const ObserveKey& key) {
  if (key.client_id.empty() && key.sequence != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", key.sequence, " is set without a client_id; set both or neither"));
  }
  if (absl::Status id = ValidateClientId(key.client_id); !id.ok()) return id;
  if (key.sequence == 0) {
    return absl::InvalidArgumentError(absl::StrCat("sequence must be >= 1 with client_id \"",
                                                   key.client_id, "\"; set both or neither"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DedupeWindow> DedupeWindow::FromClients(std::vector<Client> clients) {
  if (clients.size() > static_cast<size_t>(kMaxClients)) {
    return absl::InvalidArgumentError(absl::StrCat("the dedupe window holds ", clients.size(),
                                                   " clients; at most ", kMaxClients));
  }
  absl::flat_hash_set<std::string> seen;
  for (const Client& client : clients) {
    if (absl::Status id = ValidateClientId(client.id); !id.ok()) return id;
    if (!seen.insert(client.id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the dedupe window holds client_id \"", client.id, "\" twice"));
    }
    if (client.applied.empty() || client.applied.size() > static_cast<size_t>(kSequencesPerClient)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the dedupe window holds ", client.applied.size(), " sequences of \"",
                       client.id, "\"; 1 to ", kSequencesPerClient));
    }
    uint64_t previous = 0;
    for (const Applied& applied : client.applied) {
      if (applied.sequence <= previous || applied.observation_count < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("the dedupe window's sequences of \"", client.id,
                         "\" must ascend from 1 with counts >= 0"));
      }
      previous = applied.sequence;
    }
  }
  DedupeWindow window;
  window.clients_ = std::move(clients);
  return window;
}

const DedupeWindow::Client* DedupeWindow::Find(const std::string& id) const {
  // The most recent client is last, and a client usually repeats.
  for (auto it = clients_.rbegin(); it != clients_.rend(); ++it) {
    if (it->id == id) return &*it;
  }
  return nullptr;
}

absl::StatusOr<std::optional<int64_t>> DedupeWindow::Check(const ObserveKey& key) const {
  const Client* client = Find(key.client_id);
  if (client == nullptr) return std::nullopt;
  const std::vector<Applied>& applied = client->applied;
  auto it = std::lower_bound(
      applied.begin(), applied.end(), key.sequence,
      [](const Applied& a, uint64_t sequence) { return a.sequence < sequence; });
  if (it != applied.end() && it->sequence == key.sequence) return it->observation_count;
  // The window holds the client's highest sequences: one above its lowest that it
  // does not hold was never applied, nor was any while the window is not full.
  if (applied.size() == static_cast<size_t>(kSequencesPerClient) &&
      key.sequence < applied.front().sequence) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", key.sequence, " of client_id \"", key.client_id,
        "\" is older than the session's dedupe window (its lowest is ", applied.front().sequence,
        "), so it may have been applied; use a new sequence for a new observation"));
  }
  return std::nullopt;
}

void DedupeWindow::Record(const ObserveKey& key, int64_t observation_count) {
  auto it = std::find_if(clients_.begin(), clients_.end(),
                         [&](const Client& c) { return c.id == key.client_id; });
  Client client;
  if (it != clients_.end()) {
    client = std::move(*it);
    clients_.erase(it);
  } else {
    client.id = key.client_id;
    if (clients_.size() == static_cast<size_t>(kMaxClients)) clients_.erase(clients_.begin());
  }
  std::vector<Applied>& applied = client.applied;
  auto at = std::lower_bound(
      applied.begin(), applied.end(), key.sequence,
      [](const Applied& a, uint64_t sequence) { return a.sequence < sequence; });
  applied.insert(at, Applied{key.sequence, observation_count});
  if (applied.size() > static_cast<size_t>(kSequencesPerClient)) applied.erase(applied.begin());
  clients_.push_back(std::move(client));
}

}  // namespace qparams

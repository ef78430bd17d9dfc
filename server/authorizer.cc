#include "server/authorizer.h"

#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

constexpr char kAdminHint[] = "an admin call needs a bearer token of --admin_tokens_file";

// The message of a refused credential; `admin`: for an admin call.
std::string Explain(Refusal reason, bool admin, absl::Time expired_at) {
  std::string why;
  switch (reason) {
    case Refusal::kMissing:
      why = "missing authorization metadata; send \"authorization: Bearer <token>\"";
      break;
    case Refusal::kMalformed:
      why = "authorization metadata is not \"Bearer <token>\"";
      break;
    case Refusal::kUnknown:
      why = "the bearer token is not one this server accepts";
      break;
    case Refusal::kExpired:
      why = absl::StrCat("the bearer token expired at ",
                         absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", expired_at, absl::UTCTimeZone()),
                         "; ask for a new one");
      break;
    case Refusal::kNotAdmin:
      why = "this is a tenant's token, not an admin's";
      break;
    case Refusal::kNotTenant:
      return "an admin's token is for cluster control only; data calls need a tenant's "
             "token of --auth_tokens_file";
    case Refusal::kAdminOff:
      return "cluster control is off: this server was started without --admin_tokens_file. "
             "Start it with --admin_tokens_file=FILE (lines \"TOKEN NAME\") and call with one "
             "of its tokens (qparams-cli --token or --token_file)";
  }
  return admin ? absl::StrCat(kAdminHint, ": ", why) : why;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authorizer>> Authorizer::Load(std::string data_tokens_file,
                                                             std::string admin_tokens_file,
                                                             Family<Counter>* refusals) {
  QPARAMS_ASSIGN_OR_RETURN(Tokens tokens, Read(data_tokens_file, admin_tokens_file));
  std::unique_ptr<Authorizer> authorizer(
      new Authorizer(std::move(data_tokens_file), std::move(admin_tokens_file), refusals));
  {
    absl::MutexLock lock(&authorizer->mu_);  // no other thread sees it yet; for the analysis
    authorizer->tokens_ = std::move(tokens);
  }
  if (refusals != nullptr) {
    // Every series from the start, so that a rate over them is defined at 0.
    for (Refusal reason : kAllRefusals) refusals->WithLabels({std::string(RefusalName(reason))});
  }
  return authorizer;
}

const Authorizer& Authorizer::NoTokens() {
  static const Authorizer* const kNoTokens = new Authorizer("", "", nullptr);
  return *kNoTokens;
}

absl::StatusOr<Authorizer::Tokens> Authorizer::Read(const std::string& data_file,
                                                    const std::string& admin_file) {
  Tokens tokens;
  for (auto [file, flag, out] :
       {std::make_tuple(&data_file, "--auth_tokens_file", &tokens.data),
        std::make_tuple(&admin_file, "--admin_tokens_file", &tokens.admin)}) {
    if (file->empty()) continue;
    absl::StatusOr<TokenAuthenticator> loaded = TokenAuthenticator::Load(*file);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(flag, ": ", loaded.status().message()));
    }
    *out = std::make_shared<const TokenAuthenticator>(*std::move(loaded));
  }
  return tokens;
}

absl::Status Authorizer::Reload() {
  QPARAMS_ASSIGN_OR_RETURN(Tokens tokens, Read(data_file_, admin_file_));
  absl::MutexLock lock(&mu_);
  tokens_ = std::move(tokens);
  return absl::OkStatus();
}

Authorizer::Tokens Authorizer::tokens() const {
  // Every call reads; only SIGHUP writes.
  absl::ReaderMutexLock lock(&mu_);
  return tokens_;
}


absl::Status Authorizer::Refuse(Refusal reason, absl::Status status, absl::string_view method,
                                absl::string_view peer) const {
  if (refusals_ != nullptr) refusals_->WithLabels({std::string(RefusalName(reason))})->Increment();
  LogWarning(absl::StrCat("audit: refused ", method, " from ", peer, ": ", RefusalName(reason),
                          " credential (", absl::StatusCodeToString(status.code()), ")"));
  return status;
}

absl::StatusOr<Caller> Authorizer::Authorize(std::optional<absl::string_view> header, Access access,
                                             absl::string_view method, absl::string_view peer,
                                             absl::Time now) const {
  const Tokens tokens = this->tokens();
  const bool admin_call = access == Access::kAdmin;
  auto refuse = [&](Refusal reason, absl::Time expired_at = absl::InfinitePast()) {
    const std::string message = Explain(reason, admin_call, expired_at);
    const bool wrong_kind = reason == Refusal::kNotAdmin || reason == Refusal::kNotTenant ||
                            reason == Refusal::kAdminOff;
    return Refuse(
        reason,
        wrong_kind ? absl::PermissionDeniedError(message) : absl::UnauthenticatedError(message),
        method, peer);
  };
  if (admin_call && tokens.admin == nullptr) return refuse(Refusal::kAdminOff);
  if (!admin_call && tokens.data == nullptr) return Caller{};  // open
  const BearerToken bearer = ParseBearer(header);
  if (bearer.refusal.has_value()) return refuse(*bearer.refusal);

  // The file the call's kind needs first, then the other (to say which kind it is).
  const TokenAuthenticator* own = admin_call ? tokens.admin.get() : tokens.data.get();
  const TokenAuthenticator* other = admin_call ? tokens.data.get() : tokens.admin.get();
  const TokenAuthenticator::Holder* holder = own->Find(*bearer.token);
  bool admin = admin_call;
  if (holder == nullptr && other != nullptr) {
    holder = other->Find(*bearer.token);
    if (holder != nullptr && access != Access::kTopology) {
      return refuse(admin_call ? Refusal::kNotAdmin : Refusal::kNotTenant);
    }
    admin = !admin_call;
  }
  if (holder == nullptr) return refuse(Refusal::kUnknown);
  if (holder->expires.has_value() && now >= *holder->expires) {
    return refuse(Refusal::kExpired, *holder->expires);
  }
  return Caller{holder->name, admin};
}

void LogAdminAction(const Caller& caller, absl::string_view peer, absl::string_view method,
                    absl::string_view detail, const absl::Status& result) {
  const std::string line = absl::StrCat(
      "audit: admin ", caller.name, " from ", peer, ": ", method, detail.empty() ? "" : " ", detail,
      ": ",
      result.ok() ? "OK"
                  : absl::StrCat(absl::StatusCodeToString(result.code()), ": ", result.message()));
  // A failed admin call is worth an operator's look (a move that broke halfway).
  Log(result.ok() ? LogLevel::kInfo : LogLevel::kWarning, line);
}

}  // namespace qparams

#include "server/auth.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file.h"

namespace qparams {
namespace {

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

bool ValidToken(absl::string_view token) {
  if (token.size() < 16 || token.size() > 512) return false;
  for (char c : token) {
    if (!absl::ascii_isgraph(c)) return false;
  }
  return true;
}

}  // namespace

absl::string_view RefusalName(Refusal reason) {
  switch (reason) {
    case Refusal::kMissing:
      return "missing";
    case Refusal::kMalformed:
      return "malformed";
    case Refusal::kUnknown:
      return "unknown";
    case Refusal::kExpired:
      return "expired";
    case Refusal::kNotAdmin:
      return "not_admin";
    case Refusal::kNotTenant:
      return "not_tenant";
    case Refusal::kAdminOff:
      return "admin_off";
  }
  return "unknown";
}

BearerToken ParseBearer(std::optional<absl::string_view> header) {
  if (!header.has_value()) return {std::nullopt, Refusal::kMissing};
  absl::string_view token = *header;
  if (!absl::StartsWithIgnoreCase(token, "bearer ")) return {std::nullopt, Refusal::kMalformed};
  token.remove_prefix(7);
  token = absl::StripAsciiWhitespace(token);
  if (token.empty()) return {std::nullopt, Refusal::kMalformed};
  return {token, std::nullopt};
}

absl::StatusOr<TokenAuthenticator> TokenAuthenticator::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tokens file: ", text.status().message()));
  }
  return Parse(*text, path);
}

absl::StatusOr<TokenAuthenticator> TokenAuthenticator::Parse(absl::string_view text,
                                                             absl::string_view source) {
  TokenAuthenticator auth;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(source, ":", line_number, ": ");
    if (fields.size() != 2 && fields.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected \"TOKEN NAME [expires=TIME]\", found ", fields.size(), " fields"));
    }
    if (!ValidToken(fields[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "a token is 16 to 512 printable characters without spaces"));
    }
    if (!ValidName(fields[1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "a name is 1 to 64 characters of [a-zA-Z0-9._-]"));
    }
    Holder holder{std::string(fields[1]), std::nullopt};
    if (fields.size() == 3) {
      absl::string_view expires = fields[2];
      absl::Time time;
      std::string error;
      if (!absl::ConsumePrefix(&expires, "expires=") ||
          !absl::ParseTime(absl::RFC3339_full, expires, &time, &error)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where,
                         "the third field is expires=TIME, an RFC 3339 time such as "
                         "expires=2027-01-31T00:00:00Z"));
      }
      holder.expires = time;
    }
    if (!auth.holders_.emplace(fields[0], std::move(holder)).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "this token is listed twice"));
    }
  }
  if (auth.holders_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tokens file ", source, " lists no token; nobody could call the server"));
  }
  return auth;
}

const TokenAuthenticator::Holder* TokenAuthenticator::Find(absl::string_view token) const {
  auto it = holders_.find(token);
  return it == holders_.end() ? nullptr : &it->second;
}

}  // namespace qparams

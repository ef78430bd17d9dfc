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

bool ValidTenant(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  for (char c : tenant) {
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
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected \"TOKEN TENANT\", found ", fields.size(), " fields"));
    }
    if (!ValidToken(fields[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "a token is 16 to 512 printable characters without spaces"));
    }
    if (!ValidTenant(fields[1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "a tenant is 1 to 64 characters of [a-zA-Z0-9._-]"));
    }
    if (!auth.tenants_.emplace(fields[0], fields[1]).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "this token is listed twice"));
    }
  }
  if (auth.tenants_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the tokens file ", source, " lists no token; nobody could call the server"));
  }
  return auth;
}

absl::StatusOr<std::string> TokenAuthenticator::Authenticate(
    std::optional<absl::string_view> header) const {
  if (!header.has_value()) {
    return absl::UnauthenticatedError(
        "missing authorization metadata; send \"authorization: Bearer <token>\"");
  }
  absl::string_view token = *header;
  // The scheme name is case-insensitive (RFC 7235).
  if (!absl::StartsWithIgnoreCase(token, "bearer ")) {
    return absl::UnauthenticatedError("authorization metadata is not \"Bearer <token>\"");
  }
  token.remove_prefix(7);
  auto it = tenants_.find(absl::StripAsciiWhitespace(token));
  if (it == tenants_.end()) {
    return absl::UnauthenticatedError("the bearer token is not one this server accepts");
  }
  return it->second;
}

}  // namespace qparams

// TokenAuthenticator: the tokens file format and the authorization header.

#include "server/auth.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace qparams::testing {
namespace {

constexpr absl::StatusCode kUnauthenticated = absl::StatusCode::kUnauthenticated;

TEST(TokenAuthenticator, ParsesTokensAndTenants) {
  ASSERT_OK_AND_ASSIGN(TokenAuthenticator auth,
                       TokenAuthenticator::Parse("# team tokens\n\n"
                                                 "0123456789abcdef team-a\n"
                                                 "  fedcba9876543210\tteam.b  \n",
                                                 "tokens"));
  EXPECT_EQ(auth.token_count(), 2u);
  for (const char* header : {"Bearer 0123456789abcdef", "bearer 0123456789abcdef",
                             "BEARER 0123456789abcdef"}) {
    absl::StatusOr<std::string> tenant = auth.Authenticate(absl::string_view(header));
    ASSERT_OK(tenant);
    EXPECT_EQ(*tenant, "team-a");
  }
  EXPECT_EQ(*auth.Authenticate(absl::string_view("Bearer fedcba9876543210")), "team.b");
}

TEST(TokenAuthenticator, RefusesMissingMalformedAndUnknownTokens) {
  ASSERT_OK_AND_ASSIGN(TokenAuthenticator auth,
                       TokenAuthenticator::Parse("0123456789abcdef a\n", "tokens"));
  EXPECT_CODE(auth.Authenticate(std::nullopt), kUnauthenticated);
  EXPECT_CODE(auth.Authenticate(absl::string_view("0123456789abcdef")), kUnauthenticated);
  EXPECT_CODE(auth.Authenticate(absl::string_view("Basic 0123456789abcdef")), kUnauthenticated);
  absl::StatusOr<std::string> unknown = auth.Authenticate(absl::string_view("Bearer secret-guess-000"));
  EXPECT_CODE(unknown, kUnauthenticated);
  EXPECT_FALSE(absl::StrContains(unknown.status().message(), "secret-guess"));
}

TEST(TokenAuthenticator, RefusesBadFiles) {
  const std::pair<const char*, absl::StatusCode> bad[] = {
      {"0123456789abcdef\n", kInvalid},                          // no tenant
      {"0123456789abcdef a b\n", kInvalid},                      // three fields
      {"short a\n", kInvalid},                                   // token too short
      {"0123456789abcdef bad/tenant\n", kInvalid},               // tenant charset
      {"0123456789abcdef a\n0123456789abcdef b\n", kInvalid},    // token listed twice
      {"# nothing\n\n", absl::StatusCode::kFailedPrecondition},  // no token at all
  };
  for (const auto& [text, code] : bad) {
    absl::StatusOr<TokenAuthenticator> auth = TokenAuthenticator::Parse(text, "tokens");
    EXPECT_CODE(auth, code) << text;
    if (code == kInvalid) {
      EXPECT_TRUE(absl::StrContains(auth.status().message(), "tokens:"));
    }
  }
  EXPECT_CODE(TokenAuthenticator::Load("/nonexistent/tokens"),
              absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace qparams::testing

// TokenAuthenticator (the tokens file format, the authorization header) and
// Authorizer (who may call what, what a refusal says and counts).

#include "server/auth.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "metrics/metrics.h"
#include "server/authorizer.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

constexpr absl::StatusCode kUnauthenticated = absl::StatusCode::kUnauthenticated;
constexpr absl::StatusCode kDenied = absl::StatusCode::kPermissionDenied;

std::string WriteTokensFile(const std::string& name, const std::string& content) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name, "-", getpid());
  std::ofstream(path) << content;
  return path;
}

TEST(TokenAuthenticator, ParsesTokensNamesAndExpiries) {
  ASSERT_OK_AND_ASSIGN(
      TokenAuthenticator auth,
      TokenAuthenticator::Parse("# team tokens\n\n"
                                "0123456789abcdef team-a\n"
                                "  fedcba9876543210\tteam.b  \n"
                                "0123456789abcdeg ci expires=2027-01-31T12:00:00Z\n",
                                "tokens"));
  EXPECT_EQ(auth.token_count(), 3u);
  ASSERT_NE(auth.Find("0123456789abcdef"), nullptr);
  EXPECT_EQ(auth.Find("0123456789abcdef")->name, "team-a");
  EXPECT_FALSE(auth.Find("0123456789abcdef")->expires.has_value());
  EXPECT_EQ(auth.Find("fedcba9876543210")->name, "team.b");
  EXPECT_EQ(auth.Find("0123456789abcdeg")->expires,
            absl::FromCivil(absl::CivilSecond(2027, 1, 31, 12, 0, 0), absl::UTCTimeZone()));
  EXPECT_EQ(auth.Find("0123456789abcde"), nullptr);
}

TEST(TokenAuthenticator, ReadsTheBearerScheme) {
  for (const char* header :
       {"Bearer 0123456789abcdef", "bearer 0123456789abcdef", "BEARER  0123456789abcdef "}) {
    BearerToken bearer = ParseBearer(absl::string_view(header));
    ASSERT_TRUE(bearer.token.has_value()) << header;
    EXPECT_EQ(*bearer.token, "0123456789abcdef");
  }
  EXPECT_EQ(ParseBearer(std::nullopt).refusal, Refusal::kMissing);
  EXPECT_EQ(ParseBearer(absl::string_view("0123456789abcdef")).refusal, Refusal::kMalformed);
  EXPECT_EQ(ParseBearer(absl::string_view("Basic 0123456789abcdef")).refusal, Refusal::kMalformed);
  EXPECT_EQ(ParseBearer(absl::string_view("Bearer ")).refusal, Refusal::kMalformed);
}

TEST(TokenAuthenticator, RefusesBadFiles) {
  const std::pair<const char*, absl::StatusCode> bad[] = {
      {"0123456789abcdef\n", kInvalid},                                   // no name
      {"0123456789abcdef a b\n", kInvalid},                               // not expires=
      {"0123456789abcdef a expires=tomorrow\n", kInvalid},                // not RFC 3339
      {"0123456789abcdef a expires=2027-01-01T00:00:00Z x\n", kInvalid},  // four fields
      {"short a\n", kInvalid},                                            // token too short
      {"0123456789abcdef bad/tenant\n", kInvalid},                        // name charset
      {"0123456789abcdef a\n0123456789abcdef b\n", kInvalid},             // token listed twice
      {"# nothing\n\n", absl::StatusCode::kFailedPrecondition},           // no token at all
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

// An authorizer over two files: tenants a (expiring) and b, admin ops (expiring).
class AuthorizerTest : public ::testing::Test {
 protected:
  static constexpr char kTenantA[] = "tenant-a-token-0123";
  static constexpr char kTenantB[] = "tenant-b-token-0123";
  static constexpr char kAdmin[] = "admin-ops-token-0123";

  void SetUp() override {
    data_file_ = WriteTokensFile(
        "authorizer-data",
        absl::StrCat(kTenantA, " a expires=2030-01-01T00:00:00Z\n", kTenantB, " b\n"));
    admin_file_ = WriteTokensFile("authorizer-admin",
                                  absl::StrCat(kAdmin, " ops expires=2030-01-01T00:00:00Z\n"));
    refusals_ = registry_.AddCounter("refusals_total", "test", {"reason"});
  }
  void TearDown() override {
    std::remove(data_file_.c_str());
    std::remove(admin_file_.c_str());
  }

  absl::StatusOr<Caller> Call(const Authorizer& authorizer, std::optional<std::string> token,
                              Access access, absl::Time now = kBefore) {
    std::optional<std::string> header;
    if (token.has_value()) header = absl::StrCat("Bearer ", *token);
    return authorizer.Authorize(header, access, "Method", "ipv4:127.0.0.1:1", now);
  }
  uint64_t Refused(Refusal reason) {
    return refusals_->WithLabels({std::string(RefusalName(reason))})->value();
  }

  static inline const absl::Time kBefore =
      absl::FromCivil(absl::CivilSecond(2029, 1, 1, 0, 0, 0), absl::UTCTimeZone());
  static inline const absl::Time kAfter =
      absl::FromCivil(absl::CivilSecond(2030, 1, 1, 0, 0, 0), absl::UTCTimeZone());
  std::string data_file_, admin_file_;
  MetricsRegistry registry_;
  Family<Counter>* refusals_ = nullptr;
};

TEST_F(AuthorizerTest, EachKindOfCallTakesItsOwnTokens) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Authorizer> auth,
                       Authorizer::Load(data_file_, admin_file_, refusals_));
  EXPECT_EQ(Call(*auth, kTenantA, Access::kData)->name, "a");
  EXPECT_EQ(Call(*auth, kTenantB, Access::kTopology)->name, "b");
  ASSERT_OK_AND_ASSIGN(Caller admin, Call(*auth, kAdmin, Access::kAdmin));
  EXPECT_EQ(admin.name, "ops");
  EXPECT_TRUE(admin.admin);
  ASSERT_OK_AND_ASSIGN(Caller reader, Call(*auth, kAdmin, Access::kTopology));
  EXPECT_TRUE(reader.admin);

  EXPECT_CODE(Call(*auth, kAdmin, Access::kData), kDenied);
  EXPECT_CODE(Call(*auth, kTenantA, Access::kAdmin), kDenied);
  for (Access access : {Access::kData, Access::kTopology, Access::kAdmin}) {
    EXPECT_CODE(Call(*auth, std::nullopt, access), kUnauthenticated);
    absl::StatusOr<Caller> guess = Call(*auth, "secret-guess-000000", access);
    EXPECT_CODE(guess, kUnauthenticated);
    EXPECT_FALSE(absl::StrContains(guess.status().message(), "secret-guess"));
  }
  absl::StatusOr<Caller> expired = Call(*auth, kTenantA, Access::kData, kAfter);
  EXPECT_CODE(expired, kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(expired.status().message(), "expired at 2030-01-01T00:00:00Z"));
  EXPECT_CODE(Call(*auth, kAdmin, Access::kAdmin, kAfter), kUnauthenticated);
  EXPECT_OK(Call(*auth, kTenantB, Access::kData, kAfter));  // b's never expires

  EXPECT_EQ(Refused(Refusal::kNotTenant), 1u);
  EXPECT_EQ(Refused(Refusal::kNotAdmin), 1u);
  EXPECT_EQ(Refused(Refusal::kMissing), 3u);
  EXPECT_EQ(Refused(Refusal::kUnknown), 3u);
  EXPECT_EQ(Refused(Refusal::kExpired), 2u);
  EXPECT_EQ(Refused(Refusal::kAdminOff), 0u);
}

TEST_F(AuthorizerTest, WithoutAdminTokensClusterControlIsOff) {
  for (const std::string& data : {std::string(), data_file_}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Authorizer> auth, Authorizer::Load(data, "", refusals_));
    for (std::optional<std::string> token :
         {std::optional<std::string>(), std::optional<std::string>(kAdmin),
          std::optional<std::string>(kTenantA)}) {
      absl::StatusOr<Caller> refused = Call(*auth, token, Access::kAdmin);
      EXPECT_CODE(refused, kDenied);
      EXPECT_TRUE(absl::StrContains(refused.status().message(), "--admin_tokens_file"));
    }
  }
  EXPECT_EQ(Refused(Refusal::kAdminOff), 6u);
  // Data and topology calls are open where there are no data tokens, whatever is sent.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Authorizer> open,
                       Authorizer::Load("", admin_file_, nullptr));
  EXPECT_EQ(Call(*open, kAdmin, Access::kData)->name, "");
  EXPECT_OK(Call(*open, std::nullopt, Access::kTopology));
  EXPECT_OK(Call(*open, kAdmin, Access::kAdmin));
  EXPECT_CODE(Call(Authorizer::NoTokens(), kAdmin, Access::kAdmin), kDenied);
}

TEST_F(AuthorizerTest, ReloadSwapsTokensOrKeepsThem) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Authorizer> auth,
                       Authorizer::Load(data_file_, admin_file_, nullptr));
  // A rotation: a's token revoked, a new one for c.
  WriteTokensFile("authorizer-data", absl::StrCat(kTenantB, " b\nnew-tenant-c-token-0 c\n"));
  ASSERT_OK(auth->Reload());
  EXPECT_CODE(Call(*auth, kTenantA, Access::kData), kUnauthenticated);
  EXPECT_EQ(Call(*auth, "new-tenant-c-token-0", Access::kData)->name, "c");
  // A file that does not parse changes nothing.
  WriteTokensFile("authorizer-data", "short c\n");
  absl::Status bad = auth->Reload();
  EXPECT_CODE(bad, kInvalid);
  EXPECT_TRUE(absl::StrContains(bad.message(), "--auth_tokens_file"));
  EXPECT_EQ(Call(*auth, "new-tenant-c-token-0", Access::kData)->name, "c");
}

}  // namespace
}  // namespace qparams::testing

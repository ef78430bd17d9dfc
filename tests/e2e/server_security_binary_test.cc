// The real qparams-server binary's security at its edges (docs/security.md): it
// will not serve other machines openly unless told to, every refusal and admin call
// leaves an "audit:" line and a count, and SIGHUP rotates the tokens.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "qparams/v1/qparams.grpc.pb.h"
#include "tests/e2e/server_process.h"

namespace qparams::testing {
namespace {

constexpr char kTenantToken[] = "tenant-token-aaaaaaaa";
constexpr char kRotatedToken[] = "tenant-token-cccccccc";
constexpr char kAdminToken[] = "admin-token-bbbbbbbbb";

std::string WriteText(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name, "-", getpid());
  std::ofstream(path) << text;
  return path;
}

TEST(ServerBinarySecurity, WillNotServeOtherMachinesOpenlyUnlessAllowed) {
  const std::string tokens = WriteText("exposure-tokens", absl::StrCat(kTenantToken, " a\n"));
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> says;  // in the log, in order of appearance
  };
  const Case cases[] = {
      {{"--listen=0.0.0.0:0"},
       {"refusing to serve 0.0.0.0:0, reachable from other machines, in plaintext and to "
        "anyone",
        "--allow_insecure"}},
      {{"--listen=0.0.0.0:0", "--auth_tokens_file=" + tokens},
       {"refusing to serve 0.0.0.0:0, reachable from other machines, in plaintext:"}},
      // Allowed: the banner says what is exposed. 192.0.2.1 (TEST-NET-1) is no local
      // address, so nothing is ever bound beyond loopback by this test.
      {{"--listen=192.0.2.1:0", "--allow_insecure"},
       {"!! INSECURE: serving 192.0.2.1:0", "in plaintext", "without authentication",
        "cannot start: cannot listen on 192.0.2.1:0"}},
  };
  for (const Case& c : cases) {
    ServerProcess server(c.flags);
    ASSERT_TRUE(server.started());
    server.WaitForLine("\x01");  // to EOF: the process exits by itself
    size_t at = 0;
    for (const std::string& text : c.says) {
      at = server.log_text().find(text, at);
      EXPECT_NE(at, std::string::npos) << text << " in\n" << server.log_text();
    }
    EXPECT_NE(server.Stop(0), 0) << server.log_text();
  }
  std::remove(tokens.c_str());
}

grpc::StatusCode DropSlots(v1::ClusterAdmin::Stub& stub, std::optional<std::string> token) {
  grpc::ClientContext context;
  if (token.has_value()) context.AddMetadata("authorization", absl::StrCat("Bearer ", *token));
  v1::DropSlotsRequest request;
  request.set_low(0);
  request.set_high(255);
  v1::DropSlotsResponse response;
  return stub.DropSlots(&context, request, &response).error_code();
}

grpc::StatusCode ListSessions(v1::QParamsService::Stub& stub, const std::string& token) {
  grpc::ClientContext context;
  context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  v1::ListSessionsResponse response;
  return stub.ListSessions(&context, v1::ListSessionsRequest(), &response).error_code();
}

TEST(ServerBinarySecurity, AuditsRefusalsAndAdminCallsAndRotatesTokensOnSighup) {
  const std::string tokens = WriteText("audit-tokens", absl::StrCat(kTenantToken, " a\n"));
  const std::string admins = WriteText("audit-admins", absl::StrCat(kAdminToken, " ops\n"));
  ServerProcess server({"--auth_tokens_file=" + tokens, "--admin_tokens_file=" + admins,
                        "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(server.started());
  // "listening on ADDRESS (bearer tokens required)"
  const std::string listening = server.WaitForLine("listening on 127.0.0.1:");
  const size_t at = listening.find("127.0.0.1:");
  const std::string address = listening.substr(at, listening.find(' ', at) - at);
  const std::string metrics_line = server.WaitForLine("serving metrics on http://");
  const size_t host = metrics_line.find("http://") + 7;
  const std::string metrics = metrics_line.substr(host, metrics_line.find("/metrics") - host);
  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::QParamsService::NewStub(channel);
  auto admin = v1::ClusterAdmin::NewStub(channel);

  // The attack of issue 38, as a tenant and as nobody; then the operator.
  EXPECT_EQ(DropSlots(*admin, std::nullopt), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(server.WaitForLine("audit: refused DropSlots from ipv"),
                                ": missing credential (UNAUTHENTICATED)"))
      << server.log_text();
  EXPECT_EQ(DropSlots(*admin, kTenantToken), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(server.WaitForLine("audit: refused DropSlots from ipv"),
                                ": not_admin credential (PERMISSION_DENIED)"))
      << server.log_text();
  const grpc::StatusCode dropped = DropSlots(*admin, kAdminToken);
  const std::string line = server.WaitForLine("audit: admin ops from ipv");
  EXPECT_TRUE(absl::StrContains(line, ": DropSlots slots 0:255")) << line;
  EXPECT_TRUE(absl::StrContains(line, dropped == grpc::StatusCode::OK ? ": OK" : ": FAILED"))
      << line;
  EXPECT_FALSE(absl::StrContains(server.log_text(), kTenantToken));
  EXPECT_FALSE(absl::StrContains(server.log_text(), kAdminToken));

  httplib::Client http("http://" + metrics);
  const httplib::Result scrape = http.Get("/metrics");
  ASSERT_TRUE(scrape);
  for (const char* reason : {"missing", "not_admin"}) {
    EXPECT_TRUE(absl::StrContains(
        scrape->body, absl::StrCat("qparams_auth_refusals_total{reason=\"", reason, "\"} 1\n")))
        << scrape->body;
  }
  EXPECT_TRUE(
      absl::StrContains(scrape->body, "qparams_auth_refusals_total{reason=\"expired\"} 0\n"));

  // Rotation: the old token out, a new one in, without a restart.
  EXPECT_EQ(ListSessions(*stub, kTenantToken), grpc::StatusCode::OK);
  WriteText("audit-tokens", absl::StrCat(kRotatedToken, " a\n"));
  server.Signal(SIGHUP);
  EXPECT_NE(server.WaitForLine("received SIGHUP: tokens files read again"), "");
  EXPECT_EQ(ListSessions(*stub, kTenantToken), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ListSessions(*stub, kRotatedToken), grpc::StatusCode::OK);
  // A file that does not parse leaves the tokens in force.
  WriteText("audit-tokens", "short a\n");
  server.Signal(SIGHUP);
  EXPECT_TRUE(absl::StrContains(server.WaitForLine("tokens not reloaded"), "--auth_tokens_file"))
      << server.log_text();
  EXPECT_EQ(ListSessions(*stub, kRotatedToken), grpc::StatusCode::OK);

  stub.reset();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
  std::remove(tokens.c_str());
  std::remove(admins.c_str());
}

}  // namespace
}  // namespace qparams::testing

// Transport security and authentication end to end: in-process servers on loopback
// with TLS (certificates made at test time by the openssl CLI in a scratch
// directory, removed at exit), mutual TLS, and bearer tokens with two tenants;
// called through qparams::Client and through the real qparams-cli binary.

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.pb.h"
#include "gtest/gtest.h"
#include "qparams/client.h"
#include "qparams/v1/qparams.pb.h"
#include "tests/server/service_test_util.h"
#include "tests/support/subprocess.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using grpc::health::v1::HealthCheckResponse;

constexpr absl::StatusCode kUnauthenticated = absl::StatusCode::kUnauthenticated;
constexpr absl::StatusCode kUnavailable = absl::StatusCode::kUnavailable;
constexpr absl::StatusCode kNotFound = absl::StatusCode::kNotFound;

// Two tenants' tokens, and one no tokens file lists.
constexpr char kTokenA[] = "token-of-tenant-a-0123456789";
constexpr char kTokenB[] = "token-of-tenant-b-9876543210";
constexpr char kUnknownToken[] = "token-nobody-was-given-00000";


void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  ASSERT_TRUE(file.good()) << "cannot write " << path;
}

// ---------------------------------------------------------------- certificates

// A scratch directory holding, as PEM files: a CA (ca.pem, ca.key); a server
// certificate it signed for DNS:localhost and IP:127.0.0.1 (server.pem,
// server.key); a client certificate it signed (client.pem, client.key); another CA
// (other_ca.pem) and a client certificate that one signed (other_client.pem,
// other_client.key), from the sections of tests/data/test-pki.cnf. Made once per
// process, on first use, and removed at exit.
class Pki {
 public:
  // The certificates, made on the first call; check error() first.
  static const Pki& Get() {
    static const Pki* const pki = [] {
      auto* made = new Pki();
      made->Make();
      return made;
    }();
    return *pki;
  }

  // What went wrong making the certificates; "" if nothing did.
  const std::string& error() const { return error_; }
  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }
  const std::string& dir() const { return dir_; }

  // Removes the directory (keys included), if it was made.
  static void Remove() {
    if (!made_dir_.empty()) std::filesystem::remove_all(made_dir_);
  }

 private:
  void Make() {
    std::string dir = absl::StrCat(::testing::TempDir(), "/qparams_tls_test.XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) {
      Fail(absl::StrCat("mkdtemp ", dir, ": ", std::strerror(errno)));
      return;
    }
    dir_ = made_dir_ = dir;
    std::filesystem::copy_file(QPARAMS_TEST_PKI_CONFIG, Path("pki.cnf"));
    // openssl req with a new P-256 key, unencrypted, and `args`.
    auto req = [&](std::vector<std::string> args) {
      args.insert(args.begin(), {"openssl", "req", "-config", Path("pki.cnf"), "-newkey", "ec",
                                 "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"});
      return Openssl(args);
    };
    auto self_signed = [&](const std::string& name, const std::string& cn) {
      return req({"-x509", "-extensions", "ca_ext", "-days", "2", "-subj", "/CN=" + cn, "-keyout",
                  Path(name + ".key"), "-out", Path(name + ".pem")});
    };
    auto signed_by = [&](const std::string& ca, const std::string& name, const std::string& cn,
                         const std::string& extensions, int serial) {
      return req({"-new", "-subj", "/CN=" + cn, "-keyout", Path(name + ".key"), "-out",
                  Path(name + ".csr")}) &&
             Openssl({"openssl", "x509", "-req", "-in", Path(name + ".csr"), "-CA",
                      Path(ca + ".pem"), "-CAkey", Path(ca + ".key"), "-set_serial",
                      std::to_string(serial), "-days", "2", "-extfile", Path("pki.cnf"),
                      "-extensions", extensions, "-out", Path(name + ".pem")});
    };
    (void)(self_signed("ca", "qparams test CA") &&
           signed_by("ca", "server", "localhost", "server_ext", 2) &&
           signed_by("ca", "client", "qparams test client", "client_ext", 3) &&
           self_signed("other_ca", "another test CA") &&
           signed_by("other_ca", "other_client", "another test client", "client_ext", 4));
  }

  bool Openssl(const std::vector<std::string>& argv) {
    const ProcessResult r = RunProcess(argv, dir_);
    if (r.exit_code == 0) return true;
    Fail(absl::StrCat("`", absl::StrJoin(argv, " "), "` exited ", r.exit_code, ": ", r.err));
    return false;
  }

  void Fail(std::string error) { error_ = std::move(error); }

  std::string dir_;
  std::string error_;
  static std::string made_dir_;
};

std::string Pki::made_dir_;

// Removes the certificates after the last test.
class RemovePki : public ::testing::Environment {
 public:
  void TearDown() override { Pki::Remove(); }
};
const auto* const kRemovePki = ::testing::AddGlobalTestEnvironment(new RemovePki);

// ---------------------------------------------------------------- helpers

v1::CreateSessionRequest CreateRequest(const std::string& name) {
  v1::CreateSessionRequest request;
  request.set_name(name);
  request.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  return request;
}

// A client of `server` over `credentials` (null: plaintext) sending `token`.
std::unique_ptr<Client> NewClient(const TestServer& server,
                                  std::shared_ptr<grpc::ChannelCredentials> credentials,
                                  const std::string& token = "",
                                  const std::string& server_name = "") {
  ClientOptions options;
  options.timeout = absl::Seconds(10);
  options.credentials = std::move(credentials);
  options.bearer_token = token;
  options.tls_server_name = server_name;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(server.address(), options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Certificates from the Pki; the fixture has made sure it exists.
std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& ca, const std::string& cert = "",
                                              const std::string& key = "") {
  const Pki* pki = &Pki::Get();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = TlsCredentials(
      pki->Path(ca), cert.empty() ? "" : pki->Path(cert), key.empty() ? "" : pki->Path(key));
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  return credentials.ok() ? *credentials : nullptr;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_ = &Pki::Get();
    ASSERT_EQ(pki_->error(), "") << "cannot make the test certificates";
  }

  // A server with TLS (`tls`), requiring client certificates of the CA (`mtls`),
  // and requiring the tokens of kTokenA and kTokenB (`tokens`).
  std::unique_ptr<TestServer> StartServer(bool tls, bool mtls, bool tokens) {
    ServerOptions options;
    if (tls) {
      options.tls_cert = pki_->Path("server.pem");
      options.tls_key = pki_->Path("server.key");
    }
    if (mtls) options.tls_client_ca = pki_->Path("ca.pem");
    if (tokens) {
      options.auth_tokens_file = pki_->Path("tokens");
      WriteAll(options.auth_tokens_file,
               absl::StrCat("# token tenant\n", kTokenA, " tenant-a\n\n", kTokenB, " tenant-b\n"));
    }
    std::unique_ptr<TestServer> server = TestServer::Start(options);
    EXPECT_NE(server, nullptr) << "the server did not start";
    return server;
  }

  const Pki* pki_ = nullptr;
};

// ---------------------------------------------------------------- TLS

using TlsTest = SecurityTest;

TEST_F(TlsTest, ClientTrustingTheCaCallsEveryKindOfMethod) {
  std::unique_ptr<TestServer> server = StartServer(/*tls=*/true, /*mtls=*/false, /*tokens=*/false);
  ASSERT_NE(server, nullptr);
  // The target is 127.0.0.1: the certificate's IP subjectAltName matches it.
  std::unique_ptr<Client> client = NewClient(*server, Tls("ca.pem"));
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->CreateSession(CreateRequest("s")));
  const Tensor x = F32({2, 3}, {1, -2, 3, 4, 5, -6});
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse observed, client->Observe("s", x.view()));
  EXPECT_EQ(observed.observation_count(), 1);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ObserveResponse> streamed,
                       client->ObserveStream({TensorObservation("s", x.view())}));
  ASSERT_EQ(streamed.size(), 1u);
  EXPECT_EQ(streamed[0].observation_count(), 2);
  ASSERT_OK_AND_ASSIGN(HealthCheckResponse::ServingStatus health, client->Health());
  EXPECT_EQ(health, HealthCheckResponse::SERVING);

  // The name checked can be set apart from the target: localhost is on the
  // certificate, example.com is not.
  std::unique_ptr<Client> by_name = NewClient(*server, Tls("ca.pem"), "", "localhost");
  EXPECT_OK(by_name->GetSession("s"));
  std::unique_ptr<Client> wrong_name = NewClient(*server, Tls("ca.pem"), "", "example.com");
  EXPECT_CODE(wrong_name->GetSession("s"), kUnavailable);
}

TEST_F(TlsTest, PlaintextClientsAndOtherCasAreRefused) {
  std::unique_ptr<TestServer> server = StartServer(/*tls=*/true, /*mtls=*/false, /*tokens=*/false);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> plaintext = NewClient(*server, nullptr);
  EXPECT_CODE(plaintext->ListCalculators(), kUnavailable);
  EXPECT_CODE(plaintext->Health(), kUnavailable);
  // A client that trusts another CA does not accept the server's certificate.
  std::unique_ptr<Client> other = NewClient(*server, Tls("other_ca.pem"));
  EXPECT_CODE(other->ListCalculators(), kUnavailable);
  EXPECT_CODE(other->Health(), kUnavailable);
}

TEST_F(TlsTest, MutualTlsNeedsACertificateOfTheClientCa) {
  std::unique_ptr<TestServer> server = StartServer(/*tls=*/true, /*mtls=*/true, /*tokens=*/false);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> with_cert = NewClient(*server, Tls("ca.pem", "client.pem", "client.key"));
  EXPECT_OK(with_cert->CreateSession(CreateRequest("m")));
  ASSERT_OK_AND_ASSIGN(HealthCheckResponse::ServingStatus health, with_cert->Health());
  EXPECT_EQ(health, HealthCheckResponse::SERVING);

  std::unique_ptr<Client> without_cert = NewClient(*server, Tls("ca.pem"));
  EXPECT_CODE(without_cert->GetSession("m"), kUnavailable);
  EXPECT_CODE(without_cert->Health(), kUnavailable);
  std::unique_ptr<Client> other_cert =
      NewClient(*server, Tls("ca.pem", "other_client.pem", "other_client.key"));
  EXPECT_CODE(other_cert->GetSession("m"), kUnavailable);
  std::unique_ptr<Client> plaintext = NewClient(*server, nullptr);
  EXPECT_CODE(plaintext->GetSession("m"), kUnavailable);
}

TEST_F(TlsTest, TlsCredentialsChecksItsFiles) {
  EXPECT_OK(TlsCredentials("", "", ""));  // the default roots
  EXPECT_OK(
      TlsCredentials(pki_->Path("ca.pem"), pki_->Path("client.pem"), pki_->Path("client.key")));
  const std::string missing = pki_->Path("missing.pem");
  const absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> no_ca =
      TlsCredentials(missing, "", "");
  EXPECT_CODE(no_ca, kPrecondition);
  EXPECT_TRUE(absl::StrContains(no_ca.status().message(), missing)) << no_ca.status();
  EXPECT_CODE(TlsCredentials(pki_->Path("ca.pem"), pki_->Path("client.pem"), missing),
              kPrecondition);
  EXPECT_CODE(TlsCredentials("", pki_->dir(), pki_->Path("client.key")), kPrecondition);
  EXPECT_CODE(TlsCredentials("", pki_->Path("client.pem"), ""), kInvalid);
  EXPECT_CODE(TlsCredentials("", "", pki_->Path("client.key")), kInvalid);
  // Files of the wrong kind: a key as the CA, a certificate as the key.
  EXPECT_CODE(TlsCredentials(pki_->Path("ca.key"), "", ""), kInvalid);
  EXPECT_CODE(TlsCredentials("", pki_->Path("client.pem"), pki_->Path("client.pem")), kInvalid);
}

// ---------------------------------------------------------------- tokens

// The status of each QParamsService method called through `client`, by name.
std::vector<std::pair<std::string, absl::Status>> CallEveryMethod(Client& client) {
  const Tensor x = F32({2, 2}, {1, -2, 3, 4});
  v1::Granularity per_tensor;
  per_tensor.mutable_per_tensor();
  v1::ExportSessionsRequest export_request;
  export_request.set_format("onnx");
  return {
      {"ListCalculators", ToStatus(client.ListCalculators())},
      {"GetTopology", ToStatus(client.GetTopology())},
      {"Compute", ToStatus(client.Compute("", v1::QuantSpec(), x.view()))},
      {"CreateSession", ToStatus(client.CreateSession(CreateRequest("s")))},
      {"GetSession", ToStatus(client.GetSession("s"))},
      {"ListSessions", ToStatus(client.ListSessions(0, "", ""))},
      {"ReadSessions",
       client.ReadSessions("", [](const v1::Session&) { return absl::OkStatus(); })},
      {"SetGranularity", ToStatus(client.SetGranularity("s", per_tensor))},
      {"Observe", ToStatus(client.Observe("s", x.view()))},
      {"ObserveStream", ToStatus(client.ObserveStream({TensorObservation("s", x.view())}))},
      {"ObserveBatch", ToStatus(client.ObserveBatch({TensorObservation("s", x.view())}))},
      {"GetQParams", ToStatus(client.GetQParams("s"))},
      {"ExportSessions",
       client.ExportSessions(export_request, [](absl::string_view) { return absl::OkStatus(); })},
      {"SetExportMode", ToStatus(client.SetExportMode("s", true))},
      {"DeleteSession", client.DeleteSession("s")},
  };
}

using AuthTest = SecurityTest;

TEST_F(AuthTest, EveryMethodNeedsAKnownToken) {
  std::unique_ptr<TestServer> server = StartServer(/*tls=*/false, /*mtls=*/false, /*tokens=*/true);
  ASSERT_NE(server, nullptr);
  for (const char* token : {"", kUnknownToken}) {
    SCOPED_TRACE(absl::StrCat("token \"", token, "\""));
    std::unique_ptr<Client> client = NewClient(*server, nullptr, token);
    for (const auto& [method, status] : CallEveryMethod(*client)) {
      EXPECT_CODE(status, kUnauthenticated) << method;
      EXPECT_FALSE(absl::StrContains(status.message(), kUnknownToken)) << status;
    }
    // Health needs none (and the client sends none).
    ASSERT_OK_AND_ASSIGN(HealthCheckResponse::ServingStatus health, client->Health());
    EXPECT_EQ(health, HealthCheckResponse::SERVING);
    ASSERT_OK_AND_ASSIGN(health, client->Health("qparams.v1.QParamsService"));
    EXPECT_EQ(health, HealthCheckResponse::SERVING);
  }
  // Nothing was created on anyone's behalf.
  std::unique_ptr<Client> a = NewClient(*server, nullptr, kTokenA);
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse listed, a->ListSessions(0, "", ""));
  EXPECT_EQ(listed.sessions_size(), 0);

  // A known token in another scheme than Bearer.
  std::unique_ptr<v1::QParamsService::Stub> stub = server->NewStub();
  for (const std::string& header :
       {absl::StrCat("Basic ", kTokenA), std::string(kTokenA), std::string("Bearer ")}) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", header);
    v1::ListCalculatorsResponse response;
    EXPECT_CODE(FromGrpc(stub->ListCalculators(&context, {}, &response)), kUnauthenticated)
        << header;
  }
  // Each tenant's token works, every method through.
  for (const char* token : {kTokenA, kTokenB}) {
    std::unique_ptr<Client> client = NewClient(*server, nullptr, token);
    for (const auto& [method, status] : CallEveryMethod(*client)) {
      EXPECT_OK(status) << method;
    }
  }
}

std::vector<std::string> Names(const v1::ListSessionsResponse& response) {
  std::vector<std::string> names;
  for (const v1::Session& s : response.sessions()) names.push_back(s.name());
  return names;
}

TEST_F(AuthTest, TenantsHaveTheirOwnSessions) {
  std::unique_ptr<TestServer> server = StartServer(/*tls=*/false, /*mtls=*/false, /*tokens=*/true);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Client> a = NewClient(*server, nullptr, kTokenA);
  std::unique_ptr<Client> b = NewClient(*server, nullptr, kTokenB);

  // The same name, independently.
  ASSERT_OK_AND_ASSIGN(v1::Session a_x, a->CreateSession(CreateRequest("x")));
  ASSERT_OK_AND_ASSIGN(v1::Session b_x, b->CreateSession(CreateRequest("x")));
  EXPECT_EQ(a_x.name(), "x");
  EXPECT_EQ(b_x.name(), "x");
  EXPECT_CODE(a->CreateSession(CreateRequest("x")), absl::StatusCode::kAlreadyExists);
  ASSERT_OK(a->CreateSession(CreateRequest("a-only")));
  ASSERT_OK(b->CreateSession(CreateRequest("b-only")));

  const Tensor x = F32({2, 2}, {1, -2, 3, 4});
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse observed, a->Observe("x", x.view()));
  EXPECT_EQ(observed.observation_count(), 1);
  ASSERT_OK_AND_ASSIGN(v1::Session b_x_now, b->GetSession("x"));
  EXPECT_EQ(b_x_now.observation_count(), 0);
  ASSERT_OK_AND_ASSIGN(v1::GetQParamsResponse b_qparams, b->GetQParams("x"));
  EXPECT_FALSE(b_qparams.initialized());

  // Each lists only its own.
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse a_list, a->ListSessions(0, "", ""));
  EXPECT_EQ(Names(a_list), (std::vector<std::string>{"a-only", "x"}));
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse b_list, b->ListSessions(0, "", ""));
  EXPECT_EQ(Names(b_list), (std::vector<std::string>{"b-only", "x"}));
  for (auto [client, expected] : {std::pair{a.get(), std::vector<std::string>{"a-only", "x"}},
                                  std::pair{b.get(), std::vector<std::string>{"b-only", "x"}}}) {
    std::vector<std::string> read;
    ASSERT_OK(client->ReadSessions("", [&](const v1::Session& s) {
      read.push_back(s.name());
      return absl::OkStatus();
    }));
    EXPECT_EQ(read, expected);
  }
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse a_filtered, a->ListSessions(0, "", "b"));
  EXPECT_EQ(a_filtered.sessions_size(), 0);
  // A page token of A's, played by B, shows none of A's sessions.
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse a_page, a->ListSessions(1, "", ""));
  ASSERT_NE(a_page.next_page_token(), "");
  absl::StatusOr<v1::ListSessionsResponse> b_with_a_token =
      b->ListSessions(1, a_page.next_page_token(), "");
  if (b_with_a_token.ok()) {
    for (const std::string& name : Names(*b_with_a_token)) EXPECT_NE(name, "a-only");
  }

  // A cannot reach B's session by any method.
  EXPECT_CODE(a->GetSession("b-only"), kNotFound);
  EXPECT_CODE(a->Observe("b-only", x.view()), kNotFound);
  EXPECT_CODE(a->GetQParams("b-only"), kNotFound);
  EXPECT_CODE(a->SetExportMode("b-only", true), kNotFound);
  v1::Granularity per_channel;
  per_channel.mutable_per_channel()->set_axis(0);
  EXPECT_CODE(a->SetGranularity("b-only", per_channel), kNotFound);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ObserveResponse> streamed,
                       a->ObserveStream({TensorObservation("b-only", x.view())}));
  ASSERT_EQ(streamed.size(), 1u);
  EXPECT_EQ(streamed[0].status().code(), static_cast<int>(kNotFound));
  EXPECT_CODE(a->DeleteSession("b-only"), kNotFound);
  ASSERT_OK_AND_ASSIGN(v1::Session b_only, b->GetSession("b-only"));
  EXPECT_EQ(b_only.observation_count(), 0);
  EXPECT_FALSE(b_only.export_mode());
  EXPECT_FALSE(b_only.spec().granularity().has_per_channel()) << b_only.spec().DebugString();

  // Deleting A's "x" leaves B's.
  EXPECT_OK(a->DeleteSession("x"));
  EXPECT_CODE(a->GetSession("x"), kNotFound);
  EXPECT_OK(b->GetSession("x"));
}

// ---------------------------------------------------------------- qparams-cli

class CliSecurityTest : public SecurityTest {
 protected:
  void SetUp() override {
    SecurityTest::SetUp();
    if (HasFatalFailure()) return;
    server_ = StartServer(/*tls=*/true, /*mtls=*/false, /*tokens=*/true);
    ASSERT_NE(server_, nullptr);
    target_ = absl::StrCat("--target=127.0.0.1:", server_->server().port());
  }

  // Runs qparams-cli ARGS... with neither $QPARAMS_TOKEN nor gRPC's roots variable
  // set, unless in `env`.
  ProcessResult Cli(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
    args.insert(args.begin(), QPARAMS_CLI_PATH);
    return RunProcess(args, pki_->dir(), {"QPARAMS_TOKEN", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"},
                      env);
  }

  // --target, --tls_ca and --tls_server_name=localhost.
  std::vector<std::string> Tls(std::vector<std::string> args) {
    args.insert(args.begin(),
                {target_, "--tls_ca=" + pki_->Path("ca.pem"), "--tls_server_name=localhost"});
    return args;
  }

  std::unique_ptr<TestServer> server_;
  std::string target_;
};

template <typename Message>
Message Parse(const std::string& json) {
  Message message;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << " in\n" << json;
  return message;
}

TEST_F(CliSecurityTest, TlsAndTokenWork) {
  const ProcessResult created = Cli(Tls({"--token", kTokenA, "create", "cli-x"}));
  ASSERT_EQ(created.exit_code, 0) << created.err;
  EXPECT_EQ(created.err, "");
  EXPECT_EQ(Parse<v1::Session>(created.out).name(), "cli-x");

  // The token may come from the environment; B does not see A's session.
  const ProcessResult a_list = Cli(Tls({"list"}), {absl::StrCat("QPARAMS_TOKEN=", kTokenA)});
  ASSERT_EQ(a_list.exit_code, 0) << a_list.err;
  EXPECT_EQ(Parse<v1::ListSessionsResponse>(a_list.out).sessions_size(), 1) << a_list.out;
  const ProcessResult b_get = Cli(Tls({"get", "cli-x"}), {absl::StrCat("QPARAMS_TOKEN=", kTokenB)});
  EXPECT_EQ(b_get.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(b_get.err, "error: NOT_FOUND: ")) << b_get.err;
  // --token wins over the environment.
  const ProcessResult a_get = Cli(Tls({"--token=" + std::string(kTokenA), "get", "cli-x"}),
                                  {absl::StrCat("QPARAMS_TOKEN=", kTokenB)});
  EXPECT_EQ(a_get.exit_code, 0) << a_get.err;

  // --tls alone verifies against the default roots: gRPC's variable makes the test
  // CA one of them, else the server's certificate is refused.
  const ProcessResult system_roots =
      Cli({target_, "--tls", "--tls_server_name=localhost", "--token", kTokenA, "get", "cli-x"});
  EXPECT_EQ(system_roots.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(system_roots.err, "error: UNAVAILABLE: ")) << system_roots.err;
  const ProcessResult default_roots =
      Cli({target_, "--tls", "--tls_server_name=localhost", "--token", kTokenA, "get", "cli-x"},
          {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=" + pki_->Path("ca.pem")});
  EXPECT_EQ(default_roots.exit_code, 0) << default_roots.err;
}

TEST_F(CliSecurityTest, WithoutATokenOnlyHealthWorks) {
  for (const std::vector<std::string>& command : std::vector<std::vector<std::string>>{
           {"calculators"}, {"create", "cli-y"}, {"list"}, {"get", "cli-y"}}) {
    const ProcessResult r = Cli(Tls(command));
    EXPECT_EQ(r.exit_code, 1) << command[0];
    EXPECT_TRUE(absl::StartsWith(r.err, "error: UNAUTHENTICATED: ")) << r.err;
    EXPECT_EQ(r.out, "");
  }
  const ProcessResult unknown = Cli(Tls({"--token", kUnknownToken, "list"}));
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(unknown.err, "error: UNAUTHENTICATED: ")) << unknown.err;
  EXPECT_FALSE(absl::StrContains(unknown.err, kUnknownToken)) << unknown.err;

  const ProcessResult health = Cli(Tls({"--format=table", "health"}));
  EXPECT_EQ(health.exit_code, 0) << health.err;
  EXPECT_EQ(health.out, "SERVING\n");
}

TEST_F(CliSecurityTest, TlsMistakes) {
  // Plaintext to a TLS server; a name the certificate does not carry.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {target_, "health"},
           {target_, "--tls_ca=" + pki_->Path("ca.pem"), "--tls_server_name=example.com", "health"},
           {target_, "--tls_ca=" + pki_->Path("other_ca.pem"), "--tls_server_name=localhost",
            "health"}}) {
    const ProcessResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 1) << args[1] << "\n" << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "error: UNAVAILABLE: ")) << r.err;
  }
  // Files that cannot be read or hold no certificate: exit 1, naming the file.
  const std::string missing = pki_->Path("missing.pem");
  const ProcessResult no_ca = Cli({target_, "--tls_ca=" + missing, "health"});
  EXPECT_EQ(no_ca.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(no_ca.err, "error: FAILED_PRECONDITION: ")) << no_ca.err;
  EXPECT_TRUE(absl::StrContains(no_ca.err, missing)) << no_ca.err;
  const ProcessResult key_as_ca = Cli({target_, "--tls_ca=" + pki_->Path("ca.key"), "health"});
  EXPECT_EQ(key_as_ca.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(key_as_ca.err, "ca.key")) << key_as_ca.err;
  // Usage errors: a certificate without its key, a server name without TLS.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {target_, "--tls_cert=" + pki_->Path("client.pem"), "health"},
           {target_, "--tls_key=" + pki_->Path("client.key"), "health"},
           {target_, "--tls_server_name=localhost", "health"},
           {target_, "--token=has space", "health"}}) {
    const ProcessResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 2) << args[1];
    EXPECT_TRUE(absl::StartsWith(r.err, "error: INVALID_ARGUMENT: ")) << r.err;
  }
}

TEST_F(CliSecurityTest, MutualTls) {
  std::unique_ptr<TestServer> mtls = StartServer(/*tls=*/true, /*mtls=*/true, /*tokens=*/true);
  ASSERT_NE(mtls, nullptr);
  const std::vector<std::string> base = {absl::StrCat("--target=127.0.0.1:", mtls->server().port()),
                                         "--tls_ca=" + pki_->Path("ca.pem"),
                                         "--tls_server_name=localhost", "--token", kTokenA};
  std::vector<std::string> with_cert = base;
  with_cert.insert(with_cert.end(), {"--tls_cert=" + pki_->Path("client.pem"),
                                     "--tls_key=" + pki_->Path("client.key"), "calculators"});
  const ProcessResult ok = Cli(with_cert);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_GE(Parse<v1::ListCalculatorsResponse>(ok.out).calculators_size(), 1);
  std::vector<std::string> without_cert = base;
  without_cert.push_back("calculators");
  const ProcessResult refused = Cli(without_cert);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(refused.err, "error: UNAVAILABLE: ")) << refused.err;
}

TEST_F(CliSecurityTest, HelpNamesTheFlagsButNotTheToken) {
  const ProcessResult help = Cli({"--help"}, {"QPARAMS_TOKEN=secret-token-in-the-environment"});
  EXPECT_EQ(help.exit_code, 0);  // Abseil's own --help exits 1
  const std::string text = help.out + help.err;
  for (const char* flag : {"--tls_ca", "--tls_cert", "--tls_key", "--tls_server_name", "--token",
                           "QPARAMS_TOKEN", "--tls ("}) {
    EXPECT_TRUE(absl::StrContains(text, flag)) << flag;
  }
  EXPECT_FALSE(absl::StrContains(text, "secret-token-in-the-environment"));
}

}  // namespace
}  // namespace qparams::testing

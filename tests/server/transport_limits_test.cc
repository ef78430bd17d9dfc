// What a client can make a server hold, and what it gets over the wrong transport
// (docs/security.md, "Bounds per connection"): plaintext to a TLS server; a third
// call where two streams fill a connection; an idle connection; a connection that
// never finishes its handshake; a request above max_message_bytes. The server is
// healthy after each.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/server/raw_call.h"
#include "tests/server/service_test_util.h"
#include "tests/support/subprocess.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using grpc::StatusCode;

// A plaintext client of a TLS server fails UNAVAILABLE; the server serves TLS after.
TEST(TransportLimits, PlaintextToATlsServerIsUnavailable) {
  std::string dir_ = absl::StrCat(::testing::TempDir(), "/qparams_transport.XXXXXX");
  ASSERT_NE(mkdtemp(dir_.data()), nullptr);
  // A CA and a server certificate it signed, by the openssl CLI ("@" is dir_).
  std::filesystem::copy_file(QPARAMS_TEST_PKI_CONFIG, dir_ + "/pki.cnf");
  const std::string req =
      "openssl req -config @/pki.cnf -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes ";
  for (const std::string& command :
       {req + "-x509 -extensions ca_ext -days 2 -subj /CN=ca -keyout @/ca.key -out @/ca.pem",
        req + "-new -subj /CN=localhost -keyout @/server.key -out @/server.csr",
        std::string("openssl x509 -req -in @/server.csr -CA @/ca.pem -CAkey @/ca.key "
                    "-set_serial 2 -days 2 -extfile @/pki.cnf -extensions server_ext "
                    "-out @/server.pem")}) {
    const ProcessResult r =
        RunProcess(absl::StrSplit(absl::StrReplaceAll(command, {{"@", dir_}}), ' '), dir_);
    ASSERT_EQ(r.exit_code, 0) << command << ": " << r.err;
  }
  ServerOptions options;
  options.tls_cert = dir_ + "/server.pem";
  options.tls_key = dir_ + "/server.key";
  std::unique_ptr<TestServer> server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  const std::shared_ptr<grpc::Channel> plain =
      grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  const Reply reply =
      CallRaw(plain.get(), Path("ListCalculators"), {""}, std::nullopt, std::chrono::seconds(5));
  EXPECT_EQ(reply.status.error_code(), StatusCode::UNAVAILABLE) << reply.status.error_message();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadAll(dir_ + "/ca.pem");
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  const std::shared_ptr<grpc::Channel> tls =
      grpc::CreateCustomChannel(server->address(), grpc::SslCredentials(ssl), args);
  ExpectHealthy(tls.get(), "ListCalculators", {""}, std::nullopt);
  std::filesystem::remove_all(dir_);
}

std::unique_ptr<TestServer> StartWith(void (*edit)(ServerOptions&)) {
  ServerOptions options;
  edit(options);
  return TestServer::Start(options);
}

// Two ObserveStreams hold both streams of a connection: a third call waits in the
// client and its deadline passes unserved; once a stream ends, calls go through.
TEST(TransportLimits, MaxConcurrentStreamsHoldsTheThirdCall) {
  std::unique_ptr<TestServer> server =
      StartWith([](ServerOptions& o) { o.max_concurrent_streams = 2; });
  ASSERT_NE(server, nullptr);
  const std::shared_ptr<grpc::Channel> channel = server->NewChannel();
  std::unique_ptr<v1::QParamsService::Stub> stub = v1::QParamsService::NewStub(channel);
  auto create = [&](const std::string& name, std::chrono::milliseconds timeout) {
    return CallRaw(channel.get(), Path("CreateSession"),
                   TextRequest<v1::CreateSessionRequest>(
                       absl::StrCat("name: '", name, "' calculator: 'global_minmax' ", kInt8Spec)),
                   std::nullopt, timeout);
  };
  ASSERT_TRUE(create("sec/streamed", std::chrono::seconds(10)).status.ok());
  grpc::ClientContext contexts[2];
  std::unique_ptr<ObserveStreamRW> streams[2];
  for (int i = 0; i < 2; ++i) {
    streams[i] = stub->ObserveStream(&contexts[i]);
    v1::ObserveResponse response;
    // A round trip: the stream is open at the server.
    ASSERT_TRUE(streams[i]->Write(ObserveReq("sec/streamed")) && streams[i]->Read(&response));
    ASSERT_EQ(response.status().code(), 0) << response.status().message();
  }
  const Reply third = create("sec/third", std::chrono::milliseconds(300));
  EXPECT_EQ(third.status.error_code(), StatusCode::DEADLINE_EXCEEDED)
      << third.status.error_message();
  ASSERT_TRUE(streams[0]->WritesDone());
  EXPECT_TRUE(streams[0]->Finish().ok());
  const Reply get = CallRaw(channel.get(), Path("GetSession"),
                            TextRequest<v1::GetSessionRequest>("name: 'sec/third'"), std::nullopt);
  EXPECT_EQ(get.status.error_code(), StatusCode::NOT_FOUND) << "the held call was served";
  EXPECT_TRUE(create("sec/fourth", std::chrono::seconds(10)).status.ok());
  ExpectHealthy(channel.get(), "ListCalculators", {""}, std::nullopt);
  streams[1]->WritesDone();
  EXPECT_TRUE(streams[1]->Finish().ok());
}

// A connection without calls for max_connection_idle is closed: the channel goes IDLE.
TEST(TransportLimits, AnIdleConnectionIsClosed) {
  std::unique_ptr<TestServer> server =
      StartWith([](ServerOptions& o) { o.max_connection_idle = absl::Milliseconds(200); });
  ASSERT_NE(server, nullptr);
  const std::shared_ptr<grpc::Channel> channel = server->NewChannel();
  ExpectHealthy(channel.get(), "ListCalculators", {""}, std::nullopt);
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(5);
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/false);
  while (state != GRPC_CHANNEL_IDLE && channel->WaitForStateChange(state, deadline)) {
    state = channel->GetState(false);
  }
  EXPECT_EQ(state, GRPC_CHANNEL_IDLE);
  // The channel reconnects for the next call.
  ExpectHealthy(channel.get(), "ListCalculators", {""}, std::nullopt);
}

// A client that connects and sends nothing is disconnected after handshake_timeout.
TEST(TransportLimits, ASilentConnectionIsClosedAfterTheHandshakeTimeout) {
  std::unique_ptr<TestServer> server =
      StartWith([](ServerOptions& o) { o.handshake_timeout = absl::Milliseconds(300); });
  ASSERT_NE(server, nullptr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(server->server().port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  timeval safety{5, 0};  // a server that never closes fails here, not hangs
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &safety, sizeof(safety)), 0);
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
  }  // the server's SETTINGS frame, if it sent one
  const int error = n < 0 ? errno : 0;
  close(fd);
  EXPECT_TRUE(n == 0 || error == ECONNRESET) << "recv: " << std::strerror(error);
  const std::shared_ptr<grpc::Channel> channel = server->NewChannel();
  ExpectHealthy(channel.get(), "ListCalculators", {""}, std::nullopt);
}

// A request above max_message_bytes is RESOURCE_EXHAUSTED.
TEST(TransportLimits, ARequestAboveMaxMessageBytesIsResourceExhausted) {
  std::unique_ptr<TestServer> server =
      StartWith([](ServerOptions& o) { o.max_message_bytes = 64 << 10; });
  ASSERT_NE(server, nullptr);
  const std::shared_ptr<grpc::Channel> channel = server->NewChannel();
  v1::Tensor tensor;
  tensor.set_dtype(v1::FLOAT32);
  tensor.add_shape(32 << 10);
  tensor.set_data(std::string(128 << 10, '\0'));
  const Reply reply = CallRaw(channel.get(), Path("Compute"), {ComputeReq(tensor)}, std::nullopt);
  EXPECT_EQ(reply.status.error_code(), StatusCode::RESOURCE_EXHAUSTED)
      << reply.status.error_message();
  ExpectHealthy(channel.get(), "ListCalculators", {""}, std::nullopt);
}

}  // namespace
}  // namespace qparams::testing

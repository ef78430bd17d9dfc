// The real qparams-server binary: flags, its log lines, serving on the port it
// reports, failed-call logging, a graceful exit 0 on SIGTERM and SIGINT, no
// acknowledged observation lost to a SIGKILL, and scale groups kept across restarts.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/slot.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/convert.h"
#include "qparams/v1/qparams.grpc.pb.h"
#include "tests/e2e/server_process.h"
#include "tests/server/service_test_util.h"
#include "tests/support/subprocess.h"
#include "tests/support/test_util.h"

extern char** environ;

namespace qparams::testing {
namespace {

TEST(ServerBinary, ServesAndStopsGracefullyOnSigterm) {
  ServerProcess server({"--log_failed_rpcs", "--max_sessions=1"});
  ASSERT_TRUE(server.started());
  EXPECT_NE(server.WaitForLine("starting:"), "");
  const std::string listening = server.WaitForLine("listening on 127.0.0.1:");
  ASSERT_NE(listening, "");
  auto stub = v1::QParamsService::NewStub(
      grpc::CreateChannel(AddressFrom(listening), grpc::InsecureChannelCredentials()));

  for (const char* name : {"a", "b"}) {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_name(name);
    v1::Session session;
    grpc::Status status = stub->CreateSession(&context, request, &session);
    EXPECT_EQ(status.error_code(), *name == 'a' ? grpc::StatusCode::OK
                                                : grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // --log_failed_rpcs: the failed call is logged with its method and code.
  EXPECT_NE(server.WaitForLine("CreateSession from"), "");
  EXPECT_TRUE(absl::StrContains(server.log_text(), "RESOURCE_EXHAUSTED"));

  // An idle client connection would hold the shutdown for gRPC's GOAWAY grace (~5 s).
  stub.reset();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
  EXPECT_NE(server.WaitForLine("received SIGTERM"), "");
  EXPECT_NE(server.WaitForLine("shut down"), "");
}

TEST(ServerBinary, SigintStopsItToo) {
  ServerProcess server({});
  ASSERT_TRUE(server.started());
  ASSERT_NE(server.WaitForLine("listening on"), "");
  EXPECT_EQ(server.Stop(SIGINT), 0);
  EXPECT_NE(server.WaitForLine("received SIGINT"), "");
}

TEST(ServerBinary, HelpPrintsTheFlagsAndExitsZero) {
  char dir[] = "/tmp/qparams-help-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  for (const char* flag : {"--help", "--helpfull", "--helpshort"}) {
    const ProcessResult help = RunProcess({QPARAMS_SERVER_PATH, flag}, dir);
    EXPECT_EQ(help.exit_code, 0) << flag << ": " << help.err;
    EXPECT_TRUE(absl::StrContains(help.out, "--data_dir")) << flag << ": " << help.out;
    EXPECT_TRUE(absl::StrContains(help.out, "--max_scale_groups")) << flag << ": " << help.out;
  }
  std::filesystem::remove_all(dir);
}

// Both binaries print the project's version, written once in CMakeLists.txt.
TEST(ServerBinary, VersionIsTheProjectsForTheServerAndTheCli) {
  char dir[] = "/tmp/qparams-version-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const ProcessResult server = RunProcess({QPARAMS_SERVER_PATH, "--version"}, dir);
  EXPECT_EQ(server.exit_code, 0) << server.err;
  EXPECT_EQ(server.out, "qparams-server " QPARAMS_VERSION "\n");
  const ProcessResult cli = RunProcess({QPARAMS_CLI_PATH, "--version"}, dir);
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_EQ(cli.out, "qparams-cli " QPARAMS_VERSION "\n");
  std::filesystem::remove_all(dir);
}

TEST(ServerBinary, MaxScaleGroupsRefusesTheGroupBeyondIt) {
  ServerProcess server({"--max_scale_groups=1"});
  ASSERT_TRUE(server.started());
  EXPECT_NE(server.WaitForLine("max_scale_groups=1"), "");
  const std::string listening = server.WaitForLine("listening on 127.0.0.1:");
  ASSERT_NE(listening, "");
  auto stub = v1::QParamsService::NewStub(
      grpc::CreateChannel(AddressFrom(listening), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_name("m");
    request.set_calculator("static");
    v1::Session session;
    ASSERT_TRUE(stub->CreateSession(&context, request, &session).ok());
  }
  for (const char* name : {"g1", "g2"}) {
    grpc::ClientContext context;
    v1::CreateScaleGroupRequest request;
    request.mutable_group()->set_name(name);
    request.mutable_group()->add_members("m");
    request.mutable_group()->set_share(v1::ScaleGroup::UNION_RANGE);
    v1::ScaleGroup group;
    const grpc::Status status = stub->CreateScaleGroup(&context, request, &group);
    if (std::string(name) == "g1") {
      EXPECT_TRUE(status.ok()) << status.error_message();
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_TRUE(absl::StrContains(status.error_message(), "--max_scale_groups"))
          << status.error_message();
    }
  }
  stub.reset();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

TEST(ServerBinary, BadFlagsAndAddressesFailAtStart) {
  for (const char* flag : {"--max_sessions=-1", "--omp_threads=-2", "--listen=nonsense",
                           "--max_scale_groups=0", "--max_scale_groups=-5"}) {
    ServerProcess server({flag});
    ASSERT_TRUE(server.started());
    server.WaitForLine("\x01");  // read to EOF: the process exits by itself
    EXPECT_TRUE(absl::StrContains(server.log_text(), " E qparams-server: ")) << flag;
    if (absl::StartsWith(flag, "--max_scale_groups")) {
      EXPECT_TRUE(absl::StrContains(server.log_text(), "--max_scale_groups is ") &&
                  absl::StrContains(server.log_text(), "it must be >= 1"))
          << server.log_text();
    }
    EXPECT_NE(server.Stop(0), 0) << flag;
  }
}

// SIGKILL in the middle of concurrent observations: after a restart on the same data
// directory, every session holds every acknowledged observation (plus at most the
// one in flight when the process died, which may have reached the journal without
// its answer reaching the client), and its qparams equal a serial replay of them.
void KillDuringLoadAndCheck(const std::string& durability) {
  char pattern[] = "/tmp/qparams-crash-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::vector<std::string> flags = {"--data_dir=" + dir, "--durability=" + durability,
                                          "--flush_interval=100ms"};
  constexpr int kThreads = 8, kEnough = 400;
  v1::QuantSpec spec;
  spec.set_qscheme(v1::ASYMMETRIC);
  spec.mutable_granularity()->mutable_per_channel()->set_axis(0);
  auto input = [](int thread, int i) { return F32({4, 16}, RandN(64, 7919 * thread + i)); };

  std::vector<int> acked(kThreads, 0);
  {
    ServerProcess server(flags);
    ASSERT_TRUE(server.started());
    const std::string address = AddressFrom(server.WaitForLine("listening on"));
    ASSERT_FALSE(address.empty());
    std::atomic<int> total{0};
    absl::Notification enough;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        auto stub = v1::QParamsService::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
        grpc::ClientContext create_context;
        v1::CreateSessionRequest create;
        create.set_name(absl::StrCat("s", t));
        create.set_calculator("global_minmax");
        *create.mutable_spec() = spec;
        v1::Session session;
        if (!stub->CreateSession(&create_context, create, &session).ok()) return;
        for (int i = 0;; ++i) {
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
          v1::ObserveRequest request;
          request.set_name(create.name());
          *request.mutable_tensor() = wire::TensorToProto(input(t, i).view());
          v1::ObserveResponse response;
          if (!stub->Observe(&context, request, &response).ok()) return;  // the server died
          acked[t] = i + 1;
          if (++total == kEnough) enough.Notify();
        }
      });
    }
    enough.WaitForNotification();
    server.Kill();
    for (std::thread& t : threads) t.join();
  }

  ServerProcess server(flags);
  ASSERT_TRUE(server.started());
  const std::string address = AddressFrom(server.WaitForLine("listening on"));
  auto stub = v1::QParamsService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  int total = 0;
  for (int t = 0; t < kThreads; ++t) {
    grpc::ClientContext context;
    v1::GetSessionRequest get;
    get.set_name(absl::StrCat("s", t));
    v1::Session session;
    ASSERT_TRUE(stub->GetSession(&context, get, &session).ok()) << get.name();
    const int64_t count = session.observation_count();
    EXPECT_GE(count, acked[t]) << get.name() << ": an acknowledged observation was lost";
    EXPECT_LE(count, acked[t] + 1) << get.name();
    total += acked[t];

    ASSERT_OK_AND_ASSIGN(auto serial, Create("global_minmax", *wire::SpecFromProto(spec)));
    for (int i = 0; i < count; ++i) ASSERT_OK(Fwd(*serial, input(t, i)));
    EXPECT_TRUE(wire::QParamsFromProto(session.qparams()) ==
                AsStateful(serial.get())->GetQParams())
        << get.name();
  }
  EXPECT_GE(total, kEnough);
  stub.reset();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
  std::system(absl::StrCat("rm -rf ", dir).c_str());
}

TEST(ServerBinary, SigkillLosesNoAcknowledgedObservationWithDurabilityAlways) {
  KillDuringLoadAndCheck("always");
}

// Records reach the kernel before the response under `batched` too, so killing the
// process loses nothing; only a machine crash can lose the last flush interval.
TEST(ServerBinary, SigkillLosesNoAcknowledgedObservationWithDurabilityBatched) {
  KillDuringLoadAndCheck("batched");
}

// Scale groups through the binary: sessions and groups (one GLOBAL_AMAX group of
// NVFP4 sessions, one UNION_RANGE group, one deleted), a restart on the same data
// directory (SIGTERM, then the next start), and GetScaleGroup and GetGroupQParams
// answer the same bytes. Then a SIGKILL right after a group's creation and another
// restart: the acknowledged group is there.
TEST(ServerBinary, ScaleGroupsSurviveARestart) {
  char pattern[] = "/tmp/qparams-groups-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::vector<std::string> flags = {"--data_dir=" + dir, "--durability=always"};
  const std::vector<std::string> absent = {"{l1}.deleted"};
  std::string before;
  {
    ServerProcess server(flags);
    ASSERT_TRUE(server.started());
    const std::string address = AddressFrom(server.WaitForLine("listening on"));
    ASSERT_FALSE(address.empty());
    auto stub = v1::QParamsService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    v1::QuantSpec nvfp4;
    nvfp4.set_dtype("float4_e2m1fn_x2");
    nvfp4.set_scale_dtype("float8_e4m3fn");
    nvfp4.mutable_granularity()->mutable_per_block()->set_axis(-1);
    nvfp4.mutable_granularity()->mutable_per_block()->add_block_size(16);
    v1::QuantSpec int8;
    int8.set_qscheme(v1::ASYMMETRIC);
    uint32_t seed = 0;
    for (const auto& [name, spec] : {std::pair{"{l1}.gate", nvfp4}, std::pair{"{l1}.up", nvfp4},
                                     std::pair{"{l1}.a", int8}, std::pair{"{l1}.b", int8}}) {
      grpc::ClientContext create_context;
      v1::CreateSessionRequest create;
      create.set_name(name);
      create.set_calculator("global_minmax");
      *create.mutable_spec() = spec;
      v1::Session session;
      ASSERT_TRUE(stub->CreateSession(&create_context, create, &session).ok()) << name;
      for (int i = 0; i < 2; ++i) {
        ++seed;
        grpc::ClientContext context;
        v1::ObserveRequest request;
        request.set_name(name);
        *request.mutable_tensor() = wire::TensorToProto(F32({2, 32}, RandN(64, seed, seed)).view());
        v1::ObserveResponse response;
        ASSERT_TRUE(stub->Observe(&context, request, &response).ok()) << name;
      }
    }
    ASSERT_TRUE(CreateScaleGroup(*stub, ScaleGroupOf("{l1}.mlp", {"{l1}.up", "{l1}.gate"},
                                                     v1::ScaleGroup::GLOBAL_AMAX))
                    .ok());
    ASSERT_TRUE(CreateScaleGroup(*stub, ScaleGroupOf("{l1}.ab", {"{l1}.b", "{l1}.a"},
                                                     v1::ScaleGroup::UNION_RANGE, true))
                    .ok());
    ASSERT_TRUE(CreateScaleGroup(
                    *stub, ScaleGroupOf("{l1}.deleted", {"{l1}.a"}, v1::ScaleGroup::UNION_RANGE))
                    .ok());
    ASSERT_TRUE(DeleteScaleGroup(*stub, "{l1}.deleted").ok());
    before = ScaleGroupState(*stub, absent);
    ASSERT_TRUE(absl::StrContains(before, "{l1}.mlp"));
    stub.reset();
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  {
    ServerProcess server(flags);
    ASSERT_TRUE(server.started());
    const std::string restored = server.WaitForLine("restored ");
    EXPECT_TRUE(absl::StrContains(restored, "4 session(s) and 2 scale group(s)")) << restored;
    const std::string address = AddressFrom(server.WaitForLine("listening on"));
    auto stub = v1::QParamsService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    EXPECT_EQ(ScaleGroupState(*stub, absent), before);
    ASSERT_TRUE(
        CreateScaleGroup(*stub, ScaleGroupOf("{l1}.late", {"{l1}.a"}, v1::ScaleGroup::UNION_RANGE))
            .ok());
    before = ScaleGroupState(*stub, absent);
    stub.reset();
    server.Kill();
  }
  ServerProcess server(flags);
  ASSERT_TRUE(server.started());
  const std::string address = AddressFrom(server.WaitForLine("listening on"));
  auto stub =
      v1::QParamsService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  EXPECT_EQ(ScaleGroupState(*stub, absent), before);
  stub.reset();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
  std::filesystem::remove_all(dir);
}

// ---- --metrics_listen: Prometheus' text format at GET /metrics ----

// The host:port of the log line "serving metrics on http://HOST:PORT/metrics".
std::string MetricsAddressFrom(const std::string& line) {
  const size_t start = line.find("http://");
  const size_t end = line.rfind("/metrics");
  if (start == std::string::npos || end == std::string::npos || end < start) return "";
  return line.substr(start + 7, end - start - 7);
}

struct Scrape {
  int status = -1;
  std::string content_type;
  std::string body;
};

Scrape Get(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  Scrape scrape;
  if (httplib::Result result = http.Get(path.c_str())) {
    scrape.status = result->status;
    scrape.content_type = result->get_header_value("Content-Type");
    scrape.body = result->body;
  }
  return scrape;
}

// The first name "<prefix>N" whose slot `owned` says yes to.
std::string NameWhere(const std::string& prefix, const std::function<bool(int)>& owned) {
  for (int i = 0;; ++i) {
    std::string name = absl::StrCat(prefix, i);
    if (owned(SlotOf(name))) return name;
  }
}

// CreateSession of a global_minmax session `name` on the server at `address`: its code.
grpc::StatusCode CreateMinMax(const std::string& address, const std::string& name) {
  auto stub =
      v1::QParamsService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::CreateSessionRequest request;
  request.set_name(name);
  request.set_calculator("global_minmax");
  v1::Session session;
  return stub->CreateSession(&context, request, &session).error_code();
}

TEST(ServerBinary, ServesPrometheusMetricsOfCallsSessionsStorageAndSlots) {
  char pattern[] = "/tmp/qparams-metrics-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  {
    std::ofstream map(dir + "/slots.map");
    map << "0:99 r0\n100:255 r1\n";
  }
  ServerProcess server({"--metrics_listen=127.0.0.1:0", "--data_dir=" + dir + "/data",
                        "--replica_id=r0", "--slot_map=" + dir + "/slots.map"});
  ASSERT_TRUE(server.started());
  const std::string address = AddressFrom(server.WaitForLine("listening on 127.0.0.1:"));
  const std::string metrics = MetricsAddressFrom(server.WaitForLine("serving metrics on http://"));
  ASSERT_FALSE(address.empty());
  ASSERT_TRUE(absl::StartsWith(metrics, "127.0.0.1:")) << server.log_text();
  EXPECT_FALSE(absl::EndsWith(metrics, ":0")) << "the log names the port the OS picked";

  auto stub =
      v1::QParamsService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const std::string mine = NameWhere("mine", [](int slot) { return slot <= 99; });
  const std::string theirs = NameWhere("theirs", [](int slot) { return slot >= 100; });
  const std::string missing = NameWhere("missing", [](int slot) { return slot <= 99; });
  auto create = [&](const std::string& name) { return CreateMinMax(address, name); };
  auto observe = [&](const std::string& name) {
    grpc::ClientContext context;
    v1::ObserveRequest request;
    request.set_name(name);
    *request.mutable_tensor() = wire::TensorToProto(F32({2, 2}, {1, -2, 3, 4}).view());
    v1::ObserveResponse response;
    return stub->Observe(&context, request, &response).error_code();
  };
  ASSERT_EQ(create(mine), grpc::StatusCode::OK);
  ASSERT_EQ(create(theirs), grpc::StatusCode::FAILED_PRECONDITION);  // r1's session
  ASSERT_EQ(observe(mine), grpc::StatusCode::OK);
  ASSERT_EQ(observe(mine), grpc::StatusCode::OK);
  ASSERT_EQ(observe(missing), grpc::StatusCode::NOT_FOUND);

  const Scrape scrape = Get(metrics, "/metrics");
  ASSERT_EQ(scrape.status, 200);
  EXPECT_TRUE(absl::StartsWith(scrape.content_type, "text/plain; version=0.0.4"))
      << scrape.content_type;
  const std::string& text = scrape.body;
  EXPECT_TRUE(HasLine(text, "# TYPE qparams_calls_total counter")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_calls_total{method=\"CreateSession\",code=\"OK\"} 1")) << text;
  EXPECT_TRUE(
      HasLine(text, "qparams_calls_total{method=\"CreateSession\",code=\"FAILED_PRECONDITION\"} 1"))
      << text;
  EXPECT_TRUE(HasLine(text, "qparams_calls_total{method=\"Observe\",code=\"OK\"} 2")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_calls_total{method=\"Observe\",code=\"NOT_FOUND\"} 1"))
      << text;
  EXPECT_TRUE(HasLine(text, "# TYPE qparams_call_duration_seconds histogram")) << text;
  EXPECT_TRUE(HasLine(
      text, "qparams_call_duration_seconds_bucket{method=\"Observe\",code=\"OK\",le=\"+Inf\"} 2"))
      << text;
  EXPECT_TRUE(
      HasLine(text, "qparams_call_duration_seconds_count{method=\"Observe\",code=\"OK\"} 2"))
      << text;
  EXPECT_TRUE(HasLine(text, "qparams_observations_total 2")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_received_bytes_total 48")) << text;  // 3 x 4 float32
  EXPECT_TRUE(HasLine(text, "qparams_sessions{tenant=\"\"} 1")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_journal_appends_total 3")) << text;  // create, 2 observes
  EXPECT_TRUE(HasLine(text, "qparams_storage_state{state=\"ok\"} 1")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_owned_slots 100")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_replica_info{replica=\"r0\"} 1")) << text;
  EXPECT_EQ(Get(metrics, "/").status, 404);

  // SIGTERM stops both servers, and the process exits 0.
  stub.reset();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
  EXPECT_NE(server.WaitForLine("shut down"), "");
  EXPECT_EQ(Get(metrics, "/metrics").status, -1);  // nothing listens any more
  std::filesystem::remove_all(dir);
}

// SIGHUP reads --slot_map again: a greater epoch is taken (the log says what moved,
// the metrics and ownership follow), an older or broken file is refused and changes
// nothing, and a restart keeps the greatest epoch it took even though the file is
// older again. A replica the map gives no slot starts, refusing every session.
TEST(ServerBinary, SighupReloadsTheSlotMapUnderTheEpochRule) {
  char pattern[] = "/tmp/qparams-sighup-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::string map_path = dir + "/slots.map";
  auto write_map = [&](const std::string& text) { std::ofstream(map_path) << text; };
  write_map("# epoch 1\n0:99 r0\n100:255 r1\n");
  const std::vector<std::string> flags = {"--metrics_listen=127.0.0.1:0",
                                          "--data_dir=" + dir + "/data", "--replica_id=r0",
                                          "--slot_map=" + map_path};
  const std::string moving = NameWhere("moving", [](int slot) { return slot >= 100 && slot < 200; });
  {
    ServerProcess server(flags);
    ASSERT_TRUE(server.started());
    const std::string address = AddressFrom(server.WaitForLine("listening on 127.0.0.1:"));
    const std::string metrics =
        MetricsAddressFrom(server.WaitForLine("serving metrics on http://"));
    EXPECT_EQ(CreateMinMax(address, moving), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_TRUE(HasLine(Get(metrics, "/metrics").body, "qparams_slot_map_epoch 1"));

    write_map("# epoch 2\n0:199 r0\n200:255 r1\n");
    server.Signal(SIGHUP);
    EXPECT_TRUE(absl::StrContains(server.WaitForLine("slot map: epoch 1 -> 2"),
                                  "100:199 r1->r0; replica r0 owns 200 slot(s)"))
        << server.log_text();
    EXPECT_NE(server.WaitForLine("received SIGHUP: slot map"), "");
    EXPECT_EQ(CreateMinMax(address, moving), grpc::StatusCode::OK);
    const std::string text = Get(metrics, "/metrics").body;
    EXPECT_TRUE(HasLine(text, "qparams_owned_slots 200")) << text;
    EXPECT_TRUE(HasLine(text, "qparams_slot_map_epoch 2")) << text;

    write_map("# epoch 1\n0:99 r0\n100:255 r1\n");
    server.Signal(SIGHUP);
    EXPECT_TRUE(absl::StrContains(server.WaitForLine("not taken"),
                                  "slot map epoch 1 is older than replica r0's epoch 2"))
        << server.log_text();
    write_map("# epoch 3\n0:99 r0\n");
    server.Signal(SIGHUP);
    EXPECT_TRUE(absl::StrContains(server.WaitForLine("not taken"), "no line gives slot 100"))
        << server.log_text();
    EXPECT_EQ(CreateMinMax(address, NameWhere("still", [](int slot) { return slot >= 100 && slot < 200; })),
              grpc::StatusCode::OK);
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  {
    // The file says epoch 1 again; the data directory's epoch 2 wins.
    write_map("# epoch 1\n0:99 r0\n100:255 r1\n");
    ServerProcess server(flags);
    ASSERT_TRUE(server.started());
    EXPECT_NE(server.WaitForLine("slot map: using epoch 2"), "") << server.log_text();
    const std::string address = AddressFrom(server.WaitForLine("listening on 127.0.0.1:"));
    v1::GetSessionRequest get;
    get.set_name(moving);
    auto stub = v1::QParamsService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::Session session;
    EXPECT_TRUE(stub->GetSession(&context, get, &session).ok());
    stub.reset();
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  {
    // r9 owns no slot: it starts, saying so, and refuses every session with its owner.
    ServerProcess server({"--replica_id=r9", "--slot_map=" + map_path});
    ASSERT_TRUE(server.started());
    EXPECT_NE(server.WaitForLine("replica r9 owns no slot"), "") << server.log_text();
    const std::string address = AddressFrom(server.WaitForLine("listening on 127.0.0.1:"));
    EXPECT_EQ(CreateMinMax(address, moving), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(server.Stop(SIGTERM), 0);
  }
  std::filesystem::remove_all(dir);
}

// GET /healthz on the metrics listener: 200 while SERVING with a data directory that
// takes writes, 503 from the moment SIGTERM starts the drain (an open ObserveStream
// holds it), while /livez stays 200; nothing listens once the process is gone.
TEST(ServerBinary, HealthzIsServingThen503WhileDraining) {
  char pattern[] = "/tmp/qparams-healthz-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ServerProcess server({"--metrics_listen=127.0.0.1:0", "--data_dir=" + dir,
                        "--shutdown_grace=60s"});
  ASSERT_TRUE(server.started());
  const std::string address = AddressFrom(server.WaitForLine("listening on 127.0.0.1:"));
  const std::string line = server.WaitForLine("serving metrics on http://");
  EXPECT_TRUE(absl::StrContains(line, "health on /healthz and /livez")) << line;
  const std::string metrics = MetricsAddressFrom(line);
  ASSERT_FALSE(metrics.empty()) << server.log_text();

  const Scrape ready = Get(metrics, "/healthz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "SERVING\n");
  EXPECT_EQ(ready.content_type, "text/plain; charset=utf-8");
  EXPECT_EQ(Get(metrics, "/livez").status, 200);
  EXPECT_FALSE(std::filesystem::exists(dir + "/health-probe")) << "the probe cleans up";

  auto stub =
      v1::QParamsService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ObserveRequest, v1::ObserveResponse>> stream =
      stub->ObserveStream(&context);
  // One item answered: the call is in flight on the server before the signal.
  v1::ObserveRequest item;
  item.set_name("missing");
  v1::ObserveResponse answer;
  ASSERT_TRUE(stream->Write(item));
  ASSERT_TRUE(stream->Read(&answer));
  server.Signal(SIGTERM);
  ASSERT_NE(server.WaitForLine("received SIGTERM"), "");
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  Scrape draining;
  while ((draining = Get(metrics, "/healthz")).status == 200 && absl::Now() < deadline) {
  }
  EXPECT_EQ(draining.status, 503);
  EXPECT_TRUE(absl::StartsWith(draining.body, "NOT_SERVING: shutting down")) << draining.body;
  EXPECT_EQ(Get(metrics, "/livez").status, 200);

  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  stream.reset();
  stub.reset();
  EXPECT_EQ(server.Stop(0), 0);
  EXPECT_EQ(Get(metrics, "/healthz").status, -1);
  std::filesystem::remove_all(dir);
}

TEST(ServerBinary, MetricsListenIsOffByDefaultAndCheckedAtStart) {
  {
    ServerProcess server({});
    ASSERT_TRUE(server.started());
    ASSERT_NE(server.WaitForLine("listening on"), "");
    EXPECT_EQ(server.Stop(SIGTERM), 0);
    server.WaitForLine("\x01");  // to EOF
    EXPECT_FALSE(absl::StrContains(server.log_text(), "metrics")) << server.log_text();
  }
  // Malformed (exit 2 before anything starts) or not bindable here (exit 1).
  for (const char* flag : {"--metrics_listen=nonsense", "--metrics_listen=127.0.0.1:65536",
                           "--metrics_listen=:9100", "--metrics_listen=192.0.2.1:0"}) {
    ServerProcess server({flag});
    ASSERT_TRUE(server.started());
    server.WaitForLine("\x01");  // read to EOF: the process exits by itself
    EXPECT_TRUE(absl::StrContains(server.log_text(), " E qparams-server: ")) << flag;
    EXPECT_TRUE(absl::StrContains(server.log_text(), "--metrics_listen")) << server.log_text();
    EXPECT_NE(server.Stop(0), 0) << flag;
  }
}

}  // namespace
}  // namespace qparams::testing

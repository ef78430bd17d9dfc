// The C++ client against sharded replicas behind the real HAProxy (Debian's, run
// on docker/haproxy/haproxy.cfg as shipped): calls over many sessions split into one
// call per owner, listings merged from every replica, exports merged into one
// document, and the results bit for bit (byte for byte) those of one unsharded
// server; HAProxy's health check taking out a replica whose data directory refuses
// writes, and bringing it back once writes work; and the topology changing under a
// live client (its retries at the new owner) and in HAProxy through its runtime API
// (slot map push, a spare backend made ready). The replicas take admin calls with
// kTestAdminToken (service_test_util.h), which the tests' admin clients carry.
// tests/python/test_sharded.py covers the Python client, a killed replica, a
// restart and a draining replica.

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/replica_router.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "gtest/gtest.h"
#include "metrics/metrics_http.h"
#include "qparams/client.h"
#include "tests/client/fault_injection_env.h"
#include "tests/server/service_test_util.h"
#include "tests/support/subprocess.h"
#include "tests/support/test_util.h"
#include "tools/haproxy_runtime.h"
#include "tools/slot_map_push.h"

namespace qparams::testing {
namespace {

constexpr char kHAProxy[] = "/usr/sbin/haproxy";
constexpr char kSlotMap[] = "0:84 r0\n85:169 r1\n170:255 r2\n";
constexpr std::array<const char*, 3> kReplicas = {"r0", "r1", "r2"};
constexpr size_t kBackends = 8;  // haproxy.cfg's r0 .. r7, r3 .. r7 spares

// HAProxy in the foreground on the repository's configuration, its addresses (each
// replica's gRPC address and the port of its health endpoint) given through the
// environment as the configuration documents; stopped by its PID.
class HAProxyProcess {
 public:
  HAProxyProcess(const std::string& dir, const std::vector<std::string>& replicas,
                 const std::vector<int>& check_ports) {
    std::vector<std::string> variables = {
        absl::StrCat("QPARAMS_BIND=unix@", dir, "/grpc.sock"),
        absl::StrCat("QPARAMS_SLOT_MAP=", dir, "/slots.map"),
        absl::StrCat("QPARAMS_ADMIN_SOCKET=", dir, "/admin.sock")};
    for (size_t i = 0; i < replicas.size(); ++i) {
      variables.push_back(absl::StrCat("QPARAMS_R", i, "=", replicas[i]));
      variables.push_back(absl::StrCat("QPARAMS_R", i, "_CHECK_PORT=", check_ports[i]));
    }
    // The spare backends (disabled) at a loopback address, so that HAProxy resolves
    // no name of theirs.
    for (size_t i = replicas.size(); i < kBackends; ++i) {
      variables.push_back(absl::StrCat("QPARAMS_R", i, "=127.0.0.1:1"));
    }
    std::vector<std::string> env = EnvironmentWith({}, variables);
    std::vector<std::string> argv = {kHAProxy, "-db", "-f", QPARAMS_HAPROXY_CONFIG};
    std::vector<char*> args = CStrings(argv), envp = CStrings(env);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = absl::StrCat(dir, "/haproxy.log");
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    if (posix_spawn(&pid_, kHAProxy, &actions, nullptr, args.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~HAProxyProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

Tensor Values(int i) {
  std::vector<double> values(4 * 16);
  for (size_t k = 0; k < values.size(); ++k) {
    values[k] = static_cast<double>((k * 37 + i * 101) % 199) / 7.0 - 14.0;
  }
  return F32({4, 16}, values);
}

// kSlotMap with r0's slots moved to r1 (r0 owns nothing), at epoch 1.
constexpr char kR0MovedToR1[] = "# epoch 1\n0:169 r1\n170:255 r2\n";

class ShardedClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kHAProxy, X_OK) != 0) {
      GTEST_FAIL() << kHAProxy << " is missing: scripts/install-deps.sh installs it (haproxy)";
    }
    char pattern[] = "/tmp/qps-cc-XXXXXX";  // short: sun_path holds ~100 bytes
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ + "/slots.map") << kSlotMap;
    ASSERT_OK_AND_ASSIGN(SlotMap map, SlotMap::Parse(kSlotMap));
    map_ = std::make_shared<const SlotMap>(std::move(map));
    admin_tokens_file_ = WriteAdminTokensFile(dir_);
    std::vector<std::string> addresses;
    std::vector<int> check_ports;
    for (size_t r = 0; r < kReplicas.size(); ++r) {
      ServerOptions options;
      options.engine.slot_map = map_;
      options.engine.replica_id = kReplicas[r];
      options.admin_tokens_file = admin_tokens_file_;
      // Listings, reads and exports fan out through HAProxy (server/fan_out.h).
      options.service.cluster_address = absl::StrCat("unix:", dir_, "/grpc.sock");
      Customize(r, options);
      replicas_.push_back(TestServer::Start(options));
      ASSERT_NE(replicas_.back(), nullptr);
      addresses.push_back(replicas_.back()->address());
      // The health endpoint main() serves with --metrics_listen, which HAProxy checks.
      QParamsServer* server = &replicas_.back()->server();
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<MetricsHttpServer> health,
                           MetricsHttpServer::Start(
                               HostPort{"127.0.0.1", 0}, &server->metrics(),
                               {[server] { return server->Readiness(); },
                                [server] { return server->Liveness(); }}));
      check_ports.push_back(health->port());
      health_.push_back(std::move(health));
    }
    haproxy_ = std::make_unique<HAProxyProcess>(dir_, addresses, check_ports);
    ASSERT_TRUE(haproxy_->running());
    target_ = absl::StrCat("unix:", dir_, "/grpc.sock");
    // Ready once each replica answers through it, addressed by name.
    for (const char* replica : kReplicas) {
      ClientOptions options;
      options.replica = replica;
      options.timeout = absl::Seconds(2);
      options.bearer_token = ready_token_;
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_, options));
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      absl::StatusOr<v1::Topology> topology;
      while (!(topology = client->GetTopology()).ok() && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      ASSERT_OK(topology.status());
      ASSERT_EQ(topology->replica_id(), replica);
    }
    for (int i = 0; i < 30; ++i) names_.push_back(absl::StrCat("cc/layer", i));
  }

  void TearDown() override {
    haproxy_.reset();
    health_.clear();  // before the servers they ask
    replicas_.clear();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Creates the sessions, then observes them: a stream of every session twice,
  // interleaved, and a batch; returns each session's qparams after.
  std::vector<v1::GetQParamsResponse> Calibrate(Client& client) {
    std::vector<v1::GetQParamsResponse> out;
    for (const std::string& name : names_) {
      v1::CreateSessionRequest create;
      create.set_name(name);
      create.set_calculator("global_minmax");
      create.mutable_spec()->set_dtype("int8");
      EXPECT_OK(client.CreateSession(create).status());
    }
    std::vector<v1::ObserveRequest> requests;
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < names_.size(); ++i) {
        requests.push_back(TensorObservation(names_[i], Values(i + 50 * round).view()));
      }
    }
    absl::StatusOr<std::vector<v1::ObserveResponse>> streamed = client.ObserveStream(requests);
    EXPECT_OK(streamed.status());
    if (!streamed.ok()) return out;
    for (size_t k = 0; k < requests.size(); ++k) {
      EXPECT_EQ((*streamed)[k].status().code(), 0) << (*streamed)[k].status().message();
      EXPECT_EQ((*streamed)[k].observation_count(), k < names_.size() ? 1 : 2) << k;
    }
    requests.clear();
    for (size_t i = 0; i < names_.size(); ++i) {
      requests.push_back(TensorObservation(names_[i], Values(i + 100).view()));
    }
    absl::StatusOr<std::vector<v1::ObserveResponse>> batched = client.ObserveBatch(requests);
    EXPECT_OK(batched.status());
    if (!batched.ok()) return out;
    for (const v1::ObserveResponse& response : *batched) {
      EXPECT_EQ(response.observation_count(), 3);
    }
    for (const std::string& name : names_) {
      absl::StatusOr<v1::GetQParamsResponse> qparams = client.GetQParams(name);
      EXPECT_OK(qparams.status());
      if (qparams.ok()) out.push_back(*std::move(qparams));
    }
    return out;
  }

  // SetSlotMap(`map`, of epoch 1) on every replica, each addressed by name.
  void GiveEveryReplica(const char* map) {
    for (const char* replica : kReplicas) {
      ClientOptions options;
      options.replica = replica;
      options.bearer_token = kTestAdminToken;
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> admin, Client::Connect(target_, options));
      ASSERT_OK_AND_ASSIGN(const v1::Topology topology, admin->SetSlotMap(map));
      EXPECT_EQ(topology.epoch(), 1);
    }
  }

  // What a test changes in replica `r`'s options before it starts.
  virtual void Customize(size_t /*r*/, ServerOptions& /*options*/) {}
  // The token SetUp's readiness calls carry (a fixture with --auth_tokens_file).
  std::string ready_token_;

  std::string dir_;
  std::string admin_tokens_file_;  // in dir_: every replica's --admin_tokens_file
  std::shared_ptr<const SlotMap> map_;
  std::vector<std::unique_ptr<TestServer>> replicas_;
  std::vector<std::unique_ptr<MetricsHttpServer>> health_;  // replicas_[i]'s endpoint
  std::unique_ptr<HAProxyProcess> haproxy_;
  std::string target_;
  std::vector<std::string> names_;
};

TEST_F(ShardedClientTest, StreamsAndBatchesSplitByOwnerMatchOneServer) {
  std::unique_ptr<TestServer> single = TestServer::Start();
  ASSERT_NE(single, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> alone, Client::Connect(single->address()));
  const std::vector<v1::GetQParamsResponse> expected = Calibrate(*alone);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_));
  const std::vector<v1::GetQParamsResponse> got = Calibrate(*client);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].SerializeAsString(), expected[i].SerializeAsString()) << names_[i];
  }

  // Every replica holds exactly its own sessions.
  for (size_t r = 0; r < kReplicas.size(); ++r) {
    ClientOptions options;
    options.replica = kReplicas[r];
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> direct,
                         Client::Connect(replicas_[r]->address(), options));
    ASSERT_OK_AND_ASSIGN(const v1::ListSessionsResponse listed, direct->ListSessions(1000, "", ""));
    std::vector<std::string> own;
    for (const std::string& name : names_) {
      if (map_->OwnerOfSession(name) == kReplicas[r]) own.push_back(name);
    }
    std::sort(own.begin(), own.end());
    ASSERT_EQ(listed.sessions_size(), static_cast<int>(own.size())) << kReplicas[r];
    for (size_t k = 0; k < own.size(); ++k) EXPECT_EQ(listed.sessions(k).name(), own[k]);
  }

  // A refused request fails only its own response, whichever replica it goes to.
  std::vector<v1::ObserveRequest> requests = {TensorObservation(names_[0], Values(0).view()),
                                              TensorObservation("cc/missing", Values(1).view()),
                                              TensorObservation(names_[1], Values(2).view())};
  ASSERT_OK_AND_ASSIGN(const std::vector<v1::ObserveResponse> responses,
                       client->ObserveStream(requests));
  EXPECT_EQ(responses[0].observation_count(), 4);
  EXPECT_EQ(responses[1].status().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(responses[2].observation_count(), 4);
}

TEST_F(ShardedClientTest, ListingsMergeEveryReplica) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_));
  for (const std::string& name : names_) {
    v1::CreateSessionRequest create;
    create.set_name(name);
    ASSERT_OK(client->CreateSession(create).status());
  }
  std::vector<std::string> sorted = names_;
  std::sort(sorted.begin(), sorted.end());

  for (int page_size : {0, 1, 4, 1000}) {
    std::vector<std::string> listed;
    std::string token;
    do {
      ASSERT_OK_AND_ASSIGN(const v1::ListSessionsResponse page,
                           client->ListSessions(page_size, token, "cc/"));
      ASSERT_LE(page.sessions_size(), page_size == 0 ? 50 : page_size);
      for (const v1::Session& session : page.sessions()) listed.push_back(session.name());
      token = page.next_page_token();
      ASSERT_LE(listed.size(), sorted.size());
    } while (!token.empty());
    EXPECT_EQ(listed, sorted) << "page_size " << page_size;
  }

  std::vector<std::string> read;
  ASSERT_OK(client->ReadSessions("cc/", [&read](const v1::Session& session) {
    read.push_back(session.name());
    return absl::OkStatus();
  }));
  EXPECT_EQ(read, sorted);
  // The callback's error ends it, with every stream cancelled.
  int calls = 0;
  EXPECT_CODE(client->ReadSessions("",
                                   [&calls](const v1::Session&) {
                                     return ++calls == 3 ? absl::AbortedError("enough")
                                                         : absl::OkStatus();
                                   }),
              absl::StatusCode::kAborted);
  EXPECT_EQ(calls, 3);
}

// A [4, 32] tensor of values of a few magnitudes, for NVFP4's blocks of 16.
Tensor Values32(int i) {
  std::vector<double> values(4 * 32);
  for (size_t k = 0; k < values.size(); ++k) {
    values[k] = static_cast<double>((k * 53 + i * 31) % 211) / (3.0 + i % 5) - 20.0;
  }
  return F32({4, 32}, values);
}

v1::CreateSessionRequest Create(const std::string& name, const std::string& dtype,
                                v1::Target target) {
  v1::CreateSessionRequest create;
  create.set_name(name);
  create.set_calculator("global_minmax");
  create.mutable_spec()->set_dtype(dtype);
  create.mutable_spec()->set_target(target);
  return create;
}

// An NVFP4 session of `convention`: a weight in blocks of 16 along its last axis.
v1::CreateSessionRequest Nvfp4Weight(const std::string& name, const std::string& convention) {
  v1::CreateSessionRequest create = Create(name, "float4_e2m1fn_x2", v1::WEIGHT);
  create.mutable_spec()->set_scale_dtype("float8_e4m3fn");
  create.mutable_spec()->set_convention(convention);
  create.mutable_spec()->mutable_granularity()->mutable_per_block()->set_axis(-1);
  create.mutable_spec()->mutable_granularity()->mutable_per_block()->add_block_size(16);
  return create;
}

// Sessions for every export format, spread over the replicas by their names:
// integer weights and activations (mx/int/), uninitialized ones (mx/idle/), and NVFP4
// layers of each convention whose q/k/v weights share a GLOBAL_AMAX scale group
// (mx/ct/, mx/mo/).
void CalibrateForExport(Client& client) {
  for (int i = 0; i < 10; ++i) {
    const std::string weight = absl::StrCat("mx/int/fc", i, ".weight");
    v1::CreateSessionRequest create = Create(weight, "int8", v1::WEIGHT);
    create.mutable_spec()->mutable_granularity()->mutable_per_channel()->set_axis(0);
    ASSERT_OK(client.CreateSession(create).status());
    ASSERT_OK(client.Observe(weight, Values(i).view()).status());
    const std::string input = absl::StrCat("mx/int/fc", i, ".input");
    create = Create(input, "uint8", v1::ACTIVATION);
    create.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
    ASSERT_OK(client.CreateSession(create).status());
    ASSERT_OK(client.Observe(input, Values(i + 40).view()).status());
  }
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(client.CreateSession(Create(absl::StrCat("mx/idle/fc", i, ".weight"), "int8",
                                          v1::WEIGHT))
                  .status());
  }
  int seed = 0;
  for (const char* convention : {"compressed_tensors", "modelopt"}) {
    const std::string prefix = absl::StrCat(
        "mx/", std::string(convention) == "modelopt" ? "mo" : "ct", "/");
    for (int layer = 0; layer < 3; ++layer) {
      const std::string tag = absl::StrCat("{layers.", layer, ".self_attn}");
      v1::ScaleGroup group;
      group.set_name(absl::StrCat(prefix, tag, ".qkv"));
      group.set_share(v1::ScaleGroup::GLOBAL_AMAX);
      for (const char* proj : {"q", "k", "v"}) {
        const std::string name = absl::StrCat(prefix, tag, ".", proj, "_proj.weight");
        ASSERT_OK(client.CreateSession(Nvfp4Weight(name, convention)).status());
        ASSERT_OK(client.Observe(name, Values32(++seed).view()).status());
        group.add_members(name);
      }
      ASSERT_OK(client.CreateScaleGroup(group).status());
      const std::string down = absl::StrCat(prefix, "layers.", layer, ".mlp.down_proj.weight");
      ASSERT_OK(client.CreateSession(Nvfp4Weight(down, convention)).status());
      ASSERT_OK(client.Observe(down, Values32(++seed).view()).status());
    }
  }
}

// The document of an export, or its refusal's code and message.
std::string ExportOf(Client& client, const std::string& prefix, const std::string& format,
                     bool allow_uninitialized = false) {
  v1::ExportSessionsRequest request;
  request.set_prefix(prefix);
  request.set_format(format);
  request.set_allow_uninitialized(allow_uninitialized);
  std::string document;
  const absl::Status status = client.ExportSessions(request, [&](absl::string_view data) {
    document.append(data.data(), data.size());
    return absl::OkStatus();
  });
  return status.ok() ? document : status.ToString();
}

// Through HAProxy, an export is one document of every replica's sessions, byte for
// byte an unsharded server's with the same sessions, and refusals read as its.
TEST_F(ShardedClientTest, ExportsMergeEveryReplicaIntoOneServersBytes) {
  struct Case {
    std::string prefix, format;
    bool allow_uninitialized;
  };
  const std::vector<Case> cases = {
      {"mx/int/", "aimet", false},   {"mx/int/", "onnx", false},
      {"mx/int/", "compressed-tensors", false},
      {"mx/ct/", "compressed-tensors", false}, {"mx/mo/", "modelopt", false},
      {"mx/i", "onnx", true},        // the uninitialized left out
      {"mx/i", "onnx", false},       // uninitialized on every replica, listed once
      {"mx/", "aimet", false},       // the first session AIMET cannot express
      {"mx/int/", "tflite", false},  // no such format
      {"mx/none/", "onnx", false},   // no session
  };
  std::unique_ptr<TestServer> single = TestServer::Start();
  ASSERT_NE(single, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> alone, Client::Connect(single->address()));
  CalibrateForExport(*alone);
  std::vector<std::string> expected;
  for (const Case& c : cases) {
    expected.push_back(ExportOf(*alone, c.prefix, c.format, c.allow_uninitialized));
  }
  for (size_t k = 0; k < 6; ++k) EXPECT_EQ(expected[k].rfind("{\n", 0), 0u) << expected[k];
  EXPECT_TRUE(absl::StrContains(expected[6], "FAILED_PRECONDITION: 5 of the 25 sessions"))
      << expected[6];

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_));
  CalibrateForExport(*client);
  for (const char* prefix : {"mx/int/", "mx/idle/", "mx/ct/", "mx/mo/"}) {
    std::set<std::string> owners;
    ASSERT_OK(client->ReadSessions(prefix, [&](const v1::Session& session) {
      owners.insert(map_->OwnerOfSession(session.name()));
      return absl::OkStatus();
    }));
    EXPECT_GT(owners.size(), 1u) << prefix;  // the document spans replicas
  }
  for (size_t k = 0; k < cases.size(); ++k) {
    EXPECT_EQ(ExportOf(*client, cases[k].prefix, cases[k].format, cases[k].allow_uninitialized),
              expected[k])
        << cases[k].prefix << " " << cases[k].format;
  }
}

// A map taken by some replicas and not yet by others (a move's switch under way)
// could make an export miss a session or hold it twice: the export is ABORTED,
// naming each replica's epoch, until every replica serves the same map.
TEST_F(ShardedClientTest, AnExportWaitsForEveryReplicaToServeOneSlotMap) {
  ClientOptions options;
  options.retry_total = absl::Milliseconds(200);
  options.retry_initial_backoff = absl::Milliseconds(10);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_, options));
  Calibrate(*client);
  const std::string before = ExportOf(*client, "cc/", "onnx");
  ASSERT_EQ(before.rfind("{\n", 0), 0u) << before;

  const std::string next = absl::StrCat("# epoch 1\n", kSlotMap);  // the same owners
  auto give = [&](const char* replica) -> absl::Status {
    ClientOptions pinned;
    pinned.replica = replica;
    pinned.bearer_token = kTestAdminToken;
    absl::StatusOr<std::unique_ptr<Client>> admin = Client::Connect(target_, pinned);
    if (!admin.ok()) return admin.status();
    return (*admin)->SetSlotMap(next).status();
  };
  ASSERT_OK(give("r1"));
  const std::string half = ExportOf(*client, "cc/", "onnx");
  EXPECT_TRUE(absl::StrContains(half, "ABORTED: the replicas serve different slot maps (r0 epoch "
                                      "0, r1 epoch 1, r2 epoch 0)"))
      << half;
  ASSERT_OK(give("r0"));
  ASSERT_OK(give("r2"));
  EXPECT_EQ(ExportOf(*client, "cc/", "onnx"), before);
}

// Groups named with their members' hash tag live on the members' replica, reached
// through HAProxy by the tag in the routing header; listings merge every replica.
TEST_F(ShardedClientTest, ScaleGroupsRouteByTheirHashTagAndListAcrossReplicas) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_));
  std::vector<std::string> groups;
  std::set<std::string> owners;
  for (int t = 0; t < 8; ++t) {
    const std::string tag = absl::StrCat("{t", t, "}");
    v1::ScaleGroup group;
    group.set_name(absl::StrCat(tag, ".g"));
    group.set_share(v1::ScaleGroup::UNION_RANGE);
    for (const char* member : {".a", ".b"}) {
      v1::CreateSessionRequest create;
      create.set_name(absl::StrCat(tag, member));
      ASSERT_OK(client->CreateSession(create).status());
      group.add_members(create.name());
    }
    ASSERT_OK(client->CreateScaleGroup(group).status());
    ASSERT_OK(client->GetScaleGroup(group.name()).status());
    ASSERT_OK_AND_ASSIGN(const v1::GroupQParams result, client->GetGroupQParams(group.name()));
    EXPECT_FALSE(result.initialized());
    groups.push_back(group.name());
    owners.insert(map_->OwnerOfSession(group.name()));
  }
  ASSERT_GT(owners.size(), 1u) << "the tags should spread over the replicas";
  std::sort(groups.begin(), groups.end());

  for (int page_size : {0, 1, 3}) {
    std::vector<std::string> listed;
    std::string token;
    do {
      ASSERT_OK_AND_ASSIGN(const v1::ListScaleGroupsResponse page,
                           client->ListScaleGroups(page_size, token, "{t"));
      ASSERT_LE(page.groups_size(), page_size == 0 ? 50 : page_size);
      for (const v1::ScaleGroup& group : page.groups()) listed.push_back(group.name());
      token = page.next_page_token();
      ASSERT_LE(listed.size(), groups.size());
    } while (!token.empty());
    EXPECT_EQ(listed, groups) << "page_size " << page_size;
  }
  std::vector<std::string> read;
  ASSERT_OK(client->ReadScaleGroups("", 2, [&read](const v1::ScaleGroup& group) {
    read.push_back(group.name());
    return absl::OkStatus();
  }));
  EXPECT_EQ(read, groups);
  for (const std::string& name : groups) EXPECT_OK(client->DeleteScaleGroup(name));
}

// r1 keeps its sessions in a data directory whose file system the test breaks.
// A live client that read the topology before slots moved, HAProxy still routing by
// the old map: a call refused naming the new owner is retried there once; the items
// of ObserveStream and ObserveBatch the old owner refuses go again to the new one,
// answers in item order; the results are bit for bit those of one server. Sessions
// on moved slots are created fresh on the new owner (copying state is a move's job).
TEST_F(ShardedClientTest, ALiveClientFollowsASlotMapChangedUnderIt) {
  std::vector<std::string> moved, kept;
  for (const std::string& name : names_) {
    (map_->OwnerOfSession(name) == "r0" ? moved : kept).push_back(name);
  }
  ASSERT_GE(moved.size(), 3u);
  auto create = [](Client& client, const std::string& name) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator("global_minmax");
    request.mutable_spec()->set_dtype("int8");
    return client.CreateSession(request).status();
  };
  // Every session twice over a stream, then once in a batch.
  auto observe = [this](Client& client) -> absl::Status {
    std::vector<v1::ObserveRequest> requests;
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < names_.size(); ++i) {
        requests.push_back(TensorObservation(names_[i], Values(i + 50 * round).view()));
      }
    }
    absl::StatusOr<std::vector<v1::ObserveResponse>> streamed = client.ObserveStream(requests);
    if (!streamed.ok()) return streamed.status();
    for (size_t k = 0; k < requests.size(); ++k) {
      EXPECT_EQ((*streamed)[k].status().code(), 0) << k << ": " << (*streamed)[k].status().message();
      EXPECT_EQ((*streamed)[k].observation_count(), k < names_.size() ? 1 : 2) << k;
    }
    requests.clear();
    for (size_t i = 0; i < names_.size(); ++i) {
      requests.push_back(TensorObservation(names_[i], Values(i + 100).view()));
    }
    absl::StatusOr<std::vector<v1::ObserveResponse>> batched = client.ObserveBatch(requests);
    if (!batched.ok()) return batched.status();
    for (const v1::ObserveResponse& response : *batched) {
      EXPECT_EQ(response.status().code(), 0) << response.status().message();
      EXPECT_EQ(response.observation_count(), 3);
    }
    return absl::OkStatus();
  };
  std::vector<std::string> expected;
  {
    std::unique_ptr<TestServer> single = TestServer::Start();
    ASSERT_NE(single, nullptr);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> one, Client::Connect(single->address()));
    for (const std::string& name : names_) ASSERT_OK(create(*one, name));
    ASSERT_OK(observe(*one));
    for (const std::string& name : names_) {
      ASSERT_OK_AND_ASSIGN(const v1::GetQParamsResponse q, one->GetQParams(name));
      expected.push_back(q.SerializeAsString());
    }
  }

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> live, Client::Connect(target_));
  for (const std::string& name : kept) ASSERT_OK(create(*live, name));
  ASSERT_OK(live->ListSessions(0, "", "").status());  // reads the topology: epoch 0
  ASSERT_NO_FATAL_FAILURE(GiveEveryReplica(kR0MovedToR1));
  // HAProxy sends r0's old slots to r0, which refuses naming r1: created there.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> unary, Client::Connect(target_));
  for (const std::string& name : moved) ASSERT_OK(create(*unary, name));
  ASSERT_EQ(replicas_[1]->server().engine().session_count(),
            static_cast<int64_t>(moved.size() +
                                 std::count_if(kept.begin(), kept.end(), [&](const std::string& n) {
                                   return map_->OwnerOfSession(n) == "r1";
                                 })));

  // `live` still routes by epoch 0: r0 refuses the moved items, which go to r1.
  ASSERT_OK(observe(*live));
  for (size_t i = 0; i < names_.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(const v1::GetQParamsResponse q, live->GetQParams(names_[i]));
    EXPECT_EQ(q.SerializeAsString(), expected[i]) << names_[i];
  }
  ASSERT_OK_AND_ASSIGN(const v1::Topology now, live->GetTopology());
  EXPECT_EQ(now.epoch(), 1);

  // A client pinned to r0 is not rerouted.
  ClientOptions pinned_options;
  pinned_options.replica = "r0";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> pinned, Client::Connect(target_, pinned_options));
  EXPECT_CODE(pinned->GetQParams(moved[0]).status(), kPrecondition);
}

// With r2 dead, the topology comes from another replica (HAProxy's pool), and the
// listings hold the others' sessions and name r2: unreachable_replicas on every
// merged page, UNAVAILABLE naming it once ReadSessions passed on the others'.
TEST_F(ShardedClientTest, AReplicaDownLeavesTheOthersListedAndNamesIt) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_));
  Calibrate(*client);
  std::vector<std::string> live;
  for (const std::string& name : names_) {
    if (map_->OwnerOfSession(name) != "r2") live.push_back(name);
  }
  std::sort(live.begin(), live.end());
  health_[2].reset();
  replicas_[2].reset();

  for (const bool fresh : {false, true}) {  // a client created before the kill, and after
    std::unique_ptr<Client> after;
    if (fresh) {
      ASSERT_OK_AND_ASSIGN(after, Client::Connect(target_));
    }
    Client& c = fresh ? *after : *client;
    ASSERT_OK_AND_ASSIGN(const v1::Topology topology, c.GetTopology());
    EXPECT_NE(topology.replica_id(), "r2");
    std::vector<std::string> listed;
    std::string token;
    do {
      ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse page, c.ListSessions(0, token, "cc/"));
      EXPECT_EQ(std::vector<std::string>(page.unreachable_replicas().begin(),
                                         page.unreachable_replicas().end()),
                std::vector<std::string>{"r2"});
      for (const v1::Session& session : page.sessions()) listed.push_back(session.name());
      token = page.next_page_token();
    } while (!token.empty());
    EXPECT_EQ(listed, live);
    listed.clear();
    const absl::Status read = c.ReadSessions("cc/", [&listed](const v1::Session& session) {
      listed.push_back(session.name());
      return absl::OkStatus();
    });
    EXPECT_CODE(read, absl::StatusCode::kUnavailable);
    EXPECT_EQ(UnreachableReplicas(read), std::vector<std::string>{"r2"}) << read;
    EXPECT_TRUE(absl::StrContains(read.message(), "replica r2: ")) << read;
    EXPECT_EQ(listed, live);
  }
}

// A move's new owner that cannot be reached right after the switch (r1, put in
// maintenance in HAProxy, which then answers its calls 503 = UNAVAILABLE): the items
// the old owner refuses naming it are kept and retried with their keys, as a failed
// call is, until it is back (the stream's and the batch's caller see no error), or
// until retry_total, after which the caller sees UNAVAILABLE naming r1, never the
// refusal.
TEST_F(ShardedClientTest, ItemsForAnOwnerNotUpYetAreRetriedUntilItIsBack) {
  std::vector<std::string> moved;
  for (const std::string& name : names_) {
    if (map_->OwnerOfSession(name) == "r0") moved.push_back(name);
  }
  ASSERT_GE(moved.size(), 3u);
  ClientOptions quick_options;
  quick_options.retry_total = absl::Milliseconds(300);
  // Clients that read the topology before the switch: one batches, one streams.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> batching, Client::Connect(target_));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> streaming, Client::Connect(target_));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> quick, Client::Connect(target_, quick_options));
  for (Client* client : {batching.get(), streaming.get(), quick.get()}) {
    ASSERT_OK(client->ListSessions(0, "", "").status());  // reads the topology: epoch 0
  }
  ASSERT_NO_FATAL_FAILURE(GiveEveryReplica(kR0MovedToR1));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> creator, Client::Connect(target_));
  for (const std::string& name : moved) {  // on r1, through r0's refusal
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator("global_minmax");
    request.mutable_spec()->set_dtype("int8");
    ASSERT_OK(creator->CreateSession(request).status());
  }
  std::vector<v1::ObserveRequest> requests;
  for (size_t i = 0; i < moved.size(); ++i) {
    requests.push_back(TensorObservation(moved[i], Values(i).view()));
  }
  ASSERT_OK_AND_ASSIGN(const HaproxyRuntime haproxy, HaproxyRuntime::Create(dir_ + "/admin.sock"));
  // HAProxy's count of 5xx answers to clients (show stat, the frontend's row).
  auto answered_5xx = [&haproxy]() -> int64_t {
    absl::StatusOr<std::string> stat = haproxy.Command("show stat");
    if (!stat.ok()) return -1;
    std::vector<std::string> lines = absl::StrSplit(*stat, '\n', absl::SkipEmpty());
    std::vector<std::string> header = absl::StrSplit(absl::StripPrefix(lines[0], "# "), ',');
    const size_t column =
        std::find(header.begin(), header.end(), "hrsp_5xx") - header.begin();
    for (const std::string& line : lines) {
      std::vector<std::string> row = absl::StrSplit(line, ',');
      int64_t count = 0;
      if (row.size() > column && row[0] == "grpc" && row[1] == "FRONTEND" &&
          absl::SimpleAtoi(row[column], &count)) {
        return count;
      }
    }
    return -1;
  };
  ASSERT_OK(haproxy.DisableServer("r1", "r1"));

  // Given up after retry_total: the owner's UNAVAILABLE, not r0's refusal.
  const absl::StatusOr<std::vector<v1::ObserveResponse>> given_up = quick->ObserveBatch(requests);
  EXPECT_CODE(given_up.status(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(given_up.status().message(), "replica r1: "))
      << given_up.status();

  // Retried until r1 is back, once the batch and the stream met it down.
  for (const bool stream : {false, true}) {
    const int64_t before = answered_5xx();
    ASSERT_GE(before, 0);
    absl::StatusOr<std::vector<v1::ObserveResponse>> answered;
    std::thread observing([&] {
      answered = stream ? streaming->ObserveStream(requests) : batching->ObserveBatch(requests);
    });
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (answered_5xx() <= before && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));  // polling HAProxy's counter
    }
    EXPECT_GT(answered_5xx(), before) << "the calls never met r1 down";
    ASSERT_OK(haproxy.SetServer("r1", "r1", "127.0.0.1",
                                std::stoi(replicas_[1]->address().substr(
                                    replicas_[1]->address().rfind(':') + 1))));
    observing.join();
    ASSERT_OK(answered.status());
    for (const v1::ObserveResponse& response : *answered) {
      EXPECT_EQ(response.status().code(), 0) << response.status().message();
      EXPECT_EQ(response.observation_count(), stream ? 2 : 1);
    }
    if (!stream) {
      ASSERT_OK(haproxy.DisableServer("r1", "r1"));
    }
  }
}

// Ranks 0 and 1 of a data-parallel job, each on a thread of its own through its own
// client of `ranks`, take steps [first, first + count) of every session of
// `sessions` with a lag of 0 (each step's reads wait for the other rank): what each
// rank read, step by step and session by session.
std::array<std::vector<std::string>, 2> TakeSteps(const std::array<Client*, 2>& ranks,
                                                  const std::vector<std::string>& sessions,
                                                  int first, int count) {
  std::array<std::vector<std::string>, 2> read;
  std::array<std::thread, 2> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads[rank] = std::thread([&, rank] {
      for (int step = first; step < first + count; ++step) {
        v1::StepRequest request;
        request.set_rank(rank);
        request.set_world_size(2);
        request.mutable_step_timeout()->set_seconds(3600);
        for (size_t i = 0; i < sessions.size(); ++i) {
          *request.add_contributions() =
              TensorContribution(sessions[i], step, Values(i + 7 * rank + 13 * step).view());
          v1::StepRead* r = request.add_reads();
          r->set_name(sessions[i]);
          r->set_step(step);
        }
        absl::StatusOr<v1::StepResponse> answer = ranks[rank]->Step(request);
        ASSERT_OK(answer.status());
        for (const v1::StepContributionResult& c : answer->contributions()) {
          EXPECT_EQ(c.status().code(), 0) << c.status().message();
          EXPECT_FALSE(c.duplicate());
        }
        for (const v1::StepReadResult& r : answer->reads()) {
          EXPECT_EQ(r.status().code(), 0) << r.status().message();
          EXPECT_EQ(r.step(), step);
          read[rank].push_back(r.qparams().SerializeAsString());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return read;
}

// Step over sessions of every replica: each rank's call is split into one call per
// owner, made at once (a replica's reads waiting for the other rank hold back no
// other replica's), and both ranks read the same bits, those of one server. ResumeSteps
// is split the same way. After the slot map changes under clients that read it
// before, the old owner refuses their items naming the new one (RpcStatus.owner), and
// they are sent there.
TEST_F(ShardedClientTest, StepsSplitByOwnerAndFollowAMovedSlot) {
  auto create = [](Client& client, const std::string& name) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator("moving_average");
    request.mutable_spec()->set_target(v1::ACTIVATION);
    return client.CreateSession(request).status();
  };
  std::array<std::vector<std::string>, 2> expected;
  {
    std::unique_ptr<TestServer> single = TestServer::Start();
    ASSERT_NE(single, nullptr);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> rank0, Client::Connect(single->address()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> rank1, Client::Connect(single->address()));
    for (const std::string& name : names_) ASSERT_OK(create(*rank0, name));
    expected = TakeSteps({rank0.get(), rank1.get()}, names_, 0, 2);
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> rank0, Client::Connect(target_));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> rank1, Client::Connect(target_));
  for (const std::string& name : names_) ASSERT_OK(create(*rank0, name));
  const std::array<std::vector<std::string>, 2> read =
      TakeSteps({rank0.get(), rank1.get()}, names_, 0, 2);
  ASSERT_EQ(read[0].size(), 2 * names_.size());
  EXPECT_EQ(read[0], read[1]);
  EXPECT_EQ(read[0], expected[0]);
  std::set<std::string> owners;
  for (const std::string& name : names_) owners.insert(map_->OwnerOfSession(name));
  EXPECT_EQ(owners.size(), kReplicas.size());

  // Every session restarted from an empty checkpoint, whichever replica owns it.
  v1::ResumeStepsRequest resume;
  for (const std::string& name : names_) {
    v1::ResumeItem* item = resume.add_items();
    item->set_name(name);
    item->set_next_step(0);
  }
  ASSERT_OK_AND_ASSIGN(const v1::ResumeStepsResponse resumed, rank0->ResumeSteps(resume));
  ASSERT_EQ(resumed.statuses_size(), static_cast<int>(names_.size()));
  for (size_t i = 0; i < names_.size(); ++i) {
    EXPECT_EQ(resumed.statuses(i).code(), 0) << names_[i] << ": " << resumed.statuses(i).message();
    ASSERT_OK_AND_ASSIGN(const v1::Session session, rank0->GetSession(names_[i]));
    EXPECT_EQ(session.steps().last_applied_step(), -1) << names_[i];
  }

  // A read waiting at one replica holds back no contribution to another: rank 0
  // reads `a` (on r0), which waits for rank 1's contribution to it, which rank 1
  // makes only once its read of `b` (on r1) returned, which waits for rank 0's
  // contribution to `b`, in the same call as rank 0's read.
  std::string a, b;
  for (const std::string& name : names_) {
    if (a.empty() && map_->OwnerOfSession(name) == "r0") a = name;
    if (b.empty() && map_->OwnerOfSession(name) == "r1") b = name;
  }
  auto step0 = [](int rank, std::vector<std::string> contribute, std::vector<std::string> read) {
    v1::StepRequest request;
    request.set_rank(rank);
    request.set_world_size(2);
    for (const std::string& name : contribute) {
      *request.add_contributions() = TensorContribution(name, 0, Values(rank).view());
    }
    for (const std::string& name : read) {
      v1::StepRead* r = request.add_reads();
      r->set_name(name);
      r->set_step(0);
    }
    return request;
  };
  absl::StatusOr<v1::StepResponse> rank0_read;
  std::thread rank0_step([&] {
    rank0_read = rank0->Step(step0(0, {a, b}, {a}), absl::Seconds(10));
  });
  const absl::StatusOr<v1::StepResponse> rank1_read =
      rank1->Step(step0(1, {b}, {b}), absl::Seconds(10));
  EXPECT_OK(rank1->Step(step0(1, {a}, {})).status());  // whatever happened: rank 0 can go on
  rank0_step.join();
  ASSERT_OK(rank1_read.status());
  EXPECT_EQ(rank1_read->reads(0).step(), 0) << rank1_read->reads(0).status().message();
  ASSERT_OK(rank0_read.status());
  EXPECT_EQ(rank0_read->reads(0).step(), 0) << rank0_read->reads(0).status().message();

  // r0's slots go to r1; sessions of those slots made afresh there, through r0's
  // refusals. The ranks' clients still route by the map they read first.
  ASSERT_NO_FATAL_FAILURE(GiveEveryReplica(kR0MovedToR1));
  std::vector<std::string> moved;
  for (int i = 0; moved.size() < 4; ++i) {
    const std::string name = absl::StrCat("cc/moved", i);
    if (map_->OwnerOfSession(name) == "r0") moved.push_back(name);
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> creator, Client::Connect(target_));
  for (const std::string& name : moved) ASSERT_OK(create(*creator, name));
  const int64_t on_r1 = replicas_[1]->server().engine().session_count();
  const std::array<std::vector<std::string>, 2> after =
      TakeSteps({rank0.get(), rank1.get()}, moved, 0, 2);
  ASSERT_EQ(after[0].size(), 2 * moved.size());
  EXPECT_EQ(after[0], after[1]);
  EXPECT_EQ(replicas_[1]->server().engine().session_count(), on_r1);
  for (const std::string& name : moved) {
    ASSERT_OK_AND_ASSIGN(const v1::Session session, creator->GetSession(name));
    EXPECT_EQ(session.steps().last_applied_step(), 1) << name;
  }
  ASSERT_OK_AND_ASSIGN(const v1::Topology now, rank0->GetTopology());
  EXPECT_EQ(now.epoch(), 1);
}

// HAProxy's map changed through its runtime API, no reload: qparams-cli's library
// pushes a map to every replica and then to HAProxy (prepare, add, commit map),
// after which HAProxy routes a moved slot straight to its new owner; a spare backend
// (r3, disabled in haproxy.cfg) is pointed at a new replica and made ready, and
// takes the slots the next map gives it. Checked with plain stubs, which do not
// retry: only HAProxy's routing gets them to the owner.
TEST_F(ShardedClientTest, SlotMapPushChangesHAProxyThroughItsRuntimeApi) {
  const std::string admin = dir_ + "/admin.sock";
  ASSERT_OK_AND_ASSIGN(const HaproxyRuntime haproxy, HaproxyRuntime::Create(admin));
  ASSERT_OK_AND_ASSIGN(const std::vector<std::string> maps, haproxy.ListMaps());
  ASSERT_EQ(maps, std::vector<std::string>{dir_ + "/slots.map"});
  ASSERT_OK_AND_ASSIGN(std::vector<HaproxyRuntime::MapEntry> entries, haproxy.ShowMap(maps[0]));
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].key, "0:84");
  EXPECT_EQ(entries[0].value, "r0");

  // Creates `name` with a stub that sends only the routing header: the code HAProxy's
  // routing earns it.
  auto create = [this](const std::string& name) {
    auto stub = v1::QParamsService::NewStub(
        grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    context.AddMetadata(kSessionHeader, name);
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator("global_minmax");
    v1::Session session;
    return stub->CreateSession(&context, request, &session).error_code();
  };
  auto name_in = [](int low, int high) {
    for (int i = 0;; ++i) {
      std::string name = absl::StrCat("hap/s", i);
      if (SlotOf(name) >= low && SlotOf(name) <= high) return name;
    }
  };

  // Epoch 1: r0's 0:84 go to r1.
  ASSERT_OK_AND_ASSIGN(SlotMap one, SlotMap::Parse("# epoch 1\n0:169 r1\n170:255 r2\n"));
  PushOptions options;
  options.target = target_;
  options.client.bearer_token = kTestAdminToken;
  options.haproxy_admins = {admin};
  ASSERT_OK_AND_ASSIGN(const PushReport pushed, PushSlotMap(one, options));
  ASSERT_OK(pushed.status());
  ASSERT_EQ(pushed.replicas.size(), 3u);  // r0 (no longer named), r1, r2
  EXPECT_EQ(pushed.replicas[0].replica, "r0");
  EXPECT_EQ(pushed.replicas[0].epoch, 1);
  ASSERT_EQ(pushed.haproxies.size(), 1u);
  EXPECT_EQ(pushed.haproxies[0].map, maps[0]);
  ASSERT_OK_AND_ASSIGN(entries, haproxy.ShowMap(maps[0]));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].key, "0:169");
  EXPECT_EQ(entries[0].value, "r1");
  EXPECT_EQ(create(name_in(0, 84)), grpc::StatusCode::OK);  // straight to r1

  // Pushing it again changes nothing; an older map is refused by every replica and
  // HAProxy is left alone.
  ASSERT_OK_AND_ASSIGN(const PushReport again, PushSlotMap(one, options));
  EXPECT_OK(again.status());
  ASSERT_OK_AND_ASSIGN(SlotMap old, SlotMap::Parse(kSlotMap));
  ASSERT_OK_AND_ASSIGN(const PushReport refused, PushSlotMap(old, options));
  EXPECT_CODE(refused.status(), kPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "epoch 0 is older")) << refused.status();
  EXPECT_CODE(refused.haproxies[0].status, kPrecondition);
  ASSERT_OK_AND_ASSIGN(entries, haproxy.ShowMap(maps[0]));
  EXPECT_EQ(entries[0].key, "0:169");

  // A fourth replica r3, owning nothing yet, behind the spare backend r3.
  ServerOptions r3_options;
  r3_options.engine.slot_map = std::make_shared<const SlotMap>(one);
  r3_options.engine.replica_id = "r3";
  r3_options.admin_tokens_file = admin_tokens_file_;
  std::unique_ptr<TestServer> r3 = TestServer::Start(r3_options);
  ASSERT_NE(r3, nullptr);
  QParamsServer* r3_server = &r3->server();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<MetricsHttpServer> r3_health,
                       MetricsHttpServer::Start(HostPort{"127.0.0.1", 0}, &r3_server->metrics(),
                                                {[r3_server] { return r3_server->Readiness(); },
                                                 [r3_server] { return r3_server->Liveness(); }}));
  ASSERT_OK_AND_ASSIGN(SlotMap two, SlotMap::Parse("# epoch 2\n0:169 r1\n170:200 r2\n201:255 r3\n"));
  options.haproxy_servers = {{"r3", "127.0.0.1", r3->server().port(), r3_health->port()}};
  ASSERT_OK_AND_ASSIGN(const PushReport added, PushSlotMap(two, options));
  ASSERT_OK(added.status()) << haproxy.Command("show servers state r3").value_or("?");
  ASSERT_EQ(added.replicas.size(), 4u);  // r0, which answered GetTopology, and r3
  EXPECT_EQ(r3->server().engine().slot_map()->epoch(), 2);
  // HAProxy checks r3 within a second of making it ready (rise 1).
  const std::string on_r3 = name_in(201, 255);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  grpc::StatusCode code;
  while ((code = create(on_r3)) != grpc::StatusCode::OK && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(code, grpc::StatusCode::OK);
  EXPECT_EQ(r3->server().engine().session_count(), 1);

  // What the runtime API refuses is HAProxy's own message.
  EXPECT_CODE(haproxy.ShowMap("/no/such.map").status(), kPrecondition);
  EXPECT_CODE(haproxy.SetServer("r9", "r9", "127.0.0.1", 1), kPrecondition);
  EXPECT_CODE(HaproxyRuntime::Create("").status(), kInvalid);
  EXPECT_CODE(HaproxyRuntime::Create("no-port").status(), kInvalid);
  ASSERT_OK_AND_ASSIGN(const HaproxyRuntime nowhere, HaproxyRuntime::Create(dir_ + "/none.sock"));
  EXPECT_CODE(nowhere.ListMaps().status(), absl::StatusCode::kUnavailable);
  ASSERT_OK(haproxy.DisableServer("r3", "r3"));
  r3_health.reset();
}

class ShardedStorageTest : public ShardedClientTest {
 protected:
  void Customize(size_t r, ServerOptions& options) override {
    if (r != 1) return;
    options.data_dir = dir_ + "/r1";
    options.durability = Durability::kAlways;
    options.env = &env_;
    options.storage_probe_max_age = absl::ZeroDuration();
  }

  // Polls `call` through HAProxy until its code is `code`; false after 10 s (HAProxy
  // checks every second and needs two failures for DOWN, one success for UP).
  static bool Becomes(const std::function<absl::Status()>& call, absl::StatusCode code) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (call().code() != code) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  FaultInjectionEnv env_;  // outlives the replicas, which TearDown stops
};

TEST_F(ShardedStorageTest, HAProxyTakesOutAReplicaWhoseDiskRefusesWritesUntilItTakesThemAgain) {
  std::string name;
  for (const std::string& n : names_) {
    if (map_->OwnerOfSession(n) == "r1") name = n;
  }
  ASSERT_FALSE(name.empty());
  ClientOptions options;
  options.timeout = absl::Seconds(2);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_, options));
  v1::CreateSessionRequest create;
  create.set_name(name);
  create.set_calculator("global_minmax");
  ASSERT_OK(client->CreateSession(create).status());
  auto get = [&] { return client->GetSession(name).status(); };

  // Every write of r1's file system fails from now on: its /healthz turns 503 at the
  // next probe, HAProxy marks it DOWN, and its sessions answer UNAVAILABLE through
  // HAProxy; r1 itself still serves reads to whoever reaches it.
  env_.CrashAfter(0);
  EXPECT_TRUE(Becomes(get, absl::StatusCode::kUnavailable)) << "r1 never went DOWN";
  ClientOptions direct_options;
  direct_options.replica = "r1";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> direct,
                       Client::Connect(replicas_[1]->address(), direct_options));
  EXPECT_OK(direct->GetSession(name).status());
  EXPECT_CODE(replicas_[1]->server().Readiness(), absl::StatusCode::kUnavailable);
  EXPECT_OK(replicas_[1]->server().Liveness()) << "no write was refused: no restart needed";

  // Writes work again: UP at the next good probe, and the session takes observations.
  env_.DropUnsyncedData();
  EXPECT_TRUE(Becomes(get, absl::StatusCode::kOk)) << "r1 never came back UP";
  EXPECT_OK(client->Observe(name, Values(1).view()).status());
}

// The sessions under `prefix` that `stub` lists page after page (`page_size` each),
// the call addressed to `replica` unless it is "", or the call's error.
absl::StatusOr<std::vector<std::string>> ListAll(v1::QParamsService::Stub& stub,
                                                 const std::string& replica, int page_size,
                                                 const std::string& prefix) {
  std::vector<std::string> listed;
  std::string token;
  do {
    grpc::ClientContext context;
    if (!replica.empty()) context.AddMetadata(kReplicaHeader, replica);
    v1::ListSessionsRequest request;
    request.set_page_size(page_size);
    request.set_page_token(token);
    request.set_filter(prefix);
    v1::ListSessionsResponse page;
    const grpc::Status status = stub.ListSessions(&context, request, &page);
    if (!status.ok())
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    EXPECT_LE(page.sessions_size(), page_size);
    EXPECT_EQ(page.unreachable_replicas_size(), 0);
    for (const v1::Session& session : page.sessions()) listed.push_back(session.name());
    token = page.next_page_token();
  } while (!token.empty());
  return listed;
}

// That `got` is `expected`.
void ExpectListed(const absl::StatusOr<std::vector<std::string>>& got,
                  const std::vector<std::string>& expected) {
  ASSERT_OK(got.status());
  EXPECT_EQ(*got, expected);
}

// What ReadSessions of `prefix` streams through `stub` (unaddressed): the names,
// the status and the trailing x-qparams-unreachable ("" without one).
struct ReadOutcome {
  std::vector<std::string> names;
  grpc::Status status;
  std::string unreachable;
};
ReadOutcome ReadAll(v1::QParamsService::Stub& stub, const std::string& prefix) {
  grpc::ClientContext context;
  v1::ReadSessionsRequest request;
  request.set_prefix(prefix);
  std::unique_ptr<grpc::ClientReader<v1::Session>> reader = stub.ReadSessions(&context, request);
  ReadOutcome outcome;
  v1::Session session;
  while (reader->Read(&session)) outcome.names.push_back(session.name());
  outcome.status = reader->Finish();
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto found = trailers.find("x-qparams-unreachable"); found != trailers.end()) {
    outcome.unreachable.assign(found->second.data(), found->second.size());
  }
  return outcome;
}

// The replicas answer a listing or read for every replica themselves
// (server/fan_out.h): a call without a routing header, through HAProxy or straight
// to any replica, gets every replica's sessions in name order, paged with one token
// across replicas; a call addressed to one replica (x-qparams-replica) gets that
// replica's alone. With r2 dead, the others' sessions, and r2 named: in each page's
// unreachable_replicas, and in the trailing x-qparams-unreachable of a read that
// ends UNAVAILABLE after the others' sessions.
TEST_F(ShardedClientTest, AnyReplicaListsEveryReplicaInNameOrder) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(target_));
  Calibrate(*client);
  std::vector<std::string> sorted = names_;
  std::sort(sorted.begin(), sorted.end());
  std::unique_ptr<v1::QParamsService::Stub> through =
      v1::QParamsService::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  for (int page_size : {1, 7, 1000}) {
    ExpectListed(ListAll(*through, "", page_size, "cc/"), sorted);
  }
  for (size_t r = 0; r < kReplicas.size(); ++r) {
    std::unique_ptr<v1::QParamsService::Stub> straight = replicas_[r]->NewStub();
    ExpectListed(ListAll(*straight, "", 4, "cc/"), sorted);
    std::vector<std::string> own;
    for (const std::string& name : sorted) {
      if (map_->OwnerOfSession(name) == kReplicas[r]) own.push_back(name);
    }
    ASSERT_FALSE(own.empty());
    ASSERT_LT(own.size(), sorted.size());
    ExpectListed(ListAll(*straight, kReplicas[r], 4, "cc/"), own);
    const ReadOutcome read = ReadAll(*straight, "cc/");
    EXPECT_TRUE(read.status.ok()) << read.status.error_message();
    EXPECT_EQ(read.names, sorted);
  }

  std::vector<std::string> live;
  for (const std::string& name : sorted) {
    if (map_->OwnerOfSession(name) != "r2") live.push_back(name);
  }
  health_[2].reset();
  replicas_[2].reset();
  std::unique_ptr<v1::QParamsService::Stub> r0 = replicas_[0]->NewStub();
  std::vector<std::string> listed;
  std::string token;
  do {
    grpc::ClientContext context;
    v1::ListSessionsRequest request;
    request.set_page_size(5);
    request.set_page_token(token);
    request.set_filter("cc/");
    v1::ListSessionsResponse page;
    ASSERT_TRUE(r0->ListSessions(&context, request, &page).ok());
    EXPECT_EQ(std::vector<std::string>(page.unreachable_replicas().begin(),
                                       page.unreachable_replicas().end()),
              std::vector<std::string>{"r2"});
    for (const v1::Session& session : page.sessions()) listed.push_back(session.name());
    token = page.next_page_token();
  } while (!token.empty());
  EXPECT_EQ(listed, live);
  const ReadOutcome read = ReadAll(*r0, "cc/");
  EXPECT_EQ(read.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StrContains(read.status.error_message(), "replica r2: "))
      << read.status.error_message();
  EXPECT_EQ(read.unreachable, "r2");
  EXPECT_EQ(read.names, live);
}

// Replicas with --auth_tokens_file: two tenants, alpha and beta.
class ShardedTenantsTest : public ShardedClientTest {
 protected:
  static constexpr char kTokenA[] = "fan-out-token-of-alpha-0123";
  static constexpr char kTokenB[] = "fan-out-token-of-beta-01234";

  void SetUp() override {
    ready_token_ = kTokenA;
    ShardedClientTest::SetUp();
  }
  void Customize(size_t /*r*/, ServerOptions& options) override {
    const std::string tokens = dir_ + "/tokens";
    if (!std::filesystem::exists(tokens)) {
      std::ofstream(tokens) << kTokenA << " alpha\n" << kTokenB << " beta\n";
    }
    options.auth_tokens_file = tokens;
  }
  std::unique_ptr<Client> Tenant(const char* token) {
    ClientOptions options;
    options.bearer_token = token;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target_, options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }
};

// A replica fanning out forwards its caller's authorization: every replica lists,
// reads and exports the caller's tenant only; a call without a valid token is
// refused before any replica is asked.
TEST_F(ShardedTenantsTest, FannedOutCallsSeeOnlyTheCallersTenant) {
  std::unique_ptr<Client> alpha = Tenant(kTokenA), beta = Tenant(kTokenB);
  ASSERT_NE(alpha, nullptr);
  ASSERT_NE(beta, nullptr);
  Calibrate(*alpha);
  std::vector<std::string> alphas = names_, betas;
  std::sort(alphas.begin(), alphas.end());
  std::set<std::string> owners;
  for (int i = 0; i < 12; ++i) {
    const std::string name = absl::StrCat("cc/beta", i);
    ASSERT_OK(beta->CreateSession(Create(name, "int8", v1::WEIGHT)).status());
    ASSERT_OK(beta->Observe(name, Values(i).view()).status());
    betas.push_back(name);
    owners.insert(map_->OwnerOfSession(name));
  }
  ASSERT_GT(owners.size(), 1u);
  std::sort(betas.begin(), betas.end());

  for (auto [client, expected] : {std::pair{alpha.get(), &alphas}, std::pair{beta.get(), &betas}}) {
    std::vector<std::string> listed;
    std::string token;
    do {
      ASSERT_OK_AND_ASSIGN(const v1::ListSessionsResponse page,
                           client->ListSessions(5, token, "cc/"));
      for (const v1::Session& session : page.sessions()) listed.push_back(session.name());
      token = page.next_page_token();
    } while (!token.empty());
    EXPECT_EQ(listed, *expected);
    std::vector<std::string> read;
    ASSERT_OK(client->ReadSessions("cc/", [&read](const v1::Session& session) {
      read.push_back(session.name());
      return absl::OkStatus();
    }));
    EXPECT_EQ(read, *expected);
  }
  const std::string document = ExportOf(*beta, "cc/", "onnx");
  for (const std::string& name : betas) {  // named under the prefix
    EXPECT_TRUE(absl::StrContains(document, absl::StrCat("\"", name.substr(3), "\"")))
        << name << "\n" << document;
  }
  EXPECT_FALSE(absl::StrContains(document, "layer")) << document;
  EXPECT_TRUE(absl::StrContains(ExportOf(*beta, "cc/layer", "onnx"), "NOT_FOUND"));

  std::unique_ptr<v1::QParamsService::Stub> anonymous =
      v1::QParamsService::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  EXPECT_CODE(ListAll(*anonymous, "", 10, "cc/").status(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ReadAll(*anonymous, "cc/").status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  std::unique_ptr<Client> stranger = Tenant("not-a-token-of-anyone-0123");
  EXPECT_CODE(stranger->ListSessions(0, "", "").status(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace qparams::testing

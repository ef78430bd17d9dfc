// Durable sessions: a restart restores every session bit for bit (and later
// observations continue exactly as without the restart), torn or corrupt journal
// tails are set aside, compaction bounds the data directory, a directory serves one
// server at a time, and idle sessions are evicted with a NOT_FOUND that says so.

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "core/histogram.h"
#include "core/range.h"
#include "core/registry.h"
#include "domain/recovery.h"
#include "domain/scale_group_store.h"
#include "domain/session_store.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "qparams/client.h"
#include "storage/env.h"
#include "storage/session_codec.h"
#include "storage/session_log.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string JournalFile(const std::string& dir) {
  for (const std::string& name : Files(dir)) {
    if (absl::StartsWith(name, "journal-") && !absl::EndsWith(name, ".corrupt")) {
      return dir + "/" + name;
    }
  }
  return "";
}

int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

class PersistenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/qparams-persistence-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    server_.reset();
    for (const std::string& name : Files(dir_)) unlink((dir_ + "/" + name).c_str());
    rmdir(dir_.c_str());
  }

  ServerOptions Options(Durability durability = Durability::kAlways) {
    ServerOptions options;
    options.data_dir = dir_;
    options.durability = durability;
    return options;
  }

  // (Re)starts the server on the data directory and connects a client.
  void Start(ServerOptions options) {
    client_.reset();
    server_.reset();
    server_ = TestServer::Start(options);
    ASSERT_NE(server_, nullptr);
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(server_->address()));
  }

  // Every session with every field (times included), as bytes.
  std::string Everything() {
    absl::StatusOr<v1::ListSessionsResponse> all = client_->ListSessions(1000, "", "");
    return all.ok() ? all->SerializeAsString() : all.status().ToString();
  }

  absl::StatusOr<v1::Session> Create(const std::string& name, const std::string& calculator,
                                     v1::QuantSpec spec) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator(calculator);
    *request.mutable_spec() = spec;
    return client_->CreateSession(request);
  }

  // Sessions of every kind in varied states, plus a deleted one.
  void Populate();

  std::string dir_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

// Sessions of every kind in varied states, plus a deleted one.
void PersistenceTest::Populate() {
  Client& client = *client_;
  v1::QuantSpec per_channel;
  per_channel.set_qscheme(v1::ASYMMETRIC);
  per_channel.mutable_granularity()->mutable_per_channel()->set_axis(1);
  v1::QuantSpec bf16_block;
  bf16_block.set_dtype("int4");
  bf16_block.mutable_granularity()->mutable_per_block()->set_axis(1);
  bf16_block.mutable_granularity()->mutable_per_block()->add_block_size(2);
  v1::QuantSpec frozen;
  frozen.mutable_float_range()->set_min(-1.5);
  frozen.mutable_float_range()->set_max(2.25);
  v1::QuantSpec fp8;
  fp8.set_dtype("float8_e4m3fn");
  // The e8m0 path ignores the quant range: its zero point 0 lies outside this one.
  v1::QuantSpec e8m0;
  e8m0.set_scale_dtype("float8_e8m0fnu");
  e8m0.set_quant_min(4);
  e8m0.set_quant_max(84);

  ASSERT_OK(Create("ma", "moving_average", per_channel));
  ASSERT_OK(Create("gm", "global_minmax", bf16_block));
  ASSERT_OK(Create("st", "static", fp8));
  ASSERT_OK(Create("frozen", "moving_average", frozen));
  ASSERT_OK(Create("e8m0", "moving_average", e8m0));
  ASSERT_OK(Create("empty", "static", {}));
  ASSERT_OK(Create("gone", "static", {}));
  for (uint32_t i = 0; i < 5; ++i) {
    ASSERT_OK(client.Observe("ma", F32({3, 4}, RandN(12, i, 2)).view()));
    ASSERT_OK(client.Observe("gm", MakeTensor(DType::kBFloat16, {2, 4}, RandN(8, 10 + i)).view()));
    ASSERT_OK(client.Observe("st", MakeTensor(DType::kFloat64, {5}, RandN(5, 20 + i)).view()));
    ASSERT_OK(client.Observe("frozen", Vec(RandN(4, 30 + i)).view()));
    ASSERT_OK(client.Observe("e8m0", Vec(RandN(4, 40 + i)).view()));
  }
  ASSERT_OK(client.SetExportMode("st", true));
  v1::Granularity g;
  g.mutable_per_channel()->set_axis(0);
  ASSERT_OK(client.SetGranularity("empty", g));
  ASSERT_OK(client.DeleteSession("gone"));
}


// The same further steps on any server; their responses, as bytes.
std::string Continue(Client& client) {
  std::string out;
  for (uint32_t i = 0; i < 3; ++i) {
    for (auto [name, tensor] :
         {std::pair{"ma", F32({3, 4}, RandN(12, 100 + i, 3))},
          std::pair{"gm", MakeTensor(DType::kBFloat16, {2, 4}, RandN(8, 110 + i))},
          std::pair{"st", MakeTensor(DType::kFloat64, {5}, RandN(5, 120 + i))},
          std::pair{"frozen", Vec(RandN(4, 130 + i))},
          std::pair{"e8m0", Vec(RandN(4, 150 + i))},
          std::pair{"empty", F32({2, 3}, RandN(6, 140 + i))}}) {
      absl::StatusOr<v1::ObserveResponse> r = client.Observe(name, tensor.view());
      out += r.ok() ? r->SerializeAsString() : r.status().ToString();
    }
  }
  absl::StatusOr<v1::ListSessionsResponse> all = client.ListSessions(1000, "", "");
  for (const v1::Session& s : all->sessions()) {
    v1::Session copy = s;
    copy.clear_update_time();  // moves with the clock
    copy.clear_create_time();
    out += copy.SerializeAsString();
  }
  return out;
}

TEST_F(PersistenceTest, RestartRestoresEverySessionBitForBit) {
  for (Durability durability : {Durability::kAlways, Durability::kBatched}) {
    SCOPED_TRACE(std::string(DurabilityName(durability)));
    TearDown();
    SetUp();
    Start(Options(durability));
    Populate();
    const std::string before = Everything();
    ASSERT_TRUE(absl::StrContains(before, "frozen"));

    Start(Options(durability));  // the previous server shuts down first
    EXPECT_EQ(Everything(), before);
    EXPECT_CODE(client_->GetSession("gone"), absl::StatusCode::kNotFound);
    const std::string restarted = Continue(*client_);

    // A server that never restarted gives the same results.
    Start(Options(Durability::kNone));
    Populate();
    EXPECT_EQ(Continue(*client_), restarted);
  }
}

// NVFP4 sessions (nvfp4.md §2, §3): both conventions, the three stateful kinds,
// float32, bfloat16 and float16 precisions, single-axis and tuple blocks, tensors and
// block ranges, one session in export mode and one never observed.
v1::QuantSpec Nvfp4Spec(const std::string& convention, v1::Granularity granularity) {
  v1::QuantSpec spec;
  spec.set_dtype("float4_e2m1fn_x2");
  spec.set_scale_dtype("float8_e4m3fn");
  spec.set_convention(convention);
  *spec.mutable_granularity() = std::move(granularity);
  return spec;
}
v1::Granularity PerBlock16() {
  v1::Granularity g;
  g.mutable_per_block()->set_axis(-1);
  g.mutable_per_block()->add_block_size(16);
  return g;
}
v1::Granularity PerBlockTuple16() {  // the activations' form: one block per 16 channels
  v1::Granularity g;
  g.mutable_per_block()->add_block_size(-1);
  g.mutable_per_block()->add_block_size(16);
  return g;
}

const std::vector<std::string>& Nvfp4Names() {
  static const auto* names = new std::vector<std::string>{
      "nv/ct-ma", "nv/mo-ma", "nv/ct-gm", "nv/mo-gm", "nv/ct-st", "nv/mo-st", "nv/empty"};
  return *names;
}

// The input of session `name` at step `i`: values scaled so that some blocks are
// small, zero or huge next to the others (the floors and underflows of §3.2, §3.3).
Tensor Nvfp4Input(const std::string& name, uint32_t i) {
  const uint32_t seed = 300 + 10 * static_cast<uint32_t>(name.size()) + i;
  std::vector<double> values = RandN(64, seed, 1 + i);
  for (size_t k = 16; k < 32; ++k) values[k] *= 1e-9;  // block 1 underflows e4m3
  for (size_t k = 48; k < 64; ++k) values[k] = 0;      // block 3 is zero
  if (absl::StrContains(name, "-gm")) {
    return MakeTensor(DType::kBFloat16, {2, 32}, values);
  }
  if (absl::StrContains(name, "-st")) return MakeTensor(DType::kFloat16, {4, 16}, values);
  return F32({2, 32}, values);
}

void PopulateNvfp4(Client& client) {
  auto create = [&](const std::string& name, const std::string& calculator,
                    const v1::QuantSpec& spec, std::optional<double> averaging_constant) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator(calculator);
    *request.mutable_spec() = spec;
    if (averaging_constant) request.set_averaging_constant(*averaging_constant);
    return client.CreateSession(request);
  };
  ASSERT_OK(create("nv/ct-ma", "moving_average", Nvfp4Spec("", PerBlockTuple16()), 0.25));
  ASSERT_OK(create("nv/mo-ma", "moving_average", Nvfp4Spec("modelopt", PerBlockTuple16()), 0.25));
  ASSERT_OK(create("nv/ct-gm", "global_minmax", Nvfp4Spec("compressed_tensors", PerBlock16()),
                   std::nullopt));
  ASSERT_OK(create("nv/mo-gm", "global_minmax", Nvfp4Spec("modelopt", PerBlock16()), std::nullopt));
  ASSERT_OK(create("nv/ct-st", "static", Nvfp4Spec("", PerBlock16()), std::nullopt));
  ASSERT_OK(create("nv/mo-st", "static", Nvfp4Spec("modelopt", PerBlock16()), std::nullopt));
  ASSERT_OK(create("nv/empty", "global_minmax", Nvfp4Spec("modelopt", PerBlock16()), std::nullopt));
  for (uint32_t i = 0; i < 4; ++i) {
    for (const std::string& name : Nvfp4Names()) {
      if (name == "nv/empty") continue;
      const Tensor input = Nvfp4Input(name, i);
      if (name == "nv/mo-gm" && i % 2 == 1) {  // block ranges reduced here, as a client does
        ASSERT_OK_AND_ASSIGN(BlockRange range, ObserveRange(input.view(), {1, 16}));
        v1::ObserveRequest request;
        request.set_name(name);
        request.mutable_range()->mutable_input_shape()->Assign(input.shape.begin(),
                                                               input.shape.end());
        *request.mutable_range()->mutable_min() = wire::TensorToProto(range.min.view());
        *request.mutable_range()->mutable_max() = wire::TensorToProto(range.max.view());
        ASSERT_OK_AND_ASSIGN(std::vector<v1::ObserveResponse> responses,
                             client.ObserveBatch({request}));
        ASSERT_EQ(responses[0].status().code(), 0) << responses[0].status().message();
        continue;
      }
      ASSERT_OK(client.Observe(name, input.view()));
    }
  }
  ASSERT_OK(client.SetExportMode("nv/ct-st", true));
}

// Every NVFP4 session's readable parts (session and qparams), as bytes.
std::string Nvfp4State(Client& client) {
  std::string out;
  for (const std::string& name : Nvfp4Names()) {
    absl::StatusOr<v1::Session> session = client.GetSession(name);
    absl::StatusOr<v1::GetQParamsResponse> qparams = client.GetQParams(name);
    if (!session.ok() || !qparams.ok()) return absl::StrCat(name, " (unreadable)");
    out += session->SerializeAsString() + qparams->SerializeAsString();
  }
  return out;
}

// Further observations of every NVFP4 session, and their qparams, as bytes.
std::string ContinueNvfp4(Client& client) {
  std::string out;
  for (uint32_t i = 10; i < 13; ++i) {
    for (const std::string& name : Nvfp4Names()) {
      absl::StatusOr<v1::ObserveResponse> r = client.Observe(name, Nvfp4Input(name, i).view());
      out += r.ok() ? r->qparams().SerializeAsString() : r.status().ToString();
    }
  }
  return out;
}

TEST_F(PersistenceTest, Nvfp4SessionsRestoreBitForBitFromTheJournalAndASnapshot) {
  for (Durability durability : {Durability::kAlways, Durability::kBatched}) {
    SCOPED_TRACE(std::string(DurabilityName(durability)));
    TearDown();
    SetUp();
    ServerOptions options = Options(durability);
    Start(options);
    PopulateNvfp4(*client_);
    const std::string before = Everything();
    const std::string state = Nvfp4State(*client_);
    ASSERT_OK_AND_ASSIGN(v1::Session mo, client_->GetSession("nv/mo-gm"));
    ASSERT_EQ(mo.spec().convention(), "modelopt");
    ASSERT_TRUE(mo.qparams().has_global_scale());
    ASSERT_EQ(mo.qparams().scale_e4m3().size(), 4u);
    ASSERT_OK_AND_ASSIGN(v1::Session ct, client_->GetSession("nv/ct-ma"));
    ASSERT_EQ(ct.spec().convention(), "compressed_tensors");
    ASSERT_TRUE(ct.qparams().has_amax());

    // The journal replayed.
    Start(options);
    EXPECT_EQ(Everything(), before);
    EXPECT_EQ(Nvfp4State(*client_), state);

    // A restart that compacts writes the recovered sessions as a snapshot; the next
    // one reads them from it (the journal after it holds nothing).
    ServerOptions compacting = options;
    compacting.compact_min_bytes = 1;
    Start(compacting);
    EXPECT_EQ(Everything(), before);
    Start(options);
    const std::vector<std::string> files = Files(dir_);
    EXPECT_TRUE(std::any_of(files.begin(), files.end(), [](const std::string& name) {
      return absl::StartsWith(name, "snapshot-");
    })) << absl::StrJoin(files, ", ");
    EXPECT_EQ(FileSize(JournalFile(dir_)), 8);  // the magic alone
    EXPECT_EQ(Everything(), before);
    EXPECT_EQ(Nvfp4State(*client_), state);
    const std::string restarted = ContinueNvfp4(*client_);

    // A server that never restarted gives the same results.
    Start(Options(Durability::kNone));
    PopulateNvfp4(*client_);
    EXPECT_EQ(ContinueNvfp4(*client_), restarted);
  }
}

// ---- Scale groups ----

// The scale groups of `server` as bytes (ScaleGroupState), with the answers for the
// group names "deleted" and `absent` too.
std::string GroupState(const TestServer& server, const std::string& absent = "deleted") {
  return ScaleGroupState(*server.NewStub(), {"deleted", absent});
}

absl::Status CreateGroup(const TestServer& server, const v1::ScaleGroup& group) {
  return FromGrpc(CreateScaleGroup(*server.NewStub(), group));
}

absl::Status DeleteGroup(const TestServer& server, const std::string& name) {
  return FromGrpc(DeleteScaleGroup(*server.NewStub(), name));
}

// NVFP4 members of GLOBAL_AMAX groups (in an order that is not the names', one
// filling its uncalibrated member), integer members of a UNION_RANGE group, a group
// whose member was deleted, and a group deleted.
void PopulateGroups(Client& client, const TestServer& server) {
  auto create = [&](const std::string& name, const std::string& calculator,
                    const v1::QuantSpec& spec) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator(calculator);
    *request.mutable_spec() = spec;
    return client.CreateSession(request);
  };
  const v1::QuantSpec nvfp4 = Nvfp4Spec("modelopt", PerBlock16());
  for (const char* name : {"{l0}.q", "{l0}.k", "{l0}.v", "{l0}.o"}) {
    ASSERT_OK(create(name, "global_minmax", nvfp4));
  }
  v1::QuantSpec int8;
  int8.set_qscheme(v1::ASYMMETRIC);
  for (const char* name : {"u/a", "u/b", "u/c"}) ASSERT_OK(create(name, "moving_average", int8));
  for (uint32_t i = 0; i < 3; ++i) {
    for (const char* name : {"{l0}.q", "{l0}.k", "{l0}.v"}) {
      ASSERT_OK(client.Observe(name, Nvfp4Input(name, i).view()));
    }
    ASSERT_OK(client.Observe("u/a", Vec(RandN(16, 500 + i, 2)).view()));
    ASSERT_OK(client.Observe("u/b", Vec(RandN(16, 510 + i, 5)).view()));
    ASSERT_OK(client.Observe("u/c", Vec(RandN(16, 520 + i)).view()));
  }
  ASSERT_OK(CreateGroup(server, ScaleGroupOf("{l0}.qkv", {"{l0}.v", "{l0}.q", "{l0}.k"},
                                             v1::ScaleGroup::GLOBAL_AMAX)));
  ASSERT_OK(
      CreateGroup(server, ScaleGroupOf("{l0}.qo", {"{l0}.q", "{l0}.o"}, v1::ScaleGroup::GLOBAL_AMAX,
                                       /*fill_uncalibrated=*/true)));
  ASSERT_OK(CreateGroup(server, ScaleGroupOf("u", {"u/b", "u/a"}, v1::ScaleGroup::UNION_RANGE)));
  ASSERT_OK(CreateGroup(server, ScaleGroupOf("u-c", {"u/a", "u/c"}, v1::ScaleGroup::UNION_RANGE)));
  ASSERT_OK(CreateGroup(server, ScaleGroupOf("deleted", {"u/a"}, v1::ScaleGroup::UNION_RANGE)));
  ASSERT_OK(DeleteGroup(server, "deleted"));
  ASSERT_OK(client.DeleteSession("u/c"));
}

TEST_F(PersistenceTest, ScaleGroupsRestoreBitForBitFromTheJournalAndASnapshot) {
  for (Durability durability : {Durability::kAlways, Durability::kBatched}) {
    SCOPED_TRACE(std::string(DurabilityName(durability)));
    TearDown();
    SetUp();
    ServerOptions options = Options(durability);
    Start(options);
    PopulateGroups(*client_, *server_);
    const std::string sessions = Everything();
    const std::string groups = GroupState(*server_);
    ASSERT_TRUE(absl::StrContains(groups, "{l0}.qkv"));
    ASSERT_TRUE(absl::StrContains(groups, "member \"u/c\" of scale group \"u-c\""));
    ASSERT_TRUE(absl::StrContains(groups, "scale group \"deleted\" does not exist"));

    // The journal replayed.
    Start(options);
    EXPECT_EQ(GroupState(*server_), groups);
    EXPECT_EQ(Everything(), sessions);

    // A restart that compacts writes the groups into the snapshot; the next one
    // reads them from it (the journal after it holds nothing).
    ServerOptions compacting = options;
    compacting.compact_min_bytes = 1;
    Start(compacting);
    EXPECT_EQ(GroupState(*server_), groups);
    Start(options);
    const std::vector<std::string> files = Files(dir_);
    EXPECT_TRUE(std::any_of(files.begin(), files.end(), [](const std::string& name) {
      return absl::StartsWith(name, "snapshot-");
    })) << absl::StrJoin(files, ", ");
    EXPECT_EQ(FileSize(JournalFile(dir_)), 8);  // the magic alone
    EXPECT_EQ(GroupState(*server_), groups);
    EXPECT_EQ(Everything(), sessions);

    // A deletion after the snapshot survives too, and the name can be taken again.
    ASSERT_OK(DeleteGroup(*server_, "u"));
    const std::string fewer = GroupState(*server_, "u");
    Start(options);
    EXPECT_EQ(GroupState(*server_, "u"), fewer);
    EXPECT_OK(CreateGroup(*server_, ScaleGroupOf("u", {"u/a"}, v1::ScaleGroup::UNION_RANGE)));
  }
}

// Through the engine: tenants keep their own groups of one name, a group whose
// members are gone (deleted, or evicted) is restored and refused naming them, and
// the records of an engine restore into the same engine.
TEST_F(PersistenceTest, ScaleGroupsKeepTheirTenantsAndOutliveTheirMembers) {
  EngineOptions options;
  options.journal.data_dir = dir_;
  options.journal.durability = Durability::kAlways;
  options.session_ttl = absl::Hours(1);
  auto state = [](const Engine& engine) {
    std::string out;
    for (const char* tenant : {"", "team-a"}) {
      absl::StatusOr<ScaleGroupPage> page = engine.ListScaleGroups(tenant, 0, "", "");
      if (!page.ok()) return page.status().ToString();
      for (const ScaleGroupInfo& g : page->groups) {
        out += absl::StrCat(tenant, "|", g.name, "|", absl::StrJoin(g.members, ","), "|",
                            GroupShareName(g.share), "|", g.fill_uncalibrated, "|",
                            absl::FormatTime(g.create_time), "\n");
        absl::StatusOr<GroupResult> r = engine.GetGroupQParams(tenant, g.name);
        out += r.ok() ? absl::StrFormat("initialized %d min %a max %a scale %a zero_point %d\n",
                                        r->initialized, r->min, r->max, r->qparams.scale.at(0),
                                        r->qparams.zero_point.at(0))
                      : r.status().ToString() + "\n";
      }
    }
    return out;
  };
  std::string before;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(options));
    QuantSpec spec;
    spec.qscheme = QScheme::kAsymmetric;
    for (const char* tenant : {"", "team-a"}) {
      for (const char* name : {"a", "b"}) {
        ASSERT_OK(engine->CreateSession(tenant, name, "global_minmax", spec, {}));
        const std::vector<double> x = RandN(8, tenant[0] == 0 ? 1 : 2, name[0] == 'a' ? 1 : 4);
        ASSERT_OK(engine->Observe(tenant, name, Observation::FromTensor(Vec(x).view())).status);
      }
    }
    ASSERT_OK(engine->CreateScaleGroup("", {"g", {"b", "a"}, GroupShare::kUnionRange, false}));
    ASSERT_OK(engine->CreateScaleGroup("", {"h", {"a"}, GroupShare::kUnionRange, false}));
    ASSERT_OK(engine->CreateScaleGroup("team-a", {"g", {"a", "b"}, GroupShare::kUnionRange, true}));
    ASSERT_OK(engine->DeleteSession("", "a"));  // touches no group
    before = state(*engine);
    EXPECT_TRUE(absl::StrContains(before, "member \"a\" of scale group \"g\"")) << before;
    EXPECT_TRUE(absl::StrContains(before, "team-a|g|a,b|union_range|1|")) << before;
    EXPECT_TRUE(absl::StrContains(before, "initialized 1")) << before;
  }
  std::string evicted;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(options));
    EXPECT_EQ(engine->scale_group_count(), 3);
    EXPECT_EQ(state(*engine), before);
    Engine again;
    EXPECT_TRUE(EngineRecords::Restore(again, EngineRecords::Of(*engine)).empty());
    EXPECT_EQ(state(again), before);
    // Two hours on every session is idle: evicted, and the groups stay.
    EXPECT_EQ(engine->EvictIdle(absl::Now() + absl::Hours(2)), 3);
    EXPECT_EQ(engine->scale_group_count(), 3);
    evicted = state(*engine);
    EXPECT_TRUE(absl::StrContains(evicted, "member \"b\" of scale group \"g\"")) << evicted;
    EXPECT_FALSE(absl::StrContains(evicted, "initialized")) << evicted;
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(options));
  EXPECT_EQ(engine->session_count(), 0);
  EXPECT_EQ(state(*engine), evicted);
}

// An Env that runs `on_read` as each file is opened for reading (a restore's).
class ReadWatchEnv final : public Env {
 public:
  explicit ReadWatchEnv(std::function<void()> on_read) : on_read_(std::move(on_read)) {}
  absl::Status CreateDir(const std::string& dir) override { return base_->CreateDir(dir); }
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    return base_->LockFile(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    on_read_();
    return base_->NewSequentialFile(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return base_->NewWritableFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    return base_->RenameFile(from, to);
  }
  absl::Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }
  absl::Status SyncDir(const std::string& dir) override { return base_->SyncDir(dir); }

 private:
  Env* const base_ = Env::Posix();
  const std::function<void()> on_read_;
};

// Idle eviction starts once Open has restored everything (and not while it reads
// the directory): a --session_ttl shorter than a restore evicts nothing it brings
// back. The evictor's clock tells when it first runs; no file is read after that.
TEST_F(PersistenceTest, IdleEvictionStartsAfterTheRestore) {
  EngineOptions options;
  options.journal.data_dir = dir_;
  options.journal.durability = Durability::kAlways;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(options));
    QuantSpec spec;
    for (int i = 0; i < 20; ++i) {
      ASSERT_OK(engine->CreateSession("", absl::StrCat("s", i), "static", spec, {}));
    }
  }
  std::atomic<int> clock_reads{0}, file_reads{0};
  absl::Notification evictor_ran;
  ReadWatchEnv env([&] {
    EXPECT_EQ(clock_reads.load(), 0) << "idle eviction ran during the restore";
    ++file_reads;
  });
  options.journal.env = &env;
  // So short that the evictor does not wait between rounds (a tenth of it rounds to
  // zero): started too early, it would read the clock before the restore's reads.
  options.session_ttl = absl::Nanoseconds(1);
  options.eviction_clock = [&] {
    if (clock_reads++ == 0) evictor_ran.Notify();
    return absl::InfinitePast();  // nothing is idle: the sessions stay to be counted
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(options));
  EXPECT_GT(file_reads.load(), 0);
  EXPECT_EQ(engine->session_count(), 20);
  evictor_ran.WaitForNotification();
  EXPECT_EQ(engine->session_count(), 20);
  ASSERT_OK(engine->Close());
}

// A snapshot's group records come in batches: every group of every tenant, once, in
// key order, and they restore into the same groups.
TEST(ScaleGroupStoreRecords, EveryGroupIsEmittedOnceInKeyOrder) {
  NullSessionLog log;
  ScaleGroupStore store(/*max_groups=*/2000, log);
  const absl::Time t0 = absl::FromUnixSeconds(1'700'000'000);
  for (const char* tenant : {"", "t"}) {
    for (int i = 0; i < 700; ++i) {
      ASSERT_OK(store.Create(tenant, {absl::StrFormat("g%04d", i),
                                      {"a", "b"},
                                      GroupShare::kUnionRange,
                                      i % 2 == 0,
                                      t0 + absl::Seconds(i)}));
    }
  }
  std::vector<std::string> keys;
  ScaleGroupStore again(2000, log);
  ASSERT_OK(store.EmitRecords([&](const storage::v1::Record& record) {
    keys.push_back(absl::StrCat(record.group_create().key().tenant(), "/",
                                record.group_create().key().name()));
    EXPECT_EQ(again.Replay(record), std::nullopt);
    return absl::OkStatus();
  }));
  ASSERT_EQ(keys.size(), 1400u);
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  EXPECT_EQ(std::adjacent_find(keys.begin(), keys.end()), keys.end());
  for (const char* tenant : {"", "t"}) {
    ScaleGroupStore::Page a = store.List(tenant, "", "", 1000);
    ScaleGroupStore::Page b = again.List(tenant, "", "", 1000);
    ASSERT_EQ(a.groups.size(), b.groups.size());
    for (size_t i = 0; i < a.groups.size(); ++i) {
      EXPECT_EQ(a.groups[i].name, b.groups[i].name);
      EXPECT_EQ(a.groups[i].members, b.groups[i].members);
      EXPECT_EQ(a.groups[i].fill_uncalibrated, b.groups[i].fill_uncalibrated);
      EXPECT_EQ(a.groups[i].create_time, b.groups[i].create_time);
    }
  }
  // A record that does not restore (an invalid member) is set aside, naming it.
  storage::v1::Record bad =
      EncodeGroupCreate("", {"bad", {"a", "a"}, GroupShare::kUnionRange, false, t0});
  std::optional<std::string> problem = again.Replay(bad);
  ASSERT_TRUE(problem.has_value());
  EXPECT_TRUE(absl::StrContains(*problem, "\"a\" twice")) << *problem;
  EXPECT_CODE(again.Find("", "bad"), absl::StatusCode::kNotFound);
}

// A data directory written before groups were journaled (session records only)
// opens as before, with no group, and takes groups from then on.
TEST_F(PersistenceTest, ADirectoryWithoutGroupRecordsOpensAndTakesGroups) {
  QuantSpec spec;
  spec.qscheme = QScheme::kAsymmetric;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StatefulQParamsCalculatorBase> calculator,
                       QParamsCalculatorRegistry::Global().CreateStateful("moving_average", spec));
  ASSERT_OK(calculator->Forward(Observation::FromTensor(Vec(RandN(8, 3)).view())).status());
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  {
    JournalOptions options;
    options.data_dir = dir_;
    options.durability = Durability::kAlways;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Journal> journal, Journal::Open(options));
    ASSERT_OK(journal->Recover([](const storage::v1::Record&) {}).status());
    ASSERT_OK(journal->Start([](const Journal::Emitter&) { return absl::OkStatus(); }));
    for (const char* name : {"old", "older"}) {
      ASSERT_OK_AND_ASSIGN(uint64_t sequence,
                           journal->AppendPut({"", name}, calculator->ExportState(), t0, t0, {},
                                              std::nullopt));
      ASSERT_OK(journal->Sync(sequence));
    }
  }
  Start(Options());
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse all, client_->ListSessions(0, "", ""));
  EXPECT_EQ(all.sessions_size(), 2);
  EXPECT_EQ(server_->server().engine().scale_group_count(), 0);
  ASSERT_OK(
      CreateGroup(*server_, ScaleGroupOf("g", {"older", "old"}, v1::ScaleGroup::UNION_RANGE)));
  const std::string groups = GroupState(*server_);
  Start(Options());
  EXPECT_EQ(GroupState(*server_), groups);
}

// Histogram sessions of the three kinds, fed by tensors (NaN included under
// nonfinite=ignore), client-side histograms and observations that ran no search.
void PopulateHistograms(Client& client) {
  auto create = [&](const std::string& name, const std::string& calculator,
                    const std::string& dtype, v1::QScheme qscheme, v1::HistogramParams params) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator(calculator);
    request.mutable_spec()->set_dtype(dtype);
    request.mutable_spec()->set_qscheme(qscheme);
    *request.mutable_histogram() = params;
    return client.CreateSession(request);
  };
  v1::HistogramParams pct;
  pct.set_num_bins(1024);
  pct.set_percentile(99.9);
  pct.set_skip_zeros(true);
  pct.set_nonfinite(v1::NONFINITE_IGNORE);
  v1::HistogramParams ent;
  ent.set_num_bins(512);
  ent.set_stride(4);
  v1::HistogramParams mse;
  mse.set_num_bins(256);
  mse.set_start_bin(16);
  ASSERT_OK(create("h/pct", "percentile", "int8", v1::SYMMETRIC, pct));
  ASSERT_OK(create("h/ent", "entropy", "uint8", v1::ASYMMETRIC, ent));
  ASSERT_OK(create("h/mse", "mse", "int4", v1::SYMMETRIC, mse));
  ASSERT_OK(create("h/empty", "percentile", "int8", v1::SYMMETRIC, {}));
  for (uint32_t i = 0; i < 4; ++i) {
    std::vector<double> values = RandN(300, 200 + i, 1 + i);
    values[i] = std::nan("");
    ASSERT_OK(client.Observe("h/pct", Vec(values).view()));
    ASSERT_OK_AND_ASSIGN(Histogram binned,
                         BinTensor(Vec(RandN(200, 210 + i)).view(), 512, NonFinitePolicy::kReject));
    ASSERT_OK(client.ObserveHistogram("h/ent", binned));
    v1::ObserveRequest omitted =
        TensorObservation("h/mse", MakeTensor(DType::kBFloat16, {4, 8}, RandN(32, 220 + i)).view());
    omitted.set_omit_qparams(true);
    ASSERT_OK_AND_ASSIGN(std::vector<v1::ObserveResponse> responses,
                         client.ObserveBatch({omitted}));
    ASSERT_EQ(responses[0].status().code(), 0) << responses[0].status().message();
  }
  ASSERT_OK(client.SetExportMode("h/pct", true));
}

// A histogram session's every readable part, as bytes: the session, its qparams
// and calibration, and its histogram.
std::string HistogramState(Client& client, const std::string& name) {
  absl::StatusOr<v1::Session> session = client.GetSession(name);
  absl::StatusOr<v1::GetQParamsResponse> qparams = client.GetQParams(name);
  absl::StatusOr<v1::HistogramObservation> histogram = client.GetHistogram(name);
  if (!session.ok() || !qparams.ok() || !histogram.ok()) return "(unreadable)";
  return session->SerializeAsString() + qparams->SerializeAsString() +
         histogram->SerializeAsString();
}

TEST_F(PersistenceTest, HistogramSessionsRestoreBitForBit) {
  const std::vector<std::string> names = {"h/pct", "h/ent", "h/mse", "h/empty"};
  for (Durability durability : {Durability::kAlways, Durability::kBatched}) {
    SCOPED_TRACE(std::string(DurabilityName(durability)));
    TearDown();
    SetUp();
    Start(Options(durability));
    PopulateHistograms(*client_);
    // Read before anything computed the searches the omitted observations skipped: the
    // results come from the restored histograms, not from a journaled result.
    Start(Options(durability));
    std::string before;
    for (const std::string& name : names) before += HistogramState(*client_, name);
    ASSERT_OK_AND_ASSIGN(v1::Session mse, client_->GetSession("h/mse"));
    EXPECT_TRUE(mse.has_calibration());
    EXPECT_EQ(mse.histogram().start_bin(), 16);

    // Restarted, and once more after reading: every part identical.
    Start(Options(durability));
    std::string after;
    for (const std::string& name : names) after += HistogramState(*client_, name);
    EXPECT_EQ(after, before);

    // And the same histograms, qparams and calibrations as a server that never
    // restarted (its sessions' times differ).
    Start(Options(Durability::kNone));
    PopulateHistograms(*client_);
    for (const std::string& name : names) {
      ASSERT_OK_AND_ASSIGN(v1::HistogramObservation h, client_->GetHistogram(name));
      ASSERT_OK_AND_ASSIGN(v1::GetQParamsResponse q, client_->GetQParams(name));
      EXPECT_TRUE(absl::StrContains(before, h.SerializeAsString())) << name;
      EXPECT_TRUE(absl::StrContains(before, q.SerializeAsString())) << name;
    }
  }
}

TEST_F(PersistenceTest, ATornTailIsSetAsideAndEverythingBeforeItRestored) {
  Start(Options());
  Populate();
  const std::string before = Everything();
  const std::string journal = JournalFile(dir_);
  ASSERT_NE(journal, "");
  server_.reset();

  {  // Half a record at the end, as a crash mid-write leaves it.
    std::ofstream out(journal, std::ios::app | std::ios::binary);
    out << std::string("\x40\x00\x00\x00\x12\x34", 6) << "partial";
  }
  Start(Options());
  EXPECT_EQ(Everything(), before);
  bool set_aside = false;
  for (const std::string& name : Files(dir_)) set_aside |= absl::EndsWith(name, ".corrupt");
  EXPECT_TRUE(set_aside);
  // The server goes on journaling, and that survives another restart.
  ASSERT_OK(client_->Observe("ma", F32({3, 4}, RandN(12, 7)).view()));
  const std::string after = Everything();
  Start(Options());
  EXPECT_EQ(Everything(), after);
}

TEST_F(PersistenceTest, ACorruptRecordEndsRecoveryThere) {
  Start(Options());
  ASSERT_OK(Create("first", "static", {}));
  const std::string journal = JournalFile(dir_);
  const int64_t first_end = FileSize(journal);
  ASSERT_OK(Create("second", "static", {}));
  ASSERT_OK(Create("third", "static", {}));
  server_.reset();

  {  // Flip a byte inside the second record: its checksum no longer matches.
    std::fstream file(journal, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(first_end + 12);
    file.put('\xff');
  }
  Start(Options());
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse all, client_->ListSessions(0, "", ""));
  ASSERT_EQ(all.sessions_size(), 1);
  EXPECT_EQ(all.sessions(0).name(), "first");
}

TEST_F(PersistenceTest, TheDirectoryStaysProportionalToTheState) {
  ServerOptions options = Options(Durability::kBatched);
  options.compact_min_bytes = 16 << 10;
  options.flush_interval = absl::Milliseconds(1);
  Start(options);
  v1::QuantSpec spec;
  spec.mutable_granularity()->mutable_per_channel()->set_axis(0);
  ASSERT_OK(Create("s", "global_minmax", spec));
  // Hundreds of kilobytes of records in all.
  for (uint32_t i = 0; i < 600; ++i) {
    ASSERT_OK(client_->Observe("s", F32({64, 2}, RandN(128, i)).view()));
  }
  const std::string before = Everything();
  // After a restart (which compacts journals that outgrew the snapshot) the
  // directory holds one session's snapshot and at most compact_min_bytes of journal.
  Start(options);
  EXPECT_EQ(Everything(), before);
  int64_t total = 0;
  for (const std::string& name : Files(dir_)) total += FileSize(dir_ + "/" + name);
  EXPECT_LT(total, (16 << 10) + (8 << 10));
}

TEST_F(PersistenceTest, CompactionReplacesTheJournalWithASnapshot) {
  JournalOptions options;
  options.data_dir = dir_;
  options.durability = Durability::kAlways;
  options.compact_min_bytes = int64_t{1} << 40;  // only explicit compactions
  std::vector<storage::v1::Record> live;
  for (int i = 0; i < 3; ++i) {
    storage::v1::Record& r = live.emplace_back();
    r.mutable_put()->mutable_key()->set_name(absl::StrCat("s", i));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Journal> journal, Journal::Open(options));
    ASSERT_OK_AND_ASSIGN(Recovery recovery, journal->Recover([](const storage::v1::Record&) {}));
    EXPECT_EQ(recovery.records, 0);
    ASSERT_OK(journal->Start([&](const Journal::Emitter& emit) {
      for (const storage::v1::Record& r : live) {
        if (absl::Status s = emit(r); !s.ok()) return s;
      }
      return absl::OkStatus();
    }));
    for (int i = 0; i < 200; ++i) {
      ASSERT_OK_AND_ASSIGN(uint64_t sequence, journal->Append(live[i % 3]));
      ASSERT_OK(journal->Sync(sequence));
    }
    EXPECT_GT(FileSize(JournalFile(dir_)), 200 * 4);
    ASSERT_OK(journal->Compact());
    EXPECT_EQ(Files(dir_), (std::vector<std::string>{"LOCK", "journal-00000000000000000002",
                                                     "snapshot-00000000000000000002"}));
    EXPECT_EQ(FileSize(JournalFile(dir_)), 8);  // the magic alone
    ASSERT_OK_AND_ASSIGN(uint64_t sequence, journal->Append(live[0]));
    ASSERT_OK(journal->Sync(sequence));
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Journal> journal, Journal::Open(options));
  std::vector<storage::v1::Record> records;
  ASSERT_OK_AND_ASSIGN(Recovery recovery, journal->Recover([&](const storage::v1::Record& r) {
    records.push_back(r);
  }));
  ASSERT_EQ(records.size(), 4u);  // the snapshot's three, then the append
  EXPECT_EQ(recovery.records, 4);
  EXPECT_TRUE(recovery.problems.empty());
  EXPECT_EQ(records[3].put().key().name(), "s0");
}

// A finite range wider than float32 gives an infinite scale; such a session must
// survive a restart like any other.
TEST_F(PersistenceTest, SessionsWithInfiniteScalesAreRestored) {
  Start(Options());
  v1::QuantSpec spec;
  spec.set_qscheme(v1::ASYMMETRIC);
  ASSERT_OK(Create("huge", "global_minmax", spec));
  ASSERT_OK(Create("huge64", "static", spec));
  ASSERT_OK(client_->Observe("huge", Vec({-3.4e38, 3.4e38}).view()));
  ASSERT_OK(client_->Observe("huge64", MakeTensor(DType::kFloat64, {2}, {-1e300, 1e300}).view()));
  ASSERT_OK_AND_ASSIGN(v1::Session huge, client_->GetSession("huge"));
  EXPECT_TRUE(std::isinf(huge.qparams().scale(0)));
  const std::string before = Everything();
  Start(Options());
  EXPECT_EQ(Everything(), before);
}

TEST_F(PersistenceTest, ADataDirectoryServesOneServerAtATime) {
  Start(Options());
  ServerOptions options = Options();
  options.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<QParamsServer>> second = QParamsServer::Start(options);
  EXPECT_CODE(second, absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "in use")) << second.status();
}

TEST_F(PersistenceTest, IdleSessionsAreEvictedAndSaySo) {
  ServerOptions options = Options();
  options.engine.session_ttl = absl::Hours(1);
  Start(options);
  ASSERT_OK(Create("idle", "static", {}));
  ASSERT_OK(Create("busy", "static", {}));
  Engine& engine = server_->server().engine();
  EXPECT_EQ(engine.EvictIdle(absl::Now()), 0);  // nobody idle for an hour yet

  // Two hours on, both are idle; a call at that time would have kept "busy".
  EXPECT_EQ(engine.EvictIdle(absl::Now() + absl::Hours(2)), 2);
  for (const char* name : {"idle", "busy"}) {
    absl::StatusOr<v1::Session> s = client_->GetSession(name);
    EXPECT_CODE(s, absl::StatusCode::kNotFound);
    EXPECT_TRUE(absl::StrContains(s.status().message(), "evicted")) << s.status();
    EXPECT_CODE(client_->Observe(name, Vec({1}).view()), absl::StatusCode::kNotFound);
  }
  // The eviction survives a restart, and the name can be created again.
  Start(options);
  absl::StatusOr<v1::Session> s = client_->GetSession("idle");
  EXPECT_TRUE(absl::StrContains(s.status().message(), "evicted")) << s.status();
  EXPECT_OK(Create("idle", "static", {}));
  EXPECT_OK(client_->GetSession("idle"));
}

// The memory of evicted names is bounded and forgets the oldest eviction first, in
// memory and across a snapshot (whose records keep that order).
// Directories written before the storage format had its own messages hold the
// qparams in repeated fields (the wire's layout); they decode to the same state.
TEST(SessionCodec, ReadsTheRepeatedFieldsOfOlderDirectories) {
  QuantSpec spec;
  spec.qscheme = QScheme::kAsymmetric;
  spec.granularity = Granularity::PerChannel(0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StatefulQParamsCalculatorBase> calculator,
                       QParamsCalculatorRegistry::Global().CreateStateful("moving_average", spec));
  const std::vector<float> values = {-3.5f, 1.25f, 0.5f, 7.0f, -0.25f, 2.0f};
  ASSERT_OK(calculator
                ->Forward(Observation::FromTensor(*TensorView::Create(
                    DType::kFloat32, {3, 2},
                    absl::string_view(reinterpret_cast<const char*>(values.data()),
                                      values.size() * sizeof(float)),
                    100, "x")))
                .status());
  const CalculatorState state = calculator->ExportState();
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  storage::v1::SessionState record = EncodeSession({"t", "s"}, state, t0, t0);
  ASSERT_FALSE(record.qparams().scale_f32().empty());

  storage::v1::SessionState older = record;
  storage::v1::QParams* q = older.mutable_qparams();
  q->clear_scale_f32();
  q->clear_zero_point_i32();
  q->clear_minval_f32();
  q->mutable_scale()->Assign(state.qparams.scale.begin(), state.qparams.scale.end());
  q->mutable_zero_point()->Assign(state.qparams.zero_point.begin(), state.qparams.zero_point.end());
  q->mutable_minval()->Assign(state.qparams.minval.begin(), state.qparams.minval.end());
  for (const storage::v1::SessionState* r : {&record, &older}) {
    ASSERT_OK_AND_ASSIGN(DecodedSession decoded, DecodeSession(*r));
    EXPECT_EQ(decoded.key, (SessionKey{"t", "s"}));
    EXPECT_EQ(decoded.create_time, t0);
    const CalculatorState again = decoded.calculator->ExportState();
    EXPECT_EQ(again.qparams.scale, state.qparams.scale);
    EXPECT_EQ(again.qparams.zero_point, state.qparams.zero_point);
    EXPECT_EQ(again.qparams.minval, state.qparams.minval);
    EXPECT_EQ(again.running->lo, state.running->lo);
    EXPECT_EQ(again.running->hi, state.running->hi);
    EXPECT_EQ(again.observation_count, 1);
  }
}

TEST(SessionStoreEvictions, TheOldestIsForgottenFirst) {
  const absl::Time t0 = absl::FromUnixSeconds(1'700'000'000);
  auto evicted = [&](const std::string& name, int minutes) {
    return EncodeEviction({"", name}, t0 + absl::Minutes(minutes));
  };
  auto remembered = [](const SessionStore& store, const std::string& name) {
    return absl::StrContains(store.Find({"", name}).status().message(), "evicted");
  };
  // Names in the reverse order of their eviction times, records in neither: the
  // order is the times'.
  const std::vector<storage::v1::Record> records = {
      evicted("x3", 3), evicted("z1", 1), evicted("v5", 5), evicted("y2", 2), evicted("w4", 4)};
  NullSessionLog log;
  SessionStore store(/*max_sessions=*/10, log, /*max_remembered_evictions=*/3);
  EXPECT_TRUE(store.Restore(records).empty());
  for (const char* name : {"z1", "y2"}) EXPECT_FALSE(remembered(store, name)) << name;
  for (const char* name : {"x3", "w4", "v5"}) EXPECT_TRUE(remembered(store, name)) << name;

  std::vector<std::string> order;
  for (const storage::v1::Record& r : store.Records()) order.push_back(r.evicted().key().name());
  EXPECT_EQ(order, (std::vector<std::string>{"x3", "w4", "v5"}));

  // A newer eviction pushes out x3, the oldest left.
  SessionStore again(10, log, 3);
  std::vector<storage::v1::Record> more = store.Records();
  more.push_back(evicted("u6", 6));
  EXPECT_TRUE(again.Restore(more).empty());
  EXPECT_FALSE(remembered(again, "x3"));
  for (const char* name : {"w4", "v5", "u6"}) EXPECT_TRUE(remembered(again, name)) << name;
}

TEST_F(PersistenceTest, DurabilityWithoutADirectoryIsRefused) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.durability = Durability::kAlways;
  EXPECT_CODE(QParamsServer::Start(options), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qparams::testing

// qparams-cli end to end: the real binary (QPARAMS_CLI_PATH) against an in-process
// server, its JSON output parsed back into the contract's messages.

#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/slot_map.h"
#include "core/registry.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpc/health/v1/health.pb.h"
#include "gtest/gtest.h"
#include "qparams/client.h"
#include "qparams/v1/qparams.pb.h"
#include "tests/server/service_test_util.h"
#include "tests/support/subprocess.h"
#include "tests/support/test_util.h"
#include "tools/npy.h"

namespace qparams::testing {
namespace {

using google::protobuf::util::MessageDifferencer;

// `json` parsed as a Message; a parse failure fails the test.
template <typename Message>
Message Parse(const std::string& json) {
  Message message;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << " in\n" << json;
  return message;
}

// The JSON documents of `out`, one after another (a document's closing brace is the
// only one at the start of a line).
std::vector<std::string> Documents(const std::string& out) {
  std::vector<std::string> docs;
  std::string doc;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&doc, line, "\n");
    if (line == "}") docs.push_back(std::exchange(doc, ""));
  }
  EXPECT_EQ(doc, "") << "trailing output";
  return docs;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = TestServer::Start().release();
    ASSERT_NE(server_, nullptr);
    std::string dir = absl::StrCat(::testing::TempDir(), "/cli_test.XXXXXX");
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = new std::string(dir);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }

  static std::string Path(const std::string& name) { return absl::StrCat(*dir_, "/", name); }

  // Writes `tensor` as DIR/name and returns the path.
  static std::string Npy(const std::string& name, const Tensor& tensor) {
    const std::string path = Path(name);
    EXPECT_OK(WriteNpy(path, tensor.view()));
    return path;
  }

  // Runs qparams-cli --target=<the server> ARGS... and collects its output.
  static ProcessResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {QPARAMS_CLI_PATH, "--target=" + server_->address()});
    ProcessResult result = RunProcess(args, *dir_);
    EXPECT_NE(result.exit_code, -1) << result.err;
    return result;
  }

  // Runs a command that must succeed and returns its output as a Message.
  template <typename Message>
  static Message Ok(std::vector<std::string> args) {
    const ProcessResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    return Parse<Message>(r.out);
  }

  static TestServer* server_;
  static std::string* dir_;
};

TestServer* CliTest::server_ = nullptr;
std::string* CliTest::dir_ = nullptr;

const char* const kSpecFlags[] = {"--quant_dtype=int4", "--qscheme=asymmetric",
                                  "--granularity=per_channel:0"};

std::vector<std::string> WithSpec(std::vector<std::string> args) {
  args.insert(args.end(), std::begin(kSpecFlags), std::end(kSpecFlags));
  return args;
}

TEST_F(CliTest, CreateObserveAndReadBack) {
  const std::string a = Npy("a.npy", F32({4, 8}, RandN(32, 1)));
  const std::string b = Npy("b.npy", F32({4, 8}, RandN(32, 2, 3.0)));

  const auto created = Ok<v1::Session>(WithSpec({"create", "cli/plain"}));
  EXPECT_EQ(created.name(), "cli/plain");
  EXPECT_EQ(created.calculator(), "static");
  EXPECT_EQ(created.spec().dtype(), "int4");
  EXPECT_EQ(created.spec().qscheme(), v1::ASYMMETRIC);
  EXPECT_EQ(created.spec().granularity().per_channel().axis(), 0);
  EXPECT_FALSE(created.initialized());

  // Both files over one stream: one JSON document per response, in order.
  const ProcessResult observed = Cli({"observe", "cli/plain", a, b});
  ASSERT_EQ(observed.exit_code, 0) << observed.err;
  const std::vector<std::string> docs = Documents(observed.out);
  ASSERT_EQ(docs.size(), 2u) << observed.out;
  const auto first = Parse<v1::ObserveResponse>(docs[0]);
  const auto second = Parse<v1::ObserveResponse>(docs[1]);
  EXPECT_EQ(first.status().code(), 0);
  EXPECT_EQ(first.observation_count(), 1);
  EXPECT_EQ(second.status().code(), 0);
  EXPECT_EQ(second.observation_count(), 2);
  EXPECT_EQ(second.qparams().shape_size(), 2);
  EXPECT_EQ(second.qparams().scale_size(), 4);

  // Reduced here to per-channel min/max: bit-identical qparams.
  Ok<v1::Session>(WithSpec({"create", "cli/reduced"}));
  const ProcessResult reduced = Cli({"observe", "--reduce-locally", "cli/reduced", a, b});
  ASSERT_EQ(reduced.exit_code, 0) << reduced.err;
  const std::vector<std::string> reduced_docs = Documents(reduced.out);
  ASSERT_EQ(reduced_docs.size(), 2u);
  EXPECT_TRUE(MessageDifferencer::Equals(Parse<v1::ObserveResponse>(reduced_docs[1]), second));

  const auto plain = Ok<v1::GetQParamsResponse>({"qparams", "cli/plain"});
  EXPECT_TRUE(plain.initialized());
  EXPECT_TRUE(MessageDifferencer::Equals(plain.qparams(), second.qparams()));
  EXPECT_TRUE(MessageDifferencer::Equals(
      Ok<v1::GetQParamsResponse>({"qparams", "cli/reduced"}).qparams(), plain.qparams()));

  const auto session = Ok<v1::Session>({"get", "cli/plain"});
  EXPECT_TRUE(session.initialized());
  EXPECT_EQ(session.observation_count(), 2);

  // Stateless compute with static on `a` alone is the first forward's result.
  const auto computed = Ok<v1::ComputeResponse>(WithSpec({"compute", "--calculator=static", a}));
  EXPECT_TRUE(MessageDifferencer::Equals(computed.qparams(), first.qparams()));
}

TEST_F(CliTest, ListPagesByName) {
  for (const char* name : {"list/b", "list/a", "list/c"}) Ok<v1::Session>({"create", name});
  const auto all = Ok<v1::ListSessionsResponse>({"list", "--filter=list/"});
  ASSERT_EQ(all.sessions_size(), 3);
  EXPECT_EQ(all.sessions(0).name(), "list/a");
  EXPECT_EQ(all.sessions(2).name(), "list/c");
  EXPECT_EQ(all.next_page_token(), "");

  const auto page = Ok<v1::ListSessionsResponse>({"list", "--filter=list/", "--page-size=2"});
  ASSERT_EQ(page.sessions_size(), 2);
  ASSERT_NE(page.next_page_token(), "");
  const auto rest = Ok<v1::ListSessionsResponse>(
      {"list", "--filter=list/", "--page_size=2", "--page_token=" + page.next_page_token()});
  ASSERT_EQ(rest.sessions_size(), 1);
  EXPECT_EQ(rest.sessions(0).name(), "list/c");
}

// export writes the server's document to stdout or, whole or not at all, to -o FILE.
// Issue 37: `"scaleE4m3": ""` was printed on every result. Every command that prints a
// message holding QParams (or a session, a group, a histogram) in JSON, on sessions
// without e4m3 codes, prints no scaleE4m3 field at all; an NVFP4 result prints its codes.
TEST_F(CliTest, NoOutputHoldsAnEmptyScaleE4m3) {
  const std::string a = Npy("e4m3_a.npy", F32({4, 8}, RandN(32, 5)));
  const std::string b = Npy("e4m3_b.npy", F32({4, 8}, RandN(32, 6)));
  const std::vector<std::vector<std::string>> commands = {
      {"calculators"},
      {"compute", a, "--calculator=dynamic"},
      {"create", "e4m3/w", "--calculator=global_minmax", "--granularity=per_tensor"},
      {"create", "e4m3/u", "--calculator=global_minmax", "--granularity=per_tensor"},
      {"granularity", "e4m3/w", "per_channel:0"},
      {"granularity", "e4m3/w", "per_tensor"},
      {"observe", "e4m3/w", a},
      {"observe", "e4m3/w", a, b},
      {"observe", "e4m3/w", "--reduce-locally", b},
      {"observe", "e4m3/u", b},
      {"get", "e4m3/w"},
      {"qparams", "e4m3/w"},
      {"list", "--filter=e4m3/"},
      {"export-mode", "e4m3/w", "on"},
      {"export-mode", "e4m3/w", "off"},
      {"create", "e4m3/h", "--calculator=entropy", "--quant_target=activation"},
      {"observe", "e4m3/h", a},
      {"observe", "e4m3/h", "--reduce-locally", b},
      {"histogram", "e4m3/h"},
      {"get", "e4m3/h"},
      {"group", "create", "e4m3/g", "--members=e4m3/w,e4m3/u", "--share=union_range"},
      {"group", "get", "e4m3/g"},
      {"group", "qparams", "e4m3/g"},
      {"group", "list", "--filter=e4m3/"},
      {"report", "--prefix=e4m3/"},
      {"group", "delete", "e4m3/g"},
      {"delete", "e4m3/u"},
  };
  for (const std::vector<std::string>& command : commands) {
    const std::string text = absl::StrJoin(command, " ");
    const ProcessResult r = Cli(command);
    ASSERT_EQ(r.exit_code, 0) << text << ": " << r.err;
    EXPECT_NE(r.out, "") << text;
    EXPECT_FALSE(absl::StrContains(r.out, "scaleE4m3")) << text << ":\n" << r.out;
    EXPECT_FALSE(absl::StrContains(r.out, "scale_e4m3")) << text << ":\n" << r.out;
  }

  std::vector<double> values(32, 0.0);
  values[3] = -7;
  const std::string nvfp4 = Npy("e4m3_nvfp4.npy", F32({1, 32}, values));
  Ok<v1::Session>({"create", "e4m3/nvfp4", "--quant_dtype=float4_e2m1fn_x2",
                   "--scale_dtype=float8_e4m3fn", "--granularity=per_block:-1:16"});
  const ProcessResult observed = Cli({"observe", "e4m3/nvfp4", nvfp4});
  ASSERT_EQ(observed.exit_code, 0) << observed.err;
  EXPECT_TRUE(absl::StrContains(observed.out, "\"scaleE4m3\": \"")) << observed.out;
  EXPECT_FALSE(absl::StrContains(observed.out, "\"scaleE4m3\": \"\"")) << observed.out;
}

TEST_F(CliTest, ExportWritesTheDocumentToStdoutOrAFile) {
  const std::string w = Npy("xw.npy", F32({4, 8}, RandN(32, 4)));
  Ok<v1::Session>({"create", "xp/fc1.weight", "--granularity=per_channel:0"});
  ASSERT_EQ(Cli({"observe", "xp/fc1.weight", w}).exit_code, 0);
  Ok<v1::Session>({"create", "xp/idle"});

  const ProcessResult refused =
      Cli({"export", "--prefix=xp/", "--format=onnx", "-o", Path("x.json")});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(refused.err, "FAILED_PRECONDITION")) << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "xp/idle")) << refused.err;
  EXPECT_FALSE(std::filesystem::exists(Path("x.json")));
  EXPECT_FALSE(std::filesystem::exists(Path("x.json.partial")));

  const ProcessResult to_stdout =
      Cli({"export", "--prefix=xp/", "--format=aimet", "--allow-uninitialized"});
  ASSERT_EQ(to_stdout.exit_code, 0) << to_stdout.err;
  EXPECT_TRUE(absl::StrContains(to_stdout.out,
                                "\"name\": \"fc1.weight\", \"dtype\": \"INT\", "
                                "\"enc_type\": \"PER_CHANNEL\""))
      << to_stdout.out;

  const ProcessResult to_file = Cli({"export", "--prefix=xp/", "--format=compressed-tensors",
                                     "--allow_uninitialized", "-o=" + Path("x.json")});
  ASSERT_EQ(to_file.exit_code, 0) << to_file.err;
  EXPECT_EQ(to_file.out, "");
  ASSERT_OK_AND_ASSIGN(const std::string written, ReadFile(Path("x.json")));
  EXPECT_TRUE(absl::StrContains(written, "\"fc1.weight_scale\"")) << written;

  const ProcessResult no_format = Cli({"export", "--prefix=xp/"});
  EXPECT_EQ(no_format.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(no_format.err, "--format=aimet")) << no_format.err;
  const ProcessResult bad_format = Cli({"export", "--prefix=xp/", "--format=csv"});
  EXPECT_EQ(bad_format.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(bad_format.err, "INVALID_ARGUMENT: format")) << bad_format.err;
}

TEST_F(CliTest, ExportModeGranularityAndDelete) {
  const std::string a = Npy("em.npy", F32({2, 4}, RandN(8, 3)));
  Ok<v1::Session>({"create", "em/s", "--granularity=per_tensor"});
  const auto changed = Ok<v1::Session>({"granularity", "em/s", "per_block:-1,2"});
  EXPECT_EQ(changed.spec().granularity().per_block().block_size_size(), 2);
  ASSERT_EQ(Cli({"observe", "em/s", a}).exit_code, 0);

  EXPECT_TRUE(Ok<v1::Session>({"export-mode", "em/s", "on"}).export_mode());
  EXPECT_FALSE(Ok<v1::Session>({"export-mode", "em/s", "off"}).export_mode());

  // After the first forward the server refuses a new granularity: exit 1.
  const ProcessResult refused = Cli({"granularity", "em/s", "per_tensor"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(refused.err, "error: FAILED_PRECONDITION: ")) << refused.err;
  EXPECT_EQ(refused.out, "");
  // A malformed one is a usage error: exit 2, nothing sent.
  const ProcessResult malformed = Cli({"granularity", "em/s", "per_row"});
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_TRUE(absl::StartsWith(malformed.err, "error: INVALID_ARGUMENT: GRANULARITY:"))
      << malformed.err;

  const ProcessResult deleted = Cli({"delete", "em/s"});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.err;
  const ProcessResult gone = Cli({"get", "em/s"});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(gone.err, "error: NOT_FOUND: ")) << gone.err;
}

// A bad file fails only its own response, with or without local reduction; every
// response is printed and the exit status is 1.
TEST_F(CliTest, ObserveReportsEachFailedResponse) {
  const std::string good = Npy("good.npy", F32({2, 3}, {1, 2, 3, 4, 5, 6}));
  const std::string nan = Npy("nan.npy", F32({2, 3}, {1, NAN, 3, 4, 5, 6}));
  for (const auto& [flag, name] :
       {std::pair<std::string, std::string>{"--reduce_locally=false", "bad/sent-whole"},
        {"--reduce_locally", "bad/reduced"}}) {
    SCOPED_TRACE(flag);
    Ok<v1::Session>({"create", name});
    const ProcessResult r = Cli({"observe", flag, name, good, nan});
    EXPECT_EQ(r.exit_code, 1);
    const std::vector<std::string> docs = Documents(r.out);
    ASSERT_EQ(docs.size(), 2u) << r.out;
    EXPECT_EQ(Parse<v1::ObserveResponse>(docs[0]).status().code(), 0);
    const auto failed = Parse<v1::ObserveResponse>(docs[1]);
    EXPECT_EQ(failed.status().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(failed.observation_count(), 1);
    EXPECT_TRUE(absl::StartsWith(r.err, absl::StrCat("error: INVALID_ARGUMENT: ", nan, ": ")))
        << r.err;
  }
}

TEST_F(CliTest, ReadsBFloat16FilesWithTheDTypeFlag) {
  const std::string bf16 = Npy("bf16.npy", MakeTensor(DType::kBFloat16, {4}, {1, -2, 0.5, 3}));
  const auto computed = Ok<v1::ComputeResponse>({"compute", "--dtype=bfloat16", bf16});
  EXPECT_EQ(computed.qparams().precision(), v1::BFLOAT16);
  const ProcessResult without = Cli({"compute", bf16});
  EXPECT_EQ(without.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(without.err, "bfloat16")) << without.err;
}

TEST_F(CliTest, Health) {
  const ProcessResult server = Cli({"health"});
  EXPECT_EQ(server.exit_code, 0) << server.err;
  EXPECT_EQ(Parse<grpc::health::v1::HealthCheckResponse>(server.out).status(),
            grpc::health::v1::HealthCheckResponse::SERVING);
  const ProcessResult table = Cli({"--format=table", "health", "qparams.v1.QParamsService"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(table.out, "SERVING\n");
  EXPECT_EQ(Cli({"health", "no.such.Service"}).exit_code, 1);
}

TEST_F(CliTest, SlotMapShowPrintsTheMapAReplicaServes) {
  // A single server has no slot map.
  const ProcessResult single = Cli({"slotmap", "show"});
  EXPECT_EQ(single.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(single.err, "error: FAILED_PRECONDITION: the server is not sharded"))
      << single.err;
  EXPECT_EQ(single.out, "");

  ASSERT_OK_AND_ASSIGN(SlotMap map, SlotMap::Parse("# epoch 7\n0:99 r0\n100:255 r1\n"));
  ServerOptions options;
  options.engine.slot_map = std::make_shared<const SlotMap>(map);
  options.engine.replica_id = "r1";
  const std::unique_ptr<TestServer> replica = TestServer::Start(options);
  ASSERT_NE(replica, nullptr);
  auto show = [&](const std::string& format) {
    return RunProcess({QPARAMS_CLI_PATH, "--target=" + replica->address(), "slotmap", "show",
                       "--format=" + format},
                      *dir_);
  };
  // The table is the map file's text, which parses back to the map served.
  const ProcessResult table = show("table");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(table.out, "# epoch 7\n# slots   replica\n0:99      r0\n100:255   r1\n");
  ASSERT_OK_AND_ASSIGN(SlotMap parsed, SlotMap::Parse(table.out));
  EXPECT_TRUE(parsed == map);
  // JSON: the topology the replica answered.
  const ProcessResult json = show("json");
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const v1::Topology topology = Parse<v1::Topology>(json.out);
  EXPECT_EQ(topology.replica_id(), "r1");
  EXPECT_EQ(topology.epoch(), 7);
  EXPECT_EQ(topology.ranges_size(), 2);
}

TEST_F(CliTest, SlotIsComputedWithoutAServer) {
  // --target names a socket nobody listens on: slot must not call the server.
  const auto slot = [](std::vector<std::string> args) {
    args.insert(args.begin(), {QPARAMS_CLI_PATH, "--target=unix:" + Path("no-server.sock")});
    return RunProcess(args, *dir_);
  };
  // Any string: the empty one, JSON's special characters, one that looks like a flag
  // (after "--"). Slots from Python's zlib.crc32(name) % 256.
  const ProcessResult json =
      slot({"slot", "123456789", "", "a\"b\\c", "tab\there", "--", "-x", "model/layer1.weight"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(json.err, "");
  EXPECT_EQ(json.out,
            "{\n"
            " \"slots\": [\n"
            "  {\"name\": \"123456789\", \"slot\": 38},\n"
            "  {\"name\": \"\", \"slot\": 0},\n"
            "  {\"name\": \"a\\\"b\\\\c\", \"slot\": 161},\n"
            "  {\"name\": \"tab\\u0009here\", \"slot\": 246},\n"
            "  {\"name\": \"-x\", \"slot\": 30},\n"
            "  {\"name\": \"model/layer1.weight\", \"slot\": 62}\n"
            " ]\n"
            "}\n");
  // JSON a parser reads back to the same names.
  const auto parsed = Parse<google::protobuf::Struct>(json.out);
  const auto& slots = parsed.fields().at("slots").list_value().values();
  ASSERT_EQ(slots.size(), 6);
  EXPECT_EQ(slots[2].struct_value().fields().at("name").string_value(), "a\"b\\c");
  EXPECT_EQ(slots[3].struct_value().fields().at("name").string_value(), "tab\there");
  EXPECT_EQ(slots[2].struct_value().fields().at("slot").number_value(), 161);

  const ProcessResult table = slot({"--format=table", "slot", "a", "model/layer1.weight"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(table.out,
            "NAME                 SLOT\n"
            "a                    67\n"
            "model/layer1.weight  62\n");

  // A name with a hash tag shows the tag it hashes; without one, nothing more.
  const ProcessResult tagged = slot({"slot", "g{layer1}", "layer1", "{}x"});
  ASSERT_EQ(tagged.exit_code, 0) << tagged.err;
  EXPECT_EQ(tagged.out,
            "{\n"
            " \"slots\": [\n"
            "  {\"name\": \"g{layer1}\", \"slot\": 236, \"hashed_part\": \"layer1\"},\n"
            "  {\"name\": \"layer1\", \"slot\": 236},\n"
            "  {\"name\": \"{}x\", \"slot\": 22}\n"
            " ]\n"
            "}\n");
  const ProcessResult tagged_table = slot({"--format=table", "slot", "g{layer1}", "layer1", "{}x"});
  EXPECT_EQ(tagged_table.out,
            "NAME       SLOT  HASHED_PART\n"
            "g{layer1}  236   layer1\n"
            "layer1     236   -\n"
            "{}x        22    -\n");

  const ProcessResult none = slot({"slot"});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(none.err, "slot NAME [NAME ...]")) << none.err;
}

TEST_F(CliTest, ErrorsAndExitCodes) {
  // A server error: its code name and message on stderr, exit 1.
  const ProcessResult exists = Cli({"create", "dup"});
  ASSERT_EQ(exists.exit_code, 0) << exists.err;
  const ProcessResult again = Cli({"create", "dup"});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(again.err, "error: ALREADY_EXISTS: ")) << again.err;
  EXPECT_TRUE(absl::StrContains(again.err, "dup")) << again.err;
  EXPECT_EQ(again.out, "");

  // Usage errors: exit 2, naming the flag or the command.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"frobnicate"},
                                             {"get"},
                                             {"--no_such_flag", "calculators"},
                                             {"--qscheme=sideways", "create", "x"},
                                             {"--quant_target=bias", "create", "x"},
                                             {"--spec={nope", "create", "x"},
                                             {"--format=yaml", "calculators"},
                                             {"--retry_total=-1s", "calculators"},
                                             {"export-mode", "dup", "maybe"}}) {
    const ProcessResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 2) << args[0];
    EXPECT_TRUE(absl::StartsWith(r.err, "error: INVALID_ARGUMENT: ")) << r.err;
  }
  EXPECT_TRUE(absl::StrContains(Cli({"--qscheme=sideways", "create", "x"}).err, "--qscheme"));
  EXPECT_TRUE(absl::StrContains(Cli({"--retry_total=-1s", "calculators"}).err, "--retry_total"));
}

TEST_F(CliTest, HistogramSessions) {
  const std::string a = Npy("h_a.npy", F32({4, 8}, RandN(32, 5)));
  std::vector<double> with_nan = RandN(16, 6, 2.0);
  with_nan[3] = std::nan("");
  const std::string b = Npy("h_b.npy", F32({16}, with_nan));

  const auto created =
      Ok<v1::Session>({"create", "cli/pct", "--calculator=percentile", "--num_bins=512",
                       "--percentile=99.9", "--skip_zeros", "--nonfinite=ignore"});
  EXPECT_EQ(created.calculator(), "percentile");
  EXPECT_EQ(created.histogram().num_bins(), 512);
  EXPECT_EQ(created.histogram().percentile(), 99.9);
  EXPECT_TRUE(created.histogram().skip_zeros());
  EXPECT_EQ(created.histogram().nonfinite(), v1::NONFINITE_IGNORE);
  // Unset flags take the defaults; one the calculator does not take is refused.
  const auto entropy = Ok<v1::Session>({"create", "cli/ent", "--calculator=entropy", "--stride=8"});
  EXPECT_EQ(entropy.histogram().num_bins(), 4096);
  EXPECT_EQ(entropy.histogram().start_bin(), 128);
  EXPECT_EQ(entropy.histogram().stride(), 8);
  const ProcessResult refused = Cli({"create", "cli/bad", "--calculator=mse", "--percentile=50"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(refused.err, "histogram.percentile")) << refused.err;
  const ProcessResult static_refused = Cli({"create", "cli/bad", "--num_bins=256"});
  EXPECT_EQ(static_refused.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(static_refused.err, "histogram")) << static_refused.err;
  const ProcessResult usage = Cli({"create", "cli/bad", "--calculator=mse", "--nonfinite=drop"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(usage.err, "--nonfinite")) << usage.err;

  // Tensors observed as today; the responses carry the calibration.
  const ProcessResult observed = Cli({"observe", "cli/pct", a, b});
  ASSERT_EQ(observed.exit_code, 0) << observed.err;
  const std::vector<std::string> docs = Documents(observed.out);
  ASSERT_EQ(docs.size(), 2u) << observed.out;
  const auto second = Parse<v1::ObserveResponse>(docs[1]);
  EXPECT_EQ(second.observation_count(), 2);
  EXPECT_EQ(second.calibration().total_count(), 32u + 15u);  // the NaN is not counted
  EXPECT_EQ(second.qparams().shape_size(), 1);

  // Binned here (--reduce-locally): the same histogram and results.
  Ok<v1::Session>({"create", "cli/pct-local", "--calculator=percentile", "--num_bins=512",
                   "--percentile=99.9", "--skip_zeros", "--nonfinite=ignore"});
  const ProcessResult local = Cli({"observe", "--reduce-locally", "cli/pct-local", a, b});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  const std::vector<std::string> local_docs = Documents(local.out);
  ASSERT_EQ(local_docs.size(), 2u) << local.out;
  EXPECT_TRUE(MessageDifferencer::Equals(Parse<v1::ObserveResponse>(local_docs[1]), second));

  const auto histogram = Ok<v1::HistogramObservation>({"histogram", "cli/pct"});
  EXPECT_EQ(histogram.num_bins(), 512);
  EXPECT_EQ(histogram.nan_count(), 1u);
  uint64_t total = 0;
  for (uint64_t c : histogram.counts()) total += c;
  EXPECT_EQ(total, 47u);
  EXPECT_TRUE(MessageDifferencer::Equals(
      Ok<v1::HistogramObservation>({"histogram", "cli/pct-local"}), histogram));

  // --output: the counts as a uint64 .npy array, left out of what is printed.
  const std::string npy = Path("counts.npy");
  const auto summary = Ok<v1::HistogramObservation>({"histogram", "cli/pct", "-o", npy});
  EXPECT_EQ(summary.counts_size(), 0);
  EXPECT_EQ(summary.exponent(), histogram.exponent());
  ASSERT_OK_AND_ASSIGN(const std::string bytes, ReadFile(npy));
  ASSERT_GT(bytes.size(), 128u);
  const size_t header = bytes.size() - histogram.counts_size() * 8;
  EXPECT_TRUE(absl::StrContains(bytes.substr(0, header), "'descr': '<u8'")) << bytes.substr(0, 80);
  EXPECT_TRUE(absl::StrContains(bytes.substr(0, header),
                                absl::StrCat("'shape': (", histogram.counts_size(), ",)")));
  EXPECT_EQ(header % 64, 0u);
  for (int k = 0; k < histogram.counts_size(); ++k) {
    uint64_t count;
    std::memcpy(&count, bytes.data() + header + 8 * k, 8);
    ASSERT_EQ(count, histogram.counts(k)) << "bin " << k;
  }

  // The qparams command shows the calibration too; a table lists the non-empty bins.
  const auto qparams = Ok<v1::GetQParamsResponse>({"qparams", "cli/pct"});
  EXPECT_EQ(qparams.calibration().total_count(), 47u);
  const ProcessResult table = Cli({"--format=table", "histogram", "cli/pct"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_TRUE(absl::StartsWith(table.out, "num_bins 512  exponent ")) << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "\nBIN  ")) << table.out;

  // A session of another calculator has no histogram.
  Ok<v1::Session>({"create", "cli/not-hist"});
  const ProcessResult none = Cli({"histogram", "cli/not-hist"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(none.err, "error: INVALID_ARGUMENT: ")) << none.err;
}

// report --html plots a histogram session's histogram, read by the CLI, marked at the
// chosen amax and at max |x|: histogram.md's worked example at percentile 50 (amax 2.0,
// bin 64 of 2^-5) and its largest value 7.3.
TEST_F(CliTest, ReportPlotsHistogramSessions) {
  const std::string x = Npy("worked.npy", F32({6}, {-3.0, 0.5, 1.0, 2.0, 2.5, 7.3}));
  Ok<v1::Session>(
      {"create", "clireport/pct", "--calculator=percentile", "--num_bins=256", "--percentile=50"});
  ASSERT_EQ(Cli({"observe", "clireport/pct", x}).exit_code, 0);
  const std::string page_path = Path("histogram-report.html");
  const ProcessResult report =
      Cli({"--format=table", "report", "--prefix=clireport/", "--html=" + page_path});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_EQ(report.err, "");
  ASSERT_OK_AND_ASSIGN(const std::string page, ReadFile(page_path));
  EXPECT_TRUE(absl::StrContains(page, "<path class=\"hist\"")) << page;
  EXPECT_TRUE(absl::StrContains(page, "<line class=\"amax\"")) << page;
  EXPECT_TRUE(absl::StrContains(page, ">amax (percentile) = 2</text>")) << page;
  EXPECT_TRUE(absl::StrContains(page, "<line class=\"max-abs\"")) << page;
  EXPECT_TRUE(absl::StrContains(page, ">max |x| = 7.3</text>")) << page;
  EXPECT_TRUE(absl::StrContains(page, "calibration: amax 2, bin_index 64, exponent -5")) << page;
  EXPECT_TRUE(absl::StrContains(page, "234 occupied bins of 2^-5")) << page;
}

// NVFP4 sessions (nvfp4.md §2, §3.5): --scale_dtype=float8_e4m3fn and --convention
// reach the server as given; the JSON holds the convention, global scale and amax, and
// the table adds them to its summary line and each block's e4m3 code in hex.
TEST_F(CliTest, Nvfp4SessionsShowTheirTwoLevelScales) {
  std::vector<double> values(32, 0.0);
  values[3] = -7;
  values[20] = 3.5;
  const std::string a = Npy("nvfp4.npy", F32({1, 32}, values));
  const std::vector<std::string> spec = {"--quant_dtype=float4_e2m1fn_x2",
                                         "--scale_dtype=float8_e4m3fn", "--convention=modelopt",
                                         "--granularity=per_block:-1:16"};
  std::vector<std::string> create = {"create", "cli/nvfp4"};
  create.insert(create.end(), spec.begin(), spec.end());
  const auto created = Ok<v1::Session>(create);
  EXPECT_EQ(created.spec().scale_dtype(), "float8_e4m3fn");
  EXPECT_EQ(created.spec().convention(), "modelopt");
  ASSERT_EQ(Cli({"observe", "cli/nvfp4", a}).exit_code, 0);

  const auto qparams = Ok<v1::GetQParamsResponse>({"qparams", "cli/nvfp4"});
  EXPECT_EQ(qparams.qparams().scale_e4m3(), std::string("\x7e\x76", 2));
  EXPECT_EQ(FloatBits(qparams.qparams().global_scale()), 0x3B2AAAABu);
  EXPECT_EQ(qparams.qparams().amax(), 7.0f);
  const ProcessResult table = Cli({"--format=table", "qparams", "cli/nvfp4"});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_TRUE(absl::StrContains(
      table.out, "shape [1, 2]  precision FLOAT32  global_scale 0.00260416674  amax 7\n"))
      << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "SCALE_E4M3")) << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "448    -           -       0x7e")) << table.out;

  // The server judges the convention: a misspelt one is its INVALID_ARGUMENT.
  std::vector<std::string> bad = {"compute", "--calculator=dynamic"};
  bad.insert(bad.end(), spec.begin(), spec.end());
  bad.push_back("--convention=ModelOpt");
  bad.push_back(a);
  const ProcessResult refused = Cli(bad);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(refused.err, "INVALID_ARGUMENT: spec.convention")) << refused.err;
}

TEST_F(CliTest, ScaleGroups) {
  std::vector<double> values(32, 0.0);
  values[3] = -7;
  values[20] = 3.5;
  const std::string q = Npy("gq.npy", F32({1, 32}, values));
  for (double& v : values) v /= 2;
  const std::string k = Npy("gk.npy", F32({1, 32}, values));
  for (const char* name : {"{cg}.q", "{cg}.k", "{cg}.v"}) {
    Ok<v1::Session>({"create", name, "--calculator=global_minmax", "--quant_dtype=float4_e2m1fn_x2",
                     "--scale_dtype=float8_e4m3fn", "--granularity=per_block:-1:16"});
  }
  ASSERT_EQ(Cli({"observe", "{cg}.q", q}).exit_code, 0);
  ASSERT_EQ(Cli({"observe", "{cg}.k", k}).exit_code, 0);

  const auto created =
      Ok<v1::ScaleGroup>({"group", "create", "{cg}.qkv", "--members={cg}.q,{cg}.k,{cg}.v",
                          "--share=global_amax", "--fill_uncalibrated"});
  EXPECT_EQ(created.name(), "{cg}.qkv");
  ASSERT_EQ(created.members_size(), 3);
  EXPECT_EQ(created.members(2), "{cg}.v");
  EXPECT_EQ(created.share(), v1::ScaleGroup::GLOBAL_AMAX);
  EXPECT_TRUE(created.fill_uncalibrated());
  EXPECT_TRUE(
      MessageDifferencer::Equals(Ok<v1::ScaleGroup>({"group", "get", "{cg}.qkv"}), created));
  Ok<v1::ScaleGroup>(
      {"group", "create", "{cg}.qk", "--members={cg}.q,{cg}.k", "--share=GLOBAL_AMAX"});

  // What the service returns, as JSON; and in the table, each member's codes.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server_->address()));
  ASSERT_OK_AND_ASSIGN(const v1::GroupQParams expected, client->GetGroupQParams("{cg}.qkv"));
  const auto result = Ok<v1::GroupQParams>({"group", "qparams", "{cg}.qkv"});
  EXPECT_TRUE(MessageDifferencer::Equals(result, expected)) << result.DebugString();
  EXPECT_TRUE(result.initialized());
  EXPECT_EQ(result.amax(), 7.0f);
  ASSERT_EQ(result.members_size(), 3);
  EXPECT_EQ(result.members(0).qparams().scale_e4m3(), std::string("\x7e\x76", 2));
  const ProcessResult table = Cli({"--format=table", "group", "qparams", "{cg}.qkv"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_TRUE(
      absl::StartsWith(table.out,
                       "group {cg}.qkv  initialized true\n"
                       "uncalibrated {cg}.v\n"
                       "amax 7  global_scale 384.000031\n"
                       "member {cg}.q  amax 7\n"
                       "shape [1, 2]  precision FLOAT32  global_scale 384.000031  amax 7\n"))
      << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "448    -           -       0x7e\n")) << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, "member {cg}.k  amax 3.5\n")) << table.out;
  EXPECT_TRUE(
      absl::StrContains(table.out,
                        "member {cg}.v  filled\n"
                        "shape [0]  precision DTYPE_UNSPECIFIED  global_scale 384.000031\n"))
      << table.out;
  // {cg}.qk has no uncalibrated member.
  const auto qk = Ok<v1::GroupQParams>({"group", "qparams", "{cg}.qk"});
  EXPECT_TRUE(qk.initialized());
  EXPECT_EQ(qk.uncalibrated_size(), 0);

  // UNION_RANGE: the union's min and max and the one qparams.
  Ok<v1::Session>({"create", "cg/a", "--qscheme=asymmetric"});
  Ok<v1::Session>({"create", "cg/b", "--qscheme=asymmetric"});
  ASSERT_EQ(Cli({"observe", "cg/a", q}).exit_code, 0);
  const auto waiting_union = Ok<v1::ScaleGroup>(
      {"group", "create", "cg/ab", "--members=cg/a,cg/b", "--share=union_range"});
  EXPECT_EQ(waiting_union.share(), v1::ScaleGroup::UNION_RANGE);
  const ProcessResult waiting = Cli({"--format=table", "group", "qparams", "cg/ab"});
  EXPECT_EQ(waiting.out, "group cg/ab  initialized false\nuncalibrated cg/b\n");
  ASSERT_EQ(Cli({"observe", "cg/b", k}).exit_code, 0);
  ASSERT_OK_AND_ASSIGN(const v1::GroupQParams union_expected, client->GetGroupQParams("cg/ab"));
  const auto union_result = Ok<v1::GroupQParams>({"group", "qparams", "cg/ab"});
  EXPECT_TRUE(MessageDifferencer::Equals(union_result, union_expected));
  EXPECT_EQ(union_result.min(), -7.0f);
  EXPECT_EQ(union_result.max(), 3.5f);
  const ProcessResult union_table = Cli({"--format=table", "group", "qparams", "cg/ab"});
  EXPECT_TRUE(absl::StartsWith(union_table.out,
                               "group cg/ab  initialized true\n"
                               "min -7  max 3.5\n"
                               "shape [1]  precision FLOAT32\n"
                               "INDEX  SCALE"))
      << union_table.out;
  // A result without e4m3 codes has no scaleE4m3 field; one with codes has it.
  const ProcessResult union_json = Cli({"group", "qparams", "cg/ab"});
  EXPECT_FALSE(absl::StrContains(union_json.out, "scaleE4m3")) << union_json.out;
  EXPECT_TRUE(absl::StrContains(Cli({"group", "qparams", "{cg}.qkv"}).out, "\"scaleE4m3\": \"fnY"));

  // list follows the pages: every group under the filter in one document.
  for (const char* page_size : {"--page_size=1", "--page_size=0"}) {
    const auto listed =
        Ok<v1::ListScaleGroupsResponse>({"group", "list", "--filter={cg}", page_size});
    ASSERT_EQ(listed.groups_size(), 2) << page_size;
    EXPECT_EQ(listed.groups(0).name(), "{cg}.qk");
    EXPECT_EQ(listed.groups(1).name(), "{cg}.qkv");
    EXPECT_EQ(listed.next_page_token(), "");
  }
  const ProcessResult list_table = Cli({"--format=table", "group", "list", "--filter=cg/"});
  ASSERT_EQ(list_table.exit_code, 0) << list_table.err;
  EXPECT_TRUE(absl::StartsWith(list_table.out,
                               "NAME   SHARE        FILL_UNCALIBRATED  MEMBERS    CREATED\n"
                               "cg/ab  union_range  false              cg/a,cg/b  "))
      << list_table.out;

  // delete removes the group, never its members.
  const ProcessResult deleted = Cli({"group", "delete", "{cg}.qk"});
  EXPECT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_EQ(deleted.out, "{}\n");
  const ProcessResult deleted_table = Cli({"--format=table", "group", "delete", "cg/ab"});
  EXPECT_EQ(deleted_table.out, "deleted group cg/ab\n");
  Ok<v1::Session>({"get", "cg/a"});
  EXPECT_EQ(Ok<v1::ListScaleGroupsResponse>({"group", "list"}).groups_size(), 1);
}

TEST_F(CliTest, ScaleGroupErrors) {
  Ok<v1::Session>({"create", "ge/m"});
  // An unknown group: the server's NOT_FOUND and message, exit 1.
  for (const char* sub : {"get", "qparams", "delete"}) {
    const ProcessResult r = Cli({"group", sub, "ge/absent"});
    EXPECT_EQ(r.exit_code, 1) << sub;
    EXPECT_TRUE(absl::StartsWith(r.err, "error: NOT_FOUND: ")) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "ge/absent")) << r.err;
    EXPECT_EQ(r.out, "");
  }
  // The server judges the members: a missing one, a spec the share does not take.
  const ProcessResult no_member =
      Cli({"group", "create", "ge/g", "--members=ge/m,ge/nope", "--share=union_range"});
  EXPECT_EQ(no_member.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(no_member.err, "error: NOT_FOUND: ")) << no_member.err;
  EXPECT_TRUE(absl::StrContains(no_member.err, "ge/nope")) << no_member.err;
  const ProcessResult not_nvfp4 =
      Cli({"group", "create", "ge/g", "--members=ge/m", "--share=global_amax"});
  EXPECT_EQ(not_nvfp4.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(not_nvfp4.err, "error: INVALID_ARGUMENT: ")) << not_nvfp4.err;
  const ProcessResult bad_page = Cli({"group", "list", "--page_size=-1"});
  EXPECT_EQ(bad_page.exit_code, 1);
  EXPECT_TRUE(absl::StartsWith(bad_page.err, "error: INVALID_ARGUMENT: ")) << bad_page.err;

  // Usage errors: exit 2, naming the flag, or the synopsis.
  const std::vector<std::pair<std::vector<std::string>, std::string>> usage = {
      {{"group", "create", "ge/g", "--share=union_range"}, "--members"},
      {{"group", "create", "ge/g", "--members=ge/m,,x", "--share=union_range"}, "--members"},
      {{"group", "create", "ge/g", "--members=ge/m"}, "--share"},
      {{"group", "create", "ge/g", "--members=ge/m", "--share=sideways"}, "--share"},
      {{"group", "create", "--members=ge/m", "--share=union_range"}, "group create NAME"},
      {{"group", "get"}, "group get NAME"},
      {{"group", "qparams"}, "group qparams NAME"},
      {{"group", "delete"}, "group delete NAME"},
      {{"group", "get", "a", "b"}, "group get NAME"},
      {{"group", "list", "--page_token=x"}, "--page_token"},
      {{"group", "list", "extra"}, "group list"},
      {{"group"}, "SUBCOMMAND"},
      {{"group", "frobnicate"}, "frobnicate"},
  };
  for (const auto& [args, named] : usage) {
    const ProcessResult r = Cli(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << ": " << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "error: INVALID_ARGUMENT: ")) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, named)) << r.err;
  }
  EXPECT_EQ(Ok<v1::ListScaleGroupsResponse>({"group", "list", "--filter=ge/"}).groups_size(), 0);
}

TEST_F(CliTest, HelpListsTheGroupSubcommandsAndEveryCalculator) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"group", "--help"}, {"group", "create", "--help"}, {"create", "--help"}}) {
    const ProcessResult help = Cli(args);
    ASSERT_EQ(help.exit_code, 0) << help.err;
    for (const char* line :
         {"  group SUBCOMMAND [ARGS]\n",
          "      group create NAME --members=A,B,... --share=global_amax|union_range "
          "[--fill_uncalibrated]\n",
          "      group get NAME\n", "      group list [--filter=PREFIX] [--page_size=N]\n",
          "      group delete NAME\n", "      group qparams NAME\n", "--members", "--share",
          "--fill_uncalibrated"}) {
      EXPECT_TRUE(absl::StrContains(help.out, line)) << line;
    }
    // create's help and --calculator's name every session calculator of the registry.
    const size_t create = help.out.find("  create NAME\n");
    const size_t flag = help.out.find("--calculator (");
    ASSERT_NE(create, std::string::npos);
    ASSERT_NE(flag, std::string::npos);
    for (const CalculatorClass* c : QParamsCalculatorRegistry::Global().ListRegistryValues()) {
      if (c->create_stateful == nullptr) continue;
      EXPECT_NE(help.out.find(c->key, create), std::string::npos) << c->key;
      const std::string calculator_help =
          help.out.substr(flag, help.out.find("); default: ", flag) - flag);
      EXPECT_TRUE(absl::StrContains(calculator_help, c->key))
          << c->key << " in " << calculator_help;
    }
  }
}

TEST_F(CliTest, TablesAreShort) {
  const auto calculators = Cli({"--format=table", "calculators"});
  EXPECT_EQ(calculators.exit_code, 0) << calculators.err;
  EXPECT_TRUE(absl::StartsWith(calculators.out, "KEY")) << calculators.out;
  EXPECT_TRUE(absl::StrContains(calculators.out, "moving_average")) << calculators.out;

  const std::string a = Npy("table.npy", F32({2, 2}, {1, -2, 3, 4}));
  const auto computed = Cli({"--format=table", "compute", "--granularity=per_channel:0", a});
  EXPECT_EQ(computed.exit_code, 0) << computed.err;
  EXPECT_TRUE(absl::StartsWith(computed.out, "shape [2, 1]  precision FLOAT32\nINDEX"))
      << computed.out;
}

}  // namespace
}  // namespace qparams::testing

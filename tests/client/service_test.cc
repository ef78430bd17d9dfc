// QParamsService over loopback gRPC: every method and every error code of
// shared/docs/api.md, pagination, limits, streams, health and shutdown.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/timestamp.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "qparams/client.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using google::protobuf::util::MessageDifferencer;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr absl::StatusCode kNotFound = absl::StatusCode::kNotFound;
constexpr absl::StatusCode kExists = absl::StatusCode::kAlreadyExists;
constexpr absl::StatusCode kExhausted = absl::StatusCode::kResourceExhausted;

v1::Tensor WireTensor(const Tensor& t) { return wire::TensorToProto(t.view()); }

Shape ShapeOf(const v1::QParams& q) { return Shape(q.shape().begin(), q.shape().end()); }

v1::QuantSpec Int8Spec(v1::QScheme qscheme = v1::SYMMETRIC, v1::Target target = v1::WEIGHT) {
  v1::QuantSpec spec;
  spec.set_dtype("int8");
  spec.set_qscheme(qscheme);
  spec.set_target(target);
  return spec;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart({}); }

  void Restart(ServerOptions options) {
    stub_.reset();
    server_ = TestServer::Start(options);
    ASSERT_NE(server_, nullptr);
    stub_ = server_->NewStub();
  }

  absl::StatusOr<v1::Session> Create(const std::string& name, const std::string& calculator,
                                     const v1::QuantSpec& spec) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator(calculator);
    *request.mutable_spec() = spec;
    return CreateWith(request);
  }

  absl::StatusOr<v1::Session> CreateWith(const v1::CreateSessionRequest& request) {
    grpc::ClientContext context;
    v1::Session session;
    grpc::Status status = stub_->CreateSession(&context, request, &session);
    if (!status.ok()) return FromGrpc(status);
    return session;
  }

  absl::StatusOr<v1::Session> Get(const std::string& name) {
    grpc::ClientContext context;
    v1::GetSessionRequest request;
    request.set_name(name);
    v1::Session session;
    grpc::Status status = stub_->GetSession(&context, request, &session);
    if (!status.ok()) return FromGrpc(status);
    return session;
  }

  absl::Status Delete(const std::string& name) {
    grpc::ClientContext context;
    v1::DeleteSessionRequest request;
    request.set_name(name);
    v1::DeleteSessionResponse response;
    return FromGrpc(stub_->DeleteSession(&context, request, &response));
  }

  absl::StatusOr<v1::ObserveResponse> Observe(const v1::ObserveRequest& request) {
    grpc::ClientContext context;
    v1::ObserveResponse response;
    grpc::Status status = stub_->Observe(&context, request, &response);
    if (!status.ok()) return FromGrpc(status);
    return response;
  }

  absl::StatusOr<v1::ObserveResponse> ObserveTensor(const std::string& name, const Tensor& t) {
    return Observe(TensorObservation(name, t.view()));
  }

  absl::StatusOr<v1::ListSessionsResponse> List(int page_size, const std::string& token,
                                                const std::string& filter) {
    grpc::ClientContext context;
    v1::ListSessionsRequest request;
    request.set_page_size(page_size);
    request.set_page_token(token);
    request.set_filter(filter);
    v1::ListSessionsResponse response;
    grpc::Status status = stub_->ListSessions(&context, request, &response);
    if (!status.ok()) return FromGrpc(status);
    return response;
  }

  absl::StatusOr<v1::QParams> Compute(const std::string& calculator, const v1::QuantSpec& spec,
                                      const v1::Tensor& tensor) {
    grpc::ClientContext context;
    v1::ComputeRequest request;
    request.set_calculator(calculator);
    *request.mutable_spec() = spec;
    *request.mutable_tensor() = tensor;
    v1::ComputeResponse response;
    grpc::Status status = stub_->Compute(&context, request, &response);
    if (!status.ok()) return FromGrpc(status);
    return response.qparams();
  }

  // A session's wire state without its times, for "nothing changed" checks.
  std::string StateOf(const std::string& name) {
    absl::StatusOr<v1::Session> session = Get(name);
    if (!session.ok()) return session.status().ToString();
    session->clear_create_time();
    return session->SerializeAsString();
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;
};

// ---- ListCalculators ----

TEST_F(ServiceTest, ListCalculatorsIsTheSortedRegistry) {
  grpc::ClientContext context;
  v1::ListCalculatorsResponse response;
  ASSERT_TRUE(stub_->ListCalculators(&context, {}, &response).ok());
  std::vector<std::string> keys;
  for (const v1::CalculatorInfo& info : response.calculators()) {
    keys.push_back(info.key());
    EXPECT_EQ(info.stateful(), info.key() != "dynamic") << info.key();
    EXPECT_FALSE(info.description().empty());
  }
  // The registry itself (a test may have registered more), built-ins included.
  EXPECT_EQ(keys, QParamsCalculatorRegistry::Global().ListRegistryKeys());
  for (const char* key : {"default", "dynamic", "global_minmax", "moving_average", "static"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), key), keys.end()) << key;
  }
}

// ---- Compute ----

TEST_F(ServiceTest, ComputeMatchesTheCoreAndStoresNothing) {
  const Tensor t = F32({2, 3}, {-1, 0, 7, 2, -4, 0.5});
  v1::QuantSpec spec = Int8Spec(v1::ASYMMETRIC);
  spec.mutable_granularity()->mutable_per_channel()->set_axis(0);
  for (const char* key : {"", "dynamic", "static"}) {
    ASSERT_OK_AND_ASSIGN(v1::QParams q, Compute(key, spec, WireTensor(t)));
    ASSERT_OK_AND_ASSIGN(auto calc, testing::Create(*key ? key : "dynamic",
                                                    *wire::SpecFromProto(spec)));
    ASSERT_OK_AND_ASSIGN(QParams expected, Fwd(*calc, t));
    EXPECT_TRUE(wire::QParamsFromProto(q) == expected) << key;
    EXPECT_EQ(q.precision(), v1::FLOAT32);
  }
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse list, List(0, "", ""));
  EXPECT_EQ(list.sessions_size(), 0);
}

TEST_F(ServiceTest, ComputeRefusesStatefulAndUnknownCalculators) {
  const v1::Tensor t = WireTensor(Vec({1, 2}));
  for (const char* key : {"moving_average", "global_minmax", "default"}) {
    absl::StatusOr<v1::QParams> q = Compute(key, Int8Spec(), t);
    EXPECT_CODE(q, kInvalid) << key;
    EXPECT_TRUE(absl::StrContains(q.status().message(), "CreateSession")) << q.status();
  }
  absl::StatusOr<v1::QParams> q = Compute("minmax_observer", Int8Spec(), t);
  EXPECT_CODE(q, kInvalid);
  EXPECT_TRUE(absl::StrContains(q.status().message(), "minmax_observer")) << q.status();
}

TEST_F(ServiceTest, ComputeRejectsBadSpecsAndValues) {
  const v1::Tensor t = WireTensor(Vec({1, 2}));
  v1::QuantSpec spec = Int8Spec();
  spec.mutable_float_range()->set_min(-1);
  EXPECT_CODE(Compute("dynamic", spec, t), kInvalid);  // dynamic refuses float_range
  spec = Int8Spec(v1::SYMMETRIC_WITH_CLIPPING);
  EXPECT_CODE(Compute("dynamic", spec, t), kInvalid);
  spec = Int8Spec(v1::ASYMMETRIC);
  spec.set_dtype("float8_e4m3fn");
  EXPECT_CODE(Compute("static", spec, t), kInvalid);
  spec = Int8Spec();
  spec.set_dtype("int9");
  EXPECT_CODE(Compute("static", spec, t), kInvalid);
  spec = Int8Spec();
  spec.set_qscheme(static_cast<v1::QScheme>(42));
  EXPECT_CODE(Compute("static", spec, t), kInvalid);
  spec = Int8Spec();
  spec.mutable_granularity()->mutable_per_channel()->set_axis(3);  // rank 1
  EXPECT_CODE(Compute("static", spec, t), kInvalid);
  EXPECT_CODE(Compute("static", Int8Spec(), WireTensor(Vec({1, std::nan("")}))), kInvalid);
  EXPECT_CODE(Compute("static", Int8Spec(), WireTensor(F32({2, 0}, {}))), kInvalid);
}

TEST_F(ServiceTest, MalformedTensorsAreInvalidOnEveryPath) {
  ASSERT_OK(Create("s", "static", Int8Spec()));
  std::vector<std::pair<std::string, v1::Tensor>> bad;
  v1::Tensor t = WireTensor(Vec({1, 2}));
  t.set_dtype(v1::DTYPE_UNSPECIFIED);
  bad.push_back({"unset dtype", t});
  t.set_dtype(static_cast<v1::DType>(9));
  bad.push_back({"unknown dtype", t});
  t = WireTensor(Vec({1, 2}));
  t.clear_shape();
  bad.push_back({"rank 0", t});
  t = WireTensor(Vec({1, 2}));
  t.set_shape(0, -2);
  bad.push_back({"negative dim", t});
  t = WireTensor(Vec({1, 2}));
  t.clear_shape();
  for (int i = 0; i < 4; ++i) t.add_shape(int64_t{1} << 20);
  bad.push_back({"overflowing shape", t});
  t = WireTensor(Vec({1, 2}));
  t.mutable_data()->pop_back();
  bad.push_back({"short data", t});
  for (const auto& [what, tensor] : bad) {
    EXPECT_CODE(Compute("static", Int8Spec(), tensor), kInvalid) << what;
    v1::ObserveRequest request;
    request.set_name("s");
    *request.mutable_tensor() = tensor;
    EXPECT_CODE(Observe(request), kInvalid) << what;
  }
  // A cached forward reads nothing of the input, but the tensor must still be well formed.
  ASSERT_OK(ObserveTensor("s", Vec({1, 2})));
  grpc::ClientContext context;
  v1::SetExportModeRequest export_mode;
  export_mode.set_name("s");
  export_mode.set_enabled(true);
  v1::Session session;
  ASSERT_TRUE(stub_->SetExportMode(&context, export_mode, &session).ok());
  v1::ObserveRequest request;
  request.set_name("s");
  *request.mutable_tensor() = bad.back().second;
  EXPECT_CODE(Observe(request), kInvalid);
  EXPECT_EQ(Get("s")->observation_count(), 1);
}

TEST_F(ServiceTest, TensorsAboveTheElementLimitAreResourceExhausted) {
  ServerOptions options;
  options.service.max_tensor_elements = 4;
  Restart(options);
  EXPECT_OK(Compute("static", Int8Spec(), WireTensor(Vec({1, 2, 3, 4}))));
  EXPECT_CODE(Compute("static", Int8Spec(), WireTensor(Vec({1, 2, 3, 4, 5}))), kExhausted);
  ASSERT_OK(Create("s", "static", Int8Spec()));
  v1::ObserveRequest request;
  request.set_name("s");
  v1::RangeObservation* range = request.mutable_range();
  for (int64_t d : {100}) range->add_input_shape(d);
  *range->mutable_min() = WireTensor(Vec({-1}));
  *range->mutable_max() = WireTensor(Vec({1}));
  EXPECT_CODE(Observe(request), kExhausted);
}

TEST_F(ServiceTest, MessagesAboveTheSizeLimitAreResourceExhausted) {
  ServerOptions options;
  options.max_message_bytes = 4096;
  Restart(options);
  EXPECT_OK(Compute("static", Int8Spec(), WireTensor(Vec(std::vector<double>(512, 1.0)))));
  EXPECT_CODE(Compute("static", Int8Spec(), WireTensor(Vec(std::vector<double>(2048, 1.0)))),
              kExhausted);
}

// ---- Sessions ----

TEST_F(ServiceTest, CreateSessionResolvesTheSpecAndCalculator) {
  ASSERT_OK_AND_ASSIGN(v1::Session weight, Create("w", "", Int8Spec()));
  EXPECT_EQ(weight.calculator(), "static");
  ASSERT_OK_AND_ASSIGN(v1::Session act,
                       Create("a", "default", Int8Spec(v1::SYMMETRIC, v1::ACTIVATION)));
  EXPECT_EQ(act.calculator(), "moving_average");
  EXPECT_EQ(act.averaging_constant(), 0.01);
  EXPECT_EQ(weight.averaging_constant(), 0);

  v1::QuantSpec spec;  // every default
  ASSERT_OK_AND_ASSIGN(v1::Session s, Create("d", "global_minmax", spec));
  EXPECT_EQ(s.spec().dtype(), "int8");
  EXPECT_EQ(s.spec().qscheme(), v1::SYMMETRIC);
  EXPECT_EQ(s.spec().target(), v1::WEIGHT);
  EXPECT_TRUE(s.spec().granularity().has_per_tensor());
  EXPECT_EQ(s.spec().quant_min(), -128);
  EXPECT_EQ(s.spec().quant_max(), 127);
  EXPECT_EQ(s.spec().range_calculator(), "minmax");
  EXPECT_EQ(s.spec().scale_dtype(), "");
  EXPECT_FALSE(s.initialized());
  EXPECT_EQ(s.observation_count(), 0);
  EXPECT_EQ(ShapeOf(s.qparams()), (Shape{0}));
  EXPECT_TRUE(s.qparams().has_zero_point());
  EXPECT_EQ(s.qparams().precision(), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(s.input_dtype(), v1::DTYPE_UNSPECIFIED);
  EXPECT_GT(s.create_time().seconds(), 0);
  EXPECT_FALSE(s.description().empty());

  spec.set_dtype("float4_e2m1fn");  // an alias
  spec.set_qscheme(v1::SYMMETRIC_WITH_CLIPPING);
  EXPECT_CODE(Create("fp4", "static", spec), kInvalid);
  spec.set_qscheme(v1::SYMMETRIC);
  ASSERT_OK_AND_ASSIGN(v1::Session fp4, Create("fp4", "static", spec));
  EXPECT_EQ(fp4.spec().dtype(), "float4_e2m1fn_x2");
  EXPECT_EQ(fp4.spec().scale_dtype(), "float8_e8m0fnu");
  EXPECT_EQ(fp4.spec().quant_max(), 6);
  EXPECT_FALSE(fp4.qparams().has_zero_point());

  // The resolved spec sent back gives an identical session.
  ASSERT_OK_AND_ASSIGN(v1::Session again, Create("fp4-again", "static", fp4.spec()));
  EXPECT_TRUE(MessageDifferencer::Equals(again.spec(), fp4.spec()));
  EXPECT_EQ(again.description(), fp4.description());
}

// NVFP4 sessions (nvfp4.md §2, §3.5): the resolved spec names the convention, and
// qparams carry the e4m3 codes, the global scale and the amax once computed (example
// E1: blocks of amax 7 and 3.5), none of them before.
TEST_F(ServiceTest, Nvfp4SessionsCarryTheConventionAndTheTwoLevelScales) {
  v1::QuantSpec spec;
  spec.set_dtype("float4_e2m1fn_x2");
  spec.set_scale_dtype("float8_e4m3fn");
  spec.mutable_granularity()->mutable_per_block()->set_axis(-1);
  spec.mutable_granularity()->mutable_per_block()->add_block_size(16);
  std::vector<double> values(32, 0.0);
  values[3] = -7;
  values[20] = 3.5;
  const Tensor input = F32({1, 32}, values);
  for (const auto& [convention, resolved, global_scale] :
       {std::tuple{"", "compressed_tensors", 0x43C00001u},
        std::tuple{"modelopt", "modelopt", 0x3B2AAAABu}}) {
    SCOPED_TRACE(resolved);
    spec.set_convention(convention);
    const std::string name = absl::StrCat("nvfp4-", resolved);
    ASSERT_OK_AND_ASSIGN(v1::Session s, Create(name, "global_minmax", spec));
    EXPECT_EQ(s.spec().scale_dtype(), "float8_e4m3fn");
    EXPECT_EQ(s.spec().convention(), resolved);
    EXPECT_EQ(ShapeOf(s.qparams()), (Shape{0}));
    EXPECT_TRUE(s.qparams().scale_e4m3().empty());
    EXPECT_FALSE(s.qparams().has_global_scale());
    EXPECT_FALSE(s.qparams().has_amax());

    ASSERT_OK_AND_ASSIGN(v1::ObserveResponse r, ObserveTensor(name, input));
    const v1::QParams& q = r.qparams();
    EXPECT_EQ(ShapeOf(q), (Shape{1, 2}));
    EXPECT_EQ(q.scale_e4m3(), std::string("\x7e\x76", 2));
    ASSERT_EQ(q.scale_size(), 2);
    EXPECT_EQ(q.scale(0), 448.0f);
    EXPECT_EQ(q.scale(1), 224.0f);
    ASSERT_TRUE(q.has_global_scale());
    EXPECT_EQ(FloatBits(q.global_scale()), global_scale);
    ASSERT_TRUE(q.has_amax());
    EXPECT_EQ(q.amax(), 7.0f);
    EXPECT_FALSE(q.has_zero_point());
    EXPECT_FALSE(q.has_minval());

    // The resolved spec sent back gives an identical session.
    ASSERT_OK_AND_ASSIGN(v1::Session again, Create(name + "-again", "global_minmax", s.spec()));
    EXPECT_TRUE(MessageDifferencer::Equals(again.spec(), s.spec()));
  }
  // Other results leave the NVFP4 fields unset.
  ASSERT_OK_AND_ASSIGN(v1::QParams int8, Compute("dynamic", Int8Spec(), WireTensor(input)));
  EXPECT_TRUE(int8.scale_e4m3().empty());
  EXPECT_FALSE(int8.has_global_scale());
  EXPECT_FALSE(int8.has_amax());
}

TEST_F(ServiceTest, CreateSessionErrors) {
  EXPECT_CODE(Create("dyn", "dynamic", Int8Spec()), kInvalid);
  EXPECT_TRUE(absl::StrContains(Create("dyn", "dynamic", Int8Spec()).status().message(),
                                "Compute"));
  EXPECT_CODE(Create("x", "nope", Int8Spec()), kInvalid);
  for (const char* name : {"", "has space", "tab\t", "ü", "a:b"}) {
    EXPECT_CODE(Create(name, "static", Int8Spec()), kInvalid) << name;
  }
  EXPECT_CODE(Create(std::string(129, 'a'), "static", Int8Spec()), kInvalid);
  EXPECT_OK(Create(std::string(128, 'a'), "static", Int8Spec()));
  EXPECT_OK(Create("team-a/layer.0_weight", "static", Int8Spec()));
  EXPECT_CODE(Create("team-a/layer.0_weight", "static", Int8Spec()), kExists);

  v1::CreateSessionRequest request;
  request.set_name("ac");
  request.set_calculator("static");
  request.set_averaging_constant(0.5);
  EXPECT_CODE(CreateWith(request), kInvalid);  // moving_average only
  request.set_calculator("moving_average");
  for (double c : {0.0, -0.1, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    request.set_averaging_constant(c);
    EXPECT_CODE(CreateWith(request), kInvalid) << c;
  }
  request.set_averaging_constant(1);
  ASSERT_OK_AND_ASSIGN(v1::Session s, CreateWith(request));
  EXPECT_EQ(s.averaging_constant(), 1);

  v1::QuantSpec spec = Int8Spec();
  spec.set_quant_min(-10);  // both or neither
  EXPECT_CODE(Create("q", "static", spec), kInvalid);
  spec.mutable_granularity()->mutable_per_block()->add_block_size(0);
  EXPECT_CODE(Create("q", "static", spec), kInvalid);
  EXPECT_CODE(Get("q"), kNotFound);  // failed creates leave nothing behind
}

TEST_F(ServiceTest, GetAndDeleteSession) {
  EXPECT_CODE(Get("missing"), kNotFound);
  EXPECT_CODE(Get("bad name"), kInvalid);
  EXPECT_CODE(Get("bad<name>"), kInvalid);
  // Braces are name characters (hash tags, common/slot.h).
  ASSERT_OK(Create("g{layer1}", "static", Int8Spec()));
  ASSERT_OK_AND_ASSIGN(v1::Session tagged, Get("g{layer1}"));
  EXPECT_EQ(tagged.name(), "g{layer1}");
  EXPECT_OK(Delete("g{layer1}"));
  EXPECT_CODE(Delete("missing"), kNotFound);
  EXPECT_CODE(Delete(""), kInvalid);
  ASSERT_OK(Create("s", "static", Int8Spec()));
  ASSERT_OK_AND_ASSIGN(v1::Session s, Get("s"));
  EXPECT_EQ(s.name(), "s");
  EXPECT_OK(Delete("s"));
  EXPECT_CODE(Get("s"), kNotFound);
  EXPECT_CODE(Delete("s"), kNotFound);
  EXPECT_CODE(ObserveTensor("s", Vec({1})), kNotFound);
  EXPECT_OK(Create("s", "static", Int8Spec()));  // the name is free again
}

TEST_F(ServiceTest, SessionLimitIsResourceExhausted) {
  ServerOptions options;
  options.engine.max_sessions = 2;
  Restart(options);
  ASSERT_OK(Create("a", "static", Int8Spec()));
  ASSERT_OK(Create("b", "static", Int8Spec()));
  absl::StatusOr<v1::Session> c = Create("c", "static", Int8Spec());
  EXPECT_CODE(c, kExhausted);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "max_sessions")) << c.status();
  ASSERT_OK(Delete("a"));
  EXPECT_OK(Create("c", "static", Int8Spec()));
}

// ---- ListSessions ----

TEST_F(ServiceTest, ListSessionsPagesInNameOrder) {
  std::vector<std::string> names;
  for (int i = 0; i < 7; ++i) names.push_back(absl::StrCat("run/", 6 - i));
  for (const std::string& name : names) ASSERT_OK(Create(name, "static", Int8Spec()));
  ASSERT_OK(Create("other", "static", Int8Spec()));
  ASSERT_OK(Create("run", "static", Int8Spec()));

  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse page, List(3, token, "run/"));
    ++pages;
    if (!page.next_page_token().empty()) {
      EXPECT_EQ(page.sessions_size(), 3);  // every page is full but the last
    }
    for (const v1::Session& s : page.sessions()) seen.push_back(s.name());
    token = page.next_page_token();
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"run/0", "run/1", "run/2", "run/3", "run/4", "run/5",
                                            "run/6"}));

  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse all, List(0, "", ""));
  EXPECT_EQ(all.sessions_size(), 9);
  EXPECT_TRUE(all.next_page_token().empty());
  EXPECT_EQ(all.sessions(0).name(), "other");
  EXPECT_EQ(all.sessions(1).name(), "run");

  // A page that holds exactly the rest is the last one.
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse first, List(7, "", "run/"));
  EXPECT_TRUE(first.next_page_token().empty());
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse six, List(6, "", "run/"));
  ASSERT_FALSE(six.next_page_token().empty());
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse rest, List(6, six.next_page_token(), "run/"));
  EXPECT_EQ(rest.sessions_size(), 1);
}

TEST_F(ServiceTest, ListSessionsErrors) {
  for (int i = 0; i < 3; ++i) ASSERT_OK(Create(absl::StrCat("a", i), "static", Int8Spec()));
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse page, List(1, "", "a"));
  ASSERT_FALSE(page.next_page_token().empty());
  EXPECT_CODE(List(1, page.next_page_token(), "b"), kInvalid);  // bound to its filter
  EXPECT_CODE(List(1, page.next_page_token(), ""), kInvalid);
  EXPECT_OK(List(1, page.next_page_token(), "a"));
  EXPECT_CODE(List(-1, "", ""), kInvalid);
  EXPECT_CODE(List(1, "garbage!", ""), kInvalid);
  EXPECT_CODE(List(1, "djEKYQo", ""), kInvalid);  // base64 of a token-like text
  EXPECT_CODE(List(1, "", "bad filter"), kInvalid);
}

TEST_F(ServiceTest, ListSessionsCapsThePageSize) {
  for (int i = 0; i < 1001; ++i) ASSERT_OK(Create(absl::StrCat("s", i), "static", Int8Spec()));
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse page, List(5000, "", ""));
  EXPECT_EQ(page.sessions_size(), 1000);
  EXPECT_FALSE(page.next_page_token().empty());
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse defaults, List(0, "", ""));
  EXPECT_EQ(defaults.sessions_size(), 50);
}

// Reads every session under a prefix through ReadSessions: the names, or the
// status the stream ended with.
absl::StatusOr<std::vector<std::string>> ReadNames(v1::QParamsService::Stub& stub,
                                                   const std::string& prefix) {
  grpc::ClientContext context;
  v1::ReadSessionsRequest request;
  request.set_prefix(prefix);
  std::unique_ptr<grpc::ClientReader<v1::Session>> reader = stub.ReadSessions(&context, request);
  std::vector<std::string> names;
  v1::Session session;
  while (reader->Read(&session)) names.push_back(session.name());
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpc(status);
  return names;
}

TEST_F(ServiceTest, ReadSessionsStreamsEverySessionUnderAPrefixInNameOrder) {
  // More than one of the server's pages (64), so that the stream crosses them.
  std::vector<std::string> expected;
  for (int i = 0; i < 150; ++i) {
    expected.push_back(absl::StrFormat("run/%03d", i));
    ASSERT_OK(Create(expected.back(), "static", Int8Spec()));
  }
  ASSERT_OK(Create("other", "static", Int8Spec()));
  ASSERT_OK(Create("run", "static", Int8Spec()));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> run, ReadNames(*stub_, "run/"));
  EXPECT_EQ(run, expected);
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> all, ReadNames(*stub_, ""));
  EXPECT_EQ(all.size(), 152u);
  EXPECT_EQ(all.front(), "other");
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> none, ReadNames(*stub_, "none/"));
  EXPECT_TRUE(none.empty());
  EXPECT_CODE(ReadNames(*stub_, "bad prefix"), kInvalid);

  // Each message is the whole session, as GetSession answers it.
  ASSERT_OK(ObserveTensor("run/007", MakeTensor(DType::kFloat32, {4}, {-1, 0.5, 2, 3})));
  ASSERT_OK_AND_ASSIGN(v1::Session got, Get("run/007"));
  grpc::ClientContext context;
  v1::ReadSessionsRequest request;
  request.set_prefix("run/007");
  std::unique_ptr<grpc::ClientReader<v1::Session>> reader = stub_->ReadSessions(&context, request);
  v1::Session read;
  ASSERT_TRUE(reader->Read(&read));
  EXPECT_EQ(read.SerializeAsString(), got.SerializeAsString());
  EXPECT_FALSE(reader->Read(&read));
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(ServiceTest, ConcurrentCreateAndDeleteRacesStayConsistent) {
  constexpr int kThreads = 8, kRounds = 100, kNames = 4;
  std::atomic<int> created{0}, deleted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<v1::QParamsService::Stub> stub = server_->NewStub();
      for (int r = 0; r < kRounds; ++r) {
        v1::CreateSessionRequest create;
        create.set_name(absl::StrCat("race", (t + r) % kNames));
        create.set_calculator("static");
        grpc::ClientContext c1;
        v1::Session session;
        grpc::Status s = stub->CreateSession(&c1, create, &session);
        if (s.ok()) ++created;
        else EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
        grpc::ClientContext c2;
        v1::DeleteSessionRequest del;
        del.set_name(absl::StrCat("race", (t * 7 + r) % kNames));
        v1::DeleteSessionResponse none;
        s = stub->DeleteSession(&c2, del, &none);
        if (s.ok()) ++deleted;
        else EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_OK_AND_ASSIGN(v1::ListSessionsResponse left, List(0, "", "race"));
  EXPECT_EQ(created - deleted, left.sessions_size());
  EXPECT_EQ(server_->server().engine().session_count(), left.sessions_size());
}

// ---- Observe ----

TEST_F(ServiceTest, ObserveTensorAndRangeAgree) {
  v1::QuantSpec spec = Int8Spec(v1::ASYMMETRIC);
  spec.mutable_granularity()->mutable_per_block()->set_axis(1);
  spec.mutable_granularity()->mutable_per_block()->add_block_size(2);
  ASSERT_OK(Create("t", "global_minmax", spec));
  ASSERT_OK(Create("r", "global_minmax", spec));
  for (uint32_t seed : {1u, 2u, 3u}) {
    const Tensor x = F32({3, 4}, RandN(12, seed));
    ASSERT_OK_AND_ASSIGN(v1::ObserveResponse by_tensor, ObserveTensor("t", x));
    ASSERT_OK_AND_ASSIGN(BlockRange range, ObserveRange(x.view(), {1, 2}));
    v1::ObserveRequest request;
    request.set_name("r");
    request.mutable_range()->add_input_shape(3);
    request.mutable_range()->add_input_shape(4);
    *request.mutable_range()->mutable_min() = WireTensor(range.min);
    *request.mutable_range()->mutable_max() = WireTensor(range.max);
    ASSERT_OK_AND_ASSIGN(v1::ObserveResponse by_range, Observe(request));
    EXPECT_TRUE(MessageDifferencer::Equals(by_tensor, by_range));
    EXPECT_EQ(by_tensor.observation_count(), seed);
    EXPECT_EQ(ShapeOf(by_tensor.qparams()), (Shape{3, 2}));
  }
  ASSERT_OK_AND_ASSIGN(v1::Session t, Get("t"));
  ASSERT_OK_AND_ASSIGN(v1::Session r, Get("r"));
  EXPECT_TRUE(t.initialized());
  EXPECT_EQ(t.input_dtype(), v1::FLOAT32);
  EXPECT_EQ(t.running_min_size(), 6);
  EXPECT_EQ(t.running_min_size(), t.running_max_size());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(t.running_min(i), r.running_min(i));
    EXPECT_LE(t.running_min(i), t.running_max(i));
  }
  EXPECT_GE(absl::ToUnixNanos(TimeFromTimestamp(t.update_time())),
            absl::ToUnixNanos(TimeFromTimestamp(t.create_time())));
}

TEST_F(ServiceTest, ObserveErrorsChangeNothing) {
  v1::QuantSpec spec = Int8Spec();
  spec.mutable_granularity()->mutable_per_channel()->set_axis(0);
  ASSERT_OK(Create("s", "moving_average", spec));
  ASSERT_OK(ObserveTensor("s", F32({2, 2}, {1, 2, 3, 4})));
  const std::string before = StateOf("s");

  // FAILED_PRECONDITION: another input dtype, another block count.
  EXPECT_CODE(ObserveTensor("s", MakeTensor(DType::kBFloat16, {2, 2}, {1, 2, 3, 4})),
              kPrecondition);
  EXPECT_CODE(ObserveTensor("s", F32({3, 2}, {1, 2, 3, 4, 5, 6})), kPrecondition);
  // INVALID_ARGUMENT: values, zero size, granularity fit, range shape/dtype/order.
  EXPECT_CODE(ObserveTensor("s", F32({2, 2}, {1, INFINITY, 3, 4})), kInvalid);
  EXPECT_CODE(ObserveTensor("s", F32({0, 2}, {})), kInvalid);
  EXPECT_CODE(ObserveTensor("s", Vec({1, 2})), kPrecondition);  // N [2] after [2, 1]
  v1::ObserveRequest request;
  request.set_name("s");
  EXPECT_CODE(Observe(request), kInvalid);  // no observation
  request.mutable_range()->add_input_shape(2);
  request.mutable_range()->add_input_shape(2);
  *request.mutable_range()->mutable_min() = WireTensor(F32({2, 1}, {1, 3}));
  *request.mutable_range()->mutable_max() = WireTensor(F32({2, 1}, {0, 4}));
  EXPECT_CODE(Observe(request), kInvalid);  // min > max
  *request.mutable_range()->mutable_max() = WireTensor(F32({1, 2}, {2, 4}));
  EXPECT_CODE(Observe(request), kInvalid);  // wrong shape
  *request.mutable_range()->mutable_max() = WireTensor(MakeTensor(DType::kFloat16, {2, 1}, {2, 4}));
  EXPECT_CODE(Observe(request), kInvalid);  // dtypes differ
  request.mutable_range()->clear_input_shape();
  *request.mutable_range()->mutable_max() = WireTensor(F32({2, 1}, {2, 4}));
  EXPECT_CODE(Observe(request), kInvalid);  // no input shape
  request.set_name("bad name");
  EXPECT_CODE(ObserveTensor("bad name", F32({2, 2}, {1, 2, 3, 4})), kInvalid);
  EXPECT_CODE(ObserveTensor("absent", F32({2, 2}, {1, 2, 3, 4})), kNotFound);

  EXPECT_EQ(StateOf("s"), before);
}

TEST_F(ServiceTest, GetQParamsExportModeAndGranularity) {
  grpc::ClientContext c0;
  v1::GetQParamsRequest get;
  get.set_name("s");
  v1::GetQParamsResponse qparams;
  EXPECT_EQ(stub_->GetQParams(&c0, get, &qparams).error_code(), grpc::StatusCode::NOT_FOUND);

  ASSERT_OK(Create("s", "static", Int8Spec()));
  auto get_qparams = [&] {
    grpc::ClientContext context;
    v1::GetQParamsResponse response;
    EXPECT_TRUE(stub_->GetQParams(&context, get, &response).ok());
    return response;
  };
  auto set_granularity = [&](const v1::Granularity& g) -> absl::StatusOr<v1::Session> {
    grpc::ClientContext context;
    v1::SetGranularityRequest request;
    request.set_name("s");
    *request.mutable_granularity() = g;
    v1::Session session;
    grpc::Status status = stub_->SetGranularity(&context, request, &session);
    if (!status.ok()) return FromGrpc(status);
    return session;
  };
  auto set_export_mode = [&](const std::string& name, bool on) -> absl::StatusOr<v1::Session> {
    grpc::ClientContext context;
    v1::SetExportModeRequest request;
    request.set_name(name);
    request.set_enabled(on);
    v1::Session session;
    grpc::Status status = stub_->SetExportMode(&context, request, &session);
    if (!status.ok()) return FromGrpc(status);
    return session;
  };

  EXPECT_FALSE(get_qparams().initialized());
  EXPECT_EQ(get_qparams().qparams().shape_size(), 1);

  v1::Granularity g;
  EXPECT_CODE(set_granularity(g), kInvalid);  // unset
  g.mutable_per_block()->add_block_size(-2);
  EXPECT_CODE(set_granularity(g), kInvalid);  // cannot be built
  g.mutable_per_channel()->set_axis(-1);
  ASSERT_OK_AND_ASSIGN(v1::Session s, set_granularity(g));
  EXPECT_EQ(s.spec().granularity().per_channel().axis(), -1);
  EXPECT_CODE(set_export_mode("nope", true), kNotFound);
  EXPECT_CODE(set_export_mode("", true), kInvalid);

  // Export mode before the first forward: cached forwards return empty buffers.
  ASSERT_OK_AND_ASSIGN(s, set_export_mode("s", true));
  EXPECT_TRUE(s.export_mode());
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse r, ObserveTensor("s", F32({2, 2}, {1, 2, 3, 4})));
  EXPECT_EQ(r.qparams().shape_size(), 1);
  EXPECT_EQ(r.observation_count(), 0);
  ASSERT_OK(set_export_mode("s", false));

  ASSERT_OK_AND_ASSIGN(r, ObserveTensor("s", F32({2, 2}, {1, -2, 3, 4})));
  EXPECT_EQ(r.observation_count(), 1);
  v1::GetQParamsResponse after = get_qparams();
  EXPECT_TRUE(after.initialized());
  EXPECT_TRUE(MessageDifferencer::Equals(after.qparams(), r.qparams()));

  // Frozen: a different tensor returns the cached buffers.
  ASSERT_OK(set_export_mode("s", true));
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse frozen, ObserveTensor("s", F32({2, 2}, {9, 9, 9, 9})));
  EXPECT_TRUE(MessageDifferencer::Equals(frozen.qparams(), r.qparams()));

  // Initialized: FAILED_PRECONDITION whatever the granularity.
  EXPECT_CODE(set_granularity(g), kPrecondition);
  g.mutable_per_tensor();
  EXPECT_CODE(set_granularity(g), kPrecondition);
}

TEST_F(ServiceTest, UpdateTimeMovesOnMutations) {
  ASSERT_OK_AND_ASSIGN(v1::Session created, Create("s", "static", Int8Spec()));
  absl::Time last = TimeFromTimestamp(created.update_time());
  EXPECT_EQ(last, TimeFromTimestamp(created.create_time()));
  ASSERT_OK(ObserveTensor("s", Vec({1, 2})));
  ASSERT_OK_AND_ASSIGN(v1::Session observed, Get("s"));
  EXPECT_GT(TimeFromTimestamp(observed.update_time()), last);
  last = TimeFromTimestamp(observed.update_time());
  EXPECT_CODE(ObserveTensor("s", Vec({1, NAN})), kInvalid);
  EXPECT_EQ(TimeFromTimestamp(Get("s")->update_time()), last);
}

// ---- ObserveStream ----

TEST_F(ServiceTest, ObserveStreamAnswersEachRequestInOrder) {
  ASSERT_OK(Create("a", "global_minmax", Int8Spec()));
  ASSERT_OK(Create("b", "static", Int8Spec()));
  std::vector<v1::ObserveRequest> requests;
  auto add = [&](const std::string& name, const Tensor& t) {
    v1::ObserveRequest r;
    r.set_name(name);
    *r.mutable_tensor() = WireTensor(t);
    requests.push_back(r);
  };
  add("a", Vec({1, -2}));
  add("a", Vec({1, NAN}));     // INVALID_ARGUMENT, the stream goes on
  add("b", Vec({3, 4}));
  add("missing", Vec({1}));   // NOT_FOUND
  add("bad name", Vec({1}));  // INVALID_ARGUMENT
  add("a", MakeTensor(DType::kFloat16, {2}, {1, 2}));  // FAILED_PRECONDITION
  add("a", Vec({5, -1}));
  requests.push_back(v1::ObserveRequest());  // no name, no observation

  grpc::ClientContext context;
  auto stream = stub_->ObserveStream(&context);
  for (const v1::ObserveRequest& r : requests) ASSERT_TRUE(stream->Write(r));
  ASSERT_TRUE(stream->WritesDone());
  std::vector<v1::ObserveResponse> responses;
  v1::ObserveResponse response;
  while (stream->Read(&response)) responses.push_back(response);
  ASSERT_TRUE(stream->Finish().ok());

  ASSERT_EQ(responses.size(), requests.size());
  const std::vector<int> codes = {0, 3, 0, 5, 3, 9, 0, 3};
  const std::vector<int64_t> counts = {1, 1, 1, 0, 0, 1, 2, 0};
  for (size_t i = 0; i < responses.size(); ++i) {
    EXPECT_EQ(responses[i].status().code(), codes[i]) << i << " " << responses[i].status().message();
    EXPECT_EQ(responses[i].status().message().empty(), codes[i] == 0) << i;
    EXPECT_EQ(responses[i].observation_count(), counts[i]) << i;
    EXPECT_EQ(responses[i].has_qparams(), codes[i] == 0) << i;
  }
  // The stream's result equals unary calls on fresh sessions.
  ASSERT_OK(Create("c", "global_minmax", Int8Spec()));
  ASSERT_OK(ObserveTensor("c", Vec({1, -2})));
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse unary, ObserveTensor("c", Vec({5, -1})));
  EXPECT_TRUE(MessageDifferencer::Equals(unary.qparams(), responses[6].qparams()));
}

// ---- ObserveBatch and omit_qparams ----

TEST_F(ServiceTest, ObserveBatchAnswersEachObservationInOrderLikeTheStream) {
  ASSERT_OK(Create("a", "global_minmax", Int8Spec()));
  ASSERT_OK(Create("b", "static", Int8Spec()));
  v1::ObserveBatchRequest batch;
  auto add = [&](const std::string& name, const Tensor& t, bool omit = false) {
    v1::ObserveRequest* r = batch.add_observations();
    r->set_name(name);
    *r->mutable_tensor() = WireTensor(t);
    r->set_omit_qparams(omit);
  };
  add("a", Vec({1, -2}));
  add("a", Vec({1, NAN}));  // INVALID_ARGUMENT, the batch goes on
  add("b", Vec({3, 4}), /*omit=*/true);
  add("missing", Vec({1}));                            // NOT_FOUND
  add("a", MakeTensor(DType::kFloat16, {2}, {1, 2}));  // FAILED_PRECONDITION
  add("a", Vec({5, -1}));
  batch.add_observations();  // no name, no observation

  grpc::ClientContext context;
  v1::ObserveBatchResponse response;
  ASSERT_TRUE(stub_->ObserveBatch(&context, batch, &response).ok());
  ASSERT_EQ(response.responses_size(), batch.observations_size());
  const std::vector<int> codes = {0, 3, 0, 5, 9, 0, 3};
  const std::vector<int64_t> counts = {1, 1, 1, 0, 1, 2, 0};
  for (int i = 0; i < response.responses_size(); ++i) {
    const v1::ObserveResponse& r = response.responses(i);
    EXPECT_EQ(r.status().code(), codes[i]) << i << " " << r.status().message();
    EXPECT_EQ(r.status().message().empty(), codes[i] == 0) << i;
    EXPECT_EQ(r.observation_count(), counts[i]) << i;
    EXPECT_EQ(r.has_qparams(), codes[i] == 0 && i != 2) << i;  // 2 omitted them
  }
  // The batch's result equals unary calls on a fresh session, and what it omitted is
  // in the session.
  ASSERT_OK(Create("c", "global_minmax", Int8Spec()));
  ASSERT_OK(ObserveTensor("c", Vec({1, -2})));
  ASSERT_OK_AND_ASSIGN(v1::ObserveResponse unary, ObserveTensor("c", Vec({5, -1})));
  EXPECT_TRUE(MessageDifferencer::Equals(unary.qparams(), response.responses(5).qparams()));
  EXPECT_EQ(Get("b")->observation_count(), 1);
  EXPECT_EQ(Get("b")->qparams().scale_size(), 1);
}

TEST_F(ServiceTest, ObserveBatchOverTheLimitAppliesNothing) {
  ASSERT_OK(Create("a", "global_minmax", Int8Spec()));
  v1::ObserveBatchRequest batch;
  for (int i = 0; i <= wire::kMaxBatchObservations; ++i) {
    *batch.add_observations() = TensorObservation("a", Vec({1, 2}).view());
  }
  grpc::ClientContext context;
  v1::ObserveBatchResponse response;
  const grpc::Status status = stub_->ObserveBatch(&context, batch, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "observations")) << status.error_message();
  EXPECT_EQ(Get("a")->observation_count(), 0);

  batch.mutable_observations()->RemoveLast();  // exactly the limit is taken
  grpc::ClientContext again;
  ASSERT_TRUE(stub_->ObserveBatch(&again, batch, &response).ok());
  EXPECT_EQ(response.responses_size(), wire::kMaxBatchObservations);
  EXPECT_EQ(Get("a")->observation_count(), wire::kMaxBatchObservations);

  grpc::ClientContext empty_context;
  ASSERT_TRUE(stub_->ObserveBatch(&empty_context, {}, &response).ok());
  EXPECT_EQ(response.responses_size(), 0);
}

TEST_F(ServiceTest, OmitQParamsLeavesThemOutOfObserveAndObserveStream) {
  ASSERT_OK(Create("a", "global_minmax", Int8Spec()));
  v1::ObserveRequest request = TensorObservation("a", Vec({1, -2}).view());
  request.set_omit_qparams(true);
  {
    grpc::ClientContext context;
    v1::ObserveResponse response;
    ASSERT_TRUE(stub_->Observe(&context, request, &response).ok());
    EXPECT_FALSE(response.has_qparams());
    EXPECT_EQ(response.observation_count(), 1);
  }
  grpc::ClientContext context;
  auto stream = stub_->ObserveStream(&context);
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->WritesDone());
  v1::ObserveResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_FALSE(response.has_qparams());
  EXPECT_EQ(response.observation_count(), 2);
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(Get("a")->qparams().scale_size(), 1);
}

// ---- Health, reflection and shutdown ----

TEST_F(ServiceTest, HealthIsServingUntilShutdownBegins) {
  auto health = grpc::health::v1::Health::NewStub(server_->NewChannel());
  for (const char* service : {"", QParamsServer::kServiceName}) {
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, request, &response).ok()) << service;
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << service;
  }
  {
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service("no.such.Service");
    HealthCheckResponse response;
    EXPECT_EQ(health->Check(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }

  // A watcher started before shutdown sees NOT_SERVING once it begins, while an
  // in-flight stream keeps the server in its grace period.
  grpc::ClientContext watch_context;
  HealthCheckRequest watch_request;
  watch_request.set_service(QParamsServer::kServiceName);
  auto watch = health->Watch(&watch_context, watch_request);
  HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);

  ASSERT_OK(Create("s", "static", Int8Spec()));
  grpc::ClientContext stream_context;
  auto stream = stub_->ObserveStream(&stream_context);
  v1::ObserveRequest request = TensorObservation("s", Vec({1, 2}).view());
  ASSERT_TRUE(stream->Write(request));
  v1::ObserveResponse response;
  ASSERT_TRUE(stream->Read(&response));

  std::thread shutdown([&] { server_->server().Shutdown(absl::Seconds(30)); });
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);
  // The in-flight stream still works during the grace period, then ends cleanly.
  ASSERT_TRUE(stream->Write(request));
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.status().code(), 0);
  EXPECT_EQ(response.observation_count(), 2);
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  watch_context.TryCancel();
  shutdown.join();

  // New calls are refused once the server has stopped.
  grpc::ClientContext context;
  v1::ListCalculatorsResponse calculators;
  EXPECT_EQ(stub_->ListCalculators(&context, {}, &calculators).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ServiceTest, ShutdownCancelsCallsThatOutliveTheGrace) {
  ASSERT_OK(Create("s", "static", Int8Spec()));
  grpc::ClientContext stream_context;
  auto stream = stub_->ObserveStream(&stream_context);
  v1::ObserveRequest request = TensorObservation("s", Vec({1, 2}).view());
  ASSERT_TRUE(stream->Write(request));
  v1::ObserveResponse response;
  ASSERT_TRUE(stream->Read(&response));
  server_->server().Shutdown(absl::Milliseconds(50));  // returns once the stream is cancelled
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_FALSE(stream->Finish().ok());
}

TEST_F(ServiceTest, ReflectionListsTheService) {
  // ServerReflectionInfo with list_services (field 7, ""), encoded by hand: Debian's
  // gRPC ships no reflection .proto.
  grpc::GenericStub generic(server_->NewChannel());
  grpc::ClientContext context;
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&context, "/grpc.reflection.v1alpha.ServerReflection/"
                                  "ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  const std::string list_services("\x3a\x00", 2);
  grpc::Slice slice(list_services);
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_TRUE(absl::StrContains(bytes, "qparams.v1.QParamsService"));
  EXPECT_TRUE(absl::StrContains(bytes, "grpc.health.v1.Health"));
  context.TryCancel();
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace qparams::testing

// The metrics registry's text exposition format (escaping, histogram buckets, value
// formatting, series order), recording from many threads, and, in-process, the
// server's metrics that the binary test cannot reach: every kind of call counted
// once, per tenant, and the storage state after a disk error.

#include "metrics/metrics.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "metrics/metrics_http.h"
#include "proto/convert.h"
#include "qparams/client.h"
#include "tests/client/fault_injection_env.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

TEST(Metrics, CounterFamilyRendersHelpTypeAndEscapedLabels) {
  MetricsRegistry registry;
  Family<Counter>* calls =
      registry.AddCounter("demo_calls_total", "Calls, by \\ method\nand code.", {"method", "code"});
  calls->WithLabels({"Get", "OK"})->Increment(3);
  calls->WithLabels({"a\"b\\c\nd", "NOT_FOUND"})->Increment();
  EXPECT_EQ(registry.Render(),
            "# HELP demo_calls_total Calls, by \\\\ method\\nand code.\n"
            "# TYPE demo_calls_total counter\n"
            "demo_calls_total{method=\"Get\",code=\"OK\"} 3\n"
            "demo_calls_total{method=\"a\\\"b\\\\c\\nd\",code=\"NOT_FOUND\"} 1\n");
}

TEST(Metrics, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  MetricsRegistry registry;
  BucketHistogram* h = registry.AddHistogram("demo_seconds", "Latency.", {"method"}, {0.1, 1, 10})
                           ->WithLabels({"x"});
  for (double v : {0.05, 0.1, 0.5, 20.0}) h->Observe(v);
  EXPECT_EQ(registry.Render(),
            "# HELP demo_seconds Latency.\n"
            "# TYPE demo_seconds histogram\n"
            "demo_seconds_bucket{method=\"x\",le=\"0.1\"} 2\n"  // 0.1 is <= 0.1
            "demo_seconds_bucket{method=\"x\",le=\"1\"} 3\n"
            "demo_seconds_bucket{method=\"x\",le=\"10\"} 3\n"
            "demo_seconds_bucket{method=\"x\",le=\"+Inf\"} 4\n"
            "demo_seconds_sum{method=\"x\"} 20.65\n"
            "demo_seconds_count{method=\"x\"} 4\n");
}

TEST(Metrics, UnlabeledSeriesGaugesAndCallbacks) {
  MetricsRegistry registry;
  registry.AddCounter("demo_total", "Things.")->WithLabels({})->Increment(7);
  Gauge* gauge = registry.AddGauge("demo_level", "Level.")->WithLabels({});
  gauge->Set(2.5);
  gauge->Add(-4);
  registry.AddGaugeCallback("demo_sessions", "Per tenant.", {"tenant"}, [] {
    return std::vector<GaugeSample>{{{"zeta"}, 1}, {{""}, 3}, {{"alpha"}, 0}};
  });
  EXPECT_EQ(registry.Render(),
            "# HELP demo_total Things.\n# TYPE demo_total counter\ndemo_total 7\n"
            "# HELP demo_level Level.\n# TYPE demo_level gauge\ndemo_level -1.5\n"
            "# HELP demo_sessions Per tenant.\n# TYPE demo_sessions gauge\n"
            "demo_sessions{tenant=\"\"} 3\n"
            "demo_sessions{tenant=\"alpha\"} 0\n"
            "demo_sessions{tenant=\"zeta\"} 1\n");
}

TEST(Metrics, ValuesAreShortestRoundTripDecimals) {
  EXPECT_EQ(FormatMetricValue(0.00025), "0.00025");
  EXPECT_EQ(FormatMetricValue(10), "10");
  EXPECT_EQ(FormatMetricValue(-3), "-3");
  EXPECT_EQ(FormatMetricValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatMetricValue(1e300), "1e+300");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(EscapeLabelValue("plain/name-1"), "plain/name-1");
}

TEST(Metrics, RecordingFromManyThreadsLosesNothing) {
  MetricsRegistry registry;
  Family<Counter>* counters = registry.AddCounter("demo_total", "Things.", {"t"});
  BucketHistogram* h = registry.AddHistogram("demo_seconds", "Latency.", {}, {1})->WithLabels({});
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        counters->WithLabels({t % 2 == 0 ? "even" : "odd"})->Increment();
        h->Observe(i % 2 == 0 ? 0.5 : 2);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(counters->WithLabels({"even"})->value(), 2 * kEach);
  EXPECT_EQ(counters->WithLabels({"odd"})->value(), 2 * kEach);
  EXPECT_EQ(h->BucketCounts(), (std::vector<uint64_t>{2 * kEach, 2 * kEach}));
  EXPECT_DOUBLE_EQ(h->sum(), kThreads * kEach / 2 * 2.5);
}

// The endpoint serves what its checks say, as they say it at each request: 200
// "SERVING" or 503 "NOT_SERVING: why", plain text never cached; other paths 404.
TEST(MetricsHttp, HealthPathsAnswerTheirChecksAtEachRequest) {
  MetricsRegistry registry;
  absl::Mutex mu;
  absl::Status ready, live;
  auto read = [&mu](const absl::Status& status) {
    return [&mu, &status] {
      absl::MutexLock lock(&mu);
      return status;
    };
  };
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http = MetricsHttpServer::Start(
      HostPort{"127.0.0.1", 0}, &registry, {read(ready), read(live)});
  ASSERT_OK(http.status());
  httplib::Client client("127.0.0.1", (*http)->port());
  auto expect = [&client](const char* path, int status, const std::string& body) {
    httplib::Result result = client.Get(path);
    ASSERT_TRUE(result) << path;
    EXPECT_EQ(result->status, status) << path;
    EXPECT_EQ(result->body, body) << path;
    EXPECT_EQ(result->get_header_value("Content-Type"), "text/plain; charset=utf-8");
    EXPECT_EQ(result->get_header_value("Cache-Control"), "no-store");
  };
  expect("/healthz", 200, "SERVING\n");
  expect("/livez", 200, "SERVING\n");
  {
    absl::MutexLock lock(&mu);
    ready = absl::UnavailableError("shutting down");
  }
  expect("/healthz", 503, "NOT_SERVING: shutting down\n");
  expect("/livez", 200, "SERVING\n");
  {
    absl::MutexLock lock(&mu);
    ready = absl::OkStatus();
    live = absl::UnavailableError("only a restart helps");
  }
  expect("/healthz", 200, "SERVING\n");
  expect("/livez", 503, "NOT_SERVING: only a restart helps\n");
  httplib::Result other = client.Get("/readyz");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

TEST(MetricsHttp, RefusesToStartWithoutBothChecks) {
  MetricsRegistry registry;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http = MetricsHttpServer::Start(
      HostPort{"127.0.0.1", 0}, &registry, {[] { return absl::OkStatus(); }, nullptr});
  EXPECT_CODE(http.status(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(http.status().message(), "live")) << http.status();
}

TEST(ServerMetrics, EveryKindOfCallIsCountedOnceAndTheStorageStateFollowsTheDisk) {
  char pattern[] = "/tmp/qparams-metrics-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  FaultInjectionEnv env;
  ServerOptions options;
  options.data_dir = dir;
  options.durability = Durability::kAlways;
  options.env = &env;
  std::unique_ptr<TestServer> server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  // The broken journal answers UNAVAILABLE until a restart: one call, not retried.
  ClientOptions client_options;
  client_options.retry_total = absl::ZeroDuration();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Connect(server->address(), client_options));
  const MetricsRegistry& metrics = server->server().metrics();
  EXPECT_TRUE(HasLine(metrics.Render(), "qparams_storage_state{state=\"ok\"} 1"));

  v1::CreateSessionRequest create;
  create.set_name("m");
  create.set_calculator("global_minmax");
  ASSERT_OK(client->CreateSession(create));
  const Tensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  ASSERT_OK(client->Observe("m", x.view()));
  // A stream of two observations (one refused) is one call, OK, at its end.
  std::vector<v1::ObserveRequest> items(2);
  items[0].set_name("m");
  *items[0].mutable_tensor() = wire::TensorToProto(x.view());
  items[1].set_name("missing");
  *items[1].mutable_tensor() = wire::TensorToProto(x.view());
  {
    std::unique_ptr<v1::QParamsService::Stub> stub = server->NewStub();
    grpc::ClientContext context;
    auto stream = stub->ObserveStream(&context);
    v1::ObserveResponse response;
    for (const v1::ObserveRequest& item : items) {
      ASSERT_TRUE(stream->Write(item));
      ASSERT_TRUE(stream->Read(&response));
    }
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());
  }
  // A server stream that fails before its first message.
  {
    std::unique_ptr<v1::QParamsService::Stub> stub = server->NewStub();
    grpc::ClientContext context;
    v1::ReadSessionsRequest request;
    request.set_prefix("bad prefix!");
    auto reader = stub->ReadSessions(&context, request);
    v1::Session session;
    while (reader->Read(&session)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }

  std::string text = metrics.Render();
  EXPECT_TRUE(HasLine(text, "qparams_calls_total{method=\"CreateSession\",code=\"OK\"} 1")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_calls_total{method=\"Observe\",code=\"OK\"} 1")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_calls_total{method=\"ObserveStream\",code=\"OK\"} 1")) << text;
  EXPECT_TRUE(
      HasLine(text, "qparams_calls_total{method=\"ReadSessions\",code=\"INVALID_ARGUMENT\"} 1"))
      << text;
  EXPECT_TRUE(
      HasLine(text, "qparams_call_duration_seconds_count{method=\"ObserveStream\",code=\"OK\"} 1"))
      << text;
  EXPECT_FALSE(absl::StrContains(text, "grpc.health")) << text;  // only qparams.v1
  EXPECT_TRUE(HasLine(text, "qparams_observations_total 2")) << text;
  // Three tensors of six float32 values arrived (one refused): 72 bytes.
  EXPECT_TRUE(HasLine(text, "qparams_received_bytes_total 72")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_sessions{tenant=\"\"} 1")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_journal_appends_total 3")) << text;  // create, 2 observes
  EXPECT_TRUE(HasLine(text, "qparams_owned_slots 256")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_replica_info{replica=\"\"} 1")) << text;

  // A failed fsync: the storage turns read-only.
  env.FailNext(FaultInjectionEnv::Op::kSync);
  EXPECT_CODE(client->Observe("m", x.view()).status(), absl::StatusCode::kUnavailable);
  text = metrics.Render();
  EXPECT_TRUE(HasLine(text, "qparams_storage_state{state=\"ok\"} 0")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_storage_state{state=\"read_only\"} 1")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_storage_state{state=\"memory_only\"} 0")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_calls_total{method=\"Observe\",code=\"UNAVAILABLE\"} 1"))
      << text;

  client.reset();
  server.reset();
  std::filesystem::remove_all(dir);
}

TEST(ServerMetrics, SessionsAreCountedPerTenantAsTheyComeAndGo) {
  const std::string tokens = absl::StrCat(::testing::TempDir(), "/metrics-tokens");
  {
    std::ofstream file(tokens);
    file << "token-of-alpha-0123 alpha\ntoken-of-beta-01234 beta\n";
  }
  ServerOptions options;
  options.auth_tokens_file = tokens;
  std::unique_ptr<TestServer> server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  ClientOptions a_options, b_options;
  a_options.bearer_token = "token-of-alpha-0123";
  b_options.bearer_token = "token-of-beta-01234";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> a, Client::Connect(server->address(), a_options));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> b, Client::Connect(server->address(), b_options));
  v1::CreateSessionRequest create;
  for (const char* name : {"x", "y", "z"}) {
    create.set_name(name);
    ASSERT_OK(a->CreateSession(create));
  }
  create.set_name("x");
  ASSERT_OK(b->CreateSession(create));
  ASSERT_OK(a->DeleteSession("y"));
  ASSERT_OK(b->DeleteSession("x"));
  {
    grpc::ClientContext context;  // no token
    v1::GetSessionRequest request;
    request.set_name("x");
    v1::Session session;
    EXPECT_EQ(server->NewStub()->GetSession(&context, request, &session).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  const std::string text = server->server().metrics().Render();
  EXPECT_TRUE(HasLine(text, "qparams_sessions{tenant=\"alpha\"} 2")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_sessions{tenant=\"beta\"} 0")) << text;
  EXPECT_TRUE(HasLine(text, "qparams_storage_state{state=\"memory_only\"} 1")) << text;
  EXPECT_TRUE(
      HasLine(text, "qparams_calls_total{method=\"GetSession\",code=\"UNAUTHENTICATED\"} 1"))
      << text;
  EXPECT_TRUE(HasLine(text, "qparams_journal_appends_total 0")) << text;
}

}  // namespace
}  // namespace qparams::testing

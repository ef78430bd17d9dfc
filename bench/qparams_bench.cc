// qparams-bench: a load generator for any server speaking qparams.v1 (by default one
// started in this process), optionally measured side by side with an in-process echo
// server of the same gRPC build, the ceiling the service can reach. `--mode memory`
// instead fills an in-process server with initialized sessions and prints its
// resident memory against the raw bytes of their buffers; `--mode restart` fills a
// real server's data directory, kills the server and times its restart.
// `--compare-target` measures a second address of the same server (it through a
// proxy: bench/haproxy_hop.sh) taking turns with --target, for the cost of the hop.
// `--compare-calculator` loads sessions of a second calculator on the same server with
// the same requests, taking turns (e.g. entropy against global_minmax, with
// --omit-qparams so that the histogram session runs no search per observation).
// `--compare-keys` does the same with observations that carry idempotency keys
// against ones that do not.
// `--mode group` times GetGroupQParams of a GLOBAL_AMAX group of --members NVFP4
// weight sessions against a one-member group (bench/group_latency.h).
// `--mode steps` measures the rate one pinned server core applies step contributions
// of --ranks ranks to --sessions step-merged sessions, in memory and journaled
// (bench/step_bench.h).

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/echo_server.h"
#include "bench/group_latency.h"
#include "bench/load_generator.h"
#include "bench/restart.h"
#include "bench/session_fill.h"
#include "bench/step_bench.h"
#include "common/flags.h"
#include "domain/engine.h"
#include "server/process_tuning.h"
#include "server/server.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, mode, "observe",
          "compute, observe, stream, range, memory, restart, group or steps");
ABSL_FLAG(std::string, target, "",
          "host:port of the server to load; empty starts a qparams server in this process");
ABSL_FLAG(int, concurrency, 1, "Workers, each with its own session, calling back to back");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(4),
          "Measured time per server (split over --rounds)");
ABSL_FLAG(absl::Duration, warmup, absl::Milliseconds(300), "Unmeasured time before each round");
ABSL_FLAG(int, rounds, 3,
          "With --compare_echo or --compare_full, the servers take turns this many times, "
          "so that the machine's drift affects both alike");
ABSL_FLAG(std::string, shape, "64", "The tensor's shape, e.g. 4096,4096");
ABSL_FLAG(std::string, dtype, "float32", "The tensor's dtype: float32, float16, bfloat16, float64");
ABSL_FLAG(std::string, granularity, "per_tensor",
          "per_tensor, per_channel:AXIS or per_block:AXIS:SIZE (int8 asymmetric, activation)");
ABSL_FLAG(std::string, calculator, "moving_average", "The sessions' calculator");
ABSL_FLAG(bool, omit_qparams, false,
          "Observations ask for no qparams (ObserveRequest.omit_qparams): a histogram "
          "session then runs no search per observation");
ABSL_FLAG(std::string, compare_calculator, "",
          "Also load sessions of this calculator on the same server with the same "
          "requests, taking turns; the ratio (calculator_ratio) is --calculator's QPS over "
          "its");
ABSL_FLAG(bool, compare_keys, false,
          "Also load sessions of the same calculator with observations that carry "
          "idempotency keys (docs/retries.md), taking turns with the unkeyed ones on the "
          "same server; keys_cost is keyed p50 / unkeyed p50 - 1, the share of an "
          "Observe's time the keys add (the median: QPS follows this VM's tail), and "
          "the engine's own time per Observe with and without keys (no gRPC)");
ABSL_FLAG(std::string, data_dir, "",
          "The in-process server journals its sessions to this directory "
          "(as qparams-server --data_dir, durability batched); empty keeps them in memory");
ABSL_FLAG(bool, compare_echo, false, "Also measure an in-process echo server, and the ratio");
ABSL_FLAG(bool, compare_parse_echo, false,
          "Also measure an in-process echo server that parses each request with the "
          "service's generated code before answering, and the ratio");
ABSL_FLAG(std::string, compare_target, "",
          "Also load this host:port, which must reach the same server as --target (it "
          "through a proxy), taking turns with it on the same sessions; the ratio is its "
          "QPS over --target's");
ABSL_FLAG(bool, compare_full, false,
          "Range mode: also measure Observe of the whole tensor, and the ratio of covered bytes");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of a table");
ABSL_FLAG(int64_t, sessions, 100000,
          "Memory and restart modes: sessions to create; steps mode: step-merged sessions "
          "(modules), at most 10000 (e.g. 200)");
ABSL_FLAG(int64_t, channels, 1024, "Memory and restart modes: channels of each session");
ABSL_FLAG(std::string, server_binary, "",
          "Restart mode: the qparams-server binary to fill, kill and restart");
ABSL_FLAG(int, members, 64, "Group mode: members of the measured GLOBAL_AMAX group");
ABSL_FLAG(int64_t, calls, 2000, "Group mode: GetGroupQParams calls per group (over --rounds)");
ABSL_FLAG(std::string, scratch_dir, "/var/tmp",
          "Restart and steps modes: where the data directory is made (on disk, not tmpfs; "
          "it is removed afterwards)");
ABSL_FLAG(int, ranks, 8, "Steps mode: the job's ranks (W), each one Step call per step");
ABSL_FLAG(int, lag, 1,
          "Steps mode: the call at the start of training step s carries the ranges of "
          "step s - 1 and reads as of step s - lag (docs/reference/qat.md section 5)");
ABSL_FLAG(std::string, input_shape, "64,128",
          "Steps mode: the module input each per_tensor range stands for");
ABSL_FLAG(std::string, server_cpus, "0",
          "Steps mode: the CPUs the server process is pinned to (e.g. 0 or 0-1; empty: "
          "unpinned)");
ABSL_FLAG(std::string, client_cpus, "1",
          "Steps mode: the CPUs this process (the ranks) is pinned to; empty: unpinned");
ABSL_FLAG(std::string, durabilities, "none,batched",
          "Steps mode: a server per durability, taking turns: none (memory), batched or "
          "always (journaled to a directory under --scratch_dir)");
ABSL_FLAG(absl::Duration, step_timeout, absl::ZeroDuration(),
          "Steps mode: StepRequest.step_timeout; 0 leaves it to the server's --step_timeout");
ABSL_FLAG(int64_t, engine_steps, 100,
          "Steps mode: steps of the engine-alone measurement (no gRPC), per durability");

namespace qparams::bench {
namespace {

absl::StatusOr<Shape> ParseShape(absl::string_view text) {
  Shape shape;
  for (absl::string_view dim : absl::StrSplit(text, ',')) {
    int64_t d;
    if (!absl::SimpleAtoi(dim, &d) || d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shape is \"", text, "\"; it must be dims >= 1 joined by commas"));
    }
    shape.push_back(d);
  }
  return shape;
}

absl::StatusOr<std::unique_ptr<QParamsServer>> StartServer(int64_t max_message_bytes,
                                                           int64_t max_sessions) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.max_message_bytes = static_cast<int>(max_message_bytes);
  options.engine.max_sessions = max_sessions;
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  return QParamsServer::Start(options);
}

// Runs `generator` against each target in turn, `rounds` times, adding up each
// target's runs.
absl::StatusOr<std::vector<LoadResult>> TakeTurns(
    const std::vector<std::pair<const LoadGenerator*, std::string>>& runs, int rounds,
    absl::Duration duration) {
  std::vector<LoadResult> results(runs.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < runs.size(); ++i) {
      absl::StatusOr<LoadResult> result = runs[i].first->Run(runs[i].second, duration / rounds);
      if (!result.ok()) return result.status();
      results[i].Merge(*result);
    }
  }
  return results;
}

void AddFigures(const std::string& prefix, const LoadResult& r, std::vector<std::string>* json) {
  json->push_back(absl::StrFormat("\"%sqps\": %.1f", prefix, r.qps()));
  json->push_back(absl::StrFormat("\"%sp50_us\": %.1f", prefix, r.LatencyUs(0.50)));
  json->push_back(absl::StrFormat("\"%sp90_us\": %.1f", prefix, r.LatencyUs(0.90)));
  json->push_back(absl::StrFormat("\"%sp99_us\": %.1f", prefix, r.LatencyUs(0.99)));
  json->push_back(absl::StrFormat("\"%smax_us\": %.1f", prefix, r.LatencyUs(1.0)));
  json->push_back(absl::StrFormat("\"%smb_per_s\": %.2f", prefix, r.mb_per_s()));
  json->push_back(absl::StrFormat("\"%scovered_mb_per_s\": %.2f", prefix, r.covered_mb_per_s()));
  json->push_back(absl::StrFormat("\"%scpu_us_per_request\": %.1f", prefix, r.cpu_us_per_request()));
}

std::string TableRow(absl::string_view server, const LoadResult& r) {
  return absl::StrFormat("%-8s %10.1f %9.1f %9.1f %9.1f %9.1f %10.2f %12.2f %9d %8.1f\n",
                         server, r.qps(), r.LatencyUs(0.5), r.LatencyUs(0.9), r.LatencyUs(0.99),
                         r.LatencyUs(1.0), r.mb_per_s(), r.covered_mb_per_s(), r.requests,
                         r.cpu_us_per_request());
}

// The engine's own time per small Observe (64 float32 values into a moving_average
// session), with and without an idempotency key, in turns, without gRPC: the keys'
// cost on the server apart from the transport's noise. Journaled (batched) to a
// fresh directory beside `data_dir` when it is set.
struct EngineKeysCost {
  double plain_ns = 0;
  double keyed_ns = 0;
};

absl::StatusOr<EngineKeysCost> MeasureEngineKeys(const std::string& data_dir) {
  EngineOptions options;
  if (!data_dir.empty()) {
    options.journal.data_dir = absl::StrCat(data_dir, "-engine");
    std::filesystem::create_directories(options.journal.data_dir);
  }
  EngineKeysCost cost;
  {
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Open(options);
    if (!engine.ok()) return engine.status();
    QuantSpec spec;
    spec.dtype = "int8";
    spec.target = Target::kActivation;
    for (const char* name : {"plain", "keyed"}) {
      absl::StatusOr<SessionInfo> created =
          (*engine)->CreateSession("", name, "moving_average", spec, {});
      if (!created.ok()) return created.status();
    }
    std::vector<float> values(64);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) - 31.5f;
    const std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    absl::StatusOr<TensorView> tensor = TensorView::Create(DType::kFloat32, {64}, bytes);
    if (!tensor.ok()) return tensor.status();
    const absl::StatusOr<Observation> x = Observation::FromTensor(*tensor);
    constexpr int kRounds = 20, kCalls = 5000;
    ObserveKey key{"engine-bench", 0};
    absl::Duration plain, keyed;
    for (int r = 0; r < kRounds; ++r) {
      absl::Time start = absl::Now();
      for (int i = 0; i < kCalls; ++i) {
        ObserveOutcome o = (*engine)->Observe("", "plain", x, /*omit_qparams=*/false);
        if (!o.status.ok()) return o.status;
      }
      plain += absl::Now() - start;
      start = absl::Now();
      for (int i = 0; i < kCalls; ++i) {
        ++key.sequence;
        ObserveOutcome o = (*engine)->Observe("", "keyed", x, /*omit_qparams=*/false, key);
        if (!o.status.ok()) return o.status;
        if (o.result.duplicate) return absl::InternalError("a new key answered as a duplicate");
      }
      keyed += absl::Now() - start;
    }
    cost.plain_ns = absl::ToDoubleNanoseconds(plain) / (kRounds * kCalls);
    cost.keyed_ns = absl::ToDoubleNanoseconds(keyed) / (kRounds * kCalls);
    if (absl::Status s = (*engine)->Close(); !s.ok()) return s;
  }
  if (!data_dir.empty()) std::filesystem::remove_all(options.journal.data_dir);
  return cost;
}

absl::Status RunLoad(Mode mode) {
  LoadSpec spec;
  spec.mode = mode;
  absl::StatusOr<Shape> shape = ParseShape(absl::GetFlag(FLAGS_shape));
  if (!shape.ok()) return shape.status();
  spec.shape = *shape;
  absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  spec.dtype = *dtype;
  absl::StatusOr<v1::Granularity> granularity =
      cli::ParseGranularity(absl::GetFlag(FLAGS_granularity));
  if (!granularity.ok()) return granularity.status();
  spec.granularity = *granularity;
  spec.calculator = absl::GetFlag(FLAGS_calculator);
  spec.omit_qparams = absl::GetFlag(FLAGS_omit_qparams);
  spec.concurrency = absl::GetFlag(FLAGS_concurrency);
  spec.warmup = absl::GetFlag(FLAGS_warmup);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const absl::Duration duration = absl::GetFlag(FLAGS_duration);
  if (rounds < 1 || duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--rounds must be >= 1 and --duration > 0");
  }
  const bool compare_full = absl::GetFlag(FLAGS_compare_full);
  if (compare_full && mode != Mode::kRange) {
    return absl::InvalidArgumentError("--compare_full needs --mode=range");
  }

  const std::string compare_calculator = absl::GetFlag(FLAGS_compare_calculator);
  if (!compare_calculator.empty() && mode == Mode::kCompute) {
    return absl::InvalidArgumentError("--compare_calculator needs sessions; not --mode=compute");
  }

  absl::StatusOr<LoadGenerator> generator = LoadGenerator::Create(spec);
  if (!generator.ok()) return generator.status();
  std::optional<LoadGenerator> base;
  if (!compare_calculator.empty()) {
    LoadSpec base_spec = spec;
    base_spec.calculator = compare_calculator;
    absl::StatusOr<LoadGenerator> created = LoadGenerator::Create(base_spec);
    if (!created.ok()) return created.status();
    base = *std::move(created);
  }
  std::optional<LoadGenerator> keyed;
  if (absl::GetFlag(FLAGS_compare_keys)) {
    if (mode == Mode::kCompute) {
      return absl::InvalidArgumentError("--compare_keys needs observations; not --mode=compute");
    }
    LoadSpec keyed_spec = spec;
    keyed_spec.idempotency_keys = true;
    absl::StatusOr<LoadGenerator> created = LoadGenerator::Create(keyed_spec);
    if (!created.ok()) return created.status();
    keyed = *std::move(created);
  }
  std::optional<LoadGenerator> full;
  if (compare_full) {
    LoadSpec full_spec = spec;
    full_spec.mode = Mode::kObserve;
    absl::StatusOr<LoadGenerator> created = LoadGenerator::Create(full_spec);
    if (!created.ok()) return created.status();
    full = *std::move(created);
  }
  const int64_t max_bytes =
      std::max<int64_t>(ServerOptions().max_message_bytes,
                        (full ? full->max_request_bytes() : generator->max_request_bytes()) +
                            (1 << 20));

  std::unique_ptr<QParamsServer> server;
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) {
    absl::StatusOr<std::unique_ptr<QParamsServer>> started =
        StartServer(max_bytes, ServerOptions().engine.max_sessions);
    if (!started.ok()) return started.status();
    server = *std::move(started);
    target = server->address();
  }
  std::unique_ptr<EchoServer> echo;
  if (absl::GetFlag(FLAGS_compare_echo)) {
    absl::StatusOr<std::unique_ptr<EchoServer>> started = EchoServer::Start(max_bytes);
    if (!started.ok()) return started.status();
    echo = *std::move(started);
  }

  std::unique_ptr<EchoServer> parse_echo;
  if (absl::GetFlag(FLAGS_compare_parse_echo)) {
    absl::StatusOr<std::unique_ptr<EchoServer>> started =
        EchoServer::Start(max_bytes, /*parse=*/true);
    if (!started.ok()) return started.status();
    parse_echo = *std::move(started);
  }

  const std::string compare_target = absl::GetFlag(FLAGS_compare_target);
  std::vector<std::pair<const LoadGenerator*, std::string>> runs = {{&*generator, target}};
  if (!compare_target.empty()) runs.push_back({&*generator, compare_target});
  if (echo) runs.push_back({&*generator, echo->address()});
  if (parse_echo) runs.push_back({&*generator, parse_echo->address()});
  if (full) runs.push_back({&*full, target});
  if (base) runs.push_back({&*base, target});
  if (keyed) runs.push_back({&*keyed, target});
  std::vector<const LoadGenerator*> generators = {&*generator};
  if (full) generators.push_back(&*full);
  if (base) generators.push_back(&*base);
  if (keyed) generators.push_back(&*keyed);
  for (const LoadGenerator* g : generators) {
    if (absl::Status s = g->CreateSessions(target); !s.ok()) return s;
  }
  absl::StatusOr<std::vector<LoadResult>> results = TakeTurns(runs, rounds, duration);
  for (const LoadGenerator* g : generators) {
    if (absl::Status s = g->DeleteSessions(target); !s.ok()) return s;
  }
  if (!results.ok()) return results.status();
  const LoadResult& service = (*results)[0];
  size_t next = 1;
  const LoadResult* compare_result = compare_target.empty() ? nullptr : &(*results)[next++];
  const LoadResult* echo_result = echo ? &(*results)[next++] : nullptr;
  const LoadResult* parse_echo_result = parse_echo ? &(*results)[next++] : nullptr;
  const LoadResult* full_result = full ? &(*results)[next++] : nullptr;
  const LoadResult* base_result = base ? &(*results)[next++] : nullptr;
  const LoadResult* keyed_result = keyed ? &(*results)[next++] : nullptr;
  std::optional<EngineKeysCost> engine_keys;
  if (keyed) {
    absl::StatusOr<EngineKeysCost> measured = MeasureEngineKeys(absl::GetFlag(FLAGS_data_dir));
    if (!measured.ok()) return measured.status();
    engine_keys = *measured;
  }

  if (absl::GetFlag(FLAGS_json)) {
    std::vector<std::string> json = {
        absl::StrFormat("\"mode\": \"%s\"", ModeName(mode)),
        absl::StrFormat("\"shape\": \"%s\"", absl::GetFlag(FLAGS_shape)),
        absl::StrFormat("\"dtype\": \"%s\"", DTypeName(spec.dtype)),
        absl::StrFormat("\"granularity\": \"%s\"", absl::GetFlag(FLAGS_granularity)),
        absl::StrFormat("\"concurrency\": %d", spec.concurrency),
        absl::StrFormat("\"requests\": %d", service.requests),
        absl::StrFormat("\"request_bytes\": %d", service.request_bytes)};
    AddFigures("", service, &json);
    if (compare_result != nullptr) {
      json.push_back(absl::StrFormat("\"target\": \"%s\"", target));
      json.push_back(absl::StrFormat("\"compare_target\": \"%s\"", compare_target));
      json.push_back(absl::StrFormat("\"compare_requests\": %d", compare_result->requests));
      AddFigures("compare_", *compare_result, &json);
      json.push_back(
          absl::StrFormat("\"compare_ratio\": %.4f", compare_result->qps() / service.qps()));
    }
    if (echo_result != nullptr) {
      AddFigures("echo_", *echo_result, &json);
      json.push_back(absl::StrFormat("\"ratio\": %.4f", service.qps() / echo_result->qps()));
    }
    if (parse_echo_result != nullptr) {
      AddFigures("parse_echo_", *parse_echo_result, &json);
      json.push_back(
          absl::StrFormat("\"parse_ratio\": %.4f", service.qps() / parse_echo_result->qps()));
    }
    if (full_result != nullptr) {
      AddFigures("full_", *full_result, &json);
      json.push_back(absl::StrFormat("\"covered_ratio\": %.2f",
                                     service.covered_mb_per_s() / full_result->covered_mb_per_s()));
    }
    if (base_result != nullptr) {
      json.push_back(absl::StrFormat("\"calculator\": \"%s\"", spec.calculator));
      json.push_back(absl::StrFormat("\"compare_calculator\": \"%s\"", compare_calculator));
      json.push_back(absl::StrFormat("\"omit_qparams\": %s", spec.omit_qparams ? "true" : "false"));
      AddFigures("base_", *base_result, &json);
      json.push_back(
          absl::StrFormat("\"calculator_ratio\": %.4f", service.qps() / base_result->qps()));
    }
    if (keyed_result != nullptr) {
      AddFigures("keyed_", *keyed_result, &json);
      json.push_back(absl::StrFormat("\"keys_cost\": %.4f",
                                     keyed_result->LatencyUs(0.5) / service.LatencyUs(0.5) - 1));
      json.push_back(
          absl::StrFormat("\"keys_qps_cost\": %.4f", 1 - keyed_result->qps() / service.qps()));
      json.push_back(absl::StrFormat("\"engine_observe_ns\": %.1f", engine_keys->plain_ns));
      json.push_back(absl::StrFormat("\"engine_keyed_observe_ns\": %.1f", engine_keys->keyed_ns));
      // The keys' server-side time as a share of an unkeyed Observe's (its p50).
      json.push_back(absl::StrFormat(
          "\"engine_keys_share\": %.4f",
          (engine_keys->keyed_ns - engine_keys->plain_ns) / (1e3 * service.LatencyUs(0.5))));
    }
    std::cout << "{" << absl::StrJoin(json, ", ") << "}" << std::endl;
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat(
      "%s of shape (%s) %s %s, concurrency %d, %s in %d round(s), request %d bytes\n",
      ModeName(mode), absl::GetFlag(FLAGS_shape), DTypeName(spec.dtype),
      absl::GetFlag(FLAGS_granularity), spec.concurrency, absl::FormatDuration(duration),
      rounds, service.request_bytes);
  std::cout << absl::StrFormat("%-8s %10s %9s %9s %9s %9s %10s %12s %9s %8s\n", "server", "qps",
                               "p50_us", "p90_us", "p99_us", "max_us", "MB/s", "covered_MB/s",
                               "requests", "cpu_us");
  std::cout << TableRow("qparams", service);
  if (compare_result != nullptr) {
    std::cout << TableRow("compare", *compare_result);
    std::cout << absl::StrFormat("ratio %s/%s: %.3f (QPS and MB/s alike)\n", compare_target, target,
                                 compare_result->qps() / service.qps());
  }
  if (echo_result != nullptr) {
    std::cout << TableRow("echo", *echo_result);
    std::cout << absl::StrFormat("ratio qparams/echo: %.3f (QPS and MB/s alike)\n",
                                 service.qps() / echo_result->qps());
  }
  if (parse_echo_result != nullptr) {
    std::cout << TableRow("parse", *parse_echo_result);
    std::cout << absl::StrFormat("ratio qparams/parsing echo: %.3f (QPS and MB/s alike)\n",
                                 service.qps() / parse_echo_result->qps());
  }
  if (full_result != nullptr) {
    std::cout << TableRow("full", *full_result);
    std::cout << absl::StrFormat(
        "range observations cover %.1fx the input bytes/s of full-tensor Observe\n",
        service.covered_mb_per_s() / full_result->covered_mb_per_s());
  }
  if (base_result != nullptr) {
    std::cout << TableRow(compare_calculator.substr(0, 8), *base_result);
    std::cout << absl::StrFormat("ratio %s/%s sessions: %.3f (QPS and MB/s alike)%s\n",
                                 spec.calculator, compare_calculator,
                                 service.qps() / base_result->qps(),
                                 spec.omit_qparams ? ", omit_qparams" : "");
  }
  if (keyed_result != nullptr) {
    std::cout << TableRow("keyed", *keyed_result);
    std::cout << absl::StrFormat(
        "keys_cost: %.3f (keyed p50 %.1f us / unkeyed p50 %.1f us - 1); by QPS: %.3f\n",
        keyed_result->LatencyUs(0.5) / service.LatencyUs(0.5) - 1, keyed_result->LatencyUs(0.5),
        service.LatencyUs(0.5), 1 - keyed_result->qps() / service.qps());
    std::cout << absl::StrFormat(
        "engine alone (no gRPC): Observe %.0f ns, keyed %.0f ns: the keys add %.0f ns, %.2f%% "
        "of an unkeyed Observe's p50\n",
        engine_keys->plain_ns, engine_keys->keyed_ns, engine_keys->keyed_ns - engine_keys->plain_ns,
        100 * (engine_keys->keyed_ns - engine_keys->plain_ns) / (1e3 * service.LatencyUs(0.5)));
  }
  return absl::OkStatus();
}

// The sessions the memory and restart modes create, from the flags.
absl::StatusOr<FillSpec> FillSpecFromFlags() {
  FillSpec spec;
  spec.sessions = absl::GetFlag(FLAGS_sessions);
  spec.channels = absl::GetFlag(FLAGS_channels);
  spec.concurrency = absl::GetFlag(FLAGS_concurrency);
  if (spec.sessions < 1 || spec.channels < 1 || spec.concurrency < 1) {
    return absl::InvalidArgumentError("--sessions, --channels and --concurrency must be >= 1");
  }
  return spec;
}

absl::Status RunMemory() {
  if (!absl::GetFlag(FLAGS_target).empty()) {
    return absl::InvalidArgumentError(
        "--mode=memory measures a server in this process; it takes no --target");
  }
  absl::StatusOr<FillSpec> fill = FillSpecFromFlags();
  if (!fill.ok()) return fill.status();
  const FillSpec spec = *fill;
  absl::StatusOr<std::unique_ptr<QParamsServer>> server =
      StartServer(ServerOptions().max_message_bytes, spec.sessions);
  if (!server.ok()) return server.status();
  absl::StatusOr<int64_t> before = ResidentBytes();
  if (!before.ok()) return before.status();
  const absl::Time start = absl::Now();
  if (absl::Status s = FillSessions((*server)->address(), spec); !s.ok()) return s;
  const absl::Duration took = absl::Now() - start;
  absl::StatusOr<int64_t> after = ResidentBytes();
  if (!after.ok()) return after.status();
  const int64_t raw = RawStateBytes(spec);
  const double ratio = static_cast<double>(*after) / raw;
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << absl::StrFormat(
                     "{\"mode\": \"memory\", \"sessions\": %d, \"channels\": %d, "
                     "\"raw_bytes\": %d, \"rss_bytes\": %d, \"rss_before_bytes\": %d, "
                     "\"rss_ratio\": %.4f, \"fill_seconds\": %.1f}",
                     spec.sessions, spec.channels, raw, *after, *before, ratio,
                     absl::ToDoubleSeconds(took))
              << std::endl;
  } else {
    std::cout << absl::StrFormat(
        "%d initialized moving_average per-channel sessions of %d channels in %.1f s\n"
        "raw buffer bytes (5 float32 buffers each): %.1f MB\n"
        "process RSS (server and bench client): %.1f MB (%.1f MB before the sessions)\n"
        "RSS / raw: %.3f\n",
        spec.sessions, spec.channels, absl::ToDoubleSeconds(took), raw / 1e6, *after / 1e6,
        *before / 1e6, ratio);
  }
  return absl::OkStatus();
}

absl::Status RunRestart() {
  RestartSpec spec;
  spec.server_binary = absl::GetFlag(FLAGS_server_binary);
  spec.scratch_dir = absl::GetFlag(FLAGS_scratch_dir);
  if (spec.server_binary.empty()) {
    return absl::InvalidArgumentError("--mode=restart needs --server_binary=PATH/qparams-server");
  }
  absl::StatusOr<FillSpec> fill = FillSpecFromFlags();
  if (!fill.ok()) return fill.status();
  spec.fill = *fill;
  absl::StatusOr<RestartResult> r = MeasureRestart(spec);
  if (!r.ok()) return r.status();
  const double seconds = absl::ToDoubleSeconds(r->restart_time);
  const double read = absl::ToDoubleSeconds(r->read_time);
  const double time_ratio = seconds / read;
  const double rss_ratio = static_cast<double>(r->rss_after_restart) / r->raw_bytes;
  const double before_ratio = static_cast<double>(r->rss_before_kill) / r->raw_bytes;
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << absl::StrFormat(
                     "{\"mode\": \"restart\", \"sessions\": %d, \"channels\": %d, "
                     "\"sessions_restored\": %d, \"data_dir_bytes\": %d, \"raw_bytes\": %d, "
                     "\"fill_seconds\": %.1f, \"read_seconds\": %.3f, "
                     "\"restart_seconds\": %.3f, \"restart_ratio\": %.3f, "
                     "\"rss_before_kill_bytes\": %d, \"rss_before_ratio\": %.4f, "
                     "\"rss_bytes\": %d, \"rss_ratio\": %.4f}",
                     spec.fill.sessions, spec.fill.channels, r->sessions_restored,
                     r->data_dir_bytes, r->raw_bytes, absl::ToDoubleSeconds(r->fill_time), read,
                     seconds, time_ratio, r->rss_before_kill, before_ratio, r->rss_after_restart,
                     rss_ratio)
              << std::endl;
  } else {
    std::cout << absl::StrFormat(
        "%d moving_average per-channel sessions of %d channels filled in %.1f s; "
        "the server killed (SIGKILL) and restarted\n"
        "data directory: %.1f MB, read once (cat to /dev/null) in %.3f s\n"
        "restart to serving: %.3f s (%.2fx the read), %d sessions restored\n"
        "server RSS / raw buffer bytes (%.1f MB): %.3f before the kill, %.3f after the "
        "restart\n",
        spec.fill.sessions, spec.fill.channels, absl::ToDoubleSeconds(r->fill_time),
        r->data_dir_bytes / 1e6, read, seconds, time_ratio, r->sessions_restored,
        r->raw_bytes / 1e6, before_ratio, rss_ratio);
  }
  if (r->sessions_restored != spec.fill.sessions) {
    return absl::DataLossError(
        absl::StrCat("restored ", r->sessions_restored, " sessions of ", spec.fill.sessions));
  }
  return absl::OkStatus();
}

absl::Status RunGroup() {
  GroupLatencySpec spec;
  spec.members = absl::GetFlag(FLAGS_members);
  spec.calls = absl::GetFlag(FLAGS_calls);
  spec.rounds = absl::GetFlag(FLAGS_rounds);
  absl::StatusOr<Shape> shape = ParseShape(absl::GetFlag(FLAGS_shape));
  if (!shape.ok()) return shape.status();
  spec.shape = *shape;
  absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  spec.dtype = *dtype;
  std::unique_ptr<QParamsServer> server;
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) {
    // The response carries every member's block scales: no receive limit in the way.
    absl::StatusOr<std::unique_ptr<QParamsServer>> started =
        StartServer(INT32_MAX, ServerOptions().engine.max_sessions);
    if (!started.ok()) return started.status();
    server = *std::move(started);
    target = server->address();
  }
  absl::StatusOr<GroupLatencyResult> r = MeasureGroupLatency(target, spec);
  if (!r.ok()) return r.status();
  LoadResult group, ref;
  group.latency_ns = r->latency_ns;
  ref.latency_ns = r->ref_latency_ns;
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << absl::StrFormat(
                     "{\"mode\": \"group\", \"shape\": \"%s\", \"dtype\": \"%s\", "
                     "\"members\": %d, \"calls\": %d, \"response_bytes\": %d, "
                     "\"p50_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, "
                     "\"ref_members\": 1, \"ref_response_bytes\": %d, \"ref_p50_us\": %.1f, "
                     "\"ref_p99_us\": %.1f, \"ref_mean_us\": %.1f}",
                     absl::GetFlag(FLAGS_shape), DTypeName(spec.dtype), spec.members,
                     r->latency_ns.size(), r->response_bytes, group.LatencyUs(0.5),
                     group.LatencyUs(0.99), MeanUs(r->latency_ns), r->ref_response_bytes,
                     ref.LatencyUs(0.5), ref.LatencyUs(0.99), MeanUs(r->ref_latency_ns))
              << std::endl;
  } else {
    std::cout << absl::StrFormat(
        "GetGroupQParams, GLOBAL_AMAX groups of NVFP4 weight sessions (%s %s each), %d calls "
        "each in %d round(s), sequential\n"
        "%-10s %8s %10s %9s %9s %9s\n"
        "%-10s %8d %10d %9.1f %9.1f %9.1f\n"
        "%-10s %8d %10d %9.1f %9.1f %9.1f\n",
        absl::GetFlag(FLAGS_shape), DTypeName(spec.dtype), r->latency_ns.size(), spec.rounds,
        "group", "members", "resp_bytes", "p50_us", "p99_us", "mean_us", "measured",
        spec.members, r->response_bytes, group.LatencyUs(0.5), group.LatencyUs(0.99),
        MeanUs(r->latency_ns), "reference", 1, r->ref_response_bytes, ref.LatencyUs(0.5),
        ref.LatencyUs(0.99), MeanUs(r->ref_latency_ns));
  }
  return absl::OkStatus();
}

absl::Status RunSteps() {
  StepBenchSpec spec;
  spec.server_binary = absl::GetFlag(FLAGS_server_binary);
  spec.scratch_dir = absl::GetFlag(FLAGS_scratch_dir);
  spec.sessions = absl::GetFlag(FLAGS_sessions);
  spec.ranks = absl::GetFlag(FLAGS_ranks);
  spec.lag = absl::GetFlag(FLAGS_lag);
  absl::StatusOr<Shape> shape = ParseShape(absl::GetFlag(FLAGS_input_shape));
  if (!shape.ok()) return shape.status();
  spec.input_shape = *shape;
  spec.calculator = absl::GetFlag(FLAGS_calculator);
  spec.server_cpus = absl::GetFlag(FLAGS_server_cpus);
  spec.client_cpus = absl::GetFlag(FLAGS_client_cpus);
  spec.durabilities = absl::StrSplit(absl::GetFlag(FLAGS_durabilities), ',', absl::SkipEmpty());
  spec.duration = absl::GetFlag(FLAGS_duration);
  spec.warmup = absl::GetFlag(FLAGS_warmup);
  spec.rounds = absl::GetFlag(FLAGS_rounds);
  spec.engine_steps = absl::GetFlag(FLAGS_engine_steps);
  spec.step_timeout = absl::GetFlag(FLAGS_step_timeout);
  return RunStepBench(spec, absl::GetFlag(FLAGS_json));
}

}  // namespace
}  // namespace qparams::bench

int main(int argc, char** argv) {
  qparams::TuneProcessForServing();
  absl::SetProgramUsageMessage(
      "qparams-bench --mode=observe|compute|stream|range|memory|restart|group|steps "
      "[--target=HOST:PORT] "
      "[--compare-echo] ...");
  // Accepts --compare-echo for --compare_echo (and so on) as ghz-style spellings.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> arg_ptrs;
  for (std::string& arg : args) {
    if (arg.rfind("--", 0) == 0) {
      const size_t end = std::min(arg.find('='), arg.size());
      std::replace(arg.begin() + 2, arg.begin() + end, '-', '_');
    }
    arg_ptrs.push_back(arg.data());
  }
  qparams::ParseFlags(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());

  const std::string mode = absl::GetFlag(FLAGS_mode);
  absl::Status status;
  if (mode == "memory") {
    status = qparams::bench::RunMemory();
  } else if (mode == "restart") {
    status = qparams::bench::RunRestart();
  } else if (mode == "group") {
    status = qparams::bench::RunGroup();
  } else if (mode == "steps") {
    status = qparams::bench::RunSteps();
  } else if (absl::StatusOr<qparams::bench::Mode> load = qparams::bench::ParseMode(mode);
             load.ok()) {
    status = qparams::bench::RunLoad(*load);
  } else {
    status = load.status();
  }
  if (!status.ok()) {
    std::cerr << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
              << std::endl;
    return 1;
  }
  return 0;
}

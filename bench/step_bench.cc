#include "bench/step_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/child_process.h"
#include "bench/load_generator.h"
#include "bench/session_fill.h"
#include "common/slot.h"
#include "core/status_macros.h"
#include "domain/engine.h"
#include "grpcpp/grpcpp.h"
#include "proto/status.h"
#include "qparams/v1/qparams.grpc.pb.h"

namespace qparams::bench {
namespace {

constexpr auto kCallDeadline = std::chrono::seconds(30);

// The range rank `rank` contributes to every session at every step: [-(1 + r/4), 2 + r/2].
std::pair<float, float> RankRange(int rank) { return {-1.0f - 0.25f * rank, 2.0f + 0.5f * rank}; }

absl::Status PinThisThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::OkStatus();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot pin to CPUs ", absl::StrJoin(cpus, ",")));
  }
  return absl::OkStatus();
}

std::vector<int> ThisThreadCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// The Cpus_allowed_list of /proc/PID/status: where the kernel runs the process.
std::string AllowedCpus(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "Cpus_allowed_list:")) {
      return std::string(absl::StripAsciiWhitespace(rest));
    }
  }
  return "?";
}

// The CPU time all processes have used (user, nice, system, irq, softirq and steal of
// /proc/stat), in seconds: with the server's and this process's, what others used.
double MachineBusySeconds() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return static_cast<double>(user + nice + system + irq + softirq + steal) / sysconf(_SC_CLK_TCK);
}

// GET /metrics of the server's metrics endpoint (HTTP/1.0, read to the close).
absl::StatusOr<std::string> FetchMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad metrics address ", address));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::ErrnoToStatus(errno, "socket");
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  std::string body;
  absl::Status status;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("cannot connect to ", address));
  } else {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: bench\r\nConnection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
      status = absl::ErrnoToStatus(errno, "cannot send the metrics request");
    }
    char buffer[16384];
    for (ssize_t n; status.ok() && (n = read(fd, buffer, sizeof buffer)) > 0;)
      body.append(buffer, n);
  }
  close(fd);
  if (!status.ok()) return status;
  return body;
}

// The value of the sample whose line starts with `series` followed by a space.
int64_t Sample(const std::string& metrics, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || !absl::ConsumePrefix(&line, " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line, &value)) return static_cast<int64_t>(value);
  }
  return 0;
}

struct Counts {
  int64_t step_calls = 0;     // Step calls finished OK, as the server counts them
  int64_t contributions = 0;  // contributions it took
  int64_t journal_bytes = 0;  // appended to its journal
};

absl::StatusOr<Counts> ServerCounts(const std::string& metrics_address) {
  QPARAMS_ASSIGN_OR_RETURN(const std::string metrics, FetchMetrics(metrics_address));
  return Counts{Sample(metrics, "qparams_calls_total{method=\"Step\",code=\"OK\"}"),
                Sample(metrics, "qparams_step_contributions_total"),
                Sample(metrics, "qparams_journal_appended_bytes_total")};
}

// What one durability's server measured, over its rounds.
struct ServerResult {
  std::string durability;
  std::string allowed_cpus;  // the server process's, from /proc
  int64_t steps = 0;         // applied in the measured windows
  double seconds = 0;
  double server_cpu_seconds = 0;
  double other_cpu_seconds = 0;  // used by every other process than the server and the bench
  Counts counted;                // by the server, in the measured windows
  LoadResult calls;              // the Step calls, timed by the ranks
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
  int64_t rss_start = 0;              // the server's resident memory with the sessions made
  int64_t rss_end = 0;                // and after the last round
  double engine_contribution_ns = 0;  // the engine alone
  double engine_read_ns = 0;

  int64_t contributions(const StepBenchSpec& spec) const {
    return steps * spec.ranks * spec.sessions;
  }
  double rate(const StepBenchSpec& spec) const {
    return seconds > 0 ? contributions(spec) / seconds : 0;
  }
  double rate_per_cpu_second(const StepBenchSpec& spec) const {
    return server_cpu_seconds > 0 ? contributions(spec) / server_cpu_seconds : 0;
  }
};

// One rank's prebuilt calls: its contributions to every session, with and without
// the reads (which the first `lag - 1` steps have none of).
struct Rank {
  std::unique_ptr<v1::QParamsService::Stub> stub;
  v1::StepRequest with_reads;
  v1::StepRequest without_reads;
};

// A server and its ranks' channels; the step the next phase starts at.
struct Server {
  std::string durability;
  std::unique_ptr<Child> process;  // null for none
  std::string address;
  std::string metrics_address;
  std::string data_dir;
  std::vector<Rank> ranks;
  int64_t next_step = 0;
  ServerResult result;
};

std::vector<std::string> SessionNames(const StepBenchSpec& spec) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < spec.sessions; ++i) names.push_back(absl::StrCat("steps/module-", i));
  return names;
}

v1::Tensor RangeTensor(const Shape& counts, float value) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  for (int64_t d : counts) t.add_shape(d);
  t.set_data(&value, sizeof value);
  return t;
}

// Starts a server (pinned to `server_cpus`: the spawning thread's affinity is what
// the child inherits) and creates the sessions; builds the ranks' requests.
absl::Status StartTarget(const StepBenchSpec& spec, const std::vector<int>& server_cpus,
                         const std::vector<int>& client_cpus, Server& target) {
  std::vector<std::string> argv = {spec.server_binary, "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0",
                                   absl::StrCat("--max_sessions=", spec.sessions + 16)};
  if (target.durability == "none") {
    argv.push_back("--durability=none");
  } else {
    std::string pattern = spec.scratch_dir + "/qparams-steps-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("cannot make a directory under ", spec.scratch_dir));
    }
    target.data_dir = pattern;
    argv.push_back(absl::StrCat("--data_dir=", pattern, "/data"));
    argv.push_back(absl::StrCat("--durability=", target.durability));
  }
  QPARAMS_RETURN_IF_ERROR(PinThisThread(server_cpus));
  absl::StatusOr<std::unique_ptr<Child>> child = Child::Spawn(argv, true, false);
  QPARAMS_RETURN_IF_ERROR(PinThisThread(client_cpus));
  if (!child.ok()) return child.status();
  target.process = *std::move(child);
  QPARAMS_ASSIGN_OR_RETURN(const std::string listening,
                           target.process->WaitForLine("listening on "));
  QPARAMS_ASSIGN_OR_RETURN(const std::string metrics,
                           target.process->WaitForLine("serving metrics on "));
  target.process->DrainLog();
  target.address = AddressIn(listening);
  target.metrics_address = AddressIn(metrics, "http://");
  target.result.durability = target.durability;
  target.result.allowed_cpus = AllowedCpus(target.process->pid());
  std::cerr << absl::StrFormat("steps bench: server (durability %s) pid %d on CPUs %s at %s%s\n",
                               target.durability, target.process->pid(), target.result.allowed_cpus,
                               target.address,
                               target.data_dir.empty() ? "" : ", data in " + target.data_dir);

  const std::vector<std::string> names = SessionNames(spec);
  const Shape counts(spec.input_shape.size(), 1);  // per_tensor: one block, the whole input
  for (int r = 0; r < spec.ranks; ++r) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per rank, as processes
    args.SetMaxReceiveMessageSize(64 << 20);
    Rank rank;
    rank.stub = v1::QParamsService::NewStub(
        grpc::CreateCustomChannel(target.address, grpc::InsecureChannelCredentials(), args));
    rank.with_reads.set_rank(r);
    rank.with_reads.set_world_size(spec.ranks);
    if (spec.step_timeout > absl::ZeroDuration()) {
      const int64_t ns = absl::ToInt64Nanoseconds(spec.step_timeout);
      rank.with_reads.mutable_step_timeout()->set_seconds(ns / 1000000000);
      rank.with_reads.mutable_step_timeout()->set_nanos(static_cast<int32_t>(ns % 1000000000));
    }
    const auto [lo, hi] = RankRange(r);
    for (const std::string& name : names) {
      v1::StepContribution* c = rank.with_reads.add_contributions();
      c->set_name(name);
      v1::RangeObservation* range = c->mutable_range();
      for (int64_t d : spec.input_shape) range->add_input_shape(d);
      *range->mutable_min() = RangeTensor(counts, lo);
      *range->mutable_max() = RangeTensor(counts, hi);
    }
    rank.without_reads = rank.with_reads;
    for (const std::string& name : names) rank.with_reads.add_reads()->set_name(name);
    target.ranks.push_back(std::move(rank));
  }
  target.result.request_bytes = target.ranks[0].with_reads.ByteSizeLong();

  v1::CreateSessionRequest create;
  create.set_calculator(spec.calculator);
  create.mutable_spec()->set_dtype("int8");
  create.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  create.mutable_spec()->set_target(v1::ACTIVATION);
  create.mutable_spec()->mutable_granularity()->mutable_per_tensor();
  for (const std::string& name : names) {
    create.set_name(name);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    context.AddMetadata(kSessionHeader, name);
    v1::Session session;
    const grpc::Status s = target.ranks[0].stub->CreateSession(&context, create, &session);
    if (!s.ok()) {
      return absl::Status(wire::FromGrpcStatus(s).code(),
                          absl::StrCat("CreateSession ", name, ": ", s.error_message()));
    }
  }
  QPARAMS_ASSIGN_OR_RETURN(target.result.rss_start,
                           ResidentBytes(absl::StrCat(target.process->pid())));
  return absl::OkStatus();
}

// One Step call of rank `r` at contributed step `step`; checks every answer.
absl::Status CallStep(const StepBenchSpec& spec, Rank& rank, int64_t step,
                      int64_t* response_bytes) {
  const int64_t read_step = step + 1 - spec.lag;
  v1::StepRequest& request = read_step >= 0 ? rank.with_reads : rank.without_reads;
  for (v1::StepContribution& c : *request.mutable_contributions()) c.set_step(step);
  for (v1::StepRead& read : *request.mutable_reads()) read.set_step(read_step);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  v1::StepResponse response;
  const grpc::Status s = rank.stub->Step(&context, request, &response);
  if (!s.ok()) {
    return absl::Status(
        wire::FromGrpcStatus(s).code(),
        absl::StrCat("Step of rank ", request.rank(), " at step ", step, ": ", s.error_message()));
  }
  if (response.contributions_size() != request.contributions_size() ||
      response.reads_size() != request.reads_size()) {
    return absl::InternalError("Step answered another number of items than it was sent");
  }
  for (const v1::StepContributionResult& c : response.contributions()) {
    if (c.status().code() != 0 || c.duplicate()) {
      return absl::InternalError(
          absl::StrCat("a contribution of rank ", request.rank(), " at step ", step,
                       " was refused or a duplicate: ", c.status().message()));
    }
  }
  for (const v1::StepReadResult& read : response.reads()) {
    if (read.status().code() != 0 || read.step() != read_step || !read.initialized()) {
      return absl::InternalError(absl::StrCat("a read as of step ", read_step, " answered step ",
                                              read.step(), ": ", read.status().message()));
    }
  }
  *response_bytes = response.ByteSizeLong();
  return absl::OkStatus();
}

// Runs every rank from target.next_step for `duration` (then each finishes the steps
// any rank started), and adds the window to target.result when `measure`.
absl::Status RunPhase(const StepBenchSpec& spec, Server& target, absl::Duration duration,
                      bool measure) {
  // The counters before the window, read before any rank thread exists.
  Counts before;
  double cpu_before = 0, self_before = 0, busy_before = 0;
  if (measure) {
    QPARAMS_ASSIGN_OR_RETURN(before, ServerCounts(target.metrics_address));
    QPARAMS_ASSIGN_OR_RETURN(cpu_before, ProcessCpuSeconds(target.process->pid()));
    QPARAMS_ASSIGN_OR_RETURN(self_before, ProcessCpuSeconds(getpid()));
    busy_before = MachineBusySeconds();
  }
  const int64_t first = target.next_step;
  absl::Mutex mu;
  int64_t end = INT64_MAX;                              // guarded by mu
  std::vector<int64_t> started(spec.ranks, first - 1);  // guarded by mu
  absl::Status error;                                   // guarded by mu
  std::vector<std::vector<int64_t>> latencies(spec.ranks);
  std::vector<int64_t> response_bytes(spec.ranks);
  absl::Notification go;
  std::vector<std::thread> threads;
  for (int r = 0; r < spec.ranks; ++r) {
    threads.emplace_back([&, r] {
      go.WaitForNotification();
      for (int64_t step = first;; ++step) {
        {
          absl::MutexLock lock(&mu);
          if (step >= end) return;
          started[r] = step;
        }
        const auto t0 = std::chrono::steady_clock::now();
        absl::Status s = CallStep(spec, target.ranks[r], step, &response_bytes[r]);
        latencies[r].push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - t0)
                                   .count());
        if (!s.ok()) {
          absl::MutexLock lock(&mu);
          if (error.ok()) error = std::move(s);
          end = 0;  // the others stop at their next step (or their reads' deadline)
          return;
        }
      }
    });
  }
  const absl::Time start = absl::Now();
  go.Notify();
  absl::SleepFor(duration);
  {
    absl::MutexLock lock(&mu);
    if (end != 0) end = *std::max_element(started.begin(), started.end()) + 1;
  }
  for (std::thread& t : threads) t.join();
  const absl::Time stop = absl::Now();
  QPARAMS_RETURN_IF_ERROR(error);
  target.next_step = end;
  if (!measure) return absl::OkStatus();
  const double busy_after = MachineBusySeconds();
  QPARAMS_ASSIGN_OR_RETURN(const double self_after, ProcessCpuSeconds(getpid()));
  QPARAMS_ASSIGN_OR_RETURN(const double cpu_after, ProcessCpuSeconds(target.process->pid()));
  QPARAMS_ASSIGN_OR_RETURN(const Counts after, ServerCounts(target.metrics_address));
  ServerResult& result = target.result;
  result.steps += end - first;
  result.seconds += absl::ToDoubleSeconds(stop - start);
  result.server_cpu_seconds += cpu_after - cpu_before;
  result.other_cpu_seconds +=
      (busy_after - busy_before) - (cpu_after - cpu_before) - (self_after - self_before);
  result.counted.step_calls += after.step_calls - before.step_calls;
  result.counted.contributions += after.contributions - before.contributions;
  result.counted.journal_bytes += after.journal_bytes - before.journal_bytes;
  result.response_bytes = *std::max_element(response_bytes.begin(), response_bytes.end());
  LoadResult phase;
  for (const std::vector<int64_t>& mine : latencies) {
    phase.latency_ns.insert(phase.latency_ns.end(), mine.begin(), mine.end());
  }
  std::sort(phase.latency_ns.begin(), phase.latency_ns.end());
  phase.requests = static_cast<int64_t>(phase.latency_ns.size());
  phase.seconds = absl::ToDoubleSeconds(stop - start);
  result.calls.Merge(phase);
  return absl::OkStatus();
}

// The engine alone on this thread, the same workload without gRPC: every rank's
// contribution to every session, then every rank's read of every session as of the
// step just applied (lag 1), `spec.engine_steps` times.
absl::Status MeasureEngine(const StepBenchSpec& spec, const std::string& durability,
                           const std::string& data_dir, ServerResult& result) {
  EngineOptions options;
  if (durability != "none") {
    options.journal.data_dir = data_dir + "/engine";
    options.journal.durability =
        durability == "always" ? Durability::kAlways : Durability::kBatched;
  }
  QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Open(options));
  QuantSpec quant;
  quant.dtype = "int8";
  quant.qscheme = QScheme::kAsymmetric;
  quant.target = Target::kActivation;
  const std::vector<std::string> names = SessionNames(spec);
  for (const std::string& name : names) {
    QPARAMS_RETURN_IF_ERROR(engine->CreateSession("", name, spec.calculator, quant, {}).status());
  }
  const Shape counts(spec.input_shape.size(), 1);
  std::vector<std::string> bytes;
  for (int r = 0; r < spec.ranks; ++r) {
    const auto [lo, hi] = RankRange(r);
    bytes.emplace_back(reinterpret_cast<const char*>(&lo), 4);
    bytes.emplace_back(reinterpret_cast<const char*>(&hi), 4);
  }
  std::vector<Observation> ranges;
  for (int r = 0; r < spec.ranks; ++r) {
    QPARAMS_ASSIGN_OR_RETURN(TensorView lo,
                             TensorView::Create(DType::kFloat32, counts, bytes[2 * r]));
    QPARAMS_ASSIGN_OR_RETURN(TensorView hi,
                             TensorView::Create(DType::kFloat32, counts, bytes[2 * r + 1]));
    ranges.push_back(Observation::FromRange(spec.input_shape, lo, hi));
  }
  absl::Duration contributing, reading;
  for (int64_t step = 0; step < spec.engine_steps; ++step) {
    absl::Time t0 = absl::Now();
    for (int r = 0; r < spec.ranks; ++r) {
      const std::optional<Observation> x = ranges[r];
      for (const std::string& name : names) {
        QPARAMS_RETURN_IF_ERROR(
            engine->Contribute("", name, step, r, spec.ranks, x, std::nullopt).status());
      }
    }
    const absl::Time t1 = absl::Now();
    for (int r = 0; r < spec.ranks; ++r) {
      for (const std::string& name : names) {
        QPARAMS_ASSIGN_OR_RETURN(Session::StepRead read,
                                 engine->ReadStep("", name, step, absl::InfinitePast()));
        if (read.step != step) return absl::InternalError("the engine read another step");
      }
    }
    if (step > 0) {  // the first step initializes: not timed
      contributing += t1 - t0;
      reading += absl::Now() - t1;
    }
  }
  const double items = static_cast<double>(spec.engine_steps - 1) * spec.ranks * spec.sessions;
  result.engine_contribution_ns = absl::ToDoubleNanoseconds(contributing) / items;
  result.engine_read_ns = absl::ToDoubleNanoseconds(reading) / items;
  return engine->Close();
}

std::string ShapeText(const Shape& shape) { return absl::StrJoin(shape, ","); }

void PrintJson(const StepBenchSpec& spec, const std::vector<Server>& targets) {
  std::vector<std::string> json = {
      "\"mode\": \"steps\"",
      absl::StrFormat("\"sessions\": %d", spec.sessions),
      absl::StrFormat("\"ranks\": %d", spec.ranks),
      absl::StrFormat("\"lag\": %d", spec.lag),
      absl::StrFormat("\"input_shape\": \"%s\"", ShapeText(spec.input_shape)),
      absl::StrFormat("\"calculator\": \"%s\"", spec.calculator),
      absl::StrFormat("\"server_cpus\": \"%s\"", spec.server_cpus),
      absl::StrFormat("\"client_cpus\": \"%s\"", spec.client_cpus),
      absl::StrFormat("\"rounds\": %d", spec.rounds)};
  for (const Server& t : targets) {
    const ServerResult& r = t.result;
    const std::string p = t.durability == "none"      ? "memory_"
                          : t.durability == "batched" ? "journal_"
                                                      : "always_";
    const double calls = static_cast<double>(spec.ranks) * r.steps;
    json.push_back(absl::StrFormat("\"%sdurability\": \"%s\"", p, r.durability));
    json.push_back(absl::StrFormat("\"%sserver_allowed_cpus\": \"%s\"", p, r.allowed_cpus));
    json.push_back(absl::StrFormat("\"%ssteps\": %d", p, r.steps));
    json.push_back(absl::StrFormat("\"%sseconds\": %.3f", p, r.seconds));
    json.push_back(absl::StrFormat("\"%ssteps_per_s\": %.1f", p, r.steps / r.seconds));
    json.push_back(absl::StrFormat("\"%scontributions_per_s\": %.0f", p, r.rate(spec)));
    json.push_back(
        absl::StrFormat("\"%sserver_cpu_util\": %.3f", p, r.server_cpu_seconds / r.seconds));
    json.push_back(
        absl::StrFormat("\"%scontributions_per_cpu_s\": %.0f", p, r.rate_per_cpu_second(spec)));
    // The cores other processes kept busy meanwhile: near 0 on a quiet machine.
    json.push_back(absl::StrFormat("\"%sother_load\": %.2f", p,
                                   std::max(0.0, r.other_cpu_seconds / r.seconds)));
    json.push_back(absl::StrFormat("\"%sserver_cpu_us_per_contribution\": %.3f", p,
                                   1e6 * r.server_cpu_seconds / r.contributions(spec)));
    json.push_back(
        absl::StrFormat("\"%srpcs_per_rank_step\": %.4f", p, r.counted.step_calls / calls));
    json.push_back(
        absl::StrFormat("\"%sserver_counted_contributions\": %d", p, r.counted.contributions));
    json.push_back(absl::StrFormat("\"%sjournal_bytes_per_contribution\": %.0f", p,
                                   static_cast<double>(r.counted.journal_bytes) /
                                       std::max<int64_t>(1, r.contributions(spec))));
    json.push_back(absl::StrFormat("\"%sp50_ms\": %.3f", p, r.calls.LatencyUs(0.5) / 1e3));
    json.push_back(absl::StrFormat("\"%sp99_ms\": %.3f", p, r.calls.LatencyUs(0.99) / 1e3));
    json.push_back(absl::StrFormat("\"%smax_ms\": %.3f", p, r.calls.LatencyUs(1.0) / 1e3));
    json.push_back(absl::StrFormat("\"%sserver_rss_start_mb\": %.1f", p, r.rss_start / 1e6));
    json.push_back(absl::StrFormat("\"%sserver_rss_end_mb\": %.1f", p, r.rss_end / 1e6));
    json.push_back(absl::StrFormat("\"%srequest_bytes\": %d", p, r.request_bytes));
    json.push_back(absl::StrFormat("\"%sresponse_bytes\": %d", p, r.response_bytes));
    json.push_back(
        absl::StrFormat("\"%sengine_contribution_ns\": %.0f", p, r.engine_contribution_ns));
    json.push_back(absl::StrFormat("\"%sengine_read_ns\": %.0f", p, r.engine_read_ns));
  }
  std::cout << "{" << absl::StrJoin(json, ", ") << "}" << std::endl;
}

void PrintTable(const StepBenchSpec& spec, const std::vector<Server>& targets) {
  std::cout << absl::StrFormat(
      "Step: %d ranks x %d %s per_tensor sessions (ranges of a [%s] float32 input), lag %d, "
      "one Step call per rank per step; server on CPUs %s, ranks on CPUs %s; %s in %d "
      "round(s) per server\n",
      spec.ranks, spec.sessions, spec.calculator, ShapeText(spec.input_shape), spec.lag,
      spec.server_cpus.empty() ? "any" : spec.server_cpus,
      spec.client_cpus.empty() ? "any" : spec.client_cpus, absl::FormatDuration(spec.duration),
      spec.rounds);
  std::cout << absl::StrFormat("%-8s %8s %12s %9s %14s %10s %8s %8s %11s %10s %6s\n", "durable",
                               "steps/s", "contrib/s", "srv_cpu", "contrib/cpu_s", "rpcs/rank",
                               "p50_ms", "p99_ms", "engine_c_ns", "engine_r_ns", "others");
  for (const Server& t : targets) {
    const ServerResult& r = t.result;
    std::cout << absl::StrFormat(
        "%-8s %8.1f %12.0f %9.3f %14.0f %10.3f %8.2f %8.2f %11.0f %10.0f %6.2f\n", r.durability,
        r.steps / r.seconds, r.rate(spec), r.server_cpu_seconds / r.seconds,
        r.rate_per_cpu_second(spec),
        r.counted.step_calls / (static_cast<double>(spec.ranks) * r.steps),
        r.calls.LatencyUs(0.5) / 1e3, r.calls.LatencyUs(0.99) / 1e3, r.engine_contribution_ns,
        r.engine_read_ns, std::max(0.0, r.other_cpu_seconds / r.seconds));
  }
  std::cout << absl::StrFormat("Step request %d bytes, response %d bytes",
                               targets[0].result.request_bytes, targets[0].result.response_bytes);
  for (const Server& t : targets) {
    std::cout << absl::StrFormat("; %s server RSS %.1f MB -> %.1f MB", t.durability,
                                 t.result.rss_start / 1e6, t.result.rss_end / 1e6);
    if (t.result.counted.journal_bytes == 0) continue;
    std::cout << absl::StrFormat(
        "; %s journal %.0f bytes per contribution", t.durability,
        static_cast<double>(t.result.counted.journal_bytes) / t.result.contributions(spec));
  }
  std::cout << "\n";
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text, const std::string& flag) {
  std::vector<int> cpus;
  if (text.empty()) return cpus;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(ends[0], &lo) || !absl::SimpleAtoi(ends.back(), &hi) || lo < 0 ||
        hi < lo || hi >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is \"", text, "\"; it must be CPUs like 0, 1-3 or 0,2"));
    }
    for (int cpu = lo; cpu <= hi; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

absl::Status RunStepBench(const StepBenchSpec& spec, bool json) {
  if (spec.server_binary.empty()) {
    return absl::InvalidArgumentError("--mode=steps needs --server_binary=PATH/qparams-server");
  }
  if (spec.sessions < 1 || spec.sessions > 10000 || spec.ranks < 1 || spec.ranks > 65536 ||
      spec.lag < 1 || spec.lag > 8 || spec.rounds < 1 || spec.engine_steps < 2 ||
      spec.duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--mode=steps needs --sessions in [1, 10000] (one call's items), --ranks in [1, "
        "65536], --lag in [1, 8], --rounds >= 1 and --duration > 0");
  }
  for (const std::string& d : spec.durabilities) {
    if (d != "none" && d != "batched" && d != "always") {
      return absl::InvalidArgumentError(
          absl::StrCat("--durabilities holds \"", d, "\"; none, batched or always"));
    }
  }
  QPARAMS_ASSIGN_OR_RETURN(std::vector<int> server_cpus,
                           ParseCpuList(spec.server_cpus, "--server_cpus"));
  QPARAMS_ASSIGN_OR_RETURN(std::vector<int> client_cpus,
                           ParseCpuList(spec.client_cpus, "--client_cpus"));
  // Unpinned means where this process may run: the server spawned with that, the
  // ranks back on it after each pinned spawn.
  if (server_cpus.empty()) server_cpus = ThisThreadCpus();
  if (client_cpus.empty()) client_cpus = ThisThreadCpus();
  // The ranks (and gRPC's threads, made from here on) run where this thread does.
  QPARAMS_RETURN_IF_ERROR(PinThisThread(client_cpus));

  std::vector<Server> targets(spec.durabilities.size());
  // Removes the data directories however the scenario ends, after the servers stop.
  struct Cleanup {
    std::vector<Server>& targets;
    ~Cleanup() {
      for (Server& t : targets) {
        t.ranks.clear();
        t.process.reset();
        std::error_code ignored;
        if (!t.data_dir.empty()) std::filesystem::remove_all(t.data_dir, ignored);
      }
    }
  } cleanup{targets};
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i].durability = spec.durabilities[i];
    QPARAMS_RETURN_IF_ERROR(StartTarget(spec, server_cpus, client_cpus, targets[i]));
  }
  for (int round = 0; round < spec.rounds; ++round) {
    for (Server& t : targets) {
      QPARAMS_RETURN_IF_ERROR(RunPhase(spec, t, spec.warmup, /*measure=*/false));
      QPARAMS_RETURN_IF_ERROR(RunPhase(spec, t, spec.duration / spec.rounds, /*measure=*/true));
    }
  }
  for (Server& t : targets) {
    QPARAMS_ASSIGN_OR_RETURN(t.result.rss_end, ResidentBytes(absl::StrCat(t.process->pid())));
    const int64_t expected = t.result.contributions(spec);
    if (t.result.counted.contributions != expected) {
      return absl::InternalError(
          absl::StrCat("the ", t.durability, " server counted ", t.result.counted.contributions,
                       " contributions in the windows; the ranks sent ", expected));
    }
    // The servers are idle from here: the engine alone runs beside them.
    QPARAMS_RETURN_IF_ERROR(MeasureEngine(
        spec, t.durability, t.data_dir.empty() ? spec.scratch_dir : t.data_dir, t.result));
  }
  if (json) {
    PrintJson(spec, targets);
  } else {
    PrintTable(spec, targets);
  }
  return absl::OkStatus();
}

}  // namespace qparams::bench

#include "bench/load_generator.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/slot.h"
#include "core/granularity.h"
#include "core/range.h"
#include "grpcpp/grpcpp.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "qparams/client.h"
#include "qparams/v1/qparams.grpc.pb.h"

namespace qparams::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kChannelSlackBytes = 1 << 20;  // headers and framing around a request

// `count` normally distributed values (fixed seed) encoded in `dtype`.
std::string RandomTensorBytes(DType dtype, int64_t count) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::string bytes(count * ItemSize(dtype), '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float v = normal(rng);
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(&bytes[4 * i], &v, 4);
        break;
      case DType::kFloat64: {
        const double d = v;
        std::memcpy(&bytes[8 * i], &d, 8);
        break;
      }
      case DType::kFloat16: {
        const uint16_t h = FloatToHalf(v);
        std::memcpy(&bytes[2 * i], &h, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t b = FloatToBFloat16(v);
        std::memcpy(&bytes[2 * i], &b, 2);
        break;
      }
    }
  }
  return bytes;
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target, int64_t max_bytes) {
  grpc::ChannelArguments args;
  const int limit = static_cast<int>(std::min<int64_t>(max_bytes + kChannelSlackBytes, INT32_MAX));
  args.SetMaxSendMessageSize(limit);
  args.SetMaxReceiveMessageSize(limit);
  // A channel of its own, not one shared through gRPC's subchannel pool, so that
  // each run starts from a fresh connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// The call's status, its message prefixed with `method`.
absl::Status Named(absl::string_view method, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(method, ": ", status.message()));
}

absl::Status FromGrpc(absl::string_view method, const grpc::Status& status) {
  return Named(method, wire::FromGrpcStatus(status));
}

double ProcessCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Collects the first failure of any worker.
class FirstError {
 public:
  void Set(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(status);
  }
  absl::Status Get() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<Mode> ParseMode(absl::string_view name) {
  for (Mode mode : {Mode::kCompute, Mode::kObserve, Mode::kStream, Mode::kRange}) {
    if (name == ModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--mode is \"", name, "\"; it must be compute, observe, stream or range"));
}

absl::string_view ModeName(Mode mode) {
  switch (mode) {
    case Mode::kCompute:
      return "compute";
    case Mode::kObserve:
      return "observe";
    case Mode::kStream:
      return "stream";
    case Mode::kRange:
      return "range";
  }
  return "?";
}

double LoadResult::LatencyUs(double q) const {
  if (latency_ns.empty()) return 0;
  const size_t i = std::min(latency_ns.size() - 1,
                            static_cast<size_t>(std::ceil(q * latency_ns.size())) -
                                (q > 0 ? 1 : 0));
  return latency_ns[i] / 1e3;
}

void LoadResult::Merge(const LoadResult& other) {
  requests += other.requests;
  seconds += other.seconds;
  cpu_seconds += other.cpu_seconds;
  std::vector<int64_t> merged;
  merged.reserve(latency_ns.size() + other.latency_ns.size());
  std::merge(latency_ns.begin(), latency_ns.end(), other.latency_ns.begin(),
             other.latency_ns.end(), std::back_inserter(merged));
  latency_ns = std::move(merged);
  request_bytes = other.request_bytes;
  covered_bytes = other.covered_bytes;
}

absl::StatusOr<LoadGenerator> LoadGenerator::Create(const LoadSpec& spec) {
  if (spec.concurrency < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--concurrency is ", spec.concurrency, "; it must be >= 1"));
  }
  absl::StatusOr<int64_t> count = NumElements(spec.shape, "--shape");
  if (!count.ok()) return count.status();
  if (*count == 0) return absl::InvalidArgumentError("--shape has no elements");

  LoadGenerator generator;
  generator.spec_ = spec;
  generator.quant_spec_.set_dtype("int8");
  generator.quant_spec_.set_target(v1::ACTIVATION);
  *generator.quant_spec_.mutable_granularity() = spec.granularity;

  const std::string bytes = RandomTensorBytes(spec.dtype, *count);
  absl::StatusOr<TensorView> tensor = TensorView::Create(spec.dtype, spec.shape, bytes);
  if (!tensor.ok()) return tensor.status();

  // Every worker has its own session; names differ between processes so that several
  // benches can share a server.
  const std::string prefix = absl::StrCat("bench-", getpid(), "-",
                                          absl::ToUnixNanos(absl::Now()) % 1000000, "-",
                                          spec.calculator, "-");
  BlockRange range;
  if (spec.mode == Mode::kRange) {
    absl::StatusOr<Granularity> granularity =
        wire::GranularityFromProto(spec.granularity, "--granularity");
    if (!granularity.ok()) return granularity.status();
    absl::StatusOr<Shape> block = granularity->BlockShape(spec.shape, Target::kActivation);
    if (!block.ok()) return block.status();
    absl::StatusOr<BlockRange> reduced = ObserveRange(*tensor, *block);
    if (!reduced.ok()) return reduced.status();
    range = *std::move(reduced);
  }
  for (int i = 0; i < spec.concurrency; ++i) {
    generator.sessions_.push_back(absl::StrCat(prefix, i));
    generator.observe_requests_.push_back(
        spec.mode == Mode::kRange
            ? RangeObservation(generator.sessions_.back(), spec.shape, range.min.view(),
                               range.max.view())
            : TensorObservation(generator.sessions_.back(), *tensor));
    generator.observe_requests_.back().set_omit_qparams(spec.omit_qparams);
  }
  if (spec.mode == Mode::kCompute) {
    generator.compute_request_.set_calculator("dynamic");
    *generator.compute_request_.mutable_spec() = generator.quant_spec_;
    *generator.compute_request_.mutable_tensor() = generator.observe_requests_[0].tensor();
    generator.result_template_.request_bytes = generator.compute_request_.ByteSizeLong();
  } else {
    generator.result_template_.request_bytes = generator.observe_requests_[0].ByteSizeLong();
  }
  generator.result_template_.covered_bytes = static_cast<int64_t>(bytes.size());
  return generator;
}

absl::Status LoadGenerator::CreateSessions(const std::string& target) const {
  return ForEachSession(target, [&](v1::QParamsService::Stub& stub, const std::string& name,
                                    grpc::ClientContext* context) {
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator(spec_.calculator);
    *request.mutable_spec() = quant_spec_;
    v1::Session session;
    return FromGrpc("CreateSession", stub.CreateSession(context, request, &session));
  });
}

absl::Status LoadGenerator::DeleteSessions(const std::string& target) const {
  return ForEachSession(target, [&](v1::QParamsService::Stub& stub, const std::string& name,
                                    grpc::ClientContext* context) {
    v1::DeleteSessionRequest request;
    request.set_name(name);
    v1::DeleteSessionResponse response;
    return FromGrpc("DeleteSession", stub.DeleteSession(context, request, &response));
  });
}

absl::Status LoadGenerator::ForEachSession(
    const std::string& target,
    const std::function<absl::Status(v1::QParamsService::Stub&, const std::string&,
                                     grpc::ClientContext*)>& call) const {
  if (spec_.mode == Mode::kCompute) return absl::OkStatus();
  auto stub = v1::QParamsService::NewStub(NewChannel(target, max_request_bytes()));
  for (const std::string& name : sessions_) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    context.AddMetadata(kSessionHeader, name);
    if (absl::Status s = call(*stub, name, &context); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> LoadGenerator::Run(const std::string& target,
                                              absl::Duration duration) const {
  std::shared_ptr<grpc::Channel> channel = NewChannel(target, max_request_bytes());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", target));
  }
  std::unique_ptr<v1::QParamsService::Stub> stub = v1::QParamsService::NewStub(channel);

  const Clock::time_point measure_begin = Clock::now() + absl::ToChronoNanoseconds(spec_.warmup);
  const Clock::time_point end = measure_begin + absl::ToChronoNanoseconds(duration);
  FirstError error;
  std::vector<std::vector<int64_t>> latencies(spec_.concurrency);
  std::vector<Clock::time_point> last_done(spec_.concurrency, measure_begin);

  // Runs `call` back to back until the window closes, timing the calls that start
  // inside it.
  auto drive = [&](int worker, auto call) {
    std::vector<int64_t>& mine = latencies[worker];
    for (;;) {
      const Clock::time_point t0 = Clock::now();
      if (t0 >= end) return;
      if (absl::Status s = call(); !s.ok()) {
        error.Set(std::move(s));
        return;
      }
      const Clock::time_point t1 = Clock::now();
      if (t0 >= measure_begin) {
        mine.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
        last_done[worker] = t1;
      }
    }
  };

  const int64_t run = runs_->fetch_add(1);
  auto worker = [&](int i) {
    // With keys, a copy whose sequence each call advances (as a client's would).
    v1::ObserveRequest keyed;
    if (spec_.idempotency_keys) {
      keyed = observe_requests_[i];
      keyed.set_client_id(absl::StrCat("bench-", getpid(), "-", run, "-", i));
    }
    const v1::ObserveRequest& observe = spec_.idempotency_keys ? keyed : observe_requests_[i];
    auto next_key = [&] {
      if (spec_.idempotency_keys) keyed.set_sequence(keyed.sequence() + 1);
    };
    switch (spec_.mode) {
      case Mode::kCompute:
        drive(i, [&] {
          grpc::ClientContext context;
          v1::ComputeResponse response;
          return FromGrpc("Compute", stub->Compute(&context, compute_request_, &response));
        });
        return;
      case Mode::kObserve:
      case Mode::kRange:
        drive(i, [&] {
          next_key();
          grpc::ClientContext context;
          context.AddMetadata(kSessionHeader, observe.name());
          v1::ObserveResponse response;
          return FromGrpc("Observe", stub->Observe(&context, observe, &response));
        });
        return;
      case Mode::kStream: {
        grpc::ClientContext context;
        // Every message of the worker's stream names its one session.
        context.AddMetadata(kSessionHeader, observe.name());
        auto stream = stub->ObserveStream(&context);
        v1::ObserveResponse response;
        drive(i, [&] {
          next_key();
          if (!stream->Write(observe) || !stream->Read(&response)) {
            return absl::UnavailableError("ObserveStream: the stream broke");
          }
          return Named("ObserveStream", wire::FromRpcStatus(response.status()));
        });
        stream->WritesDone();
        if (absl::Status s = FromGrpc("ObserveStream", stream->Finish()); !s.ok()) {
          error.Set(std::move(s));
        }
        return;
      }
    }
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < spec_.concurrency; ++i) threads.emplace_back(worker, i);
  std::this_thread::sleep_until(measure_begin);
  const double cpu_begin = ProcessCpuSeconds();
  for (std::thread& t : threads) t.join();
  const double cpu_end = ProcessCpuSeconds();
  if (absl::Status s = error.Get(); !s.ok()) return s;

  LoadResult result = result_template_;
  result.cpu_seconds = cpu_end - cpu_begin;
  const Clock::time_point window_end = *std::max_element(last_done.begin(), last_done.end());
  result.seconds = std::chrono::duration<double>(window_end - measure_begin).count();
  for (const std::vector<int64_t>& mine : latencies) {
    result.latency_ns.insert(result.latency_ns.end(), mine.begin(), mine.end());
  }
  std::sort(result.latency_ns.begin(), result.latency_ns.end());
  result.requests = static_cast<int64_t>(result.latency_ns.size());
  return result;
}

}  // namespace qparams::bench

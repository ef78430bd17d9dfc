#include "server/call_metrics.h"

#include <array>
#include <atomic>
#include <chrono>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "qparams/v1/qparams.grpc.pb.h"

namespace qparams {

// One method's series, one slot per gRPC code, filled on the code's first call.
struct CallMetricsInterceptorFactory::Method {
  static constexpr int kCodes = 17;  // OK .. UNAUTHENTICATED

  void Record(grpc::StatusCode status, double seconds) {
    int code = static_cast<int>(status);
    if (code < 0 || code >= kCodes) code = grpc::StatusCode::UNKNOWN;
    Counter* counter = calls[code].load(std::memory_order_acquire);
    BucketHistogram* histogram = durations[code].load(std::memory_order_acquire);
    if (counter == nullptr || histogram == nullptr) {
      // Racing threads get the same series from the family.
      const std::vector<std::string> labels = {
          name, absl::StatusCodeToString(static_cast<absl::StatusCode>(code))};
      counter = metrics->calls()->WithLabels(labels);
      histogram = metrics->call_seconds()->WithLabels(labels);
      calls[code].store(counter, std::memory_order_release);
      durations[code].store(histogram, std::memory_order_release);
    }
    counter->Increment();
    histogram->Observe(seconds);
  }

  const ServerMetrics* metrics = nullptr;
  std::string name;  // "Observe"
  std::array<std::atomic<Counter*>, kCodes> calls{};
  std::array<std::atomic<BucketHistogram*>, kCodes> durations{};
};

namespace {

class CallMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit CallMetricsInterceptor(CallMetricsInterceptorFactory::Method* method)
      : method_(method), start_(std::chrono::steady_clock::now()) {}

  ~CallMetricsInterceptor() override {
    if (!recorded_.load(std::memory_order_acquire)) Record(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  // The status goes out once per call, in one batch, so no two hooks record. The
  // server context that destroys this interceptor may do it on another thread than
  // the one that sent the status: gRPC orders the two, but through synchronization
  // ThreadSanitizer does not see, so recorded_ is atomic.
  void Record(grpc::StatusCode code) {
    recorded_.store(true, std::memory_order_release);
    method_->Record(
        code, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

  CallMetricsInterceptorFactory::Method* const method_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<bool> recorded_{false};
};

}  // namespace

CallMetricsInterceptorFactory::CallMetricsInterceptorFactory(const ServerMetrics* metrics) {
  // Every method of the services, from their descriptors: one added later is counted
  // too.
  for (const char* name :
       {v1::QParamsService::service_full_name(), v1::ClusterAdmin::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      auto method = std::make_unique<Method>();
      method->metrics = metrics;
      method->name = service->method(i)->name();
      methods_.emplace(absl::StrCat("/", service->full_name(), "/", method->name),
                       std::move(method));
    }
  }
}

CallMetricsInterceptorFactory::~CallMetricsInterceptorFactory() = default;

grpc::experimental::Interceptor* CallMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (info->method() == nullptr) return nullptr;
  auto it = methods_.find(absl::string_view(info->method()));
  if (it == methods_.end()) return nullptr;
  return new CallMetricsInterceptor(it->second.get());
}

}  // namespace qparams

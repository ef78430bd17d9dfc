#include "bench/session_fill.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/status.h"
#include "qparams/v1/qparams.grpc.pb.h"

namespace qparams::bench {

absl::Status FillSessions(const std::string& target, const FillSpec& spec) {
  auto stub = v1::QParamsService::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  v1::CreateSessionRequest create;
  create.set_calculator("moving_average");
  create.mutable_spec()->set_dtype("int8");
  create.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  create.mutable_spec()->set_target(v1::ACTIVATION);
  create.mutable_spec()->mutable_granularity()->mutable_per_channel()->set_axis(0);

  v1::ObserveRequest observe;
  v1::Tensor* tensor = observe.mutable_tensor();
  tensor->set_dtype(v1::FLOAT32);
  tensor->add_shape(spec.channels);
  tensor->add_shape(1);
  std::vector<float> values(spec.channels);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& v : values) v = normal(rng);
  tensor->set_data(values.data(), values.size() * sizeof(float));

  std::atomic<int64_t> next{0};
  absl::Mutex mu;
  absl::Status first_error;
  auto worker = [&] {
    v1::CreateSessionRequest my_create = create;
    v1::ObserveRequest my_observe = observe;
    for (int64_t i = next++; i < spec.sessions; i = next++) {
      const std::string name = absl::StrCat("memory-", i);
      my_create.set_name(name);
      my_observe.set_name(name);
      grpc::ClientContext create_context;
      v1::Session session;
      grpc::Status status = stub->CreateSession(&create_context, my_create, &session);
      if (status.ok()) {
        grpc::ClientContext observe_context;
        v1::ObserveResponse response;
        status = stub->Observe(&observe_context, my_observe, &response);
      }
      if (!status.ok()) {
        absl::MutexLock lock(&mu);
        if (first_error.ok()) {
          const absl::Status error = wire::FromGrpcStatus(status);
          first_error =
              absl::Status(error.code(), absl::StrCat("session ", name, ": ", error.message()));
        }
        next = spec.sessions;  // stops the others
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < spec.concurrency; ++i) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu);
  return first_error;
}

absl::StatusOr<int64_t> ResidentBytes(const std::string& process) {
  const std::string path = absl::StrCat("/proc/", process, "/status");
  std::ifstream status(path);
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    int64_t kib;
    if (absl::ConsumeSuffix(&rest, " kB") && absl::SimpleAtoi(rest, &kib)) return kib * 1024;
  }
  return absl::InternalError(absl::StrCat("no VmRSS line in ", path));
}

}  // namespace qparams::bench

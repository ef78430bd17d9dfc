// The commands that name no session: calculators, compute (a tensor's qparams,
// stored nowhere) and health.

#include <optional>

#include "tools/cli_internal.h"
#include "tools/npy.h"

namespace qparams::cli {

using grpc::health::v1::HealthCheckResponse;

int Calculators(Invocation& in) { return in.PrintResult(in.client().ListCalculators()); }

int Compute(Invocation& in) {
  absl::StatusOr<v1::QuantSpec> spec = BuildSpec(in.options().spec);
  if (!spec.ok()) return Usage(in.err(), spec.status().message());
  absl::StatusOr<Tensor> tensor = ReadNpy(in.arg(0), in.dtype());
  if (!tensor.ok()) return in.Fail(tensor.status());
  absl::StatusOr<v1::QParams> qparams =
      in.client().Compute(in.options().calculator, *spec, tensor->view());
  if (!qparams.ok()) return in.Fail(qparams.status());
  v1::ComputeResponse response;
  *response.mutable_qparams() = *std::move(qparams);
  in.Print(response);
  return kExitOk;
}

int Health(Invocation& in) {
  absl::StatusOr<HealthCheckResponse::ServingStatus> status =
      in.client().Health(in.arg_count() > 0 ? in.arg(0) : "");
  if (!status.ok()) return in.Fail(status.status());
  HealthCheckResponse response;
  response.set_status(*status);
  in.Print(response);
  return *status == HealthCheckResponse::SERVING ? kExitOk : kExitFailed;
}

}  // namespace qparams::cli

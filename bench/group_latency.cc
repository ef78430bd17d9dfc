#include "bench/group_latency.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/granularity.h"
#include "core/range.h"
#include "grpcpp/grpcpp.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "qparams/v1/qparams.grpc.pb.h"

namespace qparams::bench {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status Check(absl::string_view method, const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const absl::Status s = wire::FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat(method, ": ", s.message()));
}

// `count` N(0, 0.02) values times `factor`, encoded in `dtype` (float32 or the 16-bit
// types; the weight's dtype).
std::string WeightBytes(DType dtype, int64_t count, float factor, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::string bytes(count * ItemSize(dtype), '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float v = normal(rng) * factor;
    if (dtype == DType::kFloat32) {
      std::memcpy(&bytes[4 * i], &v, 4);
    } else if (dtype == DType::kFloat64) {
      const double d = v;
      std::memcpy(&bytes[8 * i], &d, 8);
    } else {
      const uint16_t b = dtype == DType::kBFloat16 ? FloatToBFloat16(v) : FloatToHalf(v);
      std::memcpy(&bytes[2 * i], &b, 2);
    }
  }
  return bytes;
}

}  // namespace

double MeanUs(const std::vector<int64_t>& ns) {
  if (ns.empty()) return 0;
  double total = 0;
  for (int64_t v : ns) total += static_cast<double>(v);
  return total / ns.size() / 1e3;
}

absl::StatusOr<GroupLatencyResult> MeasureGroupLatency(const std::string& target,
                                                       const GroupLatencySpec& spec) {
  if (spec.members < 1 || spec.calls < 1 || spec.rounds < 1 || spec.warmup_calls < 0) {
    return absl::InvalidArgumentError(
        "--members, --calls and --rounds must be >= 1 (and --warmup_calls >= 0)");
  }
  if (spec.shape.size() != 2 || spec.shape[1] % 16 != 0) {
    return absl::InvalidArgumentError(
        "--mode=group takes a weight --shape=OUT,IN with IN a multiple of 16");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(INT32_MAX);
  args.SetMaxSendMessageSize(INT32_MAX);
  std::unique_ptr<v1::QParamsService::Stub> stub = v1::QParamsService::NewStub(
      grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));

  // One hash tag for every name: a sharded server keeps a group with its members.
  const std::string tag = absl::StrCat("{bench-group-", getpid(), "-",
                                       absl::ToUnixNanos(absl::Now()) % 1000000, "}");
  v1::CreateSessionRequest create;
  create.set_calculator("static");
  v1::QuantSpec* qspec = create.mutable_spec();
  qspec->set_dtype("float4_e2m1fn_x2");
  qspec->set_scale_dtype("float8_e4m3fn");
  qspec->set_convention("compressed_tensors");
  qspec->set_target(v1::WEIGHT);
  qspec->mutable_granularity()->mutable_per_block()->set_axis(-1);
  qspec->mutable_granularity()->mutable_per_block()->add_block_size(16);

  const Shape block = {1, 16};
  const int64_t count = spec.shape[0] * spec.shape[1];
  std::mt19937 rng(12);
  std::vector<std::string> members;
  absl::Status status;
  for (int i = 0; i < spec.members && status.ok(); ++i) {
    members.push_back(absl::StrCat(tag, ".m", i));
    create.set_name(members.back());
    grpc::ClientContext create_context;
    v1::Session session;
    status = Check("CreateSession", stub->CreateSession(&create_context, create, &session));
    if (!status.ok()) break;
    const std::string bytes =
        WeightBytes(spec.dtype, count, 1.0f + static_cast<float>(i) / spec.members, rng);
    absl::StatusOr<TensorView> weight = TensorView::Create(spec.dtype, spec.shape, bytes);
    if (!weight.ok()) return weight.status();
    absl::StatusOr<BlockRange> range = ObserveRange(*weight, block);
    if (!range.ok()) return range.status();
    v1::ObserveRequest observe;
    observe.set_name(members.back());
    observe.set_omit_qparams(true);
    for (int64_t d : spec.shape) observe.mutable_range()->add_input_shape(d);
    *observe.mutable_range()->mutable_min() = wire::TensorToProto(range->min.view());
    *observe.mutable_range()->mutable_max() = wire::TensorToProto(range->max.view());
    grpc::ClientContext observe_context;
    v1::ObserveResponse response;
    status = Check("Observe", stub->Observe(&observe_context, observe, &response));
  }

  const std::string names[2] = {tag + ".group", tag + ".ref"};
  GroupLatencyResult result;
  std::vector<int64_t>* latencies[2] = {&result.latency_ns, &result.ref_latency_ns};
  int64_t* response_bytes[2] = {&result.response_bytes, &result.ref_response_bytes};
  int groups_created = 0;
  for (int g = 0; g < 2 && status.ok(); ++g) {
    v1::CreateScaleGroupRequest request;
    request.mutable_group()->set_name(names[g]);
    request.mutable_group()->set_share(v1::ScaleGroup::GLOBAL_AMAX);
    for (int i = 0; i < (g == 0 ? spec.members : 1); ++i) {
      request.mutable_group()->add_members(members[i]);
    }
    grpc::ClientContext context;
    v1::ScaleGroup group;
    status = Check("CreateScaleGroup", stub->CreateScaleGroup(&context, request, &group));
    if (status.ok()) ++groups_created;
  }

  // The groups take turns, each round a share of the calls after a few unmeasured ones.
  for (int r = 0; r < spec.rounds && status.ok(); ++r) {
    const int64_t calls = spec.calls * (r + 1) / spec.rounds - spec.calls * r / spec.rounds;
    for (int g = 0; g < 2 && status.ok(); ++g) {
      v1::GetGroupQParamsRequest request;
      request.set_name(names[g]);
      for (int64_t c = -spec.warmup_calls; c < calls && status.ok(); ++c) {
        grpc::ClientContext context;
        v1::GroupQParams reply;
        const Clock::time_point start = Clock::now();
        const grpc::Status s = stub->GetGroupQParams(&context, request, &reply);
        const int64_t ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        status = Check("GetGroupQParams", s);
        if (status.ok() && !reply.initialized()) {
          status = absl::InternalError(absl::StrCat("group ", names[g], " is not initialized"));
        }
        if (!status.ok() || c < 0) continue;
        latencies[g]->push_back(ns);
        *response_bytes[g] = static_cast<int64_t>(reply.ByteSizeLong());
      }
    }
  }

  // Cleanup whatever happened; the first error wins.
  for (int g = 0; g < groups_created; ++g) {
    grpc::ClientContext context;
    v1::DeleteScaleGroupRequest request;
    request.set_name(names[g]);
    v1::DeleteScaleGroupResponse response;
    absl::Status s = Check("DeleteScaleGroup", stub->DeleteScaleGroup(&context, request, &response));
    if (status.ok()) status = s;
  }
  for (const std::string& name : members) {
    grpc::ClientContext context;
    v1::DeleteSessionRequest request;
    request.set_name(name);
    v1::DeleteSessionResponse response;
    absl::Status s = Check("DeleteSession", stub->DeleteSession(&context, request, &response));
    if (status.ok() && absl::IsNotFound(s)) s = absl::OkStatus();
    if (status.ok()) status = s;
  }
  if (!status.ok()) return status;
  std::sort(result.latency_ns.begin(), result.latency_ns.end());
  std::sort(result.ref_latency_ns.begin(), result.ref_latency_ns.end());
  return result;
}

}  // namespace qparams::bench

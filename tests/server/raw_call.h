// Calls of qparams.v1 without typed stubs, for tests that call every method alike
// (security_test.cc's table) or need requests written as text: one generic path
// whatever a method's kind, and a health check.

#ifndef QPARAMS_TESTS_RAW_CALL_H_
#define QPARAMS_TESTS_RAW_CALL_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "qparams/v1/qparams.pb.h"
#include "tests/support/test_util.h"

namespace qparams::testing {

inline constexpr char kService[] = "qparams.v1.QParamsService";
// Cluster control (the admin calls), apart from kService's data path.
inline constexpr char kAdminService[] = "qparams.v1.ClusterAdmin";

// The services of qparams.v1, as the descriptor pool knows them.
inline std::vector<const google::protobuf::ServiceDescriptor*> Services() {
  std::vector<const google::protobuf::ServiceDescriptor*> services;
  for (const char* name : {kService, kAdminService}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    EXPECT_NE(service, nullptr) << name;
    if (service != nullptr) services.push_back(service);
  }
  return services;
}

// The gRPC path of `method` ("/qparams.v1.QParamsService/Observe",
// "/qparams.v1.ClusterAdmin/SetSlotMap"): of the service that declares it.
inline std::string Path(const std::string& method) {
  for (const google::protobuf::ServiceDescriptor* service : Services()) {
    if (service->FindMethodByName(method) != nullptr) {
      return absl::StrCat("/", service->full_name(), "/", method);
    }
  }
  ADD_FAILURE() << "no service of qparams.v1 declares " << method;
  return absl::StrCat("/", kService, "/", method);
}

struct Reply {
  grpc::Status status;
  std::vector<std::string> messages;  // every response, serialized
};

inline std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Calls `method` ("/package.Service/Method") with `requests` (serialized) and reads
// every response. Over gRPC's sync bidi-streaming call whatever the method's kind:
// on the wire unary, client-, server- and bidi-streaming calls are alike (messages
// each way, the client's half-close, a status), only the server tells them apart.
inline Reply CallRaw(grpc::Channel* channel, const std::string& method,
                     const std::vector<std::string>& requests,
                     const std::optional<std::string>& authorization,
                     std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  if (authorization) context.AddMetadata("authorization", *authorization);
  const grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel, rpc, &context));
  for (const std::string& request : requests) {
    grpc::Slice slice(request);
    if (!stream->Write(grpc::ByteBuffer(&slice, 1))) break;
  }
  stream->WritesDone();
  Reply reply;
  grpc::ByteBuffer buffer;
  while (stream->Read(&buffer)) reply.messages.push_back(Bytes(buffer));
  reply.status = stream->Finish();
  return reply;
}
inline std::string Bearer(const std::string& token) { return absl::StrCat("Bearer ", token); }

// `text` (protobuf text format) as a serialized M.
template <typename M>
std::vector<std::string> TextRequest(const std::string& text) {
  M m;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &m)) << text;
  return {m.SerializeAsString()};
}

inline const std::string kInt8Spec =
    "spec { dtype: 'int8' qscheme: SYMMETRIC granularity { per_tensor {} } target: WEIGHT }";
inline v1::ObserveRequest ObserveReq(const std::string& name) {
  v1::ObserveRequest r;
  r.set_name(name);
  r.mutable_tensor()->set_dtype(v1::FLOAT32);
  r.mutable_tensor()->add_shape(4);
  r.mutable_tensor()->set_data(Encode(DType::kFloat32, {-1, 0.5, 2, 3}));
  return r;
}
// A Compute of `tensor`.
inline std::string ComputeReq(const v1::Tensor& tensor) {
  v1::ComputeRequest r;
  google::protobuf::TextFormat::ParseFromString(absl::StrCat("calculator: 'dynamic' ", kInt8Spec),
                                                &r);
  *r.mutable_tensor() = tensor;
  return r.SerializeAsString();
}

// gRPC health says SERVING (whole server and the service) and `good` is OK.
inline void ExpectHealthy(grpc::Channel* channel, const std::string& good_method,
                          const std::vector<std::string>& good,
                          const std::optional<std::string>& authorization) {
  for (const std::string service : {"", kService}) {
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    const Reply reply = CallRaw(channel, "/grpc.health.v1.Health/Check",
                                {request.SerializeAsString()}, std::nullopt);
    ASSERT_TRUE(reply.status.ok()) << "health: " << reply.status.error_message();
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_EQ(reply.messages.size(), 1u);
    ASSERT_TRUE(response.ParseFromString(reply.messages[0]));
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  const Reply reply = CallRaw(channel, Path(good_method), good, authorization);
  EXPECT_TRUE(reply.status.ok()) << good_method << ": " << reply.status.error_message();
}

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_RAW_CALL_H_

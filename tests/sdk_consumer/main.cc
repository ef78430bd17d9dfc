// Computes the qparams of [0, 1, 2, 3] (the default spec) on the server at argv[1]
// through the installed C++ SDK, and prints the scale: what a consumer of
// find_package(qparams) does first.
#include <cstdio>
#include <memory>
#include <vector>

#include "qparams/client.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sdk_consumer HOST:PORT\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<qparams::Client>> client = qparams::Client::Connect(argv[1]);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  const std::vector<float> values = {0, 1, 2, 3};
  absl::StatusOr<qparams::TensorView> tensor =
      qparams::TensorView::Create(qparams::DType::kFloat32, {4},
                                  absl::string_view(reinterpret_cast<const char*>(values.data()),
                                                    values.size() * sizeof(float)));
  if (!tensor.ok()) {
    std::fprintf(stderr, "%s\n", tensor.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<qparams::v1::QParams> computed =
      (*client)->Compute("", qparams::v1::QuantSpec(), *tensor);
  if (!computed.ok()) {
    std::fprintf(stderr, "%s\n", computed.status().ToString().c_str());
    return 1;
  }
  std::printf("scale %.7g\n", computed->scale(0));
  return 0;
}

// libFuzzer target: arbitrary bytes as the requests of qparams.v1, handled by the
// real service (QParamsServiceImpl over an Engine) called in-process, without gRPC's
// transport (fuzz/service_harness.h).
//
// Input formats:
//   * byte 0 < 0xF0: one request. Byte 0 % 17 picks the method (Method in
//     service_harness.h), the rest is that request message serialized. The service
//     persists across inputs, so sessions created by one input are observed by later
//     ones; it is bounded (max_sessions 32, max_scale_groups 16, tensors of at most
//     2^16 elements) and rebuilt every kRequestsPerService inputs.
//   * byte 0 >= 0xF0: a sequence run on a fresh service: frames of
//     [method byte][uint32 little-endian length][request]. A failure that may depend
//     on earlier inputs is also written in this form (WriteHistory) so that it
//     reproduces from one file: `fuzz_requests <file>`.
//
// Besides crashes and sanitizer reports, the harness traps on broken contract rules
// of shared/docs/api.md: status codes outside the documented set, a handler that
// does not finish, malformed qparams, a failed call that changes its session, a
// resolved spec that does not recreate the same session, unsorted or short pages, a
// group call that changes a member session, a group result out of member order.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/service_harness.h"

namespace qparams::fuzz {
namespace {

constexpr uint8_t kSequenceMarker = 0xF0;
constexpr int kRequestsPerService = 2000;

// The requests applied to the persistent service since it was built.
std::vector<std::pair<uint8_t, std::string>>* history = nullptr;

// Writes the history (ending with the current request) as one sequence input, to
// $QPARAMS_FUZZ_HISTORY or fuzz_requests-history.seq in the working directory.
void WriteHistory() {
  if (history == nullptr || history->size() <= 1) return;  // the crash input alone is enough
  const char* path = std::getenv("QPARAMS_FUZZ_HISTORY");
  if (path == nullptr) path = "fuzz_requests-history.seq";
  const std::string bytes = std::string(1, static_cast<char>(0xFF)) + EncodeFrames(*history);
  if (FILE* f = std::fopen(path, "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    std::fprintf(stderr,
                 "fuzz_requests: the %zu requests since the service was built are in %s; "
                 "`fuzz_requests %s` replays them on a fresh service\n",
                 history->size(), path, path);
  }
}

std::unique_ptr<Service>* persistent = nullptr;
int requests_on_service = 0;

}  // namespace
}  // namespace qparams::fuzz

extern "C" void __sanitizer_set_death_callback(void (*callback)(void));

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  using namespace qparams::fuzz;
  history = new std::vector<std::pair<uint8_t, std::string>>();
  persistent = new std::unique_ptr<Service>();
  on_failure = WriteHistory;
  QuietProtobufLogs();
  __sanitizer_set_death_callback(WriteHistory);  // sanitizer reports
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qparams::fuzz;
  if (size == 0) return 0;
  if (data[0] >= kSequenceMarker) {
    Service s;
    for (const auto& [method, bytes] : DecodeFrames(data + 1, size - 1)) {
      Handle(s, method, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    }
    return 0;
  }

  if (*persistent == nullptr || requests_on_service >= kRequestsPerService) {
    persistent->reset();  // the old engine goes first
    *persistent = std::make_unique<Service>();
    requests_on_service = 0;
    history->clear();
  }
  ++requests_on_service;
  history->emplace_back(data[0], std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  if (!Handle(**persistent, data[0], data + 1, size - 1)) {
    history->pop_back();
    return -1;  // not a message of that type: not worth keeping in the corpus
  }
  return 0;
}

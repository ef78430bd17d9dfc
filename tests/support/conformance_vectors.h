// Reads the conformance vectors (shared/conformance/FORMAT.md, and the session cases
// of the NVFP4 vectors, nvfp4.md §10) into plain values, compares qparams with their
// expectations, and runs a session case through the core, so that every test that
// runs the vectors (through the core, or through the service) reads and judges them
// the same way.

#ifndef QPARAMS_TESTS_CONFORMANCE_VECTORS_H_
#define QPARAMS_TESTS_CONFORMANCE_VECTORS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/granularity.h"
#include "core/qparams.h"
#include "core/quant_spec.h"
#include "core/scale_group.h"
#include "core/tensor.h"
#include "google/protobuf/struct.pb.h"

namespace qparams::testing {

struct ExpectedQParams {
  Shape shape;
  std::vector<uint32_t> scale;                     // float32 bit patterns
  std::optional<std::vector<int32_t>> zero_point;  // null: none
  std::optional<std::vector<uint32_t>> minval;     // null: none
  std::optional<bool> initialized;                 // get_qparams only
  // NVFP4 vectors (nvfp4.md §10) only: the e4m3 codes, and the global scale and amax
  // (u32 bit patterns, null before initialization). Absent keys expect none.
  bool nvfp4 = false;
  std::vector<uint8_t> scale_e4m3;
  std::optional<uint32_t> global_scale;
  std::optional<uint32_t> amax;
};

struct VectorStep {
  enum class Op { kForward, kGetQParams, kSetExportMode, kSetGranularity };
  Op op = Op::kForward;
  Tensor input;             // forward
  bool enabled = false;     // set_export_mode
  Granularity granularity;  // set_granularity
  std::optional<ExpectedQParams> expect;
  std::optional<absl::StatusCode> expect_error;
};

struct VectorCase {
  std::string id;
  // "" for a session case; "group" or "qdq" (nvfp4.md §10), which LoadVectors keeps
  // only as `json`, for a runner that knows them.
  std::string kind;
  google::protobuf::Struct json;
  std::string calculator;
  std::optional<double> averaging_constant;
  QuantSpec spec;
  std::optional<absl::StatusCode> construct_error;
  std::vector<VectorStep> steps;
};

// The path of the vectors file: $QPARAMS_VECTORS if set, else the copy in the repo.
std::string VectorsPath();
// The NVFP4 vectors (nvfp4.md §10): $QPARAMS_NVFP4_VECTORS if set, else the copy in
// the repo.
std::string Nvfp4VectorsPath();

// Parses every line of a vectors file. INVALID_ARGUMENT naming the line for
// anything that is not a well-formed case.
absl::StatusOr<std::vector<VectorCase>> LoadVectors(const std::string& path);

// "" if `actual` matches `expected` bit for bit, else the first differing field,
// e.g. "scale[3]: expected 0x3cc0c0c1, got 0x3cc0c0c2".
std::string FirstDifference(const ExpectedQParams& expected, const QParams& actual,
                            std::optional<bool> actual_initialized = std::nullopt);

// How a forward's input reaches the core: the tensor, or its block ranges reduced
// beforehand (ObserveRange, as a client does) wherever the input can be reduced.
enum class ObservationMode { kTensor, kRange };

// Runs a session case (kind "") through the core calculators, a fresh one from the
// registry; returns "" on success, else the step and what differed. A failing step
// must leave the calculator's exported state unchanged.
std::string RunCoreCase(const VectorCase& c, ObservationMode mode);

// Runs a session case both ways (whole tensors, then reduced ranges); "" if both
// match, else "case ID: ..." naming the first way that differed and what did.
std::string CoreCaseFailure(const VectorCase& c);

// What a group case (nvfp4.md §10) is run against: the engine, or the service.
class GroupCaseDriver {
 public:
  virtual ~GroupCaseDriver() = default;
  virtual absl::Status CreateSession(const std::string& name, const std::string& calculator,
                                     const QuantSpec& spec,
                                     std::optional<double> averaging_constant) = 0;
  virtual absl::StatusOr<QParams> Forward(const std::string& session, const Tensor& input) = 0;
  // The buffers and the initialized flag.
  virtual absl::StatusOr<std::pair<QParams, bool>> GetQParams(const std::string& session) = 0;
  virtual absl::Status SetGranularity(const std::string& session,
                                      const Granularity& granularity) = 0;
  virtual absl::Status CreateGroup(const std::string& group,
                                   const std::vector<std::string>& members, GroupShare share,
                                   bool fill_uncalibrated) = 0;
  virtual absl::StatusOr<GroupResult> GetGroupQParams(const std::string& group) = 0;
  // Everything the driver holds (sessions and groups), to check that a failing step
  // changed nothing.
  virtual std::string StateFingerprint() = 0;
};

// Runs a group case (kind "group") through `driver`, which holds nothing yet: ""
// on success, else the step and what differed.
std::string RunGroupCase(const google::protobuf::Struct& c, GroupCaseDriver& driver);

// "invalid_argument" / "failed_precondition" / ...: the FORMAT name of a status code.
std::string CodeName(absl::StatusCode code);

// "" if a step that must fail with `expected` did, and left the calculator as it was
// (`unchanged`); else what differed.
std::string ErrorStepDifference(absl::StatusCode expected, const absl::Status& status,
                                bool unchanged);

// ---- The JSON reading every vectors file shares ----

// One line of a vectors file as a Struct. Integers of 16 digits or more become
// strings, kept exact for Uint64Of (a Struct holds numbers as doubles).
absl::StatusOr<google::protobuf::Struct> ParseJsonObject(const std::string& line);
// The value of `key`, or null when it is absent or JSON null.
const google::protobuf::Value* Field(const google::protobuf::Struct& s, const std::string& key);
// An unsigned 64-bit integer, from a number or a string of digits.
absl::StatusOr<uint64_t> Uint64Of(const google::protobuf::Value& v);
// A list of integers (each below 2^53).
std::vector<int64_t> IntList(const google::protobuf::Value& v);
// A FORMAT error code name ("invalid_argument", ...).
absl::StatusOr<absl::StatusCode> ParseCode(const std::string& name);
absl::StatusOr<Granularity> ParseGranularity(const google::protobuf::Struct& g);
absl::StatusOr<QuantSpec> ParseSpec(const google::protobuf::Struct& s);
absl::StatusOr<Tensor> ParseTensor(const google::protobuf::Struct& t);
// The qparams keys of an expect (shape, scale, zero_point, minval, initialized).
ExpectedQParams ParseExpect(const google::protobuf::Struct& e);

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_CONFORMANCE_VECTORS_H_

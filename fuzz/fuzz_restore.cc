// libFuzzer target: arbitrary storage records (what a data directory's snapshot and
// journal frames hold) restored into a fresh Engine, as the server does at start,
// then every restored session exercised through the service and every restored
// scale group read.
//
// Input: frames of [kind byte][uint32 little-endian length][bytes] (service_harness.h),
// each a serialized qparams.storage.v1.Record (the kind byte is ignored); frames that
// do not parse are skipped. The journal's own framing and checksums are not fuzzed
// here: they guard against torn writes, not against a record that decodes badly.
// Keys are made valid before the restore (a session's or a scale group's name of
// [a-zA-Z0-9._-/{}]{1,128}, braces being hash tags, a tenant of "" or
// [a-zA-Z0-9._-]{1,64}), as every key the server journals passed those checks: what
// is fuzzed is the state a key carries (a group's members, share and flags included,
// which the restore checks itself).
//
// Checked besides crashes and sanitizer reports: the restored store exports in every
// format (a JSON document or a documented refusal), before and after the exercise; a
// restored session answers every method within the contract (fuzz_requests'
// checks), its pages and their tokens work, a restored group's reads answer within the
// contract, the store's records restore into the same store again
// (EngineRecords::Of -> Restore -> Of is a fixed point), and still restore once the sessions have
// been observed.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "domain/recovery.h"
#include "export/exporter.h"
#include "fuzz/service_harness.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "qparams/storage/v1/storage.pb.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams::fuzz {
namespace {

// A small tensor of `shape` (at most 64 elements, else [2, 3]) with values in [-3, 3].
v1::Tensor SmallTensor(const google::protobuf::RepeatedField<int64_t>& shape) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) n = (d >= 1 && d <= 64 && n * d <= 64) ? n * d : 65;
  if (shape.empty() || n > 64) {
    t.add_shape(2);
    t.add_shape(3);
    n = 6;
  } else {
    t.mutable_shape()->CopyFrom(shape);
  }
  std::string data;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(i % 7) - 3.0f;
    data.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  t.set_data(data);
  return t;
}

// `text` reduced to the characters `allowed` accepts, at most `limit` of them; empty
// becomes `fallback`.
template <typename Allowed>
std::string Only(const std::string& text, Allowed allowed, size_t limit, const char* fallback) {
  std::string out;
  for (char c : text) {
    if (allowed(c) && out.size() < limit) out.push_back(c);
  }
  return out.empty() ? fallback : out;
}

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '/' || c == '{' || c == '}';
}

void MakeKeyValid(storage::v1::SessionKey* key) {
  key->set_name(Only(key->name(), NameChar, 128, "x"));
  if (!key->tenant().empty()) {
    key->set_tenant(Only(
        key->tenant(), [](char c) { return NameChar(c) && c != '/' && c != '{' && c != '}'; }, 64,
        "t"));
  }
}

void MakeKeysValid(storage::v1::Record* record) {
  switch (record->kind_case()) {
    case storage::v1::Record::kPut:
      MakeKeyValid(record->mutable_put()->mutable_key());
      break;
    case storage::v1::Record::kErase:
      MakeKeyValid(record->mutable_erase());
      break;
    case storage::v1::Record::kEvicted:
      MakeKeyValid(record->mutable_evicted()->mutable_key());
      break;
    case storage::v1::Record::kGroupCreate:
      MakeKeyValid(record->mutable_group_create()->mutable_key());
      break;
    case storage::v1::Record::kGroupDelete:
      MakeKeyValid(record->mutable_group_delete());
      break;
    case storage::v1::Record::kContributed:
      MakeKeyValid(record->mutable_contributed()->mutable_key());
      break;
    case storage::v1::Record::KIND_NOT_SET:
      break;
  }
}

template <typename Request>
void Run(Service& s, Method method, const Request& request) {
  const std::string bytes = request.SerializeAsString();
  Handle(s, method, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// The tenant's sessions exported in every format (the domain's Exporter, which the
// ExportSessions reactor drives): a document that parses as JSON, or one of the
// refusals the contract documents, with a message.
void ExportAll(Service& s) {
  for (const char* format : {"aimet", "onnx", "compressed-tensors"}) {
    for (bool allow_uninitialized : {false, true}) {
      absl::StatusOr<std::unique_ptr<Exporter>> exporter =
          Exporter::Start(&s.engine, "", {"", format, allow_uninitialized, {}});
      std::string document;
      absl::Status status = exporter.status();
      while (status.ok()) {
        absl::StatusOr<std::string> piece = (*exporter)->Next();
        status = piece.status();
        if (!piece.ok() || piece->empty()) break;
        document += *piece;
      }
      const std::string what = std::string("export to ") + format;
      if (status.ok()) {
        google::protobuf::Struct parsed;
        Check(google::protobuf::util::JsonStringToMessage(document, &parsed).ok(),
              what + " is not JSON: " + document.substr(0, 2000));
        continue;
      }
      Check(status.code() == absl::StatusCode::kInvalidArgument ||
                status.code() == absl::StatusCode::kFailedPrecondition ||
                status.code() == absl::StatusCode::kNotFound,
            what + " failed with an undocumented code: " + status.ToString());
      Check(!status.message().empty(), what + " failed without a message");
    }
  }
}

// Every session of the tenant "" through the service: reads, pages of one, a
// forward shaped like its buffers, export mode off, its own granularity again.
void Exercise(Service& s) {
  v1::ListSessionsRequest list;
  list.set_page_size(1000);
  v1::ListSessionsResponse all;
  if (!Call(s.service, &QParamsServiceImpl::ListSessions, list, &all).ok()) {
    Fail("ListSessions fails after a restore", &list);
  }
  v1::ListSessionsRequest one;
  one.set_page_size(1);
  Run(s, kListSessions, one);  // checks the page token it returns
  for (const v1::Session& session : all.sessions()) {
    CheckSession(session);
    v1::GetSessionRequest get;
    get.set_name(session.name());
    Run(s, kGetSession, get);
    v1::GetQParamsRequest qparams;
    qparams.set_name(session.name());
    Run(s, kGetQParams, qparams);
    v1::ListSessionsRequest prefix;
    prefix.set_filter(session.name());
    Run(s, kListSessions, prefix);
    v1::ObserveRequest observe;
    observe.set_name(session.name());
    *observe.mutable_tensor() = SmallTensor(session.qparams().shape());
    Run(s, kObserve, observe);
    v1::SetExportModeRequest export_mode;
    export_mode.set_name(session.name());
    Run(s, kSetExportMode, export_mode);
    Run(s, kObserve, observe);
    v1::SetGranularityRequest granularity;
    granularity.set_name(session.name());
    *granularity.mutable_granularity() = session.spec().granularity();
    Run(s, kSetGranularity, granularity);
  }
}

// Every scale group of the tenant "": listed in pages of one, read, and its shared
// result computed, which answers or refuses with a documented code and a message
// (a member absent after the restore is FAILED_PRECONDITION naming it).
void ExerciseGroups(Service& s) {
  absl::StatusOr<ScaleGroupPage> all = s.engine.ListScaleGroups("", 1000, "", "");
  Check(all.ok(), "ListScaleGroups fails after a restore");
  std::string token;
  for (size_t i = 0; i < all->groups.size(); ++i) {
    absl::StatusOr<ScaleGroupPage> one = s.engine.ListScaleGroups("", 1, token, "");
    Check(one.ok() && one->groups.size() == 1 && one->groups[0].name == all->groups[i].name,
          "ListScaleGroups pages of one disagree with the whole list");
    token = one->next_page_token;
  }
  Check(token.empty(), "the last page of ListScaleGroups has a next_page_token");
  for (const ScaleGroupInfo& group : all->groups) {
    absl::StatusOr<ScaleGroupInfo> got = s.engine.GetScaleGroup("", group.name);
    Check(got.ok() && got->members == group.members && got->share == group.share &&
              got->fill_uncalibrated == group.fill_uncalibrated &&
              got->create_time == group.create_time,
          "GetScaleGroup disagrees with ListScaleGroups: " + group.name);
    absl::StatusOr<GroupResult> result = s.engine.GetGroupQParams("", group.name);
    if (result.ok()) continue;
    const absl::StatusCode code = result.status().code();
    Check(
        code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kInvalidArgument,
        "GetGroupQParams of a restored group failed with an undocumented code: " +
            result.status().ToString());
    Check(!result.status().message().empty(), "GetGroupQParams failed without a message");
  }
}

}  // namespace
}  // namespace qparams::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  qparams::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qparams;
  using namespace qparams::fuzz;
  std::vector<storage::v1::Record> records;
  for (const auto& [kind, bytes] : DecodeFrames(data, size)) {
    storage::v1::Record record;
    if (record.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      MakeKeysValid(&record);
      records.push_back(std::move(record));
    }
  }
  if (records.empty()) return -1;

  Service s;
  EngineRecords::Restore(s.engine, records);
  const std::vector<storage::v1::Record> saved = EngineRecords::Of(s.engine);
  Service again;
  const std::vector<std::string> problems = EngineRecords::Restore(again.engine, saved);
  Check(problems.empty(), "the records of a restored store do not restore: " +
                              (problems.empty() ? std::string() : problems.front()));
  // The same records, in any order (evictions come from a hash map).
  auto sorted = [](const std::vector<storage::v1::Record>& records) {
    std::vector<std::string> out;
    for (const storage::v1::Record& r : records) {
      std::string bytes;
      google::protobuf::io::StringOutputStream stream(&bytes);
      google::protobuf::io::CodedOutputStream coded(&stream);
      coded.SetSerializationDeterministic(true);
      r.SerializeToCodedStream(&coded);
      coded.Trim();
      out.push_back(std::move(bytes));
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  Check(sorted(saved) == sorted(EngineRecords::Of(again.engine)),
        "Records -> Restore -> Records changes the records");
  ExportAll(s);
  ExerciseGroups(s);
  Exercise(s);
  ExportAll(s);
  ExerciseGroups(s);
  // What the service did to the restored sessions must restore too.
  Service after;
  const std::vector<std::string> later =
      EngineRecords::Restore(after.engine, EngineRecords::Of(s.engine));
  Check(later.empty(), "a restored session, once exercised, does not restore: " +
                           (later.empty() ? std::string() : later.front()));
  return 0;
}

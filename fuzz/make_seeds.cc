// Writes the seed corpora of the fuzz targets: `fuzz_make_seeds DIR` fills
// DIR/fuzz_requests, DIR/fuzz_restore and DIR/fuzz_core (fuzz/corpus is its output,
// committed; run it again after changing an input format: scripts/ci-hardening.sh
// does not).
//
// fuzz_requests seeds are valid requests of every method (byte 0 picks the method,
// see service_harness.h) on the session names "s", "m" and "h" (percentile), and
// three sequences that walk a session through its life on a fresh service, and two
// that walk scale groups through theirs (UNION_RANGE over int8 sessions, GLOBAL_AMAX
// over NVFP4 weights with a member deleted under the group).
// fuzz_restore seeds are the records of engines holding sessions of every stateful
// calculator, initialized or not, in export mode, deleted and evicted, and scale
// groups of both shares, created and deleted. fuzz_core
// seeds are deterministic pseudo-random bytes: a FuzzedDataProvider makes something
// of any.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "core/tensor.h"
#include "domain/engine.h"
#include "domain/recovery.h"
#include "fuzz/service_harness.h"
#include "proto/convert.h"
#include "qparams/storage/v1/storage.pb.h"
#include "qparams/v1/qparams.pb.h"
#include "storage/group_codec.h"

namespace qparams {
namespace {

namespace fs = std::filesystem;

using fuzz::kCompute;
using fuzz::kCreateScaleGroup;
using fuzz::kCreateSession;
using fuzz::kDeleteScaleGroup;
using fuzz::kDeleteSession;
using fuzz::kGetGroupQParams;
using fuzz::kGetHistogram;
using fuzz::kGetQParams;
using fuzz::kGetScaleGroup;
using fuzz::kGetSession;
using fuzz::kListCalculators;
using fuzz::kListScaleGroups;
using fuzz::kListSessions;
using fuzz::kObserve;
using fuzz::kObserveBatch;
using fuzz::kSetExportMode;
using fuzz::kSetGranularity;

void Write(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Single(uint8_t method, const google::protobuf::Message& m) {
  return std::string(1, static_cast<char>(method)) + m.SerializeAsString();
}

std::string Sequence(const std::vector<std::pair<uint8_t, std::string>>& requests) {
  return std::string(1, static_cast<char>(0xFF)) + fuzz::EncodeFrames(requests);
}

v1::Tensor F32(Shape shape, const std::vector<float>& values) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  t.mutable_shape()->Assign(shape.begin(), shape.end());
  t.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  return t;
}

v1::Tensor Bf16(Shape shape, const std::vector<float>& values) {
  v1::Tensor t;
  t.set_dtype(v1::BFLOAT16);
  t.mutable_shape()->Assign(shape.begin(), shape.end());
  std::string data;
  for (float v : values) {
    const uint16_t b = FloatToBFloat16(v);
    data.append(reinterpret_cast<const char*>(&b), 2);
  }
  t.set_data(data);
  return t;
}

v1::CreateScaleGroupRequest GroupRequest(const std::string& name,
                                         const std::vector<std::string>& members,
                                         v1::ScaleGroup::Share share) {
  v1::CreateScaleGroupRequest r;
  r.mutable_group()->set_name(name);
  for (const std::string& m : members) r.mutable_group()->add_members(m);
  r.mutable_group()->set_share(share);
  return r;
}

template <typename Request>
std::string NamedRequest(const std::string& name) {
  Request r;
  r.set_name(name);
  return r.SerializeAsString();
}

// Scale-group requests on "s" and "m", and two groups' lives on a fresh service.
void GroupSeeds(const fs::path& dir) {
  const v1::CreateScaleGroupRequest union_sm =
      GroupRequest("{l0}.g", {"s", "m"}, v1::ScaleGroup::UNION_RANGE);
  Write(dir / "create_scale_group", Single(kCreateScaleGroup, union_sm));
  v1::GetScaleGroupRequest get_g;
  get_g.set_name("{l0}.g");
  Write(dir / "get_scale_group", Single(kGetScaleGroup, get_g));
  v1::ListScaleGroupsRequest list_g;
  list_g.set_page_size(1);
  list_g.set_filter("{l0}");
  Write(dir / "list_scale_groups", Single(kListScaleGroups, list_g));
  v1::DeleteScaleGroupRequest del_g;
  del_g.set_name("{l0}.g");
  Write(dir / "delete_scale_group", Single(kDeleteScaleGroup, del_g));
  v1::GetGroupQParamsRequest result_g;
  result_g.set_name("{l0}.g");
  Write(dir / "get_group_qparams", Single(kGetGroupQParams, result_g));

  // UNION_RANGE: two static int8 sessions, one observed, then both.
  std::vector<std::pair<uint8_t, std::string>> union_life;
  for (const char* name : {"{l0}.a", "{l0}.b"}) {
    v1::CreateSessionRequest create;
    create.set_name(name);
    create.set_calculator("static");
    union_life.emplace_back(kCreateSession, create.SerializeAsString());
  }
  union_life.emplace_back(kCreateScaleGroup,
                          GroupRequest("{l0}.ab", {"{l0}.a", "{l0}.b"},
                                       v1::ScaleGroup::UNION_RANGE)
                              .SerializeAsString());
  v1::ObserveRequest observe_a;
  observe_a.set_name("{l0}.a");
  *observe_a.mutable_tensor() = F32({4}, {-1, 0.5f, 2, 3});
  union_life.emplace_back(kObserve, observe_a.SerializeAsString());
  union_life.emplace_back(kGetGroupQParams, NamedRequest<v1::GetGroupQParamsRequest>("{l0}.ab"));
  v1::ObserveRequest observe_b = observe_a;
  observe_b.set_name("{l0}.b");
  *observe_b.mutable_tensor() = F32({2}, {-6, 1});
  union_life.emplace_back(kObserve, observe_b.SerializeAsString());
  union_life.emplace_back(kGetGroupQParams, NamedRequest<v1::GetGroupQParamsRequest>("{l0}.ab"));
  v1::ListScaleGroupsRequest list_all;
  union_life.emplace_back(kListScaleGroups, list_all.SerializeAsString());
  union_life.emplace_back(kDeleteScaleGroup, NamedRequest<v1::DeleteScaleGroupRequest>("{l0}.ab"));
  Write(dir / "sequence_union_range", Sequence(union_life));

  // GLOBAL_AMAX: NVFP4 weights q and k, k deleted under the group.
  std::vector<std::pair<uint8_t, std::string>> amax_life;
  std::vector<float> values(64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.125f * static_cast<float>(i) - 4.0f;
  for (const char* name : {"{qk}.q", "{qk}.k"}) {
    v1::CreateSessionRequest create;
    create.set_name(name);
    create.set_calculator("global_minmax");
    v1::QuantSpec* spec = create.mutable_spec();
    spec->set_dtype("float4_e2m1fn_x2");
    spec->set_scale_dtype("float8_e4m3fn");
    spec->mutable_granularity()->mutable_per_block()->set_axis(-1);
    spec->mutable_granularity()->mutable_per_block()->add_block_size(16);
    amax_life.emplace_back(kCreateSession, create.SerializeAsString());
  }
  v1::ObserveRequest observe_q;
  observe_q.set_name("{qk}.q");
  *observe_q.mutable_tensor() = F32({2, 32}, values);
  amax_life.emplace_back(kObserve, observe_q.SerializeAsString());
  v1::CreateScaleGroupRequest amax_qk =
      GroupRequest("{qk}.g", {"{qk}.q", "{qk}.k"}, v1::ScaleGroup::GLOBAL_AMAX);
  amax_qk.mutable_group()->set_fill_uncalibrated(true);
  amax_life.emplace_back(kCreateScaleGroup, amax_qk.SerializeAsString());
  amax_life.emplace_back(kGetGroupQParams, NamedRequest<v1::GetGroupQParamsRequest>("{qk}.g"));
  amax_life.emplace_back(kGetScaleGroup, NamedRequest<v1::GetScaleGroupRequest>("{qk}.g"));
  amax_life.emplace_back(kDeleteSession, NamedRequest<v1::DeleteSessionRequest>("{qk}.k"));
  amax_life.emplace_back(kGetGroupQParams, NamedRequest<v1::GetGroupQParamsRequest>("{qk}.g"));
  amax_life.emplace_back(kDeleteScaleGroup, NamedRequest<v1::DeleteScaleGroupRequest>("{qk}.g"));
  Write(dir / "sequence_global_amax", Sequence(amax_life));
}

void RequestSeeds(const fs::path& dir) {
  fs::create_directories(dir);

  v1::ComputeRequest compute;
  compute.set_calculator("dynamic");
  *compute.mutable_tensor() = F32({2, 3}, {-1.5f, 0.25f, 3.0f, 0.5f, -2.0f, 1.0f});
  Write(dir / "compute_dynamic_f32", Single(kCompute, compute));

  compute.set_calculator("static");
  compute.mutable_spec()->set_dtype("uint4");
  compute.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  v1::PerBlock* block = compute.mutable_spec()->mutable_granularity()->mutable_per_block();
  block->set_axis(1);
  block->add_block_size(2);
  *compute.mutable_tensor() = Bf16({2, 4}, {-1, 2, 0.5f, 4, 8, -3, 0, 1});
  Write(dir / "compute_static_per_block_bf16", Single(kCompute, compute));

  v1::CreateSessionRequest create;
  create.set_name("s");
  create.set_calculator("global_minmax");
  create.mutable_spec()->set_qscheme(v1::ASYMMETRIC);
  create.mutable_spec()->mutable_granularity()->mutable_per_channel()->set_axis(0);
  Write(dir / "create_global_minmax", Single(kCreateSession, create));

  v1::CreateSessionRequest create_ma;
  create_ma.set_name("m");
  create_ma.set_calculator("moving_average");
  create_ma.set_averaging_constant(0.5);
  create_ma.mutable_spec()->set_dtype("float8_e4m3fn");
  create_ma.mutable_spec()->set_target(v1::ACTIVATION);
  create_ma.mutable_spec()->mutable_float_range()->set_max(6.0);
  Write(dir / "create_moving_average", Single(kCreateSession, create_ma));

  v1::ObserveRequest observe;
  observe.set_name("s");
  *observe.mutable_tensor() = F32({2, 3}, {-1.5f, 0.25f, 3.0f, 0.5f, -2.0f, 1.0f});
  Write(dir / "observe_tensor", Single(kObserve, observe));

  v1::ObserveRequest observe_range;
  observe_range.set_name("s");
  v1::RangeObservation* range = observe_range.mutable_range();
  range->add_input_shape(2);
  range->add_input_shape(3);
  *range->mutable_min() = F32({2, 1}, {-4.0f, -1.0f});
  *range->mutable_max() = F32({2, 1}, {2.0f, 1.5f});
  Write(dir / "observe_range", Single(kObserve, observe_range));

  v1::ObserveBatchRequest batch;
  *batch.add_observations() = observe;
  *batch.add_observations() = observe_range;
  batch.mutable_observations(1)->set_omit_qparams(true);
  Write(dir / "observe_batch", Single(kObserveBatch, batch));

  v1::ListSessionsRequest list;
  list.set_page_size(1);
  Write(dir / "list_sessions", Single(kListSessions, list));

  v1::SetGranularityRequest granularity;
  granularity.set_name("s");
  v1::PerBlock* multi = granularity.mutable_granularity()->mutable_per_block();
  multi->add_block_size(1);
  multi->add_block_size(-1);
  Write(dir / "set_granularity", Single(kSetGranularity, granularity));

  v1::SetExportModeRequest export_mode;
  export_mode.set_name("s");
  export_mode.set_enabled(true);
  Write(dir / "set_export_mode", Single(kSetExportMode, export_mode));

  v1::GetSessionRequest get;
  get.set_name("s");
  Write(dir / "get_session", Single(kGetSession, get));

  v1::DeleteSessionRequest del;
  del.set_name("s");
  Write(dir / "delete_session", Single(kDeleteSession, del));

  v1::GetQParamsRequest qparams;
  qparams.set_name("s");
  Write(dir / "get_qparams", Single(kGetQParams, qparams));

  Write(dir / "list_calculators", Single(kListCalculators, v1::ListCalculatorsRequest()));

  // A histogram session "h" (percentile, 256 bins, NaN ignored) and the histogram of
  // [-3, 0.5, 1, 2, 2.5, 7.3] at exponent -5 (histogram.md §12).
  v1::CreateSessionRequest create_h;
  create_h.set_name("h");
  create_h.set_calculator("percentile");
  create_h.mutable_histogram()->set_num_bins(256);
  create_h.mutable_histogram()->set_percentile(50);
  create_h.mutable_histogram()->set_nonfinite(v1::NONFINITE_IGNORE);
  Write(dir / "create_percentile", Single(kCreateSession, create_h));
  v1::ObserveRequest observe_h;
  observe_h.set_name("h");
  v1::HistogramObservation* h = observe_h.mutable_histogram();
  h->set_num_bins(256);
  h->set_exponent(-5);
  h->mutable_counts()->Resize(234, 0);
  for (int k : {16, 32, 64, 80, 96, 233}) h->set_counts(k, 1);
  h->set_negative_count(1);
  h->set_nan_count(1);
  h->set_min(-3.0);
  h->set_max(static_cast<double>(7.3f));
  Write(dir / "observe_histogram", Single(kObserve, observe_h));
  v1::GetHistogramRequest get_h;
  get_h.set_name("h");
  Write(dir / "get_histogram", Single(kGetHistogram, get_h));
  v1::ObserveRequest observe_h_tensor;
  observe_h_tensor.set_name("h");
  *observe_h_tensor.mutable_tensor() = F32({2, 3}, {-1.5f, 0.25f, 3.0f, 0.5f, -2.0f, 1.0f});
  observe_h_tensor.set_omit_qparams(true);
  Write(dir / "sequence_percentile", Sequence({{kCreateSession, create_h.SerializeAsString()},
                                               {kObserve, observe_h.SerializeAsString()},
                                               {kObserve, observe_h_tensor.SerializeAsString()},
                                               {kGetHistogram, get_h.SerializeAsString()},
                                               {kGetQParams, [] {
                                                  v1::GetQParamsRequest q;
                                                  q.set_name("h");
                                                  return q.SerializeAsString();
                                                }()}}));

  // A session's life on a fresh service.
  v1::ListSessionsRequest list_s;
  list_s.set_filter("s");
  Write(dir / "sequence_global_minmax",
        Sequence({{kCreateSession, create.SerializeAsString()},
                  {kSetGranularity, granularity.SerializeAsString()},
                  {kObserve, observe.SerializeAsString()},
                  {kObserve, observe_range.SerializeAsString()},
                  {kGetQParams, qparams.SerializeAsString()},
                  {kSetExportMode, export_mode.SerializeAsString()},
                  {kObserve, observe.SerializeAsString()},
                  {kListSessions, list_s.SerializeAsString()},
                  {kDeleteSession, del.SerializeAsString()}}));

  v1::ObserveRequest observe_m;
  observe_m.set_name("m");
  *observe_m.mutable_tensor() = Bf16({4}, {-1, 0.5f, 2, 7});
  v1::SetGranularityRequest per_tensor;
  per_tensor.set_name("m");
  per_tensor.mutable_granularity()->mutable_per_tensor();
  Write(dir / "sequence_moving_average",
        Sequence({{kCreateSession, create_ma.SerializeAsString()},
                  {kSetGranularity, per_tensor.SerializeAsString()},
                  {kObserve, observe_m.SerializeAsString()},
                  {kObserve, observe_m.SerializeAsString()},
                  {kGetSession, [] {
                     v1::GetSessionRequest g;
                     g.set_name("m");
                     return g.SerializeAsString();
                   }()}}));

  // Idempotency keys: an observation, its retry (a duplicate), the next sequence, a
  // batch of a retried and a new key, and a refused key.
  v1::ObserveRequest keyed = observe_m;
  keyed.set_client_id("seed-client");
  keyed.set_sequence(1);
  v1::ObserveRequest keyed_next = keyed;
  keyed_next.set_sequence(2);
  v1::ObserveBatchRequest keyed_batch;
  *keyed_batch.add_observations() = keyed_next;
  *keyed_batch.add_observations() = keyed_next;
  keyed_batch.mutable_observations(1)->set_sequence(3);
  v1::ObserveRequest bad_key = keyed;
  bad_key.set_client_id("bad key");
  Write(dir / "sequence_keyed_observations",
        Sequence({{kCreateSession, create_ma.SerializeAsString()},
                  {kObserve, keyed.SerializeAsString()},
                  {kObserve, keyed.SerializeAsString()},
                  {kObserveBatch, keyed_batch.SerializeAsString()},
                  {kObserve, bad_key.SerializeAsString()}}));

  GroupSeeds(dir);
}

// The records of `engine`, framed as fuzz_restore reads them.
std::string RecordFrames(const Engine& engine) {
  std::vector<std::pair<uint8_t, std::string>> frames;
  for (const storage::v1::Record& record : EngineRecords::Of(engine)) {
    frames.emplace_back(0, record.SerializeAsString());
  }
  return fuzz::EncodeFrames(frames);
}

void RestoreSeeds(const fs::path& dir) {
  fs::create_directories(dir);
  const std::string x1 = [] {
    const std::vector<float> v = {-1.5f, 0.25f, 3.0f, 0.5f, -2.0f, 1.0f};
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }();
  const TensorView x = *TensorView::Create(DType::kFloat32, {2, 3}, x1);

  Engine engine;
  QuantSpec per_channel;
  per_channel.qscheme = QScheme::kAsymmetric;
  per_channel.granularity = Granularity::PerChannel(0);
  QuantSpec fp8;
  fp8.dtype = "float8_e4m3fn";
  fp8.target = Target::kActivation;
  fp8.float_range.max = 6.0;
  QuantSpec block;
  block.dtype = "int4";
  block.granularity = Granularity::PerBlock(1, 3);
  (void)engine.CreateSession("", "s", "global_minmax", per_channel, {});
  (void)engine.CreateSession("", "m", "moving_average", fp8, CalculatorOptions{0.5});
  (void)engine.CreateSession("", "b", "static", block, {});
  (void)engine.CreateSession("", "empty", "", QuantSpec{}, {});
  (void)engine.CreateSession("tenant-a", "s", "static", QuantSpec{}, {});
  HistogramParams entropy;
  entropy.num_bins = 256;
  entropy.stride = 4;
  (void)engine.CreateSession("", "h", "entropy", QuantSpec{}, CalculatorOptions{{}, entropy});
  Write(dir / "records_fresh", RecordFrames(engine));

  (void)engine.Observe("", "s", Observation::FromTensor(x));
  (void)engine.Observe("", "s", Observation::FromTensor(x));
  (void)engine.Observe("", "m", Observation::FromTensor(x));
  (void)engine.Observe("", "b", Observation::FromTensor(x));
  (void)engine.Observe("", "h", Observation::FromTensor(x));
  (void)engine.SetExportMode("", "b", true);
  (void)engine.DeleteSession("", "empty");
  Write(dir / "records_observed", RecordFrames(engine));

  // An engine whose idle sessions were evicted, and a journal-like history: puts,
  // then an erase and an eviction of the same keys.
  EngineOptions ttl;
  ttl.session_ttl = absl::Hours(1);
  Engine evicting(ttl);
  (void)evicting.CreateSession("", "gone", "static", QuantSpec{}, {});
  (void)evicting.CreateSession("", "kept", "global_minmax", per_channel, {});
  (void)evicting.Observe("", "kept", Observation::FromTensor(x));
  std::string history = RecordFrames(evicting);
  evicting.EvictIdle(absl::Now() + absl::Hours(2));
  history += RecordFrames(evicting);
  storage::v1::Record erase;
  erase.mutable_erase()->set_name("kept");
  history += fuzz::EncodeFrames({{0, erase.SerializeAsString()}});
  Write(dir / "records_evicted_and_erased", history);

  // Scale groups: GLOBAL_AMAX over NVFP4 sessions (one uncalibrated, filled), UNION_RANGE
  // over per_tensor ones, a group whose member is gone, and a deleted group's records.
  Engine grouped;
  QuantSpec nvfp4;
  nvfp4.dtype = "float4_e2m1fn_x2";
  nvfp4.scale_dtype = "float8_e4m3fn";
  nvfp4.granularity = Granularity::PerBlock(-1, 16);
  const std::vector<float> w = [] {
    std::vector<float> v(32);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 9) - 4.0f;
    return v;
  }();
  const TensorView wx = *TensorView::Create(
      DType::kFloat32, {2, 16},
      absl::string_view(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float)));
  for (const char* name : {"{l}.q", "{l}.k", "{l}.v"}) {
    (void)grouped.CreateSession("", name, "global_minmax", nvfp4, {});
  }
  (void)grouped.Observe("", "{l}.q", Observation::FromTensor(wx));
  (void)grouped.Observe("", "{l}.k", Observation::FromTensor(wx));
  (void)grouped.CreateSession("", "a", "static", QuantSpec{}, {});
  (void)grouped.CreateSession("", "b", "moving_average", QuantSpec{}, CalculatorOptions{0.5});
  (void)grouped.Observe("", "a", Observation::FromTensor(x));
  (void)grouped.Observe("", "b", Observation::FromTensor(x));
  (void)grouped.CreateScaleGroup(
      "", {"{l}.qkv", {"{l}.v", "{l}.q", "{l}.k"}, GroupShare::kGlobalAmax, true});
  (void)grouped.CreateScaleGroup("", {"ab", {"b", "a"}, GroupShare::kUnionRange, false});
  (void)grouped.CreateScaleGroup("", {"a-gone", {"a"}, GroupShare::kUnionRange, false});
  (void)grouped.CreateScaleGroup("tenant-a", {"ab", {"a"}, GroupShare::kUnionRange, false});
  std::string groups = RecordFrames(grouped);
  (void)grouped.DeleteSession("", "a");
  groups += RecordFrames(grouped);
  groups += fuzz::EncodeFrames({{0, EncodeGroupDelete("", "a-gone").SerializeAsString()}});
  Write(dir / "records_scale_groups", groups);
}

void CoreSeeds(const fs::path& dir) {
  fs::create_directories(dir);
  std::mt19937 rng(20261130);
  for (size_t size : {32, 64, 128, 256, 512, 768, 1024, 2048}) {
    std::string bytes(size, '\0');
    for (char& b : bytes) b = static_cast<char>(rng() & 0xff);
    Write(dir / ("random_" + std::to_string(size)), bytes);
  }
}

}  // namespace
}  // namespace qparams

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: %s DIR  (writes DIR/fuzz_requests, DIR/fuzz_restore, DIR/fuzz_core)\n",
                 argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  qparams::RequestSeeds(dir / "fuzz_requests");
  qparams::RestoreSeeds(dir / "fuzz_restore");
  qparams::CoreSeeds(dir / "fuzz_core");
  return 0;
}

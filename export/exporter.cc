#include "export/exporter.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_string.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "domain/session_store.h"
#include "export/engine_export_source.h"
#include "export/fused_siblings.h"

namespace qparams {
namespace {

constexpr size_t kListedNames = 20;  // uninitialized sessions named in the refusal
constexpr absl::string_view kEntryIndent = "    ";
constexpr absl::string_view kQParamsVersion = QPARAMS_VERSION;

// An exported NVFP4 weight among fused siblings, with the global scale it exports.
struct FusedWeight {
  std::string module;
  std::string session;
  float global_scale = 0;
};

// FAILED_PRECONDITION naming the first siblings (by parent module) whose exported
// global scales differ: an engine fusing them would take one (vLLM the max) and
// silently misscale the others' blocks.
absl::Status CheckFusedSiblings(
    const std::map<std::pair<std::string, int>, std::vector<FusedWeight>>& fused) {
  for (const auto& [slot, weights] : fused) {
    bool equal = true;
    for (const FusedWeight& w : weights) {
      equal = equal && FloatBits(w.global_scale) == FloatBits(weights[0].global_scale);
    }
    if (equal) continue;
    std::vector<std::string> listed, sessions;
    for (const FusedWeight& w : weights) {
      listed.push_back(absl::StrCat(w.session, " (", FloatText(w.global_scale), ")"));
      sessions.push_back(w.session);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the NVFP4 weights of the ", FusedSiblingTable()[slot.second].what, " siblings under ",
        slot.first.empty() ? "the top level" : slot.first,
        ", which engines fuse into one GEMM with one global scale, have different "
        "global scales and no GLOBAL_AMAX scale group covers them: ",
        absl::StrJoin(listed, ", "),
        "; declare a scale group of them (CreateScaleGroup with share GLOBAL_AMAX and members ",
        absl::StrJoin(sessions, ", "), ") and export again"));
  }
  return absl::OkStatus();
}

}  // namespace

Exporter::Exporter(std::unique_ptr<ExportSource> source, ExportOptions options,
                   ExportFormat format)
    : source_(std::move(source)),
      options_(std::move(options)),
      format_(format),
      cursor_(source_->NewPass()) {}

absl::StatusOr<ExportFormat> Exporter::CheckOptions(const ExportOptions& options) {
  if (!options.prefix.empty()) {
    QPARAMS_RETURN_IF_ERROR(ValidateSessionName(options.prefix, "prefix"));
  }
  QPARAMS_ASSIGN_OR_RETURN(const ExportFormat format, ParseExportFormat(options.format));
  if (options.tensor_names.size() > kMaxTensorNames) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_names has ", options.tensor_names.size(),
                                                   " entries; the limit is ", kMaxTensorNames));
  }
  for (const auto& [session, tensor] : options.tensor_names) {
    if (tensor.empty() || tensor.size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor_names[\"", session, "\"] has ", tensor.size(),
                       " bytes; an exported name has 1 to ", kMaxTensorNameBytes));
    }
  }
  return format;
}

absl::StatusOr<std::unique_ptr<Exporter>> Exporter::Start(const Engine* engine, std::string tenant,
                                                          ExportOptions options,
                                                          const ExportGroupSource* groups) {
  QPARAMS_ASSIGN_OR_RETURN(const ExportFormat format, CheckOptions(options));
  QPARAMS_ASSIGN_OR_RETURN(
      std::unique_ptr<EngineExportSource> source,
      EngineExportSource::Create(engine, std::move(tenant), options.prefix, format, groups));
  return Start(std::move(source), std::move(options));
}

absl::StatusOr<std::unique_ptr<Exporter>> Exporter::Start(std::unique_ptr<ExportSource> source,
                                                          ExportOptions options) {
  QPARAMS_ASSIGN_OR_RETURN(const ExportFormat format, CheckOptions(options));
  std::unique_ptr<Exporter> exporter(new Exporter(std::move(source), std::move(options), format));
  QPARAMS_RETURN_IF_ERROR(exporter->Check());
  return exporter;
}

absl::Status Exporter::Check() {
  std::unique_ptr<ExportPass> pass = source_->NewPass();
  int64_t sessions = 0;
  std::vector<std::string> uninitialized;
  int64_t uninitialized_count = 0;
  // Tensor name (compressed-tensors: module and role) -> the session that has it.
  absl::flat_hash_map<std::string, std::string> owners;
  absl::flat_hash_map<std::string, int> args_index;  // args_ by value
  // NVFP4 weights among fused siblings, by parent module and sibling set.
  std::map<std::pair<std::string, int>, std::vector<FusedWeight>> fused;
  for (;;) {
    QPARAMS_ASSIGN_OR_RETURN(const ExportItem* item, pass->Next());
    if (item == nullptr) break;
    ++sessions;
    const SessionInfo* session = &item->session;
    if (!item->filled_group.empty() && session->spec.target == Target::kWeight) {
      return absl::FailedPreconditionError(absl::StrCat(
          "scale group ", item->filled_group, " fills session ", session->name,
          ", which never saw data, with the group's global scale; but it is a weight, with no "
          "block scales to export: observe it"));
    }
    if (!session->initialized) {
      if (uninitialized.size() < kListedNames) uninitialized.push_back(session->name);
      ++uninitialized_count;
      continue;
    }
    const TensorBinding binding = Bind(*session);
    QPARAMS_RETURN_IF_ERROR(RenderSession(format_, *session, binding, kEntryIndent).status());
    std::string key = binding.tensor;
    if (format_ == ExportFormat::kModelOpt) {
      key = absl::StrCat(binding.module, " as ", RoleName(binding.role));
    }
    if (format_ == ExportFormat::kCompressedTensors) {
      key = absl::StrCat(binding.module, " as ", RoleName(binding.role));
      // One document is one checkpoint format: nvfp4-pack-quantized or naive-quantized.
      std::string& first_of_kind = IsNvfp4(*session) ? first_nvfp4_ : first_other_;
      if (first_of_kind.empty()) first_of_kind = session->name;
      if (!first_nvfp4_.empty() && !first_other_.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sessions ", first_nvfp4_, " (NVFP4) and ", first_other_,
            " (not NVFP4) cannot share one compressed-tensors export: its format is "
            "nvfp4-pack-quantized or naive-quantized; export them under separate prefixes"));
      }
      QPARAMS_ASSIGN_OR_RETURN(std::string args, CompressedTensorsArgs(*session, binding));
      auto [index, added] = args_index.try_emplace(args, static_cast<int>(args_.size()));
      if (added) args_.push_back(std::move(args));
      modules_[binding.module].by_role[static_cast<int>(binding.role)] = index->second;
    }
    if (IsNvfp4(*session) && binding.role == TensorRole::kWeight) {
      if (std::optional<FusedSiblingSlot> slot = FusedSiblingOf(binding.module)) {
        fused[{slot->parent, slot->set}].push_back(
            {binding.module, session->name, *session->qparams.global_scale});
      }
    }
    auto [owner, inserted] = owners.try_emplace(key, session->name);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sessions ", owner->second, " and ", session->name, " both export as ", key,
          " (the names map to tensors as docs/exports.md says)"));
    }
  }
  if (sessions == 0) {
    return absl::NotFoundError(absl::StrCat("no session's name starts with prefix \"",
                                            options_.prefix, "\"; nothing to export"));
  }
  if (uninitialized_count > 0 && !options_.allow_uninitialized) {
    std::string names = absl::StrJoin(uninitialized, ", ");
    if (uninitialized_count > static_cast<int64_t>(uninitialized.size())) {
      absl::StrAppend(&names, " and ", uninitialized_count - uninitialized.size(), " more");
    }
    return absl::FailedPreconditionError(
        absl::StrCat(uninitialized_count, " of the ", sessions, " sessions under prefix \"",
                     options_.prefix, "\" never saw data (not initialized): ", names,
                     "; observe them, delete them, or allow_uninitialized (qparams-cli "
                     "--allow-uninitialized) to leave them out"));
  }
  return CheckFusedSiblings(fused);
}

TensorBinding Exporter::Bind(const SessionInfo& session) const {
  return BindTensor(session.name, options_.prefix, session.spec.target, options_.tensor_names);
}

bool Exporter::InPass(const TensorBinding& binding) const {
  if (format_ != ExportFormat::kAimet) return true;
  return (binding.role == TensorRole::kWeight) == (pass_ == 1);  // activations first
}

std::string Exporter::Opening() const {
  switch (format_) {
    case ExportFormat::kAimet:
      return "{\n  \"version\": \"1.0.0\",\n  \"activation_encodings\": [";
    case ExportFormat::kOnnx:
      return "{\n  \"version\": \"2.0.0\",\n  \"encodings\": [";
    case ExportFormat::kCompressedTensors:
    case ExportFormat::kModelOpt:
      return "{\n  \"tensors\": {";
  }
  return "";
}

std::string Exporter::BetweenPasses() const { return "\n  ],\n  \"param_encodings\": ["; }

std::string Exporter::Closing() const {
  switch (format_) {
    case ExportFormat::kAimet:
      return "\n  ],\n  \"excluded_layers\": []\n}\n";
    case ExportFormat::kOnnx:
      return "\n  ]\n}\n";
    case ExportFormat::kCompressedTensors:
      return absl::StrCat("\n  },\n  \"quantization_config\": ", QuantizationConfig(), "\n}\n");
    case ExportFormat::kModelOpt:
      return absl::StrCat("\n  },\n  \"hf_quant_config\": ", HfQuantConfig(), "\n}\n");
  }
  return "";
}

std::string Exporter::HfQuantConfig() {
  // ModelOpt's export (export/quant_utils.py get_quant_config): the service knows only
  // the sessions, so it excludes no module; the checkpoint's writer lists the ones it
  // leaves unquantized.
  return absl::StrCat(
      "{\n    \"producer\": {\"name\": \"qparams\", \"version\": \"", kQParamsVersion,
      "\"},\n    \"quantization\": {\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": null, "
      "\"group_size\": 16, \"exclude_modules\": []}\n  }");
}

std::string Exporter::QuantizationConfig() const {
  // Modules whose three args are equal share a group, numbered by their first module.
  std::map<std::array<int, 3>, std::vector<std::string>> groups;  // args -> modules
  std::vector<std::array<int, 3>> order;
  for (const auto& [module, args] : modules_) {
    std::vector<std::string>& modules = groups[args.by_role];
    if (modules.empty()) order.push_back(args.by_role);
    modules.push_back(module);
  }
  // An NVFP4 checkpoint holds the packed weights (weight_packed), the compressed
  // form; the naive form's user saves fake-quantized weights with their own tooling.
  const bool nvfp4 = !first_nvfp4_.empty();
  std::string out = absl::StrCat(
      "{\n    \"quant_method\": \"compressed-tensors\",\n    \"format\": \"",
      nvfp4 ? "nvfp4-pack-quantized" : "naive-quantized",
      "\",\n    \"quantization_status\": \"", nvfp4 ? "compressed" : "frozen",
      "\",\n    \"config_groups\": {");
  for (size_t g = 0; g < order.size(); ++g) {
    const std::vector<std::string>& modules = groups[order[g]];
    const std::array<int, 3>& args = order[g];
    auto or_null = [&](TensorRole role) -> absl::string_view {
      const int index = args[static_cast<int>(role)];
      return index < 0 ? "null" : absl::string_view(args_[index]);
    };
    absl::StrAppend(&out, g > 0 ? "," : "", "\n      \"group_", g, "\": {\n        \"targets\": [",
                    absl::StrJoin(modules, ", ", AppendJsonString),
                    "],\n        \"weights\": ", or_null(TensorRole::kWeight),
                    ",\n        \"input_activations\": ", or_null(TensorRole::kInput),
                    ",\n        \"output_activations\": ", or_null(TensorRole::kOutput),
                    "\n      }");
  }
  absl::StrAppend(&out, order.empty() ? "" : "\n    ", "},\n    \"ignore\": []\n  }");
  return out;
}

absl::StatusOr<std::string> Exporter::Next() {
  std::string piece;
  while (piece.size() < kPieceBytes && stage_ != Stage::kDone) {
    switch (stage_) {
      case Stage::kOpening:
        piece += Opening();
        stage_ = Stage::kSessions;
        break;
      case Stage::kSessions: {
        QPARAMS_ASSIGN_OR_RETURN(const ExportItem* next, cursor_->Next());
        if (next == nullptr) {  // the pass is over
          if (++pass_ < passes()) {
            piece += BetweenPasses();
            cursor_ = source_->NewPass();
            first_in_pass_ = true;
          } else {
            stage_ = Stage::kClosing;
          }
          break;
        }
        const SessionInfo& session = next->session;
        if (!session.initialized) break;  // refused by Check unless allowed
        const TensorBinding binding = Bind(session);
        if (!InPass(binding)) break;
        QPARAMS_ASSIGN_OR_RETURN(std::string rendered,
                                 RenderSession(format_, session, binding, kEntryIndent));
        absl::StrAppend(&piece, first_in_pass_ ? "\n" : ",\n", kEntryIndent, rendered);
        first_in_pass_ = false;
        break;
      }
      case Stage::kClosing:
        piece += Closing();
        stage_ = Stage::kDone;
        break;
      case Stage::kDone:
        break;
    }
  }
  return piece;
}

}  // namespace qparams

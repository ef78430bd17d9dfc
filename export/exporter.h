// One export of the sessions under a prefix (ExportSessions, RenderExport): checks
// every session, then writes the document a piece at a time. It reads the sessions
// from an ExportSource: the store's (export/engine_export_source.h), so that memory
// holds one page of sessions (and, for compressed-tensors, one args entry per module)
// whatever the prefix matches, or items a caller supplies
// (export/item_export_source.h), rendered to the same bytes.

#ifndef QPARAMS_EXPORT_EXPORTER_H_
#define QPARAMS_EXPORT_EXPORTER_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "domain/engine.h"
#include "export/export_format.h"
#include "export/export_group_source.h"
#include "export/export_source.h"

namespace qparams {

struct ExportOptions {
  std::string prefix;  // "" = every session
  std::string format;  // "aimet", "onnx", "compressed-tensors" or "modelopt"
  bool allow_uninitialized = false;
  // The exported name of a session's tensor by its name without the prefix (see
  // BindTensor); others keep theirs. At most kMaxTensorNames entries, each value 1 to
  // kMaxTensorNameBytes bytes.
  std::map<std::string, std::string> tensor_names;
};

// Not thread-safe: one caller drives an Exporter. The engine (of the engine's Start)
// must outlive it.
class Exporter {
 public:
  // The size the pieces Next() returns reach before it returns them.
  static constexpr size_t kPieceBytes = 64 << 10;
  static constexpr size_t kMaxTensorNames = 100000;
  static constexpr size_t kMaxTensorNameBytes = 1024;

  // INVALID_ARGUMENT for a bad prefix, format or tensor_names entry; else the format.
  static absl::StatusOr<ExportFormat> CheckOptions(const ExportOptions& options);

  // Reads every session of `tenant` under the prefix once and checks it:
  // INVALID_ARGUMENT for a bad prefix, format or tensor_names entry, or naming the first session the
  // format cannot express (or two that would get the same tensor name);
  // FAILED_PRECONDITION listing uninitialized sessions unless allow_uninitialized;
  // NOT_FOUND when no session has the prefix.
  //
  // NVFP4 formats (compressed-tensors, modelopt): an exported NVFP4 session that is a
  // member of a GLOBAL_AMAX group of `groups` exports the group's result, computed
  // here once (the shared global scale, the member's own blocks); a filled input
  // member exports the group's global scale. FAILED_PRECONDITION naming the group:
  // uncalibrated members without fill_uncalibrated, an exported filled weight (no
  // block scales), a session in two groups whose global scales differ, or the group's
  // own error; and naming them, fused siblings (export/fused_siblings.h) whose
  // exported global scales differ. `groups` (null: no groups) must outlive the
  // exporter.
  static absl::StatusOr<std::unique_ptr<Exporter>> Start(const Engine* engine, std::string tenant,
                                                         ExportOptions options,
                                                         const ExportGroupSource* groups = nullptr);

  // The same checks and document over the items of `source` (their names under the
  // prefix; scale groups already applied, as EngineExportSource applies them): the
  // items of the store's sessions give the same bytes as the store.
  static absl::StatusOr<std::unique_ptr<Exporter>> Start(std::unique_ptr<ExportSource> source,
                                                         ExportOptions options);

  // The document's next bytes (at least kPieceBytes but for the last piece, and
  // whole sessions); "" once the document is complete. Sessions are read again, in
  // name order (a new pass of the source); one changed since Start so that the format
  // cannot express it is INVALID_ARGUMENT, and one created since then may or may not
  // appear.
  absl::StatusOr<std::string> Next();

 private:
  // compressed-tensors' quantization args of a module's three tensors, by
  // TensorRole, as indexes into args_ (-1 = none): modules mostly share a handful of
  // distinct args.
  struct ModuleArgs {
    std::array<int, 3> by_role = {-1, -1, -1};
  };

  Exporter(std::unique_ptr<ExportSource> source, ExportOptions options, ExportFormat format);

  absl::Status Check();
  // The session's binding, under its name from options_.tensor_names if it has one.
  TensorBinding Bind(const SessionInfo& session) const;
  // The number of passes over the sessions (AIMET writes activations, then params).
  int passes() const { return format_ == ExportFormat::kAimet ? 2 : 1; }
  bool InPass(const TensorBinding& binding) const;
  std::string Opening() const;
  std::string BetweenPasses() const;
  std::string Closing() const;
  std::string QuantizationConfig() const;
  static std::string HfQuantConfig();

  const std::unique_ptr<ExportSource> source_;
  const ExportOptions options_;
  const ExportFormat format_;
  std::map<std::string, ModuleArgs> modules_;  // compressed-tensors only, by module name
  std::vector<std::string> args_;              // distinct args, as JSON objects
  // compressed-tensors: the first NVFP4 session and the first other one (a document
  // holds one kind).
  std::string first_nvfp4_;
  std::string first_other_;

  enum class Stage { kOpening, kSessions, kClosing, kDone };
  Stage stage_ = Stage::kOpening;
  int pass_ = 0;
  bool first_in_pass_ = true;
  std::unique_ptr<ExportPass> cursor_;  // the current pass's
};

}  // namespace qparams

#endif  // QPARAMS_EXPORT_EXPORTER_H_

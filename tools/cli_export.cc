// export: the sessions under --prefix in a deployment format, to stdout or a file.

#include "tools/cli_internal.h"
#include "tools/partial_file.h"

namespace qparams::cli {

// Streams the document to stdout, or to -o FILE whole or not at all (PartialFile: a
// refusal leaves no file at all).
int Export(Invocation& in) {
  const Options& options = in.options();
  if (options.format == "json" || options.format == "table") {
    return Usage(in.err(),
                 "export needs --format=aimet, --format=onnx, "
                 "--format=compressed-tensors or --format=modelopt");
  }
  v1::ExportSessionsRequest request;
  request.set_prefix(options.prefix);
  request.set_format(options.format);
  request.set_allow_uninitialized(options.allow_uninitialized);
  if (options.output.empty()) {
    const absl::Status status = in.client().ExportSessions(request, [&](absl::string_view data) {
      in.out() << data;
      return absl::OkStatus();
    });
    in.out().flush();
    return status.ok() ? kExitOk : in.Fail(status);
  }
  PartialFile file(options.output);
  absl::Status status = in.client().ExportSessions(request, [&](absl::string_view data) {
    if (!file.is_open()) {  // only once the server has accepted the export
      if (absl::Status opened = file.Open(); !opened.ok()) return opened;
    }
    return file.Write(data);
  });
  if (status.ok() && file.is_open()) status = file.Commit();
  return status.ok() ? kExitOk : in.Fail(status);
}

}  // namespace qparams::cli

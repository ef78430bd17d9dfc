#include "storage/state_file.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace qparams {

absl::Status WriteStateFile(Env& env, const std::string& dir, absl::string_view name,
                            absl::string_view contents) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string temporary = absl::StrCat(path, ".tmp");
  {
    QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env.NewWritableFile(temporary));
    QPARAMS_RETURN_IF_ERROR(file->Append(contents));
    QPARAMS_RETURN_IF_ERROR(file->Sync());
  }
  QPARAMS_RETURN_IF_ERROR(env.RenameFile(temporary, path));
  return env.SyncDir(dir);
}

absl::StatusOr<std::optional<std::string>> ReadStateFile(Env& env, const std::string& dir,
                                                         absl::string_view name) {
  absl::StatusOr<std::unique_ptr<SequentialFile>> file =
      env.NewSequentialFile(absl::StrCat(dir, "/", name));
  if (absl::IsNotFound(file.status())) return std::nullopt;
  if (!file.ok()) return file.status();
  std::string contents;
  char buffer[4096];
  while (true) {
    QPARAMS_ASSIGN_OR_RETURN(const size_t n, (*file)->Read(buffer, sizeof(buffer)));
    if (n == 0) break;
    contents.append(buffer, n);
  }
  return contents;
}

}  // namespace qparams

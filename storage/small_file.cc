#include "storage/small_file.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace qparams {

absl::Status WriteSmallFile(Env& env, const std::string& dir, absl::string_view name,
                            absl::string_view content) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string temp = absl::StrCat(path, ".tmp");
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env.NewWritableFile(temp);
  if (!file.ok()) return file.status();
  absl::Status written = (*file)->Append(content);
  if (written.ok()) written = (*file)->Sync();
  file->reset();
  if (written.ok()) written = env.RenameFile(temp, path);
  if (written.ok()) written = env.SyncDir(dir);
  return written;
}

absl::StatusOr<std::optional<std::string>> ReadSmallFile(Env& env, const std::string& dir,
                                                        absl::string_view name) {
  absl::StatusOr<std::vector<std::string>> names = env.ListDir(dir);
  if (!names.ok()) return names.status();
  bool present = false;
  for (const std::string& n : *names) present = present || n == name;
  if (!present) return std::optional<std::string>();
  absl::StatusOr<std::unique_ptr<SequentialFile>> file =
      env.NewSequentialFile(absl::StrCat(dir, "/", name));
  if (!file.ok()) return file.status();
  std::string content;
  char buffer[4096];
  while (true) {
    absl::StatusOr<size_t> n = (*file)->Read(buffer, sizeof(buffer));
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    content.append(buffer, *n);
  }
  return std::optional<std::string>(std::move(content));
}

}  // namespace qparams

#include "bench/restart.h"

#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/child_process.h"
#include "core/status_macros.h"

namespace qparams::bench {
namespace {

absl::StatusOr<std::unique_ptr<Child>> StartServer(const RestartSpec& spec,
                                                   const std::string& data_dir) {
  return Child::Spawn(
      {spec.server_binary, "--listen=127.0.0.1:0", absl::StrCat("--data_dir=", data_dir),
       absl::StrCat("--max_sessions=", spec.fill.sessions)},
      /*capture_stderr=*/true, /*stdout_to_null=*/false);
}

// The directory removed however the scenario ends.
struct ScratchDir {
  std::string path;
  ~ScratchDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

absl::StatusOr<RestartResult> MeasureRestart(const RestartSpec& spec) {
  RestartResult result;
  result.raw_bytes = RawStateBytes(spec.fill);
  std::string pattern = spec.scratch_dir + "/qparams-restart-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot make a directory under ", spec.scratch_dir));
  }
  const ScratchDir scratch{pattern};
  const std::string data_dir = scratch.path + "/data";

  {
    QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Child> server, StartServer(spec, data_dir));
    QPARAMS_ASSIGN_OR_RETURN(const std::string listening, server->WaitForLine("listening on "));
    const absl::Time start = absl::Now();
    QPARAMS_RETURN_IF_ERROR(FillSessions(AddressIn(listening), spec.fill));
    result.fill_time = absl::Now() - start;
    QPARAMS_ASSIGN_OR_RETURN(result.rss_before_kill, ResidentBytes(absl::StrCat(server->pid())));
    QPARAMS_RETURN_IF_ERROR(server->Stop(SIGKILL).status());
  }

  std::vector<std::string> cat = {"/bin/cat"};
  for (const auto& entry : std::filesystem::directory_iterator(data_dir)) {
    if (!entry.is_regular_file()) continue;
    result.data_dir_bytes += static_cast<int64_t>(entry.file_size());
    cat.push_back(entry.path().string());
  }
  {
    const absl::Time start = absl::Now();
    QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Child> reader,
                             Child::Spawn(cat, /*capture_stderr=*/false, /*stdout_to_null=*/true));
    QPARAMS_ASSIGN_OR_RETURN(const int code, reader->Wait());
    if (code != 0) return absl::InternalError(absl::StrCat("cat exited with ", code));
    result.read_time = absl::Now() - start;
  }

  const absl::Time start = absl::Now();
  QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Child> server, StartServer(spec, data_dir));
  QPARAMS_ASSIGN_OR_RETURN(const std::string restored, server->WaitForLine("restored "));
  QPARAMS_RETURN_IF_ERROR(server->WaitForLine("listening on ").status());
  result.restart_time = absl::Now() - start;
  QPARAMS_ASSIGN_OR_RETURN(result.rss_after_restart, ResidentBytes(absl::StrCat(server->pid())));
  const std::vector<absl::string_view> words = absl::StrSplit(restored, ' ');
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    if (words[i] == "restored" && absl::SimpleAtoi(words[i + 1], &result.sessions_restored)) break;
  }
  QPARAMS_RETURN_IF_ERROR(server->Stop(SIGTERM).status());
  return result;
}

}  // namespace qparams::bench

// Running a program to completion with its output captured, for the tests that
// drive the real qparams-cli.

#ifndef QPARAMS_TESTS_SUBPROCESS_H_
#define QPARAMS_TESTS_SUBPROCESS_H_

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

extern char** environ;

namespace qparams::testing {

// The whole file, or "" if it cannot be read.
inline std::string ReadAll(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream s;
  s << file.rdbuf();
  return s.str();
}

// This process's environment without the variables named in `unset`, plus `set`
// ("NAME=value").
inline std::vector<std::string> EnvironmentWith(const std::vector<std::string>& unset = {},
                                                const std::vector<std::string>& set = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const bool dropped = std::any_of(unset.begin(), unset.end(), [&](const std::string& name) {
      return absl::StartsWith(entry, name + "=");
    });
    if (!dropped) env.emplace_back(entry);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

// `strings` as the null-terminated array posix_spawn takes for argv and envp; valid
// while `strings` is, unchanged.
inline std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

struct ProcessResult {
  int exit_code = -1;  // -1: not run, or killed by a signal
  std::string out;
  std::string err;
};

// Runs argv[0] (looked up in PATH) with `argv` and an environment of this process's
// without the variables named in `unset`, plus `set` ("NAME=value"); collects its
// output through files in `dir`.
inline ProcessResult RunProcess(std::vector<std::string> argv, const std::string& dir,
                                const std::vector<std::string>& unset = {},
                                const std::vector<std::string>& set = {}) {
  std::vector<std::string> env_strings = EnvironmentWith(unset, set);
  std::vector<char*> envp = CStrings(env_strings);
  std::vector<char*> args = CStrings(argv);

  const std::string out_path = absl::StrCat(dir, "/stdout"),
                    err_path = absl::StrCat(dir, "/stderr");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  pid_t pid;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ProcessResult result;
  if (spawned != 0) {
    result.err = absl::StrCat("cannot run ", argv[0], ": ", std::strerror(spawned));
    return result;
  }
  int status;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.out = ReadAll(out_path);
  result.err = ReadAll(err_path);
  return result;
}

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_SUBPROCESS_H_

// Command-line parsing shared by the project's binaries (qparams-server,
// qparams-cli, qparams-bench): Abseil's, except that a usage flag (--help,
// --helpfull, --helpshort, --helpmatch, --version, ...) prints what it asks for on
// stdout and exits 0. Abseil 20220623 exits 1 after --help, which scripts and
// package checks read as a failure.

#ifndef QPARAMS_COMMON_FLAGS_H_
#define QPARAMS_COMMON_FLAGS_H_

#include <vector>

namespace qparams {

// absl::ParseCommandLine with the exit status above: returns the positional
// arguments (argv[0] first); an unknown or malformed flag prints its error and
// exits 1, as Abseil does. Call after absl::SetProgramUsageMessage and
// absl::SetFlagsUsageConfig.
std::vector<char*> ParseFlags(int argc, char* argv[]);

}  // namespace qparams

#endif  // QPARAMS_COMMON_FLAGS_H_

// Runs the NVFP4 vectors (Nvfp4VectorsPath(), nvfp4.md §10) through the core. The
// session cases run as the conformance vectors do, with whole tensors and with block
// ranges reduced beforehand; the group cases need the service's scale groups (§4) and
// the qdq cases the client-side quantize/dequantize (§5), so they are counted apart.

#include <iostream>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "tests/conformance_vectors.h"

namespace qparams::testing {
namespace {

TEST(Nvfp4Conformance, EverySessionCaseMatchesBitForBit) {
  const std::string path = Nvfp4VectorsPath();
  absl::StatusOr<std::vector<VectorCase>> cases = LoadVectors(path);
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_FALSE(cases->empty()) << path << " holds no cases";

  int run = 0;
  int failed = 0;
  std::map<std::string, int> not_run;  // by kind
  for (const VectorCase& c : *cases) {
    if (!c.kind.empty()) {
      ++not_run[c.kind];
      continue;
    }
    ++run;
    for (ObservationMode mode : {ObservationMode::kTensor, ObservationMode::kRange}) {
      const std::string diff = RunCoreCase(c, mode);
      if (diff.empty()) continue;
      ++failed;
      ADD_FAILURE() << "case " << c.id
                    << (mode == ObservationMode::kRange ? " (range observations)" : "") << ": "
                    << diff;
      break;
    }
  }
  std::cout << "nvfp4 conformance: " << run - failed << " of " << run << " cases match\n";
  for (const auto& [kind, count] : not_run) {
    std::cout << "nvfp4 conformance: " << count << " " << kind
              << " cases not run in the core (" << path << ")\n";
  }
  EXPECT_GT(run, 0);
}

}  // namespace
}  // namespace qparams::testing

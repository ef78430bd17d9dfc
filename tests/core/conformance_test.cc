// Runs every case of the conformance vectors (VectorsPath()) through the core
// calculators and fails on any difference, naming the case, step and field. Each
// case runs twice: with whole tensors, and with block ranges reduced beforehand
// (ObserveRange, as a client does) wherever the input can be reduced.

#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/conformance_vectors.h"

namespace qparams::testing {
namespace {

TEST(Conformance, EveryVectorMatchesBitForBit) {
  const std::string path = VectorsPath();
  absl::StatusOr<std::vector<VectorCase>> cases = LoadVectors(path);
  ASSERT_TRUE(cases.ok()) << cases.status();
  ASSERT_FALSE(cases->empty()) << path << " holds no cases";

  int failed = 0;
  for (const VectorCase& c : *cases) {
    if (const std::string failure = CoreCaseFailure(c); !failure.empty()) {
      ++failed;
      ADD_FAILURE() << failure;
    }
  }
  std::cout << "conformance: " << cases->size() - failed << " of " << cases->size()
            << " cases match (" << path << ")\n";
}

}  // namespace
}  // namespace qparams::testing

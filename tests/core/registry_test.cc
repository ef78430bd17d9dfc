// The calculator registry (semantics.md §1.1, §8): register, get_class, list, resolve,
// "default" resolution by target, and construction.

#include "core/registry.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using QS = QScheme;

const QParamsCalculatorRegistry& Global() { return QParamsCalculatorRegistry::Global(); }

// A class for a private registry; its factory builds a static calculator.
CalculatorClass Fake(const std::string& key, const std::string& description = "fake") {
  return StatefulClass(key, description,
                       [](const QuantSpec& spec, const CalculatorOptions&)
                           -> absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> {
                         return std::make_unique<StaticQParamsCalculator>(spec);
                       });
}

// §8: list_registry_keys is a set upstream; the C++ returns it sorted.
TEST(Registry, GlobalHoldsTheBuiltinsSorted) {
  EXPECT_EQ(Global().ListRegistryKeys(),
            (std::vector<std::string>{"default", "dynamic", "entropy", "global_minmax",
                                      "moving_average", "mse", "percentile", "static"}));
  const std::vector<const CalculatorClass*> values = Global().ListRegistryValues();
  ASSERT_EQ(values.size(), 8u);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(values[i]->key, Global().ListRegistryKeys()[i]);
  }
}

TEST(Registry, StatefulFlags) {  // §1.1: only dynamic is stateless
  for (const char* key :
       {"static", "moving_average", "global_minmax", "percentile", "entropy", "mse"}) {
    ASSERT_OK_AND_ASSIGN(const CalculatorClass* cls, Global().GetClass(key));
    EXPECT_TRUE(cls->stateful) << key;
    EXPECT_TRUE(cls->create) << key;
  }
  ASSERT_OK_AND_ASSIGN(const CalculatorClass* dynamic, Global().GetClass("dynamic"));
  EXPECT_FALSE(dynamic->stateful);
}

// §8 get_class: KeyError upstream, NOT_FOUND here, naming the key.
TEST(Registry, GetClassOfAnUnknownKeyIsNotFound) {
  const auto cls = Global().GetClass("minmax");
  EXPECT_CODE(cls, absl::StatusCode::kNotFound);
  EXPECT_NE(cls.status().message().find("minmax"), std::string::npos) << cls.status();
  EXPECT_CODE(Global().GetClass(""), absl::StatusCode::kNotFound);
  EXPECT_CODE(Global().GetClass("Static"), absl::StatusCode::kNotFound);  // case-sensitive
}

// §8 resolve: ValueError upstream, INVALID_ARGUMENT here, naming the key and listing
// the available keys sorted.
TEST(Registry, ResolveOfAnUnknownKeyListsTheKeys) {
  ASSERT_OK_AND_ASSIGN(const CalculatorClass* cls, Global().Resolve("global_minmax"));
  EXPECT_EQ(cls->key, "global_minmax");

  const auto bad = Global().Resolve("histogram");
  EXPECT_CODE(bad, kInvalid);
  const std::string message(bad.status().message());
  EXPECT_NE(message.find("histogram"), std::string::npos) << message;
  EXPECT_NE(message.find("default, dynamic, entropy, global_minmax, moving_average, mse, "
                         "percentile, static"),
            std::string::npos)
      << message;
}

// §1.1: "default" resolves by target: weight -> static, activation -> moving_average.
TEST(Registry, DefaultResolvesByTarget) {
  for (const char* key : {"default", ""}) {
    ASSERT_OK_AND_ASSIGN(std::string weight, Global().ResolveKey(key, Target::kWeight));
    ASSERT_OK_AND_ASSIGN(std::string activation, Global().ResolveKey(key, Target::kActivation));
    EXPECT_EQ(weight, "static");
    EXPECT_EQ(activation, "moving_average");
  }
  ASSERT_OK_AND_ASSIGN(std::string explicit_key, Global().ResolveKey("dynamic", Target::kWeight));
  EXPECT_EQ(explicit_key, "dynamic");
  EXPECT_CODE(Global().ResolveKey("nope", Target::kActivation), kInvalid);

  for (Target target : {Target::kWeight, Target::kActivation}) {
    ASSERT_OK_AND_ASSIGN(auto calc, Create("default", MakeSpec("int8", QS::kSymmetric,
                                                               Granularity::PerTensor(), target)));
    EXPECT_EQ(calc->key(), target == Target::kWeight ? "static" : "moving_average");
  }
}

// register: a new key returns true; a duplicate overwrites (the last registration
// wins, §8) and returns false so the caller can warn.
TEST(Registry, RegisterAndDuplicateOverwrite) {
  QParamsCalculatorRegistry registry;
  EXPECT_TRUE(registry.ListRegistryKeys().empty());
  EXPECT_TRUE(registry.Register(Fake("zeta", "first")));
  EXPECT_TRUE(registry.Register(Fake("alpha")));
  EXPECT_EQ(registry.ListRegistryKeys(), (std::vector<std::string>{"alpha", "zeta"}));

  EXPECT_FALSE(registry.Register(Fake("zeta", "second")));
  EXPECT_EQ(registry.ListRegistryKeys(), (std::vector<std::string>{"alpha", "zeta"}));
  ASSERT_OK_AND_ASSIGN(const CalculatorClass* zeta, registry.GetClass("zeta"));
  EXPECT_EQ(zeta->description, "second");

  // A private registry does not touch the global one.
  EXPECT_CODE(Global().GetClass("zeta"), absl::StatusCode::kNotFound);
  const auto bad = registry.Resolve("static");
  EXPECT_CODE(bad, kInvalid);
  EXPECT_NE(bad.status().message().find("alpha, zeta"), std::string::npos) << bad.status();
}

TEST(Registry, CreateThroughAPrivateRegistry) {
  QParamsCalculatorRegistry registry;
  registry.Register(Fake("mine"));
  registry.Register(CalculatorClass{"marker", true, "no factory", nullptr, nullptr});
  ASSERT_OK_AND_ASSIGN(auto calc, registry.Create("mine", MakeSpec("int4", QS::kSymmetric)));
  EXPECT_EQ(calc->spec().quant_min, -8);  // the factory gets the resolved spec
  EXPECT_CODE(registry.Create("marker", QuantSpec()), kInvalid);
  EXPECT_CODE(registry.Create("other", QuantSpec()), kInvalid);
  // A session's calculator comes typed as stateful, from the same factory.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<StatefulQParamsCalculatorBase> stateful,
                       registry.CreateStateful("mine", MakeSpec("int4", QS::kSymmetric)));
  EXPECT_EQ(stateful->spec().quant_min, -8);
}

TEST(Registry, CreateStatefulRefusesStatelessClasses) {
  const absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> dynamic =
      Global().CreateStateful("dynamic", QuantSpec());
  EXPECT_CODE(dynamic, kInvalid);
  EXPECT_TRUE(absl::StrContains(dynamic.status().message(), "stateless")) << dynamic.status();
  for (const char* key : {"static", "moving_average", "global_minmax", "default"}) {
    EXPECT_OK(Global().CreateStateful(key, QuantSpec()).status()) << key;
  }
}

// The "default" marker cannot itself be built once resolved (§1.1).
TEST(Registry, DefaultMarkerHasNoFactory) {
  ASSERT_OK_AND_ASSIGN(const CalculatorClass* cls, Global().GetClass("default"));
  EXPECT_FALSE(cls->create);
}

TEST(Registry, CreateRejectsInvalidSpecsAndKeys) {
  QuantSpec bad = MakeSpec("float8_e4m3fn", QS::kAsymmetric);
  for (const char* key : {"static", "moving_average", "global_minmax", "dynamic", "default"}) {
    EXPECT_CODE(Create(key, bad), kInvalid) << key;
  }
  EXPECT_CODE(Create("nope", QuantSpec()), kInvalid);
}

// §1.2: averaging_constant is a moving_average parameter; 0 < c <= 1 and finite.
TEST(Registry, AveragingConstantRules) {
  const QuantSpec spec = MakeSpec("int8", QS::kSymmetric);
  for (double c : {0.0, -0.5, 1.5, double{NAN}, double{INFINITY}}) {
    EXPECT_CODE(Create("moving_average", spec, CalculatorOptions{c}), kInvalid) << c;
  }
  for (double c : {1.0, 0.5, 1e-6}) {
    ASSERT_OK_AND_ASSIGN(auto calc, Create("moving_average", spec, CalculatorOptions{c}));
    EXPECT_EQ(dynamic_cast<MovingAverageQParamsCalculator&>(*calc).averaging_constant(), c);
  }
  for (const char* key : {"static", "global_minmax", "dynamic"}) {
    EXPECT_CODE(Create(key, spec, CalculatorOptions{0.5}), kInvalid) << key;
  }
  // "default" for an activation is moving_average, so it takes the constant.
  ASSERT_OK_AND_ASSIGN(
      auto activation,
      Create("default",
             MakeSpec("int8", QS::kSymmetric, Granularity::PerTensor(), Target::kActivation),
             CalculatorOptions{0.25}));
  EXPECT_EQ(dynamic_cast<MovingAverageQParamsCalculator&>(*activation).averaging_constant(), 0.25);
}

}  // namespace
}  // namespace qparams::testing

// The flags' syntax (cli.h): flag names and values checked before absl parses them,
// and the spec, granularity and histogram flags turned into their messages.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/dtype.h"
#include "google/protobuf/util/json_util.h"
#include "tools/cli.h"

namespace qparams::cli {

absl::Status NormalizeFlags(std::vector<std::string>& argv) {
  // absl's own flags, which ParseCommandLine handles itself.
  static const auto* const kBuiltin = new absl::flat_hash_set<absl::string_view>{
      "help",    "helpfull",        "helpshort", "helppackage", "helpon",     "helpmatch",
      "version", "only_check_args", "flagfile",  "fromenv",     "tryfromenv", "undefok"};
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string& arg = argv[i];
    if (arg == "--") break;                         // the rest is positional
    if (arg.size() < 2 || arg[0] != '-') continue;  // a positional argument
    if (arg == "-o" || absl::StartsWith(arg, "-o=")) arg.replace(0, 2, "--output");
    const size_t start = arg[1] == '-' ? 2 : 1;
    const size_t equals = arg.find('=');
    const size_t end = equals == std::string::npos ? arg.size() : equals;
    std::replace(arg.begin() + start, arg.begin() + end, '-', '_');
    const std::string name = arg.substr(start, end - start);
    if (kBuiltin->contains(name)) continue;

    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {  // --noreduce_locally
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() && equals == std::string::npos) {
        continue;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, "; run qparams-cli --help for the flags"));
    }
    std::string value;
    if (equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argv.size()) {
      value = argv[++i];  // "--flag value"
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    std::string error;  // names the flag
    if (!flag->ParseFrom(value, &error)) return absl::InvalidArgumentError(error);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Granularity> ParseGranularity(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  v1::Granularity granularity;
  if (parts.size() == 1 && parts[0] == "per_tensor") {
    granularity.mutable_per_tensor();
    return granularity;
  }
  int32_t axis;
  if (parts.size() == 2 && parts[0] == "per_channel" && absl::SimpleAtoi(parts[1], &axis)) {
    granularity.mutable_per_channel()->set_axis(axis);
    return granularity;
  }
  int64_t size;
  if (parts.size() == 3 && parts[0] == "per_block" && absl::SimpleAtoi(parts[1], &axis) &&
      absl::SimpleAtoi(parts[2], &size)) {
    granularity.mutable_per_block()->set_axis(axis);
    granularity.mutable_per_block()->add_block_size(size);
    return granularity;
  }
  if (parts.size() == 2 && parts[0] == "per_block") {
    v1::PerBlock* block = granularity.mutable_per_block();
    bool ok = true;
    for (absl::string_view s : absl::StrSplit(parts[1], ',')) {
      ok = ok && absl::SimpleAtoi(s, &size);
      block->add_block_size(size);
    }
    if (ok) return granularity;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text,
                   "\" is not per_tensor, per_channel:AXIS, per_block:AXIS:SIZE or "
                   "per_block:B0,B1,..."));
}

absl::StatusOr<v1::QuantSpec> BuildSpec(const SpecFlags& flags) {
  v1::QuantSpec spec;
  if (!flags.spec_json.empty()) {
    const auto status = google::protobuf::util::JsonStringToMessage(flags.spec_json, &spec);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--spec: not a QuantSpec in JSON: ",
                       absl::string_view(status.message().data(), status.message().size())));
    }
  }
  if (!flags.quant_dtype.empty()) {
    absl::StatusOr<QuantDType> dtype = ParseQuantDType(flags.quant_dtype);
    if (!dtype.ok()) {
      // The core names the spec field; here the flag is the name.
      return absl::InvalidArgumentError(absl::StrCat(
          "--quant_dtype: ", absl::StripPrefix(dtype.status().message(), "spec.dtype: ")));
    }
    spec.set_dtype(flags.quant_dtype);
  }
  if (!flags.qscheme.empty()) {
    v1::QScheme qscheme;
    if (!v1::QScheme_Parse(absl::AsciiStrToUpper(flags.qscheme), &qscheme) ||
        qscheme == v1::QSCHEME_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("--qscheme: \"", flags.qscheme,
                       "\" is not symmetric, asymmetric or symmetric_with_clipping"));
    }
    spec.set_qscheme(qscheme);
  }
  if (!flags.granularity.empty()) {
    absl::StatusOr<v1::Granularity> granularity = ParseGranularity(flags.granularity);
    if (!granularity.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--granularity: ", granularity.status().message()));
    }
    *spec.mutable_granularity() = *std::move(granularity);
  }
  if (!flags.target.empty()) {
    v1::Target target;
    if (!v1::Target_Parse(absl::AsciiStrToUpper(flags.target), &target) ||
        target == v1::TARGET_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("--quant_target: \"", flags.target, "\" is not weight or activation"));
    }
    spec.set_target(target);
  }
  if (flags.quant_min.has_value()) spec.set_quant_min(*flags.quant_min);
  if (flags.quant_max.has_value()) spec.set_quant_max(*flags.quant_max);
  if (flags.float_range_min.has_value()) {
    spec.mutable_float_range()->set_min(*flags.float_range_min);
  }
  if (flags.float_range_max.has_value()) {
    spec.mutable_float_range()->set_max(*flags.float_range_max);
  }
  // Passed as given: the server judges scale dtypes and conventions (nvfp4.md §2).
  if (!flags.scale_dtype.empty()) spec.set_scale_dtype(flags.scale_dtype);
  if (!flags.convention.empty()) spec.set_convention(flags.convention);
  return spec;
}

absl::StatusOr<std::optional<v1::HistogramParams>> BuildHistogramParams(
    const HistogramFlags& flags) {
  v1::HistogramParams params;
  if (flags.num_bins.has_value()) params.set_num_bins(*flags.num_bins);
  if (flags.percentile.has_value()) params.set_percentile(*flags.percentile);
  if (flags.start_bin.has_value()) params.set_start_bin(*flags.start_bin);
  if (flags.stride.has_value()) params.set_stride(*flags.stride);
  params.set_skip_zeros(flags.skip_zeros);
  if (!flags.nonfinite.empty()) {
    const std::string policy = absl::AsciiStrToLower(flags.nonfinite);
    if (policy != "reject" && policy != "ignore") {
      return absl::InvalidArgumentError(
          absl::StrCat("--nonfinite: \"", flags.nonfinite, "\" is not reject or ignore"));
    }
    params.set_nonfinite(policy == "ignore" ? v1::NONFINITE_IGNORE : v1::NONFINITE_REJECT);
  }
  // A given flag is on the wire (the optional fields by presence, --skip_zeros and
  // --nonfinite by a non-default value), so an empty message means none was given.
  if (params.ByteSizeLong() == 0) return std::nullopt;
  return params;
}

}  // namespace qparams::cli

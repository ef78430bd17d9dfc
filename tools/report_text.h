// The numbers of the coverage report as its table, JSON and page all print them
// (report.cc; the page is report_html.cc's). Internal to qparams_report.

#ifndef QPARAMS_TOOLS_REPORT_TEXT_H_
#define QPARAMS_TOOLS_REPORT_TEXT_H_

#include <optional>
#include <string>

#include "tools/report.h"

namespace qparams::report::internal {

// A float with the digits to round-trip it.
std::string Float(double value);

// A spread value in a table or on the page: "inf" for an infinite one, "-" when unset.
std::string Float(const std::optional<float>& value);

// The spread's MAX/MIN cell: "-" when unset.
std::string Ratio(const ScaleSpread& spread);

}  // namespace qparams::report::internal

#endif  // QPARAMS_TOOLS_REPORT_TEXT_H_

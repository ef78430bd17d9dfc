#include "export/fused_siblings.h"

#include <string>
#include <vector>

namespace qparams {

const std::vector<FusedSiblings>& FusedSiblingTable() {
  static const std::vector<FusedSiblings>* const table = new std::vector<FusedSiblings>{
      {"attention", {"q_proj", "k_proj", "v_proj"}},
      {"MLP", {"gate_proj", "up_proj"}},
      {"MLA", {"q_a_proj", "kv_a_proj_with_mqa"}},
      {"expert", {"w1", "w3"}},
  };
  return *table;
}

std::optional<FusedSiblingSlot> FusedSiblingOf(absl::string_view module) {
  const size_t dot = module.rfind('.');
  const absl::string_view parent =
      dot == absl::string_view::npos ? absl::string_view() : module.substr(0, dot);
  const absl::string_view leaf = dot == absl::string_view::npos ? module : module.substr(dot + 1);
  const std::vector<FusedSiblings>& table = FusedSiblingTable();
  for (size_t set = 0; set < table.size(); ++set) {
    for (absl::string_view member : table[set].members) {
      if (leaf == member) {
        return FusedSiblingSlot{std::string(parent), static_cast<int>(set)};
      }
    }
  }
  return std::nullopt;
}

}  // namespace qparams

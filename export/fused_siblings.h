// The linears inference engines fuse into one GEMM, which takes one global scale per
// operand (nvfp4.md section 7): the NVFP4 weights of such siblings under one parent
// module must share their global scale, as a GLOBAL_AMAX scale group gives them. The
// one table of them; docs/exports.md lists it.
//
// Pure functions over constant data; thread-safe.

#ifndef QPARAMS_EXPORT_FUSED_SIBLINGS_H_
#define QPARAMS_EXPORT_FUSED_SIBLINGS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace qparams {

struct FusedSiblings {
  absl::string_view what;                  // e.g. "attention"
  std::vector<absl::string_view> members;  // the modules' last name components
};

// attention (q_proj, k_proj, v_proj), MLP (gate_proj, up_proj), MLA (q_a_proj,
// kv_a_proj_with_mqa), expert (w1, w3): llm-compressor's FUSED_LAYER_NAMES and the
// experts' gate/up.
const std::vector<FusedSiblings>& FusedSiblingTable();

// Where a module sits among fused siblings: its parent module (the name before the
// last '.', "" for a name without one: the exported names' top level) and its set in
// FusedSiblingTable().
struct FusedSiblingSlot {
  std::string parent;
  int set = 0;
};

// The slot of `module` ("model.layers.0.self_attn.q_proj": parent
// "model.layers.0.self_attn", attention), or nullopt when its last component is no
// table member.
std::optional<FusedSiblingSlot> FusedSiblingOf(absl::string_view module);

}  // namespace qparams

#endif  // QPARAMS_EXPORT_FUSED_SIBLINGS_H_

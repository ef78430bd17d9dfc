// The bad requests of ClusterAdmin's SetSlotMap: credentials, and maps that do not
// parse or do not apply to this server (docs/sharding.md).

#include <string>
#include <utility>
#include <vector>

#include "tests/server/bad_request_table.h"

namespace qparams::testing::bad_request {

std::vector<Row> SlotRows() {
  Table table;

  // The admin call: no token or an unknown one is UNAUTHENTICATED, a tenant's
  // token PERMISSION_DENIED (it is no admin's); an admin's bad map is refused naming
  // the line, and a good one on this server without sharding too.
  auto set_map = [&](std::string what, const std::string& map, StatusCode code, std::string field,
                     bool as_admin = true) {
    v1::SetSlotMapRequest r;
    r.set_map(map);
    table.Add(std::move(what), Method::kSetSlotMap, std::move(r), code, std::move(field));
    table.Last().as_admin = as_admin;
  };
  set_map("a tenant's token", "0:255 r0\n", StatusCode::PERMISSION_DENIED, "--admin_tokens_file",
          /*as_admin=*/false);
  set_map("an epoch that is no integer", "0:255 r0\n# epoch x\n", kInvalid, "map: slot map line 2");
  set_map("a negative epoch", "# epoch -3\n0:255 r0\n", kInvalid, "non-negative integer");
  set_map("a map missing slot 255", "0:254 r0\n", kInvalid, "no line gives slot 255");
  set_map("a slot given twice", "0:255 r0\n7 r1\n", kInvalid, "slot 7 is already r0's");
  set_map("a replica name with a slash", "0:255 r/0\n", kInvalid, "line 1");
  set_map("a valid map on a server without sharding", "# epoch 1\n0:255 r0\n", kPrecondition,
          "not a replica");
  set_map("no authorization metadata", "0:255 r0\n", StatusCode::UNAUTHENTICATED,
          "--admin_tokens_file");
  table.Last().token = "";
  set_map("a token of neither file", "0:255 r0\n", StatusCode::UNAUTHENTICATED,
          "--admin_tokens_file");
  table.Last().token = "hardening-unknown-token-0123";
  return table.TakeRows();
}

}  // namespace qparams::testing::bad_request

// Sessions are sharded by name over kSlotCount slots; a slot map (common/slot_map.h)
// says which replica owns each. The slot is one HAProxy computes too, from the
// routing header that carries the name: `req.hdr(x-qparams-session),crc32,mod(256)`
// (HAProxy's crc32 converter is zlib's CRC-32), so that the balancer routes each
// call to the owner without a router of ours.

#ifndef QPARAMS_COMMON_SLOT_H_
#define QPARAMS_COMMON_SLOT_H_

#include <cstdint>

#include <string>

#include "absl/strings/string_view.h"

namespace qparams {

inline constexpr int kSlotCount = 256;

// The metadata (HTTP/2 header) that carries a call's session name for routing.
inline constexpr char kSessionHeader[] = "x-qparams-session";

// The metadata that addresses a call to one replica by its name in the slot map: a
// client's per-owner ObserveStream or ObserveBatch, one leg of a ListSessions or
// ReadSessions over every replica. HAProxy routes it to the backend of that name; a
// replica refuses a call that names another replica.
inline constexpr char kReplicaHeader[] = "x-qparams-replica";

// The payload (absl::Status::GetPayload) of a refusal for a session another replica
// owns: that replica's name. The engine sets it; the wire conversions carry it to
// the client (a call's trailing metadata, an item's RpcStatus.owner), which sends
// the call or item there.
inline constexpr absl::string_view kOwnerPayload = "type.qparams/owner";

// The part of `name` that is hashed for its slot, Redis Cluster's hash-tag rule: if
// the name has a '{' and, after the first '{', a '}' with at least one character
// between them, the characters between the first '{' and the first '}' after it;
// otherwise the whole name. So "x{a}y", "{a}" and "{a}{b}" hash "a"; "{}x" and "x{"
// hash whole. A scale group and its members name a shared tag to share a slot. The
// clients send this part in kSessionHeader, so HAProxy hashes the same bytes.
// Returns a view into `name`. Thread-safe.
absl::string_view HashedPart(absl::string_view name);

// `name` without the two braces of its hash tag (HashedPart's rule): "{model.l0}.q"
// -> "model.l0.q"; a name with no hash tag is returned whole. Exports use it, so a
// tag chosen for placement does not leak into a checkpoint's tensor names.
std::string WithoutHashTagBraces(absl::string_view name);

// crc32(HashedPart(name)) mod kSlotCount (zlib's CRC-32 over the bytes). Names
// without a hash tag hash whole, as before hash tags. Thread-safe.
int SlotOf(absl::string_view name);

}  // namespace qparams

#endif  // QPARAMS_COMMON_SLOT_H_

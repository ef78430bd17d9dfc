"""The calls of qparams.Client about the server rather than its sessions: its
calculators, the sharded deployment's topology and slot map (docs/sharding.md), and
the health protocol."""

from __future__ import annotations

import grpc

from qparams._client_core import ClientCore, Metadata, joined
from qparams._errors import error_from_rpc
from qparams._health.v1 import health_pb2
from qparams.v1 import qparams_pb2 as pb

__all__ = ["ServerCalls"]


class ServerCalls(ClientCore):
    """qparams.Client's calls on the server and the deployment."""

    def list_calculators(self, *,
                         timeout: float | None = None, metadata: Metadata = None
                        ) -> list[pb.CalculatorInfo]:
        """The calculator registry (key, stateful, description), sorted by key."""
        return list(self._call("ListCalculators", pb.ListCalculatorsRequest(), timeout,
                               metadata).calculators)

    def topology(self, *, timeout: float | None = None, metadata: Metadata = None) -> pb.Topology:
        """Which replica owns which slots (GetTopology): slot_count, the answering
        replica_id, the slot ranges and the replicas. A session's slot is
        zlib.crc32(part.encode()) % slot_count, the part being the name's hash tag
        (between its first "{" and the next "}", if not empty) or else the whole
        name. An unsharded server is one replica "" owning every slot. `epoch` is the
        slot map's (0 without one); a newer one than this client routes by replaces
        its routing."""
        topology = self._read_topology(self._router.replicas(), timeout=timeout,
                                       metadata=metadata)
        self._router.offer(topology)
        return topology

    def set_slot_map(self, slot_map: str, *, timeout: float | None = None,
                     metadata: Metadata = None) -> pb.Topology:
        """Admin: gives the replica this client reaches (its `replica`, through a
        balancer) the slot map `slot_map`, a slot map file's text ("# epoch N"
        included), and returns that replica's topology after it (ClusterAdmin.SetSlotMap,
        docs/sharding.md). Raises InvalidArgument for a map that does not parse,
        FailedPrecondition for an older epoch or a server without sharding,
        Unauthenticated without a valid token, PermissionDenied with a tenant's
        token or on a server without --admin_tokens_file (docs/security.md)."""
        topology = self._call("SetSlotMap", pb.SetSlotMapRequest(map=slot_map), timeout,
                              metadata)
        self._router.offer(topology)
        return topology

    def health(self, service: str = "", *,
               timeout: float | None = None, metadata: Metadata = None) -> str:
        """The serving status of `service` ("" = the server; "qparams.v1.QParamsService"):
        "SERVING" or "NOT_SERVING". Sends no token."""
        self._in_this_process()
        sent = joined(self._health_metadata, metadata)
        try:
            response = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                  timeout=timeout or self.timeout, metadata=sent)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

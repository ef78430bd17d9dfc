#!/usr/bin/python3
"""The slot-map attack on a deployment, run by docker/test.sh: the two admin calls
(qparams.v1.ClusterAdmin) that, on a replica open to cluster control, erased every
session (issue 38):

  1. SetSlotMap with a map giving all 256 slots to a made-up replica at an epoch far
     above the deployment's, so that the attacked replica owns nothing;
  2. DropSlots 0:255, which deletes the sessions of slots the replica does not own.

  PYTHONPATH=build/python /usr/bin/python3 docker/attack.py TARGET [options]

Prints one JSON object: each call's status code name ("OK", "UNAUTHENTICATED", ...)
and message, e.g. {"SetSlotMap": ["PERMISSION_DENIED", "..."], "DropSlots": [...]}.
Exits 0 whatever the codes (docker/test.sh judges them); 2 on a usage error.

  --ca FILE           TLS, verifying the server against this PEM CA (else plaintext)
  --server-name NAME  the name the certificate is checked for (default: TARGET's host)
  --token TOKEN       send "authorization: Bearer TOKEN" (default: none)
  --replica NAME      address the calls to this replica through HAProxy
                      (x-qparams-replica), as qparams-cli --replica does
  --timeout SECONDS   per call (default 10)
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc

from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc

# All 256 slots to a replica no deployment has, at an epoch above any real one.
EVIL_MAP = "# epoch 999999\n0:255 evil\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target")
    parser.add_argument("--ca")
    parser.add_argument("--server-name")
    parser.add_argument("--token")
    parser.add_argument("--replica")
    parser.add_argument("--timeout", type=float, default=10.0)
    options = parser.parse_args()

    if options.ca:
        with open(options.ca, "rb") as f:
            credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
        channel_options = []
        if options.server_name:
            channel_options.append(("grpc.ssl_target_name_override", options.server_name))
        channel = grpc.secure_channel(options.target, credentials, options=channel_options)
    else:
        channel = grpc.insecure_channel(options.target)
    metadata = []
    if options.token:
        metadata.append(("authorization", f"Bearer {options.token}"))
    if options.replica:
        metadata.append(("x-qparams-replica", options.replica))

    stub = pb_grpc.ClusterAdminStub(channel)
    result = {}
    calls = (("SetSlotMap", stub.SetSlotMap, pb.SetSlotMapRequest(map=EVIL_MAP)),
             ("DropSlots", stub.DropSlots, pb.DropSlotsRequest(low=0, high=255)))
    for name, method, request in calls:
        try:
            response = method(request, timeout=options.timeout, metadata=metadata)
            result[name] = ["OK", str(response).replace("\n", " ").strip()]
        except grpc.RpcError as e:
            result[name] = [e.code().name, e.details() or ""]
    channel.close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

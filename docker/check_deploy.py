#!/usr/bin/python3
"""Static checks of the deployment files, run by docker/test.sh (Debian's python3-yaml).

  /usr/bin/python3 docker/check_deploy.py            checks; prints what it checked
  /usr/bin/python3 docker/check_deploy.py sync-configmaps
                                                     rewrites the ConfigMaps of
                                                     kubernetes-sharded.yaml from
                                                     haproxy/slots.map and haproxy.cfg
  /usr/bin/python3 docker/check_deploy.py podman-args SERVICE [options]
                                                     the `podman run` arguments of a
                                                     compose service (docker/test.sh runs
                                                     the sharded profile with them)

Checked, for the sharded form (issue 16) against docker/haproxy/slots.map:
- the slot map gives every slot 0..255 exactly one owner, as qparams' parser reads it;
- haproxy.cfg has one backend per replica of the map, then spare backends (their
  servers disabled) up to r7, then the pool `any` (the default backend: calls naming
  no session) with a server per backend tracking its health, each server's address from
  QPARAMS_R<i> and its health checked with GET /healthz over HTTP/1.1 on port
  QPARAMS_R<i>_CHECK_PORT (default 9100, the replicas' --metrics_listen), and reads the
  slot map through QPARAMS_SLOT_MAP;
- compose.yaml: the single server `qparams` unchanged (no profile, 127.0.0.1:50051) but
  for --metrics_listen on 9100 and the health check asking GET /healthz there; the
  profile sharded is exactly r0, r1, r2 (one per replica of the map, named after it,
  with its own volume, the map mounted read-only, --metrics_listen, and the single
  server's image, health check, stop grace and hardening) and haproxy (the config and map
  read-only, 127.0.0.1:50052, QPARAMS_R<i> naming the replica services, read-only root
  with a tmpfs for its socket);
- kubernetes-sharded.yaml: its ConfigMaps hold slots.map and haproxy.cfg verbatim; the
  StatefulSet's replicas equal the map's, its pods name themselves r<ordinal>, read the
  map from the ConfigMap, serve metrics on the annotated port, and are probed with HTTP
  GET /healthz (readiness) and /livez (startup, liveness) on it (kubernetes.yaml's pod
  too); the Services select the right pods; HAProxy's QPARAMS_R<i> are the pods' DNS names under the headless Service;
- kubernetes.yaml: the single-replica form still stands, and no selector of either file
  matches the other's pods.

Checked for TLS and tokens (issue 38), on every shipped form:
- every server (compose's qparams, r0, r1, r2; both StatefulSets) runs with --tls_cert,
  --tls_key, --auth_tokens_file and --admin_tokens_file, each a file of a secret the
  server mounts (compose: /run/secrets/NAME of a secret it lists, whose file is under
  ${QPARAMS_TLS_DIR:-./tls}; Kubernetes: a volume of the Secret qparams-tls holding
  that key), and none with --allow_insecure;
- haproxy.cfg: with QPARAMS_TLS_CERT its bind is TLS (ssl crt, alpn h2); with
  QPARAMS_TLS_CA the replicas' and the pool's servers are TLS, verified (ssl verify
  required ca-file verifyhost, alpn h2), the replicas' health checks not (no-check-ssl,
  plain HTTP to the metrics port); nothing says verify none;
- HAProxy in compose and Kubernetes sets QPARAMS_TLS_CERT and QPARAMS_TLS_CA to files
  of its mounted secret (tls.key beside tls.crt), and gets no token.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import sys

import yaml

DOCKER = pathlib.Path(__file__).resolve().parent
SLOT_MAP = DOCKER / "haproxy/slots.map"
HAPROXY_CFG = DOCKER / "haproxy/haproxy.cfg"
COMPOSE = DOCKER / "compose.yaml"
K8S = DOCKER / "kubernetes.yaml"
K8S_SHARDED = DOCKER / "kubernetes-sharded.yaml"
SLOTS = 256
MAP_IN_CONTAINER = "/etc/qparams/slots.map"
CFG_IN_CONTAINER = "/etc/haproxy/haproxy.cfg"  # docker/haproxy/Dockerfile's -f
METRICS_PORT = 9100  # --metrics_listen in compose and Kubernetes: /metrics, /healthz, /livez
METRICS_LISTEN = f"--metrics_listen=0.0.0.0:{METRICS_PORT}"
# haproxy.cfg's backends: the replicas r0.. of the map, then spares (disabled) up to r7,
# so that adding a replica needs no reload.
BACKENDS = [f"r{i}" for i in range(8)]
POOL = "any"  # the default backend: calls naming no session go to any healthy replica

# TLS and tokens (issue 38): the server flags every shipped server form passes, each
# naming a file of the deployment's secret (compose's secrets, the Kubernetes Secret).
TLS_FLAGS = {"--tls_cert": "tls.crt", "--tls_key": "tls.key",
             "--auth_tokens_file": "tokens", "--admin_tokens_file": "admin-tokens"}
# HAProxy's variables (haproxy.cfg): its certificate (the key beside it) and the CA of
# the replicas' certificates.
HAPROXY_TLS_ENV = {"QPARAMS_TLS_CERT": "tls.crt", "QPARAMS_TLS_CA": "ca.crt"}
K8S_SECRET = "qparams-tls"
COMPOSE_SECRETS_DIR = "/run/secrets"
TLS_DIR_DEFAULT = "./tls"  # compose's ${QPARAMS_TLS_DIR:-./tls}, relative to docker/

failures: list[str] = []


def check(condition: bool, what: str) -> bool:
    if not condition:
        failures.append(what)
    return condition


def parse_slot_map(text: str) -> list[str]:
    """The owner of each slot, as common/slot_map.cc reads the file."""
    owner = [""] * SLOTS
    for number, line in enumerate(text.split("\n"), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ValueError(f"slot map line {number}: {line!r}")
        low, _, high = fields[0].partition(":")
        low_slot, high_slot = int(low), int(high or low)
        for slot in range(low_slot, high_slot + 1):
            if owner[slot]:
                raise ValueError(f"slot map line {number}: slot {slot} given twice")
            owner[slot] = fields[1]
    missing = [s for s in range(SLOTS) if not owner[s]]
    if missing:
        raise ValueError(f"slot map: slots without an owner: {missing[:5]}...")
    return owner


def replicas_of(owner: list[str]) -> list[str]:
    return sorted(set(owner))


def check_slot_map() -> list[str]:
    text = SLOT_MAP.read_text()
    replicas = replicas_of(parse_slot_map(text))
    check(replicas == [f"r{i}" for i in range(len(replicas))],
          f"slots.map: replicas {replicas} are not r0..r{len(replicas) - 1}")
    # HAProxy's map files take only whole-line comments: a trailing one would become
    # part of the value (the backend's name).
    for line in text.splitlines():
        check("#" not in line or line.lstrip().startswith("#"),
              f"slots.map: a comment after a value: {line!r}")
    print(f"slots.map: {len(replicas)} replicas {replicas}, every slot owned once")
    return replicas


def check_haproxy_cfg(replicas: list[str]) -> None:
    cfg = HAPROXY_CFG.read_text()
    backends = re.findall(r"^backend (\S+)", cfg, re.M)
    check(backends == BACKENDS + [POOL] and backends[:len(replicas)] == replicas,
          f"haproxy.cfg: backends {backends}, not the slot map's replicas {replicas} then spares "
          f"up to {BACKENDS[-1]}, then the pool {POOL}")
    check(re.search(rf"^\s*default_backend {POOL}$", cfg, re.M) is not None,
          f"haproxy.cfg: the default backend is not the pool {POOL}")
    pool = cfg[cfg.index(f"backend {POOL}"):]
    for i, backend in enumerate(BACKENDS):
        check(re.search(rf'^\s*server {backend} "\$\{{QPARAMS_R{i}-{backend}:50051\}}" '
                        rf"track {backend}/{backend}$", pool, re.M) is not None,
              f"haproxy.cfg: the pool {POOL} has no server {backend} tracking {backend}/{backend}")
    for i, backend in enumerate(BACKENDS):
        spare = backend not in replicas
        check(re.search(rf'^\s*server {backend} "\$\{{QPARAMS_R{i}-{backend}:50051\}}"', cfg, re.M)
              is not None, f"haproxy.cfg: backend {backend}'s server is not \"${{QPARAMS_R{i}-...}}\"")
        check(re.search(rf'^\s*server {backend} .* port "\$\{{QPARAMS_R{i}_CHECK_PORT-{METRICS_PORT}\}}"'
                        r" check-proto h1" + (" disabled" if spare else "") + "$", cfg, re.M)
              is not None,
              f"haproxy.cfg: backend {backend} is not checked on port \"${{QPARAMS_R{i}_CHECK_PORT-"
              f"{METRICS_PORT}}}\" with check-proto h1" + (", disabled (a spare)" if spare else ""))
    check(re.search(r"^\s*http-check send meth GET uri /healthz ver HTTP/1.1\b", cfg, re.M) is not None
          and re.search(r"^\s*http-check expect status 200$", cfg, re.M) is not None
          and re.search(r"^\s*option httpchk$", cfg, re.M) is not None,
          "haproxy.cfg: the replicas' health check is not GET /healthz expecting 200")
    check(f"map_int(${{QPARAMS_SLOT_MAP-{MAP_IN_CONTAINER}}})" in cfg,
          "haproxy.cfg: the slot map is not map_int(${QPARAMS_SLOT_MAP-...})")
    check(re.search(r'^\s*bind "\$\{QPARAMS_BIND-:50051\}"', cfg, re.M) is not None,
          "haproxy.cfg: bind is not \"${QPARAMS_BIND-:50051}\"")
    check("@" + "R0@" not in cfg and "@BIND@" not in cfg, "haproxy.cfg: a template placeholder is left")
    check_haproxy_tls(cfg)
    print(f"haproxy.cfg: backends {backends} ({len(BACKENDS) - len(replicas)} spares, disabled, "
          f"and the pool {POOL}), addresses from QPARAMS_R0..R{len(BACKENDS) - 1}")


def conditional_blocks(cfg: str, variable: str) -> list[str]:
    """The lines between each `.if defined(VARIABLE)` and its `.else`/`.endif`."""
    return re.findall(rf"^\.if defined\({variable}\)\n(.*?)^\.(?:else|endif)\b", cfg, re.M | re.S)


def section(cfg: str, header: str) -> str:
    """The text of the section starting with the line `header`, up to the next one."""
    match = re.search(rf"^{re.escape(header)}\n(.*?)(?=^(?:global|defaults|frontend|backend|"
                      r"resolvers|listen)\b|\Z)", cfg, re.M | re.S)
    return match[1] if match else ""


def check_haproxy_tls(cfg: str) -> None:
    """TLS on both sides when the shipped forms' variables are set, checks in plain HTTP."""
    code = "\n".join(line.split("#", 1)[0] for line in cfg.splitlines())
    binds = conditional_blocks(section(code, "frontend grpc"), "QPARAMS_TLS_CERT")
    check(any(re.search(r'^\s*bind "\$\{QPARAMS_BIND-:50051\}" ssl crt "\$\{QPARAMS_TLS_CERT\}"'
                        r" .*\balpn h2\b", b, re.M) for b in binds),
          "haproxy.cfg: no `.if defined(QPARAMS_TLS_CERT)` bind with ssl crt \"${QPARAMS_TLS_CERT}\" "
          "alpn h2 in the frontend grpc")
    verified = (r'^\s*default-server ssl verify required ca-file "\$\{QPARAMS_TLS_CA\}" '
                r'verifyhost "\$\{QPARAMS_TLS_VERIFYHOST-[\w.-]+\}" alpn h2\b(?P<rest>.*)$')
    for name in ("defaults replica", "defaults pool"):
        found = [m for b in conditional_blocks(section(code, name), "QPARAMS_TLS_CA")
                 for m in re.finditer(verified, b, re.M)]
        check(len(found) == 1, f"haproxy.cfg: {name} has no `.if defined(QPARAMS_TLS_CA)` default-server "
              "ssl verify required ca-file \"${QPARAMS_TLS_CA}\" verifyhost ... alpn h2")
        if name == "defaults replica" and found:
            check("no-check-ssl" in found[0]["rest"].split(),
                  "haproxy.cfg: the replicas' TLS default-server lacks no-check-ssl (the health "
                  "checks are plain HTTP to the metrics port)")
    check(re.search(r"^\s*ssl-load-extra-del-ext\s*$", section(code, "global"), re.M) is not None,
          "haproxy.cfg: no ssl-load-extra-del-ext in global (QPARAMS_TLS_CERT's key beside it, tls.key)")
    check(re.search(r"\bverify\s+none\b", code) is None and "ssl-server-verify none" not in code,
          "haproxy.cfg: something says verify none")
    check(re.search(r"(?<![\w-])check-ssl\b", code) is None,
          "haproxy.cfg: check-ssl: the health checks are plain HTTP to the metrics port")
    print("haproxy.cfg: TLS bind with QPARAMS_TLS_CERT; replicas re-encrypted and verified with "
          "QPARAMS_TLS_CA; health checks plain HTTP")


def flag_values(args: list[str]) -> dict[str, str]:
    """--flag=value arguments as a dict."""
    return dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)


def check_server_tls(where: str, args: list[str], files: dict[str, str]) -> None:
    """The server's TLS and tokens flags each name the file of its secret `files` maps
    the path to (container path -> the secret's key), and no --allow_insecure."""
    flags = flag_values(args)
    for flag, key in TLS_FLAGS.items():
        path = flags.get(flag)
        check(path is not None and files.get(path) == key,
              f"{where}: {flag} is {path!r}, not the file {key} of its mounted secret")
    check(not any(a.startswith("--allow_insecure") for a in args), f"{where}: --allow_insecure")


def check_haproxy_env(where: str, env: dict, files: dict[str, str]) -> None:
    for variable, key in HAPROXY_TLS_ENV.items():
        path = env.get(variable)
        check(path is not None and files.get(path) == key,
              f"{where}: {variable} is {path!r}, not the file {key} of its mounted secret")
    cert = env.get("QPARAMS_TLS_CERT") or ""
    check(files.get(cert.rsplit(".", 1)[0] + ".key") == "tls.key",
          f"{where}: no tls.key beside QPARAMS_TLS_CERT (haproxy.cfg's ssl-load-extra-del-ext)")
    check(not {"tokens", "admin-tokens"} & set(files.values()), f"{where}: HAProxy gets tokens it does not need")


# ---- compose ------------------------------------------------------------------------------
HARDENING = ("image", "healthcheck", "stop_signal", "stop_grace_period", "restart",
             "read_only", "security_opt", "cap_drop")


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def bind_mounts(service: dict) -> dict[str, tuple[str, str]]:
    """Container path -> (host path relative to docker/, mode) of the bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        parts = volume.split(":")
        if parts[0].startswith("."):
            mounts[parts[1]] = (parts[0], parts[2] if len(parts) > 2 else "rw")
    return mounts


def named_volumes(service: dict) -> dict[str, str]:
    """Container path -> named volume."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])
            if not v.startswith((".", "/"))}


def interpolate(text: str) -> str:
    """compose's ${VAR:-DEFAULT}, ${VAR-DEFAULT} and ${VAR} from this environment."""
    def value(match: re.Match) -> str:
        name, op, default = match[1], match[2], match[3] or ""
        current = os.environ.get(name)
        if op == ":-":
            return current or default
        if op == "-":
            return default if current is None else current
        return current or ""
    return re.sub(r"\$\{(\w+)(?:(:?-)([^}]*))?\}", value, text)


def compose_secret_files(compose: dict, service: dict) -> dict[str, str]:
    """Container path -> secret name of the secrets a service lists (short syntax, or
    long with an optional target), each defined at the top level by a file."""
    files = {}
    for entry in service.get("secrets", []):
        name = entry if isinstance(entry, str) else entry.get("source")
        target = name if isinstance(entry, str) else entry.get("target", name)
        if check("file" in compose.get("secrets", {}).get(name, {}),
                 f"compose: the secret {name} is not defined by a file"):
            files[target if target.startswith("/") else f"{COMPOSE_SECRETS_DIR}/{target}"] = name
    return files


def check_compose_tls(compose: dict, servers: list[str]) -> None:
    secrets = compose.get("secrets", {})
    for key in sorted(set(TLS_FLAGS.values()) | set(HAPROXY_TLS_ENV.values())):
        file = secrets.get(key, {}).get("file", "")
        check(file == f"${{QPARAMS_TLS_DIR:-{TLS_DIR_DEFAULT}}}/{key}",
              f"compose: the secret {key} is not the file ${{QPARAMS_TLS_DIR:-{TLS_DIR_DEFAULT}}}/{key}")
    services = compose["services"]
    for name in servers:
        s = services.get(name, {})
        files = compose_secret_files(compose, s)
        check_server_tls(f"compose: {name}", s.get("command", []), files)
        check(files.get(f"{COMPOSE_SECRETS_DIR}/ca.crt") == "ca.crt",
              f"compose: {name} lacks the secret ca.crt (its in-container CLI, the image's HEALTHCHECK)")
    h = services.get("haproxy", {})
    check_haproxy_env("compose: haproxy", h.get("environment") or {}, compose_secret_files(compose, h))
    print(f"compose.yaml: {', '.join(servers)} with TLS and both tokens files; haproxy TLS on both sides")


def check_compose(replicas: list[str]) -> None:
    compose = load_compose()
    services = compose["services"]
    check_compose_tls(compose, ["qparams"] + replicas)
    single = services.get("qparams", {})
    check("profiles" not in single, "compose: the service qparams got a profile")
    check(single.get("ports") == ["127.0.0.1:50051:50051"], "compose: qparams is not on 127.0.0.1:50051")
    check(METRICS_LISTEN in single.get("command", []), f"compose: qparams lacks {METRICS_LISTEN}")
    test = " ".join(single.get("healthcheck", {}).get("test", []))
    check(f"/dev/tcp/127.0.0.1/{METRICS_PORT}" in test and "GET /healthz" in test and " 200 " in test,
          f"compose: qparams's health check does not ask GET /healthz on {METRICS_PORT} for 200")
    check(named_volumes(single) == {"/data": "qparams-data"}, "compose: qparams's volume changed")
    sharded = sorted(name for name, s in services.items() if "sharded" in s.get("profiles", []))
    check(sharded == sorted(replicas + ["haproxy"]),
          f"compose: profile sharded has {sharded}, not {replicas} and haproxy")
    volumes_used = set()
    for replica in replicas:
        s = services.get(replica)
        if not check(s is not None, f"compose: no service {replica}"):
            continue
        command = s.get("command", [])
        check(f"--replica_id={replica}" in command, f"compose: {replica} is not --replica_id={replica}")
        check(f"--slot_map={MAP_IN_CONTAINER}" in command, f"compose: {replica} lacks --slot_map")
        check(METRICS_LISTEN in command, f"compose: {replica} lacks {METRICS_LISTEN}")
        check(bind_mounts(s).get(MAP_IN_CONTAINER) == ("./haproxy/slots.map", "ro"),
              f"compose: {replica} does not mount ./haproxy/slots.map read-only")
        data = named_volumes(s).get("/data")
        check(data is not None and data not in volumes_used and data in compose.get("volumes", {}),
              f"compose: {replica} has no volume of its own at /data")
        volumes_used.add(data)
        for key in HARDENING:
            check(s.get(key) == single.get(key),
                  f"compose: {replica}'s {key} differs from the service qparams's")
        check(not s.get("ports"), f"compose: {replica} publishes a port (only haproxy should)")
    h = services.get("haproxy")
    if check(h is not None, "compose: no service haproxy"):
        check(h.get("build", {}).get("context") == "haproxy"
              and (DOCKER / "haproxy" / h["build"].get("dockerfile", "Dockerfile")).is_file(),
              "compose: haproxy is not built from docker/haproxy/Dockerfile")
        check(sorted(h.get("depends_on", [])) == replicas, "compose: haproxy does not depend on the replicas")
        check(h.get("ports") == ["127.0.0.1:50052:50051"], "compose: haproxy is not on 127.0.0.1:50052")
        mounts = bind_mounts(h)
        check(mounts.get(CFG_IN_CONTAINER) == ("./haproxy/haproxy.cfg", "ro"),
              "compose: haproxy does not mount ./haproxy/haproxy.cfg read-only")
        check(mounts.get(MAP_IN_CONTAINER) == ("./haproxy/slots.map", "ro"),
              "compose: haproxy does not mount ./haproxy/slots.map read-only")
        env = h.get("environment", {})
        for i, replica in enumerate(replicas):
            check(env.get(f"QPARAMS_R{i}") == f"{replica}:50051",
                  f"compose: haproxy's QPARAMS_R{i} is not the service {replica}")
        check(h.get("read_only") is True and h.get("cap_drop") == ["ALL"]
              and h.get("security_opt") == ["no-new-privileges:true"],
              "compose: haproxy is not hardened like the servers")
        check(h.get("tmpfs") == ["/run/haproxy"], "compose: haproxy has no tmpfs for its socket")
    for path in {m[0] for s in services.values() for m in bind_mounts(s).values()}:
        check((DOCKER / path).is_file(), f"compose: {path} does not exist")
    print(f"compose.yaml: qparams as before, with /healthz on {METRICS_PORT}; profile sharded: {sharded}")


def podman_args(service_name: str, image: str, volume_prefix: str, host_port: str | None,
                drop: list[str]) -> list[str]:
    """`podman run` arguments equivalent to the compose service (for a user network)."""
    s = load_compose()["services"][service_name]
    args = ["--network-alias", service_name]
    if s.get("read_only"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    args += [f"--cap-drop={c}" for c in s.get("cap_drop", [])]
    args += ["--security-opt=" + o.replace(":true", "") for o in s.get("security_opt", [])]
    args += [f"--tmpfs={t}" for t in s.get("tmpfs", [])]
    if "stop_signal" in s:
        args.append(f"--stop-signal={s['stop_signal']}")
    # The health check as compose runs it (`podman healthcheck run` runs it on demand).
    if test := s.get("healthcheck", {}).get("test"):
        if test[0] != "CMD":
            raise SystemExit(f"{service_name}: a healthcheck test that is not [\"CMD\", ...]")
        args.append("--health-cmd=" + json.dumps(test[1:]))
    for key, value in (s.get("environment") or {}).items():
        args += ["-e", f"{key}={value}"]
    for volume in s.get("volumes", []):
        parts = volume.split(":")
        if parts[0].startswith("."):
            parts[0] = str((DOCKER / parts[0]).resolve())
        else:
            parts[0] = volume_prefix + parts[0]
        args += ["-v", ":".join(parts)]
    # compose's file secrets are read-only bind mounts of the files as they are
    # (docker compose and podman-compose alike), at /run/secrets/NAME.
    compose = load_compose()
    for target, name in compose_secret_files(compose, s).items():
        source = DOCKER / interpolate(compose["secrets"][name]["file"])
        if not source.is_file():
            raise SystemExit(f"{service_name}: the secret {name}'s file {source} does not exist "
                             "(scripts/make-dev-ca.sh; QPARAMS_TLS_DIR)")
        args += ["-v", f"{source.resolve()}:{target}:ro"]
    for port in s.get("ports", []):
        if host_port is None:
            raise SystemExit(f"{service_name} publishes {port}: give --host-port")
        args += ["-p", f"127.0.0.1:{host_port}:{port.rsplit(':', 1)[1]}"]
    args.append(image)
    args += [a for a in s.get("command", []) if not any(a.startswith(d) for d in drop)]
    return args


# ---- Kubernetes ---------------------------------------------------------------------------
def by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs if d}


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def check_probes(where: str, container: dict) -> None:
    """The pod's probes are HTTP GETs on its metrics port: /healthz for readiness, /livez
    for startup and liveness, and the port is --metrics_listen's."""
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    check(ports.get("metrics") == METRICS_PORT and METRICS_LISTEN in container.get("args", []),
          f"{where}: no metrics port {METRICS_PORT} with {METRICS_LISTEN}")
    for probe, path in (("startupProbe", "/livez"), ("readinessProbe", "/healthz"),
                        ("livenessProbe", "/livez")):
        get = container.get(probe, {}).get("httpGet", {})
        check(get.get("path") == path and get.get("port") == "metrics",
              f"{where}: {probe} is not an httpGet of {path} on the port metrics")


def k8s_secret_files(pod_spec: dict, container: dict) -> dict[str, str]:
    """Container path -> key of the Secret qparams-tls mounted in the container (all its
    keys, or the items listed)."""
    volumes = {v["name"]: v.get("secret") for v in pod_spec.get("volumes", []) if "secret" in v}
    files = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"])
        if not secret or secret.get("secretName") != K8S_SECRET or mount.get("subPath"):
            continue
        check(mount.get("readOnly") is True, f"the Secret {K8S_SECRET} is not mounted read-only")
        keys = ({i["key"]: i["path"] for i in secret["items"]} if "items" in secret
                else {k: k for k in set(TLS_FLAGS.values()) | set(HAPROXY_TLS_ENV.values())})
        for key, path in keys.items():
            files[f"{mount['mountPath'].rstrip('/')}/{path}"] = key
    return files


def check_kubernetes_tls(where: str, pod_spec: dict) -> None:
    container = pod_spec["containers"][0]
    check_server_tls(where, container.get("args", []), k8s_secret_files(pod_spec, container))


def check_kubernetes(replicas: list[str]) -> None:
    single = by_kind(list(yaml.safe_load_all(K8S.read_text())))
    docs = by_kind(list(yaml.safe_load_all(K8S_SHARDED.read_text())))
    print(f"kubernetes.yaml: {sorted(single)}")
    print(f"kubernetes-sharded.yaml: {sorted(docs)}")
    one = single.get(("StatefulSet", "qparams"))
    if check(one is not None and one["spec"]["replicas"] == 1, "kubernetes.yaml: no one-replica StatefulSet qparams"):
        check_probes("kubernetes.yaml", one["spec"]["template"]["spec"]["containers"][0])
        check_kubernetes_tls("kubernetes.yaml: StatefulSet qparams", one["spec"]["template"]["spec"])

    slot_cm = docs.get(("ConfigMap", "qparams-slot-map"), {}).get("data", {})
    cfg_cm = docs.get(("ConfigMap", "qparams-haproxy"), {}).get("data", {})
    hint = "; regenerate it: /usr/bin/python3 docker/check_deploy.py sync-configmaps"
    check(slot_cm.get("slots.map") == SLOT_MAP.read_text(),
          "kubernetes-sharded.yaml: ConfigMap qparams-slot-map is not docker/haproxy/slots.map" + hint)
    check(cfg_cm.get("haproxy.cfg") == HAPROXY_CFG.read_text(),
          "kubernetes-sharded.yaml: ConfigMap qparams-haproxy is not docker/haproxy/haproxy.cfg" + hint)

    sts = docs.get(("StatefulSet", "qparams-shard"))
    headless = docs.get(("Service", "qparams-shard-headless"))
    haproxy = docs.get(("Deployment", "qparams-haproxy"))
    front = docs.get(("Service", "qparams-sharded"))
    if not check(None not in (sts, headless, haproxy, front),
                 "kubernetes-sharded.yaml: missing StatefulSet qparams-shard, Service "
                 "qparams-shard-headless, Deployment qparams-haproxy or Service qparams-sharded"):
        return
    spec = sts["spec"]
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    check(spec["replicas"] == len(replicas),
          f"StatefulSet qparams-shard: {spec['replicas']} replicas, the slot map {len(replicas)}")
    check(matches(spec["selector"]["matchLabels"], labels), "StatefulSet: its selector misses its pods")
    check(spec["serviceName"] == "qparams-shard-headless", "StatefulSet: serviceName is not the headless Service")
    check(headless["spec"].get("clusterIP") == "None" and matches(headless["spec"]["selector"], labels),
          "Service qparams-shard-headless: not headless or not selecting the replica pods")
    annotations = pod["metadata"].get("annotations", {})
    check(annotations.get("prometheus.io/scrape") == "true" and annotations.get("prometheus.io/port") == "9100"
          and annotations.get("prometheus.io/path") == "/metrics",
          "StatefulSet: the pods lack the prometheus.io annotations")
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    check(ports == {"grpc": 50051, "metrics": METRICS_PORT}, f"StatefulSet: container ports {ports}")
    check_probes("StatefulSet qparams-shard", container)
    check_kubernetes_tls("kubernetes-sharded.yaml: StatefulSet qparams-shard", pod["spec"])
    env = {e["name"]: e for e in container.get("env", [])}
    check(env.get("POD_INDEX", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.labels['apps.kubernetes.io/pod-index']",
          "StatefulSet: POD_INDEX is not the pod-index label")
    args = container.get("args", [])
    # Pod N is replica rN: the slot map's names must be r0..r{replicas-1}.
    check("--replica_id=r$(POD_INDEX)" in args, "StatefulSet: --replica_id is not r$(POD_INDEX)")
    check(replicas == [f"r{i}" for i in range(spec["replicas"])],
          "StatefulSet: the pods' names r<ordinal> are not the slot map's")
    check(f"--slot_map={MAP_IN_CONTAINER}" in args and "--metrics_listen=0.0.0.0:9100" in args,
          f"StatefulSet: args {args}")
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    map_mount = mounts.get(str(pathlib.PurePosixPath(MAP_IN_CONTAINER).parent), {})
    check(volumes.get(map_mount.get("name"), {}).get("configMap", {}).get("name") == "qparams-slot-map"
          and map_mount.get("readOnly") is True,
          "StatefulSet: /etc/qparams is not the ConfigMap qparams-slot-map, read-only")
    check(mounts.get("/data", {}).get("name") in {c["metadata"]["name"] for c in spec["volumeClaimTemplates"]},
          "StatefulSet: /data is not a volume claim")
    check(container["securityContext"].get("readOnlyRootFilesystem") is True
          and pod["spec"]["securityContext"].get("runAsNonRoot") is True,
          "StatefulSet: not non-root with a read-only root")

    hpod = haproxy["spec"]["template"]
    hlabels = hpod["metadata"]["labels"]
    check(matches(haproxy["spec"]["selector"]["matchLabels"], hlabels), "Deployment qparams-haproxy: selector")
    check(matches(front["spec"]["selector"], hlabels) and not matches(front["spec"]["selector"], labels),
          "Service qparams-sharded does not select the HAProxy pods (only)")
    check(not matches(headless["spec"]["selector"], hlabels), "the headless Service selects HAProxy pods")
    hc = hpod["spec"]["containers"][0]
    henv = {e["name"]: e.get("value") for e in hc.get("env", [])}
    check_haproxy_env("kubernetes-sharded.yaml: Deployment qparams-haproxy", henv,
                      k8s_secret_files(hpod["spec"], hc))
    # Every backend, the spares too: a pod of a scaled-up StatefulSet resolves.
    for i in range(len(BACKENDS)):
        want = (f"qparams-shard-{i}.qparams-shard-headless.$(POD_NAMESPACE).svc.cluster.local:50051")
        check(henv.get(f"QPARAMS_R{i}") == want, f"Deployment qparams-haproxy: QPARAMS_R{i} is not {want}")
    hports = {p["name"] for p in hc["ports"]}
    check(front["spec"]["ports"][0]["targetPort"] in hports, "Service qparams-sharded: targetPort")
    hvolumes = {v["name"]: v for v in hpod["spec"].get("volumes", [])}
    hmounts = {m["mountPath"]: m["name"] for m in hc["volumeMounts"]}

    def configmap_at(path: str) -> str | None:
        return hvolumes.get(hmounts.get(path), {}).get("configMap", {}).get("name")

    check(configmap_at(str(pathlib.PurePosixPath(CFG_IN_CONTAINER).parent)) == "qparams-haproxy",
          "Deployment qparams-haproxy: /etc/haproxy is not the ConfigMap qparams-haproxy")
    check(configmap_at(str(pathlib.PurePosixPath(MAP_IN_CONTAINER).parent)) == "qparams-slot-map",
          "Deployment qparams-haproxy: /etc/qparams is not the ConfigMap qparams-slot-map")
    check("emptyDir" in hvolumes.get(hmounts.get("/run/haproxy"), {}),
          "Deployment qparams-haproxy: no emptyDir at /run/haproxy")
    check(hc["securityContext"].get("readOnlyRootFilesystem") is True
          and hpod["spec"]["securityContext"].get("runAsNonRoot") is True,
          "Deployment qparams-haproxy: not non-root with a read-only root")

    # The two forms side by side: no selector of one matches the other's pods.
    pods_single = [d["spec"]["template"]["metadata"]["labels"] for d in single.values() if "template" in d.get("spec", {})]
    pods_sharded = [labels, hlabels]
    for name, d in list(single.items()) + list(docs.items()):
        selector = d.get("spec", {}).get("selector")
        if not selector:
            continue
        selector = selector.get("matchLabels", selector)
        others = pods_sharded if name in single else pods_single
        check(not any(matches(selector, p) for p in others), f"{name} also selects the other form's pods")
    print(f"kubernetes-sharded.yaml: {spec['replicas']} replicas = the slot map's, ConfigMaps = the files, "
          "selectors and names consistent")
    print("kubernetes.yaml, kubernetes-sharded.yaml: the servers with TLS and both tokens files from the "
          f"Secret {K8S_SECRET}; HAProxy TLS on both sides from it")


CONFIGMAP_FILES = {"slots.map": SLOT_MAP, "haproxy.cfg": HAPROXY_CFG}


def sync_configmaps() -> None:
    """Replaces each `  KEY: |` block of kubernetes-sharded.yaml by its file, verbatim."""
    lines = K8S_SHARDED.read_text().splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        match = re.fullmatch(r"  ([\w.-]+): \|\+?\n", line)
        if not match or match[1] not in CONFIGMAP_FILES:
            out.append(line)
            continue
        while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
            i += 1  # the old content
        path = CONFIGMAP_FILES[match[1]]
        text = path.read_text()
        if "\t" in text or not text.endswith("\n") or text[0].isspace():
            raise SystemExit(f"{path}: a tab, no final newline or a leading space: "
                             "not as a plain block scalar")
        # "|" drops trailing blank lines, "|+" keeps them.
        out.append(f"  {match[1]}: |{'+' if text.endswith(chr(10) * 2) else ''}\n")
        out += [("    " + line) if line.strip() else "\n" for line in text.splitlines(keepends=True)]
    K8S_SHARDED.write_text("".join(out))
    for (kind, name), doc in by_kind(list(yaml.safe_load_all(K8S_SHARDED.read_text()))).items():
        for key, text in (doc.get("data") or {}).items() if kind == "ConfigMap" else ():
            if key in CONFIGMAP_FILES and text != CONFIGMAP_FILES[key].read_text():
                raise SystemExit(f"ConfigMap {name}: {key} still differs after the rewrite")
    print(f"{K8S_SHARDED.name}: ConfigMaps rewritten from {', '.join(CONFIGMAP_FILES)}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", nargs="?", default="check", choices=["check", "podman-args", "sync-configmaps"])
    parser.add_argument("service", nargs="?")
    parser.add_argument("--image", default="")
    parser.add_argument("--volume-prefix", default="")
    parser.add_argument("--host-port")
    parser.add_argument("--drop", action="append", default=[],
                        help="leave out command arguments starting with this")
    options = parser.parse_args()
    if options.command == "sync-configmaps":
        sync_configmaps()
        return 0
    if options.command == "podman-args":
        print(shlex.join(podman_args(options.service, options.image, options.volume_prefix,
                                     options.host_port, options.drop)))
        return 0
    try:
        replicas = check_slot_map()
    except ValueError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    check_haproxy_cfg(replicas)
    check_compose(replicas)
    check_kubernetes(replicas)
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

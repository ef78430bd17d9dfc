#!/usr/bin/env bash
# Builds the qparams image (docker/Dockerfile) with podman and proves it works: health,
# a compute, a session that survives a restart, and a clean exit on SIGTERM. Prints the
# image size. Then the sharded deployment (issue 16): checks the deployment files
# (docker/check_deploy.py: the slot map, compose's profile sharded, the Kubernetes forms;
# haproxy -c on haproxy.cfg with its variables set), builds the HAProxy image
# (docker/haproxy/Dockerfile) and runs compose's profile sharded with podman alone (a
# network, the three replicas and HAProxy, run with the arguments check_deploy.py derives
# from compose.yaml, its health check among them): each replica's compose health check
# (GET /healthz on 9100) is healthy, HAProxy (which checks the same /healthz) reaches
# every replica, and sessions created and observed through HAProxy are each found on
# their owner, with the same qparams, and refused by the other replicas.
# Every form runs as compose runs it, with TLS and tokens (issue 38): the TLS material and
# tokens come from scripts/make-dev-ca.sh (a fresh CA per run, given to the containers as
# compose's secrets), clients call over TLS with a data token, and the slot-map attack
# (docker/attack.py: SetSlotMap giving every slot to a made-up replica, then DropSlots
# 0:255) fails on the single server, on a replica reached directly and through HAProxy:
# no token UNAUTHENTICATED, a data token PERMISSION_DENIED, plaintext to a TLS port
# UNAVAILABLE; every session is still there after, and an admin token's SetSlotMap
# (slotmap push of the same map) is taken. Needs root (apt, podman as root); no container registry: the base image
# debian:bookworm-slim is made locally with debootstrap from the host's apt mirror and
# cached under ${XDG_CACHE_HOME:-$HOME/.cache}/qparams, so reruns skip debootstrap.
#
# Environment: QPARAMS_IMAGE (tag to build, default localhost/qparams:test),
# QPARAMS_HAPROXY_IMAGE (default localhost/qparams-haproxy:test),
# QPARAMS_DEBIAN_MIRROR (default: the host's first Debian mirror), QPARAMS_KEEP_IMAGE=0
# to remove the built images at the end, QPARAMS_REBUILD_BASE=1 to redo debootstrap.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

image=${QPARAMS_IMAGE:-localhost/qparams:test}
haproxy_image=${QPARAMS_HAPROXY_IMAGE:-localhost/qparams-haproxy:test}
base_ref=docker.io/library/debian:bookworm-slim
cache_dir=${XDG_CACHE_HOME:-$HOME/.cache}/qparams
base_tar=$cache_dir/debian-bookworm-slim.tar
max_mb=120
suffix=$$-$RANDOM
ctr=qparams-test-$suffix
vol=$ctr-qparams-data  # compose's volume qparams-data, prefixed (podman-args --volume-prefix)
work=$(mktemp -d /tmp/qparams-docker-test.XXXXXX)
cli=$repo/build/tools/qparams-cli
python=/usr/bin/python3  # Debian's, with python3-yaml
# The sharded run: one network, containers and volumes named after compose's services.
net=qparams-test-net-$suffix
shard=qparams-test-$suffix-
shard_services=(haproxy r0 r1 r2)
start_time=$SECONDS

step() { printf '\n== [%3ds] %s\n' $((SECONDS - start_time)) "$*"; }
fail() { printf '\ndocker/test.sh: FAIL: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "run as root (podman as root, apt, debootstrap)"

# Podman as these machines need it: runc, cgroupfs, file events, fixed ulimits (as flags,
# so nothing in /etc/containers is changed).
# Without systemd, podman logs an error each time it would (un)schedule a HEALTHCHECK
# timer; those lines are dropped (this script runs the health check itself).
pm() {
  podman --runtime=runc --cgroup-manager=cgroupfs --events-backend=file "$@" \
    2> >(grep -v 'unable to get systemd connection' >&2)
}
# The TLS material and tokens of every form (compose's secrets: QPARAMS_TLS_DIR).
tls=$work/tls
export QPARAMS_TLS_DIR=$tls
ulimits=(--ulimit=nofile=20000:20000 --ulimit=nproc=32768:32768)

cleanup() {
  local rc=$?
  set +e
  if [ -n "${ctr_started:-}" ]; then
    if [ $rc -ne 0 ]; then
      echo "--- container log (last 40 lines) ---" >&2
      pm logs --tail=40 "$ctr" >&2 2>&1
    fi
    pm rm -f -t 0 "$ctr" >/dev/null 2>&1
  fi
  pm volume rm -f "$vol" >/dev/null 2>&1
  [ -n "${bare_started:-}" ] && pm rm -f -t 0 "$ctr-bare" >/dev/null 2>&1
  if [ -n "${shard_started:-}" ]; then
    local s
    for s in "${shard_services[@]}"; do
      if [ $rc -ne 0 ] && pm container exists "$shard$s"; then
        echo "--- $shard$s log (last 20 lines) ---" >&2
        pm logs --tail=20 "$shard$s" >&2 2>&1
      fi
      pm rm -f -t 0 "$shard$s" >/dev/null 2>&1
    done
    for s in r0 r1 r2; do pm volume rm -f "${shard}qparams-$s" >/dev/null 2>&1; done
  fi
  [ -n "${net_created:-}" ] && pm network rm -f "$net" >/dev/null 2>&1
  if [ "${QPARAMS_KEEP_IMAGE:-1}" = 0 ]; then
    pm rmi -f "$image" >/dev/null 2>&1
    pm rmi -f "$haproxy_image" >/dev/null 2>&1
  fi
  rm -rf "$work"
  if [ $rc -eq 0 ]; then
    printf '\ndocker/test.sh: PASS in %ds\n' $((SECONDS - start_time))
  else
    printf 'docker/test.sh: FAILED (exit %d) after %ds\n' $rc $((SECONDS - start_time)) >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------
step "host packages (podman, runc, debootstrap)"
need=(podman runc debootstrap uidmap netavark aardvark-dns iptables slirp4netns fuse-overlayfs
      ca-certificates haproxy python3-yaml python3-grpcio openssl)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || fail "apt-get update"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || fail "apt-get install ${missing[*]}"
fi
pm info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}} {{.Store.GraphDriverName}}' \
  || fail "podman does not run"

# The host CLI drives the test from outside the container.
if [ ! -x "$cli" ]; then
  step "host CLI: building build/tools/qparams-cli"
  scripts/install-deps.sh
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j2 --target qparams-cli
fi
[ -x "$cli" ] || fail "no $cli"
# docker/attack.py imports the generated stubs of the Python package (build/python).
if [ ! -f "$repo/build/python/qparams/v1/qparams_pb2_grpc.py" ]; then
  step "host Python package: building build/python"
  cmake --build build --target qparams_python >/dev/null
fi
attack() { PYTHONPATH="$repo/build/python" "$python" docker/attack.py "$@"; }

step "TLS material and tokens: scripts/make-dev-ca.sh $tls"
scripts/make-dev-ca.sh "$tls" >/dev/null || fail "scripts/make-dev-ca.sh"
ls -l "$tls" | tail -n +2
data_token=$(cat "$tls/token")
admin_token=$(cat "$tls/admin-token")
# Every host CLI call below sends the data token (from the environment, not the command line).
export QPARAMS_TOKEN=$data_token

# ---------------------------------------------------------------------------------------
step "deployment files: slot map, haproxy.cfg, compose profile sharded, Kubernetes"
"$python" docker/check_deploy.py || fail "docker/check_deploy.py"
# haproxy.cfg as it is, with its variables set as the test, compose and Kubernetes set
# them (names that do not resolve here only warn: init-addr none).
haproxy_check() {
  local what=$1 out
  shift
  out=$(env QPARAMS_SLOT_MAP="$repo/docker/haproxy/slots.map" QPARAMS_ADMIN_SOCKET="$work/admin.sock" \
    "$@" haproxy -c -f docker/haproxy/haproxy.cfg 2>&1) || { echo "$out" >&2; fail "haproxy -c, $what"; }
  echo "haproxy -c, $what: valid ($(echo "$out" | grep -c WARNING) warnings)"
}
haproxy_check "the Python test's addresses" QPARAMS_BIND="unix@$work/grpc.sock" \
  QPARAMS_R0=127.0.0.1:1 QPARAMS_R1=127.0.0.1:2 QPARAMS_R2=127.0.0.1:3 \
  QPARAMS_R3=127.0.0.1:1 QPARAMS_R4=127.0.0.1:1 QPARAMS_R5=127.0.0.1:1 QPARAMS_R6=127.0.0.1:1 \
  QPARAMS_R7=127.0.0.1:1
# As the shipped forms run it: TLS on both sides (the Python test's run above is h2c).
tls_env=(QPARAMS_TLS_CERT="$tls/tls.crt" QPARAMS_TLS_CA="$tls/ca.crt")
haproxy_check "compose's addresses (the defaults), TLS" "${tls_env[@]}"
k8s_env=()
for i in 0 1 2 3 4 5 6 7; do
  k8s_env+=("QPARAMS_R$i=qparams-shard-$i.qparams-shard-headless.default.svc.cluster.local:50051")
done
haproxy_check "the Kubernetes addresses, TLS" "${k8s_env[@]}" "${tls_env[@]}"

# ---------------------------------------------------------------------------------------
# The host's Debian mirror: QPARAMS_DEBIAN_MIRROR, else the first non-security Debian URI
# of the active apt sources.
host_sources() {
  ls /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true
}
mirror=${QPARAMS_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  # shellcheck disable=SC2046
  mirror=$(sed -n -e 's/^URIs:[[:space:]]*//p' -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?//p' \
      $(host_sources) /dev/null 2>/dev/null | tr -s ' \t' '\n' | grep -E '^https?://' | grep -v -- '-security' | grep -E '/debian/?$' | head -n1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

make_base() {
  local rootfs=$work/rootfs
  step "base image: debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; fail "debootstrap from $mirror"; }

  # Slim like the official bookworm-slim: no docs, man pages or translations (now or in
  # later installs), no .deb cache, no apt lists.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
CFG
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
  printf 'Acquire::Languages "none";\n' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$rootfs/etc/apt/apt.conf.d/docker-no-recommends"
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/* \
         "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
         "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/tmp/* \
         "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old

  # The host's apt sources, so apt inside the build reaches the same mirror; a source
  # whose keyring the rootfs lacks would break apt-get update there, so it is left out.
  rm -f "$rootfs/etc/apt/sources.list"
  local f key ok
  for f in $(host_sources); do
    ok=1
    for key in $(sed -n -e 's/^Signed-By:[[:space:]]*//p' -e 's/.*signed-by=\([^] ]*\).*/\1/p' "$f"); do
      [ -e "$rootfs$key" ] || ok=0
    done
    if [ $ok = 1 ]; then
      mkdir -p "$rootfs$(dirname "$f")"
      cp "$f" "$rootfs$f"
    else
      echo "base image: leaving out $f (keyring not in the rootfs)"
    fi
  done
  [ -n "$(ls "$rootfs"/etc/apt/sources.list "$rootfs"/etc/apt/sources.list.d/* 2>/dev/null)" ] \
    || printf 'deb %s bookworm main\n' "$mirror" >"$rootfs/etc/apt/sources.list"

  tar -C "$rootfs" --numeric-owner -cf - . \
    | pm import --change 'ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD=["bash"]' - "$base_ref" >/dev/null || fail "podman import"
  rm -rf "$rootfs"
  mkdir -p "$cache_dir"
  pm save -o "$base_tar.tmp" "$base_ref" >/dev/null || fail "podman save $base_tar"
  mv "$base_tar.tmp" "$base_tar"
  echo "base image cached in $base_tar"
}

step "base image $base_ref"
if [ "${QPARAMS_REBUILD_BASE:-0}" = 1 ]; then
  pm rmi -f "$base_ref" >/dev/null 2>&1 || true
  rm -f "$base_tar"
fi
if pm image exists "$base_ref"; then
  echo "present in podman's store"
elif [ -s "$base_tar" ]; then
  pm load -i "$base_tar" >/dev/null || fail "podman load $base_tar"
  echo "loaded from $base_tar"
else
  make_base
fi

# ---------------------------------------------------------------------------------------
step "podman build -f docker/Dockerfile -t $image ."
# --format docker keeps the HEALTHCHECK; --network=host lets apt reach the mirror.
pm build --format docker --network=host --pull=never "${ulimits[@]}" \
  -f docker/Dockerfile -t "$image" . || fail "podman build"

size_bytes=$(pm image inspect --format '{{.Size}}' "$image")
size_mb=$(( (size_bytes + 500000) / 1000000 ))
echo "image $image: $size_mb MB ($size_bytes bytes)"

# Check the image's configuration: what compose and Kubernetes rely on.
cfg=$(pm image inspect --format '{{.Config.User}}|{{json .Config.Entrypoint}}|{{json .Config.Volumes}}|{{json .Config.ExposedPorts}}|{{.Config.StopSignal}}|{{json .Config.Healthcheck}}' "$image")
echo "config: $cfg"
case $cfg in 10001:10001\|*) ;; *) fail "image does not run as the non-root user 10001" ;; esac
case $cfg in *'"--data_dir=/data"'*) ;; *) fail "entrypoint lacks --data_dir=/data" ;; esac
case $cfg in *'/data'*'50051/tcp'*) ;; *) fail "no /data volume or 50051 port" ;; esac
case $cfg in *'|SIGTERM|'*) ;; *) fail "stop signal is not SIGTERM" ;; esac
case $cfg in *health*) ;; *) fail "no HEALTHCHECK (built without --format docker?)" ;; esac

# ---------------------------------------------------------------------------------------
free_port() {
  local p i
  for i in $(seq 1 50); do
    p=$(( 20000 + RANDOM % 20000 ))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
  done
  return 1
}
port=$(free_port) || fail "no free port"
target=127.0.0.1:$port
q() { "$cli" --target="$target" --tls_ca="$tls/ca.crt" --timeout=10s "$@"; }

wait_healthy() {
  local i
  for i in $(seq 1 60); do
    if q health >/dev/null 2>&1; then
      echo "SERVING after ~$(( i / 2 ))s"
      return 0
    fi
    if [ "$(pm inspect --format '{{.State.Running}}' "$ctr" 2>/dev/null)" != true ]; then
      fail "the container exited before it was healthy"
    fi
    sleep 0.5
  done
  fail "not healthy after 30s"
}

step "the image alone, without TLS and tokens: refuses to listen on 0.0.0.0"
bare_started=1
rc=0
out=$(timeout 20 podman --runtime=runc --cgroup-manager=cgroupfs --events-backend=file run \
  --name "$ctr-bare" "${ulimits[@]}" --read-only --read-only-tmpfs=false "$image" 2>&1) || rc=$?
case $rc in
  0|124) echo "$out" >&2; fail "the server ran on 0.0.0.0 without TLS and tokens (exit $rc)" ;;
esac
echo "$out" | grep -q -- '--allow_insecure' || { echo "$out" >&2; fail "the refusal does not name --allow_insecure"; }
echo "$out" | grep -- '--allow_insecure' | head -n 2

step "run compose's service qparams: volume $vol at /data, port $target -> 50051, TLS + tokens"
pm network create "$net" >/dev/null || fail "podman network create"
net_created=1
ctr_started=1
# As compose.yaml runs it (check_deploy.py podman-args): TLS and both tokens files from
# its secrets, metrics and /healthz on 9100, and hardened as compose.yaml and
# kubernetes.yaml run it: read-only root filesystem (no tmpfs), no capabilities, no
# privilege escalation; only /data is writable.
args=()
podman_args() {  # the `podman run` arguments of compose's service $1 (shell-quoted, hence eval)
  local words
  words=$("$python" docker/check_deploy.py podman-args "$@") || fail "check_deploy.py podman-args $1"
  eval "args=($words)"
}
podman_args qparams --image="$image" --volume-prefix="$ctr-" --host-port="$port"
echo "podman run ... ${args[*]}"
pm run -d --name "$ctr" --network "$net" "${ulimits[@]}" "${args[@]}" >/dev/null || fail "podman run"
wait_healthy
q health || fail "health"
# compose's health check (GET /healthz on 9100), which podman_args passes as --health-cmd.
for i in $(seq 1 20); do
  pm healthcheck run "$ctr" >/dev/null 2>&1 && break
  [ "$i" = 20 ] && fail "compose's health check (GET /healthz on 9100) is not healthy"
  sleep 0.5
done
echo "compose's health check (GET /healthz on 9100): healthy"
# The image's own HEALTHCHECK (compose replaces it), run inside the container: gRPC
# health over TLS with the CA compose mounts at /run/secrets/ca.crt.
image_health=()
while IFS= read -r -d '' word; do image_health+=("$word"); done < <(pm image inspect \
  --format '{{json .Config.Healthcheck.Test}}' "$image" \
  | "$python" -c 'import json, sys; t = json.load(sys.stdin); assert t[0] == "CMD", t; sys.stdout.write("".join(w + "\0" for w in t[1:]))')
pm exec "$ctr" "${image_health[@]}" >/dev/null || fail "the image's HEALTHCHECK failed"
echo "the image's HEALTHCHECK inside the container (gRPC health over TLS): healthy"
uid=$(pm exec "$ctr" id -u) || fail "podman exec"
[ "$uid" = 10001 ] || fail "the server runs as uid '$uid', not 10001"

# A 2x3 float32 tensor as .npy (v1.0 header written by hand, no numpy):
# [[-1.5, 0.25, 3.0], [0.5, -2.0, 1.0]]
write_npy() {
  local header="{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
  local total=$(( 10 + ${#header} + 1 ))
  local pad=$(( (64 - total % 64) % 64 ))
  local hlen=$(( ${#header} + pad + 1 ))
  {
    printf '\x93NUMPY\x01\x00'
    printf "\\x$(printf '%02x' $((hlen & 255)))\\x$(printf '%02x' $((hlen >> 8)))"
    printf '%s%*s\n' "$header" "$pad" ''
    printf '\x00\x00\xc0\xbf\x00\x00\x80\x3e\x00\x00\x40\x40'  # -1.5 0.25 3.0
    printf '\x00\x00\x00\x3f\x00\x00\x00\xc0\x00\x00\x80\x3f'  #  0.5 -2.0 1.0
  } >"$1"
}
npy=$work/x.npy
write_npy "$npy"

step "compute (stateless)"
out=$(q compute "$npy" --calculator=static --qscheme=asymmetric --granularity=per_channel:0 --format=table) \
  || fail "compute"
echo "$out"
echo "$out" | grep -q '0.0176470596' || fail "compute: unexpected qparams"

step "session: create + observe"
session=docker-test
q create "$session" --calculator=global_minmax --qscheme=asymmetric --granularity=per_channel:0 \
  --format=table || fail "create"
out=$(q observe "$session" "$npy" --format=table) || fail "observe"
echo "$out"
echo "$out" | grep -q 'observation_count 1' || fail "observe: unexpected response"
before=$(q qparams "$session") || fail "qparams"

# The slot-map attack (docker/attack.py) with no token, a data token, and in plaintext.
# Each of its two calls must be refused: $1 names the form, $2 the codes allowed, then
# attack.py's arguments.
expect_refused() {
  local what=$1 codes=$2 out
  shift 2
  out=$(attack "$@") || fail "docker/attack.py $*"
  "$python" -c '
import json, sys
result, allowed = json.loads(sys.argv[1]), sys.argv[2].split(",")
bad = {call: code for call, (code, _) in result.items() if code not in allowed}
sys.exit(f"{sys.argv[3]}: {bad} (want {allowed}): {result}" if bad else 0)' "$out" "$codes" "$what" \
    || fail "the attack was not refused: $what"
  echo "  $what: $("$python" -c 'import json, sys; print(", ".join(f"{c} {v[0]}" for c, v in json.loads(sys.argv[1]).items()))' "$out")"
}
attack_fails() {  # $1: what, $2: TLS target, $3: plaintext target, then attack.py's options
  local what=$1 target=$2 plain=$3
  shift 3
  expect_refused "$what, no token" UNAUTHENTICATED,PERMISSION_DENIED "$target" --ca "$tls/ca.crt" "$@"
  expect_refused "$what, a data token" PERMISSION_DENIED "$target" --ca "$tls/ca.crt" --token "$data_token" "$@"
  expect_refused "$what, plaintext to the TLS port" UNAVAILABLE "$plain" --timeout 5 "$@"
}

step "the attack fails on the single server"
attack_fails "single server" "$target" "$target"
out=$("$cli" --target="$target" --timeout=5s --retry_total=0s get "$session" 2>&1) \
  && fail "a plaintext call to the TLS port succeeded"
case $out in *UNAVAILABLE*) echo "  plaintext get: $out" ;; *) fail "plaintext get: $out" ;; esac
out=$(QPARAMS_TOKEN=$admin_token q get "$session" 2>&1) && fail "an admin token read a session"
case $out in *PERMISSION_DENIED*) echo "  an admin token on a data call: $out" ;; *) fail "admin token on get: $out" ;; esac
out=$(QPARAMS_TOKEN= q get "$session" 2>&1) && fail "a call without a token read a session"
case $out in *UNAUTHENTICATED*) echo "  no token on a data call: $out" ;; *) fail "no token on get: $out" ;; esac
[ "$(q qparams "$session")" = "$before" ] || fail "the session changed under the attack"
echo "  $session: still there, its qparams unchanged"

step "restart: the session survives in the volume"
pm restart -t 30 "$ctr" >/dev/null || fail "podman restart"
wait_healthy
q get "$session" --format=table || fail "get $session after the restart"
after=$(q qparams "$session") || fail "qparams after the restart"
[ "$before" = "$after" ] || fail "the qparams changed across the restart"
echo "qparams identical before and after the restart"

step "SIGTERM: podman stop -t 30, a clean exit within the grace period"
t0=$SECONDS
pm stop -t 30 "$ctr" >/dev/null || fail "podman stop"
took=$(( SECONDS - t0 ))
code=$(pm inspect --format '{{.State.ExitCode}}' "$ctr")
echo "stopped in ${took}s, exit code $code"
[ "$code" = 0 ] || fail "exit code $code after SIGTERM (want 0)"
[ "$took" -lt 25 ] || fail "took ${took}s to stop (the server's grace is 20s)"
echo "--- last lines of the server log ---"
pm logs --tail=5 "$ctr" 2>&1

# ---------------------------------------------------------------------------------------
step "podman build -f docker/haproxy/Dockerfile -t $haproxy_image docker/haproxy"
pm build --format docker --network=host --pull=never "${ulimits[@]}" \
  -f docker/haproxy/Dockerfile -t "$haproxy_image" docker/haproxy || fail "podman build (haproxy)"
hcfg=$(pm image inspect --format '{{.Config.User}}|{{json .Config.Entrypoint}}' "$haproxy_image")
echo "config: $hcfg"
case $hcfg in 10002:10002\|*) ;; *) fail "the HAProxy image does not run as the non-root user 10002" ;; esac
pm run --rm "${ulimits[@]}" --read-only --read-only-tmpfs=false "$haproxy_image" -c >/dev/null 2>"$work/hcheck" \
  || { cat "$work/hcheck" >&2; fail "haproxy -c inside the HAProxy image"; }
echo "haproxy -c inside the image: valid"

step "sharded: compose's profile sharded on network $net (r0, r1, r2, haproxy)"
hport=$(free_port) || fail "no free port"
shard_started=1
for r in r0 r1 r2; do
  podman_args "$r" --image="$image" --volume-prefix="$shard"
  echo "podman run ... ${args[*]}"
  pm run -d --name "$shard$r" --network "$net" "${ulimits[@]}" "${args[@]}" >/dev/null || fail "podman run $r"
done
podman_args haproxy --image="$haproxy_image" --volume-prefix="$shard" --host-port="$hport"
echo "podman run ... ${args[*]}"
pm run -d --name "${shard}haproxy" --network "$net" "${ulimits[@]}" "${args[@]}" >/dev/null || fail "podman run haproxy"

# Each replica's own CLI, straight to it (not through HAProxy): over TLS with the CA
# compose mounts, and the data token.
direct() {
  local r=$1
  shift
  pm exec -e QPARAMS_TOKEN="$data_token" "$shard$r" \
    qparams-cli --target=127.0.0.1:50051 --tls_ca=/run/secrets/ca.crt --timeout=10s "$@"
}
for r in r0 r1 r2; do
  for i in $(seq 1 60); do
    direct "$r" health >/dev/null 2>&1 && break
    [ "$(pm inspect --format '{{.State.Running}}' "$shard$r" 2>/dev/null)" = true ] || fail "$r exited"
    [ "$i" = 60 ] && fail "$r not healthy after 30s"
    sleep 0.5
  done
done
echo "r0, r1, r2: SERVING"
# compose's health check (GET /healthz on the metrics port 9100), which podman_args passes
# as --health-cmd: healthy once the metrics listener, started just after gRPC's, answers.
for r in r0 r1 r2; do
  for i in $(seq 1 20); do
    pm healthcheck run "$shard$r" >/dev/null 2>&1 && break
    [ "$i" = 20 ] && fail "$r: compose's health check (GET /healthz on 9100) is not healthy"
    sleep 0.5
  done
done
echo "r0, r1, r2: compose's health check (GET /healthz on 9100) healthy"

# The sessions and their owners: qparams-cli slot, then the slot map.
names=()
for i in $(seq 0 11); do names+=("docker-shard/s$i"); done
owners=$("$cli" slot "${names[@]}" | "$python" -c '
import json, sys
sys.path.insert(0, "docker")
from check_deploy import SLOT_MAP, parse_slot_map
owner = parse_slot_map(SLOT_MAP.read_text())
for s in json.load(sys.stdin)["slots"]:
    print(s["name"], owner[s["slot"]])') || fail "qparams-cli slot"
owned_by() { echo "$owners" | awk -v r="$1" '$2 == r {print $1}' | LC_ALL=C sort; }
for r in r0 r1 r2; do
  [ -n "$(owned_by "$r")" ] || fail "no test session falls on $r: change the names"
done

# Through HAProxy on the published port: wait until it reaches every replica (a session
# of each owner is NOT_FOUND there, not UNAVAILABLE).
hq() { "$cli" --target="127.0.0.1:$hport" --tls_ca="$tls/ca.crt" --timeout=10s "$@"; }
for r in r0 r1 r2; do
  probe=$(owned_by "$r" | head -n1)
  for i in $(seq 1 60); do
    out=$(hq get "$probe" 2>&1) && fail "$probe exists before the test created it"
    case $out in *NOT_FOUND*) break ;; esac
    [ "$(pm inspect --format '{{.State.Running}}' "${shard}haproxy" 2>/dev/null)" = true ] \
      || fail "haproxy exited"
    [ "$i" = 60 ] && fail "haproxy does not reach $r after 30s: $out"
    sleep 0.5
  done
done
echo "haproxy on 127.0.0.1:$hport reaches r0, r1, r2"
[ "$(pm exec "${shard}haproxy" sh -c 'id -u; test -S /run/haproxy/admin.sock && echo socket' | tr '\n' ' ')" = "10002 socket " ] \
  || fail "haproxy does not run as 10002 with its runtime API socket in /run/haproxy"
# HAProxy's runtime API from the host, through the container's root (/proc/PID/root).
admin_sock=/proc/$(pm inspect --format '{{.State.Pid}}' "${shard}haproxy")/root/run/haproxy/admin.sock
# Its health checks of the replicas (plain GET /healthz on 9100, while the calls are TLS).
stat=$("$python" - "$admin_sock" <<'PY'
import socket, sys
with socket.socket(socket.AF_UNIX) as s:
    s.connect(sys.argv[1])
    s.sendall(b"show stat\n")
    data = b"".join(iter(lambda: s.recv(65536), b""))
rows = [line.split(",") for line in data.decode().splitlines() if line and not line.startswith("#")]
for r in rows:
    if r[0] == r[1] and r[0] in ("r0", "r1", "r2"):
        print(r[0], r[17], r[36], r[37])
PY
) || fail "haproxy's runtime API"
echo "$stat" | sed 's/^/  haproxy health check: /'
[ "$(echo "$stat" | grep -c ' UP L7OK 200$')" = 3 ] || fail "haproxy's health checks: $stat"

step "sharded: ${#names[@]} sessions created and observed through haproxy:50051"
# A client on the deployment's network (the image's CLI), as compose's own users are.
through=$(pm run --rm -i --network "$net" "${ulimits[@]}" --cap-drop=ALL -e QPARAMS_TOKEN="$data_token" \
  -v "$tls/ca.crt:/run/secrets/ca.crt:ro" --entrypoint /bin/sh "$image" -c '
  set -e
  cat >/tmp/x.npy
  q() { qparams-cli --target=haproxy:50051 --tls_ca=/run/secrets/ca.crt --timeout=10s "$@"; }
  for n in "$@"; do
    q create "$n" --calculator=global_minmax --qscheme=asymmetric --granularity=per_channel:0 >/dev/null
    q observe "$n" /tmp/x.npy >/tmp/out || { cat /tmp/out >&2; exit 1; }
    q qparams "$n" >/tmp/q
    echo "$n $(md5sum </tmp/q | cut -c1-32)"
  done' sh "${names[@]}" <"$npy") || fail "create/observe through haproxy"
echo "$through" | sed 's/^/  through haproxy: /'

step "sharded: the attack fails through HAProxy and on a replica reached directly"
attack_fails "through haproxy, addressed to r0" "127.0.0.1:$hport" "127.0.0.1:$hport" --replica r0
attack_fails "through haproxy, to any replica" "127.0.0.1:$hport" "127.0.0.1:$hport"
# r1 on its address in the network (rootful podman: the host routes to it), as a
# neighbour in the network would reach it, HAProxy bypassed.
r1_ip=$(pm inspect --format "{{(index .NetworkSettings.Networks \"$net\").IPAddress}}" "${shard}r1") \
  || fail "r1's address"
attack_fails "r1 directly ($r1_ip:50051)" "$r1_ip:50051" "$r1_ip:50051" --server-name r1
# An admin token is taken for cluster control: the deployment's own map again, to every
# replica and to HAProxy's runtime API (slotmap push; the same map changes nothing).
QPARAMS_TOKEN=$admin_token hq slotmap push docker/haproxy/slots.map --replicas=r0,r1,r2 \
  --haproxy_admin="$admin_sock" --format=table || fail "slotmap push with the admin token"
out=$(hq slotmap push docker/haproxy/slots.map --replicas=r0 --format=table 2>&1) \
  && fail "slotmap push with a data token succeeded"
case $out in *PERMISSION_DENIED*) echo "  slotmap push with a data token: refused, PERMISSION_DENIED" ;;
  *) fail "slotmap push with a data token: $out" ;; esac
for n in "${names[@]}"; do hq get "$n" >/dev/null || fail "$n is gone after the attacks"; done
echo "after the attacks: all ${#names[@]} sessions there through haproxy (next: each on its owner, bit for bit)"

step "sharded: each session is found on its owner, refused by the others"
# Straight to each replica (its own CLI, not through HAProxy): its sessions are there, with
# the qparams read through HAProxy bit for bit; another's session is FAILED_PRECONDITION
# naming the owner (refused before anything is read or created).
pairs=$(echo "$owners" | tr '\n' ' ')
for r in r0 r1 r2; do
  # shellcheck disable=SC2016,SC2086
  here=$(pm exec -e QPARAMS_TOKEN="$data_token" "$shard$r" /bin/sh -c '
    me=$1; shift
    q() { qparams-cli --target=127.0.0.1:50051 --tls_ca=/run/secrets/ca.crt --timeout=10s "$@"; }
    while [ $# -gt 0 ]; do
      n=$1 o=$2; shift 2
      if [ "$o" = "$me" ]; then
        q get "$n" >/dev/null || exit 1
        echo "$n $(q qparams "$n" | md5sum | cut -c1-32)"
      elif out=$(q get "$n" 2>&1); then
        echo "$me serves $n, which is $o'"'"'s" >&2; exit 1
      else
        case $out in *FAILED_PRECONDITION*"$o"*) ;; *) echo "$me on $n: $out" >&2; exit 1 ;; esac
      fi
    done' sh "$r" $pairs) || fail "$r: its sessions and the others'"
  [ "$(echo "$here" | LC_ALL=C sort)" = "$(echo "$through" | grep -F -f <(owned_by "$r" | sed 's/$/ /') | LC_ALL=C sort)" ] \
    || fail "$r: its sessions or their qparams differ from those read through haproxy: $here"
  echo "$r: its $(echo "$here" | wc -l) sessions found, equal to haproxy's; the other $(( ${#names[@]} - $(echo "$here" | wc -l) )) refused naming their owner"
done
# And host clients reach every owner through the published port.
for r in r0 r1 r2; do
  n=$(owned_by "$r" | head -n1)
  hq get "$n" >/dev/null || fail "get $n through 127.0.0.1:$hport"
done
echo "host CLI through 127.0.0.1:$hport: a session of each replica found"
out=$(pm exec "${shard}r0" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9100 &&
  printf "GET /metrics HTTP/1.0\r\nHost: r0\r\n\r\n" >&3 && head -n1 <&3') || fail "r0: metrics"
case $out in *" 200"*) echo "r0 /metrics on 9100: $out" ;; *) fail "r0 /metrics: $out" ;; esac

step "sharded: SIGTERM stops haproxy, then the replicas, cleanly"
t0=$SECONDS
pm stop -t 30 "${shard}haproxy" >/dev/null || fail "podman stop haproxy"
took=$(( SECONDS - t0 ))
[ "$took" -lt 10 ] || fail "haproxy took ${took}s to stop (SIGTERM ignored?)"
pm stop -t 30 "${shard}r0" "${shard}r1" "${shard}r2" >/dev/null || fail "podman stop the replicas"
for s in "${shard_services[@]}"; do
  code=$(pm inspect --format '{{.State.ExitCode}}' "$shard$s")
  [ "$code" = 0 ] || fail "$s exited with $code after SIGTERM (want 0)"
done
echo "haproxy stopped in ${took}s, all in $((SECONDS - t0))s, every exit code 0"

step "image size"
echo "image $image: $size_mb MB (target < $max_mb MB)"
if [ "$size_mb" -ge "$max_mb" ]; then
  fail "the image is $size_mb MB, over the $max_mb MB target"
fi

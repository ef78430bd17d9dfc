#!/usr/bin/env bash
# Builds the qparams image (docker/Dockerfile) with podman and proves it works: health,
# a compute, a session that survives a restart, and a clean exit on SIGTERM. Prints the
# image size. Needs root (apt, podman as root); no container registry: the base image
# debian:bookworm-slim is made locally with debootstrap from the host's apt mirror and
# cached under ${XDG_CACHE_HOME:-$HOME/.cache}/qparams, so reruns skip debootstrap.
#
# Environment: QPARAMS_IMAGE (tag to build, default localhost/qparams:test),
# QPARAMS_DEBIAN_MIRROR (default: the host's first Debian mirror), QPARAMS_KEEP_IMAGE=0
# to remove the built image at the end, QPARAMS_REBUILD_BASE=1 to redo debootstrap.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

image=${QPARAMS_IMAGE:-localhost/qparams:test}
base_ref=docker.io/library/debian:bookworm-slim
cache_dir=${XDG_CACHE_HOME:-$HOME/.cache}/qparams
base_tar=$cache_dir/debian-bookworm-slim.tar
max_mb=120
suffix=$$-$RANDOM
ctr=qparams-test-$suffix
vol=qparams-test-data-$suffix
work=$(mktemp -d /tmp/qparams-docker-test.XXXXXX)
cli=$repo/build/client/qparams-cli
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
  [ "${QPARAMS_KEEP_IMAGE:-1}" = 0 ] && pm rmi -f "$image" >/dev/null 2>&1
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
      ca-certificates)
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
  step "host CLI: building build/client/qparams-cli"
  scripts/install-deps.sh
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j2 --target qparams-cli
fi
[ -x "$cli" ] || fail "no $cli"

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
q() { "$cli" --target="$target" --timeout=10s "$@"; }

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

step "run: volume $vol at /data, port $target -> 50051"
pm volume create "$vol" >/dev/null || fail "podman volume create"
ctr_started=1
# Hardened as compose.yaml and kubernetes.yaml run it: read-only root filesystem (no
# tmpfs), no capabilities, no privilege escalation; only /data is writable.
pm run -d --name "$ctr" "${ulimits[@]}" --read-only --read-only-tmpfs=false --cap-drop=ALL \
  --security-opt=no-new-privileges -v "$vol:/data" -p "$target:50051" "$image" >/dev/null \
  || fail "podman run"
wait_healthy
q health || fail "health"
# The image's own HEALTHCHECK, run inside the container (podman runs it on demand).
pm healthcheck run "$ctr" || fail "the image's HEALTHCHECK failed"
echo "HEALTHCHECK inside the container: healthy"
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

step "image size"
echo "image $image: $size_mb MB (target < $max_mb MB)"
if [ "$size_mb" -ge "$max_mb" ]; then
  fail "the image is $size_mb MB, over the $max_mb MB target"
fi

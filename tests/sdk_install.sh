#!/usr/bin/env bash
# The C++ SDK as a consumer gets it (client/README.md): `cmake --install` of this build
# into a fresh prefix, tests/sdk_consumer configured against it with
# find_package(qparams CONFIG) and built, then run against a qparams-server.
#   tests/sdk_install.sh BUILD_DIR WORK_DIR SERVER [cmake option...]
# WORK_DIR is emptied first; the options go to the consumer's configure (compiler,
# launcher).
set -euo pipefail
build=$1 work=$2 server=$3
shift 3
consumer=$(cd "$(dirname "$0")/sdk_consumer" && pwd)

rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
cmake -S "$consumer" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" "$@" >"$work/configure.log"
cmake --build "$work/build" >"$work/build.log"

"$server" --listen=127.0.0.1:0 2>"$work/server.log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  target=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$work/server.log" | head -n1)
  [[ -n $target ]] && break
  sleep 0.1
done
[[ -n $target ]] || { cat "$work/server.log" >&2; exit 1; }
"$work/build/sdk_consumer" "$target"

#!/usr/bin/env bash
# The cost of the balancer's hop (issue 16): qparams-bench against one qparams-server
# replica straight and through HAProxy, in turns within one run (--compare-target),
# so that both see the same machine noise; Observe (unary) and ObserveStream, 64
# floats and 1 MiB (262144 float32), concurrency 1 and 8. Writes OUT/haproxy_hop.jsonl
# (qparams-bench's objects with HAProxy's counters and both processes' CPU added) and
# OUT/haproxy_hop.md (the table), and prints the table. bench/run.sh (make bench)
# runs it; alone:
#   bench/haproxy_hop.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, BUILD_DIR/bench-results)
# DURATION (default 8s: measured time per side) and ROUNDS (16) as in bench/run.sh;
# SCRATCH_DIR (/var/tmp) holds the replica's data directory, removed afterwards;
# HAPROXY_CFG (docker/haproxy/haproxy.cfg) the configuration HAProxy runs, e.g. a
# tuned copy to compare.
#
# The setup, all on loopback, every process started here and stopped by its PID:
# - the replica: `qparams-server --replica_id=r0 --slot_map=slots.map` ("0:255 r0": it
#   owns every slot) on a port the OS picks, journaling to a data directory (default
#   durability), as a replica runs in production;
# - HAProxy (/usr/sbin/haproxy) on docker/haproxy/haproxy.cfg as it is, given its
#   environment variables as tests/python/test_sharded.py gives them, listening on a
#   loopback TCP port the OS picks (bound here and handed over: QPARAMS_BIND=fd@3).
#   Its three backends r0, r1, r2 all point
#   at the one replica, and its copy of the slot map sends every slot to backend r1:
#   a session's call reaches the replica through the header route
#   (x-qparams-session, crc32, mod 256, map_int), never through the default backend
#   r0, so that r1's counters in HAProxy's `show stat` count exactly the calls the
#   header routed, which the table checks against what the bench sent. The cost of
#   the route is the same whichever backend the map names.
set -euo pipefail

build=${1:-build}
out=${2:-$build/bench-results}
duration=${DURATION:-8s}
rounds=${ROUNDS:-16}
server_bin="$build/server/qparams-server"
qb="$build/bench/qparams-bench"
haproxy_bin=${HAPROXY:-/usr/sbin/haproxy}
python=/usr/bin/python3  # Debian's: the socket helpers below use only its standard library
template=${HAPROXY_CFG:-"$(dirname "$0")/../docker/haproxy/haproxy.cfg"}
timeout_s=20  # the deadline of every wait below

for f in "$server_bin" "$qb" "$haproxy_bin" "$python" "$template"; do
  [ -e "$f" ] || { echo "haproxy_hop: $f is missing" >&2; exit 1; }
done
command -v jq > /dev/null || { echo "haproxy_hop: jq is missing (scripts/install-deps.sh bench)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
# A short directory: the admin socket's path must fit sun_path (108 bytes).
dir=$(mktemp -d /tmp/qhop.XXXXXX)
data_dir=$(mktemp -d "${SCRATCH_DIR:-/var/tmp}/qparams-hop-data.XXXXXX")
server_pid=
haproxy_pid=

stop() {
  local pid
  for pid in $haproxy_pid $server_pid; do
    if kill -0 "$pid" 2> /dev/null; then
      kill -TERM "$pid"
      wait "$pid" 2> /dev/null || true
    fi
  done
  rm -rf "$dir" "$data_dir"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "haproxy_hop: $*" >&2
  exit 1
}

# Polls `condition` (a command) every 20 ms until it succeeds; fails naming `what`
# after timeout_s. A process that dies meanwhile fails it at once (the condition
# functions check their process).
wait_for() {
  local what=$1
  shift
  local deadline=$((SECONDS + timeout_s))
  until "$@"; do
    [ $SECONDS -lt $deadline ] || fail "timed out after $timeout_s s waiting for $what"
    sleep 0.02
  done
}

alive() {  # alive PID NAME LOG
  kill -0 "$1" 2> /dev/null || fail "$2 exited:"$'\n'"$(cat "$3")"
}

# One command of HAProxy's runtime API on its admin socket; its answer on stdout.
haproxy_cmd() {
  "$python" - "$dir/admin.sock" "$1" << 'EOF'
import socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.settimeout(10)
    s.connect(sys.argv[1])
    s.sendall(sys.argv[2].encode() + b"\n")
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
sys.stdout.write(answer.decode())
EOF
}

# `show stat` as "PXNAME SVNAME status req_tot stot bin bout hrsp_2xx" lines (the
# counters as HAProxy wrote them, never through awk's floating point: bin passes 2^31).
stat_rows() {
  haproxy_cmd "show stat" | awk -F, '
    function n(v) { return v == "" ? "0" : v }
    NR == 1 { sub(/^# /, ""); for (i = 1; i <= NF; i++) col[$i] = i; next }
    NF > 1 { print $col["pxname"], $col["svname"], $col["status"], n($col["req_tot"]),
             n($col["stot"]), n($col["bin"]), n($col["bout"]), n($col["hrsp_2xx"]) }'
}

# hstat PXNAME SVNAME FIELD: one counter (req_tot, stot, bin, bout, hrsp_2xx) or status.
hstat() {
  stat_rows | awk -v px="$1" -v sv="$2" -v f="$3" '
    BEGIN { split("status req_tot stot bin bout hrsp_2xx", names, " ")
            for (i in names) idx[names[i]] = i + 2 }
    $1 == px && $2 == sv { print $idx[f]; found = 1 }
    END { if (!found) exit 1 }'
}

# CPU time (user + system) of a process so far, in microseconds.
cpu_us() {
  awk -v tck="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.0f\n", ($12 + $13) * 1e6 / tck }' \
    "/proc/$1/stat"
}

# --- the replica
printf '# slots  replica\n0:255    r0\n' > "$dir/slots.map"
"$server_bin" --listen=127.0.0.1:0 --replica_id=r0 --slot_map="$dir/slots.map" \
  --data_dir="$data_dir" 2> "$dir/server.log" &
server_pid=$!
server_listening() {
  alive "$server_pid" qparams-server "$dir/server.log"
  grep -q 'listening on ' "$dir/server.log"
}
wait_for "qparams-server to listen" server_listening
replica=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$dir/server.log" | head -n 1)

# --- HAProxy: the file as it is; what differs here goes in the environment variables
# it expands (as tests/python/test_sharded.py does). Each has a default in the file,
# so a variable it no longer reads would go unseen: check that it reads each.
printf '# slots  backend: every slot through the header route to r1 (= the replica)\n0:255    r1\n' \
  > "$dir/haproxy-slots.map"
export QPARAMS_BIND=fd@3 QPARAMS_ADMIN_SOCKET="$dir/admin.sock" \
  QPARAMS_SLOT_MAP="$dir/haproxy-slots.map" QPARAMS_R0="$replica" QPARAMS_R1="$replica" \
  QPARAMS_R2="$replica" QPARAMS_R3=127.0.0.1:1 QPARAMS_R4=127.0.0.1:1 QPARAMS_R5=127.0.0.1:1 \
  QPARAMS_R6=127.0.0.1:1 QPARAMS_R7=127.0.0.1:1  # the spares: disabled, no name to resolve
for v in QPARAMS_BIND QPARAMS_ADMIN_SOCKET QPARAMS_SLOT_MAP QPARAMS_R0 QPARAMS_R1 QPARAMS_R2; do
  grep -qF "\${$v-" "$template" ||
    fail "$template does not read \${$v-...} any more: give it what tests/python/test_sharded.py gives"
done
# HAProxy cannot bind port 0 itself; the socket is bound (the OS picks the port) and
# listening before HAProxy starts, and HAProxy takes it over as fd 3 (same PID: exec).
"$python" -c '
import os, socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(128)
with open(sys.argv[1], "w") as f:
    f.write("127.0.0.1:%d\n" % s.getsockname()[1])
if s.fileno() != 3:
    os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
os.execv(sys.argv[2], sys.argv[2:])' "$dir/proxy.addr" "$haproxy_bin" -f "$template" -db \
  < /dev/null > "$dir/haproxy.log" 2>&1 &
haproxy_pid=$!
haproxy_ready() {
  alive "$haproxy_pid" haproxy "$dir/haproxy.log"
  [ -S "$dir/admin.sock" ] && [ -s "$dir/proxy.addr" ] || return 1
  local r
  for r in r0 r1 r2; do
    [ "$(hstat "$r" "$r" status 2> /dev/null)" = UP ] || return 1
  done
}
wait_for "haproxy to listen with r0, r1 and r2 UP" haproxy_ready
proxy=$(cat "$dir/proxy.addr")

echo "== haproxy_hop: replica r0 at $replica, HAProxy $("$haproxy_bin" -v | sed -n '1s/HAProxy version \([^ ]*\).*/\1/p') at $proxy" >&2
rm -f "$out/haproxy_hop.jsonl"

# scenario NAME MODE SHAPE CONCURRENCY
scenario() {
  local name=$1 mode=$2 shape=$3 c=$4
  local req0 bin0 other0 s0 h0 json
  req0=$(hstat r1 BACKEND req_tot)
  bin0=$(hstat r1 BACKEND bin)
  other0=$(($(hstat r0 BACKEND req_tot) + $(hstat r2 BACKEND req_tot)))
  s0=$(cpu_us "$server_pid")
  h0=$(cpu_us "$haproxy_pid")
  echo "== $name: qparams-bench --mode=$mode --shape=$shape --concurrency=$c" >&2
  json=$("$qb" --json --mode="$mode" --shape="$shape" --concurrency="$c" --target="$replica" \
    --compare-target="$proxy" --duration="$duration" --rounds="$rounds" --warmup=100ms)
  jq -c --arg name "$name" \
    --argjson req $(($(hstat r1 BACKEND req_tot) - req0)) \
    --argjson bin $(($(hstat r1 BACKEND bin) - bin0)) \
    --argjson other $(($(hstat r0 BACKEND req_tot) + $(hstat r2 BACKEND req_tot) - other0)) \
    --argjson server_cpu $(($(cpu_us "$server_pid") - s0)) \
    --argjson haproxy_cpu $(($(cpu_us "$haproxy_pid") - h0)) \
    '. + {scenario: $name, haproxy_r1_requests: $req, haproxy_r1_bytes_in: $bin,
          haproxy_other_requests: $other, server_cpu_us: $server_cpu,
          haproxy_cpu_us: $haproxy_cpu}' <<< "$json" | tee -a "$out/haproxy_hop.jsonl" >&2
}

for mode in observe stream; do
  for c in 1 8; do
    scenario "${mode}_small_c$c" "$mode" 64 "$c"
    scenario "${mode}_mib_c$c" "$mode" 262144 "$c"
  done
done
final_stat=$(stat_rows | awk '$1 ~ /^(grpc|r[012])$/')

{
  echo "qparams-bench straight to one replica (r0, owning all 256 slots, --data_dir) and through"
  echo "HAProxy $("$haproxy_bin" -v | sed -n '1s/HAProxy version \([^ ]*\).*/\1/p') ($template), taking $rounds turns of $duration in all per side,"
  echo "each worker its own session; $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores shared by the bench, HAProxy and the replica."
  echo "Ratio: calls/s through HAProxy / straight (stream: messages/s). CPU µs per call: the"
  echo "replica's over both sides' calls, HAProxy's over its own (warmup calls not counted: a few % high)."
  echo "Routed: HAProxy's backend r1 (reached only through the x-qparams-session route) counted"
  echo "at least the calls (observe) and the bytes (both) the bench sent through it, and r0 and r2 nothing."
  echo
  echo "| scenario | request | straight calls/s | via HAProxy calls/s | ratio | straight p50 / p99 µs | via p50 / p99 µs | replica CPU µs/call | HAProxy CPU µs/call | routed |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  jq -r '
    def r1: . * 10 | round / 10;
    def ok: (.haproxy_other_requests == 0)
            and (.haproxy_r1_bytes_in >= .compare_requests * .request_bytes)
            and (.mode == "stream" or .haproxy_r1_requests >= .compare_requests);
    "| \(.mode) \(if .shape == "64" then "64 floats" else "1 MiB" end), concurrency \(.concurrency) | \(.request_bytes) B | \(.qps | round) | \(.compare_qps | round) | \(.compare_ratio * 1000 | round / 1000) | \(.p50_us | r1) / \(.p99_us | r1) | \(.compare_p50_us | r1) / \(.compare_p99_us | r1) | \(.server_cpu_us / (.requests + .compare_requests) | r1) | \(.haproxy_cpu_us / .compare_requests | r1) | \(if ok then "yes" else "NO" end) |"' \
    "$out/haproxy_hop.jsonl"
  echo
  echo "HAProxy's show stat at the end (pxname svname status req_tot stot bin bout hrsp_2xx):"
  echo
  echo '```'
  echo "$final_stat"
  echo '```'
} > "$out/haproxy_hop.md"
cat "$out/haproxy_hop.md"
if jq -e 'select((.haproxy_other_requests != 0)
                 or (.haproxy_r1_bytes_in < .compare_requests * .request_bytes)
                 or (.mode == "observe" and .haproxy_r1_requests < .compare_requests))' \
  "$out/haproxy_hop.jsonl" > /dev/null; then
  fail "some calls did not go through HAProxy's header route (the routed column)"
fi

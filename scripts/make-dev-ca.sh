#!/usr/bin/env bash
# Makes the TLS material and bearer tokens the shipped deployments (docker/compose.yaml,
# docker/kubernetes.yaml, docker/kubernetes-sharded.yaml) read, for a FIRST TRY: a
# self-signed CA, a server certificate signed by it whose names cover every name those
# forms use, and random tokens. In production use your own CA (or cert-manager) and
# your own token management; keep the file names below.
#
#   scripts/make-dev-ca.sh [options] DIR
#
# Writes into DIR (created with mode 0700; what exists is kept, see --force):
#   ca.crt        the CA certificate: clients' --tls_ca, HAProxy's ca-file     0644
#   ca.key        the CA's private key: never mounted anywhere                 0600
#   tls.crt       the server certificate (leaf then nothing: the CA is ca.crt) 0644
#   tls.key       its private key (the servers' --tls_key, HAProxy's crt)      0644 *
#   tokens        --auth_tokens_file: "TOKEN TENANT", one data token           0644 *
#   admin-tokens  --admin_tokens_file: "TOKEN NAME", one admin token           0644 *
#   token         the data token alone (QPARAMS_TOKEN=$(cat DIR/token))        0600
#   admin-token   the admin token alone (for reshard, slotmap push)            0600
# * compose bind-mounts its file secrets as they are, into containers running as uid
#   10001 (the servers) and 10002 (HAProxy): the files they read must be readable by
#   others, and DIR's mode 0700 is what keeps them private on this host. Kubernetes
#   copies them into a Secret (the command is printed at the end) whose mode the
#   manifests set.
#
# The certificate's names (subjectAltName): qparams, haproxy, r0 .. r7 (compose's
# services), localhost, 127.0.0.1, ::1, and for each --namespace NS (default: default)
# the Kubernetes names of both manifests: the Services qparams, qparams-headless,
# qparams-sharded, qparams-shard-headless (NAME, NAME.NS, NAME.NS.svc,
# NAME.NS.svc.CLUSTER_DOMAIN) and the pods qparams-0 and qparams-shard-0 .. -7 under
# their headless Services. HAProxy checks the replicas' certificates against the name
# "qparams" (haproxy.cfg, QPARAMS_TLS_VERIFYHOST), so a certificate of your own CA
# must carry it too.
#
# Options:
#   --namespace NS       a Kubernetes namespace to cover (repeatable; default: default)
#   --cluster-domain D   the cluster's DNS domain (default: cluster.local)
#   --dns NAME           another DNS name for the certificate (repeatable)
#   --ip ADDRESS         another IP address for the certificate (repeatable)
#   --days N             the server certificate's validity (default 397; the CA: 3650)
#   --force              make everything anew (a new CA, certificate and tokens)
#   -h, --help           this text
#
# Without --force an existing CA and existing tokens are kept, and the server
# certificate is made again only if it is missing, not signed by ca.crt, or lacks one
# of the names asked for; so a second run is a no-op and adding --dns re-issues the
# certificate alone. Needs openssl (scripts/install-deps.sh installs it).
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "make-dev-ca.sh: $*" >&2; exit 2; }

namespaces=() extra_dns=() extra_ip=()
cluster_domain=cluster.local days=397 force=0 dir=
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --namespace) [ $# -ge 2 ] || die "$1 needs a value"; namespaces+=("$2"); shift 2 ;;
    --namespace=*) namespaces+=("${1#*=}"); shift ;;
    --cluster-domain) [ $# -ge 2 ] || die "$1 needs a value"; cluster_domain=$2; shift 2 ;;
    --cluster-domain=*) cluster_domain=${1#*=}; shift ;;
    --dns) [ $# -ge 2 ] || die "$1 needs a value"; extra_dns+=("$2"); shift 2 ;;
    --dns=*) extra_dns+=("${1#*=}"); shift ;;
    --ip) [ $# -ge 2 ] || die "$1 needs a value"; extra_ip+=("$2"); shift 2 ;;
    --ip=*) extra_ip+=("${1#*=}"); shift ;;
    --days) [ $# -ge 2 ] || die "$1 needs a value"; days=$2; shift 2 ;;
    --days=*) days=${1#*=}; shift ;;
    --force) force=1; shift ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$dir" ] || die "one directory only (see --help)"; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || { usage >&2; exit 2; }
[[ $days =~ ^[1-9][0-9]*$ ]] || die "--days: not a positive number: $days"
command -v openssl >/dev/null || die "openssl is not installed (scripts/install-deps.sh)"
[ ${#namespaces[@]} -gt 0 ] || namespaces=(default)

# ---- the names -------------------------------------------------------------------------
dns=(qparams haproxy localhost)
for i in 0 1 2 3 4 5 6 7; do dns+=("r$i"); done
for ns in "${namespaces[@]}"; do
  for svc in qparams qparams-headless qparams-sharded qparams-shard-headless; do
    dns+=("$svc.$ns" "$svc.$ns.svc" "$svc.$ns.svc.$cluster_domain")
  done
  dns+=("qparams-0.qparams-headless.$ns.svc.$cluster_domain")
  for i in 0 1 2 3 4 5 6 7; do
    dns+=("qparams-shard-$i.qparams-shard-headless.$ns.svc.$cluster_domain")
  done
done
dns+=(${extra_dns[@]+"${extra_dns[@]}"})
ips=(127.0.0.1 ::1 ${extra_ip[@]+"${extra_ip[@]}"})
san=
for n in "${dns[@]}"; do san+="${san:+,}DNS:$n"; done
for a in "${ips[@]}"; do san+=",IP:$a"; done

umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
cd "$dir"
if [ "$force" = 1 ]; then
  rm -f ca.crt ca.key ca.srl tls.crt tls.key tokens admin-tokens token admin-token
fi

# ---- the CA ----------------------------------------------------------------------------
if [ ! -s ca.key ] || [ ! -s ca.crt ]; then
  rm -f tls.crt tls.key  # a new CA: the old certificate is no longer its
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout ca.key -out ca.crt -days 3650 -sha256 \
    -subj "/O=qparams development/CN=qparams development CA $(date -u +%Y-%m-%dT%H:%MZ)" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  echo "made a CA: $dir/ca.crt (its key ca.key, 0600: keep it here)"
else
  echo "kept the CA $dir/ca.crt"
fi

# ---- the server certificate ------------------------------------------------------------
have_all_names() {
  local text n a
  text=$(openssl x509 -in tls.crt -noout -ext subjectAltName 2>/dev/null) || return 1
  for n in "${dns[@]}"; do grep -q "DNS:$n\(,\|$\)" <<<"$text" || return 1; done
  for a in "${ips[@]}"; do
    # OpenSSL prints ::1 as 0:0:0:0:0:0:0:1.
    [ "$a" = ::1 ] && a=0:0:0:0:0:0:0:1
    grep -qi "IP Address:$a\(,\|$\)" <<<"$text" || return 1
  done
}
if [ -s tls.crt ] && [ -s tls.key ] && openssl verify -CAfile ca.crt tls.crt >/dev/null 2>&1 \
   && openssl x509 -in tls.crt -noout -checkend 86400 >/dev/null && have_all_names; then
  echo "kept the server certificate $dir/tls.crt"
else
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout tls.key -out tls.csr -subj "/O=qparams development/CN=qparams" 2>/dev/null
  cat >tls.ext <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EXT
  openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out tls.crt \
    -days "$days" -sha256 -extfile tls.ext 2>/dev/null
  rm -f tls.csr tls.ext
  openssl verify -CAfile ca.crt tls.crt >/dev/null || die "the new certificate does not verify"
  echo "made a server certificate: $dir/tls.crt (${#dns[@]} DNS names, ${#ips[@]} IP addresses, $days days)"
fi

# ---- the tokens ------------------------------------------------------------------------
# 32 random bytes, base64url without padding: 43 characters.
new_token() { head -c 32 /dev/urandom | base64 -w0 | tr '+/' '-_' | tr -d '='; }
if [ ! -s tokens ] || [ ! -s token ]; then
  t=$(new_token)
  printf '# --auth_tokens_file: "TOKEN TENANT" lines (made by scripts/make-dev-ca.sh)\n%s dev\n' "$t" >tokens
  printf '%s\n' "$t" >token
  echo "made a data token for the tenant dev: $dir/tokens, $dir/token"
else
  echo "kept the data tokens $dir/tokens"
fi
if [ ! -s admin-tokens ] || [ ! -s admin-token ]; then
  t=$(new_token)
  printf '# --admin_tokens_file: "TOKEN NAME" lines (made by scripts/make-dev-ca.sh)\n%s admin\n' "$t" >admin-tokens
  printf '%s\n' "$t" >admin-token
  echo "made an admin token: $dir/admin-tokens, $dir/admin-token"
else
  echo "kept the admin tokens $dir/admin-tokens"
fi

chmod 0600 ca.key token admin-token
chmod 0644 ca.crt tls.crt tls.key tokens admin-tokens
rm -f ca.srl

abs=$(pwd)
cat <<EOF

For a first try only: in production use your own CA and keep ca.key offline.
  compose:     QPARAMS_TLS_DIR=$abs docker compose -f docker/compose.yaml up -d --build
               (QPARAMS_TLS_DIR defaults to docker/tls)
  Kubernetes:  kubectl create secret generic qparams-tls \\
                 --from-file=$abs/tls.crt --from-file=$abs/tls.key \\
                 --from-file=$abs/ca.crt --from-file=$abs/tokens \\
                 --from-file=$abs/admin-tokens        (add -n NAMESPACE as needed)
  a client:    QPARAMS_TOKEN=\$(cat $abs/token) qparams-cli --target=127.0.0.1:50051 \\
                 --tls_ca=$abs/ca.crt list
EOF

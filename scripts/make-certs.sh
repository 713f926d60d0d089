#!/usr/bin/env bash
# Makes the certificates the compose stacks run their query and peer ports with (mutual TLS),
# with openssl:
#
#   scripts/make-certs.sh [DIR]        (default: deploy/certs; existing files are kept)
#
#   ca.pem / ca.key          a private CA (10 years; ECDSA P-256)
#   server.pem / server.key  the query port (serve --tls-cert/--tls-key; --tls-client-ca ca.pem)
#   peer.pem / peer.key      the peer port, server and client (--peer-tls-cert/-key/-ca)
#   client.pem / client.key  gateways, scripts/check_stack.py and grpcurl (client auth)
#
# Names: localhost and 127.0.0.1 (deploy/compose.local.yml: host network), and the compose
# service names replica-a, replica-b, shard0-a ... shard1-b (docker-compose.yml), in both the
# server and the peer certificate. More names: PREFIXLOG_CERT_NAMES="a,b" (DNS names).
# The keys are readable by every user (0644): the containers run as uid 10001 and read them
# from a bind mount. These are certificates for a development or test stack; in production
# issue them from your own CA (Kubernetes: deploy/k8s/components/tls, cert-manager).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
DIR="${1:-deploy/certs}"
mkdir -p "$DIR"
cd "$DIR"
NAMES="localhost,replica-a,replica-b,shard0-a,shard0-b,shard1-a,shard1-b${PREFIXLOG_CERT_NAMES:+,$PREFIXLOG_CERT_NAMES}"
SAN="$(echo "$NAMES" | tr ',' '\n' | sed 's/^/DNS:/' | paste -sd, -),IP:127.0.0.1"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -s ca.pem ] || [ ! -s ca.key ]; then
  key ca.key
  openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=prefixlog-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out ca.pem 2>/dev/null
fi

# leaf NAME CN EXTENDED_KEY_USAGE [SAN]
leaf() {
  local name=$1 cn=$2 eku=$3 san=${4:-} ext
  [ -s "$name.pem" ] && [ -s "$name.key" ] && return
  key "$name.key"
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=$eku"
    [ -n "$san" ] && echo "subjectAltName=$san"
  } > "$ext"
  openssl req -new -key "$name.key" -subj "/CN=$cn" 2>/dev/null \
    | openssl x509 -req -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 -sha256 -extfile "$ext" -out "$name.pem" 2>/dev/null
  rm -f "$ext"
}
leaf server prefixlog-query serverAuth "$SAN"
leaf peer prefixlog-peer serverAuth,clientAuth "$SAN"
leaf client prefixlog-client clientAuth
rm -f ca.srl
chmod 0644 ./*.pem ./*.key
chmod 0600 ca.key
for c in server peer client; do
  openssl verify -CAfile ca.pem "$c.pem" >/dev/null
done
echo "certificates in $DIR: ca.pem, server.pem/key (query), peer.pem/key (peers), client.pem/key (clients); names $NAMES, 127.0.0.1"

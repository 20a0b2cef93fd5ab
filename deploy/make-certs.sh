#!/bin/sh
# A test CA, the broker's certificate and one client certificate per party, for TLS to the
# broker (docs/operations.md, "Broker security"). Good for trying the compose file and for tests; a real
# federation uses its own CA, and each party makes its own key and sends only a request:
#
#   openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out host.key
#   openssl req -new -key host.key -subj /CN=host -out host.csr      (the CA signs host.csr)
#
# usage: deploy/make-certs.sh [-o DIR] [-s BROKER_NAME]... PARTY...
#   deploy/make-certs.sh -o deploy/tls guest host host_1 host_2 aggregator flow   (docker-compose.yml)
# writes DIR/ca.pem (+ ca.key, which only the CA keeps), DIR/server.pem + server.key (names:
# -s, default "rabbitmq" and "localhost") and DIR/PARTY.pem + PARTY.key. Private keys are 0600.
set -eu

out=deploy/tls
names=""
while getopts o:s: opt; do
  case $opt in
    o) out=$OPTARG ;;
    s) names="$names $OPTARG" ;;
    *) echo "usage: $0 [-o DIR] [-s BROKER_NAME]... PARTY..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ -n "$names" ] || names="rabbitmq localhost"
mkdir -p "$out"
umask 077
days=825  # the longest validity clients accept for a leaf certificate

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# sign NAME CN EXTENSIONS: DIR/NAME.pem for DIR/NAME.key, signed by the CA
sign() {
  key "$out/$1.key"
  openssl req -new -key "$out/$1.key" -subj "/CN=$2" -out "$out/$1.csr"
  printf '%s\n' "basicConstraints = critical, CA:FALSE" \
    "keyUsage = critical, digitalSignature, keyEncipherment" \
    "subjectKeyIdentifier = hash" "authorityKeyIdentifier = keyid" "$3" > "$out/$1.ext"
  openssl x509 -req -in "$out/$1.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days $days -sha256 -extfile "$out/$1.ext" \
    -out "$out/$1.pem" 2>/dev/null
  rm -f "$out/$1.csr" "$out/$1.ext"
  chmod 644 "$out/$1.pem"
}

if [ ! -f "$out/ca.key" ]; then
  key "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -subj "/CN=fedboost test CA" -days $days -sha256 \
    -addext "basicConstraints = critical, CA:TRUE" \
    -addext "keyUsage = critical, keyCertSign, cRLSign" -out "$out/ca.pem"
  chmod 644 "$out/ca.pem"
fi

san=""
for name in $names; do san="${san:+$san, }DNS:$name"; done
case " $names " in *" localhost "*) san="$san, IP:127.0.0.1" ;; esac
first=${names# }
sign server "${first%% *}" "subjectAltName = $san
extendedKeyUsage = serverAuth"

for party in "$@"; do
  sign "$party" "$party" "extendedKeyUsage = clientAuth"
done
echo "$out: ca.pem, server.pem/.key ($san)${*:+, and for $*: PARTY.pem/.key}"

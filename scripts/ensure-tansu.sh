#!/usr/bin/env bash
# Installs the Kafka-protocol test broker (tansu 0.6.0, with SQLite storage) if it is not
# installed yet. Takes about 15 minutes on 2 cores, once per machine; prints the binary path.
# The default features of tansu have no usable storage engine, hence --features libsql.
set -euo pipefail
want="0.6.0"
bin="${CARGO_HOME:-$HOME/.cargo}/bin/tansu"
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$want"; then
  echo "$bin"; exit 0
fi
echo "installing tansu $want (Kafka-protocol broker for the demo and tests; ~15 min, once)..." >&2
cargo install tansu --version "$want" --locked --features libsql >&2
echo "$bin"

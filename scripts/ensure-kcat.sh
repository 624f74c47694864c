#!/usr/bin/env bash
# Installs Debian's kcat if it is missing: tests/tests/upstream.rs publishes with it a record
# whose header key is not UTF-8, as a producer on librdkafka's C API (or a Go client) may.
# Uses apt-get (as root, or through sudo without a password: scripts/apt-install.sh); prints
# the kcat path.
set -euo pipefail
if command -v kcat >/dev/null 2>&1; then
  command -v kcat; exit 0
fi
"$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" "a Kafka producer that is not pixgate's, for the integration tests" kcat
command -v kcat >/dev/null 2>&1 || { echo "error: kcat installed but not on PATH" >&2; exit 1; }
command -v kcat

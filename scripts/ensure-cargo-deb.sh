#!/usr/bin/env bash
# Installs cargo-deb (the `cargo deb` subcommand that builds pixgate's Debian package) at a
# pinned version if it is not installed yet; about 5 minutes on 2 cores, once per machine.
# Prints the binary path.
set -euo pipefail
want="3.8.0"
bin="${CARGO_HOME:-$HOME/.cargo}/bin/cargo-deb"
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$want"; then
  echo "$bin"; exit 0
fi
echo "installing cargo-deb $want (builds the Debian package; once per machine)..." >&2
cargo install cargo-deb --version "$want" --locked >&2
echo "$bin"

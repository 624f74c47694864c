#!/usr/bin/env bash
# A throwaway Kafka-protocol broker (tansu) on loopback, shared by the demo and the tests.
#
#   scripts/kafka-broker.sh start DIR [PORT]   start one with its data in DIR; prints HOST:PORT
#   scripts/kafka-broker.sh stop DIR           stop the broker started in DIR
#
# DIR is also the broker's working directory: tansu reads a .env there and keeps its SQLite
# file there, so a fresh DIR means a fresh broker. PORT defaults to a free one.
set -euo pipefail
cmd="${1:?usage: kafka-broker.sh start|stop DIR [PORT]}"
dir="${2:?usage: kafka-broker.sh start|stop DIR [PORT]}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"

case "$cmd" in
start)
  tansu="$("$here/ensure-tansu.sh")"
  port="${3:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
  url="tcp://127.0.0.1:$port"
  ( cd "$dir" && : > .env && exec setsid "$tansu" broker --storage-engine "sqlite://tansu.db" \
      --listener-url "$url" --advertised-listener-url "$url" >"$dir/broker.log" 2>&1 ) &
  echo $! > "$dir/broker.pid"
  echo "127.0.0.1:$port" > "$dir/broker.addr"
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "127.0.0.1:$port"; exit 0; fi
    kill -0 "$(cat "$dir/broker.pid")" 2>/dev/null || { echo "tansu exited; log:" >&2; cat "$dir/broker.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "tansu did not listen on $port within 30 s; log: $dir/broker.log" >&2; exit 1
  ;;
stop)
  [ -f "$dir/broker.pid" ] || exit 0
  pid="$(cat "$dir/broker.pid")"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  rm -f "$dir/broker.pid"
  ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac

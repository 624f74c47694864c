#!/usr/bin/env python3
"""An upstream Kafka producer that is not pixgate's: Python's confluent-kafka.

Used by tests/tests/upstream.rs to publish the bundled fixtures as an operator's own
producer would: any codec, headers (a W3C traceparent among them), tombstones.

Reads one JSON command per line on stdin and answers one JSON line on stdout:

  {"file": PATH, "codec": "zstd", "lines": [FROM, TO]}   publish lines FROM..TO (0-based,
        TO exclusive; all when absent) of a fixtures file ({"topic", "key", "value"} per
        line: an object value is sent as compact JSON, a string value as its raw text),
        compressed with CODEC (compression.type: none, gzip, snappy, lz4, zstd), each
        record with headers source, content-type and traceparent (the trace id is the
        first 32 hex of sha256(file name, line number)); the line of "bad_traceparent"
        (if given) gets a malformed traceparent instead.
  {"tombstone": TOPIC, "key": KEY, "codec": "zstd"}      publish a null value (a tombstone).
  {"quit": true}

Answer: {"published": N, "positions": [[partition, offset], ...]} or {"error": TEXT}.
Every command waits until Kafka acknowledged all its records (flush).
"""

import hashlib
import json
import os
import sys

from confluent_kafka import Producer

BROKERS = sys.argv[1]
producers = {}


def producer(codec):
    if codec not in producers:
        producers[codec] = Producer({
            "bootstrap.servers": BROKERS,
            "compression.type": codec,
            "acks": "all",
            "linger.ms": 20,
            "log.connection.close": False,
        })
    return producers[codec]


def trace_id(name, n):
    return hashlib.sha256(f"{name}:{n}".encode()).hexdigest()[:32]


def publish(cmd):
    path, codec = cmd["file"], cmd["codec"]
    name = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        lines = [l for l in f.read().splitlines() if l.strip()]
    start, end = cmd.get("lines", [0, len(lines)])
    p = producer(codec)
    positions = [None] * (end - start)
    errors = []

    def delivered(i):
        def cb(err, msg):
            if err is not None:
                errors.append(str(err))
            else:
                positions[i] = [msg.partition(), msg.offset()]
        return cb

    for i, n in enumerate(range(start, end)):
        rec = json.loads(lines[n])
        value = rec["value"]
        value = value.encode() if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        traceparent = f"00-{trace_id(name, n)}-{hashlib.sha256(str(n).encode()).hexdigest()[:16]}-01"
        if cmd.get("bad_traceparent") == n:
            traceparent = "00-not-a-trace-context"
        headers = [("source", f"fixtures/{name}".encode()), ("content-type", b"application/json"), ("traceparent", traceparent.encode())]
        p.produce(rec["topic"], key=rec["key"].encode(), value=value, headers=headers, on_delivery=delivered(i))
        p.poll(0)
    p.flush(30)
    if errors or any(x is None for x in positions):
        return {"error": f"not delivered: {errors or 'flush timed out'}"}
    return {"published": len(positions), "positions": positions}


def tombstone(cmd):
    p = producer(cmd.get("codec", "none"))
    positions = []
    p.produce(cmd["tombstone"], key=cmd["key"].encode(), value=None, on_delivery=lambda err, msg: positions.append(err or [msg.partition(), msg.offset()]))
    p.flush(30)
    if len(positions) != 1 or not isinstance(positions[0], list):
        return {"error": f"tombstone not delivered: {positions}"}
    return {"published": 1, "positions": positions}


for line in sys.stdin:
    cmd = json.loads(line)
    if cmd.get("quit"):
        break
    try:
        answer = tombstone(cmd) if "tombstone" in cmd else publish(cmd)
    except Exception as e:  # the test reads the reason
        answer = {"error": repr(e)}
    print(json.dumps(answer), flush=True)

"""An MQTT 5 card machine written with Eclipse Paho (paho-mqtt 2.x), an outside client for
tests/tests/mqtt5_devices.rs.

Commands come on stdin, one JSON object a line; what happens goes to stdout, one JSON object
a line (`event`: `connack`, `suback`, `job`, `published` (its `mid`), `puback`, `disconnect`,
`error`):

  {"cmd": "connect", "clean_start": true, "session_expiry": 300, "max_packet": null, "receive_max": 1, "raw": false}
  {"cmd": "subscribe", "topics": ["pixgate/v1/devices/ID/jobs"]}
  {"cmd": "publish", "topic": "...", "payload": "...", "count": 1}
  {"cmd": "flood", "topic": "...", "payload": "...", "per_second": 500, "seconds": 15}
  {"cmd": "disconnect"}

Every job received is acked `done` on the device's acks topic (QoS 1), unless `--no-ack`.
With `"raw": true` the CONNECT asks for raw job payloads (user property
`pixgate-payload: raw`); a job whose content type is not `application/json` is then
reported with `payload_b64` (its bytes) and acked from its `message_id` and `seq` user
properties.

Usage: mqtt5_device.py HOST PORT DEVICE_ID CA CERT KEY [--no-ack]
"""

import base64
import json
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

host, port, device, ca, cert, key = sys.argv[1:7]
auto_ack = "--no-ack" not in sys.argv
lock = threading.Lock()


def say(**event):
    with lock:
        print(json.dumps(event), flush=True)


def props_of(p):
    if p is None:
        return {}
    out = {}
    for name in ("MaximumPacketSize", "ReceiveMaximum", "SessionExpiryInterval", "MaximumQoS",
                 "RetainAvailable", "TopicAliasMaximum", "WildcardSubscriptionAvailable",
                 "SharedSubscriptionAvailable", "SubscriptionIdentifierAvailable",
                 "MessageExpiryInterval", "ContentType", "PayloadFormatIndicator"):
        if hasattr(p, name):
            out[name] = getattr(p, name)
    if hasattr(p, "UserProperty"):
        out["UserProperty"] = [list(kv) for kv in p.UserProperty]
    return out


def on_connect(client, userdata, flags, reason_code, properties):
    say(event="connack", reason=reason_code.value, session_present=flags.session_present,
        props=props_of(properties))


def on_subscribe(client, userdata, mid, reason_codes, properties):
    say(event="suback", reason_codes=[rc.value for rc in reason_codes])


def on_message(client, userdata, msg):
    props = props_of(msg.properties)
    if props.get("ContentType", "application/json") == "application/json":
        payload = msg.payload.decode()
        say(event="job", topic=msg.topic, payload=payload, props=props)
        job = json.loads(payload)
        message_id, seq = job["message_id"], job["seq"]
    else:
        say(event="job", topic=msg.topic, size=len(msg.payload), payload_b64=base64.b64encode(msg.payload).decode(),
            props=props)
        user = dict(props.get("UserProperty", []))
        message_id, seq = user["message_id"], int(user["seq"])
    if auto_ack:
        ack = {"v": 1, "message_id": message_id, "seq": seq, "result": "done"}
        client.publish(f"pixgate/v1/devices/{device}/acks", json.dumps(ack), qos=1)


def on_publish(client, userdata, mid, reason_code, properties):
    say(event="puback", mid=mid, reason=reason_code.value)


def on_disconnect(client, userdata, flags, reason_code, properties):
    say(event="disconnect", reason=reason_code.value)


client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dev-{device}", protocol=mqtt.MQTTv5)
client.tls_set(ca_certs=ca, certfile=cert, keyfile=key)
client.on_connect = on_connect
client.on_subscribe = on_subscribe
client.on_message = on_message
client.on_publish = on_publish
client.on_disconnect = on_disconnect

for line in sys.stdin:
    c = json.loads(line)
    try:
        if c["cmd"] == "connect":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = c.get("session_expiry", 0)
            if c.get("max_packet"):
                props.MaximumPacketSize = c["max_packet"]
            if c.get("receive_max"):
                props.ReceiveMaximum = c["receive_max"]
            if c.get("raw"):
                props.UserProperty = ("pixgate-payload", "raw")
            client.connect(host, int(port), keepalive=30, clean_start=c.get("clean_start", True), properties=props)
            client.loop_start()
        elif c["cmd"] == "subscribe":
            client.subscribe([(t, 1) for t in c["topics"]])
        elif c["cmd"] == "publish":
            for _ in range(c.get("count", 1)):
                info = client.publish(c["topic"], c["payload"], qos=c.get("qos", 1))
                say(event="published", mid=info.mid)
        elif c["cmd"] == "flood":
            # QoS 0, paced: a device that keeps sending beyond its rate.
            import time
            end = time.monotonic() + c["seconds"]
            while time.monotonic() < end and client.is_connected():
                for _ in range(c["per_second"] // 10):
                    client.publish(c["topic"], c["payload"], qos=0)
                time.sleep(0.1)
        elif c["cmd"] == "disconnect":
            client.disconnect()
            client.loop_stop()
    except Exception as e:  # the test reads it as a failed step
        say(event="error", error=repr(e))

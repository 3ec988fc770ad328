"""Record every TCP connection attempt (SYN) and reset (RST) seen in the network namespace it runs in.

    ip netns exec NS python -m tests.cluster.tcpwatch OUT.jsonl

One JSON line per packet: {"if", "out", "src", "sport", "dst", "dport", "flags"} (flags: "S" connect,
"SA" accept, "R"/"RA" reset). A packet socket on every interface of the namespace, with a kernel
filter (classic BPF, the compiled form of `tcp[tcpflags] & (tcp-syn|tcp-rst) != 0`) so the bulk
traffic (weights, batches) never reaches Python. On `lo` each packet passes twice (out and in): only
the outgoing copy is kept. Prints "ready" once capturing; SIGTERM/SIGINT stop it. Needs root.

What it is for: a process dialling 127.0.0.1 for a service of another host shows up as a SYN to
127.0.0.1:<port> answered by a RST from that port — the "Connection refused, remote=[127.0.0.1]" of
a service advertised on loopback. `refused_loopback(records)` lists those.
"""

from __future__ import annotations

import ctypes
import json
import signal
import socket
import struct
import sys

ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
# (code, jt, jf, k): IPv4 / TCP / not a fragment / SYN or RST flag set -> keep the packet, else drop.
SYN_OR_RST = [
    (0x28, 0, 0, 12),  # 0: ldh [12]                 ethertype
    (0x15, 0, 8, ETH_P_IP),  # 1: jeq #0x800         else -> 10
    (0x30, 0, 0, 23),  # 2: ldb [23]                 IP protocol
    (0x15, 0, 6, 6),  # 3: jeq #6 (TCP)              else -> 10
    (0x28, 0, 0, 20),  # 4: ldh [20]                 flags + fragment offset
    (0x45, 4, 0, 0x1FFF),  # 5: jset #0x1fff         a fragment -> 10
    (0xB1, 0, 0, 14),  # 6: ldxb 4*([14]&0xf)        IP header length
    (0x50, 0, 0, 27),  # 7: ldb [x + 27]             TCP flags (14 + 13)
    (0x45, 0, 1, 0x06),  # 8: jset #0x06 (SYN|RST)   else -> 10
    (0x06, 0, 0, 0x40000),  # 9: ret #262144         keep
    (0x06, 0, 0, 0),  # 10: ret #0                   drop
]
FLAG_NAMES = ((0x02, "S"), (0x10, "A"), (0x04, "R"), (0x01, "F"))


def attach_filter(sock: socket.socket, program: list[tuple[int, int, int, int]]) -> None:
    code = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(code)
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HL", len(program), ctypes.addressof(buf)))


def parse(frame: bytes) -> dict | None:
    """Fields of an Ethernet-framed IPv4 TCP packet (what `lo` and veth deliver), else None."""
    if len(frame) < 34 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP or frame[23] != 6:
        return None
    tcp = 14 + 4 * (frame[14] & 0x0F)
    if len(frame) < tcp + 14:
        return None
    sport, dport = struct.unpack_from("!HH", frame, tcp)
    bits = frame[tcp + 13]
    return {"src": socket.inet_ntoa(frame[26:30]), "sport": sport, "dst": socket.inet_ntoa(frame[30:34]),
            "dport": dport, "flags": "".join(name for bit, name in FLAG_NAMES if bits & bit)}


def refused_loopback(records: list[dict]) -> list[tuple[int, int]]:
    """(client port, server port) of every connection to a loopback address refused with a reset: a
    SYN to 127.x:p whose reset came back from p to the SYN's source port."""
    syns = {(r["sport"], r["dport"]) for r in records if r["flags"] == "S" and r["dst"].startswith("127.")}
    resets = {(r["dport"], r["sport"]) for r in records if "R" in r["flags"] and r["src"].startswith("127.")}
    return sorted(syns & resets)


def main(out_path: str) -> None:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    attach_filter(sock, SYN_OR_RST)
    sock.settimeout(0.2)
    running = True

    def stop(signum, frame):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with open(out_path, "a", buffering=1) as out:
        print("ready", flush=True)
        while running:
            try:
                frame, (ifname, _, pkttype, _, _) = sock.recvfrom(256)
            except (TimeoutError, InterruptedError):
                continue
            rec = parse(frame)
            if rec is None or (ifname == "lo" and pkttype != PACKET_OUTGOING):
                continue
            out.write(json.dumps({"if": ifname, "out": pkttype == PACKET_OUTGOING, **rec}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])

#!/usr/bin/env python3
"""Writes the seed corpus of kolo's fuzz targets into tests/fuzz/corpus/<name>/.

The seeds are small, valid (or deliberately almost valid) inputs in each harness's input
format, so that libFuzzer starts from the interesting parts of the grammar instead of guessing
magic numbers. Run it again after changing a harness's input format; libFuzzer's own finds are
merged in with `FUZZER -merge=1 tests/fuzz/corpus/<name> <run dir>/corpus` (see run_fuzzer.sh).
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def write(name, seeds):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    for old in os.listdir(d):
        if old.startswith("seed-"):
            os.remove(os.path.join(d, old))
    for label, data in seeds:
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(d, "seed-" + label), "wb") as f:
            f.write(data)
    print(f"{name}: {len(seeds)} seeds")


# ---------------------------------------------------------------- env (fuzz_env.cpp)

def env_seeds():
    env = lambda *xs: b"\x00" + ("\n".join(xs) + "\n").encode()
    mode = lambda m, text: bytes([m]) + text.encode()
    return [
        ("kolo-run", env("KOLO_RANK=1", "KOLO_SIZE=4", "KOLO_LOCAL_RANK=1", "KOLO_LOCAL_SIZE=4",
                         "KOLO_CROSS_RANK=0", "KOLO_CROSS_SIZE=1", "KOLO_STORE=127.0.0.1:29500",
                         "KOLO_SECRET=0123456789abcdef0123", "KOLO_HOST_KEY=node-a",
                         "KOLO_TIMEOUT_SECONDS=30", "KOLO_TRANSPORT=shm")),
        ("torchrun", env("RANK=3", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
                         "GROUP_RANK=1", "MASTER_ADDR=10.1.2.3", "MASTER_PORT=29400",
                         "KOLO_SECRET=abcdefgh12345678")),
        ("openmpi", env("OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3",
                        "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1",
                        "KOLO_PEERS=[::1]:4000,10.0.0.2:4001,host-c:4002",
                        "KOLO_SECRET=secretsecret", "KOLO_ADDR=10.0.0.3", "KOLO_DEVICES=0,1,3")),
        ("horovod", env("HOROVOD_RANK=0", "HOROVOD_SIZE=2", "HOROVOD_LOCAL_RANK=0",
                        "HOROVOD_LOCAL_SIZE=1", "HOROVOD_CROSS_RANK=0", "HOROVOD_CROSS_SIZE=2",
                        "KOLO_STORE=[fe80::1]:65535", "KOLO_SECRET=0000000000000000",
                        "KOLO_LISTEN_FD=3")),
        ("options", env("KOLO_SIZE=1", "KOLO_RANK=0",
                        "KOLO_ALLREDUCE=tree:0-65536;ring:65537-max",
                        "KOLO_BROADCAST=binomial:0-32767;chain:32K-max",
                        "KOLO_TUNING=file:/tmp/kolo.tuning", "KOLO_COMPRESSION=fp16",
                        "KOLO_FUSION_THRESHOLD=67108864", "KOLO_CYCLE_TIME_MS=2.5",
                        "KOLO_CACHE_CAPACITY=0", "KOLO_STALL_WARNING_SECONDS=5",
                        "KOLO_STALL_SHUTDOWN_SECONDS=1e2", "KOLO_TIMELINE=/tmp/t.json",
                        "KOLO_SHM_SLOT_BYTES=65536", "KOLO_SHM_SLOTS=4", "KOLO_SPIN_US=0.5",
                        "KOLO_SEGMENT_BYTES=131072", "KOLO_SMALL_ALLREDUCE_BYTES=4096")),
        ("small-threshold", env("KOLO_SMALL_ALLREDUCE_BYTES=1099511627776", "KOLO_COMPRESSION=bf16",
                                "KOLO_TRANSPORT=routed", "KOLO_BROADCAST=auto:0-max")),
        ("bad-values", env("KOLO_SIZE=-1", "KOLO_RANK=abc", "KOLO_TIMEOUT_SECONDS=nan",
                           "KOLO_STORE=:80", "KOLO_SECRET=short", "KOLO_SHM_SLOTS=99999999999",
                           "KOLO_ALLREDUCE=ring:0-10;tree:5-max", "KOLO_TUNING=file:",
                           "KOLO_CYCLE_TIME_MS=inf", "KOLO_SPIN_US= 1 ")),
        ("allreduce-rules", mode(2, "recursive-doubling:0-4K;rabenseifner:4097-1M;"
                                    "hierarchical:1048577-1G;auto:1073741825-max")),
        ("allreduce-rules-2", mode(2, " Double-Binary-Tree : 0-10kib ; halving-doubling:10241-MAX;")),
        ("allreduce-overlap", mode(2, "ring:0-10;tree:5-max")),
        ("broadcast-rules", mode(3, "binomial:0-32767;chain:32K-max")),
        ("host-port", mode(4, "[::1]:29500")),
        ("number", mode(4, " 1e-3 ")),
        ("names", mode(5, "file:/tmp/kolo.tuning")),
        ("tuning-file", mode(6, "# kolo tuning\nshm_alpha_us 4.0000\nshm_beta_ns 0.25000\n"
                                "tcp_alpha_us 30.0\ntcp_beta_ns 0.6\ngamma_ns 0.08\n")),
        ("tuning-file-crlf", mode(6, "gamma_ns=0.1\r\ntcp_alpha_us\t12\r\n")),
    ]


# ---------------------------------------------------------------- store (fuzz_store.cpp)

SET, GET, ADD, WAIT, ERASE, CAS = 1, 2, 3, 4, 5, 6


def frame(tag, payload=b""):
    return struct.pack("<IB", 1 + len(payload), tag) + payload


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<I", len(b)) + b


def store_seeds():
    set_ = lambda k, v: frame(SET, s(k) + (v.encode() if isinstance(v, str) else v))
    get = lambda k, ms=0: frame(GET, struct.pack("<Q", ms) + s(k))
    add = lambda k, d: frame(ADD, s(k) + struct.pack("<q", d))
    wait = lambda ks, ms=0: frame(WAIT, struct.pack("<QI", ms, len(ks)) + b"".join(s(k) for k in ks))
    erase = lambda k: frame(ERASE, s(k))
    b = lambda v: v.encode() if isinstance(v, str) else v
    cas = lambda k, old, new: frame(CAS, s(k) + s(old) + b(new))
    auth = lambda stream: b"\x00" + stream
    two = lambda a, b: b"\x02" + struct.pack("<H", len(a)) + a + b
    return [
        ("set-get", auth(set_("kolo/0/hostkey/0", "node-a") + get("kolo/0/hostkey/0"))),
        ("get-missing", auth(get("nope") + get("nope", 3))),
        ("add", auth(add("c", 1) + add("c", -5) + get("c") + add("c", 2**63 - 1))),
        ("add-not-int", auth(set_("v", "x1") + add("v", 1) + set_("e", "") + add("e", 1))),
        ("wait", auth(set_("a", "1") + wait(["a"]) + wait(["a", "b"]) + wait([]))),
        ("erase", auth(set_("k", b"\x00\xff" * 8) + erase("k") + get("k") + erase("k"))),
        ("cas", auth(cas("d", "", "1,3") + cas("d", "", "2") + cas("d", "1,3", "4") + get("d") +
                     cas("absent", "x", "y") + get("absent"))),
        ("cas-binary", auth(cas(b"\x00k", b"", b"\x00\xff") + cas(b"\x00k", b"\x00\xff", b""))),
        ("cas-overrun", auth(frame(CAS, s("k") + struct.pack("<I", 1000) + b"short"))),
        ("two-wake-cas", two(get("dec", 5000) + wait(["dec"], 5000), cas("dec", "", "0,1"))),
        ("binary-key", auth(set_(b"\x00\x01'\\key", "v") + get(b"\x00\x01'\\key"))),
        ("bad-len", auth(struct.pack("<I", 0) + b"\x01")),
        ("huge-len", auth(struct.pack("<IB", 0xFFFFFFFF, SET))),
        ("unknown-op", auth(frame(9, b"abc"))),
        ("trailing", auth(frame(GET, struct.pack("<Q", 0) + s("k") + b"junk"))),
        ("key-overrun", auth(frame(SET, struct.pack("<I", 1000) + b"short"))),
        ("wait-count", auth(frame(WAIT, struct.pack("<QI", 0, 0xFFFFFFFF)))),
        ("pipelined", auth(get("late", 100000) + set_("other", "1") + get("other"))),
        ("two-wake-get", two(get("wake", 5000) + get("wake"), set_("wake", "now"))),
        ("two-wake-wait", two(wait(["x", "y"], 5000), set_("x", "1") + add("y", 7))),
        ("two-barrier", two(add("b/count", 1) + get("b/done", 5000),
                            add("b/count", 1) + set_("b/done", "1"))),
        ("stranger-garbage", b"\x01" + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("stranger-magic", b"\x01" + b"KOLOAU1\x00" + b"\x00" * 80),
        ("stranger-short", b"\x01" + b"KOLO"),
        ("wrong-purpose", b"\x04" + set_("k", "v") + get("k")),
    ]


# ---------------------------------------------------------------- mesh frames (fuzz_mesh_frames.cpp)

RECV, REDUCE, SEND = 0, 1, 2
DT = {"f16": 0, "bf16": 1, "f32": 2, "f64": 3, "i8": 4, "u8": 5, "i32": 6, "i64": 7}
OP = {"sum": 0, "avg": 1, "min": 2, "max": 3, "prod": 4}


def op(kind, dtype, count, red="sum"):
    return struct.pack("<BH", kind | (DT[dtype] << 2) | (OP[red] << 5), count)


def header(*ops):
    return bytes([len(ops) - 1]) + b"".join(ops)


def whole(i, chunk_elems):  # a correct message for operation i
    return bytes([0xC0 | i]) + struct.pack("<H", chunk_elems)


def begin(i, bad_seq=False, bad_total=False):
    return bytes([0x80 | (bad_seq << 2) | (bad_total << 3) | i])


def data(i, length, rest=False, extra=None):
    f = (1 if rest else 0) | (2 if extra is not None else 0)
    out = bytes([0x90 | (f << 2) | i]) + struct.pack("<H", length)
    if extra is not None:
        out += bytes([extra])
    return out


def abort(kind, origin, reason):
    r = reason.encode()
    return bytes([0xA0 | kind, origin, len(r)]) + r


def raw(b):
    out = b""
    while b:
        part, b = b[:128], b[128:]
        out += bytes([len(part) - 1]) + part
    return out


def mesh_seeds():
    return [
        ("one-recv", header(op(RECV, "f32", 1000)) + whole(0, 65535)),
        ("reduce-chunks", header(op(REDUCE, "i32", 3000, "sum")) + whole(0, 7)),
        ("large-direct", header(op(RECV, "f16", 40000)) + whole(0, 30000)),
        ("mixed", header(op(RECV, "f64", 100), op(SEND, "u8", 500), op(REDUCE, "bf16", 4097, "max"),
                         op(RECV, "i8", 0)) + whole(0, 13) + whole(2, 4096) + whole(3, 1)),
        ("reduce-all-types", header(op(REDUCE, "f16", 999, "prod"), op(REDUCE, "i64", 77, "min"),
                                    op(REDUCE, "u8", 5, "avg"), op(REDUCE, "f64", 2048, "max"))
         + whole(0, 3) + whole(1, 76) + whole(2, 1) + whole(3, 2047)),
        ("by-hand", header(op(RECV, "u8", 300)) + begin(0) + data(0, 100) + data(0, 0, rest=True)),
        ("bad-seq", header(op(RECV, "f32", 10)) + begin(0, bad_seq=True) + data(0, 40)),
        ("bad-total", header(op(RECV, "f32", 10)) + begin(0, bad_total=True)),
        ("data-first", header(op(RECV, "i32", 8)) + data(0, 32)),
        ("overrun", header(op(RECV, "u8", 10), op(RECV, "u8", 10)) + begin(0) + data(0, 30)
         + begin(1) + data(1, 10)),
        ("partial-element", header(op(REDUCE, "f32", 4)) + begin(0) + data(0, 3) + data(0, 13)),
        # Followed by more than the 256 KiB receive buffer holds: the parser must not spin.
        ("partial-element-spin", header(op(REDUCE, "f32", 4), op(RECV, "u8", 1)) + begin(0)
         + data(0, 3) + data(1, 65535) * 5),
        ("overrun-spin", header(op(RECV, "u8", 10), op(RECV, "u8", 1)) + begin(0) + data(0, 30)
         + data(1, 65535) * 5),
        ("lying-length", header(op(RECV, "u8", 64)) + begin(0) + data(0, 64, extra=9)),
        ("abort", header(op(RECV, "f32", 10)) + abort(4, 3, "collective mismatch: test")),
        # A peer's timeout (kind 2) is forwarded as a TimeoutError at once, not a hang; a NUL in
        # the reason must not cut the message short (regress-forwarded-timeout-nul found both).
        ("abort-timeout-nul", header(op(RECV, "f16", 40000)) + abort(2, 0, "timed out\0 here")),
        ("abort-mid", header(op(RECV, "u8", 100)) + begin(0) + data(0, 50) + abort(3, 1, "gone")),
        ("abort-short", header(op(RECV, "u8", 1)) + raw(struct.pack("<II", 0x4B4C0003, 4) + b"ab")),
        ("abort-huge", header(op(RECV, "u8", 1)) + raw(struct.pack("<II", 0x4B4C0003, 1 << 20))),
        ("bad-type", header(op(RECV, "u8", 1)) + raw(struct.pack("<II", 0x4B4C0009, 0))),
        ("bad-begin-len", header(op(RECV, "u8", 1)) + raw(struct.pack("<II", 0x4B4C0001, 39))),
        ("truncated", header(op(RECV, "f64", 1000)) + begin(0) + data(0, 100)),
        ("send-only", header(op(SEND, "f32", 8191), op(SEND, "u8", 0))),
        ("garbage", header(op(RECV, "u8", 16)) + raw(bytes(range(256)))),
    ]


def main():
    write("env", env_seeds())
    write("store", store_seeds())
    write("mesh_frames", mesh_seeds())
    return 0


if __name__ == "__main__":
    sys.exit(main())

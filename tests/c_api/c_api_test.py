#!/usr/bin/env python3
"""c_api_test.py — kolo's C ABI from Python through ctypes (standard library only).

    c_api_test.py --lib path/to/libkolo_c.so MODE [N]

Under kolo-run each rank runs one MODE and checks every value exactly:

  collectives      allreduce (float32, float64, int32, int64, uint8; sum/average/min/max/product,
                   in and out of place), allgather, allgatherv, broadcast from every root,
                   reduce_scatter, alltoall, barrier; the engine's allreduce, allgather and
                   broadcast by name with test/wait/free
  explicit         the same through kolo_comm_init(rank, size, KOLO_STORE, KOLO_SECRET)
  bad-dtype        rank 0 passes dtype 99: KOLO_ERR_INVALID_ARGUMENT on every rank
  overflow         an allgather whose size x count wraps size_t: KOLO_ERR_INVALID_ARGUMENT
                   naming the count and element size on every rank
  mismatch         rank 0 reduces 4 elements, the others 5: KOLO_ERR_MISMATCH on every rank
  dead-peer        the last rank exits without a word: KOLO_ERR_PEER_LOST on the others
  abort            the last rank calls kolo_comm_abort: KOLO_ERR_PEER_LOST on the others
  timeout          rank 1 comes after the deadline (KOLO_TIMEOUT_SECONDS): KOLO_ERR_TIMEOUT on both
                   (on rank 1 at its allreduce or its next call; see FaultLog)
  engine-mismatch  one name, different counts: KOLO_ERR_MISMATCH from kolo_request_wait

Without a launcher:

  local            version, error strings, NULL handles, bad init arguments, a bad KOLO_*
                   variable (KOLO_ERR_CONFIG), bad dtype/op on a single-rank communicator
  host-store N     starts N ranks itself (subprocesses of this script); rank 0 hosts the store
                   (KOLO_INIT_HOST_STORE) at a free port, all run allreduce/allgather/broadcast

Each rank prints "KOLO_PY_PASS rank=R mode=M" and exits 0, or says what failed and exits 1.
Every failure path checks the code, that a message came with it, and that the interpreter is
still running afterwards (the exit status tells kolo-run otherwise).
"""
import ctypes
import os
import socket
import subprocess
import sys
import time

# ---------------------------------------------------------------- the binding

SUCCESS, INVALID_ARGUMENT, MISMATCH, PEER_LOST, TIMEOUT, CONFIG, INTERNAL = range(7)
FLOAT16, BFLOAT16, FLOAT32, FLOAT64, INT8, UINT8, INT32, INT64 = range(8)
SUM, AVERAGE, MIN, MAX, PRODUCT = range(5)
INIT_HOST_STORE = 1

CTYPE = {FLOAT32: ctypes.c_float, FLOAT64: ctypes.c_double, INT8: ctypes.c_int8,
         UINT8: ctypes.c_uint8, INT32: ctypes.c_int32, INT64: ctypes.c_int64}


def load(path):
    lib = ctypes.CDLL(path)
    P, S, I, R = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int
    sig = {
        "kolo_get_version": (I, []),
        "kolo_get_abi_version": (I, []),
        "kolo_get_error_string": (ctypes.c_char_p, [R]),
        "kolo_get_last_error": (ctypes.c_char_p, []),
        "kolo_comm_init_env": (R, [ctypes.POINTER(P)]),
        "kolo_comm_init": (R, [ctypes.POINTER(P), I, I, ctypes.c_char_p, ctypes.c_char_p,
                               ctypes.c_uint]),
        "kolo_comm_destroy": (R, [P]),
        "kolo_comm_abort": (R, [P]),
        "kolo_comm_rank": (R, [P, ctypes.POINTER(I)]),
        "kolo_comm_size": (R, [P, ctypes.POINTER(I)]),
        "kolo_comm_local_rank": (R, [P, ctypes.POINTER(I)]),
        "kolo_comm_local_size": (R, [P, ctypes.POINTER(I)]),
        "kolo_allreduce": (R, [P, P, S, I, I, P]),
        "kolo_allgather": (R, [P, P, S, I, P]),
        "kolo_allgatherv": (R, [P, S, P, ctypes.POINTER(S), I, P]),
        "kolo_broadcast": (R, [P, S, I, I, P]),
        "kolo_reduce_scatter": (R, [P, P, S, I, I, P]),
        "kolo_alltoall": (R, [P, P, S, I, P]),
        "kolo_barrier": (R, [P]),
        "kolo_engine_create": (R, [ctypes.POINTER(P), P]),
        "kolo_engine_destroy": (R, [P]),
        "kolo_engine_allreduce": (R, [P, ctypes.c_char_p, P, P, S, I, I, ctypes.POINTER(P)]),
        "kolo_engine_allreduce_coalesced": (R, [P, ctypes.c_char_p, ctypes.POINTER(P),
                                                ctypes.POINTER(S), S, I, I, ctypes.POINTER(P)]),
        "kolo_engine_allgather": (R, [P, ctypes.c_char_p, P, S, I, ctypes.POINTER(P)]),
        "kolo_engine_broadcast": (R, [P, ctypes.c_char_p, P, S, I, I, ctypes.POINTER(P)]),
        "kolo_request_test": (R, [P, ctypes.POINTER(I)]),
        "kolo_request_wait": (R, [P]),
        "kolo_request_output": (R, [P, ctypes.POINTER(P), ctypes.POINTER(S)]),
        "kolo_request_counts": (R, [P, ctypes.POINTER(S), S]),
        "kolo_request_free": (None, [P]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


lib = None
rank = int(os.environ.get("KOLO_RANK", "0"))
mode = ""
failures = 0


def fail(what):
    global failures
    failures += 1
    print(f"KOLO_PY_FAIL rank={rank} mode={mode}: {what}", file=sys.stderr, flush=True)


def check(cond, what):
    if not cond:
        fail(what)


def last_error():
    return lib.kolo_get_last_error().decode()


def ok(code, what):
    if code != SUCCESS:
        fail(f"{what} returned {code} ({lib.kolo_get_error_string(code).decode()}): "
             f"{last_error()}")


def expect_error(code, want, needle, what):
    msg = last_error()
    if code != want:
        fail(f"{what} returned {code} ({lib.kolo_get_error_string(code).decode()}), expected "
             f"{want} ({lib.kolo_get_error_string(want).decode()}): {msg}")
    elif not msg or (needle and needle not in msg):
        fail(f"{what}: message {msg!r} lacks {needle!r}")
    else:
        print(f"rank {rank}: {what} -> {lib.kolo_get_error_string(code).decode()}: {msg}",
              flush=True)


def arr(dtype, values):
    return (CTYPE[dtype] * len(values))(*values)


def init_env():
    comm = ctypes.c_void_p()
    ok(lib.kolo_comm_init_env(ctypes.byref(comm)), "kolo_comm_init_env")
    return comm


def init(r, n, store, secret, flags=0):
    comm = ctypes.c_void_p()
    ok(lib.kolo_comm_init(ctypes.byref(comm), r, n, store and store.encode(),
                          secret and secret.encode(), flags), "kolo_comm_init")
    return comm


def query(fn, comm):
    v = ctypes.c_int(-1)
    ok(fn(comm, ctypes.byref(v)), fn.__name__)
    return v.value


# ---------------------------------------------------------------- collectives

def run_collectives(comm, expect_size):
    me, n = query(lib.kolo_comm_rank, comm), query(lib.kolo_comm_size, comm)
    check(me == rank and n == expect_size, f"rank/size {me}/{n}, expected {rank}/{expect_size}")
    check(query(lib.kolo_comm_local_size, comm) == n, "local size")
    check(query(lib.kolo_comm_local_rank, comm) == me, "local rank")

    # allreduce: float32 sum out of place (an odd count), float64 average in place, int32
    # max/min, int64 product, uint8 sum — each against values computed here.
    count = 1037
    src = arr(FLOAT32, [me * 1000 + i for i in range(count)])
    dst = arr(FLOAT32, [0] * count)
    ok(lib.kolo_allreduce(src, dst, count, FLOAT32, SUM, comm), "allreduce float32 sum")
    want = [1000 * n * (n - 1) // 2 + n * i for i in range(count)]
    check(list(dst) == want, "allreduce float32 sum values")
    check(list(src) == [me * 1000 + i for i in range(count)], "allreduce input unchanged")

    d = arr(FLOAT64, [2.0 * me + i for i in range(9)])
    ok(lib.kolo_allreduce(d, d, 9, FLOAT64, AVERAGE, comm), "allreduce float64 average")
    check(list(d) == [float(n - 1 + i) for i in range(9)], "allreduce float64 average values")

    def ival(r, i):
        return (r * 7 + i * 3) % 11 - 5
    a = arr(INT32, [ival(me, i) for i in range(6)])
    mx, mn = arr(INT32, [0] * 6), arr(INT32, [0] * 6)
    ok(lib.kolo_allreduce(a, mx, 6, INT32, MAX, comm), "allreduce int32 max")
    ok(lib.kolo_allreduce(a, mn, 6, INT32, MIN, comm), "allreduce int32 min")
    check(list(mx) == [max(ival(r, i) for r in range(n)) for i in range(6)], "int32 max values")
    check(list(mn) == [min(ival(r, i) for r in range(n)) for i in range(6)], "int32 min values")

    p = arr(INT64, [me + 2, -(me + 1), 1000 + me])
    ok(lib.kolo_allreduce(p, p, 3, INT64, PRODUCT, comm), "allreduce int64 product")
    want = [1, 1, 1]
    for r in range(n):
        want = [want[0] * (r + 2), want[1] * -(r + 1), want[2] * (1000 + r)]
    check(list(p) == want, f"int64 product values {list(p)} != {want}")

    u = arr(UINT8, [me * 10 + i for i in range(5)])
    ok(lib.kolo_allreduce(u, u, 5, UINT8, SUM, comm), "allreduce uint8 sum")
    check(list(u) == [(10 * n * (n - 1) // 2 + n * i) % 256 for i in range(5)], "uint8 sum")

    # allgather, out of place and in place (this rank's block of the output).
    k = 5
    out = arr(INT32, [0] * (n * k))
    ok(lib.kolo_allgather(arr(INT32, [me * 100 + i for i in range(k)]), out, k, INT32, comm),
       "allgather")
    check(list(out) == [r * 100 + i for r in range(n) for i in range(k)], "allgather values")
    buf = arr(INT32, [-1] * (n * k))
    for i in range(k):
        buf[me * k + i] = me * 7 + i
    block = ctypes.cast(ctypes.addressof(buf) + me * k * 4, ctypes.c_void_p)
    ok(lib.kolo_allgather(block, buf, k, INT32, comm), "allgather in place")
    check(list(buf) == [r * 7 + i for r in range(n) for i in range(k)], "allgather in place")

    # allgatherv: rank r contributes r + 1 elements.
    counts = (ctypes.c_size_t * n)(*[r + 1 for r in range(n)])
    out = arr(FLOAT64, [0.0] * sum(counts))
    ok(lib.kolo_allgatherv(arr(FLOAT64, [me + 0.25 * i for i in range(me + 1)]), me + 1, out,
                           counts, FLOAT64, comm), "allgatherv")
    check(list(out) == [r + 0.25 * i for r in range(n) for i in range(r + 1)],
          "allgatherv values")

    # broadcast from every root.
    for root in range(n):
        b = arr(FLOAT64, [root * 10.0 + i if me == root else -1.0 for i in range(7)])
        ok(lib.kolo_broadcast(b, 7, FLOAT64, root, comm), f"broadcast root {root}")
        check(list(b) == [root * 10.0 + i for i in range(7)], f"broadcast root {root} values")

    # reduce_scatter: block `me` of the elementwise sum.
    k = 3
    out = arr(FLOAT32, [0] * k)
    ok(lib.kolo_reduce_scatter(arr(FLOAT32, [me + i for i in range(n * k)]), out, k, FLOAT32,
                               SUM, comm), "reduce_scatter")
    check(list(out) == [n * (n - 1) // 2 + n * (me * k + i) for i in range(k)],
          "reduce_scatter values")

    # alltoall: block j of rank r's input lands on rank j as block r.
    k = 2
    out = arr(INT64, [0] * (n * k))
    ok(lib.kolo_alltoall(arr(INT64, [me * 100 + j * 10 + i for j in range(n) for i in range(k)]),
                         out, k, INT64, comm), "alltoall")
    check(list(out) == [r * 100 + me * 10 + i for r in range(n) for i in range(k)],
          "alltoall values")

    for _ in range(3):
        ok(lib.kolo_barrier(comm), "barrier")
    run_engine(comm, me, n)


def wait_polling(req, what):
    done = ctypes.c_int(0)
    give_up = time.monotonic() + 60
    while True:
        code = lib.kolo_request_test(req, ctypes.byref(done))
        if done.value or code != SUCCESS:
            return code
        if time.monotonic() > give_up:
            fail(f"{what}: not done after 60 s")
            return TIMEOUT
        time.sleep(0.001)


def run_engine(comm, me, n):
    engine = ctypes.c_void_p()
    ok(lib.kolo_engine_create(ctypes.byref(engine), comm), "kolo_engine_create")
    if not engine:
        return
    grad = arr(FLOAT32, [me + i for i in range(100)])
    summed = arr(FLOAT32, [0] * 100)
    ids = arr(INT64, [me * 1000 + i for i in range(me + 1)])
    params = arr(FLOAT64, [1.5, 2.5, 3.5] if me == n - 1 else [-1.0] * 3)
    r_grad, r_ids, r_params = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    ok(lib.kolo_engine_allreduce(engine, b"grad", grad, summed, 100, FLOAT32, SUM,
                                 ctypes.byref(r_grad)), "engine allreduce")
    ok(lib.kolo_engine_allgather(engine, b"ids", ids, me + 1, INT64, ctypes.byref(r_ids)),
       "engine allgather")
    ok(lib.kolo_engine_broadcast(engine, b"params", params, 3, FLOAT64, n - 1,
                                 ctypes.byref(r_params)), "engine broadcast")
    ok(lib.kolo_barrier(comm), "barrier next to the engine")
    ok(wait_polling(r_grad, "grad"), "grad request")
    ok(lib.kolo_request_wait(r_ids), "ids request")
    ok(wait_polling(r_params, "params"), "params request")
    check(list(summed) == [n * (n - 1) // 2 + n * i for i in range(100)], "engine allreduce")
    check(list(params) == [1.5, 2.5, 3.5], "engine broadcast values")
    data, count = ctypes.c_void_p(), ctypes.c_size_t()
    ok(lib.kolo_request_output(r_ids, ctypes.byref(data), ctypes.byref(count)), "output")
    check(count.value == n * (n + 1) // 2, "engine allgather count")
    if data:
        got = list((ctypes.c_int64 * count.value).from_address(data.value))
        check(got == [r * 1000 + i for r in range(n) for i in range(r + 1)],
              f"engine allgather values {got}")
    per_rank = (ctypes.c_size_t * n)()
    ok(lib.kolo_request_counts(r_ids, per_rank, n), "counts")
    check(list(per_rank) == [r + 1 for r in range(n)], "engine allgather counts")
    for r in (r_grad, r_ids, r_params):
        lib.kolo_request_free(r)
    # A bucket of int32 buffers (1 to 30 elements) in one request, twice (negotiated, cached).
    for rnd in range(2):
        counts = [1 + (j * 7) % 30 for j in range(9)]
        bufs = [arr(INT32, [me + j + i + rnd for i in range(c)]) for j, c in enumerate(counts)]
        ptrs = (ctypes.c_void_p * len(bufs))(*[ctypes.cast(b, ctypes.c_void_p) for b in bufs])
        cs = (ctypes.c_size_t * len(counts))(*counts)
        req = ctypes.c_void_p()
        ok(lib.kolo_engine_allreduce_coalesced(engine, b"bucket", ptrs, cs, len(bufs), INT32, SUM,
                                               ctypes.byref(req)), "engine coalesced")
        ok(lib.kolo_request_wait(req), "coalesced request")
        lib.kolo_request_free(req)
        for j, b in enumerate(bufs):
            want = [n * (n - 1) // 2 + n * (j + i + rnd) for i in range(counts[j])]
            check(list(b) == want, f"engine coalesced buffer {j}: {list(b)}")
    ok(lib.kolo_engine_destroy(engine), "kolo_engine_destroy")


# ---------------------------------------------------------------- errors

def run_local():
    # The library's version is the header's (kolo.h's KOLO_VERSION_* and KOLO_C_ABI_VERSION).
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include",
                          "kolo", "c", "kolo.h")
    macros = {}
    with open(header) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "#define" and parts[2].isdigit():
                macros[parts[1]] = int(parts[2])
    want = (macros["KOLO_VERSION_MAJOR"] * 10000 + macros["KOLO_VERSION_MINOR"] * 100
            + macros["KOLO_VERSION_PATCH"])
    check(lib.kolo_get_version() == want, f"version {lib.kolo_get_version()} != {want}")
    check(lib.kolo_get_abi_version() == macros["KOLO_C_ABI_VERSION"], "abi version")
    strings = {lib.kolo_get_error_string(c).decode() for c in range(7)}
    check(len(strings) == 7, f"error strings not distinct: {strings}")
    check(lib.kolo_get_error_string(1234).decode() == "unknown kolo result code", "unknown code")

    one = ctypes.c_int(0)
    expect_error(lib.kolo_comm_init_env(None), INVALID_ARGUMENT, "comm is NULL", "init_env(NULL)")
    expect_error(lib.kolo_barrier(None), INVALID_ARGUMENT, "comm is NULL", "barrier(NULL)")
    expect_error(lib.kolo_comm_rank(None, ctypes.byref(one)), INVALID_ARGUMENT, "comm is NULL",
                 "rank(NULL)")
    expect_error(lib.kolo_request_wait(None), INVALID_ARGUMENT, "request is NULL",
                 "request_wait(NULL)")

    comm = ctypes.c_void_p()
    expect_error(lib.kolo_comm_init(ctypes.byref(comm), 5, 2, b"127.0.0.1:1", b"0123456789abcdef",
                                    0), INVALID_ARGUMENT, "rank 5", "init rank 5 of 2")
    expect_error(lib.kolo_comm_init(ctypes.byref(comm), 0, 2, b"localhost", b"0123456789abcdef",
                                    0), INVALID_ARGUMENT, "store_address", "init without a port")
    expect_error(lib.kolo_comm_init(ctypes.byref(comm), 0, 2, b"127.0.0.1:1", b"abc", 0),
                 INVALID_ARGUMENT, "secret", "init with a short secret")
    check(not comm, "comm stays NULL after a failed init")

    os.environ["KOLO_TIMEOUT_SECONDS"] = "-3"
    expect_error(lib.kolo_comm_init_env(ctypes.byref(comm)), CONFIG, "KOLO_TIMEOUT_SECONDS",
                 "init_env with a bad KOLO_TIMEOUT_SECONDS")
    del os.environ["KOLO_TIMEOUT_SECONDS"]
    os.environ.pop("KOLO_SECRET", None)
    expect_error(lib.kolo_comm_init(ctypes.byref(comm), 1, 2, b"127.0.0.1:1", None, 0), CONFIG,
                 "secret", "init without a secret")

    # A single-rank communicator: a bad dtype/op fails the call, and the communicator after it.
    comm = init(0, 1, None, None)
    x = arr(FLOAT32, [1.0, 2.0])
    ok(lib.kolo_allreduce(x, x, 2, FLOAT32, SUM, comm), "allreduce on one rank")
    check(list(x) == [1.0, 2.0], "one-rank allreduce values")
    expect_error(lib.kolo_allreduce(x, x, 2, 99, SUM, comm), INVALID_ARGUMENT, "dtype 99",
                 "allreduce with dtype 99")
    expect_error(lib.kolo_barrier(comm), INVALID_ARGUMENT, "dtype 99", "barrier after the error")
    ok(lib.kolo_comm_destroy(comm), "destroy")
    comm = init(0, 1, None, None)
    expect_error(lib.kolo_allreduce(x, x, 2, FLOAT32, 17, comm), INVALID_ARGUMENT, "op 17",
                 "allreduce with op 17")
    ok(lib.kolo_comm_destroy(comm), "destroy")


class FaultLog:
    """The steps of a fault mode: a barrier (0), the call that goes wrong (1), a barrier (2).

    An error reaches a rank at the latest in the step after the fault: a rank still finishing
    the barrier when a peer's abort arrives gets it there, and a rank whose part of the failing
    exchange had already arrived complete (a late rank whose peer timed out after sending)
    returns normally and gets it at its next call (kolo's rule, docs/api.md). Checked: the first
    failing step returns the expected code with a message, no later step succeeds or returns
    another code, and the first failure is not after step `latest`."""

    def __init__(self):
        self.code, self.step, self.message = SUCCESS, -1, ""

    def __call__(self, step, code):
        if self.code == SUCCESS and code != SUCCESS:
            self.code, self.step, self.message = code, step, last_error()
            print(f"rank {rank}: step {step} -> {lib.kolo_get_error_string(code).decode()}: "
                  f"{self.message}", flush=True)
        elif self.code != SUCCESS and code != self.code:
            fail(f"step {step} returned {code} after step {self.step} failed with {self.code}")

    def expect(self, code, needle, latest):
        if (self.code != code or self.step > latest or not self.message
                or (needle and needle not in self.message)):
            fail(f"expected {code} with {needle!r} by step {latest}, got {self.code} at step "
                 f"{self.step}: {self.message!r}")


def run_fault(comm):
    me, n = query(lib.kolo_comm_rank, comm), query(lib.kolo_comm_size, comm)
    check(n >= 2, "fault modes need 2 ranks or more")
    a, b = arr(INT32, [1, 2, 3, 4, 5]), arr(INT32, [0] * 5)
    if mode == "engine-mismatch":
        engine = ctypes.c_void_p()
        ok(lib.kolo_engine_create(ctypes.byref(engine), comm), "kolo_engine_create")
        req = ctypes.c_void_p()
        ok(lib.kolo_engine_allreduce(engine, b"w", a, a, 4 if me == 0 else 5, INT32, SUM,
                                     ctypes.byref(req)), "engine allreduce")
        expect_error(lib.kolo_request_wait(req), MISMATCH, "'w'", "wait on a mismatched name")
        lib.kolo_request_free(req)
        ok(lib.kolo_engine_destroy(engine), "kolo_engine_destroy")
        ok(lib.kolo_barrier(comm), "the communicator is untouched by the engine's error")
        return
    log = FaultLog()
    log(0, lib.kolo_barrier(comm))
    if mode == "bad-dtype":
        log(1, lib.kolo_allreduce(a, b, 5, 99 if me == 0 else INT32, SUM, comm))
        log(2, lib.kolo_barrier(comm))
        log.expect(INVALID_ARGUMENT, "dtype 99" if me == 0 else "on rank 0", 1 if me == 0 else 2)
    elif mode == "overflow":
        # size x count wraps in the C ABI (2^64 / n + 1 one-byte elements): refused on every
        # rank, nothing read or written.
        wraps = (2**64 - 1) // n + 1
        log(1, lib.kolo_allgather(a, b, wraps, UINT8, comm))
        log(2, lib.kolo_barrier(comm))
        log.expect(INVALID_ARGUMENT, "elements of 1 bytes overflow", 1)
    elif mode == "mismatch":
        log(1, lib.kolo_allreduce(a, b, 4 if me == 0 else 5, INT32, SUM, comm))
        log(2, lib.kolo_barrier(comm))
        log.expect(MISMATCH, "allreduce", 2)
    elif mode in ("dead-peer", "abort"):
        if me == n - 1:
            if mode == "abort":
                ok(lib.kolo_comm_abort(comm), "kolo_comm_abort")
            print(f"KOLO_PY_PASS rank={me} mode={mode} (leaving)", flush=True)
            os._exit(1 if failures or log.code != SUCCESS else 0)  # gone, nothing destroyed
        log(1, lib.kolo_allreduce(a, b, 5, INT32, SUM, comm))
        log(2, lib.kolo_barrier(comm))
        log.expect(PEER_LOST, "kolo_comm_abort" if mode == "abort" else None, 1)
    elif mode == "timeout":
        timeout = float(os.environ["KOLO_TIMEOUT_SECONDS"])
        if me == 1:
            time.sleep(timeout + 1.5)
        t0 = time.monotonic()
        log(1, lib.kolo_allreduce(a, b, 5, INT32, SUM, comm))
        if me == 0:
            check(time.monotonic() - t0 >= 0.9 * timeout, "timed out before the deadline")
        log(2, lib.kolo_barrier(comm))
        log.expect(TIMEOUT, "timed out", 1 if me == 0 else 2)
    else:
        fail(f"unknown mode {mode}")


# ---------------------------------------------------------------- host-store: no launcher

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_host_store_parent(lib_path, n):
    port = free_port()
    secret = os.urandom(16).hex()
    procs = []
    for r in range(n):
        env = dict(os.environ, KOLO_RANK=str(r))
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--lib", lib_path, "host-store-rank", str(r), str(n),
             f"127.0.0.1:{port}", secret], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    bad = 0
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            bad += 1
        sys.stdout.write("".join(f"[{r}] {line}\n" for line in out.splitlines()))
        if p.returncode != 0 or f"KOLO_PY_PASS rank={r}" not in out:
            bad += 1
    if bad:
        fail(f"{bad} of {n} self-started ranks failed")


def run_host_store_rank(r, n, address, secret):
    comm = init(r, n, address, secret, INIT_HOST_STORE)
    if comm:
        run_collectives(comm, n)
        ok(lib.kolo_comm_destroy(comm), "destroy")


def main():
    global lib, mode, rank
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--lib":
        sys.exit(__doc__)
    lib = load(args[1])
    mode = args[2]
    if mode == "local":
        run_local()
    elif mode == "host-store":
        run_host_store_parent(args[1], int(args[3]))
    elif mode == "host-store-rank":
        rank = int(args[3])
        run_host_store_rank(rank, int(args[4]), args[5], args[6])
    else:
        if mode == "explicit":
            comm = init(rank, int(os.environ["KOLO_SIZE"]), os.environ["KOLO_STORE"],
                        os.environ["KOLO_SECRET"])
        else:
            comm = init_env()
        if not comm:
            fail("no communicator")
        elif mode in ("collectives", "explicit"):
            run_collectives(comm, int(os.environ.get("KOLO_SIZE", "1")))
        else:
            run_fault(comm)
        if comm:
            ok(lib.kolo_comm_destroy(comm), "kolo_comm_destroy")
    if failures:
        print(f"KOLO_PY_FAIL rank={rank} mode={mode}: {failures} failed checks", file=sys.stderr)
        sys.exit(1)
    print(f"KOLO_PY_PASS rank={rank} mode={mode}", flush=True)


if __name__ == "__main__":
    main()

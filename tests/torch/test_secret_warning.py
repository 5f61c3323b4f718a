"""kolo_torch without KOLO_SECRET: rank 0 warns, in one line, when the drawn secret goes into a
TCPStore on a non-loopback address, and not for a loopback one; load_secret() sets the secret
from an owner-only file (issue 53). Real TCPStores (torch from the test venv), no compiled
plugin: kolo_torch/_secret.py is loaded by its path."""
import datetime
import importlib.util
import io
import os
import socket
import sys
import tempfile
import time

import torch.distributed as dist

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "kolo_torch_secret", os.path.join(here, "..", "..", "backends", "torch", "kolo_torch",
                                      "_secret.py"))
secret = importlib.util.module_from_spec(spec)
spec.loader.exec_module(secret)

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def own_ip():
    """A non-loopback address of this machine (the one its default route leaves through)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 9))
            ip = s.getsockname()[0]
        except OSError:
            ip = ""
    return ip if ip and not ip.startswith("127.") else None


def store(host):
    # As env:// builds it from MASTER_ADDR (the server listens on every interface; its own
    # client connects to host), wrapped in the PrefixStore torch hands a backend.
    tcp = dist.TCPStore(host, 0, 1, True, timeout=datetime.timedelta(seconds=10))
    return tcp, dist.PrefixStore("default_pg/0//cpu", tcp)


t0 = time.monotonic()
env = {k: v for k, v in os.environ.items() if k != "KOLO_SECRET"}
os.environ.pop("KOLO_SECRET", None)
tcp, loop = store("127.0.0.1")
check(secret.published_warning(loop, 0, env) is None, "loopback MASTER_ADDR: no warning")
check(secret.published_warning(dist.PrefixStore("x", dist.HashStore()), 0, env) is None,
      "a HashStore: no warning")
class _Tcp:  # a machine without a non-loopback address: a stand-in with TCPStore's fields
    host, port = "192.0.2.10", 29500


ip = own_ip()
if ip is not None:
    tcp2, remote = store(ip)
else:
    print("note: no non-loopback IPv4 address here; a stand-in store at 192.0.2.10")
    tcp2 = _Tcp()
    ip, remote = tcp2.host, dist.PrefixStore("default_pg/0//cpu", dist.HashStore())
    remote = type("Prefix", (), {"underlying_store": tcp2})()
line = secret.published_warning(remote, 0, env)
check(line is not None and f"{ip}:{tcp2.port}" in line and "\n" not in line and
      "KOLO_SECRET" in line and "load_secret" in line,
      f"MASTER_ADDR={ip}: one line naming {ip}:{tcp2.port}, KOLO_SECRET and load_secret")
check(secret.published_warning(remote, 1, env) is None, "only rank 0 warns")
check(secret.published_warning(remote, 0, dict(env, KOLO_SECRET="s3cret-given")) is None,
      "KOLO_SECRET set: no warning")
out = io.StringIO()
secret.warn_if_published(remote, 0, stream=out)
secret.warn_if_published(remote, 0, stream=out)
check(out.getvalue().count("\n") == 1 and out.getvalue().startswith("kolo_torch: warning:"),
      "warn_if_published prints it once per process")

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "secret")
    with open(path, "w") as f:
        f.write("0123456789abcdef\n")
    os.chmod(path, 0o644)
    got = {}
    try:
        secret.load_secret(path, got)
        check(False, "load_secret refuses a file others can read")
    except RuntimeError as e:
        check("readable by others" in str(e) and path in str(e),
              "load_secret refuses a file others can read, naming it")
    os.chmod(path, 0o600)
    check(secret.load_secret(path, got) == path and got["KOLO_SECRET"] == "0123456789abcdef",
          "load_secret sets KOLO_SECRET from an owner-only file")
    check(secret.published_warning(remote, 0, got) is None, "after load_secret: no warning")
print(f"{len(failures) == 0 and 'passed' or 'FAILED'} in {time.monotonic() - t0:.2f} s")
sys.exit(1 if failures else 0)

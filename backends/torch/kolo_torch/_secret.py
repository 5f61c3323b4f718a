"""The group secret under torch: a warning when it would be published where strangers can read
it, and load_secret(), which sets it from a file every rank can read instead.

Without KOLO_SECRET, rank 0 draws the group's secret and publishes it through the store torch
hands the backend. torch's TCPStore has no authentication (and its server listens on every
interface), so whoever reaches MASTER_PORT can read the secret. On one host (a loopback
MASTER_ADDR) that costs nothing: the ranks meet through shared memory and kolo opens no TCP
listener. Across hosts it makes kolo's TCP connections as private as that port: rank 0 then
says so, in one line on stderr, once per process. Pure Python (no torch import), so it is
tested without the compiled plugin.
"""
import ipaddress
import os
import socket
import stat
import sys

_warned = False


def store_address(store):
    """(host, port) of the TCPStore under ``store`` (PrefixStores unwrapped), or None when
    ``store`` is another kind (a FileStore, a HashStore)."""
    seen = 0
    while store is not None and seen < 32:
        if hasattr(store, "underlying_store"):
            store = store.underlying_store
            seen += 1
            continue
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and host:
            return host, port
        return None
    return None


def is_loopback(host):
    """Whether every address ``host`` names is a loopback one (an unresolvable name is not)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback
                               for i in infos)


def published_warning(store, rank, environ=None):
    """The one-line warning for a group about to publish its drawn secret in a TCPStore on a
    non-loopback address, or None (KOLO_SECRET set, not rank 0, loopback, not a TCPStore)."""
    env = os.environ if environ is None else environ
    if env.get("KOLO_SECRET") or rank != 0:
        return None
    addr = store_address(store)
    if addr is None:
        return None
    host, port = addr
    if is_loopback(host):
        return None
    return (f"kolo_torch: warning: KOLO_SECRET is not set, so rank 0 publishes the group's "
            f"drawn secret in torch's TCPStore at {host}:{port}, which has no authentication: "
            "anyone who reaches that port can read it and join kolo's TCP connections; set "
            "KOLO_SECRET on every rank or call kolo_torch.load_secret(path) first (docs/torch.md)")


def warn_if_published(store, rank, stream=None):
    """Prints published_warning's line (once per process) to stderr."""
    global _warned
    line = published_warning(store, rank)
    if line is None or _warned:
        return
    _warned = True
    try:
        (stream or sys.stderr).write(line + "\n")
        (stream or sys.stderr).flush()
    except (OSError, ValueError):
        pass


def load_secret(path, environ=None):
    """Sets KOLO_SECRET from the first line of ``path`` (a file only its owner can read, holding
    at least 8 characters: ``openssl rand -hex 32 > path; chmod 600 path``, on a shared file
    system or copied to every host) unless KOLO_SECRET is set already; call it on every rank
    before ``init_process_group``. Returns the secret's source: "KOLO_SECRET" or ``path``."""
    env = os.environ if environ is None else environ
    if env.get("KOLO_SECRET"):
        return "KOLO_SECRET"
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read(4097)
    except OSError as e:
        raise RuntimeError(f"kolo_torch: cannot read the secret file {path}: "
                           f"{e.strerror or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise RuntimeError(f"kolo_torch: the secret file {path} is readable by others "
                           f"(mode {stat.S_IMODE(mode):o}): chmod 600 it")
    lines = raw.decode("utf-8", "replace").splitlines()
    secret = lines[0].strip() if lines else ""
    if len(secret) < 8 or len(raw) > 4096:
        raise RuntimeError(f"kolo_torch: the secret file {path} must hold one line of 8 to "
                           "4096 characters")
    env["KOLO_SECRET"] = secret
    return path

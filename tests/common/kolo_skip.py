"""tests/common/kolo_skip.py — the Python tests' skip: a skip outside CI, a failure in CI unless its
reason is on tests/common/skip_allowlist.txt (the shell twin is skip.sh, the C++ one skip.hpp;
all three read that list and decide alike).

    skip_allowed(reason)         True where a skip for ``reason`` is allowed here
    pytest_skip(reason, message) pytest.skip where allowed, pytest.fail where not
    exit_skip(reason, message)   for scripts: exit 77 (CTest's SKIP_RETURN_CODE) or 1
    fail_skips_in_ci(report)     for a conftest's report hooks: a skip in CI becomes a failure
                                 (every pytest skip, whatever raised it: importorskip, a marker)

A skip is allowed outside CI (CI unset, empty, "0" or "false"), and in CI only for a reason the list
names; with KOLO_TEST_REQUIRE_GPU=1 never for the reason no-gpu.
"""

import os
import re
import sys

ALLOWLIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skip_allowlist.txt")


def in_ci():
    return os.environ.get("CI", "") not in ("", "0", "false", "FALSE", "False", "no")


def allowed_reasons(path=ALLOWLIST):
    """The reasons the allow-list names (its second column)."""
    reasons = set()
    try:
        with open(path) as f:
            for line in f:
                words = line.split()
                if len(words) >= 2 and not words[0].startswith("#"):
                    reasons.add(words[1])
    except OSError:
        pass
    return reasons


def _refusal(reason):
    """Why a skip for ``reason`` is a failure here, or None where it is allowed."""
    if reason == "no-gpu" and os.environ.get("KOLO_TEST_REQUIRE_GPU") == "1":
        return "KOLO_TEST_REQUIRE_GPU=1"
    if in_ci() and reason not in allowed_reasons():
        return f"CI={os.environ.get('CI')} and '{reason}' is not on tests/common/skip_allowlist.txt"
    return None


def skip_allowed(reason):
    return _refusal(reason) is None


def _failure_text(reason, message, why):
    return f"FAILED: this test would skip ({reason}: {message}), and a skip is a failure here ({why})"


def pytest_skip(reason, message):
    import pytest

    why = _refusal(reason)
    if why is None:
        pytest.skip(f"SKIP ({reason}): {message}")  # fail_skips_in_ci reads the reason back
    pytest.fail(_failure_text(reason, message, why), pytrace=False)


def exit_skip(reason, message):
    why = _refusal(reason)
    if why is None:
        print(f"SKIP ({reason}): {message}", flush=True)
        sys.exit(77)
    print(_failure_text(reason, message, why), file=sys.stderr, flush=True)
    sys.exit(1)


def fail_skips_in_ci(report):
    """Turns a skipped pytest report (a test's or a module's collection) into a failed one in CI.

    A skip from pytest_skip whose reason is allowed stays a skip; any other (pytest.skip,
    importorskip, a skip marker) has no reason on the list. An expected failure (xfail) is left
    alone. Call it from hookwrapper implementations of pytest_runtest_makereport and
    pytest_make_collect_report."""
    if not (in_ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    what = report.longrepr
    if isinstance(what, tuple) and len(what) == 3:  # (path, line, "Skipped: ...")
        what = f"{what[0]}:{what[1]}: {what[2]}"
    what = str(what)
    m = re.search(r"SKIP \(([a-z0-9-]+)\): ", what)
    reason = m.group(1) if m else "pytest-skip"
    why = _refusal(reason)
    if why is None:
        return
    report.outcome = "failed"
    report.longrepr = _failure_text(reason, what, why)


def _pytest_hooks():
    """The two hookwrappers that apply fail_skips_in_ci to every report; a conftest takes them
    with `from kolo_skip import pytest_runtest_makereport, pytest_make_collect_report`."""
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def runtest_makereport(item, call):
        outcome = yield
        fail_skips_in_ci(outcome.get_result())

    @pytest.hookimpl(hookwrapper=True)
    def make_collect_report(collector):
        outcome = yield
        fail_skips_in_ci(outcome.get_result())

    return runtest_makereport, make_collect_report


if "pytest" in sys.modules:  # imported from a conftest: define the hooks for it to take
    pytest_runtest_makereport, pytest_make_collect_report = _pytest_hooks()

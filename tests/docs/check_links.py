#!/usr/bin/env python3
"""Every relative link in README.md and docs/*.md must name a file or directory of the
repository, and no page may send a reader to a file a user of kolo does not have (the design
notes kept outside the repository). Prints one line per broken link and "N passed, N failed"."""
import os
import re
import sys

repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
pages = [os.path.join(repo, "README.md")] + sorted(
    os.path.join(repo, "docs", f) for f in os.listdir(os.path.join(repo, "docs"))
    if f.endswith(".md"))
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
outside = re.compile(r"\.\./shared|\b(ENV|ARCHITECTURE|BENCHMARKS|STYLE)\.md\b")
passed = failed = 0
for page in pages:
    text = open(page, encoding="utf-8").read()
    rel = os.path.relpath(page, repo)
    for n, line in enumerate(text.splitlines(), 1):
        for target in link.findall(line):
            if re.match(r"^[a-z]+://|^mailto:|^#", target):
                continue
            path = target.split("#", 1)[0]
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path))
            if os.path.exists(resolved) and resolved.startswith(repo):
                passed += 1
            else:
                failed += 1
                print(f"{rel}:{n}: broken link {target}")
        if outside.search(line):
            failed += 1
            print(f"{rel}:{n}: refers to a file users do not have: {line.strip()[:120]}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

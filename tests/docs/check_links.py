#!/usr/bin/env python3
"""Every relative link in README.md, docs/*.md and docs/perf/*.md must name a file or directory
of the repository, a link into a Markdown page with #anchor must name a heading of that page
(GitHub's anchor rules), and no page may send a reader to a file a user of kolo does not have
(the design notes kept outside the repository). Prints one line per broken link and
"N passed, N failed"."""
import os
import re
import sys

repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def md_files(folder):
    full = os.path.join(repo, folder)
    return sorted(os.path.join(full, f) for f in os.listdir(full) if f.endswith(".md"))


pages = [os.path.join(repo, "README.md")] + md_files("docs") + md_files(os.path.join("docs", "perf"))
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
outside = re.compile(r"\.\./shared|\b(ENV|ARCHITECTURE|BENCHMARKS|STYLE)\.md\b")
heading = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_anchors = {}


def anchors(page):
    """The anchors GitHub gives the headings of a Markdown page (outside code fences):
    lower case, punctuation but '-' and '_' dropped, spaces to '-', repeats numbered -1, -2."""
    if page not in _anchors:
        seen, found, fenced = {}, set(), False
        for line in open(page, encoding="utf-8"):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            m = None if fenced else heading.match(line)
            if not m:
                continue
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link's text only
            slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
        _anchors[page] = found
    return _anchors[page]


passed = failed = 0
for page in pages:
    text = open(page, encoding="utf-8").read()
    rel = os.path.relpath(page, repo)
    for n, line in enumerate(text.splitlines(), 1):
        for target in link.findall(line):
            if re.match(r"^[a-z]+://|^mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            ok = os.path.exists(resolved) and resolved.startswith(repo)
            if ok and anchor and resolved.endswith(".md") and os.path.isfile(resolved):
                ok = anchor.lower() in anchors(resolved)
            if ok:
                passed += 1
            else:
                failed += 1
                print(f"{rel}:{n}: broken link {target}")
        if outside.search(line):
            failed += 1
            print(f"{rel}:{n}: refers to a file users do not have: {line.strip()[:120]}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

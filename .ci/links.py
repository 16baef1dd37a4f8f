#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown pages: every linked file exists and
every `#anchor` is a heading of the page it names (GitHub's anchors: lower case, punctuation
dropped, spaces as hyphens). Pages under target/ and the recorded outputs under docs/results/
(but not its index, docs/results/README.md) are left out; links to the web are not followed. Prints each broken link and exits 1 if there is one."""

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SKIP = ("target", ".git")
RESULTS = os.path.join(ROOT, "docs", "results")


def pages():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP]
        for f in files:
            path = os.path.join(d, f)
            recorded = path.startswith(RESULTS + os.sep) and path != os.path.join(RESULTS, "README.md")
            if f.endswith(".md") and not recorded:
                yield path


def anchors(path, cache={}):
    if path not in cache:
        found, code = set(), False
        for line in open(path, encoding="utf-8"):
            if line.startswith("```"):
                code = not code
            m = re.match(r"^#{1,6} (.*)", line)
            if m and not code:
                slug = re.sub(r"[^a-z0-9 _\-]", "", m.group(1).strip().lower()).replace(" ", "-")
                found.add(slug)
        cache[path] = found
    return cache[path]


def main():
    bad = 0
    for page in pages():
        text = open(page, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for url in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", url):
                continue
            path, _, frag = url.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            rel = os.path.relpath(page, ROOT)
            if not os.path.exists(target):
                print(f"{rel}: {url}: no such file")
                bad += 1
            elif frag and target.endswith(".md") and frag not in anchors(target):
                print(f"{rel}: {url}: no heading #{frag}")
                bad += 1
    if bad:
        print(f"{bad} broken link(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

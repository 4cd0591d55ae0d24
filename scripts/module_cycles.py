#!/usr/bin/env python3
"""Finds files of a crate that reach a file that reaches them back.

    scripts/module_cycles.py CRATE_SRC_DIR [...]

An edge A -> B is any path in A's code (a `use` line or an inline `crate::`, `super::`
or `self::` path; comments, `mod` declarations and test modules aside) that names an item
of file B. A path into a folder's `mod.rs` that names one of its `pub use` re-exports is
followed to the file the item comes from, so a module's surface is not itself a dependency.
Prints each cycle found (one line, the files in order) and exits 1 if there is any.
"""
import os
import re
import sys


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] if "//" in line else line for line in text.splitlines())


def without_tests(text):
    """The text before a `#[cfg(test)]` module (test modules sit at the end of a file)."""
    m = re.search(r"#\[cfg\(test\)\]\s*(pub\s+)?mod\s+\w+\s*\{", text)
    return text[: m.start()] if m else text


def expand(path):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]] (a `use` tree, flattened)."""
    path = path.replace(" ", "").replace("\n", "")
    m = re.match(r"^(.*?)\{(.*)\}$", path)
    if not m:
        return [[s for s in path.split("::") if s]]
    head = [s for s in m.group(1).split("::") if s]
    depth, part, parts = 0, "", []
    for ch in m.group(2):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    return [head + rest for p in parts if p for rest in expand(p)]


class Crate:
    def __init__(self, src):
        self.src = os.path.abspath(src)
        self.files = {}  # module path tuple -> file
        for dirpath, _, names in os.walk(self.src):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                f = os.path.join(dirpath, name)
                rel = os.path.relpath(f, self.src)[:-3].split(os.sep)
                if rel[-1] == "mod" or rel in (["lib"], ["main"]):
                    rel = rel[:-1]
                self.files.setdefault(tuple(rel), f)
        self.text = {f: without_tests(strip_comments(open(f).read())) for f in self.files.values()}
        self.reexports = {f: self._reexports(f) for f in self.files.values()}

    def module_of(self, f):
        return next(m for m, g in self.files.items() if g == f)

    def _use_trees(self, text, public_only):
        pattern = r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);" if public_only else r"\buse\s+([^;]+);"
        for m in re.finditer(pattern, text):
            yield from expand(m.group(1))

    def _reexports(self, f):
        out = {}
        for segs in self._use_trees(self.text[f], public_only=True):
            name = segs[-1]
            if " as " in name or "as" in segs:
                continue
            out[name] = segs
        return out

    def absolute(self, f, segs):
        """The crate path `segs` (as written in file `f`) names, or None outside the crate."""
        here = list(self.module_of(f))
        if not segs:
            return None
        if segs[0] == "crate":
            return segs[1:]
        if segs[0] == "self":
            return here + segs[1:]
        if segs[0] == "super":
            base = here
            while segs and segs[0] == "super":
                base = base[:-1]
                segs = segs[1:]
            return base + segs
        # A bare path: a child module of this file's module, or an external crate.
        if tuple(here + segs[:1]) in self.files:
            return here + segs
        return None

    def target(self, path, seen=0):
        """The file that defines what `path` (absolute segments) names."""
        path = [s for s in path if s not in ("*",)]
        for n in range(len(path), -1, -1):
            module = tuple(path[:n])
            if module in self.files:
                f = self.files[module]
                rest = path[n:]
                if rest and rest[0] in self.reexports[f] and seen < 8:
                    via = self.absolute(f, self.reexports[f][rest[0]])
                    if via is not None:
                        return self.target(via + rest[1:], seen + 1)
                return f
        return None

    def edges(self, f):
        text = self.text[f]
        code = re.sub(r"\b(pub(\([^)]*\))?\s+)?mod\s+\w+\s*;", "", text)
        code_without_reexports = re.sub(r"\bpub(?:\([^)]*\))?\s+use\s+[^;]+;", "", code)
        paths = list(self._use_trees(code_without_reexports, public_only=False))
        rest = re.sub(r"\buse\s+[^;]+;", "", code_without_reexports)
        for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", rest):
            paths.append(m.group(1).split("::"))
        out = set()
        for segs in paths:
            segs = [s.split(" as ")[0] for s in segs]
            absolute = self.absolute(f, segs)
            if absolute is None:
                continue
            t = self.target(absolute)
            if t is not None and t != f:
                out.add(t)
        return out


def cycles(crate):
    graph = {f: crate.edges(f) for f in crate.files.values()}
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def strongconnect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strongconnect(v)
    return found


def main():
    bad = 0
    for src in sys.argv[1:]:
        crate = Crate(src)
        for comp in cycles(crate):
            bad += 1
            print("cycle:", " <-> ".join(os.path.relpath(f) for f in comp))
    if bad:
        sys.exit(1)
    print("no cycles in", ", ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()

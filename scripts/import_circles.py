#!/usr/bin/env python3
"""Import circles between the modules (files) of one crate: scripts/import_circles.py SRC

Reads every .rs under SRC (a crate's src/), maps each file to its module path,
collects the modules it names (crate::, super::, self::, its own child modules,
grouped use trees; one level of `pub use` re-exports followed; comments, string and
character literals and #[cfg(test)] modules left out: --with-tests keeps them), and
prints the strongly connected components (Tarjan). Exits 1 if there is one: a type
two modules share lives in a leaf (../shared/STYLE.md). scripts/test runs it on
every crate."""
import os, re, sys
src = sys.argv[1] if len(sys.argv) > 1 else "engine/src"
skip_tests = "--with-tests" not in sys.argv
mods = {}
for root, _, files in os.walk(src):
    for f in files:
        if not f.endswith(".rs"): continue
        p = os.path.join(root, f); rel = os.path.relpath(p, src)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib", "main"): rel = rel[:-1]
        mods[tuple(rel)] = p
def resolve(path):
    # longest existing module prefix
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in mods: return tuple(path[:n])
    return None
LITERALS = re.compile(r'r(#*)"(?:.|\n)*?"\1|b?"(?:\\.|[^"\\])*"|b?\'(?:\\.|[^\'\\])\'|//[^\n]*')


def closing_brace(text, i):
    """The index of the brace that closes the one at text[i] (or the end)."""
    depth = 0
    while i < len(text):
        if text[i] == "{": depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0: break
        i += 1
    return i


def strip(text):
    # Strings, characters and comments hold braces and paths that are not code.
    text = LITERALS.sub('""', text)
    while skip_tests:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text)
        if not m: break
        i = closing_brace(text, m.end() - 1)
        text = text[:m.start()] + text[i + 1:]
    # inside an inline `mod name { .. }` (not a test), `super::` is this file's module
    for m in list(re.finditer(r"\bmod\s+\w+\s*\{", text))[::-1]:
        i = closing_brace(text, m.end() - 1)
        block = re.sub(r"(?<!::)\bsuper::super::", "super::", text[m.end():i])
        block = re.sub(r"(?<!::)\bsuper::(?!super)", "self::", block)
        text = text[:m.end()] + block + text[i:]
    return text
def expand_use(body):
    # expand a use tree "a::{b, c::{d,e}}" into paths
    body = re.sub(r"\s+as\s+\w+", "", body)  # `x as y` names x
    body = body.replace(" ", "").replace("\n", "")
    out = []
    def rec(prefix, s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{": depth += 1
            if ch == "}": depth -= 1
            if ch == "," and depth == 0: parts.append(cur); cur = ""
            else: cur += ch
        if cur: parts.append(cur)
        for part in parts:
            if "{" in part:
                i = part.index("{"); head = part[:i].rstrip(":"); inner = part[i+1:part.rindex("}")]
                rec(prefix + ([x for x in head.split("::") if x]), inner)
            else:
                out.append(prefix + [x for x in part.split("::") if x])
    rec([], body)
    return out
edges = {m: set() for m in mods}
evidence = {}
def reexports(mod):
    text = strip(open(mods[mod]).read())
    res = []
    for u in re.findall(r"\bpub(?:\(crate\))?\s+use\s+([^;]+);", text, re.S):
        for path in expand_use(u):
            if path and path[0] not in ("crate", "self", "super") and tuple(list(mod) + [path[0]]) in mods:
                res.append((path[:1], [path[-1]]))
    return res
for m, p in mods.items():
    text = strip(open(p).read())
    is_dir = os.path.basename(p) in ("mod.rs", "lib.rs")
    here = list(m) if is_dir else list(m)  # module path of this file
    children = set(re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M))
    paths = []
    for u in re.findall(r"\buse\s+([^;]+);", text, re.S):
        paths += expand_use(u)
    for r in re.findall(r"(?<![\w:])((?:crate|super|self|\w+)(?:::\w+)+)", text):
        paths.append(r.split("::"))
    for path in paths:
        if not path: continue
        if path[0] == "crate": target = path[1:]
        elif path[0] == "self": target = here + path[1:]
        elif path[0] == "super":
            base = here[:]; i = 0
            while i < len(path) and path[i] == "super": base = base[:-1]; i += 1
            target = base + path[i:]
        elif path[0] in children: target = here + path
        else: continue
        t = resolve(target)
        # follow a `pub use child::Item` re-export one level, so crate::Settings names settings
        if t is not None and len(target) > len(t):
            item = target[len(t)]
            for (child, names) in reexports(t):
                if item in names: t = resolve(list(t) + child) or t; break
        if t is not None and t != m and t != ():
            evidence.setdefault((m, t), "::".join(path))
            # a child naming its ancestor only as a path prefix to reach a sibling is fine; resolve handles longest prefix
            edges[m].add(t)
# Tarjan
idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        out.append(comp)
for v in mods:
    if v not in idx: sc(v)
name = lambda m: "::".join(m) or "crate"
circles = [sorted(c) for c in out if len(c) > 1]
print(f"{len(mods)} modules, {sum(len(e) for e in edges.values())} edges, {len(circles)} circle(s)")
for comp in circles:
    s = set(comp)
    print(f"circle of {len(comp)}: " + ", ".join(name(m) for m in comp))
    for m in comp:
        inn = sorted(name(t) for t in edges[m] if t in s)
        print(f"   {name(m)} -> " + ", ".join(f"{name(t)} ({evidence[(m, t)]})" for t in sorted(edges[m]) if t in s))
sys.exit(1 if circles else 0)

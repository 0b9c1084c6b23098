"""One Markdown section of BENCHMARKS.md rewritten in place: what every
bench script that owns a section does (scripts/bench_*.py)."""
import os


def splice(path, section, text, after=None):
    """Replaces the section headed `section` (`## ...`) in the Markdown at
    path with text; a page without it gets it after the section headed
    `after` when there is one, else before `## Targets`, else at the end."""
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    body = text.rstrip() + "\n"
    start = old.find(f"\n{section}\n")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        new = old[: start + 1] + body + (old[end:] if end >= 0 else "")
    else:
        at = old.find(f"\n{after}\n") if after else -1
        at = old.find("\n## ", at + 1) if at >= 0 else old.find("\n## Targets\n")
        new = (old[: at + 1] + body + old[at:]) if at >= 0 else old.rstrip() + "\n\n" + body
    with open(path, "w") as f:
        f.write(new)

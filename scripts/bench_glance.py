"""Every target on the benchmarks page in one table, from the page itself.

  python3 scripts/bench_glance.py BENCHMARKS.md

Each bench script writes its own section with its targets' verdicts in
**Target** lines (and scripts/bench_run.py the "## Targets" table); a run of
one section leaves the others as they were. This collects those verdicts
after any run, full or `--*-only`, into "### Every target at a glance" under
"## Targets", each with the section (and its date) it comes from, so the
summary can never disagree with the sections it summarises.
"""
import re
import sys

SUBSECTION = "### Every target at a glance"


def sections(text):
    """(heading, body) of every `## ` section, in order."""
    parts = re.split(r"(?m)^(## .*)$", text)
    return [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def verdicts(body):
    """The target sentences of a section: its **Target** lines, split where
    one line judges several targets, each with the date it was measured:
    the nearest stamp ("YYYY-MM-DD HH:MM UTC") above its line, as a later
    paragraph of a section (a before/after run) carries its own, else the
    section's first date."""
    found = []
    lines = body.splitlines()
    for at, line in enumerate(lines):
        if not line.startswith("**Target"):
            continue
        date = date_of(body)
        for above in reversed(lines[:at]):
            stamp = re.search(r"20\d\d-\d\d-\d\d \d\d:\d\d UTC", above)
            if stamp:
                date = stamp.group(0)[:-4]
                break
        # "**Target: X: **missed**** (...)", "**Targets.** X: met (...). Y: ..."
        text = re.sub(r"^\*\*Targets?(?: \([^)]*\))?[.:]?(?:\*\*)?:?\s*", "", line).replace("**", "")
        for piece in re.split(r"(?<=\))[.;] (?=[A-Z-])", text):
            piece = re.sub(r"\bmissed\b", "**missed**", piece.strip().rstrip("."))
            if "missed" in piece or re.search(r"\bmet\b", piece):
                found.append((date, piece))
    return found


def date_of(body):
    m = re.search(r"(20\d\d-\d\d-\d\d)(?: (\d\d:\d\d) UTC)?", body)
    return " ".join(g for g in m.groups() if g) if m else "–"


def glance(text):
    rows = []
    machine = dict(sections(text)).get("## Machine", "")
    for heading, body in sections(text):
        if heading == "## Targets":
            # scripts/bench_run.py's own table: | target | measured | verdict |
            for line in body.split(SUBSECTION)[0].splitlines():
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) == 3 and cells[2] in ("met", "**missed**"):
                    rows.append(("Targets (the zoo, IPC, pipe)", date_of(machine), f"{cells[0]}: {cells[2]} ({cells[1]})"))
            continue
        for date, verdict in verdicts(body):
            rows.append((heading[3:], date, verdict))
    lines = [SUBSECTION, "",
             "Collected from the sections above by `scripts/bench_glance.py` after every bench run; each verdict "
             "is its section's, measured when that section was last written.", "",
             "| section | written | target and verdict |", "|---|---|---|"]
    lines += [f"| {section} | {date} | {verdict.replace('|', '/')} |" for section, date, verdict in rows]
    missed = sum("missed" in v for _, _, v in rows)
    lines += ["", f"{len(rows)} targets, {missed} missed.", ""]
    return "\n".join(lines)


def main():
    path = sys.argv[1]
    text = open(path).read()
    start = text.find("\n## Targets\n")
    if start < 0:
        sys.exit(f"bench_glance: {path} has no '## Targets' section")
    # Drop the summary of the last run.
    text = re.sub(rf"(?ms)^{re.escape(SUBSECTION)}\n.*?(?=^## |\Z)", "", text)
    start = text.find("\n## Targets\n")
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    text = text[:end].rstrip() + "\n\n" + glance(text) + text[end:]
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()

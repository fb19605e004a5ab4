#!/usr/bin/env python3
"""The floors of docs/DESIGN.md, checked: every library source against the table there.

- includes: a file of folder F includes only headers of F, of the folders F's row names, and
  the public headers (include/); kernels/cuda/device.cuh alone may include emu/ (the emulated
  build's wrapper);
- calls: MPI (`MPI_Xxx(`) and NCCL (`ncclXxx(`) are called in comm/ only;
- builds: `#if`s on RINGATTN_HAVE_CUDA/_MPI/_NCCL only in the two registries;
- the API: public functions (`ringattn_xxx(...) {`) are defined in api/ only, and the floors
  below it never call one (they call the ra__ function the public one wraps).

usage: floors.py SOURCE_DIR   (exit 1 with each breach listed)
"""
import os
import re
import sys

EXTS = (".c", ".h", ".cu", ".cuh", ".cpp", ".hpp")
REGISTRIES = {"kernels/backends.c", "comm/transports.c"}
WRAPPER_MAY_USE = {"kernels/cuda/device.cuh": {"emu"}}
LIBRARY = ("base", "masks", "kernels", "comm", "plan", "ring", "api", "tools")
ABOVE_API = ("api", "tools")  # may define (api/) and call the public functions
PUBLIC_DEF = re.compile(r"^[A-Za-z_][\w \t*]*?\b(ringattn_[a-z0-9_]+)\s*\([^;{]*\)\s*\{", re.M)
PUBLIC_CALL = re.compile(r"\b(ringattn_[a-z0-9_]+)(?<!_t)(?<!_fn)\s*\(")  # not a type's "(*"


def read_floors(design):
    """{folder: set of folders it may include} from the table after the floors marker."""
    text = open(design, encoding="utf-8").read()
    at = text.find("<!-- floors:")
    if at < 0:
        sys.exit("floors: no floors table in docs/DESIGN.md")
    rows = {}
    for line in text[at:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        m = re.fullmatch(r"`(\w+)/`", cells[0])
        if m:
            rows[m.group(1)] = set(cells[2].split())
    return rows


def sources(root, folder):
    for dirpath, _, names in os.walk(os.path.join(root, folder)):
        for n in sorted(names):
            if n.endswith(EXTS):
                path = os.path.join(dirpath, n)
                yield os.path.relpath(path, root), open(path, encoding="utf-8").read()


def strip_comments(code):
    code = re.sub(r"/\*.*?\*/", " ", code, flags=re.S)
    code = re.sub(r"//[^\n]*", " ", code)
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', code)  # and string literals


def main(root):
    floors = read_floors(os.path.join(root, "docs", "DESIGN.md"))
    missing = [f for f in LIBRARY + ("emu",) if f not in floors]
    if missing:
        sys.exit("floors: the table has no row for " + ", ".join(missing))
    breaches, files = [], 0
    for folder in LIBRARY + ("emu",):
        allowed = floors[folder] | {folder}
        for rel, text in sources(root, folder):
            files += 1
            for n, line in enumerate(text.splitlines(), 1):
                m = re.match(r'\s*#\s*include\s+"(\w+)/', line)
                if m and m.group(1) in floors and m.group(1) not in allowed | WRAPPER_MAY_USE.get(rel, set()):
                    breaches.append(f"{rel}:{n}: includes {m.group(1)}/ ({folder}/ may use: "
                                    f"{' '.join(sorted(floors[folder])) or 'nothing'})")
                if re.match(r"\s*#\s*(if|ifdef|ifndef|elif)\b.*RINGATTN_HAVE_(CUDA|MPI|NCCL)\b", line) \
                        and rel not in REGISTRIES and folder != "emu":
                    breaches.append(f"{rel}:{n}: a build #if outside the registries: {line.strip()}")
            code = strip_comments(text)
            for m in PUBLIC_DEF.finditer(code):
                if folder != "api":
                    n = code.count("\n", 0, m.start(1)) + 1
                    breaches.append(f"{rel}:{n}: defines the public {m.group(1)} outside api/")
            if folder not in ABOVE_API:
                defined = {m.start(1) for m in PUBLIC_DEF.finditer(code)}
                for m in PUBLIC_CALL.finditer(code):
                    if m.start(1) not in defined:
                        n = code.count("\n", 0, m.start()) + 1
                        breaches.append(f"{rel}:{n}: calls the public {m.group(1)} below api/")
            if folder in ("comm", "emu"):
                continue
            for m in re.finditer(r"\b(MPI_[A-Z][a-z0-9_]*|nccl[A-Z]\w*)\s*\(", code):
                n = code.count("\n", 0, m.start()) + 1
                breaches.append(f"{rel}:{n}: calls {m.group(1)} outside comm/")
    for b in breaches:
        print("floors: " + b)
    if breaches:
        print(f"floors: {len(breaches)} breach(es) of docs/DESIGN.md's floors")
        return 1
    print(f"floors: {files} files in {len(LIBRARY) + 1} folders keep docs/DESIGN.md's floors "
          f"(includes, MPI/NCCL calls in comm/, build #ifs in the registries, public "
          f"functions in api/)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))

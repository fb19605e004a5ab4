#!/usr/bin/env python3
"""PNG figures of what ringattn's benchmarks measure, from their JSON lines.

    python bench/plot.py OUT_DIR FILE.jsonl [FILE.jsonl ...] [--caption TEXT]

Reads every JSON line of the files (bench_local, bench_ring, bench_dynamic print them after
their tables, or into --json FILE; lines that are not JSON objects are skipped, so a whole
captured stdout works too) and writes the figures it has data for:

  throughput.png   forward and backward GFLOP/s against T, one line per mask and backend
                   (bench_local "result" lines)
  efficiency.png   ring efficiency (single-rank time / (P x ring time)) against P, one line per
                   layout and pass (bench_ring "result" lines of runs at several P)
  traffic.png      forward bytes sent over the mask's lower bound, per layout and mask/window
                   (bench_ring "traffic_total" lines)
  error.png        O, LSE and dQ error against float64 for P ranks (bench_ring "error" lines)
  dynamic.png      dynamic-mask forward and backward time against the share of keys kept
                   (bench_dynamic "result" lines)
  decode.png       decode tokens/s against P, one line per cache size (bench_ring "decode")
  cp2d_pP.png      the link model's ESTIMATED step time (forward + backward) against P_u for P
                   ranks: compute, all-to-all and the ring's exposed exchanges stacked, and each
                   part alone (ringattn-info --model --csv output, a CSV file among the inputs;
                   tools/link_model.h)

Each figure's caption is --caption (the machine and the date, say) and the benchmark's banner
(version, backend, BLAS kernels). Prints the files written; exit 2 when no figure had data, 3
when matplotlib is missing.
"""
import argparse
import json
import os
import sys
from collections import defaultdict

try:
    import matplotlib
except ImportError:  # say so rather than a traceback: the figures are optional
    sys.stderr.write("bench/plot.py: matplotlib is not installed, no figures written (pip install "
                     "matplotlib; the Python of cmake/python-env.sh has it)\n")
    sys.exit(3)

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

MODEL_HEADER = "ranks,per_node,ulysses,ring,"  # ringattn-info --csv's header line starts so


def model_row(raw, fields, notes):
    """A row of ringattn-info --csv as a "model_2d" record (numbers as numbers), or None."""
    values = raw.split(",")
    if len(values) != len(fields):
        return None
    try:
        rec = {k: (float(v) if "." in v or "e" in v else int(v)) for k, v in zip(fields, values)}
    except ValueError:
        return None
    rec.update(type="model_2d", _notes=list(notes))
    return rec


def read_lines(paths):
    """Every JSON object of the files, each tagged with the banner of its file, and the rows of
    ringattn-info --csv tables (with their '#' lines, the shape and the model's parameters)."""
    records = []
    for path in paths:
        banner = {}
        fields, notes, rows_read = None, [], False
        with open(path) as f:
            for raw in f:
                raw = raw.strip()
                if raw.startswith("# "):  # a table's notes come before its header
                    notes = [raw[2:]] if rows_read else notes + [raw[2:]]
                    rows_read = False
                    continue
                if raw.startswith(MODEL_HEADER):
                    fields = raw.split(",")
                    continue
                if fields and raw[:1].isdigit():
                    rec = model_row(raw, fields, notes)
                    if rec:
                        rec["_banner"] = banner
                        records.append(rec)
                        rows_read = True
                    continue
                if not raw.startswith("{"):
                    continue
                try:
                    rec = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if rec.get("type") == "banner":
                    banner = rec
                    continue
                rec["_banner"] = banner
                records.append(rec)
    return records


def banner_text(records):
    seen = []
    for r in records:
        b = r.get("_banner") or {}
        text = "ringattn %s, backend %s" % (b.get("version", "?"), b.get("backend", "?"))
        if b.get("blas_core"):
            text += ", BLAS %s" % b["blas_core"]
        if text not in seen and not any(s.startswith(text) for s in seen):
            seen = [s for s in seen if not text.startswith(s)] + [text]
    return "; ".join(seen)


def finish(fig, ax, records, caption, path, ncol=1):
    text = "; ".join(t for t in (caption, banner_text(records)) if t)
    fig.text(0.01, 0.01, text, fontsize=7, ha="left", va="bottom", wrap=True)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7 if ncol == 1 else 6, ncol=ncol)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw(ax, lines, label, dashed=lambda key: False, floor=None):
    """One line per key of `lines` ({key: {x: y}}), its points in x order; dashed(key): --."""
    for key, pts in sorted(lines.items()):
        xs = sorted(pts)
        ys = [pts[x] if floor is None else max(pts[x], floor) for x in xs]
        ax.plot(xs, ys, marker="o", linestyle="--" if dashed(key) else "-", label=label(key))


def of_type(records, kind, bench=None):
    return [r for r in records if r.get("type") == kind and
            (bench is None or bench(r))]


def plot_throughput(records, caption, out):
    rows = of_type(records, "result", lambda r: "gflops" in r and r.get("ranks") == 1
                   and r.get("layout") != "naive")
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lines = defaultdict(dict)
    for r in rows:
        key = (r["_banner"].get("backend", "cpu"), r["mask"], r.get("dtype", "f32"), r["pass"])
        lines[key][r["seq"]] = r["gflops"]
    draw(ax, lines, lambda k: "%s %s %s %s" % (k[0], k[2], k[1], k[3]), lambda k: k[3] == "bwd")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens T (one rank)")
    ax.set_ylabel("GFLOP/s (allowed pairs)")
    ax.set_title("Forward (solid) and backward (dashed) throughput against T")
    return finish(fig, ax, rows, caption, os.path.join(out, "throughput.png"))


def plot_efficiency(records, caption, out):
    rows = of_type(records, "result", lambda r: r.get("eff_pct") not in (None, "null")
                   and r.get("ranks", 1) > 1 and r.get("layout") in ("contig", "zigzag", "striped"))
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lines = defaultdict(dict)
    for r in rows:
        lines[(r["layout"], r["mask"], r["pass"])][r["ranks"]] = float(r["eff_pct"])
    draw(ax, lines, lambda k: "%s %s %s" % k, lambda k: k[2] == "bwd")
    ax.axhline(85, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("ranks P")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("efficiency % (1 rank / (P x ring))")
    ax.set_ylim(bottom=0)
    ax.set_title("Ring efficiency against P")
    return finish(fig, ax, rows, caption, os.path.join(out, "efficiency.png"))


def plot_traffic(records, caption, out):
    rows = of_type(records, "traffic_total")
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    groups = sorted({(r["mask"], r["ranks"]) for r in rows})
    layouts = sorted({r["layout"] for r in rows})
    width = 0.8 / max(1, len(layouts))
    for i, layout in enumerate(layouts):
        ratios = []
        for mask, ranks in groups:
            match = [r for r in rows if r["layout"] == layout and r["mask"] == mask and r["ranks"] == ranks]
            ratios.append(match[-1]["fwd_sent"] / match[-1]["fwd_bound"]
                          if match and match[-1]["fwd_bound"] > 0 else float("nan"))
        ax.bar([g + i * width for g in range(len(groups))], ratios, width, label=layout)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xticks([g + width * (len(layouts) - 1) / 2 for g in range(len(groups))])
    ax.set_xticklabels(["%s, P %d" % g for g in groups], fontsize=8)
    ax.set_ylabel("bytes sent / the mask's lower bound")
    ax.set_title("Forward traffic against what the mask needs (1 = nothing more)")
    return finish(fig, ax, rows, caption, os.path.join(out, "traffic.png"))


def plot_error(records, caption, out):
    rows = of_type(records, "error")
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    layouts = sorted({r["layout"] for r in rows if r.get("layout") != "single"}) or ["single"]
    for what in ("o", "lse", "dq"):
        lines = defaultdict(dict)
        for r in rows:  # the single-rank plan is every layout's P = 1
            for layout in (layouts if r.get("layout") == "single" else [r.get("layout", "")]):
                key = (r.get("dtype", "f32"), r.get("mask", ""), layout)
                lines[key][r["ranks"]] = r["err_" + what]
        name = what.upper() if what != "dq" else "dQ"
        draw(ax, lines, lambda k, name=name: "%s %s %s %s" % ((name,) + k), floor=1e-12)
    ax.set_yscale("log")
    ax.set_xlabel("ranks P")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("error against float64 (SPEC 9 norms)")
    ax.set_title("Error against the ring's size")
    return finish(fig, ax, rows, caption, os.path.join(out, "error.png"), ncol=2)


def plot_dynamic(records, caption, out):
    rows = of_type(records, "result", lambda r: "kept_pct" in r)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lines = defaultdict(dict)
    for r in rows:
        for pas in ("fwd", "bwd"):
            lines[(r["seq"], pas)][r["kept_pct"]] = r["time_%s_ms" % pas]
    draw(ax, lines, lambda k: "T %d %s" % k, lambda k: k[1] == "bwd")
    ax.set_xlabel("keys kept per row, % of the allowed ones (top-k density)")
    ax.set_ylabel("time, ms")
    ax.set_title("Dynamic mask attention: time against density")
    return finish(fig, ax, rows, caption, os.path.join(out, "dynamic.png"))


def plot_decode(records, caption, out):
    rows = of_type(records, "decode")
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lines = defaultdict(dict)
    for r in rows:
        lines[r["cache"]][r["ranks"]] = r["tokens_per_s"]
    draw(ax, lines, lambda cache: "cache %d keys" % cache)
    ax.set_yscale("log")
    ax.set_xlabel("ranks P holding the cache")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("decoded tokens / s")
    ax.set_title("Decode against a sharded KV cache")
    return finish(fig, ax, rows, caption, os.path.join(out, "decode.png"))


def plot_model_2d(records, caption, out):
    """The link model's step time against P_u, one figure per P (ringattn-info --csv rows)."""
    rows = of_type(records, "model_2d")
    written = []
    for P in sorted({r["ranks"] for r in rows}):
        mine = sorted((r for r in rows if r["ranks"] == P), key=lambda r: r["ulysses"])
        seen = {}
        for r in mine:  # the last of a P_u (a file given twice, say)
            seen[r["ulysses"]] = r
        mine = [seen[k] for k in sorted(seen)]
        labels = ["%d x %d" % (r["ulysses"], r["ring"]) for r in mine]
        parts = (("compute", [r["compute_fwd_ms"] + r["compute_bwd_ms"] for r in mine]),
                 ("all-to-all (intra-group)", [r["a2a_fwd_ms"] + r["a2a_bwd_ms"] for r in mine]),
                 ("ring exposed (not hidden)", [r["exposed_fwd_ms"] + r["exposed_bwd_ms"] for r in mine]))
        colors = {"compute": "C0", "all-to-all (intra-group)": "C1", "ring exposed (not hidden)": "C3",
                  "ring exchanges (hidden or not)": "C2", "step": "black"}
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4))
        xs = range(len(mine))
        bottom = [0.0] * len(mine)
        for name, ys in parts:
            left.bar(xs, ys, 0.6, bottom=bottom, label=name, color=colors[name])
            bottom = [b + y for b, y in zip(bottom, ys)]
        for x, total in zip(xs, bottom):
            left.text(x, total, "%.0f" % total, ha="center", va="bottom", fontsize=7)
        left.set_xticks(list(xs))
        left.set_xticklabels(labels, fontsize=8)
        left.set_xlabel("P_u x P_r (ulysses x ring)")
        left.set_ylabel("estimated step time, ms (forward + backward)")
        left.set_title("Estimated step time, P = %d (%d per node)" % (P, mine[0]["per_node"]), fontsize=10)
        lines = parts + (("ring exchanges (hidden or not)",
                          [r["ring_comm_fwd_ms"] + r["ring_comm_bwd_ms"] for r in mine]),
                         ("step", [r["step_ms"] for r in mine]))
        for name, ys in lines:  # a log axis: zeros (a flat ring's all-to-all) left out
            pts = [(x, y) for x, y in zip(xs, ys) if y > 0]
            if not pts:  # said in the legend, as nothing can be drawn
                right.plot([], [], color=colors[name], label=name + ": 0 at every P_u")
                continue
            right.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[name],
                       linestyle="--" if name == "step" else "-", label=name)
        right.set_yscale("log")
        right.set_xticks(list(xs))
        right.set_xticklabels(labels, fontsize=8)
        right.set_xlabel("P_u x P_r (ulysses x ring)")
        right.set_ylabel("ms per step (log)")
        right.set_title("Each part alone", fontsize=10)
        right.grid(True, alpha=0.3)
        right.legend(fontsize=7)
        notes = "; ".join(mine[0].get("_notes", []))
        text = "ESTIMATE (ringattn-info --model), not a measurement. " + notes
        written.append(finish(fig, left, [], "; ".join(t for t in (caption, text) if t),
                              os.path.join(out, "cp2d_p%d.png" % P)))
    return written


PLOTS = (plot_throughput, plot_efficiency, plot_traffic, plot_error, plot_dynamic, plot_decode,
         plot_model_2d)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="directory for the PNG files")
    ap.add_argument("files", nargs="+", help="JSON lines of the benchmarks, ringattn-info --csv tables")
    ap.add_argument("--caption", default="", help="the machine and the date, say")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    records = read_lines(args.files)
    written = []
    for plot in PLOTS:  # a figure's path, or a list of them (one per P), or None
        got = plot(records, args.caption, args.out)
        written += got if isinstance(got, list) else [got] if got else []
    for p in written:
        print(p)
    return 0 if written else 2


if __name__ == "__main__":
    sys.exit(main())

"""Presenting a :class:`~gnnsched.simulator.runner.Report`: the terminal table, the JSON file, the PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gnnsched.simulator.runner import Report

# (metric key, column title, format)
TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("makespan_s", "makespan s", "{:.1f}"),
    ("jct_mean_s", "JCT mean s", "{:.1f}"),
    ("jct_p99_s", "JCT p99 s", "{:.1f}"),
    ("queue_mean_s", "queue s", "{:.1f}"),
    ("qos_violation_rate", "QoS viol", "{:.0%}"),
    ("oom_kills", "OOM", "{}"),
    ("deployed", "deployed", "{}"),
    ("completed", "done", "{}"),
    ("gpu_mem_util", "GPU mem", "{:.0%}"),
    ("sm_util", "SM", "{:.0%}"),
)

# the closed loop's columns, shown when the run has --estimate-error, --hw-fault-rate or --buggy-jobs
LOOP_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("memory_exceeded", "mem-exc", "{}"),
    ("resize_retries", "resized", "{}"),
    ("fault_victims", "victims", "{}"),
    ("jobs_lost", "lost", "{}"),
    ("wasted_gpu_seconds", "wasted GPU s", "{:.0f}"),
)

JSON_KEYS = ("makespan_s", "jct_mean_s", "jct_p99_s", "queue_mean_s", "qos_violation_rate", "oom_kills", "completed",
             "deployed", "gpu_mem_util")


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def table_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    columns = TABLE_COLUMNS + (LOOP_COLUMNS if report.closed_loop else ())
    header = ["policy"] + [title for _, title, _ in columns]
    rows = [[name] + [_fmt(m.get(key), fmt) for key, _, fmt in columns] for name, m in report.policies.items()]
    return header, rows


def render_table(report: Report) -> str:
    """Plain-text comparison table (also what the rich table shows)."""
    header, rows = table_rows(report)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "  ".join(padded)

    lines = [line(header)] + [line(r) for r in rows]
    for ref in report.reference:
        sim = "-" if ref["simulated"] is None else f"{ref['simulated']:g}{ref['unit']}"
        if ref["paper_value"] is None:
            against = "the paper's best" if ref.get("against") == "paper" else "best other"
            lines.append(f"best gnnsched vs {against}: {ref['compare']} on {ref['metric']}: ratio {sim} "
                         f"(gnnsched {ref.get('verdict')})" + (f"; {ref['note']}" if ref.get("note") else ""))
            continue
        lines.append(f"{ref['paper']}: {ref['compare']} {ref['metric']}: paper {ref['paper_value']:g}{ref['unit']}, "
                     f"simulated {sim}")
    if report.runtime_error:
        lines.append(f"runtime error {report.runtime_error['dist']}: mean JCT (makespan) under it vs the oracle's")
        for name, gap in report.runtime_error["gap"].items():
            lines.append(f"  {name}: {_fmt(gap['jct_mean_s'], '{:.1f}')} s vs "
                         f"{_fmt(gap['oracle_jct_mean_s'], '{:.1f}')} s "
                         f"(x{_fmt(gap['jct_mean_s_ratio'], '{:.3f}')}); makespan "
                         f"x{_fmt(gap['makespan_s_ratio'], '{:.3f}')}")
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def json_document(report: Report) -> dict[str, Any]:
    """The ``--json`` document: ``{"policies": {NAME: {...}}}`` with the issue's keys first, extras after."""
    doc = report.to_json()
    doc["policies"] = {
        name: {**{k: m.get(k) for k in JSON_KEYS}, **{k: v for k, v in m.items() if k not in JSON_KEYS}}
        for name, m in report.policies.items()
    }
    return doc


def write_json(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_document(report), indent=2, sort_keys=False) + "\n")


def write_plots(report: Report, directory: Path) -> list[Path]:
    """JCT CDF, utilisation over time and memory per group against capacity, one PNG each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, res in report.results.items():
        jcts = sorted(o.jct for o in res.outcomes if o.jct is not None)
        if jcts:
            ys = [(i + 1) / len(res.outcomes) for i in range(len(jcts))]
            ax.step(jcts, ys, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs completed")
    ax.set_title(f"JCT CDF: {report.workload} on {report.cluster}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path = directory / "jct_cdf.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    # one panel per policy, each on its own time axis: a policy that pages for hours (greedy MPS) would otherwise
    # squeeze every other policy's minutes into a sliver at the left of a shared axis
    names = [name for name, res in report.results.items() if res.timeline] or list(report.results)[:1]
    fig, axes = plt.subplots(max(len(names), 1), 1, figsize=(7, max(1.6 * len(names), 3)), squeeze=False,
                             sharey=True)
    for ax, name in zip(axes[:, 0], names, strict=True):
        tl = _decimate(report.results[name].timeline, 1500)
        ts = [p[0] / 60 for p in tl]
        ax.step(ts, [p[1] for p in tl], where="post", lw=1, label="GPU memory in use")
        ax.step(ts, [p[2] for p in tl], where="post", lw=1, label="modelled SM busy")
        ax.set_ylabel(name, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0, 0].set_title(f"Utilisation over time (fraction of the cluster): {report.workload}")
    axes[0, 0].legend(fontsize=6, loc="upper right")
    axes[-1, 0].set_xlabel("time (min)")
    path = directory / "utilisation.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    names = list(report.results)
    fig, axes = plt.subplots(len(names), 1, figsize=(7, max(2.2 * len(names), 3)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        groups = report.results[name].groups[:400]
        if groups:
            xs = list(range(len(groups)))
            ax.bar(xs, [g.used / 2**30 for g in groups], width=1.0, label="real peak of the group (GiB)")
            if any(g.committed for g in groups):
                ax.plot(xs, [g.committed / 2**30 for g in groups], "k.", ms=2, label="admitted bytes (GiB)")
            ax.plot(xs, [g.capacity / 2**30 for g in groups], "r-", lw=1, label="GPU capacity")
        ax.set_ylabel(name, fontsize=7)
        ax.grid(alpha=0.3)
    axes[0, 0].set_title("Memory of each admission group against GPU capacity")
    axes[0, 0].legend(fontsize=6, loc="upper right")
    axes[-1, 0].set_xlabel("admission (in order)")
    path = directory / "group_memory.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def _decimate(points: list, limit: int) -> list:
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit)] + [points[-1]]

"""Tables and the plot of :mod:`benchmarks.control_plane`'s results, from its ``--json`` files:
``python -m benchmarks.control_report RESULTS.json... [--real REAL.json] [--capacity N] [--plot PNG]``
prints, per scenario, the requests, keys and bytes per rank at each N (8 ranks a host), the rate
per rank per second of the waiting scenarios, when every rank knew, and the load on the store."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks.control_plane import NEWS, PER_HOST, SCENARIOS, Result

__all__ = ["load", "load_table", "main", "plot", "scenario_table"]


def load(paths: Sequence[str]) -> tuple[list[Result], list[dict[str, Any]]]:
    """The results and the news measurements (``{"news": ...}`` lines) in JSON-lines files."""
    fields = {f.name for f in dataclasses.fields(Result)}
    results, news = [], []
    for path in paths:
        with open(path) as lines:
            for line in lines:
                found = json.loads(line)
                if "scenario" not in found:  # a news measurement
                    news.append(found["news"])
                else:
                    results.append(Result(**{k: v for k, v in found.items() if k in fields}))
    return results, news


def _cell(r: Result) -> str:
    rate = f" ({r.rate:.2f}/s)" if r.seconds else ""
    return f"{r.per_rank:.2f} / {r.keys_per_rank:.1f} / {r.bytes_per_rank:,.0f}{rate}"


def scenario_table(results: Sequence[Result], real: Sequence[Result] = (), per_host: int = PER_HOST) -> str:
    """Requests / keys / bytes per rank (rate) per scenario and N, ``per_host`` ranks a host, then
    when every rank knew: on the simulation's schedule, and (``real``) against a real store."""
    mine = [r for r in results if r.per_host == per_host]
    sizes = sorted({r.ranks for r in mine})
    by = {(r.scenario, r.ranks): r for r in mine}
    timed = {(r.scenario, r.ranks): r for r in real if r.per_host == per_host}
    head = "| scenario | " + " | ".join(f"N = {n:,}" for n in sizes) + " |"
    lines = [head, "|---" * (len(sizes) + 1) + "|"]
    for scenario in SCENARIOS:
        cells = [_cell(by[scenario, n]) if (scenario, n) in by else "not played" for n in sizes]
        if any(cell != "not played" for cell in cells):
            lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    lines += ["", "| every rank knew after (s) | " + " | ".join(f"N = {n:,}" for n in sizes) + " |"]
    lines.append("|---" * (len(sizes) + 1) + "|")
    for scenario in NEWS:
        cells = []
        for n in sizes:
            r, t = by.get((scenario, n)), timed.get((scenario, n))
            schedule = "" if r is None or r.knew_after is None else f"{r.knew_after:.2f}"
            measured = "" if t is None or t.knows_within is None else f"; {t.knows_within:.2f} measured"
            cells.append(schedule + measured)
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _spread(values: Sequence[float], unit: str = "", digits: int = 2) -> str:
    """``value`` for one measurement, ``low to high`` for several."""
    low, high = min(values), max(values)
    if len(values) == 1:
        return f"{low:,.{digits}f}{unit}"
    return f"{low:,.{digits}f} to {high:,.{digits}f}{unit}"


def load_table(results: Sequence[Result], news: Sequence[dict[str, Any]], capacity: float | None) -> str:
    """The requests a second the whole job puts on its one store: waiting idle (every rank's rate
    in the idle wait), and while a failure's news spreads (the idle rate, plus its requests over
    the time every rank took to know, as scheduled); the hosts' reads measured against a real
    store (each measurement's spread); what one store served here."""
    lines = [
        "| N (8 a host) | idle | during a failure | runs | hosts' reads asked / made, per second "
        "| news read by every host | by half the hosts |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(r.scenario, r.ranks): r for r in results if r.per_host == PER_HOST}
    sizes = {r.ranks for r in results if r.per_host == PER_HOST} | {n["ranks"] for n in news}
    for n in sorted(sizes):
        idle, failure = by.get(("idle wait", n)), by.get(("failure", n))
        idle_rate = idle.rate * n if idle is not None else None
        spread = failure.requests / failure.knew_after if failure is not None and failure.knew_after else None
        during = (idle_rate or 0.0) + spread if spread is not None else None
        found = [m for m in news if m["per_host"] == PER_HOST and m["ranks"] == n]
        runs = str(len(found)) if found else ""
        reads = f"{found[0]['wanted']:,.0f} / {_spread([m['served'] for m in found], digits=0)}" if found else ""
        knew = _spread([m["knew"] for m in found], " s") if found else ""
        half = _spread([m["median"] for m in found], " s") if found else ""
        idle_text = f"{idle_rate:,.0f}" if idle_rate is not None else ""
        during_text = f"{during:,.0f}" if during is not None else ""
        lines.append(f"| {n:,} | {idle_text} | {during_text} | {runs} | {reads} | {knew} | {half} |")
    if capacity is not None:
        lines.append(f"\nOne TCPStore served {capacity:,.0f} requests/s here.")
    return "\n".join(lines)


def plot(results: Sequence[Result], path: str, capacity: float | None = None) -> None:
    """Requests per rank against N per scenario (8 ranks a host), and the store's load while idle
    against what one ``TCPStore`` served (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in results if r.per_host == PER_HOST and r.served is None]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for scenario in SCENARIOS:
        points = sorted((r.ranks, r.per_rank) for r in mine if r.scenario == scenario)
        if points:
            left.plot(*zip(*points, strict=True), marker="o", label=scenario)
    left.set(xscale="log", yscale="log", xlabel="ranks (8 a host)", ylabel="store requests per rank")
    left.set_title("Requests per rank, per scenario")
    left.legend(fontsize="x-small", ncol=2)
    idle = sorted((r.ranks, r.rate * r.ranks) for r in mine if r.scenario == "idle wait")
    if idle:
        right.plot(*zip(*idle, strict=True), marker="o", label="the job waiting idle")
    if capacity is not None:
        right.axhline(capacity, linestyle=":", color="grey", label="what one TCPStore served here")
    right.set(xscale="log", yscale="log", xlabel="ranks (8 a host)", ylabel="store requests per second")
    right.set_title("The store's load")
    right.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.control_report", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", help="--json files of counted runs")
    parser.add_argument("--real", nargs="*", default=[], help="--json files of --real-store runs")
    parser.add_argument("--capacity", type=float, help="requests a second one TCPStore served (--store-capacity)")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args(argv)
    results, _ = load(args.results)
    real, news = load(args.real)
    for per_host in sorted({r.per_host for r in results}):
        print(f"{per_host} a host: requests / keys / bytes per rank (rate per rank per second)\n")
        print(scenario_table(results, real, per_host) + "\n")
    print(load_table(results, news, args.capacity))
    if args.plot:
        plot(results, args.plot, args.capacity)
    return 0


if __name__ == "__main__":
    sys.exit(main())

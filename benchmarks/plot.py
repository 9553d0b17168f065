"""The performance page's plot: every headline claim's ratio with its interval, one row per comparison.

``python -m benchmarks.plot docs/performance-claims.json docs/images/performance-at-a-glance.png``
draws it from the claims file (:mod:`.verify`), so the plot and the page's table show the same run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.verify import Claim, against, load_claims

__all__ = ["main", "plot"]

MARKERS = ("o", "s", "^", "D")


def plot(claims: Sequence[Claim], path: Path | str) -> None:
    """Horizontal intervals on a log axis, the peer's time over ours; one colour per world size."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the plot goes to a file
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys((claim.what, claim.peer, claim.op) for claim in claims))
    sizes = sorted({claim.world_size for claim in claims})
    figure, axes = plt.subplots(figsize=(11, 0.3 * len(rows) + 1.6))
    for index, size in enumerate(sizes):
        # Each world size a little apart, so that overlapping intervals stay readable.
        offset = (index - (len(sizes) - 1) / 2) * 0.25
        mine = [(rows.index((c.what, c.peer, c.op)), c) for c in claims if c.world_size == size]
        axes.errorbar(
            [c.median for _, c in mine],
            [row + offset for row, _ in mine],
            xerr=[[c.median - c.low for _, c in mine], [c.high - c.median for _, c in mine]],
            fmt=MARKERS[index % len(MARKERS)],
            capsize=2,
            label=f"world {size}",
        )
    axes.axvline(1.0, color="grey", linestyle=":")
    axes.set_xscale("log")
    ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50) if axes.get_xlim()[0] <= t <= axes.get_xlim()[1]]
    axes.set_xticks(ticks, [f"{t:g}" for t in ticks])
    axes.set_yticks(range(len(rows)), [f"{what} vs {against(op, peer)}" for what, peer, op in rows], fontsize=8)
    axes.invert_yaxis()  # the table's order, top to bottom
    axes.set_xlabel("the peer's time / ours (log scale): right of 1, communicator is faster")
    axes.legend(fontsize="small", loc="lower right")
    machine = claims[0].machine
    load = [seen for claim in claims for seen in claim.machine["load"]]  # over every run of the claims
    axes.set_title(
        f"{machine['cores']}-core {machine['machine']}, load average {min(load):.1f}-{max(load):.1f}, gloo on one"
        " machine\nmedian of per-round ratios, 90 % interval",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m benchmarks.plot CLAIMS.json OUT.png", file=sys.stderr)
        return 2
    plot(load_claims(args[0]), args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())

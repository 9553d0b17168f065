"""Profile training steps on 2 local ranks and draw rank 0's trace as a timeline.

Writes ``trace.rank0.json`` (torch's Chrome-format trace: open it in Perfetto or
``chrome://tracing``) and ``trace.rank0.html``, a self-contained page drawing the last step's
ranges as nested bars, the communicator's in colour. The image on the "Observing a job" page is
this page, rendered by headless Chromium::

    python docs/examples/profile_step.py
    chromium --headless --window-size=1400,300 --screenshot=trace.png trace.rank0.html
"""

from __future__ import annotations

import html
import json
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from communicator import Communicator, launch

STEPS = 3
WIDTH, ROW, TOP = 1360, 26, 40


def train(comm: Communicator) -> str:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(STEPS):
            with torch.profiler.record_function(f"step {step}"):
                loss = model(torch.randn(256, 512)).square().mean()
                model.zero_grad()
                loss.backward()
                for parameter in model.parameters():
                    comm.all_reduce(parameter.grad, op="mean")
                comm.all_gather_object({"step": step, "loss": loss.item()})
    path = f"trace.rank{comm.rank}.json"
    prof.export_chrome_trace(path)
    return path


def last_step(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The complete ("X") events of the main thread inside the last step's range."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    step = max((e for e in spans if e["name"] == f"step {STEPS - 1}"), key=lambda e: e["ts"])
    start, end = step["ts"], step["ts"] + step["dur"]
    return [e for e in spans if e["tid"] == step["tid"] and start <= e["ts"] and e["ts"] + e["dur"] <= end]


def timeline(events: list[dict[str, Any]]) -> str:
    """An HTML page drawing ``events`` as nested bars (depth by containment), time left to right."""
    events = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    start = events[0]["ts"]
    scale = WIDTH / max(e["ts"] + e["dur"] - start for e in events)
    open_ends: list[float] = []
    bars, deepest = [], 0
    for event in events:
        while open_ends and open_ends[-1] <= event["ts"]:
            open_ends.pop()
        depth = len(open_ends)
        deepest = max(deepest, depth)
        open_ends.append(event["ts"] + event["dur"])
        x, width = (event["ts"] - start) * scale, max(event["dur"] * scale, 1.0)
        ours = event["name"].startswith("communicator.")
        colour = "#e4572e" if ours else ("#4c78a8" if event["name"].startswith("step") else "#b8c4d6")
        label = html.escape(event["name"]) if width > 6.2 * len(event["name"]) else ""
        bars.append(
            f"<g><title>{html.escape(event['name'])}: {event['dur']:.0f} us</title>"
            f'<rect x="{x:.1f}" y="{TOP + depth * ROW}" width="{width:.1f}" height="{ROW - 3}" fill="{colour}"/>'
            f'<text x="{x + 3:.1f}" y="{TOP + depth * ROW + 17}">{label}</text></g>'
        )
    height = TOP + (deepest + 1) * ROW
    total_ms = max(e["ts"] + e["dur"] - start for e in events) / 1000
    return (
        "<!doctype html><meta charset='utf-8'><title>rank 0, one training step</title>"
        "<style>body{margin:20px;font:13px sans-serif}text{font-size:12px;fill:#111}</style>"
        f"<svg width='{WIDTH}' height='{height}'>"
        f"<text x='0' y='20' style='font-size:15px'>rank 0, the last of {STEPS} steps ({total_ms:.1f} ms): "
        "communicator ranges in red</text>" + "".join(bars) + "</svg>"
    )


def main() -> None:
    paths = launch(train, 2)
    with open(paths[0]) as trace:
        events = json.load(trace)["traceEvents"]
    names = {e["name"] for e in events if str(e.get("name", "")).startswith("communicator.")}
    assert {"communicator.all_reduce", "communicator.all_gather_object"} <= names, names
    assert "communicator.all_reduce float32[1024, 512]" in names, names
    with open("trace.rank0.html", "w") as page:
        page.write(timeline(last_step(events)))
    print(f"wrote {paths[0]} and trace.rank0.html; communicator ranges: {sorted(names)}")


if __name__ == "__main__":
    main()

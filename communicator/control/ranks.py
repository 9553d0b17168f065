"""Lists of ranks as records carry them: spans (``"0-5,7,9-1023"``), so that a record naming
most of a 10,000-rank job stays a few bytes, and every rank that reads it stays O(1)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

__all__ = ["Spans", "listed", "spans_text", "spans_within"]


def spans_text(ranks: Iterable[int]) -> str:
    """Ranks (ascending) as spans: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts = []
    for _, run in itertools.groupby(enumerate(ranks), key=lambda pair: pair[1] - pair[0]):
        members = [rank for _, rank in run]
        parts.append(str(members[0]) if len(members) == 1 else f"{members[0]}-{members[-1]}")
    return ",".join(parts)


def listed(text: str, size: int, separator: str = ",") -> set[int]:
    """The ranks of a list the members append to (``"3,0,2,"``; an entry may go on after a colon:
    ``"3:1;"``), those in ``range(size)`` only: an entry that is not one is skipped."""
    found = set()
    for entry in text.split(separator):
        rank = entry.partition(":")[0]
        if rank.isdigit() and len(rank) < 10 and int(rank) < size:
            found.add(int(rank))
    return found


def spans_within(text: str, size: int) -> Spans:
    """The ranks of a spans text read from the store, those in ``range(size)`` only, without
    listing them: a part that is not a span is skipped, spans that overlap or come out of order
    are merged."""
    runs = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        last = last or first
        if first.isdigit() and last.isdigit() and len(first) < 10 and len(last) < 10:
            start, stop = int(first), min(int(last), size - 1) + 1
            if start < stop:
                runs.append([start, stop])
    merged: list[list[int]] = []
    for start, stop in sorted(runs):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return Spans(",".join(f"{start}-{stop - 1}" for start, stop in merged))


class Spans(Sequence[int]):
    """The ranks of a spans text, as a sequence that is never expanded unless asked to."""

    def __init__(self, text: str) -> None:
        self._spans: list[range] = []  # runs of consecutive ranks, each as long as it can be
        for part in filter(None, text.split(",")):
            first, _, last = part.partition("-")
            span = range(int(first), int(last or first) + 1)
            if self._spans and span and self._spans[-1].stop == span.start:
                self._spans[-1] = range(self._spans[-1].start, span.stop)
            elif span:
                self._spans.append(span)
        self._length = sum(len(span) for span in self._spans)

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self._spans)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            if step == 1:
                return list(itertools.islice(self, start, stop))
            return [self[i] for i in range(start, stop, step)]
        if index < 0:
            index += self._length
        for span in self._spans:
            if index < len(span):
                return span[index]
            index -= len(span)
        raise IndexError("rank index out of range")

    def __contains__(self, rank: object) -> bool:
        return any(rank in span for span in self._spans)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Spans):  # the same ranks in the same order: the same runs (O(spans))
            return self._spans == other._spans
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"[{spans_text(self)}]"

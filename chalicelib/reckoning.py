"""Dead reckoning: a ticket holder's turn while Redis cannot be asked (docs/guarantees.md#fail-open).

Every poll Redis answers tells this container where the target's line stood: the admitted mark, the users a tick
the pump admits (the batch, or the measured rate when lower), whether the line is paused, and how many users were
ahead of the polling user's seq. With Redis unreachable, a ticket holder's poll is answered from that. Since the
container last heard, the pump can have admitted at most `per_tick` users a tick, so a user is admitted once enough
ticks have passed for everyone the container knows to be ahead of them, and never sooner; until then they are told
how far they stand and when to poll again.

Nobody is let in early. Users ahead of a seq only ever leave or get admitted (newcomers queue behind), so a count
seen at some moment bounds the count at every later one; a user is ahead of everyone with a larger seq, so a count
seen for anyone behind them bounds theirs too. A ticket whose place the container cannot bound (no poll of that
line seen, nobody behind them seen, a place an opening draw dealt and has not settled) is not reckoned: its holder
polls again, and waits for Redis.

When Redis answers again, the container moves the line's admitted mark up to the highest seq it admitted
(`QueueStore.raise_mark`): everyone ahead of it was due by the same reckoning, so the line goes on in order and
the pump does not spend slots on users already let in. Until Redis's mark has passed that seq, the container
admits anyone ahead of it whom Redis still finds waiting: nobody is told to wait behind someone it let in.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from chalicelib.answers import Waiting
from chalicelib.targets import Target

MAX_LINES = 256  # targets remembered per container (the least recently polled is forgotten)
MAX_SIGHTINGS = 4096  # (seq, ahead) counts remembered per target (the oldest is forgotten)


@dataclass(frozen=True)
class Turn:
    """A ticket holder's standing by dead reckoning: `admitted`, or at most `ahead` users ahead of them and their
    turn `due_s` from now (None: not while the line is paused)."""

    admitted: bool
    ahead: int = 0
    due_s: float | None = None
    paused: bool = False


@dataclass
class _Line:
    seen_at: float  # when a poll of this line last reached Redis (this container's clock, s)
    mark: int
    per_tick: float
    tick_ms: int
    paused: bool
    drawn: int  # numbers up to this were dealt anew by the opening draw: a ticket up to it does not tell its place
    ahead_of: OrderedDict[int, int] = field(default_factory=OrderedDict)  # seq -> users seen ahead of it
    reckoned: int | None = None  # the highest seq admitted by reckoning here, until Redis's mark passes it
    owed: bool = False  # ...and not yet written back


class Reckoner:
    """What this container saw of each line, and the turns it reckons from that. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: OrderedDict[Target, _Line] = OrderedDict()

    def saw(self, target: Target, place: Waiting, now: float) -> int | None:
        """A poll of `target`'s line reached Redis at `now` and found its user `place`. Answers the seq the line's
        mark is owed by admissions reckoned here meanwhile, if any (taken: give it back with `admitted` should it
        not be written). A mark that stepped back (Redis lost writes, or restarted empty) voids what was seen and
        what is owed: the numbers may no longer mean the same places."""
        if place.mark is None or place.tick_ms <= 0:
            return None
        # The measured rate is what the pump achieved lately (held back by maxActive or the shop's health): the
        # lower of the two is the most it would admit.
        per_tick = min(float(place.batch), place.rate * place.tick_ms / 1000)
        with self._lock:
            line = self._lines.pop(target, None)
            if line is None or line.drawn != place.drawn or place.mark < line.mark:
                line = _Line(now, place.mark, per_tick, place.tick_ms, place.paused, place.drawn)
            else:
                line.seen_at, line.mark, line.per_tick = now, place.mark, per_tick
                line.tick_ms, line.paused = place.tick_ms, place.paused
            if line.reckoned is not None and line.reckoned <= place.mark:
                line.reckoned, line.owed = None, False  # Redis's mark has passed them: nothing is owed
            owed, line.owed = (line.reckoned if line.owed else None), False
            self._lines[target] = line
            if len(self._lines) > MAX_LINES:
                self._lines.popitem(last=False)
            if place.drawn >= 0 and place.seq > place.drawn:
                line.ahead_of.pop(place.seq, None)
                line.ahead_of[place.seq] = place.ahead
                if len(line.ahead_of) > MAX_SIGHTINGS:
                    line.ahead_of.popitem(last=False)
        return owed

    def saw_admitted(self, target: Target, entry: int) -> None:
        """A poll Redis answered found the user of line seq `entry` admitted: the mark has passed it."""
        with self._lock:
            line = self._lines.get(target)
            if line is not None and entry > line.mark:
                line.mark = entry

    def admitted(self, target: Target, seq: int) -> None:
        """The ticket numbered `seq` was admitted by reckoning: the mark owes it, unless its place is one an opening
        draw dealt (its ticket does not tell where it stands) or the mark passed it already."""
        with self._lock:
            line = self._lines.get(target)
            if line is not None and seq > max(line.drawn, line.mark):
                line.reckoned, line.owed = max(seq, line.reckoned or 0), True

    def reckoned_in(self, target: Target, seq: int) -> bool:
        """Whether this container admitted someone behind seq `seq` (a line seq, not one the draw dealt) by
        reckoning, and Redis's mark has not yet passed them: the user at `seq` is due too."""
        with self._lock:
            line = self._lines.get(target)
            return line is not None and line.reckoned is not None and line.drawn < seq <= line.reckoned

    def near_turn(self, target: Target, seq: int, now: float) -> bool:
        """Whether the ticket numbered `seq` may be admitted by now or within a tick, as far as this container saw
        the line: the mark passed it, or the users it last saw ahead of it are within what the ticks since can
        admit, and one tick more. False when it cannot tell. A poll that may not be admitted passes no grant to draw
        (chalicelib/queue.py), and asks this on every poll: constant time, unlike `turn`."""
        with self._lock:
            line = self._lines.get(target)
            if line is None or line.paused:
                return False
            if seq <= line.mark:
                return True
            ahead = line.ahead_of.get(seq)
            if ahead is None:
                return False
            ticks = max(0, math.floor((now - line.seen_at) * 1000 / line.tick_ms))
            return ahead < line.per_tick * (ticks + 1)

    def forget(self, target: Target) -> None:
        """The line is gone (sold out): nothing about it can be reckoned any more."""
        with self._lock:
            self._lines.pop(target, None)

    def turn(self, target: Target, seq: int, now: float) -> Turn | None:
        """The standing of the ticket numbered `seq` at `now`, or None if this container cannot bound it."""
        with self._lock:
            line = self._lines.get(target)
            if line is None or line.drawn < 0:
                return None
            if seq <= line.mark and (seq > line.drawn or line.mark >= line.drawn):
                return Turn(admitted=True)  # the pump admitted them already
            if line.reckoned is not None and line.drawn < seq <= line.reckoned:
                return Turn(admitted=True)  # someone behind them was let in here
            # Users ahead of this seq: seen for itself, or one fewer than seen for anyone behind it.
            bounds = [ahead - (seen > seq) for seen, ahead in line.ahead_of.items() if seen >= seq]
            seen_at, per_tick, tick_ms, paused = line.seen_at, line.per_tick, line.tick_ms, line.paused
        if not bounds:
            return None
        ahead = max(0, min(bounds))
        if paused or per_tick <= 0:
            return Turn(admitted=False, ahead=ahead, paused=paused)
        ticks = max(0, math.floor((now - seen_at) * 1000 / tick_ms))
        admitted_since = math.floor(per_tick * ticks)
        if admitted_since > ahead:
            return Turn(admitted=True)
        # Their turn: the first tick by whose end `ahead + 1` users can have been admitted.
        due_at = seen_at + math.ceil((ahead + 1) / per_tick) * tick_ms / 1000
        return Turn(admitted=False, ahead=ahead - admitted_since, due_s=max(0.0, due_at - now))

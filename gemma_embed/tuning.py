"""Batch sizes that measure fastest on this machine, decided from repeated timings so that noise cannot decide.

A stage's batches are sized in work: the units' padded length summed over a batch (tokens for text, patches for
images, mel frames for audio). One search per stage: a batch of 20-token texts and one of 400-token texts at the
same work cost about the same GEMMs, so a work size found on one length serves the others (rows = work // length,
at least 1, at most what the memory plan admits for that length). The old search ran per length class from chunk 1
and never settled on a stream of short texts (`"8-15": {"1": 376, "2": 1368}`).

Noise: on a shared machine one chunk's time moves by more than the differences a tuner decides on (issue 22
measured 6,122 / 3,383 / 4,486 rows/s for chunks of 1 / 2 / 4, and settled on 1). So:
- the search starts at a size that is fast on its own (the memory plan's size on an accelerator; `CPU_START` on a
  CPU, clipped to the memory plan) and moves one doubling or halving at a time;
- a move is a comparison: chunks alternate between the size in use and the challenger in an A B B A order (a slow
  drift of the machine's load, or of the sorted lengths, cancels), every pair gives the ratio of the two rates,
  and the challenger is taken only when the pairs' mean log ratio beats `GAIN` by more than `Z` times its
  standard error (the measured spread, never taken below `MIN_SPREAD`); after `MAX_PAIRS` pairs without that
  margin the size in use stays. One slow sample never moves it;
- every chunk keeps adding to the rates reported (`report()` says what was chosen and why, in numbers a user can
  check).
A comparison also ends without timings where the challenger cannot change the run: units share a batch only with
units of their length, so a batch that held the rest of its group, with that under both sizes, or one the memory
plan cut below both, is the same batch at either size (`BatchCut`). Once `DEDUCE_AFTER` batches of the comparison
have run, if the work in batches the challenger could change is too small a share for it to win by `GAIN` even at
twice the rate (`STEP_GAIN_BOUND`), the size in use is kept: 600 mixed lines made 41 of 42 batches whole groups of
about 1,100 tokens, and 16384 against 8192 waited for pairs that never came. Such a decision is the input's, not the
machine's: it is kept across runs like the others, and the batches keep being counted against it; once they show the
same share could win after all (longer texts, say), the comparison is open again. Deducing costs nothing: every
batch it counts runs at the size in use.
The run's first chunk pays one-off costs (allocator, thread pools, kernels) and is never counted. Pure bookkeeping:
timings come from the caller.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

GAIN = 1.05  # a challenger must be at least this much faster to be taken
Z = 2.5  # ... by this many standard errors of the pairs' mean log ratio
Z_DROP = 2.0  # a challenger is dropped on less: a wrong drop loses a possible gain, a wrong move loses speed
SMALL_SAMPLE = 8.0  # ... plus this / (pairs - 1): a spread from few pairs is itself uncertain (as Student's t)
MIN_SPREAD = 0.15  # a floor on the standard deviation of one pair's log ratio: a few pairs that agree prove little
MIN_PAIRS = 3  # pairs before a comparison may end
MAX_PAIRS = 64  # pairs after which the mean ratio decides without the margin (its standard error is small by then)
# Work per batch a CPU search starts from. Measured on 2 shared cores (a hidden-512 x 8-layer text model, float32):
# a token of a 64-token batch took 4x the time of a token of a 4096-token batch, and in three runs of 600 mixed
# lines the tuner's batches of 8192 tokens ran 1.1-1.6x the tokens/s of its batches of 4096 while other work
# shared the cores (fewer, larger parallel regions wait less on a busy core).
CPU_START = 8192
DEDUCE_AFTER = 16  # batches of a comparison before its share of changeable work may end it
# A doubling at most doubles the rate: a batch of twice the work takes no less time than the smaller one. A halving
# is held to the same bound (a half batch running over twice the rate would be a cache cliff the pairs would show).
STEP_GAIN_BOUND = 2.0
# A size set aside is compared again once that bound reaches this: a margin above GAIN, so that a share of
# changeable work near the line does not set it aside and reopen it batch after batch (measured on 600 mixed lines:
# set aside after 16 batches at under 9.5% of the work, reopened a few batches later at just over it).
REOPEN_GAIN = GAIN**2
MOVES_KEPT = 8  # the decisions a kept state remembers, newest last
ORDER = (False, True, True, False)  # A B B A: whether the k-th chunk of a comparison runs the challenger


@dataclass(frozen=True)
class BatchCut:
    """How the engine cut a batch from its group: units of `length` (their padded length), at most `memory_rows`
    of them (the memory plan), `remaining` of the group still to run."""

    length: int
    memory_rows: int
    remaining: int

    def rows_at(self, size: int) -> int:
        """The units a batch cut for `size` would hold."""
        return min(self.memory_rows, max(1, size // max(1, self.length)), self.remaining)


def same_batch(cut: BatchCut | None, size: int, other: int) -> bool:
    """Whether a batch is the same at `size` and at `other`: both would cut it to the same units (the rest of its
    group fits under both, or the memory plan cuts it below both). None: not known, so not the same."""
    return cut is not None and cut.rows_at(size) == cut.rows_at(other)


def power_of_two_at_most(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


@dataclass
class Rates:
    """Every rate (work per second) measured at one size."""

    values: list[float] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(self.values) if self.values else 0.0


@dataclass
class Comparison:
    """The size in use against one challenger, chunk by chunk in A B B A order."""

    incumbent: int
    challenger: int
    step: int = 0
    pending: float | None = None  # the first rate of the pair under way
    log_ratios: list[float] = field(default_factory=list)  # log(challenger rate / incumbent rate), per pair
    # This run's batches while the comparison was under way, and those the same at either size (both would cut them
    # alike), with their work: whether the challenger could change enough of the run to win.
    batches: int = 0
    work: float = 0.0
    same_batches: int = 0
    same_work: float = 0.0
    decision: str = ""  # for a challenger set aside as running the same batches: why (`BatchTuner.same`)

    def next_size(self) -> int:
        return self.challenger if ORDER[self.step % len(ORDER)] else self.incumbent

    def add(self, size: int, rate: float) -> None:
        runs_challenger = size == self.challenger
        if self.pending is None:
            self.pending = rate if runs_challenger else -rate  # the sign remembers which side came first
        else:
            first = self.pending
            challenger, incumbent = (first, rate) if first > 0 else (rate, -first)
            self.log_ratios.append(math.log(challenger / incumbent))
            self.pending = None
        self.step += 1

    def verdict(self) -> bool | None:
        """True: the challenger is faster by the margin; False: it is not (or could not show it); None: measure on."""
        n = len(self.log_ratios)
        if n < MIN_PAIRS:
            return None
        mean = sum(self.log_ratios) / n
        variance = sum((x - mean) ** 2 for x in self.log_ratios) / (n - 1)
        spread = max(MIN_SPREAD, math.sqrt(variance))
        error = spread / math.sqrt(n)
        small = SMALL_SAMPLE / (n - 1)
        if mean - (Z + small) * error > math.log(GAIN):
            return True
        if mean + (Z_DROP + small) * error < math.log(GAIN):
            return False
        if n >= MAX_PAIRS:  # measured long enough: the estimate decides
            return mean > math.log(GAIN)
        return None

    def count(self, work: float, cut: BatchCut | None) -> None:
        """A batch of `work`, cut as `cut` says, ran while this comparison was under way."""
        self.batches += 1
        self.work += work
        if same_batch(cut, self.incumbent, self.challenger):
            self.same_batches += 1
            self.same_work += work

    def best_gain(self) -> float | None:
        """The most the challenger could speed the run up, taking the changeable batches' share of the work at
        `STEP_GAIN_BOUND` times the rate and the rest as it is; None before `DEDUCE_AFTER` batches."""
        if self.batches < DEDUCE_AFTER or self.work <= 0:
            return None
        changeable = 1.0 - self.same_work / self.work
        return 1.0 / (1.0 - changeable * (1.0 - 1.0 / STEP_GAIN_BOUND))


@dataclass
class BatchTuner:
    """The work per batch of one stage: `size(cap)` says what to run next, `record` what a batch measured."""

    start: int | None = None  # where the search begins; None: the memory plan's size
    unit: str = "units"  # what work counts ("tokens", "patches", "frames"), for the report
    current: int | None = None  # the size in use
    comparison: Comparison | None = None
    rejected: set[int] = field(default_factory=set)  # challengers that lost against the size in use
    # ... of which those set aside because they could not change the batches seen: each its comparison, with the
    # decision and the batches counted against it since (reopened when their share could win after all)
    same: dict[int, Comparison] = field(default_factory=dict)
    pairs_aside: dict[int, list[float]] = field(default_factory=dict)  # a reopened size's pairs, until compared
    ceiling: int | None = None  # an out-of-memory error: sizes from twice this up are never tried again
    capped: bool = False  # the last batch could not double: the memory plan's size is reached
    warmed_up: bool = False
    rates: dict[int, Rates] = field(default_factory=dict)
    moves: list[str] = field(default_factory=list)  # the comparisons decided, for the report
    stored: str | None = None  # where the state this run continued from was kept (`resume`), for the report
    batches: int = 0  # batches after the first
    unshaped: int = 0  # ... of which held under half their size: no size shaped them

    def size(self, cap: int) -> int:
        """The work to put in the next batch, never above `cap` (the work of the batch the memory plan admits)."""
        limit = max(1, int(cap))
        if self.ceiling is not None:
            limit = min(limit, self.ceiling)
        if self.current is None:
            self.current = power_of_two_at_most(min(self.start or limit, limit))
        self.capped = self.current * 2 > limit
        if self.comparison is None:  # the next comparison: a doubling first (if memory admits it), then a halving
            for candidate in (self.current * 2, self.current // 2):
                if 1 <= candidate <= limit and candidate not in self.rejected:
                    self.comparison = Comparison(self.current, candidate)
                    self.comparison.log_ratios = self.pairs_aside.pop(candidate, [])  # a reopened one's pairs
                    break
        wanted = self.comparison.next_size() if self.comparison is not None else self.current
        return min(wanted, limit)

    def record(self, size: int, work: float, seconds: float, full: bool = True, cut: BatchCut | None = None) -> None:
        """A batch run for `size` did `work` (real, not padding) in `seconds`. `full`: it was shaped by `size` (not a
        group's short last batch), so its rate speaks for that size. `cut`: how the engine cut it (None: not
        known), which tells the sizes at which it would have been the same batch."""
        if not self.warmed_up:  # the run's first batch pays one-off costs
            self.warmed_up = True
            return
        self.batches += 1
        if not full:
            self.unshaped += 1
        for size_aside, tally in list(self.same.items()):
            if work > 0:
                tally.count(work, cut)
            if (gain := tally.best_gain()) is not None and gain >= REOPEN_GAIN:  # it could win after all
                del self.same[size_aside]
                self.rejected.discard(size_aside)
                self.pairs_aside[size_aside] = tally.log_ratios  # compared again from the pairs it had
        comparison = self.comparison
        if comparison is not None and work > 0:
            comparison.count(work, cut)
        if seconds > 0 and work > 0 and full:
            rate = work / seconds
            self.rates.setdefault(size, Rates()).values.append(rate)
            if comparison is not None and size == comparison.next_size():
                # (another size: the A B B A order's side was cut by memory, and the pairs stay in order)
                comparison.add(size, rate)
                verdict = comparison.verdict()
                if verdict is not None:
                    self._decided(comparison, verdict)
                    return
        if comparison is not None and (gain := comparison.best_gain()) is not None and gain < GAIN:
            self._kept_as_the_same(comparison, gain)

    def _decided(self, comparison: Comparison, taken: bool) -> None:
        ratio = math.exp(statistics.fmean(comparison.log_ratios))
        pairs = len(comparison.log_ratios)
        if taken:
            self.moves.append(f"{comparison.challenger} over {comparison.incumbent}: {ratio:.2f}x over {pairs} pairs")
            self.current = comparison.challenger
            self.rejected = {comparison.incumbent}
            self.same.clear()
            self.pairs_aside.clear()
        else:
            self.moves.append(
                f"kept {comparison.incumbent} over {comparison.challenger}: {ratio:.2f}x over {pairs} pairs"
            )
            self.rejected.add(comparison.challenger)
        self.comparison = None

    def _kept_as_the_same(self, comparison: Comparison, gain: float) -> None:
        """The challenger could not change enough of the batches seen to win by `GAIN`: the size in use stays, and
        the challenger is set aside while the batches it would change stay few (`REOPEN_GAIN`)."""
        c = comparison
        share = c.same_work / c.work
        c.decision = (
            f"kept {c.incumbent} over {c.challenger} without timing them: {c.same_batches} of {c.batches} batches "
            f"({share:.0%} of the {self.unit}) were the same batches at either size (the rest of a group of one "
            f"length under {min(c.incumbent, c.challenger)} {self.unit}, or what the memory plan admits); the rest "
            f"could gain at most {gain:.2f}x"
        )
        self.rejected.add(c.challenger)
        self.same[c.challenger] = c  # counted on from here: the decision's own counts and pairs
        self.comparison = None

    def state(self) -> dict:
        """What a later run on the same machine and tower continues from (`resume`): the size in use, the sizes
        that lost against it, the comparison under way with its pairs, the decisions so far, the sizes set aside as
        running the same batches (with their decisions)."""
        comparison = None
        if self.comparison is not None:
            c = self.comparison
            comparison = {"incumbent": c.incumbent, "challenger": c.challenger, "log_ratios": list(c.log_ratios)}
        return {
            "current": self.current,
            "rejected": sorted(self.rejected - self.same.keys()),
            "comparison": comparison,
            "moves": self.moves[-MOVES_KEPT:],
            "same": {str(size): tally.decision for size, tally in self.same.items()},
            "same_pairs": {str(size): list(tally.log_ratios) for size, tally in self.same.items() if tally.log_ratios},
        }

    def progress(self) -> tuple:
        """Changes when a pair or a decision is added: whether the state is worth keeping again."""
        pairs = len(self.comparison.log_ratios) if self.comparison is not None else 0
        return self.current, len(self.moves), pairs, len(self.rejected), len(self.same)

    def resume(self, state: dict, where: str) -> bool:
        """Continue from a `state` a run before kept: its pairs count towards the comparison under way (each pair
        compares two neighbouring batches, so pairs from runs under other loads still compare like with like).
        False, and nothing changed, for a state that is not one."""
        try:
            current = int(state["current"])
            rejected = {int(size) for size in state.get("rejected") or ()}
            moves = [str(move) for move in state.get("moves") or ()]
            same = {int(size): str(why) for size, why in (state.get("same") or {}).items()}
            same_pairs = {
                int(size): [float(x) for x in pairs][:MAX_PAIRS]
                for size, pairs in (state.get("same_pairs") or {}).items()
            }
            found = state.get("comparison")
            comparison = None
            if found is not None:
                comparison = Comparison(int(found["incumbent"]), int(found["challenger"]))
                comparison.log_ratios = [float(x) for x in found["log_ratios"]][:MAX_PAIRS]
        except (KeyError, TypeError, ValueError, AttributeError):
            return False
        if current < 1 or current != power_of_two_at_most(current) or any(size < 1 for size in rejected):
            return False
        same = {size: why for size, why in same.items() if size in (2 * current, current // 2)}
        if comparison is not None and (
            comparison.incumbent != current
            or comparison.challenger not in (2 * current, current // 2)
            or not all(math.isfinite(x) for x in comparison.log_ratios)
        ):
            comparison = None
        if comparison is not None and comparison.challenger in same:
            comparison = None
        self.current, self.rejected, self.comparison, self.moves = current, rejected | same.keys(), comparison, moves
        self.same = {  # counted afresh on this run's input, with the pairs they had
            size: Comparison(current, size, log_ratios=[x for x in same_pairs.get(size, []) if math.isfinite(x)],
                             decision=why)
            for size, why in same.items()
        }  # fmt: skip
        pairs = f", {len(comparison.log_ratios)} pairs of {comparison.challenger} against it" if comparison else ""
        self.stored = f"continued from {current}{pairs}, kept for this machine and tower in {where}"
        return True

    def conditions_changed(self) -> None:
        """The machine changed under the comparison under way (the CPU forwards' thread count): a pair whose first
        batch ran before the change is dropped and the A B B A order starts again, so each pair still compares
        two neighbouring batches under one condition. Finished pairs stay, as pairs kept from runs under other
        loads do (`resume`): dropping them all at each change threw away the pairs earlier runs had kept (one
        kept pair, then "0 pairs so far" in the next run of 600 mixed lines) and, where the count follows a busy
        machine's load, kept a comparison from ever ending. Decided moves and rejected sizes stay."""
        if self.comparison is not None:
            self.comparison.pending = None
            self.comparison.step = 0

    def limit(self, work: int) -> None:
        """An out-of-memory error at a batch of `work`: nothing from there up is tried again."""
        self.ceiling = power_of_two_at_most(max(1, int(work) // 2))
        if self.current is not None and self.current > self.ceiling:
            self.current = self.ceiling
        self.comparison = None

    def report(self) -> dict:
        """What was chosen and why, in measured numbers: `{"chosen": 4096, "unit": "tokens a batch", "reason":
        "fastest measured (4096: 812 tokens/s over 6 batches; 8192: 700 tokens/s over 4)"}`."""
        unit = f"{self.unit} a batch"
        if self.current is None:
            return {"chosen": None, "unit": unit, "reason": "nothing run yet"}
        order = sorted(self.rates, key=lambda s: (s != self.current, s))
        measured = "; ".join(
            f"{s}: {self.rates[s].median():.0f} {self.unit}/s over {len(self.rates[s].values)} batches" for s in order
        )
        measured = measured or "no full batch measured after the first"
        if not self.rates and self.unshaped and self.comparison is not None:
            # Units share a batch only with units of their (padded) length, within one window: where each length's
            # group is smaller than half the sizes compared (600 mixed lines: about 20 lengths, 41 of 42 batches
            # about 1,100 tokens against 8192 and 16384), every batch is a whole group, the same at either size,
            # and no comparison can be measured: the share of work a size could change decides (`best_gain`).
            batches = f"{self.unshaped} {'batch' if self.unshaped == 1 else 'batches'} after the first"
            c = self.comparison
            reason = (
                f"no batch held half of {self.current} {self.unit} so far: each was a whole group of units of one "
                f"length ({batches}), the same at any larger size, so none was measured ({c.challenger} against "
                f"{c.incumbent}: after {DEDUCE_AFTER} batches, decided by the share of work it could change)"
            )
        elif self.comparison is not None:
            challenger = self.comparison.challenger
            reason = f"still exploring ({challenger} against {self.current}, {len(self.comparison.log_ratios)} pairs"
            reason += f" so far): {measured}"
            if self.unshaped:  # why so few: the groups of one length were smaller than the sizes compared
                reason += (
                    f"; {self.unshaped} of {self.batches} batches after the first held under half their size (a "
                    f"whole group of units of one length, or a group's last part) and measured no size"
                )
        elif self.capped:
            reason = f"capped by memory; no smaller size was faster by the margin: {measured}"
        elif self.same and not self.rates:
            others = " and ".join(str(size) for size in sorted(self.same))
            reason = f"the size in use: {others} would run the same batches on this input (decided): {measured}"
        else:
            reason = f"fastest measured: {measured}"
        report = {"chosen": self.current, "unit": unit, "reason": reason}
        if self.stored:
            report["stored"] = self.stored
        if self.moves or self.same:
            report["decided"] = [*self.moves, *(tally.decision for tally in self.same.values())]
        return report

"""EpochState and PlanSettings (daskfeed.batches._epoch) with a recording prefetcher: no cluster.

The cursor is handed ``new_prefetcher(plan, order, budget)``; here it makes a
:class:`FakePrefetcher` that records what the cursor asked of it, so the epoch rules (which
``on_epoch_end`` advances, which windows are done, when the next epoch is fetched ahead) are
checked by value.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daskfeed.batches._epoch import PEEKED, EpochState, PlanSettings
from daskfeed.batches._plan import EpochPlan, equal_shard_batches, make_plan
from daskfeed.core import SettingError


class FakePrefetcher:
    """What EpochState uses of a Prefetcher, recording each call."""

    def __init__(self, plan: EpochPlan, order: list[int], budget: int | None, *,
                 started_all: bool, room: int) -> None:
        self.plan, self.order = plan, list(order)
        self.budget = 1000 if budget is None else budget
        self.lent_budget = budget  # None: the sequence's own; an int: room lent to it
        self.started_all = started_all
        self.room = room  # what lend() gives
        self.submitted = 0
        self.wait_seconds = 0.0
        self.done: list[int] = []
        self.starts: list[int | None] = []
        self.grown: list[int] = []  # room added by grow()
        self.let_go: list[bool] = []  # each lend's let_go
        self.resets = self.loans = self.loans_ended = self.closes = 0

    def start(self, first: int | None = None, within_budget: bool = False) -> None:
        self.starts.append(first)

    def done_serving(self, w: int) -> None:
        self.done.append(w)

    def reset(self) -> None:
        self.resets += 1

    def lend(self, let_go: bool = False) -> int:
        self.loans += 1
        self.let_go.append(let_go)
        return self.room

    def grow(self, room: int) -> None:
        self.grown.append(room)

    def end_loan(self) -> None:
        self.loans_ended += 1

    def close(self) -> None:
        self.closes += 1


class Factory:
    """``new_prefetcher`` for the cursor: every prefetcher it made, in order."""

    def __init__(self, started_all: bool = False, room: int = 0) -> None:
        self.made: list[FakePrefetcher] = []
        self.started_all, self.room = started_all, room

    def __call__(self, plan: EpochPlan, order: list[int], budget: int | None) -> FakePrefetcher:
        pf = FakePrefetcher(plan, order, budget, started_all=self.started_all, room=self.room)
        self.made.append(pf)
        return pf


def settings_of(counts=(40, 40, 40), *, batch_size=10, shuffle=True, window_rows=40,
                drop_remainder=False, shard=(0, 1), seed=7) -> PlanSettings:
    return PlanSettings(counts=tuple(counts), batch_size=batch_size, seed=seed, shuffle=shuffle,
                        window_rows=window_rows, drop_remainder=drop_remainder, shard=shard)


def cursor_of(ps: PlanSettings | None = None, *, tolerance: int = 4,
              **factory) -> tuple[EpochState, Factory]:
    f = Factory(**factory)
    return EpochState(ps or settings_of(), f, tolerance=tolerance), f


def serve(cur: EpochState, indices) -> None:
    """Read batches ``indices`` as the sequence does: reserve, then mark served."""
    for i in indices:
        plan, _, j = cur.reserve(i)
        cur.served(plan, j, plan.batch(j))


# -- PlanSettings ---------------------------------------------------------------------------
def test_plan_settings_plan_is_make_plan_of_its_fields():
    ps = settings_of(counts=(13, 0, 25, 7, 40), batch_size=8, window_rows=20, seed=3)
    for epoch in (0, 1, 5):
        assert ps.plan(epoch) == make_plan([13, 0, 25, 7, 40], batch_size=8, epoch=epoch, seed=3,
                                           shuffle=True, window_rows=20)
    assert ps.plan(0) != ps.plan(1)  # shuffled: another block order each epoch
    assert settings_of(shuffle=False).plan(0).same_batches(settings_of(shuffle=False).plan(3))


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 60), min_size=1, max_size=12), batch_size=st.integers(1, 25),
       nshards=st.integers(2, 4), epoch=st.integers(0, 3))
def test_shards_serve_equal_full_batches_and_count_what_they_drop(counts, batch_size, nshards, epoch):
    equal = equal_shard_batches(counts, batch_size=batch_size, nshards=nshards)
    plans = [settings_of(counts=counts, batch_size=batch_size, shard=(i, nshards)).plan(epoch)
             for i in range(nshards)]
    assert {p.num_batches for p in plans} == {equal}
    assert all(p.rows == equal * batch_size for p in plans)
    # every row of the data is either served by its shard or counted as dropped there
    assert sum(p.rows + p.dropped for p in plans) == sum(counts)


def test_one_shard_is_not_cut_to_equal_batches():
    ps = settings_of(counts=(25, 5), batch_size=10)
    plan = ps.plan(0)
    assert (plan.num_batches, plan.rows, plan.dropped) == (3, 30, 0)  # last batch short, kept


# -- set -----------------------------------------------------------------------------------
def test_an_epoch_without_a_batch_is_refused_saying_rows_and_settings():
    cur, f = cursor_of(settings_of(counts=(0, 0), batch_size=10))
    with pytest.raises(SettingError) as err:
        cur.set(0)
    assert str(err.value) == ("Expected at least one batch. Received: 0 rows with batch_size=10, "
                              "drop_remainder=False.\nHint: lower batch_size or add data.")
    assert f.made == []


def test_an_epoch_emptied_by_drop_remainder_says_how_many_rows_the_data_holds():
    cur, _ = cursor_of(settings_of(counts=(4, 3), batch_size=10, drop_remainder=True))
    with pytest.raises(SettingError, match=r"Received: 7 rows with batch_size=10, drop_remainder=True\."):
        cur.set(0)


@pytest.mark.parametrize("start", [-1, 12, 50])
def test_a_start_outside_the_epoch_is_refused_naming_the_range(start):
    cur, f = cursor_of()  # 120 rows of 10: 12 batches
    with pytest.raises(ValueError, match=rf"Expected 0 <= start < 12 \(batches of epoch 2\)\. "
                                         rf"Received: start={start}\."):
        cur.set(2, start)
    assert f.made == []  # nothing was fetched for it


def test_set_makes_a_prefetcher_of_the_windows_still_to_serve():
    cur, f = cursor_of()  # windows of 40 rows (4 batches each): 3 windows
    cur.set(1, start=5)
    plan = cur.plan
    assert (cur.epoch, cur.start, plan.epoch) == (1, 5, 1)
    (pf,) = f.made
    # window 0 holds batches 0-3, wholly before start 5: not fetched
    assert pf.order == [w.index for w in plan.windows if max(plan.batches_of(w.index)) >= 5]
    assert pf.order == [1, 2] and pf.lent_budget is None
    old = pf
    cur.set(2)
    assert old.resets == 1 and len(f.made) == 2 and f.made[1].order == [0, 1, 2]


# -- reserve -------------------------------------------------------------------------------
def test_reserve_counts_from_the_start_and_from_the_end():
    cur, f = cursor_of()
    cur.set(0, start=9)  # batches 9, 10, 11 are left
    plan, pf, i = cur.reserve(0)
    assert (plan, pf, i) == (cur.plan, f.made[0], 9)
    assert cur.reserve(-1)[2] == 11 and cur.reserve(2)[2] == 11 and cur.reserve(-3)[2] == 9
    for bad in (3, -4):
        with pytest.raises(IndexError, match=rf"^Batch index {bad} out of range for 3 batches\.$"):
            cur.reserve(bad)


# -- the cursor rule: which on_epoch_end advances --------------------------------------------
def test_end_advances_only_once_every_batch_was_served():
    cur, _ = cursor_of()
    cur.set(0)
    cur.begin()
    serve(cur, range(11))
    assert cur.end() is False and cur.epoch == 0
    serve(cur, [11])
    assert cur.end() is True
    assert (cur.epoch, cur.start) == (1, 0)
    stats = cur.ended[0]
    assert (stats["epoch"], stats["rows"], stats["batches"], stats["start_batch"]) == (0, 120, 12, 0)
    assert cur.last_stats == stats


def test_batches_served_twice_count_once():
    cur, _ = cursor_of()
    cur.set(0)
    serve(cur, [0, 1, 0, 1, 1])
    assert cur.stats()["batches"] == 2 and cur.stats()["rows"] == 20


def test_a_long_epoch_complete_at_keras_first_on_epoch_end_ends_at_once():
    """More than PEEKED batches cannot all have been read by Keras' peek: no ambiguity."""
    cur, _ = cursor_of(settings_of(counts=(30,), window_rows=30))  # 3 batches
    cur.set(0)
    serve(cur, range(3))
    assert PEEKED == 2
    assert cur.end() is True and cur.epoch == 1


def short_epoch() -> tuple[EpochState, Factory]:
    """A cursor on epoch 0 of two batches (what Keras' TF backend peeks), both served."""
    cur, f = cursor_of(settings_of(counts=(20,), window_rows=20))
    cur.set(0)
    serve(cur, [0, 1])
    return cur, f


def test_a_short_epoch_read_by_keras_peek_is_not_ended_by_the_reset_on_epoch_end():
    cur, _ = short_epoch()
    assert cur.end() is False and cur.epoch == 0  # maybe Keras' reset after its peek
    cur.begin()  # Keras' on_epoch_begin: the peeked batches are trained now
    serve(cur, [0, 1])  # (the same batches again: already served)
    assert cur.end() is True and cur.epoch == 1
    assert cur.ended[0]["batches"] == 2 and list(cur.ended) == [0]


def test_a_short_epoch_ends_at_a_second_on_epoch_end_without_a_begin():
    cur, _ = short_epoch()
    assert cur.end() is False
    assert cur.end() is True and cur.epoch == 1


def test_a_short_epoch_ends_when_the_next_batch_is_asked_for():
    cur, f = short_epoch()
    assert cur.end() is False
    plan, pf, i = cur.reserve(0)  # the next epoch's first batch: the ambiguous end was real
    assert (cur.epoch, plan.epoch, i) == (1, 1, 0)
    assert list(cur.ended) == [0]
    # epoch 1 shuffles its rows otherwise: epoch 0's window is dropped, epoch 1's fetched
    assert pf is f.made[1] and f.made[0].resets == 1


def test_a_resumed_epoch_with_at_most_peeked_batches_left_is_ambiguous_too():
    cur, _ = cursor_of()  # 12 batches
    cur.set(0, start=10)
    serve(cur, [0, 1])  # batches 10 and 11
    assert cur.end() is False and cur.epoch == 0
    cur.begin()
    assert cur.end() is True and cur.epoch == 1
    assert cur.ended[0]["start_batch"] == 10 and cur.ended[0]["rows"] == 20


def test_a_begin_counts_for_the_next_on_epoch_end_only():
    cur, _ = cursor_of(settings_of(counts=(20,), window_rows=20))
    cur.set(0)
    cur.begin()
    serve(cur, [0])
    assert cur.end() is False  # incomplete: and the begin is used up
    serve(cur, [1])
    assert cur.end() is False and cur.epoch == 0  # no begin before it: ambiguous again
    cur.begin()
    assert cur.end() is True and cur.epoch == 1


def test_the_stats_of_only_the_last_eight_epochs_are_kept():
    cur, _ = cursor_of(settings_of(counts=(30,), window_rows=30))
    cur.set(0)
    for _ in range(11):
        serve(cur, range(3))
        assert cur.end() is True
    assert sorted(cur.ended) == list(range(3, 11)) and cur.epoch == 11


# -- finish / open_pass (feeds that know when a pass ends) ----------------------------------
def test_finish_ends_only_the_current_complete_plan():
    cur, _ = cursor_of(settings_of(counts=(30,), window_rows=30))
    cur.set(0)
    plan = cur.plan
    serve(cur, [0, 1])
    assert cur.finish(plan) is False  # one batch left
    serve(cur, [2])
    other = make_plan([30], batch_size=10, epoch=0, seed=7, window_rows=30)
    assert other == plan and cur.finish(other) is False  # an equal plan, not this pass's
    assert cur.finish(plan, advance=False) is True
    assert cur.epoch == 0 and cur.ended[0]["batches"] == 3  # figures kept, the epoch stays
    assert cur.finish(plan) is True and cur.epoch == 1


def test_open_pass_starts_the_epoch_afresh_unless_it_stands_there_unread():
    cur, f = cursor_of()
    cur.set(0)
    first = f.made[0]
    plan, pf = cur.open_pass(0, 0)
    assert (plan, pf) == (cur.plan, first) and len(f.made) == 1  # nothing served: untouched
    serve(cur, [0, 1, 2])
    plan2, pf2 = cur.open_pass(0, 0)  # a pass cut short: the same epoch again, windows kept
    assert plan2 == plan and pf2 is first and first.resets == 0 and len(f.made) == 1
    assert cur.stats()["batches"] == 0
    cur.open_pass(1, 4)
    assert (cur.epoch, cur.start) == (1, 4) and first.resets == 1 and len(f.made) == 2


# -- windows done, the next epoch fetched ahead ----------------------------------------------
def test_a_window_is_done_once_every_batch_taking_rows_from_it_was_served():
    cur, f = cursor_of()  # window w holds batches 4w .. 4w+3 (40 rows, batches of 10)
    cur.set(0)
    pf = f.made[0]
    serve(cur, [0, 1, 2])
    assert pf.done == []
    serve(cur, [3])
    assert pf.done == [0]
    serve(cur, [11, 10, 9, 8])
    assert pf.done == [0, 2]


def test_a_batch_of_an_old_plan_is_not_counted():
    cur, f = cursor_of()
    cur.set(0)
    old = cur.plan
    cur.set(1)
    cur.served(old, 0, old.batch(0))
    assert cur.stats()["batches"] == 0 and f.made[1].done == []


def test_windows_spanning_batches_are_done_after_their_last_batch():
    cur, f = cursor_of(settings_of(counts=(15, 15, 15), batch_size=10, window_rows=15, shuffle=False))
    cur.set(0)
    pf = f.made[0]
    plan = cur.plan
    assert [list(plan.batches_of(w.index)) for w in plan.windows] == [[0, 1], [1, 2], [3, 4]]
    serve(cur, [0])
    assert pf.done == []
    serve(cur, [1])
    assert pf.done == [0]  # batch 1 also takes rows from window 1: not done yet
    serve(cur, [2, 3])
    assert pf.done == [0, 1]  # batch 4 is window 2's too
    serve(cur, [4])
    assert pf.done == [0, 1, 2]


def test_the_next_epoch_is_fetched_ahead_in_lent_room_and_served_from_it():
    cur, f = cursor_of(started_all=True, room=300)
    cur.set(0)
    this, ahead = f.made
    assert this.loans == 1
    assert ahead.plan == cur.settings.plan(1) and ahead.lent_budget == 300
    assert ahead.order == [w.index for w in ahead.plan.windows]
    serve(cur, range(12))
    assert cur.end() is True
    assert cur.prefetcher is ahead and ahead.resets == 0  # its windows were on their way
    assert ahead.budget == this.budget  # the sequence's budget again
    assert ahead.starts == [ahead.order[0]] and this.resets == 1
    assert len(f.made) == 3 and f.made[2].plan.epoch == 2  # and the epoch after it, ahead


def test_the_loan_grows_as_the_epochs_windows_are_served():
    cur, f = cursor_of(started_all=True, room=100)  # each lend frees 100 bytes more
    cur.set(0)
    this, ahead = f.made
    serve(cur, range(5))
    assert this.loans == 6 and ahead.grown == [100] * 5  # the first lend made it; each batch after
    assert all(this.let_go)  # read in order: served windows are let go
    cur2, f2 = cursor_of(started_all=True, room=0)
    cur2.set(0)
    serve(cur2, range(3))
    assert len(f2.made) == 1 and f2.made[0].loans == 4  # nothing freed: asked again each batch


def test_nothing_is_fetched_ahead_without_room_or_before_every_window_started():
    cur, f = cursor_of(started_all=True, room=0)
    cur.set(0)
    assert len(f.made) == 1 and f.made[0].loans == 1
    cur2, f2 = cursor_of(started_all=False, room=300)
    cur2.set(0)
    serve(cur2, range(5))
    assert len(f2.made) == 1 and f2.made[0].loans == 0


def test_unshuffled_epochs_keep_their_windows_and_fetch_nothing_ahead():
    cur, f = cursor_of(settings_of(shuffle=False), started_all=True, room=300)
    cur.set(0)
    (pf,) = f.made  # the next epoch has the same batches: nothing to fetch ahead
    assert pf.loans == 0
    serve(cur, range(12))
    done_before = list(pf.done)
    assert cur.end() is True and cur.epoch == 1
    assert cur.prefetcher is pf and pf.resets == 0 and len(f.made) == 1
    # every window is evictable again (held, to be used again, not cancelled)
    assert pf.done[len(done_before):] == [w.index for w in cur.plan.windows]


def test_nothing_is_fetched_past_the_last_epoch():
    cur, f = cursor_of(started_all=True, room=300)
    cur.set_last_epoch(0)
    cur.set(0)
    assert len(f.made) == 1
    cur.set_last_epoch(None)  # not known any more: the next epoch may come
    assert len(f.made) == 2 and f.made[1].plan.epoch == 1


def test_setting_the_last_epoch_drops_what_was_fetched_past_it():
    cur, f = cursor_of(started_all=True, room=300)
    cur.set(0)
    this, ahead = f.made
    cur.set_last_epoch(0)
    assert ahead.resets == 1 and this.loans_ended == 1
    cur.set_last_epoch(1)  # again reachable: fetched ahead again
    assert len(f.made) == 3 and f.made[2].plan.epoch == 1
    cur.close()
    assert (this.closes, f.made[2].closes, ahead.closes) == (1, 1, 0)


# -- reading order -----------------------------------------------------------------------------
def test_random_order_warns_once_after_three_jumps_beyond_the_tolerance():
    cur, _ = cursor_of(tolerance=2)
    cur.set(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in (0, 1, 3, 5, 4, 2):  # jumps of at most 2: Keras' threads reading ahead
            cur.reserve(i)
        assert caught == []
        for i in (9, 1, 7):  # three jumps of more than 2
            cur.reserve(i)
        for i in (11, 2, 10, 0, 6):
            cur.reserve(i)
    assert len(caught) == 1
    assert "read in random batch order" in str(caught[0].message)
    assert "pass shuffle=False to model.fit()" in str(caught[0].message)
    assert caught[0].category is UserWarning


def test_jumps_back_to_batch_zero_are_not_random_order():
    cur, _ = cursor_of(tolerance=1)
    cur.set(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            for i in (0, 1, 2, 3):
                cur.reserve(i)
    assert caught == []

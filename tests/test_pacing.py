"""A replay's pace: each tick shows the step due by the wall clock, so late ticks catch up and
the last step comes on time; the charts redraw at most once a period while playing; a pause holds
where play got to."""

from __future__ import annotations

from dgemma.ui.generate_tab.playback import PlayClock, Playback
from fake_clock import Clock


def test_ticks_on_time_show_one_step_each():
    clock = Clock()
    play = PlayClock(0, 0.25, clock)
    shown = []
    for k in range(1, 5):
        clock.now += 0.25
        shown.append(play.next_step(k - 1, 0.25))
    assert shown == [1, 2, 3, 4]


def test_a_late_tick_shows_the_step_due_nearest_to_now_skipping_the_missed_ones():
    clock = Clock()
    play = PlayClock(2, 0.25, clock)
    clock.now += 0.26
    assert play.next_step(2, 0.25) == 3
    clock.now += 0.74  # two ticks were lost on the way: step 6 is due now
    assert play.next_step(3, 0.25) == 6
    clock.now += 0.2  # step 7 is due in 0.05 s: nearer than step 6's time, already past
    assert play.next_step(6, 0.25) == 7


def test_an_early_tick_still_moves_one_step():
    clock = Clock()
    play = PlayClock(0, 1.0, clock)
    clock.now += 0.1
    assert play.next_step(0, 1.0) == 1


def test_a_new_pace_counts_from_the_step_shown_when_it_changed():
    clock = Clock()
    play = PlayClock(0, 1.0, clock)
    clock.now += 3.0
    assert play.next_step(2, 0.25) == 3  # the new pace starts here, at step 2
    clock.now += 0.5
    assert play.next_step(3, 0.25) == 4


def test_the_charts_redraw_at_most_once_a_period_and_always_at_the_last_step():
    clock = Clock()
    play = PlayClock(0, 0.25, clock)
    drawn = []
    for _ in range(8):
        clock.now += 0.25
        drawn.append(play.charts_due(1.0, last=False))
    assert drawn == [False, False, False, True, False, False, False, True]  # play drew them at its start
    clock.now += 0.25
    assert play.charts_due(1.0, last=True)


def test_the_wait_is_until_the_next_step_is_due_less_the_time_a_frame_takes_to_arrive():
    clock = Clock()
    play = PlayClock(4, 0.5, clock)
    assert play.wait(4, ahead=0.0) == 0.5 and abs(play.wait(4, ahead=0.1) - 0.4) < 1e-9
    assert abs(play.wait(4, ahead=0.4) - 0.25) < 1e-9  # never more than half a step early
    clock.now += 0.2
    assert abs(play.wait(4, ahead=0.0) - 0.3) < 1e-9 and play.wait(3) == 0.0  # never negative


def test_a_pause_holds_at_the_step_play_sent_last_when_the_page_still_shows_an_earlier_one():
    tab = Playback()
    tab.playing, tab.clock = True, PlayClock(0, 1.0, Clock())
    tab.clock.sent = 5  # step 5 is on its way to the page, whose slider still reads 4 as the user presses pause
    assert tab.stop_at(4, pause=True) == 5 and not tab.playing and tab.clock is None
    assert tab.stop_at(3, pause=True) == 3  # nothing playing: the pause holds the page's step
    tab.playing, tab.clock = True, PlayClock(0, 1.0, Clock())
    tab.clock.sent = 5
    assert tab.stop_at(2) == 2 and not tab.playing  # a hand on the slider (or back) goes where it says, back too

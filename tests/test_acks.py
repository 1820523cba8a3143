"""The one pacing (dgemma/serving/acks.py): a page that acknowledges the frames it draws has at most a
window of them in flight; a client that never does gets the plain rate; the public route the page
posts to, through a real ASGI app (Starlette's test client)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from dgemma.events import RequestEvent
from dgemma.serving.acks import ACK_PATH, COOKIE, MAX_BODY, STALLED_S, AckRoute, Acks, Pace, paces_by_acks
from dgemma.serving.runs import ticks
from fake_clock import Clock


def sent(pace: Pace, frames: int = 1) -> None:
    for _ in range(frames):
        pace.stamp({})


def test_a_pages_frames_are_in_flight_from_the_first_until_drawn():
    pace = Pace(True, Acks())
    sent(pace, 2)
    assert pace.in_flight == 2 and not pace.ready()


def test_a_client_that_never_acknowledges_is_never_held_back():
    pace = Pace(False, Acks())
    sent(pace, 5)
    assert pace.in_flight == 0 and pace.ready()


def test_a_stream_whose_page_acknowledges_a_frame_is_paced_by_its_window_from_then_on():
    clock = Clock()
    acks = Acks(clock=clock)
    pace = Pace(False, acks)  # its cookie did not arrive
    sent(pace)
    clock.now += 3
    acks.drawn(pace.token, 1)
    sent(pace)
    assert pace.in_flight == 1 and not pace.ready()


def test_an_acknowledgement_counts_up_to_the_frame_it_names():
    acks = Acks()
    pace = Pace(True, acks)
    sent(pace, 3)
    acks.drawn(pace.token, 3)
    acks.drawn(pace.token, 1)  # a late, older one
    assert pace.in_flight == 0


def test_a_page_that_draws_each_frame_quickly_may_have_two_in_flight():
    clock = Clock()
    acks = Acks(clock=clock)
    pace = Pace(True, acks)
    sent(pace)
    clock.now += 0.2
    acks.drawn(pace.token, 1)
    sent(pace)
    assert pace.ready()
    sent(pace)
    assert not pace.ready()


def test_a_page_silent_after_a_frame_gets_one_more_past_its_window_and_no_more():
    clock = Clock()
    acks = Acks(clock=clock)
    pace = Pace(True, acks)
    sent(pace)
    clock.now += STALLED_S - 0.1
    assert not pace.ready()
    clock.now += 0.1
    assert pace.ready()  # its acknowledgement was lost, or its drawing failed: the view does not freeze
    sent(pace)
    clock.now += 10 * STALLED_S
    assert pace.in_flight == 2 and not pace.ready()  # a page that draws nothing is sent nothing more
    acks.drawn(pace.token, 2)  # the later frame drawn: the lost acknowledgement no longer counts
    assert pace.in_flight == 0 and pace.ready()


def test_an_unknown_token_or_a_frame_never_sent_is_ignored():
    acks = Acks()
    pace = Pace(True, acks)
    sent(pace)
    assert not acks.drawn("no-such-stream", 1) and not acks.drawn(pace.token, 2) and not acks.drawn(pace.token, 0)
    assert pace.in_flight == 1 and len(acks) == 1


def test_a_closed_stream_leaves_nothing_and_its_late_acknowledgement_is_ignored():
    acks = Acks()
    pace = Pace(True, acks)
    sent(pace)
    pace.close()
    assert len(acks) == 0 and not acks.drawn(pace.token, 1)


def test_past_the_cap_a_stream_goes_at_the_plain_rate_and_registers_nothing():
    acks = Acks(max_streams=2)
    paces = [Pace(True, acks) for _ in range(3)]
    sent(paces[2], 3)
    assert len(acks) == 2 and paces[2].stamp({})["seq"] == 0 and paces[2].ready()


def test_each_frame_a_pace_stamps_carries_its_stream_token_and_the_next_number():
    pace = Pace(True, Acks())
    first, second = pace.stamp({"rows": []}), pace.stamp({"rows": []})
    assert (first["ack"], first["seq"], second["seq"]) == (pace.token, 1, 2) and first["rows"] == []


def test_only_a_request_carrying_the_cookie_is_paced_by_its_page():
    class Request:
        cookies = {COOKIE: "1"}

    assert paces_by_acks(Request()) and not paces_by_acks(object()) and not paces_by_acks(None)


def run_of_events(clock: Clock, events: list) -> tuple:
    """poll and over for `events`, one every 10 ms of (fake) time, the last ending the run."""
    pending = list(events)

    def poll(timeout: float) -> list:
        clock.now += 0.01
        return [pending.pop(0)] if pending else []

    return poll, lambda: not pending


def test_while_the_page_has_not_drawn_the_last_frame_ticks_carry_events_but_no_frame_and_the_last_goes():
    clock = Clock()
    acks = Acks(clock=clock)
    pace = Pace(True, acks)
    poll, over = run_of_events(clock, [RequestEvent(0, "running")] * 200 + [RequestEvent(0, "done")])
    got = []
    for tick in ticks(poll, over, pace, clock=clock):
        if tick.send:
            tick.stamp({})  # sent, and drawn by no page: it stays in flight
        got.append(tick)
    sent = [t for t in got if t.send]
    assert sum(len(t.events) for t in got) == 201  # every event handed on, to fold
    assert len(sent) == 2 and sent[-1].finished  # the first frame and the last
    assert 3 <= len(got) - len(sent) <= 6  # a tick every 0.5 s held back, where Gradio notices a gone client


def test_a_page_that_draws_every_frame_gets_one_a_tick():
    clock = Clock()
    acks = Acks(clock=clock)
    pace = Pace(True, acks)
    poll, over = run_of_events(clock, [RequestEvent(0, "running")] * 200 + [RequestEvent(0, "done")])
    got = []
    for tick in ticks(poll, over, pace, clock=clock):
        if tick.send:
            acks.drawn(pace.token, tick.stamp({})["seq"])
        got.append(tick.send)
    assert all(got) and 10 <= len(got) <= 16  # 2 s of events at 6 a second


@pytest.fixture
def client_and_acks():
    acks = Acks()
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("the app"))])
    with TestClient(AckRoute(app, acks)) as client:
        yield client, acks


def test_the_route_marks_the_frame_drawn(client_and_acks):
    client, acks = client_and_acks
    pace = Pace(True, acks)
    acks.drawn(pace.token, pace.stamp({})["seq"])
    sent(pace)
    answer = client.post(ACK_PATH, content=f"{pace.token} 2")
    assert answer.status_code == 204 and pace.in_flight == 0


def test_the_routes_answer_sets_the_cookie_that_says_this_page_acknowledges(client_and_acks):
    client, _ = client_and_acks
    answer = client.post(ACK_PATH, content="")
    assert answer.status_code == 204 and answer.cookies.get(COOKIE) == "1"


def test_the_route_answers_an_unknown_token_or_garbage_the_same_and_keeps_nothing(client_and_acks):
    client, acks = client_and_acks
    answers = [client.post(ACK_PATH, content=body).status_code for body in ("nope 1", "x", "a b c", "t 99999999999", "\xff 1")]
    assert answers == [204] * 5 and len(acks) == 0


def test_the_route_refuses_a_body_longer_than_a_token_and_a_number(client_and_acks):
    client, _ = client_and_acks
    assert client.post(ACK_PATH, content="x" * (MAX_BODY + 1)).status_code == 413


def test_the_route_takes_only_posts_and_leaves_every_other_path_to_the_app(client_and_acks):
    client, _ = client_and_acks
    assert client.get(ACK_PATH).status_code == 405 and client.get("/").text == "the app"


def test_behind_a_proxy_that_ends_tls_the_cookie_is_partitioned_and_secure(client_and_acks):
    client, _ = client_and_acks
    cookie = client.post(ACK_PATH, content="", headers={"x-forwarded-proto": "https"}).headers["set-cookie"].lower()
    assert "secure" in cookie and "partitioned" in cookie and "samesite=none" in cookie

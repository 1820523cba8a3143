"""The frames a page has drawn (dgemma/serving/acks.py): the registry a stream asks, and the public
route the page posts to, through a real ASGI app (Starlette's test client)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from dgemma.serving.acks import ACK_PATH, MAX_BODY, AckRoute, Acks
from dgemma.serving.backlog import Visitor
from dgemma.ui.stream import coalesced
from fake_clock import Clock


def test_a_streams_frames_are_in_flight_from_the_first_until_drawn():
    acks = Acks()
    token = acks.open()
    acks.sent(token), acks.sent(token)
    assert acks.in_flight(token) == 2


def test_a_stream_whose_first_frame_is_not_drawn_within_the_grace_is_not_held_back():
    clock = Clock()
    acks = Acks(first_ack_s=5, clock=clock)
    token = acks.open()
    acks.sent(token)
    clock.now += 4.9
    assert acks.in_flight(token) == 1
    clock.now += 0.1
    acks.sent(token)
    assert acks.in_flight(token) == 0


def test_a_stream_held_back_again_once_its_page_draws_a_frame_late():
    clock = Clock()
    acks = Acks(first_ack_s=5, clock=clock)
    token = acks.open()
    acks.sent(token)
    clock.now += 8
    acks.drawn(token, 1)
    acks.sent(token)
    assert acks.in_flight(token) == 1


def test_once_the_page_acknowledges_the_frames_sent_since_are_in_flight():
    acks = Acks()
    token = acks.open()
    acks.drawn(token, acks.sent(token))
    assert acks.in_flight(token) == 0
    acks.sent(token)
    assert acks.in_flight(token) == 1


def test_an_acknowledgement_counts_up_to_the_frame_it_names():
    acks = Acks()
    token = acks.open()
    for _ in range(3):
        acks.sent(token)
    acks.drawn(token, 3)
    acks.drawn(token, 1)  # a late, older one
    assert acks.in_flight(token) == 0


def test_a_page_that_draws_slowly_holds_its_stream_at_one_frame_in_flight():
    clock = Clock()
    acks = Acks(clock=clock)
    token = acks.open()
    acks.sent(token)
    clock.now += 3
    acks.drawn(token, 1)
    acks.sent(token)
    assert acks.holding(token)


def test_a_page_that_draws_each_frame_quickly_may_have_two_in_flight():
    clock = Clock()
    acks = Acks(clock=clock)
    token = acks.open()
    acks.sent(token)
    clock.now += 0.2
    acks.drawn(token, 1)
    acks.sent(token)
    assert not acks.holding(token)
    acks.sent(token)
    assert acks.holding(token)


def test_an_unknown_token_or_a_frame_never_sent_is_ignored():
    acks = Acks()
    token = acks.open()
    acks.sent(token)
    assert not acks.drawn("no-such-stream", 1) and not acks.drawn(token, 2) and not acks.drawn(token, 0)
    assert acks.in_flight(token) == 1 and len(acks) == 1


def test_a_closed_stream_leaves_nothing_and_its_late_acknowledgement_is_ignored():
    acks = Acks()
    token = acks.open()
    acks.sent(token)
    acks.close(token)
    assert len(acks) == 0 and not acks.drawn(token, 1) and acks.sent(token) == 0


def test_past_the_cap_a_stream_runs_unpaced_and_registers_nothing():
    acks = Acks(max_streams=2)
    tokens = [acks.open() for _ in range(3)]
    assert len(acks) == 2 and len(set(tokens)) == 3 and acks.sent(tokens[2]) == 0


def test_each_frame_a_visitor_stamps_carries_its_stream_token_and_the_next_number():
    acks = Acks()
    visitor = Visitor("s", acks)
    first, second = visitor.stamp({"rows": []}), visitor.stamp({"rows": []})
    assert (first["ack"], first["seq"], second["seq"]) == (visitor.token, 1, 2) and first["rows"] == []


def test_a_visitor_who_has_not_drawn_the_last_frame_gets_only_the_last_update():
    clock = Clock()
    acks = Acks(clock=clock)
    visitor = Visitor("s", acks)
    seq = visitor.stamp({})["seq"]
    clock.now += 3  # a slow link: one frame in flight
    acks.drawn(visitor.token, seq)
    visitor.stamp({})  # sent, not drawn
    assert list(coalesced(range(5), visitor, lambda i: i == 4)) == [4]


def test_a_visitor_who_draws_each_frame_gets_every_update_and_is_closed_at_the_end():
    acks = Acks()
    visitor = Visitor("s", acks)
    got = []
    for update in coalesced(range(5), visitor, lambda i: i == 4):
        acks.drawn(visitor.token, visitor.stamp({})["seq"])
        got.append(update)
    assert got == [0, 1, 2, 3, 4] and len(acks) == 0


@pytest.fixture
def client_and_acks():
    acks = Acks()
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("the app"))])
    with TestClient(AckRoute(app, acks)) as client:
        yield client, acks


def test_the_route_marks_the_frame_drawn(client_and_acks):
    client, acks = client_and_acks
    token = acks.open()
    acks.drawn(token, acks.sent(token))
    acks.sent(token)
    answer = client.post(ACK_PATH, content=f"{token} 2")
    assert answer.status_code == 204 and acks.in_flight(token) == 0


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

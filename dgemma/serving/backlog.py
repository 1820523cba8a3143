"""Whether a visitor is behind: their earlier messages still wait, unwritten, in Gradio's queue.

Gradio (6.31) sends every message of a page's events (each value a generator yields, and the
status messages around them) down one server-sent-event stream per session. `Queue.send_message`
puts each into that session's `asyncio.Queue`, `blocks._queue.pending_messages_per_session
[session_hash]` (gradio/queueing.py), and the stream's writer (`sse_stream` in
gradio/routes.py, `queue_data_helper`) takes the next one only once the last is written. On a
link slower than the stream, uvicorn's flow control holds the writer in `send`, and the queue
grows by one message per yield, without bound: a visitor on 0.1 Mbit/s watching a real-scale
run made the server hold every frame, and saw the run as it was minutes before.

`Visitor(session).behind()` reads that queue's length, so the streams (dgemma/ui/stream.py `coalesced`)
skip a frame while the visitor still has one waiting: the next frame they are sent is the state
of that moment, and the server holds at most one frame for them. It reads the Blocks from
`gradio.context.LocalContext.blocks`, which Gradio sets before every step of an event's
function; outside an event (a script, a unit test) no one is behind. tests/test_backlog.py fails
loudly if a Gradio upgrade moves the queue. DGEMMA_COALESCE=0 turns the skipping off (every
frame queues, as before it): the baseline of scripts/measure_slow_visitor.py.

A visitor whose page says which frames it drew (dgemma/serving/acks.py) is also behind while a
frame sent to them is not drawn yet (two, on a quick link): the sockets and the link's buffers hold half a megabyte before
Gradio's queue holds anything. A stream stamps each frame it sends (`Visitor.stamp`), and ends its
Visitor (`close`) when it ends.
"""

from __future__ import annotations

import logging
import os

from gradio.context import LocalContext

from dgemma.serving.acks import ACKS, PACED, Acks

log = logging.getLogger(__name__)
_warned: list[bool] = []
COALESCE = os.environ.get("DGEMMA_COALESCE", "1") != "0"


def waiting(session: str) -> int:
    """Messages of `session`'s events that Gradio has queued and its stream has not yet written."""
    blocks = LocalContext.blocks.get(None)
    if blocks is None:  # not inside a Gradio event
        return 0
    try:
        queue = blocks._queue.pending_messages_per_session.get(session)
    except AttributeError:  # a Gradio whose queue is elsewhere: frames are sent, none skipped
        if not _warned:
            _warned.append(True)
            log.warning("Gradio's per-session message queue is not where dgemma/serving/backlog.py reads it; "
                        "a slow visitor's frames will queue up")
        return 0
    return queue.qsize() if queue is not None else 0


def event_alive() -> bool:
    """Whether the Gradio event this code runs in still has its client: Gradio marks the event's job
    not `alive` (`Queue.clean_events`) as soon as the client's stream closes, and ends the event's
    generator at its next yield. True outside an event, or where Gradio keeps its jobs elsewhere."""
    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    if blocks is None or event_id is None:
        return True
    try:
        jobs = [job for job_set in blocks._queue.active_jobs if job_set for job in job_set]
        return next((job.alive for job in jobs if job._id == event_id), True)
    except AttributeError:
        return True


class Visitor:
    """One session's visitor as a stream sees them: whether they are behind, and how far they got behind."""

    def __init__(self, session: str, acks: Acks = ACKS) -> None:
        self.session = session
        self.most_waiting = 0  # the most of their messages seen waiting at once
        self.acks = acks
        self.token = acks.open()  # this stream's, in the frames it sends

    def behind(self) -> bool:
        """A message of theirs is still waiting to be written, or their page has not yet drawn the
        last frame sent to it: a frame now would queue behind it."""
        n = waiting(self.session)
        self.most_waiting = max(self.most_waiting, n)
        return COALESCE and (n > 0 or (PACED and self.acks.holding(self.token)))

    def gone(self) -> bool:
        """Their client has left (tab closed, connection dropped): the next yield is where Gradio ends
        the stream, so it should come at once, not when they would have caught up."""
        return not event_alive()

    def stamp(self, frame: dict) -> dict:
        """`frame` (a compact frame, dgemma/ui/compact.py), sent: with this stream's token and its
        sequence number, which the page posts back once it has drawn it."""
        return {**frame, "ack": self.token, "seq": self.acks.sent(self.token)}

    def close(self) -> None:
        """The stream has ended: its page's acknowledgements are no longer kept."""
        self.acks.close(self.token)

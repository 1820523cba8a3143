"""Loading a run file, saying how far its upload has come. Gradio's upload area sends the file with an
`upload_id` and follows `/gradio_api/upload_progress`, drawing a small bar; assets/upload_note.js reads that bar
and says it in words ("Uploading run.jsonl: 1.2 of 4.6 MB (26 %)"), then "reading the run ..." until
the run is shown or refused: a real-scale run file over a visitor's uplink takes seconds to minutes."""

from __future__ import annotations

import gradio as gr

from dgemma.ui import asset


def note() -> gr.HTML:
    """The note of an upload under way, empty when none is (call where it goes: under the upload area)."""
    return gr.HTML('<div class="upload-note" role="status" aria-live="polite"></div>', js_on_load=asset("upload_note.js"),
                   elem_id="upload-note", padding=False, apply_default_css=False)

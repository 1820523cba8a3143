"""Serving: how a click or an API call becomes engine work, and the Backend contract the views see.

backend (the contract), engine_backend (the engine in this process), gpu_backend and gpu_worker
(ZeroGPU: the one `spaces.GPU` call), loading (page first), sessions, inputs (a call's checked
input), api (the API's endpoints), lesson_budget (the lesson's batch and budget); what visitors leave: runfiles
(disk), held_runs (memory), upload_guard (uploads sized first); compression (the page's event stream),
send_buffer (its socket keeps little unsent), backlog (whether a visitor is behind: their frames coalesce)
and acks (which frames a page has drawn).
"""

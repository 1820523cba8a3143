"""Serving: how a click or an API call becomes engine work, and the Backend contract the views see.

backend (the contract), engine_backend (the engine in this process), gpu_backend and gpu_worker
(ZeroGPU: the one `spaces.GPU` call), loading (page first), runs (a run's whole life: the tab's cap,
start, recording, where it is kept, pacing, close), inputs (a call's checked input), api (the API's
endpoints), lesson_budget (the lesson's batch and budget); what visitors leave: runfiles (disk),
held_runs (memory), upload_guard (uploads sized first); acks (how fast a stream sends: as its page draws).
"""

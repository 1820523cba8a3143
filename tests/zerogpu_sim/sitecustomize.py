"""Runs at interpreter start-up for processes started with tests/zerogpu_sim on PYTHONPATH.

The stubs live in a module of their own: spaces imports the package in a forked pool at once,
and the child unpickles `zerogpu_stubs._never_in_bad_fork`, which must be a fully imported module
(this one is still being imported while it runs).
"""

import zerogpu_stubs

zerogpu_stubs.install()

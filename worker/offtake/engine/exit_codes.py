"""The worker's exit codes, for the loop and the delivery modes that stop it.

0: stopped as asked (a graceful stop duplicates and loses nothing). 1: stopped on an error the
pipeline's ``errors.policy: stop`` (or the processing thread) asked to stop for. 3: a fault the
worker cannot go on through (the source's fatal error, an exactly-once transaction that cannot
be recovered in process): a restart resumes from the last commit. The watchdog's 14 is
:data:`offtake.engine.watchdog.EXIT_WATCHDOG`.
"""

EXIT_OK, EXIT_STOPPED_ON_ERROR, EXIT_FATAL = 0, 1, 3

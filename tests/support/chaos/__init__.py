"""Chaos scenarios on real components, shared by the short tests (tests/chaos/) and the long
runs of ``bench/chaos.py``: the same body, only the sizes differ.

Each scenario returns a :class:`Outcome`: records, faults injected, records lost, records
duplicated, the longest time to recover after a fault, peak RSS where memory is the question,
and the duplicate bound it must stay within (faults times ``limits.maxInFlightMessages``: a
killed worker re-delivers at most its in-flight records). Callers assert ``lost == 0`` and
``duplicated <= duplicate_bound``; the bench writes them into docs/reliability.md.

One module per scenario, numbered as docs/reliability.md numbers them (``s01_worker_kills``
... ``s06_sidecar_outages``), and :mod:`.common` for what they share.
"""

"""Real components for tests and the local demo, installed and cached outside the repository.

Everything here downloads from the package registries this project may reach (Maven Central,
the Go module proxy, Debian's packages, PyPI) into ``~/.cache/offtake`` (or
``$OFFTAKE_CACHE``), so that reruns are quick and nothing binary is ever committed.
"""

"""Delivery modes: when and how settled records are committed (see :mod:`.base`)."""

"""The buffer's machinery behind the ``ReplayBuffer`` facade, one job per module.

``state`` (the shared parts and their lock), ``budget`` (RAM and back-pressure), ``ingest`` (push),
``writeback`` (eviction, write-back, the one install-fragment path), ``reads`` (get, scan),
``deletes``, ``recovery``, ``snapshots`` (the lake), ``tasks`` (background queue), ``dirlock``.
"""

"""Replay traffic against KV allocators and account for where the memory goes.

``model.py`` defines what is simulated (requests, the serving config, the step-time model, the
allocators); ``placement.py`` the address-space allocators that place contiguous reservations;
``engine.py`` the event-driven simulator; ``workload.py`` synthetic request generation.
"""

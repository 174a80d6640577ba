"""The framework-free core: plans, maths, stores and the tracker that both adapters share.

Nothing under ``hvdsync.core`` imports torch or tensorflow (tests/repo/test_layering.py checks it);
an adapter hands the core what it needs as callables or through :class:`hvdsync.core.train.loop.Backend`.
"""

"""Runs inside 2 Horovod workers (sent by value): notebook 17's co-design measurements, small, for either framework.

tests/parallel/test_codesign.py asserts on the numbers.
"""
import importlib


def all_checks(framework: str) -> dict:
    """The 100k-row embedding table with sync.sparse allgather and dense (codec none, then fp16), dense under
    top-k (a reducing codec on a densified sparse gradient), and batch-norm statistics of an uneven split."""
    codesign = importlib.import_module(f"hvdsync.{framework}.codesign")
    return {"none": codesign.embedding_exchange(steps=3),
            "fp16": codesign.embedding_exchange(steps=2, compression="fp16"),
            "topk": codesign.embedding_exchange(steps=2, compression="topk:0.01", modes=("dense",)),
            "bn": codesign.batchnorm_statistics(rows=(5, 3))}

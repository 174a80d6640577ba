"""Decentralised (gossip) averaging on a ring, planned and simulated in numpy.

With no server and no global all-reduce, each rank keeps its own parameters and, every H steps, replaces them by a
weighted average of its own and its ring neighbours' (D-PSGD: Lian et al., "Can decentralized algorithms outperform
centralized algorithms?", NeurIPS 2017):

    x_r <- sum_j W[r, j] x_j    (j in {r-1, r, r+1}),   then   x_r <- x_r - lr * grad_r(x_r)

W is the Metropolis-Hastings matrix of the ring (:func:`mixing_matrix`): symmetric and doubly stochastic, so the
mean of the ranks' parameters is kept exactly, and the spread around it (the *consensus distance*,
:func:`consensus_distance`; Kong et al., "Consensus control for decentralized deep learning", ICML 2021)
shrinks by the second-largest eigenvalue modulus of W per round (:func:`contraction`) while the gradients push it
apart again. Each rank sends its parameters to d = min(2, W-1) neighbours: the bytes per rank do not grow with the
world size, unlike a parameter server's; the price is that the ranks only agree approximately, and the ring mixes
slowly when W is large (``contraction`` tends to 1 like 1 - c/W^2).

With W = 2 both neighbours are the same rank and W = [[1/2, 1/2], [1/2, 1/2]]: one gossip round *is* an exact
average (an all-reduce of the parameters). That is why the simulation below is run for 4 and 8 ranks, and
checked against the real Horovod exchange at 2.

Example:
    >>> np.round(mixing_matrix(4)[0], 4).tolist()
    [0.3333, 0.3333, 0.0, 0.3333]
    >>> exchange_splits(5, rank=0, world=4)       # alltoall splits: my 5 parameters to ranks 1 and 3
    [0, 5, 0, 5]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hvdsync.core.comm.schemes.ps import Traffic


def neighbours(rank: int, world: int) -> list[int]:
    """The distinct ring neighbours of ``rank`` (one when W = 2, none when W = 1), sorted."""
    return sorted({(rank - 1) % world, (rank + 1) % world} - {rank})


def mixing_matrix(world: int) -> np.ndarray:
    """Metropolis-Hastings weights of the ring: ``W[i, j] = 1 / (1 + max(deg i, deg j))`` for neighbours, the rest
    on the diagonal. Symmetric, rows and columns sum to 1."""
    w = np.zeros((world, world))
    for i in range(world):
        for j in neighbours(i, world):
            w[i, j] = 1.0 / (1 + max(len(neighbours(i, world)), len(neighbours(j, world))))
        w[i, i] = 1.0 - w[i].sum()
    return w


def exchange_splits(size: int, rank: int, world: int) -> list[int]:
    """Elements ``rank`` sends to each destination in one gossip round (an ``alltoall`` with these splits)."""
    targets = set(neighbours(rank, world))
    return [size if j in targets else 0 for j in range(world)]


def mix(rank_params: Sequence[np.ndarray]) -> list[np.ndarray]:
    """One gossip round: every rank's parameters replaced by the weighted average with its neighbours'."""
    x = np.stack([np.asarray(p, dtype=np.float64) for p in rank_params])
    w = mixing_matrix(len(rank_params))
    return list(w @ x.reshape(len(rank_params), -1))


def consensus_distance(rank_params: Sequence[np.ndarray]) -> float:
    """sqrt(mean over ranks of ||x_r - mean x||^2): 0 when all ranks hold the same parameters."""
    x = np.stack([np.asarray(p, dtype=np.float64).ravel() for p in rank_params])
    return float(np.sqrt(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1))))


def contraction(world: int) -> float:
    """Second-largest eigenvalue modulus of the mixing matrix: one round multiplies the consensus distance by at
    most this (0 for W <= 3, where one round is an exact average; tends to 1 as W grows)."""
    if world <= 1:
        return 0.0
    eig = np.sort(np.abs(np.linalg.eigvalsh(mixing_matrix(world))))
    return float(eig[-2])


def traffic(size: int, itemsize: int, world: int) -> Traffic:
    """Bytes per rank of one gossip round: d = min(2, W-1) copies of the parameters out, d in."""
    d = len(neighbours(0, world))
    per_rank = np.full(world, d * size * itemsize, dtype=np.int64)
    return Traffic(per_rank, per_rank.copy())

"""How the package names an attention head: one type and one label, used everywhere.

A head is a ``(layer, head)`` pair of integers (:data:`Head`), and it is written ``layer.head``
(:func:`head_name`): ``"1.0"`` is head 0 of layer 1, so prose reads "head 1.0". Every table,
title and tick label in the package comes from :func:`head_name`, so the names cannot drift apart.
"""

from __future__ import annotations

__all__ = ["Head", "head_name"]

Head = tuple[int, int]  # (layer, head)


def head_name(layer: int, head: int) -> str:
    """The label of head ``head`` of layer ``layer``: ``head_name(1, 0) == "1.0"``.

    Takes the two integers (``head_name(*h)`` for a :data:`Head` pair ``h``); numpy or torch
    integers are accepted and printed as plain integers.
    """
    if isinstance(layer, tuple) or isinstance(head, tuple):
        raise TypeError("head_name takes two integers, head_name(layer, head); for a (layer, head) pair h use head_name(*h)")
    return f"{int(layer)}.{int(head)}"

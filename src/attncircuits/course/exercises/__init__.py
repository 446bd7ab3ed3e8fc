"""The learner's checks: one module per chapter, each check beside the chapter's references.

A chapter's exercise cell ends with a call such as::

    from attncircuits.course.exercises.ch01 import check_attention_head
    check_attention_head(attention_head)

which runs the learner's function on shipped, random and hand-built inputs against the package's
reference function and prints one message: ✓ correct, ✗ what is wrong (in words: the shape, a
transpose, a missing ``1/sqrt(d_head)``, ...), or ○ not attempted yet. Checks return True or False
and never raise for anything the learner's function does.

One module per chapter of ``_toc.yml`` that has exercises (``ch01`` ... ``ch09``) because the learner's import then names the chapter
the exercise comes from, and each module imports only that chapter's reference functions (from the rooms of the package:
``circuits``, ``scores``, ``losses``, ``interop``; never defined here), so a chapter's checks sit
beside what they check and one chapter's change leaves the others alone. The
shared machinery (running a function safely, comparing, the messages) is in :mod:`._core`; its
docstring says how to write a check.

Declaring a check (chapters 11 and later get the same contract without doing anything more)::

    def check_loss_bump(fn) -> bool:
        return run_check(fn, cases, reference=loss_bump, diagnoses=[...],
                         generate=_curve,        # Draw -> the arguments of one generated case
                         returns=float,          # the type the text asks (float, int; None: any)
                         outputs=("W", "b"),     # names of a tuple's items, for messages
                         identities=[Identity("components sum to resid", holds)])

``generate(draw)`` returns the arguments (or a ``Case`` whose label is a note on the case), the
text's edges first (``draw.edge(n)``; :mod:`._draws` has small models, tokens and patterns). ``run_check`` itself gives every check the time limit, the
torch-state guard, the in-place check of every input and the return type; ``tests/`` asserts each
``identities`` on every case, and that every ``check_*`` of every ``chNN`` module keeps them.
"""

from attncircuits.course.exercises._core import (
    Case,
    Diagnosis,
    Draw,
    Identity,
    random_model,
    random_tokens,
    report,
    run_check,
    shipped,
)

__all__ = ["Case", "Diagnosis", "Draw", "Identity", "random_model", "random_tokens", "report", "run_check", "shipped"]

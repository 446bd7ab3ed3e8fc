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
"""

from attncircuits.course.exercises._core import Case, Diagnosis, random_model, random_tokens, report, run_check, shipped

__all__ = ["Case", "Diagnosis", "random_model", "random_tokens", "report", "run_check", "shipped"]

"""Training: everything that turns text into a checkpoint, one module a step.

==============  ===============================================================================
``presets``     the recipes (model shape, steps, schedule, batch mix), each with why
``loop``        :func:`train`, the loop every model is trained by, and ``prepare_corpus``
``run_folder``  an output folder: write-then-swap saves, ``--resume``, what a run keeps
``cli``         ``python -m attncircuits.train``: argument checks, Ctrl-C, one line per refusal
``sets``        a set of models trained side by side, one process per lane
``replicate``   ``make replicate SEED=n``: the shipped recipes with another seed, every chapter run
``mine``        ``make train-mine``: the course on the learner's own text
``live``        chapter 7's live run: induction heads forming in seconds
``markov``      chapter 13: models on in-context Markov chains, their stages (``make markov``)
``clamps``      chapter 13: the live recipe with heads' attention clamped (``make clamps``)
==============  ===============================================================================

``from attncircuits.train import train, TrainConfig, PRESETS`` is the loop's public face.
"""

from attncircuits.train.loop import (
    TrainConfig,
    TrainingDiverged,
    TrainingInterrupted,
    evaluate,
    lr_at,
    make_batch,
    make_batch_checked,
    prepare_corpus,
    train,
)
from attncircuits.train.presets import PRESETS

__all__ = ["PRESETS", "TrainConfig", "TrainingDiverged", "TrainingInterrupted", "evaluate", "lr_at", "make_batch",
           "make_batch_checked", "prepare_corpus", "train"]

"""attncircuits: the helper package of *Transformer Circuits from Scratch*.

The folders follow the course's pipeline: text and a model, a checkpoint, what is read from it,
how it is drawn, how it is trained, and the course around it. **A function lives in the room of what
it reads.** A module imports only from rooms below it, or from its own room without a circle, never
back up (``tests/layout.py`` holds the package to this; ``python tests/layout.py`` prints the rooms):

===================  ===========================================================================
``core/``            knows no model: head names (``"1.0"``), one check per kind of input with one
                     message style (``validate``), durable writes, SHA-256 manifests
``data``             corpus, tokenizer, batches, repeated random tokens
``models/``          one interface for every model (``interface``); the family as configuration
                     (``config``), built by one class (``transformer``: with the default config
                     the framework's exact object) from ``parts``; chapter 10's checkpoint read
                     as a member (``hooked``); smeared keys, hand-written weights; the
                     TransformerLens 4 bridge (``interop``, ``tl_native``)
``checkpoints/``     the model set in use, loading, saving and verifying checkpoints and the
                     corpus files; the shipped weights in ``checkpoints/shipped/``
``analysis/``        reads a model, draws nothing: ``circuits/`` from **weights** (factored
                     matrices, QK/OV, bigrams, paths, skip-trigrams, copying, composition,
                     induction); ``losses`` from **losses** (repeated tokens, in-context learning,
                     ablations); ``scores``, the registry of head **detectors**, from attention
                     patterns; ``attribution``, the logit and scores split into their terms
``show/``            draws what it is given, computes nothing: ``plotting/``, ``widgets/``
``train/``           the loop, presets, command line (``python -m attncircuits.train``), run
                     folders, model sets, replicates, the learner's own text, the live run
``course/``          the claims a chapter checks, the exercise checks (**checks only**: the
                     references they compare against live in the rooms below) and the
                     learner-notebook generator
===================  ===========================================================================

So a new model goes to ``models/``, a new score to ``analysis/scores``, a new weights-only circuit
to ``analysis/circuits/``, a new ablation to ``analysis/losses``, a new figure to ``show/plotting/``,
a chapter's explorer to ``show/widgets/chapters.py``, a new training command to ``train/``, a new
chapter's checks to ``course/exercises/chNN.py``; the chapters import analysis from the rooms, never
from ``course/exercises/``. Public functions check their inputs once (``core.validate``) and call
inner functions that trust them. No star imports, no private name (``_x``) used outside its module
(a private module such as ``course/exercises/_run`` is its package's inside), no import hidden in a
function, no module over 400 lines.
"""

from attncircuits.checkpoints.pretrained import MODEL_NAMES, load_checkpoint, load_pretrained
from attncircuits.models.transformer import ModelConfig
from attncircuits.models.parts import ActivationCache, loss_fn
from attncircuits.models.transformer import Transformer

__all__ = ["ActivationCache", "ModelConfig", "Transformer", "MODEL_NAMES", "load_checkpoint", "load_pretrained", "loss_fn"]
__version__ = "0.1.0"

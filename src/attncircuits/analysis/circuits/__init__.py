"""Weight-based analysis: circuits read from a model's weights, one module per idea, in the order
the book teaches them:

- ``bigrams``          the zero-layer bigram table ``W_E @ W_U`` and the corpus's counted bigrams (ch. 2)
- ``factored_matrix``  the factored-matrix type ``A @ B`` kept as its factors (no model needed)
- ``factored``         a head's full OV / QK circuits and the positional QK circuit, factored (ch. 3)
- ``paths``            the exact path expansion of the logits of one-layer models (ch. 3)
- ``skip_trigrams``    skip-trigram tables, their effect on the model and the skip-trigram bug (ch. 4)
- ``copying``          copying heads: OV eigenvalues and top-1 "copies itself" (ch. 4, 6)
- ``composition``      Q/K/V composition scores, their random baseline, virtual heads' OV circuits (ch. 5)
- ``two_layer_paths``  the 2-layer path expansion and term importance, patterns frozen (ch. 5)
- ``induction``        the K-composition term of an induction head and the QK-vs-OV eigenvalue scatter (ch. 6)

A new weights-only measure goes into the module of its idea (or a new one, listed here). Every
public name is also importable from here: ``from attncircuits.analysis.circuits import FactoredMatrix``.
"""

from attncircuits.analysis.circuits.bigrams import (
    BigramComparison,
    DirectPathWarning,
    bigram_count_table,
    bigram_log_probs,
    bigram_logits,
    compare_bigram_tables,
    conditional_entropy,
    count_bigrams,
    cross_entropy,
    fit_smoothing,
    next_token_kl,
    resolve_token,
    self_prediction,
    smoothed_log_probs,
    top_next_tokens,
    topk_agreement,
    weighted_pearson,
    weighted_spearman,
)
from attncircuits.analysis.circuits.composition import (
    CompositionBaseline,
    CompositionScores,
    composition_score,
    composition_scores,
    random_composition_baseline,
    random_composition_scores,
    virtual_ov_circuit,
)
from attncircuits.analysis.circuits.copying import (
    CopyingSummary,
    copying_summary,
    eigen_copying_score,
    ov_copying_accuracy,
)
from attncircuits.analysis.circuits.factored import (
    QKParts,
    full_ov_circuit,
    full_qk_circuit,
    mean_attention_by_offset,
    ov_factors,
    positional_attention,
    positional_heads,
    positional_qk_circuit,
    qk_circuit_parts,
    qk_factors,
)
from attncircuits.analysis.circuits.factored_matrix import DENSE_LIMIT_BYTES, FactoredMatrix
from attncircuits.analysis.circuits.induction import (
    InductionEigen,
    induction_eigen_positivity,
    k_composition_circuit,
    writer_ov,
)
from attncircuits.analysis.circuits.paths import (
    PathExpansion,
    attention_patterns_from_weights,
    next_token_contributions,
    path_expansion,
    path_expansion_error,
)
from attncircuits.analysis.circuits.skip_trigrams import (
    SkipTrigramBug,
    SkipTrigrams,
    find_skip_trigram_bugs,
    resolve_tokens,
    skip_trigram_effects,
    top_skip_trigrams,
)
from attncircuits.analysis.circuits.two_layer_paths import (
    PAPER_TERM_IMPORTANCE,
    TermImportance,
    TwoLayerPaths,
    term_importance,
    two_layer_path_expansion,
    virtual_head_pattern,
)

__all__ = [
    "BigramComparison",
    "CompositionBaseline",
    "CompositionScores",
    "CopyingSummary",
    "DENSE_LIMIT_BYTES",
    "DirectPathWarning",
    "FactoredMatrix",
    "InductionEigen",
    "PAPER_TERM_IMPORTANCE",
    "PathExpansion",
    "QKParts",
    "SkipTrigramBug",
    "SkipTrigrams",
    "TermImportance",
    "TwoLayerPaths",
    "attention_patterns_from_weights",
    "bigram_count_table",
    "bigram_log_probs",
    "bigram_logits",
    "compare_bigram_tables",
    "composition_score",
    "composition_scores",
    "conditional_entropy",
    "copying_summary",
    "count_bigrams",
    "cross_entropy",
    "eigen_copying_score",
    "find_skip_trigram_bugs",
    "fit_smoothing",
    "full_ov_circuit",
    "full_qk_circuit",
    "induction_eigen_positivity",
    "k_composition_circuit",
    "mean_attention_by_offset",
    "next_token_contributions",
    "next_token_kl",
    "ov_copying_accuracy",
    "ov_factors",
    "path_expansion",
    "path_expansion_error",
    "positional_attention",
    "positional_heads",
    "positional_qk_circuit",
    "qk_circuit_parts",
    "qk_factors",
    "random_composition_baseline",
    "random_composition_scores",
    "resolve_token",
    "resolve_tokens",
    "self_prediction",
    "skip_trigram_effects",
    "smoothed_log_probs",
    "term_importance",
    "top_next_tokens",
    "top_skip_trigrams",
    "topk_agreement",
    "two_layer_path_expansion",
    "virtual_head_pattern",
    "virtual_ov_circuit",
    "weighted_pearson",
    "weighted_spearman",
    "writer_ov",
]

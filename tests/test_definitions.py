"""One definition per head role and per verdict (attncircuits.analysis.definitions): the chapters,
the grader and the detectors read the levels from there, never a number of their own.

The chapters' code cells (the solved notebooks and the reproduces page; the learner copies are
generated from them) and the package's verdict modules are parsed; every comparison of a
score-like name (prefix matching, previous-token, copying, stripe, role and composition scores)
with a number, every ``threshold=`` number passed to a call, and every level constant or
``threshold`` default set to a number fails, unless it is on the short allow-list below, each entry
with the reason it is not a role's level."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from attncircuits.analysis import circuit_check as cc
from attncircuits.analysis import definitions as D
from attncircuits.analysis import phase
from attncircuits.train import replicate, watch

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + [ROOT / "book" / "reproduces.ipynb"]
#: the package's modules that give a head a role or a verdict
PACKAGE = [ROOT / "src" / "attncircuits" / p for p in (
    "analysis/grading.py", "course/claims.py", "analysis/circuit_check.py", "analysis/phase.py",
    "analysis/scores.py", "analysis/circuits/induction.py", "analysis/circuits/factored.py",
    "train/replicate.py", "train/watch.py", "train/live.py", "train/clamps.py", "train/enough.py",
    "course/exercises/ch06_heads.py", "analysis/stages.py", "analysis/mystery_claims.py")]

#: a name that holds a detector's score (the names of one side of a comparison, indices left out)
SCORE = re.compile(
    r"^(prefix\w*|previous_token|pm\w*|pt|prev\w*|copying|cp|eigen_score|ov|stripe\w*|tl_scores"
    r"|tl_copy|roles|z|\w+_z|kz\w*|qvz|induction|previous-token|duplicate-token)$")
#: names that make a side something else: a difference between two computations, a shape
NOT_A_SCORE = re.compile(r"_diff$|_err$|error$|^shape$|^ndim$")
#: a count of heads or pairs (compared with a whole number: how many, not how strongly)
COUNT = re.compile(r"^n_\w+|^len$|^sum$|count|_heads$")
#: a claim whose words give a head a role: its condition compares with no number of its own
ROLE_WORDS = re.compile(r"induction head|previous-token head|duplicate-token head|copying head|\bcopies\b"
                        r"|\bformed?\b|\bforms\b|K-composes|V-composes|Q-composes")
#: a module constant that names a level
LEVEL_NAME = re.compile(r"THRESHOLD|^ATTENDS$|^FORMED$|^COMPOSES$|TARGET_PREFIX|^INDUCTION$")

#: (file, the comparison's source, why it is not a role's level); each entry must still match
ALLOWED = {
    ("01_attention_only_transformer.ipynb", "row[top].item() > 0.3"):
        "one query's attention in one example (its largest weight), not a head's score",
    ("06_induction_heads.ipynb", "zero_effect[prev_head] > 1.0"):
        "an ablation's effect in nats, not a head score",
    ("07_why_two_layers.ipynb", "abs(g0) < 0.1"):
        "a loss difference in nats (the claim names layers, not a role)",
    ("07_why_two_layers.ipynb", "d > 1.5"):
        "a direct-logit term in nats on the second copy, not a head score",
    ("09_transformer_lens.ipynb", "tl_effect > 1.0"):
        "an ablation's effect in nats, not a head score",
    ("stages.py", "end['prev_token'] - start['prev_token'] > 0.1"):
        "chapter 14's stage-naming rule, stated in advance: a rise of a score over a stage, not a level",
    ("stages.py", "pm1 - pm0 > 0.05"):
        "chapter 14's stage-naming rule, stated in advance: a rise of a score over a stage, not a level",
    ("07_why_two_layers.ipynb", "pm_snap[min(falls)].max() > 0.8"):
        "how far the heads had formed when the ICL score first fell, a finding, not a role's level",
    ("reproduces.ipynb", "float(zero6[prev6]) > 1.0"):
        "an ablation's effect in nats (chapter 6's), not a head score",
    ("reproduces.ipynb", "share7 > 0.6"):
        "a share of the ICL score (chapter 7's), not a head score",
    ("reproduces.ipynb", "share10 > 0.5"):
        "a share of the ICL score (chapter 10's), not a head score",
    ("04_skip_trigrams.ipynb", "cs.eigen_score[clear] > 0.9"):
        "'clearly so': the heads that copy (COPYING_EIGEN) do so far above the level, a finding",
    ("04_skip_trigrams.ipynb", "cs.diagonal_z[clear] > 1"):
        "the OV diagonal's z in its row, a second measure of copying strength, a finding",
    ("06_induction_heads.ipynb", "diag_z > 3.0"):
        "the K-composition circuit's diagonal z in its row (a token-level finding), not COMPOSES",
    ("reproduces.ipynb", "cs1.eigen_score[clear1] > 0.9"):
        "chapter 4's 'clearly so' finding, restated",
    ("05_two_layer_composition.ipynb", "k_z > 10"):
        "a finding about the shipped model's strength ('far beyond chance'), not a level",
    ("07_why_two_layers.ipynb", "prev_l0.max() < 0.5"):
        "the prose's 'a modest share': no one head takes half, a description, not a role",
    ("07_why_two_layers.ipynb", "prev_l0 > 0.1"):
        "the prose's 'shared': several heads take a tenth, a description, not a role",
    ("08_build_circuits_by_hand.ipynb", "prev_score > 0.99"):
        "a hand-built head is exact by construction, far above any trained level",
    ("08_build_circuits_by_hand.ipynb", "pm[1] > 0.995"):
        "a hand-built induction head is exact by construction",
    ("08_build_circuits_by_hand.ipynb", "pm[0] < 0.05"):
        "a hand-built layer 0 has no induction by construction",
    ("08_build_circuits_by_hand.ipynb", "pm_no_prev < 0.1"):
        "the hand-built induction head without its previous-token head: exactly none",
    ("10_deeper_model.ipynb", "kz[prev[1]] > 5"):
        "a finding about the shipped model's strength, not a level",
    ("reproduces.ipynb", "k_z > 10"):
        "a finding about the shipped model's strength (chapter 5's), not a level",
    ("reproduces.ipynb", "float(kz10[prev10[1]]) > 5"):
        "a finding about the shipped model's strength (chapter 10's), not a level",
    ("reproduces.ipynb", "prev8[0, 0] > 0.95"):
        "a hand-built head is exact by construction (chapter 8)",
    ("reproduces.ipynb", "pm8 > 0.95"):
        "a hand-built induction head is exact by construction (chapter 8)",
    ("reproduces.ipynb", "pm8_no_prev < 0.2"):
        "the hand-built induction head without its previous-token head (chapter 8)",
    ("reproduces.ipynb", "min(kz) > 10"):
        "a finding across runs about strength (chapter 5's 'over 10 std'), not a level",
}


def _cells(path: Path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            yield "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))


def _names(node) -> list[str]:
    """The names, attributes and string keys of an expression, those inside an index left out."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        return _names(node.value) + ([key.value] if isinstance(key, ast.Constant) and isinstance(key.value, str) else [])
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return _names(node.value) + [node.attr]
    return [n for child in ast.iter_child_nodes(node) for n in _names(child)]


def _words(node) -> str:
    """The literal text of a string, an f-string or strings joined with ``+``."""
    return " ".join(c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str))


def _number(node) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool) and node.value != 0)


def own_numbers(tree: ast.AST, package: bool = False) -> list[str]:
    """The comparisons, ``threshold=`` arguments and level constants of ``tree`` that use a number."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            sides = [node.left, *node.comparators]
            for a, b in zip(sides, sides[1:]):
                for num, other in ((a, b), (b, a)):
                    names = _names(other)
                    if not _number(num) or any(NOT_A_SCORE.search(n) for n in names):
                        continue
                    if isinstance(num, ast.Constant) and isinstance(num.value, int) and any(
                            COUNT.search(n) for n in names):
                        continue
                    if any(SCORE.search(n) for n in names):
                        found.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "claim"
              and len(node.args) >= 2 and ROLE_WORDS.search(_words(node.args[0]))):
            found += [ast.unparse(c) for c in ast.walk(node.args[1]) if isinstance(c, ast.Compare)
                      and not isinstance(c.ops[0], (ast.Eq, ast.NotEq))
                      and any(_number(x) and isinstance(x, ast.Constant) and isinstance(x.value, float)
                              for x in [c.left, *c.comparators])]
        elif isinstance(node, ast.keyword) and node.arg and "threshold" in node.arg and _number(node.value):
            found.append(f"{node.arg}={ast.unparse(node.value)}")
        elif package and isinstance(node, ast.Assign) and _number(node.value):
            found += [f"{t.id} = {ast.unparse(node.value)}" for t in node.targets
                      if isinstance(t, ast.Name) and LEVEL_NAME.search(t.id)]
        elif package and isinstance(node, ast.AnnAssign) and node.value is not None and _number(node.value):
            if isinstance(node.target, ast.Name) and "threshold" in node.target.id:
                found.append(f"{node.target.id} = {ast.unparse(node.value)}")
        elif package and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            found += [f"{a.arg}={ast.unparse(d)}" for a, d in zip(args, node.args.defaults)
                      if "threshold" in a.arg and _number(d)]
    return list(dict.fromkeys(found))


def _allowed(name: str, found: str) -> bool:
    return any(f == name and snippet in found for f, snippet in ALLOWED)


def _findings():
    out = {}
    for path in NOTEBOOKS:
        out[path.name] = [f for src in _cells(path) for f in own_numbers(ast.parse(src))]
    for path in PACKAGE:
        out[path.name] = own_numbers(ast.parse(path.read_text()), package=True)
    return out


FINDINGS = _findings()


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_no_level_of_its_own(name):
    own = [f for f in FINDINGS[name] if not _allowed(name, f)]
    assert not own, (f"{name} compares a score with a number of its own: {own}; use the level of "
                     "attncircuits.analysis.definitions (e.g. INDUCTION_HEAD.holds(score)), or add the "
                     "comparison to this test's ALLOWED with the reason it is not a role's level")


def test_allow_list_is_live():
    """Every allowed comparison still exists: a stale entry would hide nothing and say something false."""
    stale = [k for k in ALLOWED if not any(k[1] in f for f in FINDINGS.get(k[0], []))]
    assert not stale, f"allow-list entries that match nothing any more: {stale}"


def test_the_scanner_finds_a_number_of_its_own():
    src = ("ind = [(1, h) for h in range(4) if pm[1, h] > 0.3]\n"
           "ok = hs.previous_token[0].max() >= 0.25\n"
           "heads = find(model, threshold=0.4)\n"
           "fine = INDUCTION_HEAD.holds(pm[1, 0]) and loss < 2.5\n")
    assert set(own_numbers(ast.parse(src))) == {"pm[1, h] > 0.3", "hs.previous_token[0].max() >= 0.25",
                                                 "threshold=0.4"}
    pkg = "FORMED = 0.5\ndef f(x, threshold: float = 0.4):\n    return x\nATTENDS = D.ATTENDS.value\n"
    assert set(own_numbers(ast.parse(pkg), package=True)) == {"FORMED = 0.5", "threshold=0.4"}


def test_every_user_reads_the_one_definition():
    assert phase.FORMED == D.FORMED.value
    assert replicate.INDUCTION_THRESHOLD == D.INDUCTION_HEAD.value
    assert replicate.COPYING_THRESHOLD == D.COPYING_EIGEN.value
    assert watch.HeadWatch.threshold == D.FORMED.value
    assert cc.ROLES["induction"].threshold == D.INDUCTION_HEAD.value
    assert cc.ROLES["previous-token"].threshold == D.PREVIOUS_TOKEN_HEAD.value
    assert cc.ROLES["duplicate-token"].threshold == D.DUPLICATE_TOKEN_HEAD.value
    assert cc.ROLES["copying"].threshold == D.COPYING_HEAD.value
    assert cc.COMPOSES == D.COMPOSES.value
    # two concepts, two names: a head is an induction head below the level at which a model has formed them
    assert D.INDUCTION_HEAD.value < D.FORMED.value


def test_a_level_says_its_value_and_marks_knife_edges():
    lv = D.INDUCTION_HEAD
    pm = torch.tensor([[0.01, 0.1], [0.91, lv.value + 0.01]])
    assert str(lv) == f"prefix matching >= {lv.value:g}"
    assert lv.heads(pm) == [(1, 0), (1, 1)]
    line = lv.line("induction heads", pm)
    assert line == f"induction heads (prefix matching >= {lv.value:g}): 1.0 (0.91), 1.1 ({lv.value + 0.01:.2f}, near)"
    below = lv.value - lv.margin / 2
    assert not lv.holds(below) and lv.near(below) and "(near the level)" in lv.verdict(below)
    assert lv.verdict(0.91) == f"0.91 >= {lv.value:g}"
    assert lv.far_below(lv.value / 2 - 0.01) and not lv.far_below(lv.value / 2 + 0.01)
    assert lv.clearly(lv.value + lv.margin) and not lv.clearly(lv.value + lv.margin / 2)


def test_the_grader_says_when_a_failed_role_is_near_its_level():
    from attncircuits.analysis import grading as grader

    assert "near the level" in grader._near(D.ATTENDS.value - 0.01, D.ATTENDS.value, D.MARGIN)
    assert grader._near(D.ATTENDS.value - 0.2, D.ATTENDS.value, D.MARGIN) == ""
    level = D.ATTENDS.value
    marks = [grader._mark(level + d, level) for d in (0.2, 0.01, -0.01, -0.2)]
    assert marks == ["*", "+", "~", " "]


def test_the_grader_notes_a_role_that_passes_by_less_than_the_margin():
    from attncircuits.course import grader

    g = grader.grader_for("attn-only-2l")  # head 0.0's previous-token score is at the level's edge
    score, level = float(g.roles["previous-token"][0, 0]), cc.ROLES["previous-token"].threshold
    assert 0 <= score - level < D.MARGIN, score
    lines = g.grade({"model": "attn-only-2l", "heads": {"0.0": "previous-token"}, "compositions": []},
                    show=False).lines
    assert any(line.startswith("~ role: 0.0 as previous-token passes by less than") for line in lines), lines

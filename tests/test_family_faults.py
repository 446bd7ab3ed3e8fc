"""make family's files are verified on read: a saved state or a member's results that was changed,
belongs to another member, seed or recipe, is refused in one line before any training; bad input
(a member or seed that does not exist, a recipe the trainer cannot build) likewise; and a user's
own seed is written outside the package."""

import json
import shutil
from pathlib import Path

import pytest

import attncircuits
from attncircuits.train import family, family_files, loop


def no_training(monkeypatch):
    monkeypatch.setattr(family, "train_member", lambda *a, **k: pytest.fail("trained despite the fault"))


def interrupted(out: Path, name: str, streams, monkeypatch, seed: int = 0) -> Path:
    """``name`` stopped by Ctrl-C at step 50, its state saved there; returns its state folder."""
    out.mkdir(parents=True, exist_ok=True)
    real, calls = loop.evaluate, {"n": 0}

    def stop(model, val_batches):
        calls["n"] += 1
        if calls["n"] == 3:
            raise loop.TrainingInterrupted(50)
        return real(model, val_batches)

    with monkeypatch.context() as mp:
        mp.setattr(loop, "evaluate", stop)
        with pytest.raises(loop.TrainingInterrupted):
            family.train_member(name, seed, out, streams)
    return family_files.state_dir(out, name)


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def test_a_saved_state_with_one_bit_flipped_is_refused_not_resumed(tiny_family, tmp_path, monkeypatch):
    out = tmp_path / "seed-0"
    state = interrupted(out, "attn-1l", tiny_family, monkeypatch) / "resume" / "state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit, inside the weights
    state.write_bytes(bytes(data))
    no_training(monkeypatch)
    with pytest.raises(SystemExit) as err:
        family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=tiny_family)
    assert "attn-1l.partial does not match its checksums; delete" in one_line(err)
    assert "to train attn-1l from the start" in one_line(err)
    with pytest.raises(family_files.FamilyFileError, match="does not match its checksums"):
        family_files.load_state(out, "attn-1l", family.identity("attn-1l", 0))


def test_another_members_or_seeds_saved_state_in_its_place_is_one_line(tiny_family, tmp_path, monkeypatch):
    out = tmp_path / "seed-0"
    theirs = interrupted(out, "ln-mlp-1l", tiny_family, monkeypatch)
    seed1 = interrupted(tmp_path / "seed-1", "attn-1l", tiny_family, monkeypatch, seed=1)
    shutil.copytree(theirs, family_files.state_dir(out, "attn-1l"))
    no_training(monkeypatch)
    with pytest.raises(SystemExit) as err:
        family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=tiny_family)
    assert "attn-1l.partial holds ln-mlp-1l's saved state, not attn-1l's; delete" in one_line(err)
    with pytest.raises(family_files.FamilyFileError, match="holds ln-mlp-1l's saved state"):  # not a state_dict error
        family_files.load_state(out, "attn-1l", family.identity("attn-1l", 0))
    shutil.rmtree(family_files.state_dir(out, "attn-1l"))
    shutil.copytree(seed1, family_files.state_dir(out, "attn-1l"))
    with pytest.raises(SystemExit) as err:
        family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=tiny_family)
    assert "holds seed 1's saved state, not seed 0's" in one_line(err)
    monkeypatch.setattr(family, "RECIPE", {"steps": 75, "eval_every": 25, "eval_batches": 1})
    with pytest.raises(family_files.FamilyFileError, match="saved by another recipe of attn-1l"):
        family_files.load_state(tmp_path / "seed-1", "attn-1l", family.identity("attn-1l", 1))


def test_a_saved_state_from_before_the_icl_rows_is_refused_in_one_line(tiny_family, tmp_path, monkeypatch):
    """A state saved by a version that kept no ICL rows (its checksums whole) would raise a
    KeyError at the next evaluation: refused before any training, naming the folder."""
    import torch

    out = tmp_path / "seed-0"
    folder = interrupted(out, "attn-1l", tiny_family, monkeypatch)
    state = torch.load(folder / "resume" / "state.pt", weights_only=False)
    for key in ("icl_steps", "icl_rows"):
        del state["kept"][key]
    ident = family.identity("attn-1l", 0)
    family_files.save_state(out, "attn-1l", ident, state)
    no_training(monkeypatch)
    with pytest.raises(SystemExit) as err:
        family.run(seed=0, processes=1, members=["attn-1l"], out=out, streams=tiny_family)
    assert "lacks the readings kept now (icl_rows, icl_steps); delete" in one_line(err)
    assert "to train attn-1l from the start" in one_line(err)


def test_a_seed_1_folder_renamed_to_seed_0_is_refused_member_by_member(tiny_family, tmp_path, monkeypatch):
    one = family.run(seed=1, processes=1, members=["attn-1l"], out=tmp_path / "seed-1", streams=tiny_family)
    renamed = one.rename(tmp_path / "seed-0")
    no_training(monkeypatch)
    with pytest.raises(SystemExit) as err:  # its recipe.json kept: the folder says it is seed 1's
        family.run(seed=0, processes=1, members=["attn-1l"], out=renamed, streams=tiny_family)
    assert "holds seed 1's family, not seed 0's" in one_line(err)
    (renamed / "recipe.json").unlink()  # without it, each member's own results say whose they are
    with pytest.raises(SystemExit) as err:
        family.run(seed=0, processes=1, members=["attn-1l"], out=renamed, streams=tiny_family)
    assert "attn-1l.json holds seed 1's results, but" in one_line(err) and "is seed 0's" in one_line(err)
    assert not (renamed / "recipe.json").exists()  # nothing written
    monkeypatch.setattr(family, "MEMBERS", {"attn-1l": family.MEMBERS["attn-1l"]})
    (renamed / "recipe.json").write_text(json.dumps(family.recipe_id(0)))  # even with seed 0's recipe.json
    with pytest.raises(ValueError, match="attn-1l.json holds seed 1's results"):
        family.load_results(renamed)


def test_results_changed_or_of_another_member_are_refused_in_one_line(tiny_family, tmp_path, monkeypatch):
    monkeypatch.setattr(family, "MEMBERS", {n: family.MEMBERS[n] for n in ("attn-1l", "ln-mlp-1l")})
    out = family.run(seed=0, processes=1, out=tmp_path / "seed-0", streams=tiny_family)
    assert sorted(family.load_results(out)) == ["attn-1l", "ln-mlp-1l"]
    good = (out / "attn-1l.json").read_text()
    (out / "attn-1l.json").write_text(good.replace('"seed": 0', '"seed": 0 '))  # one byte more
    no_training(monkeypatch)
    for call in (lambda: family.load_results(out),
                 lambda: family.run(seed=0, processes=1, out=out, streams=tiny_family)):
        with pytest.raises((ValueError, SystemExit)) as err:
            call()
        assert "attn-1l.json does not match its SHA-256" in one_line(err)
    for ext in ("json", "npz"):  # another member's files in its place, listed with their own hashes
        shutil.copy(out / f"ln-mlp-1l.{ext}", out / f"attn-1l.{ext}")
    family_files.record(out, "attn-1l")
    with pytest.raises(ValueError) as err:
        family.load_results(out)
    assert "attn-1l.json holds ln-mlp-1l's results, not attn-1l's" in one_line(err)


@pytest.mark.parametrize("change, said", [
    (dict(members=["attn-9l"]), "no family member 'attn-9l'; the members are attn-1l"),
    (dict(seed=-1), "seed -1: give a whole number from 0"),
    (dict(seed="7"), "seed '7': give a whole number from 0"),
    (dict(recipe={"steps": 50, "eval_every": 100}), "the family's recipe cannot train attn-1l: eval_every=100 is more"),
    (dict(recipe={"steps": 50, "lr": -1.0}), "the family's recipe cannot train attn-1l: "),
    (dict(recipe={"steps": 50, "n_ctx": 8}), "the family's recipe cannot train attn-1l: n_ctx=8 is too short"),
    (dict(recipe={"steps": 50, "warmup": 3}), "the family's recipe cannot train attn-1l: unknown setting ['warmup']"),
])
def test_bad_input_is_refused_in_one_line_before_anything_is_written(change, said, tiny_family, tmp_path, monkeypatch):
    if "recipe" in change:
        monkeypatch.setattr(family, "RECIPE", change.pop("recipe"))
    no_training(monkeypatch)
    out = tmp_path / "seed-0"
    kwargs = dict(seed=0, processes=1, members=["attn-1l"], out=out, streams=tiny_family) | change
    with pytest.raises(SystemExit) as err:
        family.run(**kwargs)
    assert said in one_line(err)
    assert not out.exists()


def test_a_seed_of_ones_own_is_written_outside_the_package(tmp_path, monkeypatch):
    """`make family SEED=7` once wrote into the package's shipped files, which then counted against
    what git ships (test_total_size_fits_in_git failed): another seed goes beside the replicates."""
    package = Path(attncircuits.__file__).resolve().parent
    assert family.default_out(0) == family.RESULTS / "seed-0" and package in family.default_out(0).parents
    assert family.default_out(7) == family.USER_RESULTS / "family-seed-7"
    assert package not in family.default_out(7).parents
    monkeypatch.setattr(family, "RESULTS", tmp_path / "family")
    (tmp_path / "family" / "seed-7").mkdir(parents=True)  # where an earlier version put it
    no_training(monkeypatch)
    with pytest.raises(SystemExit) as err:
        family.run(seed=7, processes=1, members=["attn-1l"])
    assert f"from an earlier version, inside the package; move it out first: mv {tmp_path}" in one_line(err)

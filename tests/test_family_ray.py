"""make family's members as tasks on a Ray cluster (a local instance of 2 CPUs, tiny members): the
same results as the local pool, bit for bit; a member whose worker is killed is run again by Ray and
resumes its saved state (the lines the tasks print reach this process through Ray's log stream); a member interrupted in the local pool resumes on the cluster; a cluster
that cannot be reached is refused in one line before anything is written."""

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from attncircuits.train import cluster, family, family_cli, family_files, loop


def _worker_pids(title: str) -> list[int]:
    """Processes of this machine whose command line (a Ray worker's process title) is ``title``."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace") == title:
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _kill_once_saved(out: Path, name: str, seen: dict, stop: threading.Event) -> None:
    """SIGKILL the worker that trains ``name`` once it has saved a state and before it finishes."""
    state = family_files.state_dir(out, name) / "resume" / "state.json"
    while not stop.is_set() and not (out / f"{name}.json").exists():
        if state.is_file():
            pids = _worker_pids(f"ray::train {name}")
            if pids:
                seen["step"] = family_files.run_folder.saved_step(family_files.state_dir(out, name))
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                seen["pids"] = pids
                return
        time.sleep(0.01)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the Ray worker to kill in /proc")
def test_members_on_a_ray_cluster_match_the_local_pool_and_survive_a_killed_worker(tiny_family, tmp_path,
                                                                                      monkeypatch, capsys):
    monkeypatch.setattr(family, "RECIPE", {"steps": 75, "eval_every": 25, "eval_batches": 1})
    names = ["attn-1l", "attn-2l"]
    t0 = time.perf_counter()
    local = family.run(seed=0, processes=1, members=names, out=tmp_path / "local", streams=tiny_family)

    out = tmp_path / "ray"  # attn-2l first stopped by Ctrl-C in the local pool at step 50: the cluster resumes it
    out.mkdir()
    real, calls = loop.evaluate, {"n": 0}

    def stop_at_50(model, val_batches):
        calls["n"] += 1
        if calls["n"] == 3:
            raise loop.TrainingInterrupted(50)
        return real(model, val_batches)

    with monkeypatch.context() as mp:
        mp.setattr(loop, "evaluate", stop_at_50)
        with pytest.raises(loop.TrainingInterrupted):
            family.train_member("attn-2l", 0, out, tiny_family)
    capsys.readouterr()
    local_s = time.perf_counter() - t0

    seen, stop = {}, threading.Event()
    killer = threading.Thread(target=_kill_once_saved, args=(out, "attn-1l", seen, stop), daemon=True)
    killer.start()
    t0 = time.perf_counter()
    try:
        family.run(seed=0, members=names, out=out, streams=tiny_family, ray="local", ray_cpus=2)
    finally:
        stop.set()
        killer.join()
    ray_s = time.perf_counter() - t0
    said = capsys.readouterr().out
    assert "training 2 on the Ray cluster at local, a task each on cpu" in said
    assert seen.get("pids"), "the worker was not killed before attn-1l finished"
    # Ray ran the killed member again, which resumed its saved state; attn-2l resumed the local pool's
    assert "attn-1l: resuming from its state saved at step" in said, said
    assert "attn-2l: resuming from its state saved at step 50" in said, said
    assert not any(Path(f"/proc/{pid}").exists() for pid in seen["pids"])

    ours, theirs = family.load(local), family.load(out)
    assert sorted(ours) == sorted(theirs) == names
    for name in names:  # bit for bit: the same floats, every evaluation and every detector
        a, b = ours[name], theirs[name]
        for key in ("history", "final_icl", "final_scores", "config", "seed", "n_params", "fixed_positions"):
            assert a[key] == b[key], (name, key)
        assert np.array_equal(a["per_token"], b["per_token"]), name
        assert not family_files.state_dir(out, name).exists()
    again = family.run(seed=0, members=names, out=out, streams=tiny_family)  # resumable the same way: done
    assert "2 of 2 members done, training 0" in capsys.readouterr().out and again == out
    print(f"local pool {local_s:.1f} s (both members, and attn-2l to step 50); on a local Ray instance of 2 CPUs "
          f"{ray_s:.1f} s, its start included; attn-1l's worker killed after its state of step {seen['step']}, "
          "both members' results equal to the local pool's bit for bit")


def test_a_cluster_that_cannot_be_reached_is_refused_in_one_line_before_anything_is_written(tmp_path, monkeypatch,
                                                                                            capsys):
    monkeypatch.setattr(family, "train_member", lambda *a, **k: pytest.fail("trained without a cluster"))
    out = tmp_path / "seed-0"
    for argv, env in ((["--ray", "127.0.0.1:9"], None), ([], "127.0.0.1:9"), (["--ray", "no-port"], None)):
        if env:
            monkeypatch.setenv(cluster.ENV, env)
        t0 = time.perf_counter()
        with pytest.raises(SystemExit) as stop:
            family_cli.main([*argv, "--members", "attn-1l", "--out", str(out)])
        text = str(stop.value)
        assert "\n" not in text and ("cannot be reached" in text or "is not host:port" in text), text
        assert f"unset {cluster.ENV} to train on this machine" in text
        assert time.perf_counter() - t0 < cluster.CONNECT_TIMEOUT_S + 2
        assert not out.exists()


def test_without_an_address_the_local_pool_trains(monkeypatch):
    monkeypatch.delenv(cluster.ENV, raising=False)
    assert cluster.address_from(None) is None  # no flag, no variable: the local pool, as before
    assert cluster.address_from("") == "local"
    monkeypatch.setenv(cluster.ENV, "10.0.0.1:6379")
    assert cluster.address_from(None) == cluster.address_from("") == "10.0.0.1:6379"
    assert cluster.address_from("auto") == "auto"

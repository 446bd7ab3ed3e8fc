"""Training a set of models (``attn-only-0l``, ``-1l``, ``-2l``) for ``make replicate`` and
``make train-mine``: each model with the training CLI, a finished one kept (trained again when its
flags carry ``--overwrite``: train-mine's other steps), an interrupted one continued with ``--resume``.

Side by side: :data:`LANES` runs the 2-layer model in one process and the 0- and 1-layer models one
after the other in a second; :data:`ONE_EACH` a process per model. These models use one CPU thread
about as well as two, and two processes of one thread each barely slow each other on a 2-core
machine (measured: the 0-layer model trained at 24,900 tokens/s alone and at 23,500 beside the
2-layer model); a machine with one core gets ``lanes=None``, one model at a time in this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from attncircuits.checkpoints.pretrained import RESUME_SUBDIR, is_checkpoint_dir, partial_dir
from attncircuits.train.cli import PROG, Interrupted, Refused, parser, run

#: which models share a process: the 2-layer model alone, the other two one after the other (for a
#: recipe whose 2-layer model takes about as many steps as the other two together: train-mine's)
LANES: tuple[tuple[str, ...], ...] = (("attn-only-2l",), ("attn-only-0l", "attn-only-1l"))
#: a process per model (for models of as many steps each: the shipped presets, make replicate)
ONE_EACH: tuple[tuple[str, ...], ...] = (("attn-only-0l",), ("attn-only-1l",), ("attn-only-2l",))


def shown(argv: list[str], keep: int = 2) -> str:
    """The command line as printed: a long list of values after one flag (a corpus's files) shows
    its first ``keep`` and how many there are, so the line stays readable."""
    out, i = [], 0
    while i < len(argv):
        out.append(argv[i])
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        values = argv[i + 1 : j]
        out += values if len(values) <= keep + 1 else [*values[:keep], f"... ({len(values)} files)"]
        i = j
    return " ".join(out)


def _argv(out: Path, name: str, flags: list[str], threads: int | None) -> list[str] | None:
    """The training CLI's arguments for model ``name``, or None (and a line) when it is trained."""
    target = out / name
    if is_checkpoint_dir(target) and "--overwrite" not in flags:  # with it: trained again (other steps)
        print(f"replicate: {target} is trained; kept", flush=True)
        return None
    resume = (partial_dir(target) / RESUME_SUBDIR / "state.json").is_file()
    argv = [*flags, "--out", str(target)] + (["--threads", str(threads)] if threads else []) + \
           (["--resume"] if resume else [])
    print(f"replicate: {PROG} {shown(argv)}", flush=True)
    return argv


def default_lanes(lanes: tuple[tuple[str, ...], ...] = LANES) -> tuple[tuple[str, ...], ...] | None:
    """``lanes`` on a machine with two cores or more, else None (one model at a time)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return lanes if cores >= 2 else None


def train_set(out: Path, train_args: dict[str, list[str]], threads: int | None = 1,
              lanes: tuple[tuple[str, ...], ...] | None = None) -> None:
    """Train each model of ``out`` not trained yet with the training CLI (``train_args[name]``: its
    flags besides --out), continuing an interrupted one with --resume; the models of one lane one
    after the other, the lanes side by side in their own processes (``lanes=None``: all in this
    process). Exits as the CLI does on a refused command or Ctrl-C (the progress is kept; the same
    command continues)."""

    if lanes is None:
        for name, flags in train_args.items():
            argv = _argv(out, name, flags, threads)
            if argv is None:
                continue
            try:
                run(parser().parse_args(argv))
            except Refused as err:
                for line in str(err).splitlines():
                    print(f"replicate: error: {line}", file=sys.stderr)
                sys.exit(130 if isinstance(err, Interrupted) else 2)
        return
    missing = [n for n in train_args if not any(n in lane for lane in lanes)]
    queues = [[n for n in lane if n in train_args] for lane in lanes] + [[n] for n in missing]
    _run_lanes(out, train_args, threads, [q for q in queues if q])


def _run_lanes(out: Path, train_args: dict[str, list[str]], threads: int | None, queues: list[list[str]]) -> None:
    running: dict[int, tuple[str, subprocess.Popen]] = {}
    failed: list[tuple[str, int]] = []

    def start_next(i: int) -> None:
        while queues[i]:
            name = queues[i].pop(0)
            argv = _argv(out, name, train_args[name], threads)
            if argv is None:
                continue
            # each bar on its own line of a terminal (tqdm reads TQDM_POSITION)
            env = {**os.environ, "TQDM_POSITION": str(i)} if sys.stderr.isatty() else None
            # its own session: a Ctrl-C reaches it once, from here, and is a request to stop at the
            # next step with its state kept (a second would stop it at once)
            running[i] = (name, subprocess.Popen([sys.executable, "-m", "attncircuits.train", *argv], env=env,
                                                 start_new_session=True))
            return
        running.pop(i, None)

    def stop(*_):
        raise KeyboardInterrupt

    # Ctrl-C, `kill -INT` and `kill PID` of this process stop the models, also when it was started
    # with SIGINT ignored (a background job of a script, `nohup ... &`); a handler only in the main thread
    main = threading.current_thread() is threading.main_thread()
    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        for i in range(len(queues)):
            start_next(i)
        while running:
            time.sleep(0.2)
            for i, (name, proc) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                if code != 0:  # the child has said why; its lane stops, the others go on
                    failed.append((name, code))
                    queues[i].clear()
                start_next(i)
    except KeyboardInterrupt:
        for name, proc in running.values():
            proc.send_signal(signal.SIGINT)
        for name, proc in running.values():
            _wait_through_interrupts(proc)
        print("replicate: interrupted; what each model had done is kept: run the same command again to continue",
              file=sys.stderr)
        sys.exit(130)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if failed:
        for name, code in failed:
            print(f"replicate: error: {name} stopped (exit {code}, see its message above); the models that "
                  "finished are kept, and the same command trains what is left", file=sys.stderr)
        sys.exit(130 if all(code == 130 for _, code in failed) else 2)


def _wait_through_interrupts(proc: subprocess.Popen) -> None:
    """Wait for ``proc``; a further Ctrl-C is passed on (the child then stops at once)."""
    while True:
        try:
            proc.wait()
            return
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)

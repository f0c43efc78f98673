"""Does a time-budgeted run land on its budget when the machine's speed changes mid-run? `python train.py` with
trainer.time_budget=M, and busy processes that start at --hog-from and stop at --hog-until of the budget.

Usage: python -m dev.bench budget [--minutes 3] [--hogs 1] [--hog-from 0.3] [--hog-until 0.6]
                                      [--repo DIR] [-- extra train.py overrides]
Prints when the training loop started and ended, its length against the budget, and every plan the run made
(state.json). --repo runs another checkout's train.py (e.g. a `git worktree` of an older commit) with the same
clock, for a before/after on one machine. The clock starts at the header's last line (the loop starts there).
"""

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

from training.checkpoint import RunFiles, list_checkpoints, read_state
from training.cli import REPO


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="A time-budgeted train.py run with busy processes started and stopped "
        "mid-run: where does it end against its budget?"
    )
    p.add_argument("--minutes", type=float, default=3.0, help="trainer.time_budget")
    p.add_argument("--hogs", type=int, default=1, help="busy loops to run between --hog-from and --hog-until")
    p.add_argument("--hog-from", type=float, default=0.3, help="share of the budget at which they start")
    p.add_argument("--hog-until", type=float, default=0.6, help="share of the budget at which they stop")
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose train.py runs")
    p.add_argument("--out", type=Path, default=Path("outputs/bench_budget"), help="outputs_dir of the run")
    p.add_argument("overrides", nargs="*", help="more train.py overrides")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    budget_s = 60 * args.minutes
    cmd = [
        sys.executable,
        str(args.repo / "train.py"),
        f"trainer.time_budget={args.minutes:g}",
        f"outputs_dir={args.out.resolve()}",
        "logger.wandb=disabled",
        *args.overrides,
    ]
    print("$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, cwd=args.repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    started, events, run_dir, lines = None, [], None, []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("run dir: "):
            run_dir = Path(line.split("run dir: ", 1)[1].split(" (", 1)[0].strip())
        if started is None and line.startswith("MFU peak "):
            started = time.time()
            threading.Thread(target=_hog, args=(args, started, budget_s, events), daemon=True).start()
        if line.startswith(("time budget", "done:", "final val", "error:")) or "re-planned" in line:
            print(line.rstrip().split("\r")[-1])
    proc.wait()
    ended = time.time()
    if proc.returncode != 0 or started is None:
        sys.stdout.write("".join(lines[-20:]))
        raise SystemExit(f"train.py exited {proc.returncode}")
    print("\n" + "\n".join(events))
    print(
        f"loop (header to exit, incl. the summary): {ended - started:.1f} s for a budget of {budget_s:.0f} s "
        f"({(ended - started) / budget_s - 1:+.1%})"
    )
    _print_plans(args.repo / run_dir if not run_dir.is_absolute() else run_dir)


def _hog(args, started: float, budget_s: float, events: list) -> None:
    time.sleep(max(0.0, started + args.hog_from * budget_s - time.time()))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    events.append(f"{args.hogs} busy loop(s) from {time.time() - started:.0f} s")
    time.sleep(max(0.0, started + args.hog_until * budget_s - time.time()))
    for hog in hogs:
        hog.kill()
    events.append(f"… until {time.time() - started:.0f} s")


def _print_plans(run_dir: Path) -> None:
    checkpoints = list_checkpoints(RunFiles(run_dir).checkpoints)
    if not checkpoints:
        return
    state = read_state(checkpoints[-1])
    plans = state.get("plans") or (state.get("budget") or {}).get("plans")  # --repo: an older checkout's state.json
    if not plans:
        print(f"one plan: {state.get('max_steps')} steps (this checkout records no plans)")
        return
    print("| plan at step | end planned | step (ms) | spent (s) |\n|---:|---:|---:|---:|")
    for plan in plans:
        print(f"| {plan['at_step']} | {plan['max_steps']} | {plan['step_s'] * 1000:.0f} | {plan['spent_s']:.0f} |")

"""Does a time-budgeted run land on its budget when the machine's speed changes mid-run? `python train.py` with
trainer.time_budget=--minutes, and --hogs busy loops from 30 % to 60 % of the budget (the clock starts at the header's
last line, where the loop starts). Prints the loop's length against the budget and every plan it made (state.json)."""

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from training.checkpoint import RunFiles, list_checkpoints, read_state
from training.program import REPO, description


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--minutes", type=float, default=3.0, help="trainer.time_budget")
    p.add_argument("--hogs", type=int, default=1, help="busy loops to run from 30 %% to 60 %% of the budget")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    budget_s = 60 * args.minutes
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, str(REPO / "train.py"), f"trainer.time_budget={args.minutes:g}"]
        cmd += [f"outputs_dir={out}", "logger.wandb=disabled"]
        print("$ " + " ".join(cmd))
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        started, events, run_dir, lines = None, [], None, []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("run dir: "):
                run_dir = Path(line.split("run dir: ", 1)[1].split(" (", 1)[0].strip())
            if started is None and line.startswith("MFU peak "):
                started = time.time()
                threading.Thread(target=_hog, args=(args.hogs, started, budget_s, events), daemon=True).start()
            if line.startswith(("time budget", "done:", "final val", "error:")) or "re-planned" in line:
                print(line.rstrip().split("\r")[-1])
        ended = time.time()
        if proc.wait() != 0 or started is None:
            sys.stdout.write("".join(lines[-20:]))
            raise SystemExit(f"train.py exited {proc.returncode}")
        print("\n" + "\n".join(events))
        print(
            f"loop (header to exit, incl. the summary): {ended - started:.1f} s for a budget of {budget_s:.0f} s "
            f"({(ended - started) / budget_s - 1:+.1%})"
        )
        _print_plans(run_dir if run_dir.is_absolute() else REPO / run_dir)


def _hog(count: int, started: float, budget_s: float, events: list) -> None:
    time.sleep(max(0.0, started + 0.3 * budget_s - time.time()))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    events.append(f"{count} busy loop(s) from {time.time() - started:.0f} s")
    time.sleep(max(0.0, started + 0.6 * budget_s - time.time()))
    for hog in hogs:
        hog.kill()
    events.append(f"… until {time.time() - started:.0f} s")


def _print_plans(run_dir: Path) -> None:
    checkpoints = list_checkpoints(RunFiles(run_dir).checkpoints)
    if not checkpoints:
        return
    state = read_state(checkpoints[-1])
    print("| plan at step | end planned | step (ms) | spent (s) |\n|---:|---:|---:|---:|")
    for plan in state["plans"]:
        print(f"| {plan['at_step']} | {plan['max_steps']} | {plan['step_s'] * 1000:.0f} | {plan['spent_s']:.0f} |")

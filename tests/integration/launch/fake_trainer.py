#!/usr/bin/env python3
"""A stand-in for `crucible train` that keeps the trainer's contracts (docs/launch.md) and fails
on request, for the launcher's integration tests and benchmarks.

Rank 0 prints `step=<n> ...` lines; every rank waits for the others at each step (a barrier on
files in --state), so one stopped rank silences the job like a stuck collective would. Progress
is saved in --state after each step and resumed from there, like a checkpoint. SIGTERM, SIGINT
and SIGUSR1 stop it like the trainer: rank 0 prints `stopped step=<n> signal=<SIG>
checkpoint=<path> exit=143` naming --stop-checkpoint (whatever is there: the launcher must check
it), or `checkpoint=none exit=75` without one, and every rank exits with that code. Failures are
injected by rank, node, attempt and step.
"""
import argparse
import os
import signal
import subprocess
import sys
import time


def env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--state", default="", help="folder for progress, pids and the barrier")
    p.add_argument("--exit", type=int, default=None, help="exit with this code before any step")
    p.add_argument("--fail-at-step", type=int, default=0)
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--fail-node", default=None)
    p.add_argument("--fail-attempts", type=int, default=1, help="fail while CRUCIBLE_ATTEMPT <= this")
    p.add_argument("--fail-code", type=int, default=1)
    p.add_argument("--fail-signal", default=None, help="KILL or STOP: signal itself instead")
    p.add_argument("--fail-message", default=None, help="printed to stderr before failing")
    p.add_argument("--fail-stamp", default=None, help="write time.time() here just before failing")
    p.add_argument("--orphan", action="store_true", help="each rank leaves a setsid'd child behind")
    p.add_argument("--finish-when-resubmitted", type=int, default=0,
                   help="when CRUCIBLE_JOB_CHAIN is set, stop after this many more steps")
    p.add_argument("--stop-checkpoint", default=None,
                   help="the checkpoint a stop names, .../step-<n> (and exits 143 for, reporting "
                        "step n); without it: none, 75")
    p.add_argument("--stop-seconds", type=float, default=0.0,
                   help="how long a stop takes before the exit (a save)")
    p.add_argument("--save-every", type=int, default=0,
                   help="report a checkpoint save (the trainer's phase=checkpoint lines) every N steps")
    p.add_argument("--save-seconds", type=float, default=0.0, help="the save time those lines report")
    a = p.parse_args()

    rank = env_int("CRUCIBLE_RANK", 0)
    world = env_int("CRUCIBLE_WORLD_SIZE", 1)
    attempt = env_int("CRUCIBLE_ATTEMPT", 1)
    node = os.environ.get("CRUCIBLE_NODE", "")
    state = a.state
    if state:
        os.makedirs(state, exist_ok=True)
        with open(os.path.join(state, f"pid-{attempt}-{rank}"), "w") as f:
            f.write(f"{os.getpid()}\n")
        with open(os.path.join(state, f"node-{attempt}-{rank}"), "w") as f:
            f.write(node + "\n")
    if a.orphan:
        child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
        if state:
            with open(os.path.join(state, f"orphan-{attempt}-{rank}"), "w") as f:
                f.write(f"{child.pid}\n")
    if a.exit is not None:
        print(f"fake_trainer: error: asked to exit {a.exit}", file=sys.stderr, flush=True)
        sys.exit(a.exit)

    progress = os.path.join(state, "progress") if state else ""
    start = 1
    if progress and os.path.exists(progress):
        start = int(open(progress).read().strip() or 0) + 1
        if rank == 0:
            print(f"phase=resume step={start - 1}", flush=True)
    last = a.steps
    if a.finish_when_resubmitted and os.environ.get("CRUCIBLE_JOB_CHAIN"):
        last = start + a.finish_when_resubmitted - 1
    current = [start - 1]

    def on_stop(signum, frame):
        # Like the trainer: a repeated SIGUSR1 (forwarded by mpirun or srun while the launcher
        # also signals the rank directly) is ignored up to the exit.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        name = signal.Signals(signum).name
        code = 143 if a.stop_checkpoint else 75
        if rank == 0:
            print(f"phase=stop signal={name} step={current[0]}", flush=True)
        time.sleep(a.stop_seconds)
        stopped = os.path.join(state, f"stopped-{attempt}") if state else ""
        # The step a stop reports is the one its checkpoint is of (a folder step-<n>).
        folder = os.path.basename(a.stop_checkpoint or "")
        step = int(folder[5:]) if folder.startswith("step-") and folder[5:].isdigit() else current[0]
        if rank == 0:
            print(f"stopped step={step} signal={name} checkpoint={a.stop_checkpoint or 'none'} "
                  f"exit={code}", flush=True)
            if stopped:
                open(stopped, "w").close()
        elif stopped:  # like the trainer's stop barrier: no rank exits before rank 0 has printed
            deadline = time.time() + 30
            while not os.path.exists(stopped) and time.time() < deadline:
                time.sleep(0.01)
        sys.exit(code)

    for stop_signal in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(stop_signal, on_stop)
    should_fail = (a.fail_rank is None or a.fail_rank == rank) and \
                  (a.fail_node is None or a.fail_node == node) and attempt <= a.fail_attempts
    for step in range(start, last + 1):
        if should_fail and a.fail_at_step and step >= a.fail_at_step:
            if a.fail_message:
                print(a.fail_message, file=sys.stderr, flush=True)
            if a.fail_stamp:
                with open(a.fail_stamp, "w") as f:
                    f.write(repr(time.time()))
            if a.fail_signal:
                os.kill(os.getpid(), getattr(signal, "SIG" + a.fail_signal))
                if a.fail_signal == "STOP":
                    continue
            sys.exit(a.fail_code)
        if state and world > 1:  # barrier: every rank reaches this step before any goes on
            open(os.path.join(state, f"at-{attempt}-{rank}-{step}"), "w").close()
            while not all(os.path.exists(os.path.join(state, f"at-{attempt}-{r}-{step}"))
                          for r in range(world)):
                time.sleep(0.01)
        if a.step_seconds:
            time.sleep(a.step_seconds)
        current[0] = step
        if rank == 0:
            if progress:
                with open(progress + ".tmp", "w") as f:
                    f.write(f"{step}\n")
                os.replace(progress + ".tmp", progress)
            print(f"step={step} loss={10.0 / step:.4f} node={node} world={world}", flush=True)
            if a.save_every and step % a.save_every == 0:
                time.sleep(a.save_seconds)
                print(f"phase=checkpoint step={step} status=complete path=ckpt/step-{step} bytes=1 "
                      f"write_s={a.save_seconds:.3f}", flush=True)
                print(f"phase=checkpoint step={step} mode=sync reason=interval stall_s={a.save_seconds:.4f} "
                      f"copy_s=0.0001 wait_s=0.0000 state_bytes=1", flush=True)
    if rank == 0:
        print(f"done steps={last}", flush=True)


if __name__ == "__main__":
    main()

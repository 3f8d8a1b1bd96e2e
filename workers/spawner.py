"""The preloaded parent of inference workers: `python -m workers.spawner --model BASE`.

It imports torch, transformers and peft and loads the base model's tokenizer once, then forks a
worker per request, so workers share those pages copy-on-write and start in well under a second.
It stays single-threaded and never runs torch compute, so forking is safe. It talks to the worker
manager in typed JSON lines over its stdin/stdout (`wire.spawner`, no pickle): a `WorkerSpec` or
`TrainerSpec` in, `Spawned` and `Exited` out. When its stdin closes (the manager is gone), it
stops its workers and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import sys
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() creates no context


import msgspec
import peft  # noqa: F401  (preloaded for the workers)
import torch  # noqa: F401
import transformers  # noqa: F401

import workers.remote.build  # noqa: F401
from wire import spawner as S
from wire.call.device import assert_fork_safe
from wire.forking import fork_child
from workers.inference.preloaded import Preloaded, preload
from workers.inference.worker import serve
from workers.training.runner import run as train

# peft reads transformers' deprecated `is_gradient_checkpointing` on every PeftModel: one
# FutureWarning per worker start that no user can act on
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

log = logging.getLogger("workers.spawner")
STOP_GRACE_S = 8.0  # under the manager's 10 s wait for us (`SpawnerClient.stop`)


def spawn(target, preloaded: Preloaded) -> int:
    """Fork a child that runs `target(preloaded)` and exits with its return code, sharing the
    spawner's memory and dying with it (`wire.forking`)."""
    assert_fork_safe()

    def child() -> int:
        os.setpgid(0, 0)  # signals for the spawner's group do not reach workers twice
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stdin.close()
        return target(preloaded)

    return fork_child(child, "child process")


def reap(children: dict[int, str], out) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.pop(pid, None)
        out.write(S.encode(S.Exited(pid, os.waitstatus_to_exitcode(status))))
        out.flush()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workers.spawner")
    parser.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the manager decides when we stop
    preloaded = preload(args.model)
    out = sys.stdout.buffer
    out.write(S.encode(S.SpawnerReady(os.getpid())))
    out.flush()
    children: dict[int, str] = {}
    stdin = sys.stdin.fileno()
    buffer = b""
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.1)
        reap(children, out)
        if not readable:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                spec = S.decode_request(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("undecodable request from the manager: %s", exc)
                continue
            if isinstance(spec, S.TrainerSpec):
                key = S.trainer_key(spec.job_id)
                pid = spawn(lambda p, c=spec: train(c, p.tokenizer), preloaded)
            else:
                key = spec.key
                pid = spawn(lambda p, c=spec: serve(c, p), preloaded)
            children[pid] = key
            out.write(S.encode(S.Spawned(key, pid)))
            out.flush()
    stop(children)
    return 0


def stop(children: dict[int, str], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to every child, then wait for them (a trainer ends its step and saves a
    checkpoint first: `ControlChannel.stop_on_sigterm`); those still there after `grace_s`
    are killed. The executor stays up meanwhile: the launcher stops it after the manager,
    which waits for us."""
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            children.pop(pid, None)
        else:
            time.sleep(0.05)
    for pid in children:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m bench.forked`: a preloaded parent (torch, transformers and peft imported, no model
loaded) that forks benchmark clients, the way the worker manager's spawner starts workers and
trainers: shared import pages, so PSS counts them once, and no interpreter start per client.

It lives for a whole benchmark run. Line protocol (JSON, one object per line): it reads
`{"argvs": [[...], ...]}` on stdin, forks one child per argument list running
`bench.workload.main(argv)`, answers `{"pids": [...]}`, and once all have exited
`{"failed": N}`. It exits at the end of its input.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() creates no context

import peft  # noqa: F401
import torch  # noqa: F401
import transformers  # noqa: F401

import workers.remote.build  # noqa: F401
from bench import workload
from wire.call.device import assert_fork_safe


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _fork(argv: list[str]) -> int:
    assert_fork_safe()
    gc.freeze()  # as the spawner does: children's collections leave the parent's pages shared
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the protocol pipes stay the parent's
            os.dup2(2, 1)
            code = workload.main(argv)
        except BaseException:
            traceback.print_exc()  # os._exit below would drop it: the run's log must say why
            sys.stderr.flush()
        finally:
            os._exit(code)
    return pid


def main() -> int:
    while line := sys.stdin.readline():
        pids = [_fork(argv) for argv in json.loads(line)["argvs"]]
        _say({"pids": pids})
        failed = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in pids)
        _say({"failed": failed})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

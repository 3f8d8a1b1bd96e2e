"""`symbiosis adapters register`: through the running worker manager, the data dir's one writer,
or, with none running, as that writer for the time of the change (`workers.manager.records`)."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import msgspec
import zmq

from catalogue.paths import local_path
from state.adapters import FILES, staging
from state.db import Database, db_path
from wire import manager as W
from wire.store import StoreAction, StoreAnswer, StoreCommand
from workers.manager.adapter_store import AdapterError, AdapterRegistry
from workers.manager.records import Busy, writing

ANSWER_S = 60.0


class Refused(Exception):
    pass


def register(data_dir: Path, model: str, tenant: str, name: str, directory: Path) -> str:
    """The new version's id; Refused saying why not."""
    try:
        with writing(data_dir):
            registry = AdapterRegistry(Database(db_path(data_dir)), data_dir, model,
                                       local_path(model))
            return registry.register(tenant, name, directory).id
    except AdapterError as exc:
        raise Refused(str(exc)) from None
    except Busy as exc:
        endpoint = str(exc)
    if not endpoint:
        raise Refused("another tool is changing this data dir's records; try again")
    staged = staging(data_dir)
    try:
        for filename in FILES:
            if not (directory / filename).is_file():
                raise Refused(f"an adapter directory needs {filename}")
            shutil.copyfile(directory / filename, staged / filename)
        answer = ask(endpoint, StoreCommand(id=uuid.uuid4().hex,
                                            action=StoreAction.ADD_ADAPTER, tenant=tenant,
                                            name=name, staged=staged.name))
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    if answer is None:
        raise Refused(f"the running worker manager (at {endpoint}) did not answer within "
                      f"{ANSWER_S:.0f} s")
    if not answer.ok:
        raise Refused(answer.message)
    return answer.made


def ask(endpoint: str, command: msgspec.Struct, answer: type = StoreAnswer):
    """The manager's answer to `command` (an `answer` with its id), or None after ANSWER_S."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(W.encode(command))
        deadline = time.monotonic() + ANSWER_S
        while (left := deadline - time.monotonic()) > 0:
            if sock.poll(int(left * 1000)):
                message = W.decode(sock.recv())
                if isinstance(message, answer) and message.id == command.id:
                    return message
        return None
    finally:
        sock.close(0)

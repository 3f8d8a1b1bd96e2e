"""The gateway's changes to the data dir's records, carried out by their one writer.

Each `StoreCommand` acts on the commanding tenant's own records only, and is answered once done
or with why not (nothing changed then). A file or model that an unfinished job still reads is
refused here, in the process that also creates jobs, so no job can slip in between the check and
the delete. Staged uploads are found by their staging name in the manager's own directories.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from state.files import PURPOSES
from state.jobs import JobReader
from state.storage import out_of_space
from state.usage import directory_bytes, readable, stored_bytes
from wire.store import StoreAction, StoreAnswer, StoreCommand
from workers.manager.adapter_store import AdapterError, AdapterRegistry, Inspected
from workers.manager.batch_store import BatchStore
from workers.manager.chat_store import ChatStore
from workers.manager.conversation_desk import ConversationDesk
from workers.manager.conversation_store import ConversationStore
from workers.manager.file_store import FileStore
from workers.manager.inspector import Outcome
from workers.manager.refused import Refused
from workers.manager.response_store import InvalidRecord, ResponseStore
from workers.manager.upload_desk import UploadDesk
from workers.manager.upload_store import UploadStore
from workers.manager.version_store import VersionError

log = logging.getLogger("workers.manager.store")
Act = Callable[[StoreCommand], StoreAnswer]


class StoreDesk:
    def __init__(self, registry: AdapterRegistry, files: FileStore, jobs: JobReader,
                 responses: ResponseStore, batches: BatchStore, chats: ChatStore,
                 conversations: ConversationStore, uploads: UploadStore) -> None:
        self.chats = chats
        self.batches = batches
        self.registry = registry
        self.files = files
        self.jobs = jobs
        self.responses = responses
        self.acts: dict[StoreAction, Act] = {
            StoreAction.ADD_FILE: self._add_file, StoreAction.DELETE_FILE: self._delete_file,
            StoreAction.ADD_ADAPTER: self._add_adapter, StoreAction.PROMOTE: self._promote,
            StoreAction.ROLLBACK: self._rollback, StoreAction.SPLIT: self._split,
            StoreAction.WITHDRAW: self._withdraw,
            StoreAction.DELETE_VERSION: self._delete_version,
            StoreAction.DELETE_MODEL: self._delete_model,
            StoreAction.ADD_RESPONSE: self._add_response,
            StoreAction.DELETE_RESPONSE: self._delete_response,
            StoreAction.SETTLE_RESPONSE: self._settle_response,
            StoreAction.ADD_BATCH: self._add_batch, StoreAction.BATCH_RESULT: self._batch_result,
            StoreAction.CANCEL_BATCH: self._cancel_batch,
            StoreAction.FINISH_BATCH: self._finish_batch,
            StoreAction.ADD_CHAT: self._add_chat, StoreAction.TAG_CHAT: self._tag_chat,
            StoreAction.DELETE_CHAT: self._delete_chat,
            **ConversationDesk(conversations, self._fits).acts(),
            **UploadDesk(uploads, files, self._fits).acts()}

    def command(self, command: StoreCommand, inspected: Outcome | None = None) -> StoreAnswer:
        """`command` carried out (an ADD_ADAPTER with its upload's `inspected` outcome when
        it was read already, off the loop) or refused, with nothing changed."""
        try:
            if isinstance(inspected, Exception):
                raise inspected
            if inspected is not None:
                return self._add_adapter(command, inspected)
            return self.acts[command.action](command)
        except Refused as exc:
            return _answer(command, exc.status, exc.code, str(exc))
        except InvalidRecord as exc:
            return _answer(command, 400, "invalid_record", str(exc))
        except AdapterError as exc:
            return _answer(command, 400, "invalid_adapter", str(exc), exc.param)
        except VersionError as exc:
            code = "model_not_found" if exc.status == 404 else "invalid_version"
            return _answer(command, exc.status, code, str(exc))
        except sqlite3.IntegrityError as exc:  # a command sent again: what it makes is there
            log.warning("store command %s refused: %s", command.action, exc)
            return _answer(command, 409, "already_exists", "A record of that id is kept "
                           "already; nothing was changed.")
        except (OSError, sqlite3.Error) as exc:
            if out_of_space(exc):
                log.error("out of disk space: %s", exc)
                return _answer(command, 507, "insufficient_storage", "out of disk space")
            log.exception("store command %s failed", command.action)
            return _answer(command, 503, "store_failed", f"the data dir refused: {exc}")
        except Exception:  # a bug here must not take the manager, and every tenant, down
            log.exception("store command %s failed", command.action)
            return _answer(command, 500, "internal_error", "the change could not be made")

    # -- files -----------------------------------------------------------------------------

    def _add_file(self, command: StoreCommand) -> StoreAnswer:
        staged = self.files.staged(command.staged)
        if staged is None or not staged.is_file():
            raise Refused(400, "invalid_file", f"no staged upload {command.staged!r}")
        if command.purpose not in PURPOSES:
            raise Refused(400, "invalid_purpose", f"purpose {command.purpose!r} is not one of "
                          f"{', '.join(sorted(PURPOSES))}")
        self._fits(command, staged.stat().st_size, "file")
        record = self.files.create(command.tenant, command.name, command.purpose, staged,
                                   examples=command.examples, format=command.format,
                                   expires_in=command.expires_in)
        return StoreAnswer(id=command.id, made=record.id)

    def _delete_file(self, command: StoreCommand) -> StoreAnswer:
        record = self.files.get(command.file_id, command.tenant)
        if record is None:
            raise Refused(404, "file_not_found", f"No such File object: {command.file_id}")
        users = self.jobs.using_file(record.id, command.tenant)
        if users:
            raise Refused(409, "file_in_use", f"File {record.id} is used by fine-tuning job(s) "
                          f"that have not finished: {', '.join(users)}. Cancel them or wait "
                          "for them to finish.")
        running = self.batches.using_file(record.id, command.tenant)
        if running:
            raise Refused(409, "file_in_use", f"File {record.id} is the input of running "
                          f"batch(es): {', '.join(running)}. Cancel them or wait for them to "
                          "finish.")
        self.files.delete(record)
        return StoreAnswer(id=command.id, deleted=[record.id])

    def expire_files(self, now: int) -> list[str]:
        """Delete the files past their expiry that no unfinished job or running batch reads;
        their ids."""
        gone = [r for r in self.files.expired(now) if not self.jobs.using_file(r.id, r.tenant)
                and not self.batches.using_file(r.id, r.tenant)]
        for record in gone:
            self.files.delete(record)
        return [r.id for r in gone]

    # -- responses ---------------------------------------------------------------------------

    def _add_response(self, command: StoreCommand) -> StoreAnswer:
        return StoreAnswer(id=command.id, made=self.responses.add(
            command.tenant, command.record, lambda size: self._fits(command, size, "response")))

    def _settle_response(self, command: StoreCommand) -> StoreAnswer:
        """Kept whatever it takes (a background response's answer is not thrown away); `made`
        its id, or empty where it had ended (or was deleted) before."""
        return StoreAnswer(id=command.id, made=self.responses.settle(command.tenant,
                                                                     command.record))

    def _delete_response(self, command: StoreCommand) -> StoreAnswer:
        if not self.responses.delete(command.response_id, command.tenant):
            raise Refused(404, "response_not_found",
                          f"Response with id '{command.response_id}' not found.")
        return StoreAnswer(id=command.id, deleted=[command.response_id])

    # -- chat completions ----------------------------------------------------------------

    def _add_chat(self, command: StoreCommand) -> StoreAnswer:
        return StoreAnswer(id=command.id, made=self.chats.add(
            command.tenant, command.record,
            lambda size: self._fits(command, size, "chat completion")))

    def _tag_chat(self, command: StoreCommand) -> StoreAnswer:
        if not self.chats.tag(command.tenant, command.record):
            raise Refused(404, "chat_completion_not_found", "Chat completion not found.")
        return StoreAnswer(id=command.id)

    def _delete_chat(self, command: StoreCommand) -> StoreAnswer:
        if not self.chats.delete(command.response_id, command.tenant):
            raise Refused(404, "chat_completion_not_found", "Chat completion with id "
                          f"'{command.response_id}' not found.")
        return StoreAnswer(id=command.id, deleted=[command.response_id])

    # -- batches -------------------------------------------------------------------------

    def _add_batch(self, command: StoreCommand) -> StoreAnswer:
        return StoreAnswer(id=command.id, made=self.batches.add(command.tenant, command.record))

    def _batch_result(self, command: StoreCommand) -> StoreAnswer:
        kept = self.batches.keep(command.tenant, command.record)
        return StoreAnswer(id=command.id, made="kept" if kept else "")

    def _cancel_batch(self, command: StoreCommand) -> StoreAnswer:
        if self.batches.cancel(command.tenant, command.batch_id) is None:
            raise Refused(404, "batch_not_found", f"No batch found with id "
                          f"'{command.batch_id}'.")
        return StoreAnswer(id=command.id)

    def _finish_batch(self, command: StoreCommand) -> StoreAnswer:
        if self.batches.finish(command.tenant, command.batch_id, command.name) is None:
            raise Refused(404, "batch_not_found", f"No batch found with id "
                          f"'{command.batch_id}'.")
        return StoreAnswer(id=command.id)

    # -- adapters and versions -------------------------------------------------------------

    def upload(self, command: StoreCommand) -> Path | StoreAnswer:
        """An ADD_ADAPTER's staged directory, to inspect; or the answer saying there is none."""
        staged = self.registry.staged(command.staged)
        if staged is None or not staged.is_dir():
            return _answer(command, 400, "invalid_adapter", f"no staged upload "
                           f"{command.staged!r}")
        return staged

    def _add_adapter(self, command: StoreCommand,
                     inspected: Inspected | None = None) -> StoreAnswer:
        staged = self.upload(command)
        if isinstance(staged, StoreAnswer):
            return staged
        self._fits(command, directory_bytes(staged), "adapter")
        version = self.registry.register(command.tenant, command.name, staged,
                                         in_service=command.serve, hold=command.hold,
                                         move=True, inspected=inspected)
        return StoreAnswer(id=command.id, made=version.id)

    def _promote(self, command: StoreCommand) -> StoreAnswer:
        self._owned(command)
        self.registry.promote(command.model, command.number)
        return StoreAnswer(id=command.id)

    def _rollback(self, command: StoreCommand) -> StoreAnswer:
        self._owned(command)
        self.registry.versions.rollback(command.model)
        return StoreAnswer(id=command.id)

    def _split(self, command: StoreCommand) -> StoreAnswer:
        self._owned(command)
        self.registry.versions.split(command.model, command.split or [])
        return StoreAnswer(id=command.id)

    def _withdraw(self, command: StoreCommand) -> StoreAnswer:
        self._owned(command)
        version = self.registry.versions.get(command.model, command.number or 0)
        if version is None:
            raise VersionError(f"{command.model} has no version {command.number}", 404)
        self.registry.withdraw(version)
        return StoreAnswer(id=command.id, deleted=[version.id])

    def _delete_version(self, command: StoreCommand) -> StoreAnswer:
        self._owned(command)
        self._refuse_if_training(command, f"{command.model}@{command.number}")
        version = self.registry.versions.delete(command.model, command.number or 0)
        return StoreAnswer(id=command.id, deleted=[version.id])

    def _delete_model(self, command: StoreCommand) -> StoreAnswer:
        self._owned(command)
        self._refuse_if_training(command, command.model)
        return StoreAnswer(id=command.id, deleted=self.registry.delete(command.model))

    def _fits(self, command: StoreCommand, size: int, what: str) -> None:
        """A 403 if keeping `size` more bytes would take the tenant past its quota."""
        if not command.quota_bytes:
            return
        used = stored_bytes(self.registry.db, command.tenant)
        if used + size > command.quota_bytes:
            raise Refused(403, "storage_quota_exceeded", f"This {what} ({readable(size)}) "
                          f"does not fit in tenant {command.tenant}'s storage quota: "
                          f"{readable(used)} of {readable(command.quota_bytes)} in use. "
                          "Delete files, models, stored responses, chat completions or "
                          "conversations you no longer need (the dashboard lists what you "
                          "keep).")

    def _owned(self, command: StoreCommand) -> None:
        if self.registry.visible(command.model, command.tenant) is None:
            raise Refused(404, "model_not_found", f"The model `{command.model}` does not exist "
                          "or you do not have access to it.")

    def _refuse_if_training(self, command: StoreCommand, model_id: str) -> None:
        """A 409 while unfinished jobs continue training `model_id` (they will read its
        adapter)."""
        users = self.jobs.using_model(model_id, command.tenant)
        if users:
            raise Refused(409, "model_in_use", f"{model_id} is being trained further by "
                          f"fine-tuning job(s) that have not finished: {', '.join(users)}. "
                          "Cancel them or wait for them to finish.")


def _answer(command: StoreCommand, status: int, code: str, message: str,
            param: str = "") -> StoreAnswer:
    return StoreAnswer(id=command.id, status=status, code=code, message=message, param=param)

"""The store commands on uploads (a file sent in parts), carried out by their one writer
(`StoreDesk` hands them here): the gateway checks them first, this checks again against the
records as they are when the command comes."""

from __future__ import annotations

from collections.abc import Callable

from state.uploads import PURPOSES, UploadRecord, not_found, not_pending, parts_wrong
from wire.store import StoreAction, StoreAnswer, StoreCommand
from workers.manager.conversation_desk import Fits
from workers.manager.file_store import FileStore
from workers.manager.refused import Refused
from workers.manager.upload_store import UploadStore


class UploadDesk:
    def __init__(self, uploads: UploadStore, files: FileStore, fits: Fits) -> None:
        self.uploads, self.files, self.fits = uploads, files, fits

    def acts(self) -> dict[StoreAction, Callable[[StoreCommand], StoreAnswer]]:
        return {StoreAction.ADD_UPLOAD: self._add, StoreAction.ADD_PART: self._add_part,
                StoreAction.COMPLETE_UPLOAD: self._complete,
                StoreAction.CANCEL_UPLOAD: self._cancel}

    def _add(self, command: StoreCommand) -> StoreAnswer:
        if command.purpose not in PURPOSES:
            raise Refused(400, "invalid_purpose", f"purpose {command.purpose!r} is not one of "
                          f"{', '.join(sorted(PURPOSES))}")
        if command.size < 1:
            raise Refused(400, "invalid_upload", "an upload holds at least one byte")
        self.fits(command, len(f"upload-{'0' * 24}{command.name}{command.mime_type}".encode()),
                  "upload")
        record = self.uploads.create(command.tenant, command.name, command.purpose,
                                     command.size, command.mime_type, command.expires_in)
        return StoreAnswer(id=command.id, made=record.id)

    def _add_part(self, command: StoreCommand) -> StoreAnswer:
        upload = self._pending(command)
        staged = self.files.staged(command.staged)
        if staged is None or not staged.is_file():
            raise Refused(400, "invalid_file", f"no staged upload {command.staged!r}")
        size, held = staged.stat().st_size, self.uploads.held(upload.id)
        if held + size > upload.bytes:
            raise Refused(409, "upload_too_large", too_large(upload, held, size))
        self.fits(command, size, "part")
        return StoreAnswer(id=command.id, made=self.uploads.add_part(upload, staged).id)

    def _complete(self, command: StoreCommand) -> StoreAnswer:
        upload = self._pending(command)
        parts = self.uploads.parts(upload.id)
        sizes = {part.id: part.bytes for part in parts}
        wrong = parts_wrong(upload, sizes, command.part_ids)
        if wrong:
            raise Refused(*wrong)
        staged = self.files.staged(command.staged)
        if staged is None or not staged.is_file() or staged.stat().st_size != upload.bytes:
            raise Refused(400, "invalid_file", f"no staged upload {command.staged!r} of "
                          f"{upload.bytes} bytes")
        file = self.files.create(  # the file and the upload's end in one transaction
            upload.tenant, upload.filename, upload.purpose, staged, examples=command.examples,
            format=command.format, expires_in=upload.file_expires_in,
            then=lambda conn, file: self.uploads.ended(conn, upload.id, "completed", file.id))
        self.uploads.remove(parts)
        return StoreAnswer(id=command.id, made=file.id)

    def _cancel(self, command: StoreCommand) -> StoreAnswer:
        upload = self._pending(command)
        self.uploads.finish(upload, "cancelled")
        return StoreAnswer(id=command.id, made=upload.id)

    def _pending(self, command: StoreCommand) -> UploadRecord:
        upload = self.uploads.get(command.upload_id, command.tenant)
        if upload is None:
            raise Refused(404, "upload_not_found", not_found(command.upload_id))
        if upload.status_now() != "pending":
            raise Refused(409, "upload_not_pending", not_pending(upload))
        return upload


def too_large(upload: UploadRecord, held: int, size: int) -> str:
    return (f"This part ({size} bytes) would take upload {upload.id} to {held + size} bytes, "
            f"past the {upload.bytes} bytes it was created for.")

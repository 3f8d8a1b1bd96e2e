"""The data dir's records (uploaded files, adapters and their versions, stored responses):
gateway -> worker manager.

The manager is the one writer of the data dir's records, as it is of jobs (`wire.jobs`). The
gateway reads them and asks for every change with a `StoreCommand`: an upload is first staged by
the gateway (a file beside the files, a directory under `staging/`) and named in the command by
its staging name, never by a path. The manager answers each command once it took effect, or with
the HTTP status, code and message of why not (then nothing changed): `StoreAnswer`.
"""

from __future__ import annotations

import enum

import msgspec

ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # a tenant's adapter name, and in words:
ADAPTER_NAME_RULE = "letters, digits, '.', '_' and '-' (at most 64), a letter or digit first"
METADATA_RULE = "at most 16 pairs (keys <= 64, values <= 512 chars)"  # OpenAI's, for `metadata`


def metadata_ok(metadata: object) -> bool:
    """Whether `metadata` is an object's tags within METADATA_RULE (strings to strings)."""
    return isinstance(metadata, dict) and len(metadata) <= 16 and all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
        for k, v in metadata.items())


class StoreAction(enum.StrEnum):
    ADD_FILE = "add_file"  # the staged upload `staged` becomes the tenant's file
    DELETE_FILE = "delete_file"  # the tenant's file `file_id`
    ADD_ADAPTER = "add_adapter"  # the staged directory `staged`: the next version of `name`
    PROMOTE = "promote"  # `number` (None: the latest) serves all of `model`'s traffic
    ROLLBACK = "rollback"  # what served `model` before its last change serves again
    SPLIT = "split"  # `split` serves `model`
    WITHDRAW = "withdraw"  # version `number` of `model` that never served goes
    DELETE_VERSION = "delete_version"  # version `number` of `model`, not serving
    DELETE_MODEL = "delete_model"  # `model` with every version
    ADD_RESPONSE = "add_response"  # `record` (a response with its conversation) is kept
    DELETE_RESPONSE = "delete_response"  # the tenant's stored response `response_id`
    SETTLE_RESPONSE = "settle_response"  # `record` (a Response) replaces its id's while pending
    SETTLE_TURN = "settle_turn"  # `record` ({response, conversation, items}): SETTLE_RESPONSE,
    # and only if it settled, its turn added to the conversation (one transaction)
    ADD_BATCH = "add_batch"  # `record` (a batch for an input file) runs from now
    BATCH_RESULT = "batch_result"  # `record` (one line's result) is kept
    CANCEL_BATCH = "cancel_batch"  # the tenant's running batch `batch_id` stops
    FINISH_BATCH = "finish_batch"  # `batch_id` ends as `name` (completed, cancelled, expired)
    ADD_CHAT = "add_chat"  # `record` (a chat completion with its messages) is kept
    TAG_CHAT = "tag_chat"  # `record` ({id, metadata}): the stored completion's new metadata
    DELETE_CHAT = "delete_chat"  # the tenant's stored chat completion `response_id`
    ADD_CONVERSATION = "add_conversation"  # `record` ({id, created_at, metadata, items}) is kept
    ADD_ITEMS = "add_items"  # `record` ({conversation, items}): items added at its end
    TAG_CONVERSATION = "tag_conversation"  # `record` ({id, metadata}): its new metadata
    DELETE_CONVERSATION = "delete_conversation"  # the tenant's conversation `response_id`
    DELETE_ITEM = "delete_item"  # `record` ({conversation, item}): that item of it goes
    ADD_UPLOAD = "add_upload"  # an upload of `size` bytes (`name`, `purpose`, `mime_type`)
    ADD_PART = "add_part"  # the staged upload `staged`: the next part of `upload_id`
    COMPLETE_UPLOAD = "complete_upload"  # `staged` (`part_ids` joined) becomes its file
    CANCEL_UPLOAD = "cancel_upload"  # the pending `upload_id` and its parts go


class StoreCommand(msgspec.Struct, tag="store_command", array_like=True, kw_only=True):
    id: str  # the request's, for its answer
    action: StoreAction
    tenant: str  # whose record; the manager acts only on the tenant's own
    model: str = ""
    number: int | None = None
    split: list[list[int]] | None = None  # [[version, weight], ...]
    name: str = ""  # ADD_ADAPTER: the adapter's name; ADD_FILE, ADD_UPLOAD: the filename
    staged: str = ""  # a staging name (`state.files.STAGED`, `state.adapters.STAGED`)
    serve: bool = True  # ADD_ADAPTER: meant to serve (False: a candidate, as promote=false)
    hold: bool = False  # ADD_ADAPTER: meant to serve, but only once promoted
    purpose: str = ""  # ADD_FILE, ADD_UPLOAD
    examples: int = 0  # ADD_FILE, COMPLETE_UPLOAD: the examples its validation counted
    format: str | None = None  # ADD_FILE, COMPLETE_UPLOAD: "chat" or "prompt-completion"
    file_id: str = ""  # DELETE_FILE
    expires_in: int | None = None  # ADD_FILE, ADD_UPLOAD: seconds until the file is gone for
    # its tenant
    record: str = ""  # the JSON of what to keep or change (responses, chats, conversations)
    response_id: str = ""  # DELETE_RESPONSE; DELETE_CHAT, DELETE_CONVERSATION: the record's id
    quota_bytes: int = 0  # ADD_FILE, ADD_ADAPTER, ADD_RESPONSE, ADD_CHAT, ADD_CONVERSATION,
    # ADD_ITEMS, SETTLE_TURN, ADD_UPLOAD, ADD_PART: what the tenant may keep (0: any)
    batch_id: str = ""  # CANCEL_BATCH, FINISH_BATCH
    upload_id: str = ""  # ADD_PART, COMPLETE_UPLOAD, CANCEL_UPLOAD
    part_ids: list[str] = []  # COMPLETE_UPLOAD: its parts, in the file's order
    size: int = 0  # ADD_UPLOAD: the bytes it will hold
    mime_type: str = ""  # ADD_UPLOAD


class StoreAnswer(msgspec.Struct, tag="store_answer", array_like=True, kw_only=True):
    id: str
    status: int = 200  # an HTTP status: 200 done; else why not, and nothing changed
    code: str = ""  # the OpenAI-shaped error's code when not done
    message: str = ""
    made: str = ""  # the id of what was made: a file id, a version id (`model@number`)
    deleted: list[str] = []  # the ids of what was deleted (version ids, a file id)
    param: str = ""  # the request's field at fault, when the manager knows it
    added: bool = False  # SETTLE_TURN: the turn was added to its conversation

    @property
    def ok(self) -> bool:
        return self.status == 200

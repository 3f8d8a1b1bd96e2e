"""The store commands on conversations, carried out by their one writer (`StoreDesk` hands
them here)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from wire.store import StoreAction, StoreAnswer, StoreCommand
from workers.manager.conversation_store import ConversationStore
from workers.manager.refused import Refused

log = logging.getLogger("workers.manager.store")
Fits = Callable[[StoreCommand, int, str], None]  # a 403 past the tenant's quota


class ConversationDesk:
    def __init__(self, conversations: ConversationStore, fits: Fits) -> None:
        self.conversations = conversations
        self.fits = fits

    def acts(self) -> dict[StoreAction, Callable[[StoreCommand], StoreAnswer]]:
        return {StoreAction.ADD_CONVERSATION: self._add, StoreAction.ADD_ITEMS: self._extend,
                StoreAction.TAG_CONVERSATION: self._tag,
                StoreAction.DELETE_CONVERSATION: self._delete,
                StoreAction.DELETE_ITEM: self._delete_item,
                StoreAction.SETTLE_TURN: self._settle_turn}

    def _add(self, command: StoreCommand) -> StoreAnswer:
        return StoreAnswer(id=command.id, made=self.conversations.add(
            command.tenant, command.record,
            lambda size: self.fits(command, size, "conversation")))

    def _extend(self, command: StoreCommand) -> StoreAnswer:
        if not self.conversations.extend(command.tenant, command.record,
                                         lambda size: self.fits(command, size, "item")):
            raise _not_found(command)
        return StoreAnswer(id=command.id)

    def _settle_turn(self, command: StoreCommand) -> StoreAnswer:
        """`made`: the response's id, or empty where it had ended before; `added`: whether its
        turn was (not where the conversation is gone or the quota refuses it: logged, and the
        response settles all the same)."""
        def room(size: int) -> bool:
            try:
                self.fits(command, size, "turn")
            except Refused as refused:
                log.warning("a turn of tenant %s was not added: %s", command.tenant, refused)
                return False
            return True

        made, added = self.conversations.settle_turn(command.tenant, command.record, room)
        return StoreAnswer(id=command.id, made=made, added=added)

    def _tag(self, command: StoreCommand) -> StoreAnswer:
        if not self.conversations.tag(command.tenant, command.record):
            raise _not_found(command)
        return StoreAnswer(id=command.id)

    def _delete(self, command: StoreCommand) -> StoreAnswer:
        if not self.conversations.delete(command.response_id, command.tenant):
            raise Refused(404, "conversation_not_found",
                          f"Conversation with id '{command.response_id}' not found.")
        return StoreAnswer(id=command.id, deleted=[command.response_id])

    def _delete_item(self, command: StoreCommand) -> StoreAnswer:
        deleted = self.conversations.delete_item(command.tenant, command.record)
        if deleted is None:
            raise _not_found(command)
        item = json.loads(command.record).get("item")
        if not deleted:
            raise Refused(404, "item_not_found", f"Item with id '{item}' not found.")
        return StoreAnswer(id=command.id, deleted=[str(item)])


def _not_found(command: StoreCommand) -> Refused:
    try:
        record = json.loads(command.record)
        named = record.get("conversation") or record.get("id")
    except (ValueError, AttributeError):
        named = None
    return Refused(404, "conversation_not_found", f"Conversation with id '{named}' not found.")

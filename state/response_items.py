"""Which stored response keeps an item of a given id (`response_items`), so that an item sent
by reference is found by an index, not by reading every response the tenant keeps. SQLite's
triggers keep it as the responses are: whoever adds, settles, hands on or deletes one (the
manager's stores, a migration, a test) changes its rows with it, in the same transaction."""

from __future__ import annotations

# an item's id where it has one that is a string (items are objects; anything else has none)
ITEM_ID = ("CASE item.type WHEN 'object' THEN CASE json_type(item.value, '$.id') WHEN 'text' "
           "THEN json_extract(item.value, '$.id') END END")
KEPT_IN = ("json_each({row}.conversation)", "json_each({row}.body, '$.output')")


def kept_items(row: str, source: str = "") -> str:
    """A SELECT of (tenant, item id, response) for each item with an id that the responses
    row `row` keeps (in its conversation and in its output); `source`: what to read `row`
    from, if anything ("responses AS r, ")."""
    return " UNION ".join(
        f"SELECT {row}.tenant, {ITEM_ID}, {row}.id FROM {source}{each.format(row=row)} AS item "
        f"WHERE {ITEM_ID} IS NOT NULL" for each in KEPT_IN)


MIGRATION = f"""
    CREATE TABLE response_items (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        response TEXT NOT NULL
    );
    CREATE INDEX response_items_by_id ON response_items (tenant, id);
    CREATE INDEX response_items_by_response ON response_items (response);
    INSERT INTO response_items {kept_items("r", "responses AS r, ")};
    CREATE TRIGGER response_items_added AFTER INSERT ON responses BEGIN
        INSERT INTO response_items {kept_items("NEW")};
    END;
    CREATE TRIGGER response_items_changed AFTER UPDATE OF body, conversation ON responses BEGIN
        DELETE FROM response_items WHERE response = OLD.id;
        INSERT INTO response_items {kept_items("NEW")};
    END;
    CREATE TRIGGER response_items_gone AFTER DELETE ON responses BEGIN
        DELETE FROM response_items WHERE response = OLD.id;
    END;
    """

# the newest unexpired response of the tenant's that keeps an item of that id
KEEPER = ("SELECT r.conversation, r.body FROM response_items AS x JOIN responses AS r ON "
          "r.id = x.response WHERE x.tenant = ? AND x.id = ? AND r.expires_at > ? "
          "ORDER BY r.created_at DESC, r.rowid DESC LIMIT 1")

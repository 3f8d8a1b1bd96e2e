"""The schema of the data dir's records, as the migrations that made it, in order: a data dir
at version n (SQLite's user_version) runs those after the nth when first opened."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from state.kept_bytes import MEASURED_MIGRATION as MEASURED_BYTES
from state.kept_bytes import MIGRATION as KEPT_BYTES
from state.response_items import MIGRATION as RESPONSE_ITEMS
from state.upload_tables import MIGRATION as UPLOADS

MIGRATIONS = [
    """
    CREATE TABLE models (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        base TEXT NOT NULL,
        path TEXT NOT NULL,
        peft_type TEXT NOT NULL,
        created INTEGER NOT NULL,
        source TEXT NOT NULL DEFAULT 'registered',
        job_id TEXT
    );
    CREATE INDEX models_by_tenant ON models (tenant);
    """,
    """
    CREATE TABLE files (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        bytes INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        filename TEXT NOT NULL,
        purpose TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'processed',
        path TEXT NOT NULL,
        examples INTEGER NOT NULL DEFAULT 0,
        format TEXT
    );
    CREATE INDEX files_by_tenant ON files (tenant, created_at);
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        status TEXT NOT NULL,
        model TEXT NOT NULL,
        training_file TEXT NOT NULL,
        validation_file TEXT,
        suffix TEXT,
        seed INTEGER NOT NULL,
        hyperparameters TEXT NOT NULL,
        method TEXT NOT NULL,
        metadata TEXT,
        fine_tuned_model TEXT,
        finished_at INTEGER,
        error TEXT,
        trained_tokens INTEGER,
        result_files TEXT NOT NULL DEFAULT '[]',
        control TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        queued_at REAL
    );
    CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at);
    CREATE INDEX jobs_by_status ON jobs (status);
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        job_id TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        level TEXT NOT NULL,
        message TEXT NOT NULL,
        type TEXT NOT NULL,
        data TEXT
    );
    CREATE INDEX events_by_job ON events (job_id, seq);
    CREATE TABLE checkpoints (
        id TEXT PRIMARY KEY,
        job_id TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        step INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        model TEXT NOT NULL,
        metrics TEXT NOT NULL,
        path TEXT NOT NULL
    );
    CREATE INDEX checkpoints_by_job ON checkpoints (job_id, step);
    """,
    """
    ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    """,
    """
    ALTER TABLE models ADD COLUMN in_service INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE jobs ADD COLUMN gates TEXT;
    """,
    """
    CREATE TABLE versions (
        model TEXT NOT NULL,
        number INTEGER NOT NULL,
        path TEXT NOT NULL,
        peft_type TEXT NOT NULL,
        created INTEGER NOT NULL,
        source TEXT NOT NULL,
        job_id TEXT,
        lineage TEXT NOT NULL DEFAULT '{}',
        passed_gates INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (model, number)
    );
    INSERT INTO versions (model, number, path, peft_type, created, source, job_id, passed_gates)
        SELECT id, 1, path, peft_type, created, source, job_id, in_service FROM models;
    ALTER TABLE models ADD COLUMN serving TEXT NOT NULL DEFAULT '[[1, 100]]';
    UPDATE models SET serving = '[]' WHERE in_service = 0;
    ALTER TABLE models ADD COLUMN history TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE models ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
    """,
    """
    ALTER TABLE jobs DROP COLUMN control;
    """,
    """
    ALTER TABLE files ADD COLUMN expires_at INTEGER;
    """,
    """
    CREATE TABLE responses (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        body TEXT NOT NULL,
        conversation TEXT NOT NULL,
        own INTEGER NOT NULL
    );
    CREATE INDEX responses_by_expiry ON responses (expires_at);
    """,
    """
    CREATE TABLE batches (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL,
        output_expires_s INTEGER
    );
    CREATE INDEX batches_by_tenant ON batches (tenant, created_at);
    CREATE INDEX batches_by_status ON batches (status);
    CREATE TABLE batch_results (
        batch_id TEXT NOT NULL,
        line INTEGER NOT NULL,
        ok INTEGER NOT NULL,
        result TEXT NOT NULL,
        PRIMARY KEY (batch_id, line)
    );
    """,
    """
    ALTER TABLE responses ADD COLUMN status TEXT NOT NULL DEFAULT 'completed';
    ALTER TABLE responses ADD COLUMN request TEXT;
    UPDATE responses SET status = COALESCE(json_extract(body, '$.status'), 'completed');
    CREATE INDEX responses_by_status ON responses (status);
    """,
    """
    ALTER TABLE responses ADD COLUMN previous TEXT;
    CREATE INDEX responses_by_previous ON responses (previous);
    """,
    """
    CREATE TABLE chat_completions (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        model TEXT NOT NULL,
        metadata TEXT NOT NULL,
        body TEXT NOT NULL,
        messages TEXT NOT NULL
    );
    CREATE INDEX chat_completions_by_tenant ON chat_completions (tenant, created_at);
    CREATE INDEX chat_completions_by_expiry ON chat_completions (expires_at);
    """,
    """
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        metadata TEXT NOT NULL
    );
    CREATE INDEX conversations_by_tenant ON conversations (tenant);
    CREATE TABLE conversation_items (
        conversation TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        id TEXT NOT NULL,
        item TEXT NOT NULL,
        PRIMARY KEY (conversation, seq),
        UNIQUE (conversation, id)
    );
    """,
    """
    CREATE INDEX conversation_items_by_id ON conversation_items (id);
    CREATE INDEX responses_by_tenant ON responses (tenant, created_at);
    """,
    RESPONSE_ITEMS,
    KEPT_BYTES,
    MEASURED_BYTES,
    UPLOADS,
]


def statements(script: str) -> Iterator[str]:
    """The script's statements one by one (a trigger's body keeps the `;` within it)."""
    pending = ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield pending
            pending = ""

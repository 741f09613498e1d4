-- Mirrors migrations/0026_retention_rules.sql: retention rules set through the admin API.
CREATE TABLE retention_rules (
    kind       TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    days       INTEGER NOT NULL CHECK (days >= 1),
    keep       TEXT    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
) STRICT;

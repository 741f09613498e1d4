-- Mirrors migrations/0018_web_search.sql: web searches a session's provider ran for it.
ALTER TABLE sessions ADD COLUMN web_search_requests INTEGER NOT NULL DEFAULT 0
    CHECK (web_search_requests >= 0);

-- agentq: web searches a session's provider ran for it (its own search tool, billed per
-- search): summed like the token counts, priced at read time with them. 0 on every row
-- written before, which ran none.
ALTER TABLE sessions ADD COLUMN web_search_requests bigint NOT NULL DEFAULT 0
    CHECK (web_search_requests >= 0);

-- agentq: the shard map, read on the control shard (the first of several Postgres): per
-- generation, over how many shards new trees spread, and from when ids name it. A
-- generation is added when a shard is (`agentq migrate` with one more URL); rows are
-- never changed afterwards, since every id minted in a generation is read by it. Empty on
-- a database that `agentq migrate` has not recorded a map on: it is then read as one
-- generation over the shards given (see docs/scale.md, "Adding a shard").
CREATE TABLE shard_generations (
    generation integer     NOT NULL PRIMARY KEY CHECK (generation BETWEEN 0 AND 15),
    shards     integer     NOT NULL CHECK (shards BETWEEN 1 AND 1024),
    since      timestamptz NOT NULL
);

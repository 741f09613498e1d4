-- Mirrors migrations/0031_shard_map.sql so that the schemas stay level; an embedded
-- database has one shard and never reads it.
CREATE TABLE shard_generations (
    generation INTEGER NOT NULL PRIMARY KEY CHECK (generation BETWEEN 0 AND 15),
    shards     INTEGER NOT NULL CHECK (shards BETWEEN 1 AND 1024),
    since      INTEGER NOT NULL
) STRICT;

-- Ledger of migrations shipped by plugins (pgtasks_add_migrations hook), applied by
-- App.migrate after pgtasks' own; one row per plugin key and version.
CREATE TABLE pgtasks.plugin_migrations (
    plugin text NOT NULL CHECK (plugin ~ '^[a-z][a-z0-9_]*$'),
    version integer NOT NULL CHECK (version > 0),
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (plugin, version)
);

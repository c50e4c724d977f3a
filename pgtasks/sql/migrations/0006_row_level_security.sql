-- Row-level security mode: the functions that switch it on and off. Installing them
-- changes nothing; `pgtasks rls enable` calls pgtasks.rls_enable (docs/security.md,
-- "Database-enforced isolation").
--
-- The mode covers every table of pgtasks' schemas (pgtasks and pgtasks_*: the built-in
-- plugins' and third-party ones') that has a "tenant" column. Each gets two policies:
--
--   pgtasks_tenant: a row is visible and writable when its tenant is the setting
--       pgtasks.tenant of the current transaction (set by a tenant handle with
--       set_config(..., true)). An empty or missing setting matches no row: a connection
--       that forgot to say whose it is sees nothing (PostgreSQL resets a custom setting
--       to '' after the transaction that set it, hence the nullif).
--   pgtasks_fleet: every row, for the roles that run workers, schedulers and operator
--       commands (by default the role that enables the mode).
--
-- FORCE makes the policies bind the tables' owner too. Superusers and roles with
-- BYPASSRLS are never subject to row-level security (PostgreSQL, "5.9. Row Security
-- Policies").

CREATE FUNCTION pgtasks.tenant_tables() RETURNS SETOF regclass
LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass
    FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant' AND NOT a.attisdropped
    WHERE c.relkind IN ('r', 'p')
      AND (n.nspname = 'pgtasks' OR n.nspname LIKE 'pgtasks\_%')
    ORDER BY n.nspname, c.relname
$$;

CREATE FUNCTION pgtasks.rls_roles(roles text[]) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r text;
BEGIN
    IF roles IS NULL OR cardinality(roles) = 0 THEN
        RAISE EXCEPTION 'at least one role is needed' USING ERRCODE = '22023';
    END IF;
    FOREACH r IN ARRAY roles LOOP
        IF r IS NULL OR to_regrole(quote_ident(r)) IS NULL THEN
            RAISE EXCEPTION 'role % does not exist', quote_ident(coalesce(r, '')) USING ERRCODE = '42704';
        END IF;
    END LOOP;
    RETURN (SELECT string_agg(quote_ident(x), ', ') FROM unnest(roles) AS x);
END
$$;

CREATE FUNCTION pgtasks.rls_enable(fleet_roles text[]) RETURNS SETOF regclass
LANGUAGE plpgsql AS $$
DECLARE
    roles text := pgtasks.rls_roles(fleet_roles);
    t regclass;
BEGIN
    FOR t IN SELECT * FROM pgtasks.tenant_tables() LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('DROP POLICY IF EXISTS pgtasks_tenant ON %s', t);
        EXECUTE format(
            'CREATE POLICY pgtasks_tenant ON %s'
            ' USING (tenant = nullif(current_setting(''pgtasks.tenant'', true), ''''))'
            ' WITH CHECK (tenant = nullif(current_setting(''pgtasks.tenant'', true), ''''))', t);
        EXECUTE format('DROP POLICY IF EXISTS pgtasks_fleet ON %s', t);
        EXECUTE format('CREATE POLICY pgtasks_fleet ON %s TO %s USING (true) WITH CHECK (true)', t, roles);
        RETURN NEXT t;
    END LOOP;
END
$$;

CREATE FUNCTION pgtasks.rls_disable() RETURNS SETOF regclass
LANGUAGE plpgsql AS $$
DECLARE
    t regclass;
BEGIN
    FOR t IN SELECT * FROM pgtasks.tenant_tables() LOOP
        EXECUTE format('DROP POLICY IF EXISTS pgtasks_tenant ON %s', t);
        EXECUTE format('DROP POLICY IF EXISTS pgtasks_fleet ON %s', t);
        EXECUTE format('ALTER TABLE %s NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY', t);
        RETURN NEXT t;
    END LOOP;
END
$$;

-- What a role that acts only through tenant handles needs: read the schemas, enqueue
-- (INSERT and the id sequences), read, cancel and requeue (UPDATE) its tenant's rows.
-- The policies decide which rows; no DELETE, and nothing on tables without a tenant.
CREATE FUNCTION pgtasks.rls_grant_tenant_role(role text) RETURNS SETOF regclass
LANGUAGE plpgsql AS $$
DECLARE
    grantee text := pgtasks.rls_roles(ARRAY[role]);
    s name;
    t regclass;
BEGIN
    FOR s IN
        SELECT DISTINCT n.nspname FROM pg_catalog.pg_namespace n
        WHERE n.nspname = 'pgtasks' OR n.nspname LIKE 'pgtasks\_%'
    LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %s', s, grantee);
        EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO %s', s, grantee);
    END LOOP;
    FOR t IN SELECT * FROM pgtasks.tenant_tables() LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %s TO %s', t, grantee);
        RETURN NEXT t;
    END LOOP;
END
$$;

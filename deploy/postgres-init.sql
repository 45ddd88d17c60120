-- Run once by the postgres image on an empty data volume (docker-entrypoint-initdb.d), as
-- POSTGRES_USER, who owns what it creates. POSTGRES_DB (`dagster`) holds Dagster's runs, events and
-- schedules; this database holds the fleet's state (INVESTIGATIONS_DATABASE_URL), whose tables the
-- fleet creates itself on first start.
CREATE DATABASE investigations;

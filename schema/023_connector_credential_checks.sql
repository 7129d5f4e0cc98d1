-- The credential version the `connectors` worker last checked with the kind's plugin
-- (decisions-part2 "Runs": check_credential after creation with a credential and after each
-- replacement; its `expires_at` drives the credential_expiring health state).
ALTER TABLE connectors ADD COLUMN credential_checked_version integer NOT NULL DEFAULT 0;

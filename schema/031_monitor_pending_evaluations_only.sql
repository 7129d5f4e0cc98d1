-- `monitor_evaluations` keeps only the evaluations still to decide. It kept one row per
-- (Subscription Version, Record Version) ever evaluated, every `no_match` included, so that folding
-- the journal again decided no pair twice: with a thousand Subscriptions each ingest added a
-- thousand rows for good. An evaluation that ends (decided, failed or dropped) now leaves the
-- table, and `monitor_trigger_mark` says which triggers were folded already: a fold of the journal
-- again (its checkpoint reset) arms no evaluation at or below it, which is the set the first fold
-- armed, since the fold reads Subscriptions as they were at each event's position.
CREATE TABLE monitor_trigger_mark (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    position   bigint NOT NULL  -- the highest position of a trigger the monitor has folded
);
INSERT INTO monitor_trigger_mark (position)
SELECT greatest(coalesce((SELECT max(trigger_position) FROM monitor_evaluations), 0),
                coalesce((SELECT position FROM projector_checkpoints WHERE name = 'monitor'), 0));

DELETE FROM monitor_evaluations WHERE state <> 'pending';
DROP INDEX monitor_evaluations_due;
DROP INDEX monitor_evaluations_by_version;
DROP INDEX monitor_evaluations_by_subscription;
ALTER TABLE monitor_evaluations DROP COLUMN state;
CREATE INDEX monitor_evaluations_due ON monitor_evaluations (next_attempt_at);
CREATE INDEX monitor_evaluations_by_version ON monitor_evaluations (version_id);
CREATE INDEX monitor_evaluations_by_subscription ON monitor_evaluations (subscription_id);

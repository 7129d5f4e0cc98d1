-- `monitor_evaluations`' key leads with the Record Version. A trigger arms one row per
-- Subscription of one Version (a thousand with a thousand Subscriptions); Version ids grow with
-- time, so those rows now land side by side at the right edge of the key's index instead of in
-- as many leaf pages as there are Subscription Versions. Every lookup names the Version (the
-- scan, the settle, a withdrawal, a newer Version) or the whole pair, so the key serves them and
-- `monitor_evaluations_by_version` goes: three indexes to maintain per row instead of four
-- (docs/decisions.md "Evaluation and Matches").
ALTER TABLE monitor_evaluations DROP CONSTRAINT monitor_evaluations_pkey;
ALTER TABLE monitor_evaluations ADD PRIMARY KEY (version_id, subscription_version_id);
DROP INDEX monitor_evaluations_by_version;

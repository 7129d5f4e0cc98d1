-- Saved Queries and Subscriptions (part 2 "Saved queries and subscriptions"): read tables folded
-- from the `saved_query.committed` and `subscription.committed` journal events
-- (src/contentsvc/monitoring/views.py), inline by the commands and again by the readmodel
-- projector. Each head row keeps the `revision` of the event that last set it: a fold applies an
-- event only when its revision is higher, so a lagging projector never moves a head backwards.

CREATE TABLE saved_queries (
    saved_query_id      text PRIMARY KEY,
    org_id              text NOT NULL,
    revision            integer NOT NULL,
    name                text NOT NULL,
    current_version_id  text NOT NULL,
    corpus_ids          text[] NOT NULL,   -- the current Version's
    deleted             boolean NOT NULL,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL
);

CREATE TABLE saved_query_versions (
    version_id      text PRIMARY KEY,
    saved_query_id  text NOT NULL,
    org_id          text NOT NULL,
    corpus_ids      text[] NOT NULL,
    expression      jsonb NOT NULL,
    created_at      timestamptz NOT NULL
);
CREATE INDEX saved_query_versions_by_query ON saved_query_versions (saved_query_id, version_id);

CREATE TABLE subscriptions (
    subscription_id     text PRIMARY KEY,
    org_id              text NOT NULL,
    revision            integer NOT NULL,
    name                text NOT NULL,
    owner               text,              -- NULL: a global Subscription
    saved_query_id      text NOT NULL,
    current_version_id  text NOT NULL,
    enabled             boolean NOT NULL,
    deleted             boolean NOT NULL,
    disabled_reason     text,
    scope               text[] NOT NULL,   -- every Corpus any of its Versions pinned (rule 8)
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL
);
-- listSubscriptions: active ones of one owner (or the global ones) in id order.
CREATE INDEX subscriptions_active ON subscriptions (org_id, owner, subscription_id) WHERE enabled AND NOT deleted;
-- deleteSavedQuery: is a non-deleted Subscription still on it?
CREATE INDEX subscriptions_of_query ON subscriptions (saved_query_id) WHERE NOT deleted;

CREATE TABLE subscription_versions (
    version_id              text PRIMARY KEY,
    subscription_id         text NOT NULL,
    org_id                  text NOT NULL,
    saved_query_id          text NOT NULL,
    saved_query_version_id  text NOT NULL,
    evaluator               jsonb NOT NULL,   -- {plugin_id, version, configuration}
    destination_id          text NOT NULL,
    owner                   text,
    corpus_ids              text[] NOT NULL,  -- the pinned Saved Query Version's
    created_at              timestamptz NOT NULL,
    activated_at            timestamptz NOT NULL,
    -- The journal position of its `subscription.committed` event: it judges only later changes.
    -- Set by the readmodel projector (an inline fold runs before the append draws positions).
    activation_position     bigint
);
CREATE INDEX subscription_versions_by_subscription ON subscription_versions (subscription_id, version_id);

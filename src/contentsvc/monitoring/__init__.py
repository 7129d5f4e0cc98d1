"""Part 2 slice: saved queries, subscriptions, evaluator calls, Matches and signed webhook deliveries.
Holds its routes, commands, events, views and workers."""

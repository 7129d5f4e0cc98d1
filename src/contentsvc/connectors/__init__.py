"""Part 2 slice: scheduled pulls, encrypted credentials, connector health, the webhook relay and push routes.
Holds its routes, commands, events, views and workers."""

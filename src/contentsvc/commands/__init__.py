"""Command handlers by resource: validate, claim idempotency, append events in one transaction."""
